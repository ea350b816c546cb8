#!/bin/bash
# A Slurm on loopback for the tests and the benchmarks (as root; munged, slurmctld and slurmd with
# all their state under $1), slurmctld on port $2. Prints "cluster ready" when every node is idle.
# After the recipe in shared/notes/slurm-local.
#
#   start.sh BASE CTLD_PORT SLURMD_PORT          one node, named as this host (`hostname -s`)
#   start.sh BASE CTLD_PORT PORT1,PORT2[,...]    a node per port, node1, node2, ...: one slurmd
#                                                each (`slurmd -N nodeI`), all on this host, so a
#                                                job of `--nodes=2` runs on two Slurm nodes
#
# Each node has four GPUs, declared as links to /dev/null (Slurm wants character devices).
set -euo pipefail
BASE=$1
CTLD_PORT=${2:-6817}
IFS=, read -r -a PORTS <<< "${3:-6818}"
HERE=$(cd "$(dirname "$0")" && pwd)
HOST=$(hostname -s)
mkdir -p "$BASE"/{etc,munge,munge-run,state,spool,log,devlink}
nodes="" gres="" names=()
for i in "${!PORTS[@]}"; do
  if [ ${#PORTS[@]} -eq 1 ]; then name=$HOST; else name=node$((i + 1)); fi
  names+=("$name")
  first=$((4 * i))
  for d in 0 1 2 3; do ln -sf /dev/null "$BASE/devlink/nvidia$((first + d))"; done
  mkdir -p "$BASE/spool/$name"
  nodes+="NodeName=$name NodeHostname=$HOST NodeAddr=127.0.0.1 Port=${PORTS[$i]} CPUs=8 Boards=1 SocketsPerBoard=1 CoresPerSocket=8 ThreadsPerCore=1 RealMemory=20000 Gres=gpu:a100:4 State=UNKNOWN\n"
  gres+="NodeName=$name Name=gpu Type=a100 File=$BASE/devlink/nvidia[$first-$((first + 3))]\n"
done
for f in slurm.conf gres.conf; do
  sed -e "s|@BASE@|$BASE|g; s|@CTLD_PORT@|$CTLD_PORT|; s|@NODES@|$nodes|; s|@GRES@|$gres|" \
    "$HERE/$f.in" > "$BASE/etc/$f"
done
export SLURM_CONF=$BASE/etc/slurm.conf
chmod 755 "$BASE/munge" "$BASE/munge-run"   # munged wants its socket folder world-searchable
[ -f "$BASE/munge/munge.key" ] || mungekey -c -k "$BASE/munge/munge.key"
munged --socket="$BASE/munge-run/munge.socket.2" --key-file="$BASE/munge/munge.key" \
       --log-file="$BASE/log/munged.log" --pid-file="$BASE/munge-run/munged.pid" \
       --seed-file="$BASE/munge/munged.seed"
fail() { echo "START FAILED: $*" >&2; tail -n 15 "$BASE"/log/*.log >&2 || true; exit 1; }
# A daemon is dead once its pid file names no live process. Until the daemon has written the file
# (it forks first, and a loaded machine can take a while) it counts as starting; the deadline
# covers one that dies before writing it.
dead() { [ -s "$1" ] && ! kill -0 "$(cat "$1")" 2>/dev/null; }
slurmctld -c
deadline=$((SECONDS+30))
until scontrol ping 2>/dev/null | grep -q UP; do
  dead "$BASE/state/slurmctld.pid" && fail "slurmctld died"
  [ $SECONDS -lt $deadline ] || fail "slurmctld not answering"; sleep 0.1
done
for name in "${names[@]}"; do
  if [ ${#names[@]} -eq 1 ]; then slurmd -c; else slurmd -c -N "$name"; fi
done
deadline=$((SECONDS+30))
for name in "${names[@]}"; do
  until [ "$(sinfo -h -n "$name" -o %t 2>/dev/null)" = idle ]; do
    dead "$BASE/spool/slurmd-$name.pid" && fail "slurmd of $name died"
    [ $SECONDS -lt $deadline ] || fail "node $name not idle: $(sinfo -h -o '%n %t %E')"; sleep 0.1
  done
done
echo "cluster ready"
