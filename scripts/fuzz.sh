#!/usr/bin/env bash
# Runs every fuzz target (crates/orch-fuzz/tests/fuzz_*.rs) one after the other, each for SECONDS
# (default 20) or CASES cases (default 1000000), whichever ends first, and prints the executions
# each ran. `.ci/run` runs it with the defaults (about 100 s on two cores, after the build that
# `cargo test --workspace` already made); by hand, give it longer: `scripts/fuzz.sh 600`.
# A failure prints the shrunk input and ORCH_FUZZ_SEED=... to replay it (docs/TESTING.md).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-20}
cases=${2:-1000000}
targets=(fuzz_job fuzz_sim fuzz_visibility fuzz_tensor fuzz_layers)
args=()
for t in "${targets[@]}"; do args+=(--test "$t"); done

# --workspace keeps the features `cargo test --workspace` resolved, so nothing is rebuilt.
cargo test --workspace "${args[@]}" --no-run
export ORCH_FUZZ_SECONDS=$seconds ORCH_FUZZ_CASES=$cases RUST_BACKTRACE=${RUST_BACKTRACE:-0}
# A hang inside one case is caught here (timeout signals the test binaries too): no target may
# run much past its budget, shrinking a failure included.
limit=$(( (seconds + 90) * ${#targets[@]} ))
timeout --signal=KILL "$limit" cargo test --workspace "${args[@]}" -- --nocapture
