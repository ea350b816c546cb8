//! The vocabulary of a training job that the run, its coordinator and a trained [`Model`]
//! share: the devices granted, the job, how to run it and how the run ended. A leaf: it uses
//! nothing of the modules that drive a run (`run`, `coordinator`, `replica`, `predict`), which
//! all use it.
//!
//! [`Model`]: crate::Model

use crate::progress::ProgressSink;
use orch_core::job::TrainSpec;
use orch_tensor::{Device, MemoryPool};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

/// A device the job was granted, as the trainer computes on it.
#[derive(Debug, Clone)]
pub struct GrantedDevice {
    /// `Cpu`, `Sim(i)` (computed on the CPU, capped at the simulated memory) or `Cuda(i)`.
    pub device: Device,
    pub name: String,
    pub memory_total: Option<u64>,
    pub memory_free: Option<u64>,
    /// The device-wide pool the job's pool nests in (jobs sharing a device share it); `None`:
    /// one made here, capped at `memory_free`, else `memory_total` (the CPU: the host's
    /// available memory).
    pub pool: Option<Arc<MemoryPool>>,
}

impl GrantedDevice {
    /// The host CPU, with a pool capped at the host's available memory.
    pub fn cpu() -> GrantedDevice {
        GrantedDevice {
            device: Device::Cpu,
            name: "host CPU".into(),
            memory_total: None,
            memory_free: None,
            pool: None,
        }
    }
}

/// The job to train.
#[derive(Debug, Clone)]
pub struct TrainJob<'a> {
    pub name: &'a str,
    pub spec: &'a TrainSpec,
    /// `[resources] memory_limit`: the per-device quota of the job's tensors.
    pub memory_limit: Option<u64>,
}

/// How to run it.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// Continue from the checkpoint in the output folder.
    pub resume: bool,
    /// Where the run's progress events go (`None`: nowhere).
    pub progress: Option<ProgressSink>,
    /// Tensor handles one replica may hold at once.
    pub max_tensors: u32,
    /// Autograd graph nodes one replica may keep alive at once: host memory no device quota
    /// sees (about 390 bytes a node, measured in docs/TRAINERS.md).
    pub max_graph_nodes: usize,
    /// Stop after this many steps, with a checkpoint (a deliberate interruption, for tests).
    pub stop_after: Option<u64>,
    /// Once this is set (by a signal's handler: the job's warning signal, SIGTERM), stop at the
    /// end of the current step with a checkpoint; every replica stops at the same step.
    pub stop_when: Option<Arc<AtomicBool>>,
    /// Compiled-component cache (`None`: [`orch_host::default_cache_dir`]).
    pub cache_dir: Option<PathBuf>,
}

impl Default for RunOptions {
    fn default() -> RunOptions {
        RunOptions {
            resume: false,
            progress: None,
            max_tensors: 4096,
            max_graph_nodes: DEFAULT_MAX_GRAPH_NODES,
            stop_after: None,
            stop_when: None,
            cache_dir: None,
        }
    }
}

/// A replica's default bound on live autograd graph nodes, about 100 MiB of host memory: a
/// step of the bundled MLP keeps about a dozen, a deep model a few thousand.
pub const DEFAULT_MAX_GRAPH_NODES: usize = 1 << 18;

/// How a run ended.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    /// Steps done, over the run (a resumed run counts the steps before it too).
    pub steps: u64,
    pub final_loss: Option<f32>,
    pub eval_loss: Option<f64>,
    pub eval_accuracy: Option<f64>,
    /// Stopped by `RunOptions::stop_after`.
    pub stopped_early: bool,
    pub seconds: f64,
    pub samples_per_sec: f64,
    pub out: PathBuf,
    pub replicas: usize,
    /// Text: the closing sample ([`crate::ProgressEvent::Sample`]), when one was written.
    pub sample: Option<String>,
}

/// Rows of an evaluation batch: text is scored on windows of the training batch's size, as
/// nanoGPT's estimate does; a table on batches of at least 256 (fewer calls, the same mean).
pub(crate) fn eval_batch_size(batch_size: u32, text: bool) -> usize {
    if text {
        batch_size as usize
    } else {
        (batch_size as usize).max(256)
    }
}
