#!/usr/bin/env bash
# What CPU binding adds to `orch run`: the wall time from the command to the end of `true` on one
# leased sim GPU, bound to its NUMA node's CPUs (the default, `cpu_bind = "numa"`) and unbound
# (`--cpu-bind none`), N runs of each (default 200), alternated so that both see the same
# machine. Prints both medians, their difference, and the p90s.
#
#   scripts/bench-bind.sh [N]
#
# Uses target/release/orch when it is built (cargo build --release --bin orch), else the debug
# binary (said in the output). The sim GPU sits near every online CPU of this machine, so the
# bound job does everything binding does (the node map read, `sched_setaffinity` and
# `set_mempolicy` before exec) yet may run on the same CPUs as the unbound one: the difference
# is orch's cost, not the load on one CPU of a shared machine.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-200}
target=$(realpath -m "${CARGO_TARGET_DIR:-target}")
orch=$target/release/orch
build=release
if [ ! -x "$orch" ]; then
  orch=$target/debug/orch
  build=debug
fi
[ -x "$orch" ] || { echo "no orch binary: cargo build --release --bin orch" >&2; exit 2; }

work=$(mktemp -d /tmp/orch-bench-bind.XXXXXX)
trap 'rm -rf "$work"' EXIT
online=$(cat /sys/devices/system/cpu/online)
cat > "$work/sim.toml" <<EOF
[[gpu]]
name = "Sim"
memory_total = "16GiB"
uuid = "GPU-00000000-b1d0-4000-8000-000000000000"
numa_node = 0
cpus = "$online"
EOF
export ORCH_STATE_DIR=$work/state
unset CUDA_VISIBLE_DEVICES ORCH_SERVER

# One run's wall time in microseconds (bash's own clock: no process around the measurement).
once() {
  local start end
  start=${EPOCHREALTIME/./}
  "$orch" --devices "sim:$work/sim.toml" run --gpus 1 "$@" -- true >/dev/null 2>&1 \
    || { echo "FAILED: orch run $*" >&2; exit 1; }
  end=${EPOCHREALTIME/./}
  echo $((end - start))
}

# The binding must take, or the numbers compare nothing.
said=$("$orch" --devices "sim:$work/sim.toml" run --gpus 1 -- true 2>&1)
grep -q "bound to CPUs" <<<"$said" \
  || { echo "bench-bind: the job was not bound: $said" >&2; exit 1; }

for _ in 1 2 3 4 5; do once >/dev/null; once --cpu-bind none >/dev/null; done   # warm up
: > "$work/bound"
: > "$work/unbound"
for ((i = 0; i < N; i++)); do
  once >> "$work/bound"
  once --cpu-bind none >> "$work/unbound"
done

# `median p90` of a file of microseconds, in milliseconds.
stats() {
  sort -n "$1" | awk '{a[NR]=$1} END {m=(NR%2)?a[(NR+1)/2]:(a[NR/2]+a[NR/2+1])/2; p=a[int(NR*0.9+0.5)]; printf "%.2f %.2f\n", m/1000, p/1000}'
}
read -r bound_med bound_p90 < <(stats "$work/bound")
read -r unbound_med unbound_p90 < <(stats "$work/unbound")
echo "orch run --gpus 1 -- true ($build build, $N runs each, $(nproc) CPUs)"
printf '%-28s %10s %10s\n' "" "median ms" "p90 ms"
printf '%-28s %10s %10s\n' "bound (cpu_bind = numa)" "$bound_med" "$bound_p90"
printf '%-28s %10s %10s\n' "unbound (--cpu-bind none)" "$unbound_med" "$unbound_p90"
awk -v a="$bound_med" -v b="$unbound_med" 'BEGIN {printf "binding adds %.2f ms at the median\n", a - b}'
# Each bound run against the unbound run right after it: the median of those differences is
# less swayed by a neighbour's load than the difference of the medians.
paste "$work/bound" "$work/unbound" | awk '{print $1 - $2}' > "$work/diff"
read -r diff_med _ < <(stats "$work/diff")
echo "median of the paired differences: $diff_med ms"
