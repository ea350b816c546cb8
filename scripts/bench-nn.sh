#!/usr/bin/env bash
# The nn kernels of orch-tensor (the reference CNN's two conv2d layers and its max pooling,
# causal attention, layer norm, embedding; forward and forward+backward) beside PyTorch CPU on
# the same number of threads, in one table.
#
#   scripts/bench-nn.sh                 all cores
#   ORCH_BENCH_THREADS=N                threads for both sides (default: nproc)
#   ORCH_BENCH_VENV=DIR                 a venv with torch (default target/python-tests/venv, as
#                                       scripts/python-env.sh makes it, else
#                                       /tmp/orch-bench-venv, where torch is installed on first use)
#   ORCH_BENCH_ROUNDS=N                 rounds of alternating runs, best kept (default 3)
#
# ratio = orch ms / PyTorch ms: below 1.0 orch is faster.
set -euo pipefail
cd "$(dirname "$0")/.."

threads="${ORCH_BENCH_THREADS:-$(nproc)}"
venv="${ORCH_BENCH_VENV:-target/python-tests/venv}"
[[ -x "$venv/bin/python" ]] || venv=/tmp/orch-bench-venv
if [[ ! -x "$venv/bin/python" ]]; then
    python3 -m venv "$venv"
fi
torch=1
if ! "$venv/bin/python" -c 'import torch' 2>/dev/null; then
    "$venv/bin/pip" install -q torch || { echo "PyTorch did not install; orch side only"; torch=0; }
fi
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT

echo "== building the benchmark (release) =="
cargo bench -q -p orch-tensor --bench nn_ops --no-run 2>&1 | grep -v '^ *Executable' || true
rounds="${ORCH_BENCH_ROUNDS:-3}"
for round in $(seq 1 "$rounds"); do
    echo "== round $round of $rounds =="
    cargo bench -q -p orch-tensor --bench nn_ops -- "$threads" 2>/dev/null | tee "$out/orch-$round.txt" | grep -v '^kv '
    if [[ "$torch" == 1 ]]; then
        env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE "$venv/bin/python" scripts/bench_nn_torch.py "$threads" >"$out/torch-$round.txt"
    fi
done

python3 - "$out" "$threads" <<'PY'
import pathlib, sys
out, threads = pathlib.Path(sys.argv[1]), sys.argv[2]

def load(prefix):
    """Lowest time of each key over the rounds (the machines here are shared)."""
    kv = {}
    for path in sorted(out.glob(prefix + "-*.txt")):
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) == 3 and parts[0] == "kv":
                key, value = parts[1], float(parts[2])
                if key not in kv or value < kv[key]:
                    kv[key] = value
    return kv

orch, torch = load("orch"), load("torch")
print()
print(f"nn kernels, ms per call, best of the rounds, {threads} threads (ratio = orch / PyTorch; < 1 is faster)")
print(f"{'op':<28} {'orch':>10} {'torch':>10} {'ratio':>7}")
for key in sorted(k for k in orch if k.startswith("nn/")):
    o, t = orch[key], torch.get(key)
    ratio = f"{o / t:.2f}" if t else "-"
    tcell = f"{t:.3f}" if t else "-"
    print(f"{key[3:]:<28} {o:>10.3f} {tcell:>10} {ratio:>7}")
versions = [k.split("/", 1)[1] for k in torch if k.startswith("torch_version/")]
print("PyTorch:", versions[0] if versions else "not run")
PY
