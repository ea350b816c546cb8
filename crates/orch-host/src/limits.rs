//! What a plugin call may spend.

use std::time::Duration;

/// The limits every plugin instance runs under. `Limits::default()` is what `orch` uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Wall-clock time for one decision (instantiation included); the plugin is stopped after.
    pub deadline: Duration,
    /// Linear memory, bytes, all memories of the instance together.
    pub memory_bytes: usize,
    /// Wasm stack, bytes (`Config::max_wasm_stack`).
    pub max_wasm_stack: usize,
    /// Elements per table.
    pub table_elements: usize,
    /// Core instances, tables and memories a component may create.
    pub instances: usize,
    pub tables: usize,
    pub memories: usize,
    /// Bytes of guest stdout/stderr logged per call; the rest is dropped.
    pub log_bytes_per_call: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            deadline: Duration::from_millis(100),
            memory_bytes: 64 << 20,
            max_wasm_stack: 512 << 10,
            table_elements: 10_000,
            instances: 32,
            tables: 32,
            memories: 4,
            log_bytes_per_call: 16 << 10,
        }
    }
}
