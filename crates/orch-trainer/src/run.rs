//! A training job from start to end. [`Prepared::new`] (in `prepare`) does what needs no
//! device (read and compile the plugin, load the data), so a caller can do it before it leases
//! any; then [`Prepared::run`] sets up the devices' pools, starts one replica thread per
//! replica, and, in this thread, gathers what they report into progress, metrics and
//! checkpoints. Each phase of a run is a function of its own, named for it.

use crate::checkpoint::{self, Checkpoint, FORMAT, Meta};
use crate::collective::Collective;
use crate::coordinator::Coordinator;
use crate::data::{Data, Schedule};
use crate::error::TrainError;
use crate::host::{DeviceSlot, Shared};
use crate::job::{GrantedDevice, RunOptions, Summary, TrainJob, eval_batch_size};
use crate::prepare::Prepared;
use crate::progress::{Pace, ProgressEvent, ProgressSink, Reporter};
use crate::replica::{Plan, Replica, Start};
use crate::report::Metrics;
use crate::world::AnyTrainerPre;
use orch_core::job::TrainSpec;
use orch_host::Limits;
use orch_tensor::Device;
use std::sync::Arc;
use wasmtime::Engine;

/// Trains `job` on `devices` (one replica per device unless `[train] replicas` says fewer):
/// [`Prepared::new`], then [`Prepared::run`].
pub fn train(
    job: &TrainJob<'_>,
    devices: &[GrantedDevice],
    options: &RunOptions,
) -> Result<Summary, TrainError> {
    Prepared::new(job, options)?.run(devices)
}

impl Prepared<'_> {
    /// Runs the job on `devices`, to its end or its failure.
    pub fn run(self, devices: &[GrantedDevice]) -> Result<Summary, TrainError> {
        // Epoch deadlines tick only while the plugin runs (not while `orch run --wait` waits).
        let _ticker = self.start_ticker()?;
        let spec = self.job.spec;
        let replicas = replica_count(spec, devices)?;
        let schedule = schedule_of(spec, &self.data, replicas)?;
        let slots = DeviceSlot::of_devices(devices, self.job.memory_limit)?;
        create_output_folder(spec)?;
        let resume = if self.options.resume {
            Some(resume_from(&self.job, &self.sha, &schedule)?)
        } else {
            None
        };
        let start = resume.as_ref().map_or_else(Start::default, start_of);
        if start.step >= schedule.total_steps() {
            return Ok(nothing_to_resume(&self.job, &self.options, start, replicas));
        }
        let Prepared {
            job,
            options,
            plugin,
            sha,
            data,
            limits,
            host,
            trainer,
        } = self;
        let (engine, pre) = (host.engine(), host.pre(trainer));
        let shared = Arc::new(shared_state(spec, &options, limits, slots, data, replicas));
        let plan = replica_plan(spec, &options, &plugin, schedule, start, limits, &shared);
        let meta_template = checkpoint_template(&job, &plugin, sha, &schedule, &shared);
        let run = Run {
            plan: &plan,
            engine,
            pre,
            shared: &shared,
            resume: resume.as_ref(),
            meta_template: &meta_template,
        };
        let mut coordinator = start_reporting(&job, &options, devices, &run)?;
        run.replicas(devices, &mut coordinator);
        let mut summary = coordinator.finish(job.name)?;
        if !summary.stopped_early && shared.data.train.is_text() {
            summary.sample = closing_sample(&job, &options, &run);
        }
        Ok(summary)
    }
}

/// What the replica threads of one run share, once it is set up.
struct Run<'r> {
    plan: &'r Plan,
    engine: &'r Engine,
    pre: &'r AnyTrainerPre,
    shared: &'r Arc<Shared>,
    resume: Option<&'r Checkpoint>,
    meta_template: &'r Meta,
}

/// The replicas of the run: one per device unless `[train] replicas` says fewer, each with a
/// share of every batch.
fn replica_count(spec: &TrainSpec, devices: &[GrantedDevice]) -> Result<usize, TrainError> {
    let replicas = spec.replicas.map_or(devices.len(), |r| r as usize);
    if devices.is_empty() || replicas == 0 || replicas > devices.len() {
        return Err(TrainError::Setup(format!(
            "[train] replicas = {replicas} with {} granted device(s): ask for more gpus or fewer replicas",
            devices.len()
        )));
    }
    if (spec.batch_size as usize) < replicas {
        return Err(TrainError::Setup(format!(
            "batch_size = {} is smaller than the {replicas} replicas: every replica needs a share of each batch",
            spec.batch_size
        )));
    }
    Ok(replicas)
}

/// The run's schedule of steps over the data, which every replica computes alike.
fn schedule_of(spec: &TrainSpec, data: &Data, replicas: usize) -> Result<Schedule, TrainError> {
    let schedule = Schedule {
        samples: data.train.len(),
        batch_size: spec.batch_size as usize,
        seed: spec.seed,
        epochs: spec.epochs,
        replicas,
        steps: spec.steps,
        windows: data.train.is_text(),
    };
    if schedule.batches_per_epoch() == 0 {
        return Err(TrainError::Data(format!(
            "{} samples cannot feed {replicas} replicas",
            data.train.len()
        )));
    }
    Ok(schedule)
}

