//! What a run reports as it goes: events handed to a callback the caller gives in
//! [`RunOptions::progress`](crate::RunOptions). orch-trainer prints nothing; the `orch` command
//! draws a bar or prints lines from the events, a daemon or a test may do something else.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One thing a run reports, on the thread that called [`Prepared::run`](crate::Prepared::run).
#[derive(Debug, Clone, PartialEq)]
pub enum ProgressEvent {
    /// Training starts (or resumes): what runs where, in words, and the run's size.
    Started {
        text: String,
        epochs: u32,
        batches_per_epoch: u32,
        /// Steps done before this process started (a resumed run's checkpoint step).
        first_step: u64,
    },
    /// Every replica has done a step.
    Step {
        /// Steps done over the run, this one included.
        step: u64,
        /// 1-based.
        epoch: u32,
        epochs: u32,
        /// Steps done in this epoch, this one included.
        step_in_epoch: u64,
        batches_per_epoch: u32,
        /// The loss over the global batch.
        loss: f32,
        samples_per_sec: f64,
        /// Time left for the run at the pace of this process so far.
        eta: Duration,
    },
    /// An epoch ended and, when the job has an evaluation set, was evaluated.
    Epoch {
        /// 1-based.
        epoch: u32,
        epochs: u32,
        train_loss: f64,
        eval_loss: Option<f64>,
        eval_accuracy: Option<f64>,
        seconds: f64,
    },
    /// An evaluation inside an epoch or at the end of a run by steps (`[train] eval_every`,
    /// text data): the evaluation at an epoch's end comes with [`ProgressEvent::Epoch`].
    Eval {
        /// Steps done.
        step: u64,
        total_steps: u64,
        eval_loss: f64,
        /// `None` for text.
        eval_accuracy: Option<f64>,
        /// Training time so far, evaluations left out.
        train_seconds: f64,
    },
    /// A line the trainer logged at level info or warn (debug lines go to tracing only).
    Log {
        /// The plugin, with its replica (`mlp r1`) when there are several.
        who: String,
        warning: bool,
        message: String,
    },
    /// Text: what the trained model wrote at the end of the run (`[train] sample_tokens`
    /// characters after a newline), also saved in `path`.
    Sample {
        text: String,
        tokens: u64,
        temperature: f32,
        seed: u64,
        path: PathBuf,
    },
    /// The checkpoint to resume from is at the run's end: nothing was trained.
    NothingToResume { job: String, step: u64, epoch: u32 },
    /// The run ended well: how far it got and where its output is.
    Finished {
        steps: u64,
        seconds: f64,
        /// The last evaluation's loss and (not for text) accuracy.
        eval_loss: Option<f64>,
        eval_accuracy: Option<f64>,
        /// Stopped by `RunOptions::stop_after`.
        stopped_early: bool,
        metrics: PathBuf,
        plot: PathBuf,
        checkpoint: PathBuf,
    },
}

/// Where a run's [`ProgressEvent`]s go: a callback, called in order on one thread.
#[derive(Clone)]
pub struct ProgressSink(Arc<dyn Fn(ProgressEvent) + Send + Sync>);

impl ProgressSink {
    pub fn new(f: impl Fn(ProgressEvent) + Send + Sync + 'static) -> ProgressSink {
        ProgressSink(Arc::new(f))
    }

    pub(crate) fn send(sink: Option<&ProgressSink>, event: ProgressEvent) {
        if let Some(sink) = sink {
            (sink.0)(event);
        }
    }
}

impl fmt::Debug for ProgressSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ProgressSink(..)")
    }
}

/// A run's progress as the coordinator keeps it: its pace, and where events go.
#[derive(Debug)]
pub(crate) struct Reporter {
    pub pace: Pace,
    sink: Option<ProgressSink>,
}

impl Reporter {
    pub fn new(pace: Pace, sink: Option<ProgressSink>) -> Reporter {
        Reporter { pace, sink }
    }

    pub fn send(&self, event: ProgressEvent) {
        ProgressSink::send(self.sink.as_ref(), event);
    }
}

/// The pace of one run in this process: throughput and time left, for the step events and
/// the metrics.
#[derive(Debug)]
pub(crate) struct Pace {
    batches: u32,
    total_steps: u64,
    first_step: u64,
    started: Instant,
    samples: u64,
}

impl Pace {
    pub fn new(epochs: u32, batches: u32, first_step: u64) -> Pace {
        Pace {
            batches,
            total_steps: u64::from(epochs) * u64::from(batches),
            first_step,
            started: Instant::now(),
            samples: 0,
        }
    }

    pub fn batches(&self) -> u32 {
        self.batches
    }

    /// Counts a step of `rows` samples.
    pub fn step(&mut self, rows: usize) {
        self.samples += rows as u64;
    }

    /// Samples per second since this process started training.
    pub fn throughput(&self) -> f64 {
        let secs = self.started.elapsed().as_secs_f64();
        if secs > 0.0 {
            self.samples as f64 / secs
        } else {
            0.0
        }
    }

    /// Time left after `step` steps of the run, at this process's pace so far.
    pub fn eta(&self, step: u64) -> Duration {
        let done = step.saturating_sub(self.first_step);
        if done == 0 {
            return Duration::ZERO;
        }
        let per_step = self.started.elapsed().as_secs_f64() / done as f64;
        Duration::from_secs_f64(per_step * self.total_steps.saturating_sub(step) as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_left_scales_with_the_steps_to_go() {
        let mut pace = Pace::new(2, 10, 4);
        assert_eq!(pace.eta(4), Duration::ZERO, "nothing done yet here");
        pace.started -= Duration::from_secs(8);
        // 4 steps in 8 s: 2 s a step, 12 to go.
        let eta = pace.eta(8).as_secs_f64();
        assert!((eta - 24.0).abs() < 0.5, "{eta}");
        assert_eq!(pace.eta(20), Duration::ZERO);
    }
}
