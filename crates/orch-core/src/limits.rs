//! The limits a plugin runs under, as users set them and as the machine bounds them.
//!
//! A job file may set a plugin's deadline and memory cap (`[policy] deadline = "200ms"`,
//! `memory = "256MiB"`; the same keys under `[train]`; a daemon's `serve.toml` sets them for its
//! queue policy under `[queue]`). Each is bounded by the machine's maximum for that kind of
//! plugin, from the machine's config (`ORCH_CONFIG`, default `/etc/orch/orch.toml`):
//!
//! ```toml
//! [limits.policy]
//! max_deadline = "1s"
//! max_memory = "1GiB"
//! [limits.trainer]
//! max_deadline = "1h"
//! max_memory = "4GiB"
//! [limits.queue]
//! max_deadline = "5s"
//! max_memory = "1GiB"
//! ```
//!
//! Design decision: the maxima are the machine owner's, not the job's: a job asking past them is
//! refused (with the setting that raises it named), never silently clamped, so a user learns at
//! once why a plugin that ran elsewhere does not run here.

use crate::location::{InputError, Location};
use crate::size::ByteSize;
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::time::Duration;
use toml::Spanned;

/// Names the machine's config file; empty means "none: the built-in maxima".
pub const CONFIG_ENV: &str = "ORCH_CONFIG";

/// Where the machine's config is when `ORCH_CONFIG` does not say.
pub const DEFAULT_CONFIG: &str = "/etc/orch/orch.toml";

/// The kinds of plugin, each with its own default and maximum limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PluginKind {
    /// A placement policy: the job file's `[policy]`.
    Policy,
    /// A trainer: the job file's `[train]`.
    Trainer,
    /// A daemon's queue policy: `serve.toml`'s `[queue]`.
    Queue,
}

impl PluginKind {
    /// `policy`, `trainer`, `queue`: the machine config's table under `[limits]`.
    pub fn key(self) -> &'static str {
        match self {
            PluginKind::Policy => "policy",
            PluginKind::Trainer => "trainer",
            PluginKind::Queue => "queue",
        }
    }

    /// The table a user sets the limit in: `[policy]` or `[train]` of the job file, `[queue]`
    /// of the daemon's config.
    pub fn table(self) -> &'static str {
        match self {
            PluginKind::Policy => "[policy] of the job file",
            PluginKind::Trainer => "[train] of the job file",
            PluginKind::Queue => "[queue] of the daemon's serve.toml",
        }
    }

    /// The limits a plugin of this kind gets when nobody sets any.
    pub fn defaults(self) -> Bounds {
        match self {
            PluginKind::Policy => Bounds {
                deadline: Duration::from_millis(100),
                memory: 64 << 20,
            },
            PluginKind::Trainer => Bounds {
                deadline: Duration::from_secs(60),
                memory: 256 << 20,
            },
            PluginKind::Queue => Bounds {
                deadline: Duration::from_millis(250),
                memory: 64 << 20,
            },
        }
    }

    /// The maxima of a machine whose config sets none.
    pub fn default_maxima(self) -> Bounds {
        match self {
            PluginKind::Policy => Bounds {
                deadline: Duration::from_secs(1),
                memory: 1 << 30,
            },
            PluginKind::Trainer => Bounds {
                deadline: Duration::from_secs(3600),
                memory: 4 << 30,
            },
            PluginKind::Queue => Bounds {
                deadline: Duration::from_secs(5),
                memory: 1 << 30,
            },
        }
    }
}

/// A deadline and a memory cap (bytes, all of a plugin's linear memories together).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Bounds {
    pub deadline: Duration,
    pub memory: u64,
}

/// What a user set for one plugin: `deadline` and `memory`, each with where it was written.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LimitSettings {
    pub deadline: Option<(Duration, Location)>,
    pub memory: Option<(u64, Location)>,
}

/// Wasm32 addresses 4 GiB: no linear memory grows past it.
const WASM32_MEMORY: u64 = 4 << 30;

