#!/usr/bin/env bash
# A chain of jobs, each `--after-ok` the one before, on `orch serve` over a sim of four GPUs, and
# the same on the local one-node Slurm of the tests (tests/slurm/start.sh), with
# `sbatch --dependency=afterok:PREV`. The chain's first job waits for a file, so that every
# dependant is queued before anything ends; then the file is made and the chain runs down.
#
# Prints, for orch, the median (and p95) time from one job's end to the next one's start, from
# the jobs' recorded ended_at_ms and started_at_ms (N jobs of `true`); then, for both schedulers
# alike, the median time between consecutive jobs' own clock readings (`date +%s%N`, the whole
# job): a chain of M jobs on each, and the ratio of the two.
#
#   scripts/bench-deps.sh [N] [M]          (default 1000 and 30; builds the release orch first:
#                                           cargo build --release --bin orch)
#   ORCH_BIN=PATH scripts/bench-deps.sh    (that orch binary, nothing built)
#   NO_SLURM=1 scripts/bench-deps.sh       (orch alone; Slurm needs root and slurmctld)
set -euo pipefail
cd "$(dirname "$0")/.."
chain=${1:-1000}
short=${2:-30}
root=$PWD
target=$(realpath -m "${CARGO_TARGET_DIR:-target}")
if [ -z "${ORCH_BIN:-}" ]; then
  cargo build --release --bin orch >&2
  ORCH_BIN=$target/release/orch
fi
orch=$(realpath "$ORCH_BIN")
slurm=1
if [ -n "${NO_SLURM:-}" ]; then
  slurm=""
else
  for tool in sbatch slurmctld slurmd munged; do
    command -v "$tool" >/dev/null || { echo "bench-deps: needs $tool (apt-get install slurmctld slurmd slurm-client munge), or NO_SLURM=1" >&2; exit 2; }
  done
  [ "$(id -u)" = 0 ] || { echo "bench-deps: needs root for the local Slurm, or NO_SLURM=1" >&2; exit 2; }
fi

work=$(mktemp -d /tmp/orch-bench-deps.XXXXXX)
chmod 755 "$work"   # munged wants every folder above its socket searchable
daemon=""
cleanup() {
  [ -n "$daemon" ] && kill "$daemon" 2>/dev/null || true
  if [ -n "$slurm" ]; then
    SLURM_CONF=$work/slurm/etc/slurm.conf scancel --user=root 2>/dev/null || true
    "$root/tests/slurm/stop.sh" "$work/slurm" >/dev/null 2>&1 || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT
port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

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

# The middle and the 95th percentile of the numbers (ms) on stdin, and how many.
stats() {
  python3 -c '
import sys
v = sorted(float(x) for x in sys.stdin.read().split())
n = len(v)
med = v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2
p95 = v[min(n - 1, max(0, -(-95 * n // 100) - 1))]
print(f"median {med:.1f} ms, p95 {p95:.1f} ms, min {v[0]:.1f} ms, max {v[-1]:.1f} ms over {n} gaps")
'
}
# Gaps (ms) between consecutive clock readings (ns, one a line) in file $1.
stamp_gaps() { awk 'NR > 1 { printf "%.3f\n", ($1 - prev) / 1e6 } { prev = $1 }' "$1"; }

# An orch chain of $1 jobs running "$2..." after a gated first one; prints the ids, first to last.
orch_chain() {
  local n=$1; shift
  local gate=$work/go-$RANDOM
  local prev
  prev=$("$orch" submit -- sh -c "while [ ! -e $gate ]; do sleep 0.01; done")
  echo "$prev"
  for _ in $(seq 2 "$n"); do
    prev=$("$orch" submit --after-ok "$prev" -- "$@")
    echo "$prev"
  done
  touch "$gate"
  "$orch" wait "$prev" >/dev/null
}

echo "orch: a chain of $chain jobs of \`true\`, each --after-ok the one before ($orch)"
t0=$(date +%s)
orch_chain "$chain" true > ids.txt
echo "  submitted and ran in $(( $(date +%s) - t0 )) s"
"$orch" jobs --all --json > jobs.json
python3 - ids.txt jobs.json > orch-gaps.txt <<'EOF'
import json, sys
ids = [int(x) for x in open(sys.argv[1]).read().split()]
jobs = {int(j["id"]): j for j in json.load(open(sys.argv[2]))}
for a, b in zip(ids, ids[1:]):
    ja, jb = jobs[a], jobs[b]
    assert ja["state"] == "succeeded" and jb["state"] == "succeeded", (ja, jb)
    print(jb["started_at_ms"] - ja["ended_at_ms"])
EOF
echo "  end of one to start of the next (recorded times): $(stats < orch-gaps.txt)"

echo "orch: a chain of $short jobs, each reading the clock (date +%s%N)"
orch_chain "$short" sh -c "date +%s%N >> $work/orch-stamps" > /dev/null
orch_stamps=$(stamp_gaps orch-stamps | stats)
echo "  between consecutive jobs' clock readings: $orch_stamps"

[ -n "$slurm" ] || exit 0
"$root/tests/slurm/start.sh" "$work/slurm" "$(port)" "$(port)" >/dev/null
export SLURM_CONF=$work/slurm/etc/slurm.conf
echo "Slurm: a chain of $short jobs, each --dependency=afterok: the one before, reading the clock"
gate=$work/go-slurm
prev=$(sbatch --parsable --output=/dev/null --wrap "while [ ! -e $gate ]; do sleep 0.01; done")
for _ in $(seq 2 "$short"); do
  prev=$(sbatch --parsable --output=/dev/null --dependency="afterok:$prev" --wrap "date +%s%N >> $work/slurm-stamps")
done
touch "$gate"
for _ in $(seq 6000); do
  [ -z "$(squeue -h -o %i)" ] && break
  sleep 0.1
done
[ -z "$(squeue -h -o %i)" ] || { echo "bench-deps: Slurm's chain did not end in 10 minutes" >&2; exit 1; }
slurm_stamps=$(stamp_gaps slurm-stamps | stats)
echo "  between consecutive jobs' clock readings: $slurm_stamps"
python3 -c '
import sys
o = float(sys.argv[1].split()[1]); s = float(sys.argv[2].split()[1])
print(f"Slurm / orch (medians of the clock readings): {s / o:.1f}x")
' "$orch_stamps" "$slurm_stamps"
