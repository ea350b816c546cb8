//! The policy host: loads policy components (built-in or from a file), keeps one warm instance
//! per plugin, asks for decisions under the limits, and validates every answer.

use crate::builtin::builtin;
use crate::cache::{ComponentCache, default_cache_dir};
use crate::engine::{Ticker, deadline_ticks, new_engine};
use crate::error::PolicyError;
use crate::failure::{self, CallFailure};
use crate::limits::Limits;
use crate::sandbox::{PluginState, add_wasi};
use crate::types::{Decision, Device, Lease, Refusal, Request};
use crate::validate::{check_decision, clean_text};
pub use orch_core::PluginRef;
use orch_wit::{Policy, PolicyPre};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use wasmtime::component::types::{ComponentExtern, ComponentItem};
use wasmtime::component::{Component, Linker};
use wasmtime::{Engine, Store};

/// A loaded plugin, as [`PolicyHost::load`] returns it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PluginId(usize);

/// Runs policy plugins. One per process is the intent: it owns the engine, the epoch ticker,
/// the compiled components and a warm instance of each loaded plugin.
pub struct PolicyHost {
    engine: Engine,
    linker: Linker<PluginState>,
    limits: Limits,
    cache: ComponentCache,
    slots: Vec<Slot>,
    /// Loaded plugins by source (`builtin:NAME`, `file:PATH`, `bytes:NAME`).
    by_source: HashMap<String, PluginId>,
    _ticker: Ticker,
}

