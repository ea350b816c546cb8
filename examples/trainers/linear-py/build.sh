#!/usr/bin/env bash
# Builds the Python `linear` trainer into a component: ./build.sh [OUT.wasm]
# (default target/linear-py.wasm). Needs componentize-py 0.25 (`pip install
# componentize-py==0.25.1`, or scripts/guest-toolchains.sh, which puts it in
# target/guest-tools/py); COMPONENTIZE_PY names another one.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=$(realpath -m "${1:-$here/target/linear-py.wasm}")
tool=${COMPONENTIZE_PY:-}
if [[ -z $tool ]]; then
  if [[ -x $here/../../../target/guest-tools/py/bin/componentize-py ]]; then
    tool=$here/../../../target/guest-tools/py/bin/componentize-py
  elif command -v componentize-py >/dev/null; then
    tool=componentize-py
  else
    echo "componentize-py not found: pip install componentize-py==0.25.1, or run scripts/guest-toolchains.sh" >&2
    exit 1
  fi
fi
mkdir -p "$(dirname "$out")"
cd "$here"
# -d: the contract; -w: its world; `linear` is the module (linear.py) that implements it.
"$tool" --quiet -d ../../../wit -w trainer componentize linear -o "$out"
echo "built $out"
