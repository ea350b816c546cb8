//! What every plugin host of this crate shares, whatever the world ([`Host`]): the engine, its
//! epoch ticker, the deny-all WASI linker and the compile cache; loading a component and
//! checking it is of the right world; one warm instance per plugin, called under the limits, and
//! thrown away when it fails.
//!
//! The policy host ([`crate::PolicyHost`]) and the queue host ([`crate::QueueHost`]) differ only
//! in the world ([`World`]) and in how they check an answer.

use crate::cache::ComponentCache;
use crate::contract::{self, Identity, WorldKind};
use crate::engine::{CallClock, Ticker, deadline_ticks, new_engine};
use crate::error::{PluginKind, PolicyError};
use crate::failure::{self, CallFailure};
use crate::limits::Limits;
use crate::sandbox::{PluginState, add_wasi};
use orch_core::PluginRef;
use orch_wit::Version;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use wasmtime::component::{Component, InstancePre, Linker};
use wasmtime::{Engine, Store};

/// A host of plugins of world `W`: the engine, its ticker, the linker, the limits and the
/// compile cache, and the loaded plugins, each compiled, linked and with at most one warm
/// instance.
pub(crate) struct Host<W: World> {
    engine: Engine,
    linker: Linker<PluginState>,
    limits: Limits,
    cache: ComponentCache,
    slots: Vec<Slot<W>>,
    /// Loaded plugins by source (`builtin:NAME`, `file:PATH`, `bytes:NAME`) and limits.
    by_source: HashMap<String, usize>,
    /// Calls answered, a clock for [`Slot::last_used`].
    calls: u64,
    /// Components compiled elsewhere for plugin files, by path ([`Host::provide`]).
    provided: HashMap<PathBuf, Component>,
    /// Plugin files load from `provided` only: nothing is compiled for them on this host.
    files_precompiled_only: bool,
    _ticker: Ticker,
}

/// A world of `orch:plugin`, as its bindings (in orch-wit) present it to a host.
pub(crate) trait World {
    const KIND: PluginKind;
    const WORLD: WorldKind;
    /// The world's bindings, ready to instantiate (`PolicyPre`, `QueuePre`).
    type Pre;
    /// An instance's exports (`Policy`, `Queue`).
    type Exports;
    /// What the host keeps beside each plugin (a built-in's defaults); `Default` for a plugin
    /// that is not built in.
    type Extra: Default;
    /// The bindings of `version` of the world over `pre`.
    fn pre(pre: InstancePre<PluginState>, version: Version) -> wasmtime::Result<Self::Pre>;
    fn instantiate(
        pre: &Self::Pre,
        store: &mut Store<PluginState>,
    ) -> wasmtime::Result<Self::Exports>;
}

struct Slot<W: World> {
    name: String,
    extra: W::Extra,
    /// The version of the contract the component implements.
    version: Version,
    /// What each call of this plugin may spend (the host's defaults, or the job's settings).
    limits: Limits,
    pre: W::Pre,
    warm: Option<Warm<W>>,
    /// When the warm instance last answered (the host's call counter), for eviction.
    last_used: u64,
}

/// Warm instances a host keeps at most: the pool has room for [`POOL_INSTANCES`], and a daemon
/// whose jobs give one plugin many different limits would otherwise hold one per limit.
///
/// [`POOL_INSTANCES`]: crate::engine::POOL_INSTANCES
const MAX_WARM: usize = 32;

/// An instance that has answered well and can answer again.
pub(crate) struct Warm<W: World> {
    store: Store<PluginState>,
    exports: W::Exports,
}

impl<W: World> Host<W> {
    /// An engine for `limits`, its ticker started, caching compiled components under
    /// `cache_dir` (`None`: in memory only); no plugin loaded yet.
    pub(crate) fn new(limits: Limits, cache_dir: Option<PathBuf>) -> Result<Host<W>, PolicyError> {
        let engine_error = |e: wasmtime::Error| PolicyError::Engine(e.to_string());
        let engine = new_engine(&limits).map_err(engine_error)?;
        let mut linker = Linker::new(&engine);
        add_wasi(&mut linker).map_err(engine_error)?;
        let ticker = Ticker::start(&engine)
            .map_err(|e| PolicyError::Engine(format!("cannot start the epoch ticker: {e}")))?;
        Ok(Host {
            cache: ComponentCache::new(&engine, cache_dir),
            engine,
            linker,
            limits,
            slots: Vec::new(),
            by_source: HashMap::new(),
            calls: 0,
            provided: HashMap::new(),
            files_precompiled_only: false,
            _ticker: ticker,
        })
    }