impl std::fmt::Debug for PolicyHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PolicyHost")
            .field("limits", &self.limits)
            .field(
                "plugins",
                &self.slots.iter().map(|s| &s.name).collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

struct Slot {
    name: String,
    default_config: &'static [(&'static str, &'static str)],
    pre: PolicyPre<PluginState>,
    warm: Option<Warm>,
}

/// An instance that has answered well and can answer again.
struct Warm {
    store: Store<PluginState>,
    policy: Policy,
}

impl PolicyHost {
    /// A host with `limits`, caching compiled components under [`default_cache_dir`].
    pub fn new(limits: Limits) -> Result<PolicyHost, PolicyError> {
        PolicyHost::with_cache_dir(limits, default_cache_dir())
    }

    /// A host caching compiled components under `cache_dir` (`None`: in memory only).
    pub fn with_cache_dir(
        limits: Limits,
        cache_dir: Option<PathBuf>,
    ) -> Result<PolicyHost, PolicyError> {
        let engine_error = |e: wasmtime::Error| PolicyError::Engine(e.to_string());
        let engine = new_engine(&limits).map_err(engine_error)?;
        let mut linker = Linker::new(&engine);
        add_wasi(&mut linker).map_err(engine_error)?;
        let ticker = Ticker::start(&engine)
            .map_err(|e| PolicyError::Engine(format!("cannot start the epoch ticker: {e}")))?;
        Ok(PolicyHost {
            cache: ComponentCache::new(&engine, cache_dir),
            engine,
            linker,
            limits,
            slots: Vec::new(),
            by_source: HashMap::new(),
            _ticker: ticker,
        })
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    pub(crate) fn engine(&self) -> &Engine {
        &self.engine
    }

    pub(crate) fn linker(&self) -> &Linker<PluginState> {
        &self.linker
    }

    pub(crate) fn component(&mut self, wasm: &[u8]) -> wasmtime::Result<Component> {
        self.cache.get(&self.engine, wasm)
    }

    /// Loads a built-in by name or a component from a file (once; later calls return the
    /// same plugin).
    pub fn load(&mut self, plugin: &PluginRef) -> Result<PluginId, PolicyError> {
        match plugin {
            PluginRef::Builtin(name) => {
                let found = builtin(name)
                    .ok_or_else(|| PolicyError::UnknownBuiltin { name: name.clone() })?;
                let source = format!("builtin:{name}");
                self.load_named(source, found.name, found.wasm, found.default_config)
            }
            PluginRef::Path(path) => {
                let wasm = std::fs::read(path).map_err(|source| PolicyError::Read {
                    path: path.clone(),
                    source,
                })?;
                let source = format!("file:{}", path.display());
                self.load_named(source, &plugin_name(path), &wasm, &[])
            }
        }
    }

    /// Loads a component from bytes under `name` (the name every error uses).
    pub fn load_bytes(&mut self, name: &str, wasm: &[u8]) -> Result<PluginId, PolicyError> {
        self.load_named(format!("bytes:{name}"), name, wasm, &[])
    }

    fn load_named(
        &mut self,
        source: String,
        name: &str,
        wasm: &[u8],
        default_config: &'static [(&'static str, &'static str)],
    ) -> Result<PluginId, PolicyError> {
        if let Some(&id) = self.by_source.get(&source) {
            return Ok(id);
        }
        let pre = self.prepare(name, wasm)?;
        let id = PluginId(self.slots.len());
        self.slots.push(Slot {
            name: name.to_string(),
            default_config,
            pre,
            warm: None,
        });
        self.by_source.insert(source, id);
        Ok(id)
    }

    /// Compiles (or finds compiled) `wasm`, checks it is a policy and links it.
    fn prepare(&mut self, name: &str, wasm: &[u8]) -> Result<PolicyPre<PluginState>, PolicyError> {
        check_component_header(name, wasm)?;
        let component = self
            .component(wasm)
            .map_err(|e| PolicyError::NotComponent {
                plugin: name.to_string(),
                detail: format!("it does not validate: {e}"),
            })?;
        let exports = export_names(&self.engine, &component);
        if !exports.iter().any(|e| e == "select") {
            return Err(PolicyError::WrongWorld {
                plugin: name.to_string(),
                detail: format!(
                    "it exports {}, and a policy exports `select`",
                    list_or_nothing(&exports)
                ),
            });
        }
        let pre = self
            .linker
            .instantiate_pre(&component)
            .map_err(|e| PolicyError::Load {
                plugin: name.to_string(),
                detail: format!(
                    "{e:#} (plugins get WASI with nothing behind it, and no other import)"
                ),
            })?;
        PolicyPre::new(pre).map_err(|e| PolicyError::WrongWorld {
            plugin: name.to_string(),
            detail: format!(
                "its `select` does not match the contract ({e:#}); rebuild it against this wit/"
            ),
        })
    }

    /// The name errors use for the plugin.
    pub fn name(&self, id: PluginId) -> &str {
        &self.slots[id.0].name
    }

    /// `[policy.config]` keys the host fills in for this plugin when a job leaves them out.
    pub fn default_config(&self, id: PluginId) -> &'static [(&'static str, &'static str)] {
        self.slots[id.0].default_config
    }

    /// Drops the plugin's warm instance: the next decision instantiates afresh.
    pub fn discard_instance(&mut self, id: PluginId) {
        self.slots[id.0].warm = None;
    }

    /// Asks plugin `id` to choose among `candidates` (with the `leases` on them) for
    /// `request`, within the limits, and checks the answer. A plugin that traps, overruns or
    /// answers wrongly loses its instance.
    pub fn decide(
        &mut self,
        id: PluginId,
        request: &Request,
        candidates: &[Device],
        leases: &[Lease],
    ) -> Result<Decision, PolicyError> {
        let ticks = deadline_ticks(self.limits.deadline);
        let slot = &mut self.slots[id.0];
        let mut warm = match slot.warm.take() {
            Some(warm) => warm,
            None => instantiate(&self.engine, slot, &self.limits, ticks)?,
        };
        warm.store.data().log.begin_call();
        warm.store.set_epoch_deadline(ticks);
        let outcome = warm
            .policy
            .call_select(&mut warm.store, request, candidates, leases);
        let output = warm.store.data().log.end_call();
        let plugin = || slot.name.clone();
        match outcome {
            Err(error) => Err(classify(
                &slot.name,
                &self.limits,
                warm.store.data(),
                &error,
                output,
            )),
            Ok(Err(refusal)) => {
                slot.warm = Some(warm);
                Err(match refusal {
                    Refusal::NoFit(message) => PolicyError::NoFit {
                        plugin: plugin(),
                        message: clean_text(&message),
                    },
                    Refusal::BadConfig(message) => PolicyError::BadConfig {
                        plugin: plugin(),
                        message: clean_text(&message),
                    },
                })
            }
            Ok(Ok(decision)) => {
                check_decision(request, candidates, leases, &decision).map_err(|problem| {
                    PolicyError::WrongAnswer {
                        plugin: plugin(),
                        problem,
                    }
                })?;
                slot.warm = Some(warm);
                Ok(Decision {
                    reason: clean_text(&decision.reason),
                    devices: decision.devices,
                })
            }
        }
    }
}

/// A fresh store and instance for `slot`, under the deadline and the limits.
fn instantiate(
    engine: &Engine,
    slot: &Slot,
    limits: &Limits,
    ticks: u64,
) -> Result<Warm, PolicyError> {
    let mut store = Store::new(engine, PluginState::new(&slot.name, limits));
    store.limiter(|state| &mut state.limiter);
    store.set_epoch_deadline(ticks);
    store.data().log.begin_call();
    match slot.pre.instantiate(&mut store) {
        Ok(policy) => Ok(Warm { store, policy }),
        Err(error) => {
            let output = store.data().log.end_call();
            Err(classify(&slot.name, limits, store.data(), &error, output))
        }
    }
}

/// What stopped the plugin, in the user's words.
fn classify(
    plugin: &str,
    limits: &Limits,
    state: &PluginState,
    error: &wasmtime::Error,
    output: Vec<String>,
) -> PolicyError {
    let plugin = plugin.to_string();
    match failure::classify(state, error) {
        CallFailure::MemoryLimit => PolicyError::MemoryLimit {
            plugin,
            limit: limits.memory_bytes,
        },
        CallFailure::Denied(what) => PolicyError::Denied { plugin, what },
        CallFailure::Timeout => PolicyError::Timeout {
            plugin,
            deadline: limits.deadline,
        },
        CallFailure::Crashed(trap) => PolicyError::Crashed {
            plugin,
            trap,
            output,
        },
    }
}

/// Rejects what is not a component before compiling: another file, or a core module.
pub(crate) fn check_component_header(name: &str, wasm: &[u8]) -> Result<(), PolicyError> {
    let not = |detail: &str| PolicyError::NotComponent {
        plugin: name.to_string(),
        detail: detail.to_string(),
    };
    if !wasm.starts_with(b"\0asm") || wasm.len() < 8 {
        return Err(not("not a WebAssembly file"));
    }
    if wasm[4..8] == [1, 0, 0, 0] {
        return Err(not("a core WebAssembly module, not a component"));
    }
    Ok(())
}

/// The names a component exports.
pub(crate) fn export_names(engine: &Engine, component: &Component) -> Vec<String> {
    component
        .component_type()
        .exports(engine)
        .map(|(name, _)| name.to_string())
        .collect()
}

/// Items as `kind name` lines, for inspection.
pub(crate) fn describe<'a>(
    items: impl Iterator<Item = (&'a str, ComponentExtern<'a>)>,
) -> Vec<String> {
    items
        .map(|(name, item)| {
            let kind = match item.ty {
                ComponentItem::ComponentFunc(_) | ComponentItem::CoreFunc(_) => "func",
                ComponentItem::Module(_) => "module",
                ComponentItem::Component(_) => "component",
                ComponentItem::ComponentInstance(_) => "instance",
                ComponentItem::Type(_) => "type",
                ComponentItem::Resource(_) => "resource",
            };
            format!("{kind} {name}")
        })
        .collect()
}

fn list_or_nothing(names: &[String]) -> String {
    if names.is_empty() {
        "nothing".to_string()
    } else {
        names
            .iter()
            .map(|n| format!("`{n}`"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// A plugin file's name, as errors show it (`my_policy.wasm`).
pub(crate) fn plugin_name(path: &Path) -> String {
    path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    )
}
