//! The policy host: loads policy components (built-in or from a file), keeps one warm instance
//! per plugin, asks for decisions under the limits, and validates every answer.

use crate::builtin::builtin;
use crate::contract::WorldKind;
use crate::error::{PluginError, PluginKind};
use crate::limits::Limits;
use crate::runtime::{Host, World};
use crate::sandbox::PluginState;
use crate::types::{Decision, Device, Lease, Refusal, Request, Topology};
use crate::validate::{check_decision, clean_text};
pub use orch_core::PluginRef;
use orch_wit::{Policy, PolicyPre, Version, v0_1, v0_2, v0_3, v0_4};
use std::path::PathBuf;
use wasmtime::component::{Component, InstancePre, Linker};
use wasmtime::{Engine, Store};

/// A loaded plugin, as [`PolicyHost::load`] returns it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PluginId(usize);

/// Runs policy plugins. One per process is the intent: it owns the engine, the epoch ticker,
/// the compiled components and a warm instance of each loaded plugin.
pub struct PolicyHost {
    host: Host<PolicyWorld>,
}

impl std::fmt::Debug for PolicyHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.host.debug(f, "PolicyHost")
    }
}

/// The `policy` world; each plugin keeps the `[policy.config]` defaults of its built-in.
pub(crate) struct PolicyWorld;

/// A policy's bindings, by the version of the contract it implements.
pub(crate) enum AnyPolicyPre {
    V0_1(v0_1::policy::PolicyPre<PluginState>),
    V0_2(v0_2::policy::PolicyPre<PluginState>),
    V0_3(v0_3::policy::PolicyPre<PluginState>),
    V0_4(v0_4::policy::PolicyPre<PluginState>),
    V0_5(PolicyPre<PluginState>),
}

/// A policy instance's exports, by version.
pub(crate) enum AnyPolicy {
    V0_1(v0_1::policy::Policy),
    V0_2(v0_2::policy::Policy),
    V0_3(v0_3::policy::Policy),
    V0_4(v0_4::policy::Policy),
    V0_5(Policy),
}

impl AnyPolicy {
    /// `placement.select-devices` (0.2.0 and later) or `select` (0.1.0): the same call, with
    /// the topology for plugins of 0.4.0 and later (its slices from 0.5.0).
    fn select(
        &self,
        store: &mut Store<PluginState>,
        request: &Request,
        candidates: &[Device],
        leases: &[Lease],
        topology: &Topology,
    ) -> wasmtime::Result<Result<Decision, Refusal>> {
        match self {
            AnyPolicy::V0_1(policy) => policy.call_select(store, request, candidates, leases),
            AnyPolicy::V0_2(policy) => policy
                .orch_plugin_placement()
                .call_select_devices(store, request, candidates, leases),
            AnyPolicy::V0_3(policy) => policy
                .orch_plugin_placement()
                .call_select_devices(store, request, candidates, leases),
            AnyPolicy::V0_4(policy) => {
                crate::compat::select_0_4(policy, store, request, candidates, leases, topology)
            }
            AnyPolicy::V0_5(policy) => policy
                .orch_plugin_placement()
                .call_select_devices(store, request, candidates, leases, topology),
        }
    }
}

impl World for PolicyWorld {
    const KIND: PluginKind = PluginKind::Placement;
    const WORLD: WorldKind = WorldKind::Policy;
    type State = PluginState;
    type Pre = AnyPolicyPre;
    type Exports = AnyPolicy;
    type Extra = &'static [(&'static str, &'static str)];

    fn builtin(name: &str) -> Option<(&'static [u8], Self::Extra)> {
        builtin(name).map(|b| (b.wasm, b.default_config))
    }

    fn pre(pre: InstancePre<PluginState>, version: Version) -> wasmtime::Result<AnyPolicyPre> {
        Ok(match version {
            Version::V0_1 => AnyPolicyPre::V0_1(v0_1::policy::PolicyPre::new(pre)?),
            Version::V0_2 => AnyPolicyPre::V0_2(v0_2::policy::PolicyPre::new(pre)?),
            Version::V0_3 => AnyPolicyPre::V0_3(v0_3::policy::PolicyPre::new(pre)?),
            Version::V0_4 => AnyPolicyPre::V0_4(v0_4::policy::PolicyPre::new(pre)?),
            Version::V0_5 => AnyPolicyPre::V0_5(PolicyPre::new(pre)?),
        })
    }

    fn instantiate(
        pre: &AnyPolicyPre,
        store: &mut Store<PluginState>,
    ) -> wasmtime::Result<AnyPolicy> {
        Ok(match pre {
            AnyPolicyPre::V0_1(pre) => AnyPolicy::V0_1(pre.instantiate(store)?),
            AnyPolicyPre::V0_2(pre) => AnyPolicy::V0_2(pre.instantiate(store)?),
            AnyPolicyPre::V0_3(pre) => AnyPolicy::V0_3(pre.instantiate(store)?),
            AnyPolicyPre::V0_4(pre) => AnyPolicy::V0_4(pre.instantiate(store)?),
            AnyPolicyPre::V0_5(pre) => AnyPolicy::V0_5(pre.instantiate(store)?),
        })
    }
}

impl PolicyHost {
    /// A host with `limits`, caching compiled components under [`default_cache_dir`].
    ///
    /// [`default_cache_dir`]: crate::default_cache_dir
    pub fn new(limits: Limits) -> Result<PolicyHost, PluginError> {
        PolicyHost::with_cache_dir(limits, crate::default_cache_dir())
    }

