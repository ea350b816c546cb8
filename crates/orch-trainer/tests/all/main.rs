//! The trainer host's integration tests, one binary: real Wasm trainers (the built-in `mlp`
//! and the `trainer-fixture` component built from plugins/trainer-fixtures) on the bundled
//! 8x8 digits, on the CPU and on simulated GPUs.

mod common;
mod contract;
mod contract_nn;
mod data;
mod gpt;
mod hostile;
mod learn;
mod parallel;
mod plugin_host;
mod progress;
mod quota;
mod resume;
mod trust;
