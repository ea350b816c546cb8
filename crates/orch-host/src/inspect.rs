//! `orch plugin inspect`: which world a component implements, what it imports and exports.

use crate::contract::{self, Identity, WorldKind};
use crate::error::{PluginError, PluginKind};
use crate::policy::PolicyHost;
use crate::policy::PolicyWorld;
use crate::queue::QueueWorld;
use crate::runtime::bind;
use orch_wit::Version;
use wasmtime::component::types::{ComponentExtern, ComponentItem};

/// What a plugin component is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inspection {
    /// `orch:plugin/policy@0.5.0`, `orch:plugin/queue@0.1.0`, `orch:plugin/trainer@0.3.0`…
    pub world: String,
    /// The version of the contract it implements.
    pub version: Version,
    /// `func NAME` / `instance NAME` lines.
    pub imports: Vec<String>,
    pub exports: Vec<String>,
    pub size_bytes: usize,
}

impl Inspection {
    /// A sentence for a plugin built for an older contract than `wit/`'s: orch loads it, and
    /// what rebuilding it changes; `None` for a plugin of the current contract.
    pub fn version_note(&self) -> Option<String> {
        (self.version < Version::CURRENT).then(|| {
            format!(
                "built for contract {}, an older version than this orch's {}: orch still loads and runs it; rebuild it against wit/ to move to {}",
                self.version,
                Version::CURRENT,
                Version::CURRENT
            )
        })
    }
}

/// Inspects `wasm` (named `name` in errors): it must be a component of the policy or the queue
/// world (of a version orch loads) whose imports orch provides, or a trainer; anything else is
/// an error saying what it is instead and what orch expected.
pub fn inspect(host: &mut PolicyHost, name: &str, wasm: &[u8]) -> Result<Inspection, PluginError> {
    let component = host.compile(name, wasm)?;
    let engine = host.engine().clone();
    let ty = component.component_type();
    let imports = describe(ty.imports(&engine));
    let exports = describe(ty.exports(&engine));
    let found = match contract::identify(&engine, &component) {
        Identity::Known(found) => found,
        identity => {
            return Err(PluginError::WrongWorld {
                kind: PluginKind::Placement,
                plugin: name.to_string(),
                detail: format!(
                    "{}; a queue policy implements orch:plugin/queue, a trainer orch:plugin/trainer",
                    contract::mismatch(&identity, WorldKind::Policy).unwrap_or_default()
                ),
            });
        }
    };
    // A trainer's imports are checked by the trainer host when a job loads it (this host links
    // the policy and queue worlds only).
    match found.world {
        WorldKind::Policy => drop(bind::<PolicyWorld>(
            host.engine(),
            host.linker(),
            name,
            &component,
        )?),
        WorldKind::Queue => drop(bind::<QueueWorld>(
            host.engine(),
            host.linker(),
            name,
            &component,
        )?),
        WorldKind::Trainer => {}
    }
    Ok(Inspection {
        world: found.id(),
        version: found.version,
        imports,
        exports,
        size_bytes: wasm.len(),
    })
}

/// Items as `kind name` lines.
fn describe<'a>(items: impl Iterator<Item = (&'a str, ComponentExtern<'a>)>) -> Vec<String> {
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
