//! The coordinator: gathers what the replicas report into one view of the run. A step is
//! shown and recorded once every replica reported it (the loss weighted by each replica's rows,
//! the trainer's scalars averaged); an evaluation likewise; replica 0's snapshots become
//! checkpoints; the first failure that is a cause (not a replica stopped because of another's)
//! is the run's error.

use crate::checkpoint;
use crate::error::TrainError;
use crate::host::Shared;
use crate::plot::write_plot;
use crate::progress::{ProgressEvent, Reporter};
use crate::replica::Event;
use crate::report::{Metrics, Record};
use crate::run::Summary;
use orch_wit::trainer::orch::plugin::metrics::Level;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

/// Step reports of one step, gathered from every replica.
#[derive(Debug, Default)]
struct PendingStep {
    epoch: u32,
    count: usize,
    loss_rows: f64,
    rows: usize,
    scalars: BTreeMap<String, (f64, usize)>,
}

#[derive(Debug, Default)]
struct PendingEval {
    step: u64,
    count: usize,
    loss_sum: f64,
    correct: u64,
    rows: u64,
    scalars: BTreeMap<String, (f64, usize)>,
}

/// The last step done, its loss, and the last evaluation's loss and accuracy.
type Last = (u64, f32, Option<(f64, f64)>);

pub(crate) struct Coordinator {
    replicas: usize,
    epochs: u32,
    progress: Reporter,
    metrics: Metrics,
    out: PathBuf,
    pending_steps: BTreeMap<u64, PendingStep>,
    pending_evals: BTreeMap<u32, PendingEval>,
    failure: Option<TrainError>,
    stopped_early: bool,
    epoch_started: Instant,
    started: Instant,
    shared: Arc<Shared>,
    plugin: String,
    last: Option<Last>,
}

impl Coordinator {
    pub fn new(
        replicas: usize,
        epochs: u32,
        progress: Reporter,
        metrics: Metrics,
        out: PathBuf,
        shared: Arc<Shared>,
        plugin: String,
    ) -> Coordinator {
        Coordinator {
            replicas,
            epochs,
            progress,
            metrics,
            out,
            pending_steps: BTreeMap::new(),
            pending_evals: BTreeMap::new(),
            failure: None,
            stopped_early: false,
            epoch_started: Instant::now(),
            started: Instant::now(),
            shared,
            plugin,
            last: None,
        }
    }
}

fn add_scalars(into: &mut BTreeMap<String, (f64, usize)>, scalars: Vec<(String, f64)>) {
    for (name, value) in scalars {
        let entry = into.entry(name).or_insert((0.0, 0));
        entry.0 += value;
        entry.1 += 1;
    }
}

fn mean_scalars(scalars: &BTreeMap<String, (f64, usize)>) -> BTreeMap<String, f64> {
    scalars
        .iter()
        .map(|(k, (sum, n))| (k.clone(), sum / (*n).max(1) as f64))
        .collect()
}

impl Coordinator {
    pub fn handle(&mut self, event: Event) {
        let result = match event {
            Event::Step {
                step,
                epoch,
                loss,
                rows,
                scalars,
                ..
            } => self.step(step, epoch, loss, rows, scalars),
            Event::Eval {
                epoch,
                step,
                loss_sum,
                correct,
                rows,
                scalars,
                ..
            } => self.eval(epoch, step, loss_sum, correct, rows, scalars),
            Event::Log {
                rank,
                level,
                message,
            } => {
                let who = if self.replicas > 1 {
                    format!("{} r{rank}", self.plugin)
                } else {
                    self.plugin.clone()
                };
                tracing::debug!(target: "orch::trainer", "[{who}] {message}");
                if level != Level::Debug {
                    self.progress.send(ProgressEvent::Log {
                        who,
                        warning: level == Level::Warn,
                        message,
                    });
                }
                Ok(())
            }
            Event::Snapshot(checkpoint) => checkpoint.save(&self.out),
            Event::Done { stopped_early, .. } => {
                self.stopped_early |= stopped_early;
                Ok(())
            }
            Event::Failed { rank, error } => {
                if self.replicas > 1 {
                    tracing::info!(
                        "replica {rank} of job's trainer `{}` failed: {error}",
                        self.plugin
                    );
                }
                self.fail(error);
                Ok(())
            }
        };
        if let Err(e) = result {
            self.shared.stop("the job is stopping");
            self.fail(e);
        }
    }

    /// Keeps the first failure that is a cause, not a consequence (a replica stopped because
    /// another failed).
    pub fn fail(&mut self, error: TrainError) {
        let replace = match &self.failure {
            None => true,
            Some(TrainError::Stopped { .. }) => !matches!(error, TrainError::Stopped { .. }),
            Some(_) => false,
        };
        if replace {
            self.failure = Some(error);
        }
    }

