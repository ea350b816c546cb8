#!/usr/bin/env bash
# `orch run` through the daemon against a local claim and against `srun` on the local Slurm: the
# time from typing the command to the end of `true` on one leased GPU of an idle machine, as the
# median of N runs each (default 40), all in one run.
#
#   scripts/bench-run.sh [N]
#
# Uses target/release/orch when it is built (cargo build --release --workspace --bin orch), else
# the debug binary (said in the table). Slurm is started from tests/slurm (as root) when its
# commands are installed; without them its row says so.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-40}
target=$(realpath -m "${CARGO_TARGET_DIR:-target}")
orch=$target/release/orch
build=release
if [ ! -x "$orch" ]; then
  orch=$target/debug/orch
  build=debug
fi
[ -x "$orch" ] || { echo "no orch binary: cargo build --release --workspace --bin orch" >&2; exit 2; }

work=$(mktemp -d /tmp/orch-bench-run.XXXXXX)
chmod 755 "$work"   # munged wants every folder above its socket searchable
daemon_pid=""
slurm_up=""
cleanup() {
  [ -n "$daemon_pid" ] && kill "$daemon_pid" 2>/dev/null && wait "$daemon_pid" 2>/dev/null
  [ -n "$slurm_up" ] && SLURM_CONF=$work/slurm/etc/slurm.conf tests/slurm/stop.sh "$work/slurm" >/dev/null 2>&1
  rm -rf "$work"
}
trap cleanup EXIT

cat > "$work/sim.toml" <<'EOF'
[[gpu]]
name = "Sim"
memory_total = "16GiB"
uuid = "GPU-00000000-bench-0000-0000-000000000000"
minor_number = 0
[[gpu]]
name = "Sim"
memory_total = "16GiB"
uuid = "GPU-00000001-bench-0000-0000-000000000000"
minor_number = 1
EOF
# With minor numbers, root's jobs and the daemon's lease holders get the device rule
# (/dev/nvidiaN of their grant only), as on a real machine: its cost is in both rows.

# Prints the median wall time of N runs of "$@", in milliseconds.
median_ms() {
  local times=() i start end
  for ((i = 0; i < N; i++)); do
    start=$(date +%s%N)
    "$@" >/dev/null 2>&1 || { echo "FAILED: $*" >&2; return 1; }
    end=$(date +%s%N)
    times+=($(( (end - start) / 1000 )))
  done
  printf '%s\n' "${times[@]}" | sort -n | awk '{a[NR]=$1} END {m=(NR%2)?a[(NR+1)/2]:(a[NR/2]+a[NR/2+1])/2; printf "%.1f", m/1000}'
}

ORCH_STATE_DIR=$work/daemon ORCH_DEVICES=sim:$work/sim.toml "$orch" serve >"$work/daemon.log" 2>&1 &
daemon_pid=$!
for _ in $(seq 300); do
  [ -S "$work/daemon/orch.sock" ] && break
  sleep 0.02
done

local_ms=$(ORCH_STATE_DIR=$work/local median_ms "$orch" --devices "sim:$work/sim.toml" run --gpus 1 -- true)
daemon_ms=$(ORCH_SERVER=$work/daemon/orch.sock median_ms "$orch" run --gpus 1 -- true)

srun_ms="-"
if command -v srun >/dev/null && command -v slurmctld >/dev/null && [ "$(id -u)" = 0 ]; then
  if tests/slurm/start.sh "$work/slurm" 6917 6918 >"$work/slurm.log" 2>&1; then
    slurm_up=1
    srun_ms=$(SLURM_CONF=$work/slurm/etc/slurm.conf median_ms srun --gres=gpu:1 true)
  else
    srun_ms="(Slurm did not start: $(tail -1 "$work/slurm.log"))"
  fi
else
  srun_ms="(no Slurm here)"
fi

over=$(awk -v a="$daemon_ms" -v b="$local_ms" 'BEGIN {printf "%+.1f", a-b}')
echo
echo "orch run --gpus 1 -- true, idle machine, median of $N ($build build)"
printf '%-36s %10s\n' "path" "ms"
printf '%-36s %10s\n' "local claim (lease store)" "$local_ms"
printf '%-36s %10s\n' "through the daemon (/v1/leases)" "$daemon_ms"
printf '%-36s %10s\n' "  daemon - local" "$over"
printf '%-36s %10s\n' "  goal: at most +10 ms" "$(awk -v o="$over" 'BEGIN {print (o <= 10) ? "met" : "not met"}')"
printf '%-36s %10s\n' "srun --gres=gpu:1 true (local Slurm)" "$srun_ms"
