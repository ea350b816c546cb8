#!/bin/bash
# Stops what start.sh started under $1 (by their pid files: every node's slurmd, slurmctld, munged).
BASE=$1
pidfiles() { echo "$BASE"/spool/slurmd-*.pid "$BASE/state/slurmctld.pid" "$BASE/munge-run/munged.pid"; }
for pidfile in $(pidfiles); do
  [ -f "$pidfile" ] && kill "$(cat "$pidfile")" 2>/dev/null || true
done
sleep 0.3
for pidfile in $(pidfiles); do
  [ -f "$pidfile" ] && kill -9 "$(cat "$pidfile")" 2>/dev/null || true
done
exit 0
