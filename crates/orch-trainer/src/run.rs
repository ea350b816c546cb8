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
use orch_host::{
    ComponentCache, Limits, Ticker, add_wasi, deadline_ticks, default_cache_dir, new_engine,
};
use orch_tensor::{Device, MemoryPool};
use sha2::{Digest, Sha256};
use std::path::PathBuf;
use std::sync::Arc;
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
        });
        let plan = Plan {
            plugin: plugin.clone(),
            schedule,
            start,
            config: spec.config.clone(),
            checkpoint_every: spec.checkpoint_every,
            stop_after: options.stop_after,
            // Text is scored on windows of the training batch's size, as nanoGPT's estimate
            // does; a table on larger batches (fewer calls, the same mean).
            eval_batch: eval_batch_size(spec.batch_size, shared.data.train.is_text()),
            eval_every: spec.eval_every,
            eval_batches: spec.eval_batches,
            ticks: deadline_ticks(limits.deadline),
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
                    .spawn_scoped(scope, move || match replica_pool(rank, replicas) {
                        Some(pool) if host_compute => install_warm(&pool, move || replica.run()),
                        Some(pool) => pool.install(move || replica.run()),
                        None => replica.run(),
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
            summary.sample = closing_sample(job, options);
        }
        Ok(summary)
    }
}

/// Characters a text run's model writes at its end when the job does not say
/// (`[train] sample_tokens`).
pub const DEFAULT_SAMPLE_TOKENS: u64 = 200;

/// The temperature of the closing sample: `orch sample`'s default, so that
/// `orch sample JOB --tokens N --seed SEED` writes the same text from the same checkpoint.
pub const SAMPLE_TEMPERATURE: f32 = 0.8;

