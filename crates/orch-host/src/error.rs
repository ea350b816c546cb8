//! How a plugin of any world (a placement policy, a queue policy, a trainer) can fail to load or
//! to answer: one vocabulary for every host over the generic machinery (`runtime.rs`). Every
//! variant names the plugin, and its kind, in that kind's words.

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

/// Which kind of plugin an error is about: the words its message uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PluginKind {
    /// A placement policy (world `orch:plugin/policy`): "policy plugin `NAME`".
    Placement,
    /// A queue policy (world `orch:plugin/queue`): "queue policy `NAME`".
    Queue,
    /// A trainer (world `orch:plugin/trainer`): "trainer `NAME`".
    Trainer,
}

impl PluginKind {
    /// The world a plugin of this kind implements.
    pub fn world(self) -> String {
        match self {
            PluginKind::Placement => orch_wit::POLICY_WORLD.to_string(),
            PluginKind::Queue => orch_wit::QUEUE_WORLD.to_string(),
            PluginKind::Trainer => self.world_kind().id(orch_wit::Version::CURRENT),
        }
    }

    /// Where a user sets this kind's limits, as orch-core names it.
    pub fn limits_kind(self) -> orch_core::limits::PluginKind {
        match self {
            PluginKind::Placement => orch_core::limits::PluginKind::Policy,
            PluginKind::Queue => orch_core::limits::PluginKind::Queue,
            PluginKind::Trainer => orch_core::limits::PluginKind::Trainer,
        }
    }

    /// The world a plugin of this kind implements.
    pub fn world_kind(self) -> crate::contract::WorldKind {
        match self {
            PluginKind::Placement => crate::contract::WorldKind::Policy,
            PluginKind::Queue => crate::contract::WorldKind::Queue,
            PluginKind::Trainer => crate::contract::WorldKind::Trainer,
        }
    }

    /// "a policy", "a queue policy": what a plugin of this kind is, in a sentence.
    pub fn noun_phrase(self) -> &'static str {
        match self {
            PluginKind::Placement => "a policy",
            PluginKind::Queue => "a queue policy",
            PluginKind::Trainer => "a trainer",
        }
    }

    /// "policy", "queue policy": what a built-in of this kind is called.
    fn noun(self) -> &'static str {
        match self {
            PluginKind::Placement => "policy",
            PluginKind::Queue => "queue policy",
            PluginKind::Trainer => "trainer",
        }
    }

    /// The built-ins of this kind, as a list for a message.
    fn builtins(self) -> String {
        crate::builtin::builtin_names(self).join(", ")
    }

    /// "policy plugin", "queue policy", "trainer plugin": what a file of this kind is called
    /// when it cannot be read.
    fn file_noun(self) -> &'static str {
        match self {
            PluginKind::Placement => "policy plugin",
            PluginKind::Queue => "queue policy",
            PluginKind::Trainer => "trainer plugin",
        }
    }

    /// What a plugin of this kind is given to import, for a refusal of another import.
    fn granted(self) -> &'static str {
        match self {
            PluginKind::Placement | PluginKind::Queue => {
                "plugins get the contract's types and WASI with nothing behind it, and no other import"
            }
            PluginKind::Trainer => {
                "trainers get the trainer world's imports and WASI with nothing behind it"
            }
        }
    }
}

impl std::fmt::Display for PluginKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PluginKind::Placement => "policy plugin",
            PluginKind::Queue => "queue policy",
            PluginKind::Trainer => "trainer",
        })
    }
}

