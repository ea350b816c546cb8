#!/usr/bin/env bash
# The reference trainers, orch beside PyTorch CPU in one run (scripts/bench_trainers.py):
# cnn-small on MNIST (3 epochs) and the character GPT on Shakespeare (2000 steps), epoch and step
# times as ratios, accuracy and val loss, peak host memory of each run.
#
#   scripts/bench-trainers.sh                  both, 2 threads each
#   scripts/bench-trainers.sh --only gpt       one of them (--gpt-steps N, --cnn-epochs N)
#   ORCH_BENCH_VENV=DIR                        a venv with torch (default target/python-tests/venv,
#                                              as scripts/python-env.sh makes it, else
#                                              /tmp/orch-bench-venv, made on first use)
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${ORCH_BENCH_VENV:-target/python-tests/venv}"
[[ -x "$venv/bin/python" ]] || venv=/tmp/orch-bench-venv
if [[ ! -x "$venv/bin/python" ]]; then
    python3 -m venv "$venv"
fi
python=("--python" "$venv/bin/python")
if ! "$venv/bin/python" -c 'import torch, numpy' 2>/dev/null; then
    "$venv/bin/pip" install -q torch numpy || { echo "PyTorch did not install; orch side only"; python=(); }
fi
echo "== building orch (release) =="
cargo build -q --release -p orch-cli
exec python3 scripts/bench_trainers.py "${python[@]}" "$@"
