//! What a plugin call may spend.

use std::time::Duration;

/// The limits every plugin instance runs under. `Limits::default()` is what `orch` uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
        let defaults = orch_core::limits::PluginKind::Policy.defaults();
        Limits {
            deadline: defaults.deadline,
            memory_bytes: usize::try_from(defaults.memory).unwrap_or(usize::MAX),
            max_wasm_stack: 512 << 10,
            table_elements: 10_000,
            instances: 32,
            tables: 32,
            memories: 4,
            log_bytes_per_call: 16 << 10,
        }
    }
}

impl Limits {
    /// These limits with the deadline and memory cap of `bounds` (a job's, within the
    /// machine's maxima).
    pub fn with_bounds(self, bounds: orch_core::Bounds) -> Limits {
        Limits {
            deadline: bounds.deadline,
            memory_bytes: usize::try_from(bounds.memory).unwrap_or(usize::MAX),
            ..self
        }
    }

    /// The limits of a queue policy: the default's, with the queue's default deadline and
    /// memory (`orch_core::limits::PluginKind::Queue`: 250 ms, 64 MiB).
    ///
    /// Why another deadline: a placement decision sees a machine's few devices, but a queue
    /// pass sees the whole queue, so its cost grows with it. The host's copying of the jobs in
    /// and the ranking out dominates (`cargo bench -p orch-host --bench queue`): `fair-share`
    /// orders 10,000 jobs of 50 tenants in ~6.5 ms warm and ~7 ms on a fresh instance in a
    /// release build, ~110 ms in a debug build. 250 ms leaves a loaded machine (or a debug
    /// build) room for such a queue, while a policy that never returns still costs a pass no
    /// more than a quarter of a second. Memory stays at 64 MiB: the built-ins fit a queue of
    /// ~200,000 jobs in it. `[queue] deadline` and `memory` in serve.toml change both.
    pub fn queue_default() -> Limits {
        Limits::default().with_bounds(orch_core::limits::PluginKind::Queue.defaults())
    }
}