    /// A host caching compiled components under `cache_dir` (`None`: in memory only).
    pub fn with_cache_dir(
        limits: Limits,
        cache_dir: Option<PathBuf>,
    ) -> Result<PolicyHost, PluginError> {
        let host = Host::new(limits, cache_dir)?;
        Ok(PolicyHost { host })
    }

    pub fn limits(&self) -> &Limits {
        self.host.limits()
    }

    pub(crate) fn engine(&self) -> &Engine {
        self.host.engine()
    }

    pub(crate) fn linker(&self) -> &Linker<PluginState> {
        self.host.linker()
    }

    pub(crate) fn compile(&mut self, name: &str, wasm: &[u8]) -> Result<Component, PluginError> {
        self.host.compile(name, wasm)
    }

    /// A loader of compiled components for this host's engine, for another thread.
    pub fn loader(&self) -> crate::ComponentLoader {
        crate::ComponentLoader::new(self.host.engine())
    }

    /// Makes `component` what the plugin file `path` loads as: the host neither reads nor
    /// compiles that file.
    pub fn provide(&mut self, path: &std::path::Path, component: &crate::CompiledComponent) {
        self.host.provide(path, component.component.clone());
    }

    /// Whether [`PolicyHost::provide`] gave plugin file `path` its component.
    pub fn is_provided(&self, path: &std::path::Path) -> bool {
        self.host.is_provided(path)
    }

    /// From now on, a plugin file loads only as [`PolicyHost::provide`] gave it; any other is
    /// refused, never compiled here (the daemon's scheduling thread).
    pub fn files_precompiled_only(&mut self) {
        self.host.files_precompiled_only();
    }

    /// Loads a built-in by name or a component from a file, under the host's limits (once;
    /// later calls return the same plugin).
    pub fn load(&mut self, plugin: &PluginRef) -> Result<PluginId, PluginError> {
        let limits = *self.host.limits();
        self.load_with_limits(plugin, &limits)
    }

    /// Loads a plugin to run under `limits` (a job's `[policy] deadline` and `memory`): a
    /// plugin loaded with other limits is another instance of the same compiled component.
    pub fn load_with_limits(
        &mut self,
        plugin: &PluginRef,
        limits: &Limits,
    ) -> Result<PluginId, PluginError> {
        self.host.load(plugin, limits).map(PluginId)
    }

    /// Loads a component from bytes under `name` (the name every error uses).
    pub fn load_bytes(&mut self, name: &str, wasm: &[u8]) -> Result<PluginId, PluginError> {
        let limits = *self.host.limits();
        self.host.load_bytes(name, wasm, &limits).map(PluginId)
    }

    /// The version of the contract the plugin implements.
    pub fn version(&self, id: PluginId) -> Version {
        self.host.version(id.0)
    }

    /// The limits the plugin runs under.
    pub fn plugin_limits(&self, id: PluginId) -> &Limits {
        self.host.plugin_limits(id.0)
    }

    /// The name errors use for the plugin.
    pub fn name(&self, id: PluginId) -> &str {
        self.host.name(id.0)
    }

    /// `[policy.config]` keys the host fills in for this plugin when a job leaves them out.
    pub fn default_config(&self, id: PluginId) -> &'static [(&'static str, &'static str)] {
        self.host.extra(id.0)
    }

    /// Drops the plugin's warm instance: the next decision instantiates afresh.
    pub fn discard_instance(&mut self, id: PluginId) {
        self.host.discard(id.0);
    }

    /// Asks plugin `id` to choose among `candidates` (with the `leases` on them) for
    /// `request`, within the limits, and checks the answer; the candidates' topology is
    /// unknown ([`PolicyHost::decide_on`] gives it). A plugin that traps, overruns or answers
    /// wrongly loses its instance.
    pub fn decide(
        &mut self,
        id: PluginId,
        request: &Request,
        candidates: &[Device],
        leases: &[Lease],
    ) -> Result<Decision, PluginError> {
        let unknown = Topology {
            numa_nodes: Vec::new(),
            links: Vec::new(),
            slices: Vec::new(),
        };
        self.decide_on(id, request, candidates, leases, &unknown)
    }

    /// [`PolicyHost::decide`] with the candidates' `topology` (NUMA nodes in candidate order,
    /// links by logical index, which candidates are MIG slices), which plugins of contract 0.4.0
    /// and later see (the slices from 0.5.0).
    pub fn decide_on(
        &mut self,
        id: PluginId,
        request: &Request,
        candidates: &[Device],
        leases: &[Lease],
        topology: &Topology,
    ) -> Result<Decision, PluginError> {
        let (answer, warm) = self.host.call(id.0, |policy, store| {
            policy.select(store, request, candidates, leases, topology)
        })?;
        let plugin = || self.host.name(id.0).to_string();
        let result = match answer {
            Err(Refusal::NoFit(message)) => Err(PluginError::NoFit {
                plugin: plugin(),
                message: clean_text(&message),
            }),
            Err(Refusal::BadConfig(message)) => Err(PluginError::BadConfig {
                plugin: plugin(),
                message: clean_text(&message),
            }),
            Ok(decision) => {
                check_decision(request, candidates, leases, &decision).map_err(|problem| {
                    PluginError::WrongAnswer {
                        kind: PluginKind::Placement,
                        plugin: plugin(),
                        problem,
                    }
                })?;
                Ok(Decision {
                    reason: clean_text(&decision.reason),
                    devices: decision.devices,
                })
            }
        };
        // A refusal or a good decision keeps the instance; a wrong answer returned above.
        self.host.keep(id.0, warm);
        result
    }
}
