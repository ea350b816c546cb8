#!/usr/bin/env bash
# A shell loop of N `orch submit --gpus 1 -- true` against N `sbatch --gpus=1 --wrap true` (in
# four alternating rounds, each on idle schedulers), each against its own scheduler on this machine: `orch serve` over a sim of four
# GPUs, and the local one-node Slurm of the tests (tests/slurm/start.sh: munged, slurmctld,
# slurmd, four GPUs declared as links to /dev/null). Prints both rates and their ratio, and the
# start-up of each client alone (`orch --version`, `sbatch --version`) for scale. As root.
#
#   scripts/bench-submit.sh [N]            (default 200; builds the release orch first:
#                                           cargo build --release --workspace --bin orch)
#   ORCH_BIN=PATH scripts/bench-submit.sh  (that orch binary, nothing built)
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-200}
root=$PWD
target=$(realpath -m "${CARGO_TARGET_DIR:-target}")
if [ -z "${ORCH_BIN:-}" ]; then
  cargo build --release --workspace --bin orch >&2
  ORCH_BIN=$target/release/orch
fi
orch=$(realpath "$ORCH_BIN")
for tool in sbatch slurmctld slurmd munged; do
  command -v "$tool" >/dev/null || { echo "bench-submit: needs $tool (apt-get install slurmctld slurmd slurm-client munge)" >&2; exit 2; }
done
[ "$(id -u)" = 0 ] || { echo "bench-submit: needs root (the local Slurm runs as root)" >&2; exit 2; }

work=$(mktemp -d /tmp/orch-bench-submit.XXXXXX)
chmod 755 "$work"   # munged wants every folder above its socket searchable
daemon=""
cleanup() {
  [ -n "$daemon" ] && kill "$daemon" 2>/dev/null || true
  SLURM_CONF=$work/slurm/etc/slurm.conf scancel --user=root 2>/dev/null || true
  "$root/tests/slurm/stop.sh" "$work/slurm" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

"$root/tests/slurm/start.sh" "$work/slurm" "$(port)" "$(port)" >&2
export SLURM_CONF=$work/slurm/etc/slurm.conf

for i in 0 1 2 3; do
  printf '[[gpu]]\nname = "NVIDIA A100-SXM4-40GB"\nmemory_total = "40GiB"\nuuid = "GPU-%08x-3333-4000-8000-000000000000"\n' "$i"
done > "$work/sim4.toml"
export ORCH_STATE_DIR=$work/orch ORCH_DEVICES=sim:$work/sim4.toml ORCH_SERVER=$work/orch/orch.sock
unset CUDA_VISIBLE_DEVICES
mkdir -p "$ORCH_STATE_DIR"
"$orch" serve >"$work/serve.log" 2>&1 &
daemon=$!
for _ in $(seq 300); do [ -S "$ORCH_SERVER" ] && break; sleep 0.05; done
[ -S "$ORCH_SERVER" ] || { cat "$work/serve.log" >&2; exit 1; }
cd "$work"

now() { date +%s%N; }
# Seconds for N runs of the command in "$@".
loop() {
  local n=$1; shift
  local t0; t0=$(now)
  for _ in $(seq "$n"); do "$@" >/dev/null; done
  local t1; t1=$(now)
  echo "scale=4; $((t1 - t0)) / 1000000000" | bc
}
# A few of each first: binaries and libraries in the page cache, both schedulers awake.
loop 5 "$orch" submit --gpus 1 -- true >/dev/null
loop 5 sbatch --gpus=1 --output=/dev/null --wrap true >/dev/null

# Each loop starts on idle schedulers: the other's jobs are done (at most a minute's wait).
drained() {
  for _ in $(seq 600); do
    [ "$("$orch" jobs --json)" = "[]" ] && [ -z "$(squeue -h -o %i)" ] && return 0
    sleep 0.1
  done
  echo "bench-submit: jobs still queued after a minute" >&2
}
# In four rounds, alternating, so that a neighbour's load that comes and goes weighs on both.
rounds=4
orch_s=0 sbatch_s=0
for round in $(seq "$rounds"); do
  n=$(( runs / rounds + (round <= runs % rounds ? 1 : 0) ))
  drained
  orch_s=$(echo "$orch_s + $(loop "$n" "$orch" submit --gpus 1 -- true)" | bc)
  drained
  sbatch_s=$(echo "$sbatch_s + $(loop "$n" sbatch --gpus=1 --output=/dev/null --wrap true)" | bc)
done
drained
orch_v=$(loop 50 "$orch" --version)
sbatch_v=$(loop 50 sbatch --version)

rate() { echo "scale=1; $runs / $1" | bc; }
echo "orch:   $runs x orch submit --gpus 1 -- true            ${orch_s} s  $(rate "$orch_s")/s  ($(echo "scale=2; 1000 * $orch_s / $runs" | bc) ms each)"
echo "slurm:  $runs x sbatch --gpus=1 --wrap true             ${sbatch_s} s  $(rate "$sbatch_s")/s  ($(echo "scale=2; 1000 * $sbatch_s / $runs" | bc) ms each)"
echo "ratio:  orch's loop takes $(printf '%.2f' "$(echo "scale=4; $orch_s / $sbatch_s" | bc)")x sbatch's (<= 1.00: orch is as fast or faster)"
echo "start-up alone: orch --version $(echo "scale=2; 1000 * $orch_v / 50" | bc) ms, sbatch --version $(echo "scale=2; 1000 * $sbatch_v / 50" | bc) ms"
echo "binary: $orch"
