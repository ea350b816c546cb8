//! The trainer host of orch: runs a Wasm trainer plugin (world `trainer` of `wit/`) on host
//! tensors, one replica per granted device, and turns the run into progress, metrics, a plot
//! and checkpoints.
//!
//! Design decision: **the plugin computes nothing itself, the host computes everything on the
//! plugin's behalf.** Tensors are host resources (handles in each replica's store), so data
//! stays on the device, ops run on orch-tensor's backends, quotas are the job's memory pools,
//! and a plugin can only name its own tensors. Ops are coarse (a fused linear layer, a fused
//! cross-entropy), so a training step is tens of calls across the boundary. Replicas are
//! independent instances in their own threads that meet only at two exchanges: the parameter
//! broadcast after `init` and the gradient all-reduce inside every `optimizer.step`; both
//! combine contributions in rank order, so N replicas reproduce one replica's run up to float
//! rounding, and a run resumed from a checkpoint reproduces the uninterrupted one.
//!
//! ```text
//! Prepared::new() ── loads the plugin on orch-host's generic host (world `TrainerWorld`), loads
//!                    the data (before any device is leased)
//! Prepared::run()  ── makes device pools, spawns replicas, coordinates   (train() = both)
//!   ├─ replica 0 thread: Store<ReplicaState> → init → [train-step]* → eval-step* → snapshot
//!   ├─ replica 1 thread: …                 (meets the others at broadcast / all-reduce)
//!   └─ this thread: events → progress events (RunOptions::progress), metrics.jsonl,
//!                   checkpoint/, plot.svg
//! ```

pub mod checkpoint;
mod collective;
mod coordinator;
mod data;
mod error;
mod host;
mod job;
mod plot;
mod pool;
mod predict;
mod prepare;
mod progress;
mod replica;
pub mod report;
mod run;
pub mod safetensors;
mod state;
mod world;

pub use error::{Stage, TrainError};
pub use job::{DEFAULT_MAX_GRAPH_NODES, GrantedDevice, RunOptions, Summary, TrainJob};
pub use predict::{
    DEFAULT_SAMPLE_TOKENS, Evaluation, Model, Prediction, SAMPLE_TEMPERATURE, Sample,
    SampleOptions, predict,
};
pub use prepare::Prepared;
pub use progress::{ProgressEvent, ProgressSink};
pub use run::train;

/// Where the build (orch-host's build script, which builds every guest plugin) put the guest
/// components, the trainer test fixtures among them.
#[doc(hidden)]
pub const TRAINER_WASM_DIR: &str = orch_host::PLUGIN_WASM_DIR;
