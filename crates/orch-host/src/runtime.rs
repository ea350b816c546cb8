//! What every plugin host shares, whatever the world ([`Host`]): the engine, its epoch ticker,
//! the deny-all WASI linker and the compile cache, the limits, the built-in table; loading a
//! component (built in, from a file or from bytes) and checking it is of the right world; one
//! warm instance per plugin, called under the limits, and thrown away when it fails.
//!
//! Design decision: one runtime, one [`World`] per capability, as Spin hosts one factor per
//! capability on one runtime. A world says what its store holds ([`World::State`]: the sandbox,
//! and for the trainer the job's tensors), what it adds to the linker beyond WASI
//! ([`World::add_imports`]), how its bindings are made and which built-ins it has; the rest is
//! this file's. The policy host ([`crate::PolicyHost`]) and the queue host
//! ([`crate::QueueHost`]) differ only in the world and in how they check an answer; the trainer
//! host (crates/orch-trainer) is the third world: it loads its trainer here and makes one store
//! per replica itself, driving the calls on its replicas' threads.

use crate::cache::ComponentCache;
use crate::contract::{self, Identity, WorldKind};
use crate::engine::{CallClock, Ticker, deadline_ticks, new_engine};
use crate::error::{PluginError, PluginKind};
use crate::failure::{self, CallFailure};
use crate::limits::Limits;
use crate::sandbox::{HasPluginState, PluginState, add_wasi};
use orch_core::PluginRef;
use orch_wit::Version;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use wasmtime::component::{Component, InstancePre, Linker};
use wasmtime::{Engine, Store};

/// A host of plugins of world `W`: the engine, its ticker, the linker, the limits and the
/// compile cache, and the loaded plugins, each compiled, linked and with at most one warm
/// instance.
pub struct Host<W: World> {
    engine: Engine,
    linker: Linker<W::State>,
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
    /// `None` on a host whose world drives its calls itself ([`Host::without_ticker`]).
    _ticker: Option<Ticker>,
}

/// A world of `orch:plugin`, as its bindings (in orch-wit) present it to a host.
pub trait World {
    const KIND: PluginKind;
    const WORLD: WorldKind;
    /// A store's data: the sandbox ([`PluginState`]) and whatever the world's imports work on.
    type State: HasPluginState;
    /// The world's bindings, ready to instantiate (`PolicyPre`, `QueuePre`, `TrainerPre`).
    type Pre;
    /// An instance's exports (`Policy`, `Queue`, `Trainer`).
    type Exports;
    /// What the host keeps beside each plugin (a built-in's defaults); `Default` for a plugin
    /// that is not built in.
    type Extra: Default;
    /// The built-in called `name` (from the one table, `builtin.rs`), and what the host keeps
    /// beside it.
    fn builtin(name: &str) -> Option<(&'static [u8], Self::Extra)>;
    /// Adds what the world's plugins import beyond deny-all WASI (nothing but types for a
    /// policy or a queue policy; tensors for a trainer).
    fn add_imports(linker: &mut Linker<Self::State>) -> wasmtime::Result<()> {
        let _ = linker;
        Ok(())
    }
    /// The name errors use for the plugin in file `path` (`my_policy.wasm`).
    fn file_plugin_name(path: &Path) -> String {
        path.file_name().map_or_else(
            || path.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        )
    }
    /// The bindings of `version` of the world over `pre`.
    fn pre(pre: InstancePre<Self::State>, version: Version) -> wasmtime::Result<Self::Pre>;
    fn instantiate(
        pre: &Self::Pre,
        store: &mut Store<Self::State>,
    ) -> wasmtime::Result<Self::Exports>;
}

struct Slot<W: World> {
    name: String,
    extra: W::Extra,
    /// The SHA-256 of the component's bytes (`None`: compiled elsewhere, [`Host::provide`]).
    sha256: Option<[u8; 32]>,
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
pub struct Warm<W: World> {
    store: Store<W::State>,
    exports: W::Exports,
}

impl<W: World> std::fmt::Debug for Host<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.debug(f, "Host")
    }
}

impl<W: World> std::fmt::Debug for Warm<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Warm").finish_non_exhaustive()
    }
}

impl<W: World> Host<W> {
    /// An engine for `limits`, its ticker started, caching compiled components under
    /// `cache_dir` (`None`: in memory only); no plugin loaded yet.
    pub fn new(limits: Limits, cache_dir: Option<PathBuf>) -> Result<Host<W>, PluginError> {
        let mut host = Host::without_ticker(limits, cache_dir)?;
        host._ticker = Some(host.start_ticker()?);
        Ok(host)
    }

