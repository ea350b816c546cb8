//! A training job from start to end. [`Prepared::new`] does what needs no device (read and
//! compile the plugin, load the data), so a caller can do it before it leases any; then
//! [`Prepared::run`] sets up the devices' pools, starts one replica thread per replica, and, in
//! this thread, gathers what they report into progress, metrics and checkpoints.

use crate::builtin::load_plugin;
use crate::checkpoint::{self, Checkpoint, FORMAT, Meta};
use crate::collective::Collective;
use crate::coordinator::Coordinator;
use crate::data::{self, Schedule};
use crate::error::TrainError;
use crate::host::{DeviceSlot, Shared};
use crate::progress::{Pace, ProgressEvent, ProgressSink, Reporter};
use crate::replica::{Plan, Replica, Start};
use crate::report::Metrics;
use crate::world::{AnyTrainerPre, add_imports, trainer_version};
use orch_core::MachineLimits;
use orch_core::job::TrainSpec;
use orch_host::{ComponentCache, Limits, Ticker, add_wasi, default_cache_dir, new_engine};
use orch_tensor::{Device, MemoryPool};
use sha2::{Digest, Sha256};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use wasmtime::Engine;
use wasmtime::component::{Component, Linker};

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
    /// Compiled-component cache (`None`: [`default_cache_dir`]).
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
    /// Text: the closing sample ([`ProgressEvent::Sample`]), when one was written.
    pub sample: Option<String>,
}

/// Trains `job` on `devices` (one replica per device unless `[train] replicas` says fewer):
/// [`Prepared::new`], then [`Prepared::run`].
pub fn train(
    job: &TrainJob<'_>,
    devices: &[GrantedDevice],
    options: &RunOptions,
) -> Result<Summary, TrainError> {
    Prepared::new(job, options)?.run(devices)
}

