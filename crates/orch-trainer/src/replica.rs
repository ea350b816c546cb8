//! One replica: its own store and instance, in its own thread, walking the run's schedule.
//!
//! Every replica computes the same schedule from the seed, so they need no coordinator to stay
//! in step: they meet only at the parameter broadcast after `init` and at every optimizer step
//! (the gradient all-reduce), and at each checkpoint, which replica 0 writes while the others
//! wait, so a checkpoint that fails stops every replica at its step. What they report (losses,
//! evaluations, logs) goes to the coordinator over a channel.

use crate::checkpoint::Checkpoint;
use crate::data::{Data, Schedule, eval_batches, my_shard, shard};
use crate::error::{Stage, TrainError};
use crate::host::{BatchSlot, NamedValues, Phase, ReplicaState, Shared, panic_message};
use crate::safetensors::NamedTensor;
use crate::state::{assign_named, assign_params, load, snapshot};
use crate::world::{AnyTrainer, AnyTrainerPre};
use orch_host::{CallFailure, Limits, PluginState};
use orch_tensor::TensorError;
use orch_wit::trainer::exports::orch::plugin::training::{RunInfo, StepInfo};
use orch_wit::trainer::orch::plugin::metrics::Level;
use std::sync::Arc;
use std::sync::mpsc::Sender;
use wasmtime::{Engine, Store};

/// Where a run starts: the step count and the data position of the next step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Start {
    pub step: u64,
    pub epoch: u32,
    pub batch: u32,
}

/// What every replica of a run follows.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    pub plugin: String,
    pub schedule: Schedule,
    pub start: Start,
    pub config: Vec<(String, String)>,
    pub checkpoint_every: Option<u64>,
    /// The run's output folder, where replica 0 writes the checkpoints.
    pub out: std::path::PathBuf,
    /// Stop (with a checkpoint) once this many steps are done: a simulated interruption.
    pub stop_after: Option<u64>,
    /// Stop (with a checkpoint) at the end of the step in which this is set (a signal).
    pub stop_when: Option<Arc<std::sync::atomic::AtomicBool>>,
    pub eval_batch: usize,
    /// `[train] eval_every`: evaluate every this many steps (and at the end) instead of at the
    /// end of every epoch.
    pub eval_every: Option<u64>,
    /// `[train] eval_batches`: evaluation batches per evaluation.
    pub eval_batches: Option<u32>,
    pub limits: Limits,
}

/// How long replicas wait, beyond the step deadline, for replica 0 to write a checkpoint.
const CHECKPOINT_WRITE_ALLOWANCE: std::time::Duration = std::time::Duration::from_secs(600);

/// What a replica reports.
#[derive(Debug)]
pub(crate) enum Event {
    Step {
        step: u64,
        epoch: u32,
        loss: f32,
        rows: usize,
        scalars: Vec<(String, f64)>,
    },
    Eval(EvalDone),
    Log {
        rank: usize,
        level: Level,
        message: String,
    },
    Done {
        stopped_early: bool,
    },
    Failed {
        rank: usize,
        error: TrainError,
    },
}

/// One replica's part of an evaluation, or of an epoch's end without one.
#[derive(Debug)]
pub(crate) struct EvalDone {
    /// The epoch the evaluation falls in (0-based).
    pub epoch: u32,
    /// Steps done.
    pub step: u64,
    /// The last step of an epoch (the epoch record is due).
    pub epoch_end: bool,
    /// The evaluation set was scored (false: an epoch's end between evaluations, or no set).
    pub evaluated: bool,
    /// How long this replica's evaluation took, and when it ended.
    pub seconds: f64,
    pub ended: std::time::Instant,
    pub loss_sum: f64,
    pub correct: u64,
    pub rows: u64,
    pub scalars: Vec<(String, f64)>,
}