    /// [`Host::new`] without the ticker: for a world that calls its plugins itself, which
    /// holds a [`Host::start_ticker`] while its calls run (a trainer's, from the start of the
    /// run, not while the job waits for its devices).
    pub fn without_ticker(
        limits: Limits,
        cache_dir: Option<PathBuf>,
    ) -> Result<Host<W>, PluginError> {
        let engine_error = |e: wasmtime::Error| PluginError::Engine(e.to_string());
        let engine = new_engine(&limits).map_err(engine_error)?;
        let mut linker = Linker::new(&engine);
        add_wasi(&mut linker).map_err(engine_error)?;
        W::add_imports(&mut linker).map_err(engine_error)?;
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
            _ticker: None,
        })
    }

    /// A ticker that makes this host's deadlines work until it is dropped. One at a time: two
    /// would halve every deadline.
    pub fn start_ticker(&self) -> Result<Ticker, PluginError> {
        Ticker::start(&self.engine)
            .map_err(|e| PluginError::Engine(format!("cannot start the epoch ticker: {e}")))
    }

    /// `Debug` for the public host that wraps this one, called `name`.
    pub fn debug(&self, f: &mut std::fmt::Formatter<'_>, name: &str) -> std::fmt::Result {
        let plugins: Vec<&str> = self.slots.iter().map(|s| s.name.as_str()).collect();
        f.debug_struct(name)
            .field("limits", &self.limits)
            .field("plugins", &plugins)
            .finish_non_exhaustive()
    }

    /// The limits plugins get unless loaded with their own.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    pub fn linker(&self) -> &Linker<W::State> {
        &self.linker
    }

    /// `wasm` compiled (or found compiled), after checking it is a component at all.
    pub fn compile(&mut self, name: &str, wasm: &[u8]) -> Result<Component, PluginError> {
        self.compile_digested(name, wasm)
            .map(|(component, _)| component)
    }

    /// [`Host::compile`], with the SHA-256 of `wasm` (the cache's key).
    fn compile_digested(
        &mut self,
        name: &str,
        wasm: &[u8],
    ) -> Result<(Component, [u8; 32]), PluginError> {
        check_component_header(W::KIND, name, wasm)?;
        self.cache
            .get_digested(&self.engine, name, wasm)
            .map_err(|e| PluginError::NotComponent {
                kind: W::KIND,
                plugin: name.to_string(),
                detail: format!("it does not validate: {e}"),
            })
    }

    /// Loads a built-in by name (the world's, [`World::builtin`]) or a component from a file,
    /// once per plugin and limits: later calls return the same plugin.
    pub fn load(&mut self, plugin: &PluginRef, limits: &Limits) -> Result<usize, PluginError> {
        match plugin {
            PluginRef::Builtin(name) => {
                let (wasm, extra) =
                    W::builtin(name).ok_or_else(|| PluginError::UnknownBuiltin {
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
                        &W::file_plugin_name(path),
                        (component, None),
                        W::Extra::default(),
                        limits,
                    );
                }
                if self.files_precompiled_only {
                    return Err(PluginError::Load {
                        kind: W::KIND,
                        plugin: W::file_plugin_name(path),
                        detail: "it has not been compiled yet, and this host compiles no plugin file itself".into(),
                    });
                }
                let wasm = std::fs::read(path).map_err(|source| PluginError::Read {
                    kind: W::KIND,
                    path: path.clone(),
                    source,
                })?;
                self.load_named(
                    source,
                    &W::file_plugin_name(path),
                    &wasm,
                    W::Extra::default(),
                    limits,
                )
            }
        }
    }

    /// Makes `component` what plugin file `path` loads as: nothing is read or compiled for it.
    pub fn provide(&mut self, path: &Path, component: Component) {
        self.provided.insert(path.to_path_buf(), component);
    }

    pub fn is_provided(&self, path: &Path) -> bool {
        self.provided.contains_key(path)
    }

    /// From now on, a plugin file loads only as [`Host::provide`] gave it.
    pub fn files_precompiled_only(&mut self) {
        self.files_precompiled_only = true;
    }

    /// Loads a component from bytes under `name` (the name every error uses).
    pub fn load_bytes(
        &mut self,
        name: &str,
        wasm: &[u8],
        limits: &Limits,
    ) -> Result<usize, PluginError> {
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
    ) -> Result<usize, PluginError> {
        let key = slot_key(&source, limits);
        if let Some(&index) = self.by_source.get(&key) {
            return Ok(index);
        }
        let (component, sha256) = self.compile_digested(name, wasm)?;
        self.add_slot(key, name, (component, Some(sha256)), extra, limits)
    }

    /// The plugin of slot `key`, made from `component` (linked and bound) unless loaded already.
    fn add_slot(
        &mut self,
        key: String,
        name: &str,
        (component, sha256): (Component, Option<[u8; 32]>),
        extra: W::Extra,
        limits: &Limits,
    ) -> Result<usize, PluginError> {
        if let Some(&index) = self.by_source.get(&key) {
            return Ok(index);
        }
        let (version, pre) = bind::<W>(&self.engine, &self.linker, name, &component)?;
        let index = self.slots.len();
        self.slots.push(Slot {
            name: name.to_string(),
            extra,
            sha256,
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
    pub fn version(&self, index: usize) -> Version {
        self.slots[index].version
    }

    /// The limits plugin `index` runs under.
    pub fn plugin_limits(&self, index: usize) -> &Limits {
        &self.slots[index].limits
    }

    /// The name errors use for plugin `index`.
    pub fn name(&self, index: usize) -> &str {
        &self.slots[index].name
    }

    pub fn extra(&self, index: usize) -> &W::Extra {
        &self.slots[index].extra
    }

    /// Plugin `index`'s bindings, for a world that makes its stores itself (a trainer's
    /// replicas, each on its own thread).
    pub fn pre(&self, index: usize) -> &W::Pre {
        &self.slots[index].pre
    }

    /// The SHA-256 of plugin `index`'s component, in lowercase hex (`None`: compiled elsewhere
    /// and given to this host, [`Host::provide`]).
    pub fn sha256(&self, index: usize) -> Option<String> {
        self.slots[index]
            .sha256
            .map(|digest| digest.iter().map(|b| format!("{b:02x}")).collect())
    }
}

/// Warm instances, for the worlds whose store is the sandbox alone (the policy and the queue
/// worlds): the host makes the store, calls, and keeps the instance that answered well.
impl<W: World<State = PluginState>> Host<W> {
    /// Drops the plugin's warm instance: the next call instantiates afresh.
    pub fn discard(&mut self, index: usize) {
        self.slots[index].warm = None;
    }

    /// Runs `call` on plugin `index`'s warm instance (a fresh one when it has none) under the
    /// deadline, which covers instantiation too. A call that traps or overruns loses its
    /// instance and comes back as the error naming the plugin and the fault. Otherwise the
    /// value comes back with the instance: hand it back with [`Host::keep`] once the answer
    /// is found good; dropping it discards the instance.
    pub fn call<R>(
        &mut self,
        index: usize,
        call: impl FnOnce(&W::Exports, &mut Store<PluginState>) -> wasmtime::Result<R>,
    ) -> Result<(R, Warm<W>), PluginError> {
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
    pub fn keep(&mut self, index: usize, warm: Warm<W>) {
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
    linker: &Linker<W::State>,
    name: &str,
    component: &Component,
) -> Result<(Version, W::Pre), PluginError> {
    let found = match contract::identify(engine, component) {
        Identity::Known(found) if found.world == W::WORLD => found,
        identity => {
            return Err(PluginError::WrongWorld {
                kind: W::KIND,
                plugin: name.to_string(),
                detail: contract::mismatch(&identity, W::WORLD).unwrap_or_default(),
            });
        }
    };
    let pre = linker
        .instantiate_pre(component)
        .map_err(|e| PluginError::foreign_import(W::KIND, name, &found.id(), &format!("{e:#}")))?;
    let pre = W::pre(pre, found.version).map_err(|e| PluginError::WrongWorld {
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
fn instantiate<W: World<State = PluginState>>(
    engine: &Engine,
    slot: &Slot<W>,
    ticks: u64,
) -> Result<Warm<W>, PluginError> {
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
) -> PluginError {
    let plugin = plugin.to_string();
    match failure::classify(state, error) {
        CallFailure::MemoryLimit => PluginError::MemoryLimit {
            kind,
            plugin,
            limit: limits.memory_bytes,
        },
        CallFailure::Denied(what) => PluginError::Denied { kind, plugin, what },
        CallFailure::Timeout => PluginError::Timeout {
            kind,
            plugin,
            deadline: limits.deadline,
        },
        CallFailure::Crashed(trap) => PluginError::Crashed {
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
) -> Result<(), PluginError> {
    let not = |detail: &str| PluginError::NotComponent {
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
