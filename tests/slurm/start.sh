#!/bin/bash
# A one-node Slurm on loopback for the tests and the benchmark (as root; munged, slurmctld and
# slurmd with all their state under $1). Ports from $2 and $3. Prints "cluster ready" when the
# node is idle. After the recipe in shared/notes/slurm-local.
set -euo pipefail
BASE=$1
CTLD_PORT=${2:-6817}
SLURMD_PORT=${3:-6818}
HERE=$(cd "$(dirname "$0")" && pwd)
NODE=$(hostname -s)
mkdir -p "$BASE"/{etc,munge,munge-run,state,spool,log,devlink}
for i in 0 1 2 3; do ln -sf /dev/null "$BASE/devlink/nvidia$i"; done
for f in slurm.conf gres.conf; do
  sed -e "s|@BASE@|$BASE|g; s|@CTLD_PORT@|$CTLD_PORT|; s|@SLURMD_PORT@|$SLURMD_PORT|; s|@NODE@|$NODE|" \
    "$HERE/$f.in" > "$BASE/etc/$f"
done
export SLURM_CONF=$BASE/etc/slurm.conf
chmod 755 "$BASE/munge" "$BASE/munge-run"   # munged wants its socket folder world-searchable
[ -f "$BASE/munge/munge.key" ] || mungekey -c -k "$BASE/munge/munge.key"
munged --socket="$BASE/munge-run/munge.socket.2" --key-file="$BASE/munge/munge.key" \
       --log-file="$BASE/log/munged.log" --pid-file="$BASE/munge-run/munged.pid" \
       --seed-file="$BASE/munge/munged.seed"
fail() { echo "START FAILED: $*" >&2; tail -n 15 "$BASE"/log/*.log >&2 || true; exit 1; }
slurmctld -c
deadline=$((SECONDS+30))
until scontrol ping 2>/dev/null | grep -q UP; do
  kill -0 "$(cat "$BASE/state/slurmctld.pid" 2>/dev/null)" 2>/dev/null || fail "slurmctld died"
  [ $SECONDS -lt $deadline ] || fail "slurmctld not answering"; sleep 0.1
done
slurmd -c
deadline=$((SECONDS+30))
until [ "$(sinfo -h -n "$NODE" -o %t 2>/dev/null)" = idle ]; do
  kill -0 "$(cat "$BASE/spool/slurmd.pid" 2>/dev/null)" 2>/dev/null || fail "slurmd died"
  [ $SECONDS -lt $deadline ] || fail "node not idle: $(sinfo -h -o '%t %E')"; sleep 0.1
done
echo "cluster ready"
