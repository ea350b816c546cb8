#!/usr/bin/env bash
# The Python package's environment: a virtual environment with maturin, pytest, numpy, torch and
# tensorflow-cpu from PyPI, and the `orch` wheel (crates/orch-py, maturin) installed into it.
# scripts/python-tests.sh and scripts/flake-hunt.py use it; prints nothing else on stdout but
# the venv's path, last.
#
#   scripts/python-env.sh            a fresh venv (CI: what PyPI serves today)
#   ORCH_PY_REUSE=1 scripts/python-env.sh
#                                    keeps a venv that already has the packages (pip is skipped;
#                                    only the wheel is rebuilt and reinstalled)
#   scripts/python-env.sh --packages-only
#                                    the venv and its packages, no wheel (.ci/run makes it while
#                                    the Rust build runs)
#
# The wheel is built with the dev profile into the same target folder as `cargo test`: no release
# build of the workspace. maturin builds orch-py alone; its Cargo.toml names the features the rest
# of the workspace turns on in shared dependencies, so they resolve as in `cargo test --workspace`
# and wasmtime, cranelift and the rest are reused, not compiled again
# (scripts/check-wheel-features.sh checks it). Benches build it with --release
# (scripts/bench-python.sh).
#
# torch: PyPI has no CPU-only torch for x86-64 Linux (the CPU wheels live on PyTorch's own index,
# which CI cannot reach), and its wheel loads the CUDA libraries at import even on a CPU, so the
# plain `pip install torch` (with its nvidia-* packages, ~4 GiB) is what runs the examples here.
# tensorflow-cpu (~1.5 GB, ~20 s) runs the TensorFlow example.
set -euo pipefail
cd "$(dirname "$0")/.."

# Absolute: the tests run from tests/python.
target=$(realpath -m "${CARGO_TARGET_DIR:-target}")
venv="$target/python-tests/venv"
wheels="$target/python-tests/wheels"
packages=("maturin>=1.9.4,<2" pytest numpy torch tensorflow-cpu safetensors)

if [[ "${ORCH_PY_REUSE:-0}" == 1 ]] && "$venv/bin/python" -c 'import maturin, pytest, numpy, torch, tensorflow, safetensors' 2>/dev/null; then
  echo "== python: reusing $venv" >&2
else
  echo "== python: a fresh venv with maturin, pytest and torch" >&2
  rm -rf "$venv"
  python3 -m venv "$venv"
  started=$(date +%s)
  "$venv/bin/pip" install --quiet "${packages[@]}" >&2
  echo "installed in $(( $(date +%s) - started )) s" >&2
fi

if [[ "${1:-}" == --packages-only ]]; then
  echo "$venv"
  exit 0
fi

echo "== python: the wheel" >&2
rm -rf "$wheels"
"$venv/bin/maturin" build --profile dev -m crates/orch-py/Cargo.toml -o "$wheels" >&2
"$venv/bin/pip" install --quiet --force-reinstall --no-deps "$wheels"/orch-*.whl >&2
echo "$venv"
