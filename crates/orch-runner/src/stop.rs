//! Stopping a running job from another thread (a cancel, a preemption, a time limit, the job's
//! warning signal), whether its work is processes orch started or a trainer in this process.

use orch_exec::Stopper;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Stops a running job: its processes ([`Stopper`]) or the trainer this process runs.
#[derive(Debug, Clone)]
pub enum JobStopper {
    Command(Stopper),
    Train(TrainStopper),
}

impl JobStopper {
    /// Stops the job with SIGTERM (a trainer: at the end of its step, with a checkpoint).
    pub fn stop(&self, reason: &str) {
        self.stop_with(reason, libc::SIGTERM);
    }

    /// Stops the job, `signal` standing for SIGTERM (the job's warning signal at a cancel); the
    /// job's outcome is stopped for `reason`.
    pub fn stop_with(&self, reason: &str, signal: i32) {
        match self {
            JobStopper::Command(s) => s.stop_with(reason, signal),
            JobStopper::Train(s) => s.stop(Some(reason), signal),
        }
    }

    /// Sends the job `signal` and lets it run on (a warning before its time limit). A trainer
    /// takes its warning signal as a stop request: it stops at the end of its step with a
    /// checkpoint, as `orch run` does on that signal.
    pub fn signal(&self, signal: i32) {
        match self {
            JobStopper::Command(s) => s.signal(signal),
            JobStopper::Train(s) => s.stop(None, signal),
        }
    }
}

/// Why a trainer stopped before its end: `reason` when it was stopped from outside (a cancel, a
/// preemption, a time limit), and the signal that stood for the stop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StopCause {
    pub reason: Option<String>,
    pub signal: i32,
}

/// Called when a trainer asked to stop has not stopped within its grace period: this process
/// cannot kill a trainer it runs itself without ending, so the caller records the stop and ends.
pub type Overdue = Arc<dyn Fn(&StopCause) + Send + Sync>;

/// Stops a trainer run by this process: sets its stop request (the trainer stops at the end of
/// the current step, every replica at the same one, with a checkpoint) and remembers why; the
/// first stop from outside (a cancel, a preemption, a time limit) counts, as the first failure of
/// a command job's processes does, and replaces a warning signal that came before it.
#[derive(Clone)]
pub struct TrainStopper {
    requested: Arc<AtomicBool>,
    cause: Arc<Mutex<Option<StopCause>>>,
    finished: Arc<AtomicBool>,
    grace: Duration,
    overdue: Option<Overdue>,
}

impl std::fmt::Debug for TrainStopper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TrainStopper")
            .field("cause", &*orch_core::sync::lock(&self.cause))
            .finish_non_exhaustive()
    }
}

impl TrainStopper {
    /// A stopper over the run's stop request `requested`; `overdue` is called once `grace` has
    /// passed after a stop without the run ending.
    pub fn new(
        requested: Arc<AtomicBool>,
        grace: Duration,
        overdue: Option<Overdue>,
    ) -> TrainStopper {
        TrainStopper {
            requested,
            cause: Arc::default(),
            finished: Arc::default(),
            grace,
            overdue,
        }
    }

    fn stop(&self, reason: Option<&str>, signal: i32) {
        {
            let mut cause = orch_core::sync::lock(&self.cause);
            // A stop from outside replaces a warning: the job ends stopped for its reason, not
            // as its warning signal ends it.
            let replaces = match &*cause {
                None => true,
                Some(earlier) => earlier.reason.is_none() && reason.is_some(),
            };
            if !replaces {
                return;
            }
            *cause = Some(StopCause {
                reason: reason.map(str::to_string),
                signal,
            });
        }
        self.requested.store(true, Ordering::Release);
        // A warning never leads to a kill: only a stop with a reason has a grace period.
        if reason.is_none() {
            return;
        }
        let Some(overdue) = self.overdue.clone() else {
            return;
        };
        let (finished, cause, grace) = (
            Arc::clone(&self.finished),
            Arc::clone(&self.cause),
            self.grace,
        );
        std::thread::spawn(move || {
            std::thread::sleep(grace);
            if finished.load(Ordering::Acquire) {
                return;
            }
            let cause = orch_core::sync::lock(&cause).clone();
            if let Some(cause) = cause {
                overdue(&cause);
            }
        });
    }

    /// The run ended: no grace period runs out on it any more. Returns why it was stopped, if
    /// it was.
    pub fn finished(&self) -> Option<StopCause> {
        self.finished.store(true, Ordering::Release);
        orch_core::sync::lock(&self.cause).clone()
    }
}

/// The sentence of a `[train]` run stopped on `signal` with its checkpoint, `again` saying how
/// it goes on (`orch run --resume …`, or a submission's requeue).
pub fn stopped_sentence(
    job_name: &str,
    summary: &orch_trainer::Summary,
    signal: i32,
    again: &str,
) -> String {
    let name = orch_core::job::signal_name(signal)
        .map_or_else(|| format!("signal {signal}"), |n| format!("SIG{n}"));
    format!(
        "job {job_name} stopped on {name} after step {}, with its checkpoint in {}: {again}",
        summary.steps,
        summary.out.display()
    )
}
