//! How a training job can fail. Loading its trainer fails as any plugin does, with orch-host's
//! [`PluginError`] (kind `trainer`); every other variant about the plugin names it, and where
//! the run was (a call's fault, read by orch-host's `classify` as a policy's is, plus the step).

use orch_host::PluginError;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

/// Where in the run a plugin call was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Instantiation and `init-replica`.
    Init,
    /// `train-step` number `step` (0-based over the run), in `epoch` (0-based).
    Step { step: u64, epoch: u32 },
    /// `eval-step` at the end of `epoch`.
    Eval { epoch: u32 },
    /// `inference.predict`, outside a run.
    Predict,
}

impl fmt::Display for Stage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Stage::Init => f.write_str("in init"),
            Stage::Step { step, epoch } => write!(f, "at step {} (epoch {})", step + 1, epoch + 1),
            Stage::Eval { epoch } => write!(f, "evaluating epoch {}", epoch + 1),
            Stage::Predict => f.write_str("in predict"),
        }
    }
}

/// A training job that could not start, or stopped.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// The trainer could not be loaded: an unknown built-in, an unreadable file, not a trainer
    /// component, an import orch does not provide; or the engine failed.
    #[error(transparent)]
    Plugin(#[from] PluginError),
    #[error("training data: {0}")]
    Data(String),
    #[error("{0}")]
    Setup(String),
    #[error("device {device}: {reason}")]
    Device { device: String, reason: String },
    #[error(
        "trainer `{plugin}` did not return {stage} within its deadline of {} and was stopped; if it needs longer, set `deadline` in [train] of the job file",
        orch_core::limits::show_duration(*deadline)
    )]
    Timeout {
        plugin: String,
        stage: Stage,
        deadline: Duration,
    },
    #[error(
        "trainer `{plugin}` went over its linear-memory limit of {} (all its memories together) {stage} and was stopped; if it needs more, set `memory` in [train] of the job file",
        orch_core::limits::show_bytes(*limit as u64)
    )]
    MemoryLimit {
        plugin: String,
        stage: Stage,
        limit: usize,
    },
    #[error("trainer `{plugin}` tried to read {what} {stage}, which plugins are not granted")]
    Denied {
        plugin: String,
        stage: Stage,
        what: &'static str,
    },
    #[error("trainer `{plugin}` crashed {stage} ({trap}){}", output_suffix(.output))]
    Crashed {
        plugin: String,
        stage: Stage,
        trap: String,
        /// The last lines the plugin wrote (a panic message, typically).
        output: Vec<String>,
    },
    #[error("trainer `{plugin}` failed {stage}: {message}")]
    Failed {
        plugin: String,
        stage: Stage,
        message: String,
    },
    /// The host stopped this replica because the job is stopping (another replica failed), or
    /// the replicas could not meet at an exchange.
    #[error("trainer `{plugin}` was stopped {stage}: {reason}")]
    Stopped {
        plugin: String,
        stage: Stage,
        reason: String,
    },
    /// orch itself panicked inside a host function the plugin called: a bug in orch, named
    /// with the call and where the run was so it can be reported and reproduced.
    #[error(
        "orch failed inside `{call}`, called by trainer `{plugin}` {stage}: {message}; this is a bug in orch, please report it"
    )]
    HostPanic {
        plugin: String,
        stage: Stage,
        call: &'static str,
        message: String,
    },
    #[error("cannot resume: {0}")]
    Resume(String),
    #[error("checkpoint {}: {reason}", path.display())]
    Checkpoint { path: PathBuf, reason: String },
    /// A checkpoint could not be written: the run stops at that step (with every replica),
    /// the previous checkpoint is kept whole.
    #[error(
        "could not write the checkpoint at {}: {reason}; training stopped after step {step}, and the previous checkpoint is kept (free space or fix the folder, then resume with --resume)",
        path.display()
    )]
    CheckpointWrite {
        step: u64,
        path: PathBuf,
        reason: String,
    },
    #[error("cannot write {}: {source}", path.display())]
    Output {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the WebAssembly engine failed: {0}")]
    Engine(String),
}

/// Most characters of a plugin's own message (a step's or `predict`'s error) an error quotes.
pub(crate) const MAX_MESSAGE_CHARS: usize = 2000;

/// Most characters of a value a plugin supplied (a name) an error quotes.
pub(crate) const MAX_QUOTED_CHARS: usize = 64;

/// A plugin's message as an error quotes it: printable, at most [`MAX_MESSAGE_CHARS`]
/// characters and its size past them. A step's and `predict`'s errors alike.
pub(crate) fn plugin_message(message: &str) -> String {
    orch_host::shortened(message, MAX_MESSAGE_CHARS)
}

/// A value a plugin supplied (a name) as an error quotes it: at most [`MAX_QUOTED_CHARS`]
/// printable characters and its size past them; nothing more of it is read or copied.
pub(crate) fn quoted(value: &str) -> String {
    orch_host::shortened(value, MAX_QUOTED_CHARS)
}

fn output_suffix(output: &[String]) -> String {
    if output.is_empty() {
        String::new()
    } else {
        format!("; it wrote: {}", output.join(" / "))
    }
}

impl TrainError {
    /// True when the user's input is at fault (a name, a file, the data, a resume without a
    /// checkpoint), so the CLI exits 2; false for a job that ran and failed (exit 1).
    pub fn is_bad_input(&self) -> bool {
        match self {
            TrainError::Plugin(e) => e.is_bad_input(),
            other => matches!(
                other,
                TrainError::Data(_) | TrainError::Setup(_) | TrainError::Resume(_)
            ),
        }
    }
}
