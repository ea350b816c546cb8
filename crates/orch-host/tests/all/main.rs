//! The policy and queue hosts' integration tests, in one binary (each test binary links wasmtime).

mod builtins;
mod cache;
mod common;
mod hostile;
mod queue;
