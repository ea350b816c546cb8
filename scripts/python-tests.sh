#!/usr/bin/env bash
# The Python package's tests: builds the `orch` wheel (crates/orch-py, maturin) into a fresh
# virtual environment with pytest, numpy and torch from PyPI, then runs tests/python against it (the
# sim inventory; the daemon tests start `orch serve` themselves).
#
# The wheel is built with the dev profile into the same target folder as `cargo test`: no release
# build of the workspace. maturin builds orch-py alone, whose features unify differently from
# `cargo test --workspace`'s, so wasmtime and cranelift are compiled once more for it (~3 min on
# 2 cores); the other dependencies are reused. Benches build it with --release
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

echo "== python: a fresh venv with maturin, pytest and torch"
rm -rf "$venv" "$wheels"
python3 -m venv "$venv"
started=$(date +%s)
"$venv/bin/pip" install --quiet "maturin>=1.9.4,<2" pytest numpy torch tensorflow-cpu
echo "installed in $(( $(date +%s) - started )) s"

echo "== python: the wheel"
"$venv/bin/maturin" build --profile dev -m crates/orch-py/Cargo.toml -o "$wheels"
"$venv/bin/pip" install --quiet "$wheels"/orch-*.whl

# The daemon tests start the `orch` binary `cargo test` built (or build it now).
if [ ! -x "$target/debug/orch" ]; then
  cargo build -p orch-cli
fi
export ORCH_BIN
ORCH_BIN=$(realpath "$target/debug/orch")
export ORCH_REQUIRE_TORCH=1
export ORCH_REQUIRE_TENSORFLOW=1

echo "== python: tests/python"
# Run from the tests folder so the checkout's crates/orch-py/python never shadows the wheel.
cd tests/python
"$venv/bin/python" -m pytest -q -p no:cacheprovider
