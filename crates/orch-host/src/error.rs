//! How a policy plugin can fail. Every variant names the plugin.

use std::path::PathBuf;
use std::time::Duration;

/// Why a policy refused, as the contract's `refusal` variant says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefusalKind {
    /// Not enough candidates meet the request.
    NoFit,
    /// The job's `[policy.config]` is wrong.
    BadConfig,
}

/// A policy plugin that could not be loaded, did not answer, answered wrongly, or refused.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    #[error(
        "unknown built-in policy `{name}`: the built-ins are {}; or give a path to a .wasm component",
        crate::builtin::names().join(", ")
    )]
    UnknownBuiltin { name: String },
    #[error("cannot read policy plugin {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "`{plugin}` is not a WebAssembly component ({detail}); build a policy with `cargo build --target wasm32-wasip2 --release`"
    )]
    NotComponent { plugin: String, detail: String },
    #[error(
        "`{plugin}` is a component of another world, not {world}: {detail}",
        world = orch_wit::POLICY_WORLD
    )]
    WrongWorld { plugin: String, detail: String },
    #[error("policy plugin `{plugin}` cannot be loaded: {detail}")]
    Load { plugin: String, detail: String },
    #[error("policy plugin `{plugin}` did not answer within its deadline of {} ms and was stopped", deadline.as_millis())]
    Timeout { plugin: String, deadline: Duration },
    #[error(
        "policy plugin `{plugin}` went over its memory limit of {} MiB and was stopped",
        limit >> 20
    )]
    MemoryLimit { plugin: String, limit: usize },
    #[error(
        "policy plugin `{plugin}` tried to read {what}, which plugins are not granted, and was stopped"
    )]
    Denied { plugin: String, what: &'static str },
    #[error("policy plugin `{plugin}` crashed ({trap}){}", output_suffix(.output))]
    Crashed {
        plugin: String,
        trap: String,
        /// The last lines the plugin wrote (a panic message, typically).
        output: Vec<String>,
    },
    #[error("policy plugin `{plugin}` gave a wrong answer: {problem}")]
    WrongAnswer { plugin: String, problem: String },
    #[error("policy `{plugin}` found no fit: {message}")]
    NoFit { plugin: String, message: String },
    #[error("policy `{plugin}` rejected its configuration: {message}")]
    BadConfig { plugin: String, message: String },
    #[error("the WebAssembly engine failed: {0}")]
    Engine(String),
}

fn output_suffix(output: &[String]) -> String {
    if output.is_empty() {
        String::new()
    } else {
        format!(": {}", output.join(" "))
    }
}

impl PolicyError {
    /// True when the user's input is at fault (a name, a file, a configuration), so the CLI
    /// exits 2; false for a plugin that misbehaved or found no fit (exit 1).
    pub fn is_bad_input(&self) -> bool {
        matches!(
            self,
            PolicyError::UnknownBuiltin { .. }
                | PolicyError::Read { .. }
                | PolicyError::NotComponent { .. }
                | PolicyError::WrongWorld { .. }
                | PolicyError::Load { .. }
                | PolicyError::BadConfig { .. }
        )
    }

    /// The refusal, when the plugin refused (as opposed to failing).
    pub fn refusal(&self) -> Option<(RefusalKind, &str)> {
        match self {
            PolicyError::NoFit { message, .. } => Some((RefusalKind::NoFit, message)),
            PolicyError::BadConfig { message, .. } => Some((RefusalKind::BadConfig, message)),
            _ => None,
        }
    }
}
