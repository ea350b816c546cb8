//! Components compiled somewhere else than where they run: one process compiles a component to
//! wasmtime's serialized form ([`Precompiler`]), another thread loads that file
//! ([`ComponentLoader`]), and the policy host takes the result ready ([`PolicyHost::provide`]).
//!
//! Design decision: the daemon compiles the components tenants send in a child process under
//! caps of its own, never on the thread that schedules (a 12 MB JavaScript policy takes seconds
//! to compile). Both sides make their engine with [`new_engine`] and the same limits, so the
//! artifact's settings match and wasmtime accepts it; a file it refuses (another orch made it,
//! say) is compiled again.
//!
//! [`PolicyHost::provide`]: crate::PolicyHost::provide

use crate::engine::new_engine;
use crate::error::{PluginError, PluginKind};
use crate::limits::Limits;
use std::hash::{Hash, Hasher};
use std::path::Path;
use wasmtime::Engine;
use wasmtime::component::Component;

/// Compiles components to wasmtime's serialized form with the engine a [`PolicyHost`] made with
/// the same limits uses.
///
/// [`PolicyHost`]: crate::PolicyHost
#[derive(Clone)]
pub struct Precompiler {
    engine: Engine,
}

impl std::fmt::Debug for Precompiler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Precompiler").finish_non_exhaustive()
    }
}

impl Precompiler {
    pub fn new(limits: &Limits) -> Result<Precompiler, PluginError> {
        let engine = new_engine(limits).map_err(|e| PluginError::Engine(e.to_string()))?;
        Ok(Precompiler { engine })
    }

    /// `wasm` (named `name` in errors) compiled, as the bytes [`ComponentLoader::load`] reads.
    pub fn compile(&self, name: &str, wasm: &[u8]) -> Result<Vec<u8>, PluginError> {
        crate::runtime::check_component_header(PluginKind::Placement, name, wasm)?;
        let not = |detail: String| PluginError::NotComponent {
            kind: PluginKind::Placement,
            plugin: name.to_string(),
            detail,
        };
        let component = Component::new(&self.engine, wasm)
            .map_err(|e| not(format!("it does not validate: {e}")))?;
        component
            .serialize()
            .map_err(|e| PluginError::Engine(format!("cannot serialize `{name}`: {e}")))
    }
}

/// Loads compiled components for one host's engine, on any thread.
#[derive(Clone)]
pub struct ComponentLoader {
    engine: Engine,
    key: String,
}

impl std::fmt::Debug for ComponentLoader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ComponentLoader")
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

/// A component compiled and loaded, ready for [`PolicyHost::provide`].
///
/// [`PolicyHost::provide`]: crate::PolicyHost::provide
#[derive(Clone)]
pub struct CompiledComponent {
    pub(crate) component: Component,
}

impl std::fmt::Debug for CompiledComponent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompiledComponent").finish_non_exhaustive()
    }
}

impl ComponentLoader {
    pub(crate) fn new(engine: &Engine) -> ComponentLoader {
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        engine.precompile_compatibility_hash().hash(&mut hasher);
        ComponentLoader {
            engine: engine.clone(),
            key: format!("{:016x}", hasher.finish()),
        }
    }

    /// 16 hex digits that change with everything that makes compiled code of one engine unfit
    /// for another (wasmtime's version, its settings): a name for artifacts to carry.
    pub fn compatibility_key(&self) -> &str {
        &self.key
    }

    /// The component serialized in `file` (as [`Precompiler::compile`] wrote it). The file is
    /// mapped, not copied: it must not change while the component lives (write it once, then
    /// rename it into place).
    pub fn load(&self, file: &Path) -> Result<CompiledComponent, String> {
        // SAFETY: `deserialize_file` runs the file's bytes as machine code. The file is what
        // this orch's own compile process wrote, from a component it validated, into a folder
        // only the daemon's user writes, and it is never rewritten (written aside, renamed into
        // place); wasmtime checks its header, version and settings against this engine.
        unsafe { Component::deserialize_file(&self.engine, file) }
            .map(|component| CompiledComponent { component })
            .map_err(|e| format!("cannot load {}: {e:#}", file.display()))
    }
}