    fn step(
        &mut self,
        step: u64,
        epoch: u32,
        loss: f32,
        rows: usize,
        scalars: Vec<(String, f64)>,
    ) -> Result<(), TrainError> {
        let pending = self.pending_steps.entry(step).or_default();
        pending.epoch = epoch;
        pending.count += 1;
        pending.loss_rows += f64::from(loss) * rows as f64;
        pending.rows += rows;
        add_scalars(&mut pending.scalars, scalars);
        if pending.count < self.replicas {
            return Ok(());
        }
        let Some(done) = self.pending_steps.remove(&step) else {
            return Ok(());
        };
        let loss = (done.loss_rows / done.rows.max(1) as f64) as f32;
        self.progress.pace.step(done.rows);
        let batches = self.progress.pace.batches();
        self.progress.send(ProgressEvent::Step {
            step: step + 1,
            epoch: epoch + 1,
            epochs: self.epochs,
            step_in_epoch: step + 1 - u64::from(epoch) * u64::from(batches),
            batches_per_epoch: batches,
            loss,
            samples_per_sec: self.progress.pace.throughput(),
            eta: self.progress.pace.eta(step + 1),
        });
        self.last = Some((step + 1, loss, self.last.and_then(|l| l.2)));
        self.metrics.push(Record::Step {
            step: step + 1,
            epoch: epoch + 1,
            loss,
            samples_per_sec: self.progress.pace.throughput(),
            scalars: mean_scalars(&done.scalars),
        })
    }

    fn eval(
        &mut self,
        epoch: u32,
        step: u64,
        loss_sum: f64,
        correct: u64,
        rows: u64,
        scalars: Vec<(String, f64)>,
    ) -> Result<(), TrainError> {
        let pending = self.pending_evals.entry(epoch).or_default();
        pending.step = step;
        pending.count += 1;
        pending.loss_sum += loss_sum;
        pending.correct += correct;
        pending.rows += rows;
        add_scalars(&mut pending.scalars, scalars);
        if pending.count < self.replicas {
            return Ok(());
        }
        let Some(done) = self.pending_evals.remove(&epoch) else {
            return Ok(());
        };
        let seconds = self.epoch_started.elapsed().as_secs_f64();
        self.epoch_started = Instant::now();
        let train_loss = self.metrics.epoch_loss(epoch + 1);
        let (eval_loss, eval_accuracy) = if done.rows > 0 {
            (
                Some(done.loss_sum / done.rows as f64),
                Some(done.correct as f64 / done.rows as f64),
            )
        } else {
            (None, None)
        };
        if let (Some(l), Some(a)) = (eval_loss, eval_accuracy)
            && let Some(last) = &mut self.last
        {
            last.2 = Some((l, a));
        }
        self.progress.send(ProgressEvent::Epoch {
            epoch: epoch + 1,
            epochs: self.epochs,
            train_loss,
            eval_loss,
            eval_accuracy,
            seconds,
        });
        self.metrics.push(Record::Epoch {
            epoch: epoch + 1,
            step: done.step,
            train_loss,
            eval_loss,
            eval_accuracy,
            seconds,
            scalars: mean_scalars(&done.scalars),
        })
    }

    /// Writes the plot and says how the run ended.
    pub fn finish(self, job: &str) -> Result<Summary, TrainError> {
        let plot = self.out.join("plot.svg");
        let title = format!("{job}: trainer {}", self.plugin);
        let plotted = if self.metrics.records.is_empty() {
            Ok(())
        } else {
            write_plot(&plot, &self.metrics.records, &title)
        };
        if let Some(failure) = self.failure {
            return Err(failure);
        }
        plotted?;
        let seconds = self.started.elapsed().as_secs_f64();
        let (steps, final_loss, eval) = match self.last {
            Some((steps, loss, eval)) => (steps, Some(loss), eval),
            None => (0, None, None),
        };
        self.progress.send(ProgressEvent::Finished {
            steps,
            seconds,
            eval_accuracy: eval.map(|e| e.1),
            stopped_early: self.stopped_early,
            metrics: self.out.join("metrics.jsonl"),
            plot,
            checkpoint: checkpoint::dir(&self.out),
        });
        Ok(Summary {
            steps,
            final_loss,
            eval_loss: eval.map(|e| e.0),
            eval_accuracy: eval.map(|e| e.1),
            stopped_early: self.stopped_early,
            seconds,
            samples_per_sec: self.progress.pace.throughput(),
            out: self.out,
            replicas: self.replicas,
        })
    }
}
