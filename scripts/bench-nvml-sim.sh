#!/usr/bin/env bash
# `orch devices --json` through the simulated NVML library (`--devices nvml`, ORCH_NVML_LIBRARY)
# against the sim backend (`--devices sim:FILE`) on the 8-GPU HGX box (examples/sim/hgx-8gpu.toml):
#
# 1. in one process: `nvml::read()` against `sim::read()`, medians of READS reads each in four
#    alternating rounds (crates/orch-devices/examples/bench_nvml_sim.rs, release);
# 2. the command, end to end: RUNS runs of each `orch devices --json`, one of each in turn, the
#    median of each and their ratio.
#
#   scripts/bench-nvml-sim.sh [RUNS [READS]]   (default 100 and 400; builds the release orch,
#                                               the library and the example first)
#   ORCH_BIN=PATH scripts/bench-nvml-sim.sh     (that orch binary for part 2, orch not built)
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-100}
reads=${2:-400}
target=$(realpath -m "${CARGO_TARGET_DIR:-target}")
file=$PWD/examples/sim/hgx-8gpu.toml
cargo build --release -p orch-nvml-sim >&2
cargo build --release -p orch-devices --example bench_nvml_sim >&2
if [ -z "${ORCH_BIN:-}" ]; then
  cargo build --release -p orch-cli >&2
  ORCH_BIN=$target/release/orch
fi
orch=$(realpath "$ORCH_BIN")
export ORCH_NVML_LIBRARY=$target/release/liborch_nvml_sim.so ORCH_NVML_SIM=$file
unset CUDA_VISIBLE_DEVICES ORCH_DEVICES
work=$(mktemp -d /tmp/orch-bench-nvml-sim.XXXXXX)
trap 'rm -rf "$work"' EXIT
export ORCH_STATE_DIR=$work/state

echo "== in one process (release): $reads reads each"
"$target/release/examples/bench_nvml_sim" "$file" "$reads"

echo "== orch devices --json, end to end ($orch): $runs runs each"
# The same box from both (the backend name apart), or the timing means nothing.
diff <("$orch" --devices nvml devices --json | grep -v '"backend"') \
  <("$orch" --devices "sim:$file" devices --json | grep -v '"backend"') >/dev/null \
  || { echo "bench-nvml-sim: the two backends print different boxes" >&2; exit 1; }
now() { date +%s%N; }
# Nanoseconds of one run of "$@", appended to the file $1.
time_run() {
  local out=$1; shift
  local t0; t0=$(now)
  "$@" >/dev/null
  echo $(( $(now) - t0 )) >>"$out"
}
# One of each in turn, so a busy spell of the machine falls on both alike.
: >"$work/nvml"; : >"$work/sim"
for _ in $(seq "$runs"); do
  time_run "$work/nvml" "$orch" --devices nvml devices --json
  time_run "$work/sim" "$orch" --devices "sim:$file" devices --json
done
median_ms() { sort -n "$1" | awk '{ v[NR] = $1 } END { printf "%.2f", v[int((NR + 1) / 2)] / 1e6 }'; }
nvml_ms=$(median_ms "$work/nvml")
sim_ms=$(median_ms "$work/sim")
echo "orch --devices nvml devices --json (simulated NVML library): $nvml_ms ms (median)"
echo "orch --devices sim:FILE devices --json:                      $sim_ms ms (median)"
echo "ratio nvml/sim: $(awk -v a="$nvml_ms" -v b="$sim_ms" 'BEGIN { printf "%.2f", a / b }')"
