#!/usr/bin/env bash
# The Python package's tests: the `orch` wheel in a fresh virtual environment with pytest, numpy
# and torch (scripts/python-env.sh; ORCH_PY_REUSE=1 keeps an existing one), then tests/python
# against it (the sim inventory; the daemon tests start `orch serve` themselves). Arguments go to
# pytest: `scripts/python-tests.sh -k ddp`.
set -euo pipefail
cd "$(dirname "$0")/.."

venv=$(./scripts/python-env.sh)
target=$(realpath -m "${CARGO_TARGET_DIR:-target}")

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
"$venv/bin/python" -m pytest -q -p no:cacheprovider "$@"
