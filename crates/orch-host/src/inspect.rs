//! `orch plugin inspect`: which world a component implements, what it imports and exports.

use crate::error::{PluginKind, PolicyError};
use crate::policy::PolicyHost;
use crate::runtime::export_names;
use orch_wit::{PolicyPre, QueuePre};
use wasmtime::component::Component;
use wasmtime::component::types::{ComponentExtern, ComponentItem};

/// What a trainer component exports.
const TRAINER_EXPORTS: [&str; 3] = ["init", "train-step", "eval-step"];

/// What a plugin component is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inspection {
    /// `orch:plugin/policy@0.1.0`, `orch:plugin/queue@0.1.0` or `orch:plugin/trainer@0.1.0`.
    pub world: &'static str,
    /// `func NAME` / `instance NAME` lines.
    pub imports: Vec<String>,
    pub exports: Vec<String>,
    pub size_bytes: usize,
}

/// Inspects `wasm` (named `name` in errors): it must be a component of the policy or the queue
/// world whose imports orch provides, or a trainer; anything else is an error saying what it is
/// instead.
pub fn inspect(host: &mut PolicyHost, name: &str, wasm: &[u8]) -> Result<Inspection, PolicyError> {
    let component = host.compile(name, wasm)?;
    let engine = host.engine().clone();
    let ty = component.component_type();
    let imports = describe(ty.imports(&engine));
    let exports = describe(ty.exports(&engine));
    let names = export_names(&engine, &component);
    // A trainer is told by its exports; its imports are checked by the trainer host when a job
    // loads it (this host links the policy and queue worlds only).
    let world = if TRAINER_EXPORTS.iter().all(|t| names.iter().any(|e| e == t)) {
        orch_wit::TRAINER_WORLD
    } else {
        policy_world(host, name, &component, &names, &exports)?
    };
    Ok(Inspection {
        world,
        imports,
        exports,
        size_bytes: wasm.len(),
    })
}

/// The world of a component that exports `select` (a placement policy) or `order` (a queue
/// policy), once its imports and exports are found to match it.
fn policy_world(
    host: &PolicyHost,
    name: &str,
    component: &Component,
    names: &[String],
    exports: &[String],
) -> Result<&'static str, PolicyError> {
    let exported = |kind: PluginKind| names.iter().any(|e| e == kind.export());
    let kind = if exported(PluginKind::Queue) && !exported(PluginKind::Placement) {
        PluginKind::Queue
    } else {
        PluginKind::Placement
    };
    if !exported(kind) {
        return Err(PolicyError::WrongWorld {
            kind,
            plugin: name.to_string(),
            detail: format!(
                "it exports {}, and a policy exports `select` (a queue policy `order`)",
                if exports.is_empty() {
                    "nothing".to_string()
                } else {
                    exports.join(", ")
                }
            ),
        });
    }
    let pre = host
        .linker()
        .instantiate_pre(component)
        .map_err(|e| PolicyError::Load {
            kind,
            plugin: name.to_string(),
            detail: format!("{e:#}"),
        })?;
    let typed = match kind {
        PluginKind::Placement => PolicyPre::new(pre).map(drop),
        PluginKind::Queue => QueuePre::new(pre).map(drop),
    };
    typed.map_err(|e| PolicyError::WrongWorld {
        kind,
        plugin: name.to_string(),
        detail: format!(
            "its `{}` does not match the contract ({e:#})",
            kind.export()
        ),
    })?;
    Ok(kind.world())
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