fn create_output_folder(spec: &TrainSpec) -> Result<(), TrainError> {
    std::fs::create_dir_all(&spec.out).map_err(|source| TrainError::Output {
        path: spec.out.clone(),
        source,
    })
}

/// Where a run resumed from `checkpoint` starts.
fn start_of(checkpoint: &Checkpoint) -> Start {
    Start {
        step: checkpoint.meta.step,
        epoch: checkpoint.meta.epoch,
        batch: checkpoint.meta.batch,
    }
}

/// A resumed run whose checkpoint is at its end already: said, and nothing run.
fn nothing_to_resume(
    job: &TrainJob<'_>,
    options: &RunOptions,
    start: Start,
    replicas: usize,
) -> Summary {
    ProgressSink::send(
        options.progress.as_ref(),
        ProgressEvent::NothingToResume {
            job: job.name.to_string(),
            step: start.step,
            epoch: start.epoch,
        },
    );
    Summary {
        steps: start.step,
        final_loss: None,
        eval_loss: None,
        eval_accuracy: None,
        stopped_early: false,
        seconds: 0.0,
        samples_per_sec: 0.0,
        out: job.spec.out.clone(),
        replicas,
        sample: None,
    }
}

/// What every replica of the job shares: the devices' pools, the data and the exchanges.
fn shared_state(
    spec: &TrainSpec,
    options: &RunOptions,
    limits: Limits,
    devices: Vec<DeviceSlot>,
    data: Data,
    replicas: usize,
) -> Shared {
    Shared {
        devices,
        data,
        replicas,
        seed: spec.seed,
        max_tensors: options.max_tensors,
        max_graph_nodes: options.max_graph_nodes,
        exchange_timeout: limits.deadline,
        grads: Collective::new(replicas),
        broadcast: Collective::new(replicas),
        checkpoints: Collective::new(replicas),
        stops: Collective::new(replicas),
    }
}

/// What every replica follows: the schedule from `start`, the evaluations, the checkpoints, the
/// stops.
fn replica_plan(
    spec: &TrainSpec,
    options: &RunOptions,
    plugin: &str,
    schedule: Schedule,
    start: Start,
    limits: Limits,
    shared: &Shared,
) -> Plan {
    Plan {
        plugin: plugin.to_string(),
        schedule,
        start,
        config: spec.config.clone(),
        checkpoint_every: spec.checkpoint_every,
        out: spec.out.clone(),
        stop_after: options.stop_after,
        stop_when: options.stop_when.clone(),
        // Text is scored on windows of the training batch's size, as nanoGPT's estimate
        // does; a table on larger batches (fewer calls, the same mean).
        eval_batch: eval_batch_size(spec.batch_size, shared.data.train.is_text()),
        eval_every: spec.eval_every,
        eval_batches: spec.eval_batches,
        limits,
    }
}

/// The checkpoint's fields that are not replica state (job, plugin hash, ...).
fn checkpoint_template(
    job: &TrainJob<'_>,
    plugin: &str,
    sha: String,
    schedule: &Schedule,
    shared: &Shared,
) -> Meta {
    Meta {
        format: FORMAT.into(),
        job: job.name.to_string(),
        plugin: plugin.to_string(),
        plugin_sha256: sha,
        step: 0,
        epoch: 0,
        batch: 0,
        batch_size: job.spec.batch_size,
        seed: job.spec.seed,
        train_samples: schedule.samples as u64,
        replicas: u32::try_from(schedule.replicas).unwrap_or(u32::MAX),
        optimizers: Vec::new(),
        buffers: Vec::new(),
        vocab: shared.data.vocab.as_ref().map(orch_data::Vocab::to_stored),
    }
}

/// Opens the metrics, says the run started, and makes the coordinator that turns what the
/// replicas report into progress, metrics, checkpoints and the plot.
fn start_reporting(
    job: &TrainJob<'_>,
    options: &RunOptions,
    devices: &[GrantedDevice],
    run: &Run<'_>,
) -> Result<Coordinator, TrainError> {
    let (spec, plan) = (job.spec, run.plan);
    let schedule = plan.schedule;
    let metrics = Metrics::open(
        &spec.out.join("metrics.jsonl"),
        run.resume.map(|c| c.meta.step),
    )?;
    let batches = schedule.batches_per_epoch();
    ProgressSink::send(
        options.progress.as_ref(),
        ProgressEvent::Started {
            text: intro(
                job.name,
                &plan.plugin,
                devices,
                schedule.replicas,
                &schedule,
                run.shared,
                plan.start,
            ),
            epochs: schedule.epochs_spanned(),
            batches_per_epoch: batches,
            first_step: plan.start.step,
        },
    );
    Ok(Coordinator::new(
        schedule.replicas,
        schedule.epochs_spanned(),
        schedule.total_steps(),
        Reporter::new(
            Pace::new(schedule.epochs_spanned(), batches, plan.start.step),
            options.progress.clone(),
        ),
        metrics,
        spec.out.clone(),
        Arc::clone(run.shared),
        plan.plugin.clone(),
    ))
}