/// The closing sample of a text run: the trainer with the checkpoint the run just saved, on the
/// CPU, generates `sample_tokens` characters after a newline, drawn with the job's seed. It is
/// reported as [`ProgressEvent::Sample`] and saved as `sample.txt` in the output folder. The
/// run has succeeded by then, so a sample that cannot be made is a warning, not a failure; a
/// trainer without `predict` makes none, with a warning only where the job asked for one.
fn closing_sample(job: &TrainJob<'_>, options: &RunOptions) -> Option<String> {
    let spec = job.spec;
    let path = spec.out.join("sample.txt");
    // A sample left by an earlier run in this folder is not this run's.
    let _ = std::fs::remove_file(&path);
    let tokens = spec.sample_tokens.unwrap_or(DEFAULT_SAMPLE_TOKENS);
    if tokens == 0 {
        return None;
    }
    let warn = |message: String| {
        ProgressSink::send(
            options.progress.as_ref(),
            ProgressEvent::Log {
                who: job.name.to_string(),
                warning: true,
                message,
            },
        );
        None
    };
    let quiet = RunOptions {
        resume: false,
        progress: None,
        stop_after: None,
        ..options.clone()
    };
    let mut model = match crate::predict::Model::load(job, &GrantedDevice::cpu(), &quiet) {
        Ok(model) => model,
        Err(e) => {
            return warn(format!(
                "no closing sample: the checkpoint did not load ({e})"
            ));
        }
    };
    if !model.can_predict() {
        if spec.sample_tokens.is_some() {
            return warn(format!(
                "no closing sample: trainer {} does not export predict (contract 0.3.0's world `predicting-trainer`)",
                spec.plugin
            ));
        }
        return None;
    }
    let Some(prompt) = model
        .vocab()
        .and_then(|v| v.encode("\n", orch_data::Unknown::Error, "the prompt").ok())
    else {
        return warn(
            "no closing sample: the vocabulary has no newline to start from; use `orch sample --prompt`"
                .into(),
        );
    };
    let sampled = model.sample(
        &prompt,
        &crate::predict::SampleOptions {
            tokens: usize::try_from(tokens).unwrap_or(usize::MAX),
            temperature: SAMPLE_TEMPERATURE,
            top_k: None,
            seed: spec.seed,
        },
    );
    let sample = match sampled {
        Ok(sample) => sample,
        Err(e) => return warn(format!("no closing sample: {e}")),
    };
    if let Err(e) = orch_core::fsutil::write_atomic(&path, sample.text.as_bytes()) {
        warn(format!(
            "the closing sample was not saved in {}: {e}",
            path.display()
        ));
    }
    ProgressSink::send(
        options.progress.as_ref(),
        ProgressEvent::Sample {
            text: sample.text.clone(),
            tokens,
            temperature: SAMPLE_TEMPERATURE,
            seed: spec.seed,
            path,
        },
    );
    Some(sample.text)
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

/// Runs `f` (a replica) inside `pool` with the pool's other threads kept looking for work
/// meanwhile, instead of going to sleep between ops: a step of a small model is hundreds of
/// parallel ops tens of microseconds apart, and waking a sleeping worker for each (a futex wake,
/// a context switch) was a tenth of the step's CPU time (perf, the GPT example on 2 threads).
/// OpenMP's threads, which PyTorch computes with, spin the same way between parallel regions.
/// For replicas that compute on the host: a CUDA replica's threads have nothing to pick up.
fn install_warm<R: Send>(pool: &rayon::ThreadPool, f: impl FnOnce() -> R + Send) -> R {
    let warm = KeepWarm::start(pool);
    pool.install(|| {
        let _mark = ReplicaMark::set();
        warm.started
            .store(true, std::sync::atomic::Ordering::Release);
        f()
    })
}

thread_local! {
    /// Set on the pool thread that runs the replica itself.
    static REPLICA_THREAD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Marks this thread as the replica's while alive.
struct ReplicaMark;

impl ReplicaMark {
    fn set() -> ReplicaMark {
        REPLICA_THREAD.set(true);
        ReplicaMark
    }
}

impl Drop for ReplicaMark {
    fn drop(&mut self) {
        REPLICA_THREAD.set(false);
    }
}

/// One spinning task on each thread of a pool but one, until dropped.
struct KeepWarm {
    /// The replica runs: the tasks may take work from now on.
    started: Arc<std::sync::atomic::AtomicBool>,
    stop: Arc<std::sync::atomic::AtomicBool>,
}

impl KeepWarm {
    /// Called from outside `pool`, before the replica is installed in it: the tasks go to the
    /// pool's queue first (first in, first out), so each takes a thread of its own and the
    /// replica the last one.
    fn start(pool: &rayon::ThreadPool) -> KeepWarm {
        use std::sync::atomic::{AtomicBool, Ordering};
        let started = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        for _ in 1..pool.current_num_threads() {
            let (started, stop) = (Arc::clone(&started), Arc::clone(&stop));
            pool.spawn(move || {
                // Should the replica's own thread pick the task up while it waits inside a
                // join, it must not spin there (the join could never return).
                if REPLICA_THREAD.get() {
                    return;
                }
                // Nothing is taken before the replica runs: the replica itself is a job of
                // the pool's queue until then, and a task that took it would run it on its own
                // thread instead of leaving it to another.
                while !started.load(Ordering::Acquire) && !stop.load(Ordering::Relaxed) {
                    std::thread::yield_now();
                }
                let mut idle = 0u32;
                while !stop.load(Ordering::Relaxed) {
                    if let Some(rayon::Yield::Executed) = rayon::yield_now() {
                        idle = 0;
                        continue;
                    }
                    // Past a short spin, the core is offered to any other thread that wants
                    // it at each look (the thread stays runnable, so work is still picked up
                    // within microseconds): a machine with more threads than cores loses
                    // little to the spinning.
                    idle = idle.saturating_add(1);
                    if idle < 256 {
                        std::hint::spin_loop();
                    } else {
                        std::thread::yield_now();
                    }
                }
            });
        }
        KeepWarm { started, stop }
    }
}

impl Drop for KeepWarm {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// The CPU threads replica `rank` computes with: a rayon pool of its own, its share of the
/// machine's cores (`RAYON_NUM_THREADS` when set), which the replica runs inside. Inside the pool
/// an op's parallel loops start on the calling thread; called from outside, every op would hand
/// its work to the pool and put the caller to sleep until woken, which cost about a quarter of a
/// small model's CPU step. Replicas never share a pool: a worker that stole another replica's
/// work while that one waits in an all-reduce would stall both. `None`: the threads could not
/// be started, and the replica computes on rayon's global pool instead.
fn replica_pool(rank: usize, replicas: usize) -> Option<rayon::ThreadPool> {
    let cores = std::env::var("RAYON_NUM_THREADS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|&n| n > 0)
        .or_else(|| std::thread::available_parallelism().ok().map(usize::from))
        .unwrap_or(1);
    let threads = (cores / replicas.max(1)).max(1);
    match rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(move |i| format!("orch-replica-{rank}-cpu-{i}"))
        .build()
    {
        Ok(pool) => Some(pool),
        Err(e) => {
            tracing::debug!(
                "replica {rank}: no thread pool of its own ({e}); using the global one"
            );
            None
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use rayon::prelude::*;

    /// CPU time (user and system, in clock ticks) of this process's threads named `prefix*`.
    fn cpu_ticks_of(prefix: &str) -> u64 {
        let mut ticks = 0;
        for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
            let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
            if !comm.starts_with(prefix) {
                continue;
            }
            let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
            // Fields after the command's closing parenthesis: state is the 3rd field, utime
            // the 14th and stime the 15th.
            let rest = &stat[stat.rfind(')').map_or(0, |i| i + 2)..];
            let fields: Vec<&str> = rest.split(' ').collect();
            ticks +=
                fields[11].parse::<u64>().unwrap_or(0) + fields[12].parse::<u64>().unwrap_or(0);
        }
        ticks
    }

    /// A replica's pool with its other threads kept warm: they spin while the replica runs (it
    /// gets every join and parallel loop to the right answer), and stop when it ends: the
    /// pool's threads then use no CPU.
    #[test]
    fn a_warm_pool_computes_and_stops_spinning_with_the_replica() {
        for threads in [2, 3] {
            let prefix = format!("warm{threads}-");
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .thread_name({
                    let prefix = prefix.clone();
                    move |i| format!("{prefix}{i}")
                })
                .build()
                .unwrap();
            let (sum, warm_ticks) = install_warm(&pool, || {
                let before = cpu_ticks_of(&prefix);
                std::thread::sleep(std::time::Duration::from_millis(300));
                let warm_ticks = cpu_ticks_of(&prefix) - before;
                let sum = (0..2000u64)
                    .map(|i| {
                        let (a, b) = rayon::join(|| i, || i + 1);
                        let c: u64 = (0..(i % 64)).into_par_iter().sum();
                        a + b + c
                    })
                    .sum::<u64>();
                (sum, warm_ticks)
            });
            // While the replica slept, the other threads kept looking for work (on a quiet
            // machine about 30 ticks a thread; on a busy one they yield most of it).
            assert!(
                warm_ticks >= 2,
                "{threads} threads: the pool used {warm_ticks} ticks while the replica ran"
            );
            let expected: u64 = (0..2000u64)
                .map(|i| 2 * i + 1 + (i % 64) * (i % 64).saturating_sub(1) / 2)
                .sum();
            assert_eq!(sum, expected, "{threads} threads");
            std::thread::sleep(std::time::Duration::from_millis(100));
            let before = cpu_ticks_of(&prefix);
            std::thread::sleep(std::time::Duration::from_millis(500));
            let spent = cpu_ticks_of(&prefix) - before;
            // A thread still spinning would take most of the half second (about 50 ticks).
            assert!(
                spent <= 5,
                "{threads} threads: the pool used {spent} ticks of CPU after the replica ended"
            );
        }
    }
}