impl LimitSettings {
    /// Reads `deadline` and `memory` from a table's raw values (`None` when absent), naming
    /// `table` (such as `[policy]`) in errors.
    pub fn parse(
        file: &Path,
        text: &str,
        table: &str,
        deadline: Option<&Spanned<toml::Value>>,
        memory: Option<&Spanned<toml::Value>>,
    ) -> Result<LimitSettings, InputError> {
        let mut settings = LimitSettings::default();
        if let Some(value) = deadline {
            let span = value.span();
            let parsed = match value.get_ref() {
                toml::Value::String(s) => crate::duration::parse(s),
                toml::Value::Integer(i) if *i > 0 => Some(Duration::from_secs(i.unsigned_abs())),
                _ => None,
            };
            let deadline = parsed.ok_or_else(|| {
                InputError::at(
                    file,
                    text,
                    span.start,
                    format!("{table} deadline is not a duration"),
                )
                .with_hint("give a string such as \"200ms\", \"2s\", \"15m\", or seconds")
            })?;
            settings.deadline = Some((deadline, Location::from_offset(file, text, span.start)));
        }
        if let Some(value) = memory {
            let span = value.span();
            let parsed = match value.get_ref() {
                toml::Value::String(s) => s.parse::<ByteSize>().ok().map(ByteSize::bytes),
                toml::Value::Integer(i) if *i > 0 => Some(i.unsigned_abs()),
                _ => None,
            };
            let memory = parsed.filter(|b| *b > 0).ok_or_else(|| {
                InputError::at(
                    file,
                    text,
                    span.start,
                    format!("{table} memory is not a size"),
                )
                .with_hint("give a size such as \"256MiB\" or \"1GiB\"")
            })?;
            if memory > WASM32_MEMORY {
                return Err(InputError::at(
                    file,
                    text,
                    span.start,
                    format!("{table} memory is above 4 GiB, more than a wasm32 plugin can address"),
                )
                .with_hint("give at most \"4GiB\""));
            }
            settings.memory = Some((memory, Location::from_offset(file, text, span.start)));
        }
        Ok(settings)
    }
}

/// The machine's maxima for each kind of plugin, and the file they came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MachineLimits {
    /// The config file read; `None` when there was none (the built-in maxima).
    pub path: Option<PathBuf>,
    pub policy: Bounds,
    pub trainer: Bounds,
    pub queue: Bounds,
}

