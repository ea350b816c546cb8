//! The policy host's integration tests, in one binary (each test binary links wasmtime).

mod builtins;
mod cache;
mod common;
mod hostile;
