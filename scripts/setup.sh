#!/usr/bin/env bash
# Installs what building orch needs beyond the Rust toolchain: the wasm32-wasip2 target (plugins are
# built for it) and rustfmt/clippy. `rust-toolchain.toml` lists them, but with RUSTUP_AUTO_INSTALL=0
# rustup installs nothing by itself. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
installed=$(rustup target list --installed)
if ! grep -qx wasm32-wasip2 <<<"$installed"; then
  rustup target add wasm32-wasip2
fi
components=$(rustup component list --installed)
for c in rustfmt clippy; do
  grep -q "^$c" <<<"$components" || rustup component add "$c"
done
