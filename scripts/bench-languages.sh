#!/usr/bin/env bash
# The `coolest` policy in Rust, Python and JavaScript, side by side: builds the three examples
# (examples/policies/coolest, coolest-py, coolest-js) into target/bench-languages/ and runs
# crates/orch-host/benches/languages.rs in release, which prints one row per language (size,
# first compile, cached load, warm decision at 8 and 64 candidates, fresh-instance decision,
# the memory a fresh instance needs). Installs the Python and JavaScript toolchains first
# (scripts/guest-toolchains.sh) when they are missing.
set -euo pipefail
cd "$(dirname "$0")/.."
out=$PWD/target/bench-languages
mkdir -p "$out"
scripts/guest-toolchains.sh >/dev/null

(
  cd examples/policies/coolest
  env -u RUSTFLAGS -u CARGO_ENCODED_RUSTFLAGS \
    cargo build --quiet --release --target wasm32-wasip2 --target-dir "$out/coolest-target"
)
cp "$out/coolest-target/wasm32-wasip2/release/coolest.wasm" "$out/coolest.wasm"
for lang in py js; do
  start=$SECONDS
  "examples/policies/coolest-$lang/build.sh" "$out/coolest-$lang.wasm" >/dev/null
  echo "coolest-$lang built in $((SECONDS - start)) s"
done

ORCH_BENCH_RUST=$out/coolest.wasm \
  ORCH_BENCH_PYTHON=$out/coolest-py.wasm \
  ORCH_BENCH_JAVASCRIPT=$out/coolest-js.wasm \
  cargo bench -p orch-host --bench languages