    /// `Debug` for the public host that wraps this one, called `name`.
    pub(crate) fn debug(&self, f: &mut std::fmt::Formatter<'_>, name: &str) -> std::fmt::Result {
        let plugins: Vec<&str> = self.slots.iter().map(|s| s.name.as_str()).collect();
        f.debug_struct(name)
            .field("limits", &self.limits)
            .field("plugins", &plugins)
            .finish_non_exhaustive()
    }

    pub(crate) fn limits(&self) -> &Limits {
        &self.limits
    }

    pub(crate) fn engine(&self) -> &Engine {
        &self.engine
    }

    pub(crate) fn linker(&self) -> &Linker<PluginState> {
        &self.linker
    }

    /// `wasm` compiled (or found compiled), after checking it is a component at all.
    pub(crate) fn compile(&mut self, name: &str, wasm: &[u8]) -> Result<Component, PolicyError> {
        check_component_header(W::KIND, name, wasm)?;
        self.cache
            .get(&self.engine, name, wasm)
            .map_err(|e| PolicyError::NotComponent {
                kind: W::KIND,
                plugin: name.to_string(),
                detail: format!("it does not validate: {e}"),
            })
    }

    /// Loads a built-in by name (`builtin` finds its component and extra) or a component from
    /// a file, once per plugin and limits: later calls return the same plugin.
    pub(crate) fn load(
        &mut self,
        plugin: &PluginRef,
        limits: &Limits,
        builtin: impl FnOnce(&str) -> Option<(&'static [u8], W::Extra)>,
    ) -> Result<usize, PolicyError> {
        match plugin {
            PluginRef::Builtin(name) => {
                let (wasm, extra) = builtin(name).ok_or_else(|| PolicyError::UnknownBuiltin {
                    kind: W::KIND,
                    name: name.clone(),
                })?;
                self.load_named(format!("builtin:{name}"), name, wasm, extra, limits)
            }
            PluginRef::Path(path) => {
                let source = format!("file:{}", path.display());
                if let Some(component) = self.provided.get(path).cloned() {
                    let key = slot_key(&source, limits);
                    return self.add_slot(
                        key,
                        &plugin_name(path),
                        component,
                        W::Extra::default(),
                        limits,
                    );
                }
                if self.files_precompiled_only {
                    return Err(PolicyError::Load {
                        kind: W::KIND,
                        plugin: plugin_name(path),
                        detail: "it has not been compiled yet, and this host compiles no plugin file itself".into(),
                    });
                }
                let wasm = std::fs::read(path).map_err(|source| PolicyError::Read {
                    kind: W::KIND,
                    path: path.clone(),
                    source,
                })?;
                self.load_named(
                    source,
                    &plugin_name(path),
                    &wasm,
                    W::Extra::default(),
                    limits,
                )
            }
        }
    }

    /// Makes `component` what plugin file `path` loads as: nothing is read or compiled for it.
    pub(crate) fn provide(&mut self, path: &Path, component: Component) {
        self.provided.insert(path.to_path_buf(), component);
    }

    pub(crate) fn is_provided(&self, path: &Path) -> bool {
        self.provided.contains_key(path)
    }

    /// From now on, a plugin file loads only as [`Host::provide`] gave it.
    pub(crate) fn files_precompiled_only(&mut self) {
        self.files_precompiled_only = true;
    }

    /// Loads a component from bytes under `name` (the name every error uses).
    pub(crate) fn load_bytes(
        &mut self,
        name: &str,
        wasm: &[u8],
        limits: &Limits,
    ) -> Result<usize, PolicyError> {
        self.load_named(
            format!("bytes:{name}"),
            name,
            wasm,
            W::Extra::default(),
            limits,
        )
    }

    fn load_named(
        &mut self,
        source: String,
        name: &str,
        wasm: &[u8],
        extra: W::Extra,
        limits: &Limits,
    ) -> Result<usize, PolicyError> {
        let key = slot_key(&source, limits);
        if let Some(&index) = self.by_source.get(&key) {
            return Ok(index);
        }
        let component = self.compile(name, wasm)?;
        self.add_slot(key, name, component, extra, limits)
    }

    /// The plugin of slot `key`, made from `component` (linked and bound) unless loaded already.
    fn add_slot(
        &mut self,
        key: String,
        name: &str,
        component: Component,
        extra: W::Extra,
        limits: &Limits,
    ) -> Result<usize, PolicyError> {
        if let Some(&index) = self.by_source.get(&key) {
            return Ok(index);
        }
        let (version, pre) = bind::<W>(&self.engine, &self.linker, name, &component)?;
        let index = self.slots.len();
        self.slots.push(Slot {
            name: name.to_string(),
            extra,
            version,
            limits: *limits,
            pre,
            warm: None,
            last_used: 0,
        });
        self.by_source.insert(key, index);
        Ok(index)
    }

    /// The version of the contract plugin `index` implements.
    pub(crate) fn version(&self, index: usize) -> Version {
        self.slots[index].version
    }

    /// The limits plugin `index` runs under.
    pub(crate) fn plugin_limits(&self, index: usize) -> &Limits {
        &self.slots[index].limits
    }

    /// The name errors use for plugin `index`.
    pub(crate) fn name(&self, index: usize) -> &str {
        &self.slots[index].name
    }

    pub(crate) fn extra(&self, index: usize) -> &W::Extra {
        &self.slots[index].extra
    }

    /// Drops the plugin's warm instance: the next call instantiates afresh.
    pub(crate) fn discard(&mut self, index: usize) {
        self.slots[index].warm = None;
    }

    /// Runs `call` on plugin `index`'s warm instance (a fresh one when it has none) under the
    /// deadline, which covers instantiation too. A call that traps or overruns loses its
    /// instance and comes back as the error naming the plugin and the fault. Otherwise the
    /// value comes back with the instance: hand it back with [`Host::keep`] once the answer
    /// is found good; dropping it discards the instance.
    pub(crate) fn call<R>(
        &mut self,
        index: usize,
        call: impl FnOnce(&W::Exports, &mut Store<PluginState>) -> wasmtime::Result<R>,
    ) -> Result<(R, Warm<W>), PolicyError> {
        let slot = &mut self.slots[index];
        let limits = slot.limits;
        let ticks = deadline_ticks(limits.deadline);
        let mut warm = match slot.warm.take() {
            Some(mut warm) => {
                warm.store.data_mut().clock = CallClock::start(limits.deadline);
                warm.store.set_epoch_deadline(ticks);
                warm.store.data().log.begin_call();
                warm
            }
            None => instantiate::<W>(&self.engine, slot, ticks)?,
        };
        let outcome = call(&warm.exports, &mut warm.store);
        let output = warm.store.data().log.end_call();
        match outcome {
            Ok(value) => Ok((value, warm)),
            Err(error) => Err(classify(
                W::KIND,
                &slot.name,
                &limits,
                warm.store.data(),
                &error,
                output,
            )),
        }
    }

    /// Keeps `warm` as plugin `index`'s instance for the next call.
    pub(crate) fn keep(&mut self, index: usize, warm: Warm<W>) {
        self.calls += 1;
        let slot = &mut self.slots[index];
        slot.last_used = self.calls;
        if slot.warm.is_none() {
            // A new warm instance: past the cap, the least recently used other one goes.
            let warm_count = self.slots.iter().filter(|s| s.warm.is_some()).count();
            if warm_count >= MAX_WARM
                && let Some(oldest) = self
                    .slots
                    .iter_mut()
                    .enumerate()
                    .filter(|(i, s)| *i != index && s.warm.is_some())
                    .min_by_key(|(_, s)| s.last_used)
                    .map(|(_, s)| s)
            {
                oldest.warm = None;
            }
        }
        self.slots[index].warm = Some(warm);
    }
}

/// Tells which version of world `W` `component` (named `name` in errors) implements, links it
/// and binds it: what loading a plugin and `orch plugin inspect` both check.
pub(crate) fn bind<W: World>(
    engine: &Engine,
    linker: &Linker<PluginState>,
    name: &str,
    component: &Component,
) -> Result<(Version, W::Pre), PolicyError> {
    let found = match contract::identify(engine, component) {
        Identity::Known(found) if found.world == W::WORLD => found,
        identity => {
            return Err(PolicyError::WrongWorld {
                kind: W::KIND,
                plugin: name.to_string(),
                detail: contract::mismatch(&identity, W::WORLD).unwrap_or_default(),
            });
        }
    };
    let pre = linker
        .instantiate_pre(component)
        .map_err(|e| PolicyError::Load {
            kind: W::KIND,
            plugin: name.to_string(),
            detail: format!(
                "it implements {} but imports what orch does not provide ({e:#}); plugins \
                 get the contract's types and WASI with nothing behind it, and no other import",
                found.id()
            ),
        })?;
    let pre = W::pre(pre, found.version).map_err(|e| PolicyError::WrongWorld {
        kind: W::KIND,
        plugin: name.to_string(),
        detail: format!(
            "it exports {} of {}, but not as the contract has it ({e:#}); rebuild it \
             against the wit/ of that version",
            W::WORLD.exports(found.version),
            found.id()
        ),
    })?;
    Ok((found.version, pre))
}

/// A fresh store and instance for `slot`, under the deadline and the limits.
fn instantiate<W: World>(
    engine: &Engine,
    slot: &Slot<W>,
    ticks: u64,
) -> Result<Warm<W>, PolicyError> {
    let limits = &slot.limits;
    let mut store = Store::new(engine, PluginState::new(&slot.name, limits));
    store.limiter(|state| &mut state.limiter);
    // The deadline is the plugin's running time: at each epoch deadline the clock says whether
    // the call has budget left (a wait for a core does not count).
    store.epoch_deadline_callback(|ctx| Ok(ctx.data().clock.at_deadline()));
    store.set_epoch_deadline(ticks);
    store.data().log.begin_call();
    match W::instantiate(&slot.pre, &mut store) {
        Ok(exports) => Ok(Warm { store, exports }),
        Err(error) => {
            let output = store.data().log.end_call();
            Err(classify(
                W::KIND,
                &slot.name,
                limits,
                store.data(),
                &error,
                output,
            ))
        }
    }
}

/// What stopped the plugin, in the user's words.
fn classify(
    kind: PluginKind,
    plugin: &str,
    limits: &Limits,
    state: &PluginState,
    error: &wasmtime::Error,
    output: Vec<String>,
) -> PolicyError {
    let plugin = plugin.to_string();
    match failure::classify(state, error) {
        CallFailure::MemoryLimit => PolicyError::MemoryLimit {
            kind,
            plugin,
            limit: limits.memory_bytes,
        },
        CallFailure::Denied(what) => PolicyError::Denied { kind, plugin, what },
        CallFailure::Timeout => PolicyError::Timeout {
            kind,
            plugin,
            deadline: limits.deadline,
        },
        CallFailure::Crashed(trap) => PolicyError::Crashed {
            kind,
            plugin,
            trap,
            output,
        },
    }
}

/// Rejects what is not a component before compiling: another file, or a core module.
pub(crate) fn check_component_header(
    kind: PluginKind,
    name: &str,
    wasm: &[u8],
) -> Result<(), PolicyError> {
    let not = |detail: &str| PolicyError::NotComponent {
        kind,
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

/// One slot per plugin and limits: jobs that give one plugin other limits get instances of their
/// own, while the compiled component is shared.
fn slot_key(source: &str, limits: &Limits) -> String {
    format!(
        "{source}#{}ms#{}b",
        limits.deadline.as_millis(),
        limits.memory_bytes
    )
}

/// A plugin file's name, as errors show it (`my_policy.wasm`).
fn plugin_name(path: &Path) -> String {
    path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    )
}