/// What one replica thread needs.
pub(crate) struct Replica<'a> {
    pub rank: usize,
    pub shared: Arc<Shared>,
    pub engine: &'a Engine,
    pub pre: &'a AnyTrainerPre,
    pub plan: &'a Plan,
    pub events: Sender<Event>,
    pub resume: Option<&'a Checkpoint>,
    /// The checkpoint's fields that are not replica state (job, plugin hash, ...).
    pub meta_template: &'a crate::checkpoint::Meta,
}

impl Replica<'_> {
    /// Runs the replica to the end of the schedule (or its failure), reporting as it goes.
    pub fn run(self) {
        let rank = self.rank;
        // A panic here is a bug in the host, not the plugin's doing: it fails the job with a
        // sentence (and the lease is released) instead of tearing down the process.
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.drive()));
        let event = match outcome {
            Ok(Ok(stopped_early)) => Event::Done { stopped_early },
            Ok(Err(error)) => {
                self.shared.stop(&format!("replica {rank} failed"));
                Event::Failed { rank, error }
            }
            Err(panic) => {
                self.shared.stop(&format!("replica {rank} failed"));
                let what = panic_message(panic.as_ref());
                Event::Failed {
                    rank,
                    error: TrainError::Engine(format!(
                        "replica {rank} stopped on an internal error in orch ({what}); please report it"
                    )),
                }
            }
        };
        // The coordinator outlives every replica; a closed channel means it is gone already.
        let _ = self.events.send(event);
    }

    fn drive(&self) -> Result<bool, TrainError> {
        let plan = self.plan;
        let state = ReplicaState::new(
            PluginState::new(&plan.plugin, &plan.limits),
            Arc::clone(&self.shared),
            self.rank,
        );
        let mut store = Store::new(self.engine, state);
        store.limiter(|s| &mut s.sandbox.limiter);
        // Any list the plugin's memory can hold crosses into the host, so an oversized one
        // reaches the host function and is refused there as a value (`bad-argument`) instead
        // of trapping in the copy. The copy is bounded by the plugin's memory limit.
        store.set_hostcall_fuel(plan.limits.memory_bytes.saturating_add(1 << 20));
        store.data_mut().phase = Phase::Init;
        // Instantiation and `init-replica` share one deadline: a plugin's start-up code (a
        // language runtime's, say) cannot buy itself a second one.
        let info = self.run_info();
        let trainer = self.call(&mut store, Stage::Init, |store| {
            let trainer = self.pre.instantiate(store)?;
            Ok(trainer
                .init(&mut *store, &plan.config, info)?
                .map(|()| trainer))
        })?;
        store.data_mut().phase = Phase::Idle;
        match self.resume {
            Some(checkpoint) => load(store.data_mut(), checkpoint)?,
            None => self.broadcast(store.data_mut())?,
        }
        self.train(&mut store, &trainer)
    }

    fn run_info(&self) -> RunInfo {
        run_info(&self.plan.schedule, &self.shared.data, self.rank)
    }

    /// The training loop from the plan's start; `Ok(true)` when stopped early on purpose.
    fn train(
        &self,
        store: &mut Store<ReplicaState>,
        trainer: &AnyTrainer,
    ) -> Result<bool, TrainError> {
        let plan = self.plan;
        let schedule = plan.schedule;
        let batches = schedule.batches_per_epoch();
        let replicas = schedule.replicas;
        let total = schedule.total_steps();
        let mut order = None;
        for step in plan.start.step..total {
            let (epoch, batch) = schedule.position(step);
            let global = schedule.global_batch(step, &mut order);
            store.data_mut().phase = Phase::Train(BatchSlot {
                indices: my_shard(&global, replicas, self.rank).to_vec(),
                global_rows: global.len(),
                offset: shard(global.len(), replicas, self.rank).start,
                step,
                ..BatchSlot::default()
            });
            let info = StepInfo {
                step,
                epoch,
                batch,
                batches,
            };
            let stage = Stage::Step { step, epoch };
            let report = self.call(store, stage, |s| trainer.train_step(s, info))?;
            let state = store.data_mut();
            let rows = match std::mem::take(&mut state.phase) {
                Phase::Train(slot) => slot.indices.len(),
                _ => 0,
            };
            let scalars = std::mem::take(&mut state.scalars);
            self.send(Event::Step {
                step,
                epoch,
                loss: report.loss,
                rows,
                scalars,
            });
            let done = step + 1;
            let last = done == total;
            // Text has no passes over the data: its run is one "epoch" without an epoch record.
            let epoch_end = !schedule.windows && (batch + 1 == batches || last);
            let evaluate = match plan.eval_every {
                Some(every) => done.is_multiple_of(every) || last,
                None => epoch_end || last,
            };
            if evaluate || epoch_end {
                self.evaluate(store, trainer, epoch, done, evaluate, epoch_end)?;
            }
            let stop = plan.stop_after == Some(done) || (!last && self.stop_requested(stage)?);
            if last || stop || self.checkpoint_due(done) {
                let (next_epoch, next_batch) = schedule.position(done);
                self.snapshot(store.data(), done, next_epoch, next_batch, stage)?;
            }
            if stop && !last {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Whether the run stops after this step on a request ([`Plan::stop_when`]): with several
    /// replicas, whether any of them has seen it by now, agreed at a rendezvous so that all stop
    /// at the same step (a signal lands between two replicas' reads).
    fn stop_requested(&self, stage: Stage) -> Result<bool, TrainError> {
        let Some(flag) = &self.plan.stop_when else {
            return Ok(false);
        };
        let seen = flag.load(std::sync::atomic::Ordering::Acquire);
        if self.shared.replicas < 2 {
            return Ok(seen);
        }
        self.shared
            .stops
            .exchange(self.rank, seen, self.shared.exchange_timeout, |seen| {
                seen.into_iter().any(|s| s)
            })
            .map(|any| *any)
            .map_err(|reason| TrainError::Stopped {
                plugin: self.plan.plugin.clone(),
                stage,
                reason,
            })
    }

    fn checkpoint_due(&self, step: u64) -> bool {
        self.plan
            .checkpoint_every
            .is_some_and(|n| step.is_multiple_of(n))
    }

    /// Scores this replica's shard of every evaluation batch, autograd off (when `evaluate`;
    /// else, or without an evaluation set, only reports the epoch's end).
    fn evaluate(
        &self,
        store: &mut Store<ReplicaState>,
        trainer: &AnyTrainer,
        epoch: u32,
        step: u64,
        evaluate: bool,
        epoch_end: bool,
    ) -> Result<(), TrainError> {
        let started = std::time::Instant::now();
        let mut done = EvalDone {
            epoch,
            step,
            epoch_end,
            evaluated: false,
            seconds: 0.0,
            ended: started,
            loss_sum: 0.0,
            correct: 0,
            rows: 0,
            scalars: Vec::new(),
        };
        let eval = match self.shared.data.eval.clone() {
            Some(eval) if evaluate => eval,
            // No evaluation now: the epoch still ends (with its training loss).
            _ => {
                self.send(Event::Eval(done));
                return Ok(());
            }
        };
        let global_batches = eval_batches(&eval, self.plan.eval_batch, self.plan.eval_batches);
        let batches = u32::try_from(global_batches.len()).unwrap_or(u32::MAX);
        let (mut loss_sum, mut correct, mut total) = (0.0f64, 0u64, 0u64);
        for (batch, global) in global_batches.iter().enumerate() {
            let batch = u32::try_from(batch).unwrap_or(u32::MAX);
            let mine = my_shard(global, self.plan.schedule.replicas, self.rank);
            if mine.is_empty() {
                continue;
            }
            let rows = mine.len() as u64;
            store.data_mut().phase = Phase::Eval(BatchSlot {
                indices: mine.to_vec(),
                global_rows: global.len(),
                step,
                ..BatchSlot::default()
            });
            let info = StepInfo {
                step,
                epoch,
                batch,
                batches,
            };
            let stage = Stage::Eval { epoch };
            let report = self.call(store, stage, |s| {
                orch_tensor::no_grad(|| trainer.eval_step(s, info))
            })?;
            store.data_mut().phase = Phase::Idle;
            if u64::from(report.rows) != rows || u64::from(report.correct) > rows {
                return Err(TrainError::Failed {
                    plugin: self.plan.plugin.clone(),
                    stage,
                    message: format!(
                        "eval-step reported correct = {} of rows = {}, but its batch had {rows} rows: report the batch's rows and at most that many correct",
                        report.correct, report.rows
                    ),
                });
            }
            loss_sum += f64::from(report.loss) * rows as f64;
            correct += u64::from(report.correct);
            total += rows;
        }
        done.evaluated = true;
        done.loss_sum = loss_sum;
        done.correct = correct;
        done.rows = total;
        done.scalars = std::mem::take(&mut store.data_mut().scalars);
        done.ended = std::time::Instant::now();
        done.seconds = done.ended.duration_since(started).as_secs_f64();
        self.send(Event::Eval(done));
        Ok(())
    }

    /// Replica 0 writes its state as a checkpoint (the replicas are identical), before any
    /// replica goes on: the others wait for it here, so a checkpoint that cannot be written
    /// stops the run at this step, on one replica or many. Replica 0 writes only once every
    /// replica has reached the step (and so reported it): a write that fails at once cannot
    /// stop another replica inside the step the checkpoint is of.
    fn snapshot(
        &self,
        state: &ReplicaState,
        step: u64,
        epoch: u32,
        batch: u32,
        stage: Stage,
    ) -> Result<(), TrainError> {
        let several = self.shared.replicas > 1;
        let stopped = |what: &str, reason: String| TrainError::Stopped {
            plugin: self.plan.plugin.clone(),
            stage,
            reason: format!("{what} the checkpoint of step {step}: {reason}"),
        };
        if several {
            self.shared
                .checkpoints
                .exchange(self.rank, (), self.shared.exchange_timeout, |_| ())
                .map_err(|reason| stopped("reaching", reason))?;
        }
        if self.rank == 0 {
            let failed = |e: TensorError| TrainError::Checkpoint {
                path: "(snapshot)".into(),
                reason: e.to_string(),
            };
            let (params, buffers, optimizers) = snapshot(state).map_err(failed)?;
            let mut meta = self.meta_template.clone();
            (meta.step, meta.epoch, meta.batch) = (step, epoch, batch);
            let checkpoint = Checkpoint {
                meta,
                params,
                buffers,
                optimizers,
            };
            // A failure returns here: the replica fails, which stops the others waiting below.
            checkpoint.save(&self.plan.out)?;
        }
        if !several {
            return Ok(());
        }
        // Writing is the host's work, not the plugin's: the wait allows it more than a step.
        let timeout = self.shared.exchange_timeout + CHECKPOINT_WRITE_ALLOWANCE;
        self.shared
            .checkpoints
            .exchange(self.rank, (), timeout, |_| ())
            .map(|_| ())
            .map_err(|reason| stopped("waiting for", reason))
    }

    /// Makes every replica's parameters and buffers replica 0's.
    fn broadcast(&self, state: &mut ReplicaState) -> Result<(), TrainError> {
        if self.shared.replicas < 2 {
            return Ok(());
        }
        let mine =
            if self.rank == 0 {
                let values: Result<NamedValues, TensorError> = state
                    .params
                    .iter()
                    .chain(&state.buffers)
                    .map(|(n, p)| Ok((n.clone(), p.shape().to_vec(), p.to_vec()?)))
                    .collect();
                Some(values.map_err(|e| {
                    TrainError::Setup(format!("reading replica 0's parameters: {e}"))
                })?)
            } else {
                None
            };
        let plugin = &self.plan.plugin;
        let stopped = |reason: String| TrainError::Stopped {
            plugin: plugin.clone(),
            stage: Stage::Init,
            reason,
        };
        let timeout = self.shared.exchange_timeout;
        let result = self
            .shared
            .broadcast
            .exchange(self.rank, mine, timeout, |v| v.into_iter().next().flatten())
            .map_err(stopped)?;
        let values = result
            .as_ref()
            .as_ref()
            .ok_or_else(|| stopped("replica 0 sent nothing".into()))?;
        let (buffers, params): (Vec<NamedTensor>, Vec<NamedTensor>) = values
            .iter()
            .map(|(name, shape, data)| NamedTensor {
                name: name.clone(),
                shape: shape.clone(),
                data: data.clone(),
            })
            .partition(|t| state.buffers.iter().any(|(n, _)| *n == t.name));
        assign_params(state, &params)
            .and_then(|()| assign_named(&state.buffers, &buffers, "buffer"))
            .map_err(|why| {
                TrainError::Setup(format!(
                    "trainer `{plugin}`: replica {} registered other parameters or buffers than replica 0: {why}",
                    self.rank
                ))
            })
    }

    /// Calls into the plugin under the deadline; a trap or an `Err` becomes a [`TrainError`].
    fn call<T>(
        &self,
        store: &mut Store<ReplicaState>,
        stage: Stage,
        f: impl FnOnce(&mut Store<ReplicaState>) -> wasmtime::Result<Result<T, String>>,
    ) -> Result<T, TrainError> {
        crate::host::arm_deadline(store, self.plan.limits.deadline);
        store.data().sandbox.log.begin_call();
        let outcome = f(store);
        let output = store.data().sandbox.log.end_call();
        let cut = store.data_mut().take_cut_notice();
        for (level, message) in std::mem::take(&mut store.data_mut().logs)
            .into_iter()
            .chain(cut)
        {
            self.send(Event::Log {
                rank: self.rank,
                level,
                message,
            });
        }
        let plugin = self.plan.plugin.clone();
        match outcome {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(message)) => Err(TrainError::Failed {
                plugin,
                stage,
                message: crate::error::plugin_message(&message),
            }),
            Err(error) => Err(classify(
                plugin,
                stage,
                &self.plan.limits,
                store.data(),
                &error,
                output,
            )),
        }
    }

    fn send(&self, event: Event) {
        let _ = self.events.send(event);
    }
}

/// What stopped the plugin, in the user's words.
fn classify(
    plugin: String,
    stage: Stage,
    limits: &Limits,
    state: &ReplicaState,
    error: &wasmtime::Error,
    output: Vec<String>,
) -> TrainError {
    if let Some((call, message)) = &state.host_panic {
        return TrainError::HostPanic {
            plugin,
            stage,
            call,
            message: message.clone(),
        };
    }
    if let Some(reason) = &state.abort {
        return TrainError::Stopped {
            plugin,
            stage,
            reason: reason.clone(),
        };
    }
    match orch_host::classify(&state.sandbox, error) {
        CallFailure::MemoryLimit => TrainError::MemoryLimit {
            plugin,
            stage,
            limit: limits.memory_bytes,
        },
        CallFailure::Denied(what) => TrainError::Denied {
            plugin,
            stage,
            what,
        },
        CallFailure::Timeout => TrainError::Timeout {
            plugin,
            stage,
            deadline: limits.deadline,
        },
        CallFailure::Crashed(trap) => TrainError::Crashed {
            plugin,
            stage,
            trap,
            output,
        },
    }
}

/// What `init-replica` learns of the run, for replica `rank`.
pub(crate) fn run_info(s: &Schedule, data: &Data, rank: usize) -> RunInfo {
    let u = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
    RunInfo {
        replica: u(rank),
        replicas: u(s.replicas),
        epochs: s.epochs_spanned(),
        batch_size: u(s.batch_size),
        steps_per_epoch: s.batches_per_epoch(),
        features: u(data.train.feature_dim()),
        classes: u(data.classes),
        train_samples: u(data.train.len()),
        eval_samples: u(data.eval.as_ref().map_or(0, |e| e.len())),
        seed: s.seed,
        sample_shape: data.train.sample_shape().into_iter().map(u).collect(),
        label_shape: data.train.label_shape().into_iter().map(u).collect(),
        total_steps: s.total_steps(),
    }
}
