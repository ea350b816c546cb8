//! The policy and queue hosts' integration tests, in one binary (each test binary links wasmtime).

mod builtins;
mod cache;
mod common;
mod compat;
mod hostile;
mod queue;
mod topology;
