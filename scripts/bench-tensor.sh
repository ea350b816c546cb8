#!/usr/bin/env bash
# orch-tensor benchmarks beside numpy (and PyTorch CPU when available), in one run.
#
#   scripts/bench-tensor.sh            CPU SGEMM and CPU MLP step beside numpy and PyTorch (CPU);
#                                      GPU benchmarks too when CUDA works
#   ORCH_BENCH_TORCH=0 scripts/...     skip PyTorch (its PyPI wheel pulls ~3 GB of CUDA libraries;
#                                      about 80 s to install here, once per venv)
#   ORCH_BENCH_ROUNDS=N                rounds of alternating runs, best kept (default 3)
#
# Python baselines run in a throwaway venv (ORCH_BENCH_VENV, default /tmp/orch-bench-venv),
# created on first use and reused after. OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE are unset for the
# Python commands only (set on some machines here, they slow OpenBLAS down).
set -euo pipefail
cd "$(dirname "$0")/.."

venv="${ORCH_BENCH_VENV:-/tmp/orch-bench-venv}"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
threads="$(nproc)"

if [[ ! -x "$venv/bin/python" ]]; then
    python3 -m venv "$venv"
fi
if ! "$venv/bin/python" -c 'import numpy' 2>/dev/null; then
    "$venv/bin/pip" install -q numpy
fi
torch=0
if [[ "${ORCH_BENCH_TORCH:-1}" == 1 ]]; then
    if ! "$venv/bin/python" -c 'import torch' 2>/dev/null; then
        "$venv/bin/pip" install -q torch || echo "PyTorch did not install; comparing with numpy only"
    fi
    "$venv/bin/python" -c 'import torch' 2>/dev/null && torch=1
fi

echo "== building the benchmarks (release) =="
cargo bench -q -p orch-tensor --no-run 2>&1 | grep -v '^ *Executable' || true

# The machines here are shared: other work can take a core at any moment. Each round runs every
# side once, alternating, and the tables keep each side's best round.
py() { env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE "$@"; }
rounds="${ORCH_BENCH_ROUNDS:-3}"
for round in $(seq 1 "$rounds"); do
    echo "== round $round of $rounds =="
    for bench in sgemm mlp; do
        cargo bench -q -p orch-tensor --bench "$bench" 2>/dev/null | tee "$out/rust-$bench-$round.txt" | grep -v '^kv '
    done
    OPENBLAS_NUM_THREADS=1 py "$venv/bin/python" scripts/bench_numpy.py 1 >"$out/numpy-1-$round.txt"
    OPENBLAS_NUM_THREADS="$threads" py "$venv/bin/python" scripts/bench_numpy.py all >"$out/numpy-all-$round.txt"
    if [[ "$torch" == 1 ]]; then
        py "$venv/bin/python" scripts/bench_torch.py >"$out/torch-$round.txt"
    fi
done
echo "== GPU =="
cargo bench -q -p orch-tensor --bench gpu 2>/dev/null | tee "$out/rust-gpu-1.txt" | grep -v '^kv '

python3 - "$out" "$threads" <<'PY'
import pathlib, sys
out, threads = pathlib.Path(sys.argv[1]), sys.argv[2]

def load(prefix):
    """Best value of each key over all rounds: highest throughput, lowest time."""
    kv = {}
    for path in sorted(out.glob(prefix + "*.txt")):
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) == 3 and parts[0] == "kv":
                key, value = parts[1], float(parts[2])
                lower_is_better = "mlp" in key
                if key not in kv or (value < kv[key] if lower_is_better else value > kv[key]):
                    kv[key] = value
    return kv

rust = load("rust-")
numpy = load("numpy-")
torch = load("torch-")
versions = [k.replace("_version/", " ") for k in {**numpy, **torch} if "_version/" in k]
peers = [("numpy", numpy)] + ([("torch", torch)] if torch else [])

def cell(v, fmt="{:.1f}"):
    return fmt.format(v) if v is not None else "-"

print()
print(f"CPU SGEMM GFLOP/s, best of the rounds ({threads} cores; ratio = orch / peer, higher is better)")
header = f"{'n':>6} {'threads':>7} {'orch':>8}" + "".join(f" {p:>8} {'ratio':>6}" for p, _ in peers)
print(header)
for n in (256, 1024, 2048):
    for t in ("1", "all"):
        key = f"sgemm/{n}/{t}"
        o = rust.get(key)
        row = f"{n:>6} {t:>7} {cell(o):>8}"
        for _, peer in peers:
            p = peer.get(key)
            row += f" {cell(p):>8} {cell(o / p if o and p else None, '{:.2f}'):>6}"
        print(row)

print()
print("MLP 784-512-256-10 step at batch 128, ms, best of the rounds (ratio = peer / orch, higher means orch is faster)")
print(f"{'threads':>7} {'orch':>8}" + "".join(f" {p:>8} {'ratio':>6}" for p, _ in peers))
for t in ("1", "all"):
    key = f"mlp/{t}"
    o = rust.get(key)
    row = f"{t:>7} {cell(o, '{:.3f}'):>8}"
    for _, peer in peers:
        p = peer.get(key)
        row += f" {cell(p, '{:.3f}'):>8} {cell(p / o if o and p else None, '{:.2f}'):>6}"
    print(row)

gpu = {k: v for k, v in rust.items() if k.startswith("gpu_")}
if gpu:
    print()
    print("GPU (cuda:0)")
    for k, v in sorted(gpu.items()):
        unit = "TFLOP/s" if k.startswith("gpu_sgemm") else "ms/step"
        print(f"  {k:<24} {v:>10.3f} {unit}")
print()
print("peers:", ", ".join(versions) if versions else "none")
PY