impl Default for MachineLimits {
    fn default() -> MachineLimits {
        MachineLimits {
            path: None,
            policy: PluginKind::Policy.default_maxima(),
            trainer: PluginKind::Trainer.default_maxima(),
            queue: PluginKind::Queue.default_maxima(),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    limits: RawLimits,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLimits {
    policy: Option<RawMaxima>,
    trainer: Option<RawMaxima>,
    queue: Option<RawMaxima>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMaxima {
    max_deadline: Option<Spanned<String>>,
    max_memory: Option<Spanned<ByteSize>>,
}

impl MachineLimits {
    /// The machine's config: the file `ORCH_CONFIG` names (it must exist), else
    /// `/etc/orch/orch.toml` when it exists, else the built-in maxima.
    pub fn load() -> Result<MachineLimits, InputError> {
        match std::env::var_os(CONFIG_ENV) {
            Some(path) if path.is_empty() => Ok(MachineLimits::default()),
            Some(path) => MachineLimits::read(Path::new(&path)),
            None if Path::new(DEFAULT_CONFIG).exists() => {
                MachineLimits::read(Path::new(DEFAULT_CONFIG))
            }
            None => Ok(MachineLimits::default()),
        }
    }

    /// The machine's config as [`MachineLimits::load`] reads it, once per process: every
    /// plugin a process loads is bounded by the same maxima.
    pub fn current() -> Result<&'static MachineLimits, InputError> {
        static CURRENT: std::sync::OnceLock<Result<MachineLimits, InputError>> =
            std::sync::OnceLock::new();
        CURRENT
            .get_or_init(MachineLimits::load)
            .as_ref()
            .map_err(Clone::clone)
    }

    /// The maxima in the config file at `path`.
    pub fn read(path: &Path) -> Result<MachineLimits, InputError> {
        let text = std::fs::read_to_string(path).map_err(|e| InputError {
            location: Location::from_offset(path, "", 0),
            message: format!("cannot read the machine's config: {e}"),
            hint: Some(format!(
                "{CONFIG_ENV} names it; unset it to use {DEFAULT_CONFIG}, or set it empty for the built-in maxima"
            )),
        })?;
        MachineLimits::parse(path, &text)
    }

    /// The maxima in `text`, the config file at `path`.
    pub fn parse(path: &Path, text: &str) -> Result<MachineLimits, InputError> {
        let raw: RawConfig =
            toml::from_str(text).map_err(|e| InputError::from_toml(path, text, &e))?;
        let mut limits = MachineLimits {
            path: Some(path.to_path_buf()),
            ..MachineLimits::default()
        };
        for (kind, raw) in [
            (PluginKind::Policy, raw.limits.policy),
            (PluginKind::Trainer, raw.limits.trainer),
            (PluginKind::Queue, raw.limits.queue),
        ] {
            let Some(raw) = raw else { continue };
            let bounds = limits.bounds_mut(kind);
            if let Some(deadline) = raw.max_deadline {
                bounds.deadline = crate::duration::parse(deadline.get_ref()).ok_or_else(|| {
                    InputError::at(
                        path,
                        text,
                        deadline.span().start,
                        format!("[limits.{}] max_deadline is not a duration", kind.key()),
                    )
                    .with_hint("give a string such as \"1s\" or \"15m\"")
                })?;
            }
            if let Some(memory) = raw.max_memory {
                let bytes = memory.get_ref().bytes();
                if bytes == 0 || bytes > WASM32_MEMORY {
                    return Err(InputError::at(
                        path,
                        text,
                        memory.span().start,
                        format!(
                            "[limits.{}] max_memory must be above 0 and at most 4 GiB",
                            kind.key()
                        ),
                    )
                    .with_hint("a wasm32 plugin addresses at most 4 GiB"));
                }
                bounds.memory = bytes;
            }
        }
        Ok(limits)
    }

    pub fn bounds(&self, kind: PluginKind) -> Bounds {
        match kind {
            PluginKind::Policy => self.policy,
            PluginKind::Trainer => self.trainer,
            PluginKind::Queue => self.queue,
        }
    }

    fn bounds_mut(&mut self, kind: PluginKind) -> &mut Bounds {
        match kind {
            PluginKind::Policy => &mut self.policy,
            PluginKind::Trainer => &mut self.trainer,
            PluginKind::Queue => &mut self.queue,
        }
    }

    /// Where the maxima come from, for a message: the file, or "orch's built-in maximum".
    fn source(&self, kind: PluginKind, key: &str) -> String {
        match &self.path {
            Some(path) => format!(
                "`{key}` under [limits.{}] in {}",
                kind.key(),
                path.display()
            ),
            None => format!(
                "orch's built-in maximum; a machine raises it with `{key}` under [limits.{}] in {DEFAULT_CONFIG}",
                kind.key()
            ),
        }
    }

    /// The limits a plugin of `kind` gets: what `settings` asks for, else the kind's default
    /// (lowered to the maximum, when a machine sets a maximum below the default), refused
    /// when a setting is above the machine's maximum.
    pub fn resolve(
        &self,
        kind: PluginKind,
        settings: &LimitSettings,
    ) -> Result<Bounds, InputError> {
        let max = self.bounds(kind);
        let defaults = kind.defaults();
        let mut bounds = Bounds {
            deadline: defaults.deadline.min(max.deadline),
            memory: defaults.memory.min(max.memory),
        };
        if let Some((deadline, at)) = &settings.deadline {
            if *deadline > max.deadline {
                return Err(InputError {
                    location: at.clone(),
                    message: format!(
                        "deadline = {} in {} is above this machine's maximum of {} ({})",
                        show_duration(*deadline),
                        kind.table(),
                        show_duration(max.deadline),
                        self.source(kind, "max_deadline")
                    ),
                    hint: Some(format!(
                        "ask for at most {}, or have the machine's owner raise the maximum",
                        show_duration(max.deadline)
                    )),
                });
            }
            bounds.deadline = *deadline;
        }
        if let Some((memory, at)) = &settings.memory {
            if *memory > max.memory {
                return Err(InputError {
                    location: at.clone(),
                    message: format!(
                        "memory = {} in {} is above this machine's maximum of {} ({})",
                        show_bytes(*memory),
                        kind.table(),
                        show_bytes(max.memory),
                        self.source(kind, "max_memory")
                    ),
                    hint: Some(format!(
                        "ask for at most {}, or have the machine's owner raise the maximum",
                        show_bytes(max.memory)
                    )),
                });
            }
            bounds.memory = *memory;
        }
        Ok(bounds)
    }
}

/// `250 ms`, `2 s`, `1.5 s`, `15 min`: how a limit's duration is shown.
pub fn show_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms < 1000 {
        format!("{ms} ms")
    } else if ms.is_multiple_of(60_000) {
        format!("{} min", ms / 60_000)
    } else if ms.is_multiple_of(1000) {
        format!("{} s", ms / 1000)
    } else {
        format!("{:.1} s", d.as_secs_f64())
    }
}

/// `64 MiB`, `1 GiB`, `1536 KiB`: how a limit's size is shown.
pub fn show_bytes(bytes: u64) -> String {
    for (unit, shift) in [("GiB", 30), ("MiB", 20), ("KiB", 10)] {
        if bytes >= 1 << shift && bytes.is_multiple_of(1 << shift) {
            return format!("{} {unit}", bytes >> shift);
        }
    }
    if bytes >= 1 << 20 {
        format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
    } else {
        format!("{bytes} bytes")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(deadline: Option<u64>, memory: Option<u64>) -> LimitSettings {
        let at = Location::from_offset(Path::new("job.toml"), "", 0);
        LimitSettings {
            deadline: deadline.map(|ms| (Duration::from_millis(ms), at.clone())),
            memory: memory.map(|b| (b, at)),
        }
    }

    #[test]
    fn defaults_apply_until_a_job_sets_its_own_within_the_maximum() {
        let machine = MachineLimits::default();
        let policy = machine
            .resolve(PluginKind::Policy, &settings(None, None))
            .unwrap();
        assert_eq!(policy, PluginKind::Policy.defaults());
        let set = machine
            .resolve(PluginKind::Policy, &settings(Some(200), Some(256 << 20)))
            .unwrap();
        assert_eq!(set.deadline, Duration::from_millis(200));
        assert_eq!(set.memory, 256 << 20);
    }

    #[test]
    fn a_setting_above_the_maximum_names_the_setting_that_raises_it() {
        let text = "[limits.policy]\nmax_deadline = \"500ms\"\nmax_memory = \"128MiB\"\n";
        let machine = MachineLimits::parse(Path::new("/etc/orch/orch.toml"), text).unwrap();
        let e = machine
            .resolve(PluginKind::Policy, &settings(Some(800), None))
            .unwrap_err();
        assert!(
            e.message
                .contains("deadline = 800 ms in [policy] of the job file"),
            "{e}"
        );
        assert!(
            e.message.contains(
                "maximum of 500 ms (`max_deadline` under [limits.policy] in /etc/orch/orch.toml)"
            ),
            "{e}"
        );
        let e = machine
            .resolve(PluginKind::Policy, &settings(None, Some(256 << 20)))
            .unwrap_err();
        assert!(e.message.contains("memory = 256 MiB"), "{e}");
        assert!(
            e.message.contains("`max_memory` under [limits.policy]"),
            "{e}"
        );
        // A maximum below the default lowers the default.
        let low = "[limits.queue]\nmax_deadline = \"100ms\"\n";
        let machine = MachineLimits::parse(Path::new("orch.toml"), low).unwrap();
        let queue = machine
            .resolve(PluginKind::Queue, &settings(None, None))
            .unwrap();
        assert_eq!(queue.deadline, Duration::from_millis(100));
    }

    #[test]
    fn a_bad_config_is_refused_with_its_place() {
        for (text, words) in [
            (
                "[limits.policy]\nmax_deadline = \"soon\"\n",
                "max_deadline is not a duration",
            ),
            ("[limits.trainer]\nmax_memory = \"8GiB\"\n", "at most 4 GiB"),
            ("[limits.gpu]\n", "unknown field"),
        ] {
            let e = MachineLimits::parse(Path::new("orch.toml"), text).unwrap_err();
            assert!(e.to_string().contains(words), "{text}: {e}");
        }
    }

    #[test]
    fn durations_and_sizes_read_as_people_write_them() {
        assert_eq!(show_duration(Duration::from_millis(250)), "250 ms");
        assert_eq!(show_duration(Duration::from_secs(2)), "2 s");
        assert_eq!(show_duration(Duration::from_millis(1500)), "1.5 s");
        assert_eq!(show_duration(Duration::from_secs(900)), "15 min");
        assert_eq!(show_bytes(64 << 20), "64 MiB");
        assert_eq!(show_bytes(1 << 30), "1 GiB");
    }
}
