#!/usr/bin/env bash
# Builds the JavaScript `coolest` policy into a component: ./build.sh [OUT.wasm]
# (default target/coolest-js.wasm). Needs node and componentize-js (`npm ci` here, or
# scripts/guest-toolchains.sh, which installs this folder's package-lock.json into
# target/guest-tools/node); COMPONENTIZE_JS names another one.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=$(realpath -m "${1:-$here/target/coolest-js.wasm}")
tool=${COMPONENTIZE_JS:-}
if [[ -z $tool ]]; then
  for candidate in "$here/node_modules/.bin/componentize-js" \
    "$here/../../../target/guest-tools/node/node_modules/.bin/componentize-js"; do
    if [[ -x $candidate ]]; then
      tool=$candidate
      break
    fi
  done
fi
if [[ -z $tool ]]; then
  echo "componentize-js not found: npm ci here, or run scripts/guest-toolchains.sh" >&2
  exit 1
fi
mkdir -p "$(dirname "$out")"
cd "$here"
# --disable: the engine's optional WASI features. orch grants none of them (random, clocks,
# http, fetch-event); stdio stays, so console.log and uncaught errors reach orch's log.
"$tool" coolest.js --wit ../../../wit --world-name policy \
  --disable random clocks http fetch-event -o "$out"
echo "built $out"
