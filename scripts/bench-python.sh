#!/usr/bin/env bash
# `import orch; orch.use(gpus=1)` in a fresh interpreter, against `import torch` for scale.
# Builds the release wheel into its own virtual environment (torch from PyPI, ~4 GiB, unless
# the environment has it), then times N fresh interpreters of each on the 8-GPU sim: the time
# from the interpreter's first line to the lease applied, so the interpreter's own start (the
# same for every Python program) is left out; it is printed beside as `python -c pass`.
#
#   scripts/bench-python.sh [N]        (default 30)
#   BENCH_VENV=PATH scripts/bench-python.sh   (an existing venv, torch in it: no 4 GiB install)
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-30}
target=${CARGO_TARGET_DIR:-target}
venv=${BENCH_VENV:-$target/bench-python/venv}
wheels="$target/bench-python/wheels"

if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
"$venv/bin/pip" install --quiet "maturin>=1.9.4,<2"
"$venv/bin/python" -c "import torch" 2>/dev/null || "$venv/bin/pip" install --quiet torch
rm -rf "$wheels"
"$venv/bin/maturin" build --release --quiet -m crates/orch-py/Cargo.toml -o "$wheels"
"$venv/bin/pip" install --quiet --force-reinstall --no-deps "$wheels"/orch-*.whl

state=$(mktemp -d)
trap 'rm -rf "$state"' EXIT
export ORCH_STATE_DIR="$state" ORCH_DEVICES="sim:$PWD/examples/sim/lab-8gpu.toml"
unset CUDA_VISIBLE_DEVICES ORCH_SERVER
cd "$state"
"$venv/bin/python" - "$runs" "$venv/bin/python" <<'PY'
import statistics, subprocess, sys, time

runs, python = int(sys.argv[1]), sys.argv[2]
PROBE = (
    "import time; t0 = time.perf_counter()\n"
    "{body}\n"
    "print((time.perf_counter() - t0) * 1000)\n"
)
cases = {
    "import orch + orch.use(gpus=1)": "import orch; orch.use(gpus=1)",
    "import orch": "import orch",
    "import torch": "import torch",
}

def once(body):
    out = subprocess.run([python, "-c", PROBE.format(body=body)], capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])

def wall(args):
    t0 = time.perf_counter()
    subprocess.run([python, *args], check=True, capture_output=True)
    return (time.perf_counter() - t0) * 1000

for body in cases.values():
    once(body)  # warm: the policy's compiled form goes to the disk cache, files to the page cache
print(f"{runs} fresh interpreters each, milliseconds (median / p90 / max)")
for name, body in cases.items():
    times = sorted(once(body) for _ in range(runs))
    p90 = times[int(0.9 * (len(times) - 1))]
    print(f"  {name:34s} {statistics.median(times):7.1f} / {p90:7.1f} / {times[-1]:7.1f}")
starts = sorted(wall(["-c", "pass"]) for _ in range(runs))
print(f"  {'(python -c pass, whole process)':34s} {statistics.median(starts):7.1f}")
PY