impl Run<'_> {
    /// One thread per replica, each computing in a pool of its own; this thread hands what they
    /// report to `coordinator` until the last one ends.
    fn replicas(&self, devices: &[GrantedDevice], coordinator: &mut Coordinator) {
        let replicas = self.plan.schedule.replicas;
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::scope(|scope| {
            for (rank, device) in devices.iter().enumerate().take(replicas) {
                let host_compute = !matches!(device.device, Device::Cuda(_));
                let replica = Replica {
                    rank,
                    shared: Arc::clone(self.shared),
                    engine: self.engine,
                    pre: self.pre,
                    plan: self.plan,
                    events: tx.clone(),
                    resume: self.resume,
                    meta_template: self.meta_template,
                };
                let spawned = std::thread::Builder::new()
                    .name(format!("orch-replica-{rank}"))
                    .spawn_scoped(scope, move || {
                        match crate::pool::replica_pool(rank, replicas) {
                            Some(pool) if host_compute => {
                                crate::pool::install_warm(&pool, move || replica.run())
                            }
                            Some(pool) => pool.install(move || replica.run()),
                            None => replica.run(),
                        }
                    });
                if let Err(e) = spawned {
                    self.shared.stop("a replica thread could not start");
                    coordinator.fail(TrainError::Engine(format!(
                        "cannot start replica thread {rank}: {e}"
                    )));
                }
            }
            drop(tx);
            for event in rx {
                coordinator.handle(event);
            }
        });
    }
}

/// Text: the sample a finished run closes with, from the model as the run left it.
fn closing_sample(job: &TrainJob<'_>, options: &RunOptions, run: &Run<'_>) -> Option<String> {
    let parts = crate::predict::Parts {
        plugin: run.plan.plugin.clone(),
        data: run.shared.data.clone(),
        limits: run.plan.limits,
        engine: run.engine,
        pre: run.pre,
    };
    crate::predict::closing_sample(job, options, parts)
}

/// The checkpoint to continue from, checked against this run.
fn resume_from(
    job: &TrainJob<'_>,
    sha: &str,
    schedule: &Schedule,
) -> Result<Checkpoint, TrainError> {
    let dir = checkpoint::dir(&job.spec.out);
    if !dir.join("state.json").is_file() {
        return Err(TrainError::Resume(format!(
            "no checkpoint in {}; run without --resume to start afresh",
            dir.display()
        )));
    }
    let checkpoint = Checkpoint::load(&dir)?;
    let meta = &checkpoint.meta;
    let differs = |what: &str, then: String, now: String| {
        TrainError::Resume(format!(
            "the checkpoint was made with {what} {then}, the job now has {now}; resuming would change the run"
        ))
    };
    if meta.batch_size as usize != schedule.batch_size {
        return Err(differs(
            "batch_size",
            meta.batch_size.to_string(),
            schedule.batch_size.to_string(),
        ));
    }
    if meta.seed != schedule.seed {
        return Err(differs(
            "seed",
            meta.seed.to_string(),
            schedule.seed.to_string(),
        ));
    }
    if meta.train_samples as usize != schedule.samples {
        return Err(differs(
            "training samples",
            meta.train_samples.to_string(),
            schedule.samples.to_string(),
        ));
    }
    if meta.plugin_sha256 != sha {
        tracing::warn!(
            "resuming with a different build of trainer `{}` than the checkpoint's; its parameters must still fit",
            meta.plugin
        );
    }
    Ok(checkpoint)
}

fn intro(
    job: &str,
    plugin: &str,
    devices: &[GrantedDevice],
    replicas: usize,
    schedule: &Schedule,
    shared: &Shared,
    start: Start,
) -> String {
    let names: Vec<String> = devices.iter().map(|d| d.device.to_string()).collect();
    let eval = shared.data.eval.as_ref().map_or_else(
        || "no evaluation set".to_string(),
        |e| format!("{} to evaluate", e.len()),
    );
    let resumed = if start.step > 0 {
        format!(", resuming after step {}", start.step)
    } else {
        String::new()
    };
    let length = if schedule.windows {
        let vocab = shared.data.vocab.as_ref().map_or(0, orch_data::Vocab::len);
        format!(
            "text of {} windows of {} tokens ({vocab} in the vocabulary; {eval}), {} steps",
            schedule.samples,
            shared.data.train.feature_dim(),
            schedule.total_steps(),
        )
    } else if let Some(steps) = schedule.steps {
        format!(
            "{} samples ({eval}), {steps} steps ({} per epoch)",
            schedule.samples,
            schedule.batches_per_epoch(),
        )
    } else {
        format!(
            "{} samples ({eval}), {} steps/epoch x {} epochs",
            schedule.samples,
            schedule.batches_per_epoch(),
            schedule.epochs,
        )
    };
    format!(
        "training {job}: trainer {plugin}, {replicas} replica(s) on {}; {length}, batch {}{resumed}",
        names.join(", "),
        schedule.batch_size,
    )
}
