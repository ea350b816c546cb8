#!/usr/bin/env bash
# Installs the toolchains that build plugins in other languages than Rust, into the project's own
# folder (nothing system-wide, no root):
#   target/guest-tools/py     a virtual environment with componentize-py (Python guests)
#   target/guest-tools/node   componentize-js and jco (JavaScript guests), at the versions
#                             examples/policies/coolest-js/package-lock.json pins
# Needs python3 (with venv and pip) and node/npm; reaches PyPI and the npm registry only.
# Safe to run again: a toolchain already at the right version is left alone (well under a second).
# ORCH_GUEST_TOOLS moves the folder.
set -euo pipefail
cd "$(dirname "$0")/.."

COMPONENTIZE_PY=0.25.1
dest=${ORCH_GUEST_TOOLS:-target/guest-tools}
mkdir -p "$dest"

# Python: componentize-py bundles CPython (built for WASI) and its own wasm tools; it needs a
# host Python of 3.10 or later only to run its installer.
py="$dest/py"
if [[ "$("$py/bin/componentize-py" --version 2>/dev/null)" != "componentize-py $COMPONENTIZE_PY"* ]]; then
  start=$SECONDS
  rm -rf "$py"
  if python3 -m venv "$py" 2>/dev/null; then
    "$py/bin/pip" install --quiet --disable-pip-version-check "componentize-py==$COMPONENTIZE_PY"
  else
    # Debian's python3 without python3-venv has no ensurepip: an environment without pip, which
    # the system's pip installs into.
    rm -rf "$py"
    python3 -m venv --without-pip "$py"
    python3 -m pip --python "$py/bin/python" install --quiet --disable-pip-version-check \
      "componentize-py==$COMPONENTIZE_PY"
  fi
  echo "componentize-py $COMPONENTIZE_PY installed in $py ($((SECONDS - start)) s)"
fi
"$py/bin/componentize-py" --version

# JavaScript: the example's lock file is the one list of versions; `npm ci` installs exactly it.
node_dir="$dest/node"
lock=examples/policies/coolest-js/package-lock.json
if ! cmp -s "$lock" "$node_dir/package-lock.json" \
  || [[ ! -x "$node_dir/node_modules/.bin/componentize-js" ]]; then
  start=$SECONDS
  rm -rf "$node_dir"
  mkdir -p "$node_dir"
  cp examples/policies/coolest-js/package.json "$lock" "$node_dir/"
  (cd "$node_dir" && npm ci --no-audit --no-fund --loglevel=error)
  echo "componentize-js installed in $node_dir ($((SECONDS - start)) s)"
fi
echo "componentize-js $(node -p 'require("./'"$node_dir"'/node_modules/@bytecodealliance/componentize-js/package.json").version')"
