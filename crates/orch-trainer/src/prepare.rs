//! What a training job needs before any device: the trainer loaded through orch-host's generic
//! host (a built-in by name or a component from a file, compiled or found in the compile cache,
//! checked to be a trainer and linked against the trainer world's imports) and the data loaded.
//! Bad input in either shows here, before any device is leased. [`Prepared::run`] (in `run`)
//! then trains; [`crate::Model::load`] builds a model from it.

use crate::data;
use crate::error::TrainError;
use crate::job::{RunOptions, TrainJob};
use crate::world::{AnyTrainerPre, TrainerWorld};
use orch_core::MachineLimits;
use orch_host::{Host, Limits, Ticker, default_cache_dir};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use wasmtime::Engine;

/// A job with everything that needs no device done: the plugin read, compiled and checked to be
/// a trainer, the data loaded. Bad input in either shows here, before any device is leased.
pub struct Prepared<'a> {
    pub(crate) job: TrainJob<'a>,
    pub(crate) options: RunOptions,
    /// The trainer's name, as messages and checkpoints give it.
    pub(crate) plugin: String,
    /// The SHA-256 of the trainer's component, which checkpoints record.
    pub(crate) sha: String,
    pub(crate) data: data::Data,
    pub(crate) limits: Limits,
    /// The host the trainer was loaded on (no ticker until [`Prepared::start_ticker`]).
    pub(crate) host: Host<TrainerWorld>,
    /// The trainer, on `host`.
    pub(crate) trainer: usize,
}

impl std::fmt::Debug for Prepared<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prepared")
            .field("job", &self.job.name)
            .field("plugin", &self.plugin)
            .field("samples", &self.data.train.len())
            .finish_non_exhaustive()
    }
}

impl<'a> Prepared<'a> {
    pub fn new(job: &TrainJob<'a>, options: &RunOptions) -> Result<Prepared<'a>, TrainError> {
        let spec = job.spec;
        let limits = trainer_limits(job)?;
        let cache_dir = options.cache_dir.clone().or_else(default_cache_dir);
        let mut host = Host::<TrainerWorld>::without_ticker(limits, cache_dir)?;
        let trainer = host.load(&spec.plugin, &limits)?;
        let data = data::load(&spec.data)?;
        Ok(Prepared {
            job: job.clone(),
            options: options.clone(),
            plugin: host.name(trainer).to_string(),
            // Loaded from bytes, never given compiled: the digest is known.
            sha: host.sha256(trainer).unwrap_or_default(),
            data,
            limits,
            host,
            trainer,
        })
    }

    /// Stops the run at the end of the step in which `flag` is set, with a checkpoint
    /// ([`RunOptions::stop_when`]).
    pub fn stop_when(&mut self, flag: Arc<AtomicBool>) {
        self.options.stop_when = Some(flag);
    }

    /// The ticker that makes the trainer's deadlines work while it is held: deadlines tick only
    /// while the plugin runs (not while `orch run --wait` waits for devices).
    pub(crate) fn start_ticker(&self) -> Result<Ticker, TrainError> {
        Ok(self.host.start_ticker()?)
    }

    pub(crate) fn engine(&self) -> &Engine {
        self.host.engine()
    }

    /// The trainer's bindings, from which each replica makes its instance.
    pub(crate) fn pre(&self) -> &AnyTrainerPre {
        self.host.pre(self.trainer)
    }
}

/// The limits of the job's trainer: its `[train]` deadline and memory, within the machine's
/// maxima.
fn trainer_limits(job: &TrainJob<'_>) -> Result<Limits, TrainError> {
    let machine = MachineLimits::current().map_err(|e| TrainError::Setup(e.to_string()))?;
    let bounds = machine
        .resolve(orch_core::limits::PluginKind::Trainer, &job.spec.limits)
        .map_err(|e| TrainError::Setup(e.to_string()))?;
    Ok(Limits::default().with_bounds(bounds))
}