/// A plugin (a placement policy, a queue policy or a trainer) that could not be loaded, did not
/// answer, answered wrongly, or refused. Every variant names the plugin, and `kind` says which
/// kind of plugin it is, so the message does. A trainer's calls fail with the step they were at
/// (orch-trainer's `TrainError`, over the same [`crate::CallFailure`]); loading one fails here.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    #[error(
        "unknown built-in {} `{name}`: the built-ins are {}; or give a path to a .wasm component",
        kind.noun(),
        kind.builtins()
    )]
    UnknownBuiltin { kind: PluginKind, name: String },
    #[error("cannot read {} {}: {source}", kind.file_noun(), path.display())]
    Read {
        kind: PluginKind,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}", not_component(*kind, plugin, detail))]
    NotComponent {
        kind: PluginKind,
        plugin: String,
        detail: String,
    },
    #[error("{}", wrong_world(*kind, plugin, detail))]
    WrongWorld {
        kind: PluginKind,
        plugin: String,
        detail: String,
    },
    #[error("{kind} `{plugin}` cannot be loaded: {detail}")]
    Load {
        kind: PluginKind,
        plugin: String,
        detail: String,
    },
    #[error(
        "{kind} `{plugin}` did not answer within its deadline of {} and was stopped; if it needs longer, set `deadline` in {}",
        orch_core::limits::show_duration(*deadline),
        kind.limits_kind().table()
    )]
    Timeout {
        kind: PluginKind,
        plugin: String,
        deadline: Duration,
    },
    #[error(
        "{kind} `{plugin}` went over its memory limit of {} (all its memories together) and was stopped; if it needs more, set `memory` in {}",
        orch_core::limits::show_bytes(*limit as u64),
        kind.limits_kind().table()
    )]
    MemoryLimit {
        kind: PluginKind,
        plugin: String,
        limit: usize,
    },
    #[error(
        "{kind} `{plugin}` tried to read {what}, which plugins are not granted, and was stopped"
    )]
    Denied {
        kind: PluginKind,
        plugin: String,
        what: &'static str,
    },
    #[error("{kind} `{plugin}` crashed ({trap}){}", output_suffix(.output))]
    Crashed {
        kind: PluginKind,
        plugin: String,
        trap: String,
        /// The last lines the plugin wrote (a panic message, typically).
        output: Vec<String>,
    },
    #[error("{kind} `{plugin}` gave a wrong answer: {problem}")]
    WrongAnswer {
        kind: PluginKind,
        plugin: String,
        problem: String,
    },
    #[error("policy `{plugin}` found no fit: {message}")]
    NoFit { plugin: String, message: String },
    #[error("policy `{plugin}` rejected its configuration: {message}")]
    BadConfig { plugin: String, message: String },
    /// A queue policy answered with an error value instead of an order.
    #[error("queue policy `{plugin}` could not order the queue: {message}")]
    QueueRefused { plugin: String, message: String },
    #[error("the WebAssembly engine failed: {0}")]
    Engine(String),
}

/// `plugin` is no component at all (`detail` says what it is instead).
fn not_component(kind: PluginKind, plugin: &str, detail: &str) -> String {
    match kind {
        PluginKind::Trainer => not_a_trainer(plugin, detail),
        _ => format!(
            "`{plugin}` is not a WebAssembly component ({detail}); orch loads components of world {}: build {} with `cargo build --target wasm32-wasip2` (Rust), `componentize-py` (Python) or `jco componentize` (JavaScript) against orch's wit/, as docs/PLUGINS.md shows",
            kind.world(),
            kind.noun_phrase()
        ),
    }
}

/// `plugin` is a component, but not of the world (or version) orch loads for `kind`.
fn wrong_world(kind: PluginKind, plugin: &str, detail: &str) -> String {
    match kind {
        PluginKind::Trainer => not_a_trainer(plugin, detail),
        _ => format!(
            "`{plugin}` is not {} orch can load: {detail}",
            kind.noun_phrase()
        ),
    }
}

/// A trainer's refusals read as the trainer host has always said them, pointing at the
/// trainers' guide.
fn not_a_trainer(plugin: &str, detail: &str) -> String {
    format!(
        "`{plugin}` is not a trainer component: {detail}; build one against orch's wit/ (world `trainer`), as docs/TRAINERS.md shows"
    )
}

fn output_suffix(output: &[String]) -> String {
    if output.is_empty() {
        String::new()
    } else {
        format!(": {}", output.join(" "))
    }
}

impl PluginError {
    /// What a plugin of `kind` imports that orch does not provide, in the words of `detail`
    /// (the linker's), for [`PluginError::Load`].
    pub(crate) fn foreign_import(
        kind: PluginKind,
        plugin: &str,
        world: &str,
        detail: &str,
    ) -> PluginError {
        PluginError::Load {
            kind,
            plugin: plugin.to_string(),
            detail: format!(
                "it implements {world} but imports what orch does not provide ({detail}); {}",
                kind.granted()
            ),
        }
    }

    /// True when the user's input is at fault (a name, a file, a configuration), so the CLI
    /// exits 2; false for a plugin that misbehaved, found no fit or could not order (exit 1).
    pub fn is_bad_input(&self) -> bool {
        matches!(
            self,
            PluginError::UnknownBuiltin { .. }
                | PluginError::Read { .. }
                | PluginError::NotComponent { .. }
                | PluginError::WrongWorld { .. }
                | PluginError::Load { .. }
                | PluginError::BadConfig { .. }
        )
    }

    /// The refusal, when a placement policy refused (as opposed to failing).
    pub fn refusal(&self) -> Option<(RefusalKind, &str)> {
        match self {
            PluginError::NoFit { message, .. } => Some((RefusalKind::NoFit, message)),
            PluginError::BadConfig { message, .. } => Some((RefusalKind::BadConfig, message)),
            _ => None,
        }
    }
}
