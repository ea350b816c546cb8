//! The coordinator: gathers what the replicas report into one view of the run. A step is
//! shown and recorded once every replica reported it (the loss weighted by each replica's rows,
//! the trainer's scalars averaged); an evaluation likewise (replica 0 writes the checkpoints
//! itself); the first failure that is a cause (not a replica stopped because of another's)
//! is the run's error.

use crate::checkpoint;
use crate::error::TrainError;
use crate::host::Shared;
use crate::job::Summary;
use crate::plot::write_plot;
use crate::progress::{ProgressEvent, Reporter};
use crate::replica::{EvalDone, Event};
use crate::report::{Metrics, Record};
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
    epoch: u32,
    epoch_end: bool,
    evaluated: bool,
    /// The longest any replica took to evaluate, and the last end of one.
    seconds: f64,
    ended: Option<Instant>,
    count: usize,
    loss_sum: f64,
    correct: u64,
    rows: u64,
    scalars: BTreeMap<String, (f64, usize)>,
}

/// The last step done, its loss, and the last evaluation's loss and accuracy.
type Last = (u64, f32, Option<(f64, Option<f64>)>);

pub(crate) struct Coordinator {
    replicas: usize,
    epochs: u32,
    progress: Reporter,
    metrics: Metrics,
    out: PathBuf,
    pending_steps: BTreeMap<u64, PendingStep>,
    pending_evals: BTreeMap<u64, PendingEval>,
    /// Training steps of the whole run.
    total_steps: u64,
    /// Text: evaluations have a loss and no accuracy.
    text: bool,
    /// Time spent evaluating, over this process's part of the run and in the current epoch.
    eval_seconds: f64,
    epoch_eval_seconds: f64,
    /// The training time the last evaluation record gave.
    train_seconds: f64,
    failure: Option<TrainError>,
    stopped_early: bool,
    epoch_started: Instant,
    started: Instant,
    /// When the last step (or evaluation) ended: a step's time is measured from there.
    step_ended: Instant,
    shared: Arc<Shared>,
    plugin: String,
    last: Option<Last>,
}

impl Coordinator {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        replicas: usize,
        epochs: u32,
        total_steps: u64,
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
            total_steps,
            text: shared.data.train.is_text(),
            eval_seconds: 0.0,
            epoch_eval_seconds: 0.0,
            train_seconds: 0.0,
            failure: None,
            stopped_early: false,
            epoch_started: Instant::now(),
            started: Instant::now(),
            step_ended: Instant::now(),
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
            Event::Eval(report) => self.eval(report),
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
        let now = Instant::now();
        let step_seconds = now.duration_since(self.step_ended).as_secs_f64();
        self.step_ended = now;
        self.metrics.push(Record::Step {
            step: step + 1,
            epoch: epoch + 1,
            loss,
            samples_per_sec: self.progress.pace.throughput(),
            step_seconds: Some(step_seconds),
            scalars: mean_scalars(&done.scalars),
        })
    }

    fn eval(&mut self, report: EvalDone) -> Result<(), TrainError> {
        let pending = self.pending_evals.entry(report.step).or_default();
        pending.epoch = report.epoch;
        pending.epoch_end |= report.epoch_end;
        pending.evaluated |= report.evaluated;
        pending.seconds = pending.seconds.max(report.seconds);
        pending.ended = pending.ended.max(Some(report.ended));
        pending.count += 1;
        pending.loss_sum += report.loss_sum;
        pending.correct += report.correct;
        pending.rows += report.rows;
        add_scalars(&mut pending.scalars, report.scalars);
        if pending.count < self.replicas {
            return Ok(());
        }
        let step = report.step;
        let Some(done) = self.pending_evals.remove(&step) else {
            return Ok(());
        };
        self.eval_seconds += done.seconds;
        self.epoch_eval_seconds += done.seconds;
        // The next step's time starts now, not when the evaluation began.
        self.step_ended = Instant::now();
        let (eval_loss, eval_accuracy) = if done.evaluated && done.rows > 0 {
            let accuracy = (!self.text).then(|| done.correct as f64 / done.rows as f64);
            (Some(done.loss_sum / done.rows as f64), accuracy)
        } else {
            (None, None)
        };
        if let Some(l) = eval_loss
            && let Some(last) = &mut self.last
        {
            last.2 = Some((l, eval_accuracy));
        }
        let scalars = mean_scalars(&done.scalars);
        if let Some(eval_loss) = eval_loss {
            // Timed on the replicas' clock (when the evaluation ended), not when this thread got
            // to the report, which may be late; and never less than the last record said, as
            // replicas end their evaluations microseconds apart.
            let ended = done.ended.unwrap_or_else(Instant::now);
            let train_seconds = (ended.saturating_duration_since(self.started).as_secs_f64()
                - self.eval_seconds)
                .max(self.train_seconds);
            self.train_seconds = train_seconds;
            if !done.epoch_end {
                self.progress.send(ProgressEvent::Eval {
                    step,
                    total_steps: self.total_steps,
                    eval_loss,
                    eval_accuracy,
                    train_seconds,
                });
            }
            self.metrics.push(Record::Eval {
                step,
                eval_loss,
                eval_accuracy,
                train_seconds,
            })?;
        }
        if !done.epoch_end {
            return Ok(());
        }
        let epoch = done.epoch;
        let seconds = self.epoch_started.elapsed().as_secs_f64();
        let train_seconds = (seconds - self.epoch_eval_seconds).max(0.0);
        self.epoch_started = Instant::now();
        self.epoch_eval_seconds = 0.0;
        let train_loss = self.metrics.epoch_loss(epoch + 1);
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
            step,
            train_loss,
            eval_loss,
            eval_accuracy,
            seconds,
            train_seconds: Some(train_seconds),
            scalars,
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
            eval_loss: eval.map(|e| e.0),
            eval_accuracy: eval.and_then(|e| e.1),
            stopped_early: self.stopped_early,
            metrics: self.out.join("metrics.jsonl"),
            plot,
            checkpoint: checkpoint::dir(&self.out),
        });
        Ok(Summary {
            steps,
            final_loss,
            eval_loss: eval.map(|e| e.0),
            eval_accuracy: eval.and_then(|e| e.1),
            stopped_early: self.stopped_early,
            seconds,
            samples_per_sec: self.progress.pace.throughput(),
            out: self.out,
            replicas: self.replicas,
            sample: None,
        })
    }
}