/// A job with everything that needs no device done: the plugin read, compiled and checked to be
/// a trainer, the data loaded. Bad input in either shows here, before any device is leased.
pub struct Prepared<'a> {
    pub(crate) job: TrainJob<'a>,
    pub(crate) options: RunOptions,
    pub(crate) plugin: String,
    sha: String,
    pub(crate) data: data::Data,
    pub(crate) limits: Limits,
    pub(crate) engine: Engine,
    pub(crate) pre: AnyTrainerPre,
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
        let (plugin, wasm) = load_plugin(&spec.plugin)?;
        let machine = MachineLimits::current().map_err(|e| TrainError::Setup(e.to_string()))?;
        let bounds = machine
            .resolve(orch_core::limits::PluginKind::Trainer, &spec.limits)
            .map_err(|e| TrainError::Setup(e.to_string()))?;
        let limits = Limits::default().with_bounds(bounds);
        let engine = new_engine(&limits).map_err(|e| TrainError::Engine(e.to_string()))?;
        let pre = pre_instantiate(&engine, &plugin, &wasm, options)?;
        let data = data::load(&spec.data)?;
        Ok(Prepared {
            job: job.clone(),
            options: options.clone(),
            // sha2's digests print as lowercase hex themselves.
            sha: format!("{:x}", Sha256::digest(&wasm)),
            plugin,
            data,
            limits,
            engine,
            pre,
        })
    }

    /// Stops the run at the end of the step in which `flag` is set, with a checkpoint
    /// ([`RunOptions::stop_when`]).
    pub fn stop_when(&mut self, flag: Arc<AtomicBool>) {
        self.options.stop_when = Some(flag);
    }

    /// Runs the job on `devices`, to its end or its failure.
    pub fn run(self, devices: &[GrantedDevice]) -> Result<Summary, TrainError> {
        let Prepared {
            job,
            options,
            plugin,
            sha,
            data,
            limits,
            engine,
            pre,
        } = self;
        // Epoch deadlines tick only while the plugin runs (not while `orch run --wait` waits).
        let _ticker = Ticker::start(&engine)
            .map_err(|e| TrainError::Engine(format!("cannot start the epoch ticker: {e}")))?;
        let (job, options, engine, pre) = (&job, &options, &engine, &pre);
        let spec = job.spec;
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
        let slots = device_slots(devices, job.memory_limit)?;

        std::fs::create_dir_all(&spec.out).map_err(|source| TrainError::Output {
            path: spec.out.clone(),
            source,
        })?;
        let resume = if options.resume {
            Some(resume_from(job, &sha, &schedule)?)
        } else {
            None
        };
        let start = resume.as_ref().map_or_else(Start::default, |c| Start {
            step: c.meta.step,
            epoch: c.meta.epoch,
            batch: c.meta.batch,
        });
        if start.step >= schedule.total_steps() {
            ProgressSink::send(
                options.progress.as_ref(),
                ProgressEvent::NothingToResume {
                    job: job.name.to_string(),
                    step: start.step,
                    epoch: start.epoch,
                },
            );
            return Ok(Summary {
                steps: start.step,
                final_loss: None,
                eval_loss: None,
                eval_accuracy: None,
                stopped_early: false,
                seconds: 0.0,
                samples_per_sec: 0.0,
                out: spec.out.clone(),
                replicas,
                sample: None,
            });
        }

        let shared = Arc::new(Shared {
            devices: slots,
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
        });
        let plan = Plan {
            plugin: plugin.clone(),
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
        };
        let meta_template = Meta {
            format: FORMAT.into(),
            job: job.name.to_string(),
            plugin: plugin.clone(),
            plugin_sha256: sha,
            step: 0,
            epoch: 0,
            batch: 0,
            batch_size: spec.batch_size,
            seed: spec.seed,
            train_samples: schedule.samples as u64,
            replicas: u32::try_from(replicas).unwrap_or(u32::MAX),
            optimizers: Vec::new(),
            buffers: Vec::new(),
            vocab: shared.data.vocab.as_ref().map(orch_data::Vocab::to_stored),
        };

        let metrics_path = spec.out.join("metrics.jsonl");
        let metrics = Metrics::open(&metrics_path, resume.as_ref().map(|c| c.meta.step))?;
        let batches = schedule.batches_per_epoch();
        ProgressSink::send(
            options.progress.as_ref(),
            ProgressEvent::Started {
                text: intro(
                    job.name, &plugin, devices, replicas, &schedule, &shared, start,
                ),
                epochs: schedule.epochs_spanned(),
                batches_per_epoch: batches,
                first_step: start.step,
            },
        );
        let mut coordinator = Coordinator::new(
            replicas,
            schedule.epochs_spanned(),
            schedule.total_steps(),
            Reporter::new(
                Pace::new(schedule.epochs_spanned(), batches, start.step),
                options.progress.clone(),
            ),
            metrics,
            spec.out.clone(),
            Arc::clone(&shared),
            plugin.clone(),
        );

        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::scope(|scope| {
            for (rank, device) in devices.iter().enumerate().take(replicas) {
                let host_compute = !matches!(device.device, Device::Cuda(_));
                let replica = Replica {
                    rank,
                    shared: Arc::clone(&shared),
                    engine,
                    pre,
                    plan: &plan,
                    events: tx.clone(),
                    resume: resume.as_ref(),
                    meta_template: &meta_template,
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
                    shared.stop("a replica thread could not start");
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
        let mut summary = coordinator.finish(job.name)?;
        if !summary.stopped_early && shared.data.train.is_text() {
            let parts = crate::predict::Parts {
                plugin: plugin.clone(),
                data: shared.data.clone(),
                limits: plan.limits,
                engine,
                pre,
            };
            summary.sample = crate::predict::closing_sample(job, options, parts);
        }
        Ok(summary)
    }
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

/// The job's pool on each device: the job's quota inside the device's own cap (a simulated
/// GPU's memory, a real one's free memory, the host's available memory for the CPU).
pub(crate) fn device_slots(
    devices: &[GrantedDevice],
    quota: Option<u64>,
) -> Result<Vec<DeviceSlot>, TrainError> {
    devices
        .iter()
        .map(|d| {
            let device_pool = match &d.pool {
                Some(pool) => Arc::clone(pool),
                None => {
                    let cap = d.memory_free.or(d.memory_total).or_else(|| match d.device {
                        Device::Cpu => host_available_memory(),
                        _ => None,
                    });
                    MemoryPool::new(d.device, cap).map_err(|e| TrainError::Device {
                        device: d.device.to_string(),
                        reason: e.to_string(),
                    })?
                }
            };
            Ok(DeviceSlot {
                pool: MemoryPool::with_parent(&device_pool, quota),
                kind: d.device.to_string(),
                name: d.name.clone(),
                memory_free: d.memory_free,
                quota,
            })
        })
        .collect()
}

/// The host's available memory, bytes (the one reader of `/proc/meminfo`, in orch-devices).
fn host_available_memory() -> Option<u64> {
    orch_devices::cpu::host_memory()
        .ok()
        .map(|(_, available)| available)
}

/// Compiles (or finds compiled) the component, checks it is a trainer and links it.
fn pre_instantiate(
    engine: &Engine,
    plugin: &str,
    wasm: &[u8],
    options: &RunOptions,
) -> Result<AnyTrainerPre, TrainError> {
    let not_trainer = |detail: String| TrainError::NotTrainer {
        plugin: plugin.to_string(),
        detail,
    };
    if !wasm.starts_with(b"\0asm") {
        return Err(not_trainer("it is not WebAssembly".into()));
    }
    let cache_dir = options.cache_dir.clone().or_else(default_cache_dir);
    let mut cache = ComponentCache::new(engine, cache_dir);
    let component: Component = cache
        .get(engine, plugin, wasm)
        .map_err(|e| not_trainer(format!("it does not load as a component ({e})")))?;
    let version = trainer_version(engine, &component).map_err(not_trainer)?;
    let mut linker = Linker::new(engine);
    add_wasi(&mut linker).map_err(|e| TrainError::Engine(e.to_string()))?;
    add_imports(&mut linker).map_err(|e| TrainError::Engine(e.to_string()))?;
    let pre = linker
        .instantiate_pre(&component)
        .map_err(|e| TrainError::Load {
            plugin: plugin.to_string(),
            detail: format!(
                "it implements orch:plugin/trainer@{version} but imports what orch does not provide ({e:#}); trainers get the trainer world's imports and WASI with nothing behind it"
            ),
        })?;
    AnyTrainerPre::new(pre, version).map_err(|e| {
        not_trainer(format!(
            "it exports the trainer world of contract {version}, but not as the contract has it ({e:#}); rebuild it against the wit/ of that version"
        ))
    })
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
