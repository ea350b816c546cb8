//! The wasmtime host of orch: one engine, the limits every plugin call runs under, the
//! compile cache, one generic host over the worlds of `orch:plugin` ([`Host`], [`World`]), the
//! policy host that asks a selection policy for a decision and checks its answer, and the queue
//! host that asks a queue policy for the order of the daemon's queue and checks that. The
//! trainer world is the third [`World`] (in orch-trainer, which owns the tensors its imports work
//! on); it loads through the same host, built-ins, cache, limits and [`PluginError`]. Every
//! built-in plugin (policies, queue policies, trainers) is a Wasm component from `plugins/`,
//! built by this crate's build script and embedded here.
//!
//! Design decision: a plugin is untrusted. It runs in a store with a deadline (epoch
//! interruption, driven by a ticker thread), a linear-memory cap and a stack cap, with a WASI
//! context that grants nothing (no files, sockets, environment or arguments; the clocks trap),
//! and every answer is validated against what the host offered. A store that trapped is thrown
//! away and the next call gets a fresh instance from the reused `InstancePre`, so one bad
//! plugin never takes the process, or the next call, down with it. Every host is the same
//! machinery (`runtime.rs`) over a different world.

/// A component the build put in `ORCH_PLUGIN_WASM_DIR`, embedded.
macro_rules! wasm {
    ($file:literal) => {
        include_bytes!(concat!(env!("ORCH_PLUGIN_WASM_DIR"), "/", $file))
    };
}

mod builtin;
mod cache;
mod compat;
mod contract;
mod engine;
mod error;
mod failure;
mod inspect;
mod limits;
mod policy;
mod precompiled;
mod queue;
mod runtime;
mod sandbox;
mod validate;

pub use builtin::{
    BUILTINS, Builtin, TRAINER_BUILTINS, builtin, builtin_names, builtin_plugin, builtin_wasm,
    trainer_builtin,
};
pub use cache::{
    CACHE_DIR_ENV, CACHE_SIZE_ENV, CacheEntry, DEFAULT_CACHE_SIZE, cache_entries, cache_size_limit,
    clear_cache, default_cache_dir,
};
pub use contract::{Found, Identity, WorldKind, identify, mismatch};
pub use orch_wit::Version;
// The engine, cache and sandbox pieces the trainer host (crates/orch-trainer) reuses.
pub use builtin::QUEUE_BUILTINS;
pub use cache::ComponentCache;
pub use engine::{Ticker, deadline_ticks, new_engine, wall_backstop};
pub use error::{PluginError, PluginKind, RefusalKind};
pub use failure::{CallFailure, classify};
pub use inspect::{Inspection, inspect};
pub use limits::Limits;
pub use orch_wit::types;
pub use policy::{PluginId, PluginRef, PolicyHost};
pub use precompiled::{CompiledComponent, ComponentLoader, Precompiler};
pub use queue::{QueueHost, QueuePluginId};
pub use runtime::{Host, Warm, World};
pub use sandbox::{GuestLog, HasPluginState, Limiter, PluginState, add_wasi, printable, shortened};
pub use validate::misfit;

/// Where the build put the guest components (built-ins and the hostile test fixtures).
#[doc(hidden)]
pub const PLUGIN_WASM_DIR: &str = env!("ORCH_PLUGIN_WASM_DIR");
