//! `orch plugin inspect`: which world a component implements, what it imports and exports.

use crate::error::PolicyError;
use crate::policy::{PolicyHost, check_component_header, describe, export_names};
use orch_wit::PolicyPre;

/// What a trainer component exports.
const TRAINER_EXPORTS: [&str; 3] = ["init", "train-step", "eval-step"];

/// What a plugin component is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inspection {
    /// `orch:plugin/policy@0.1.0` or `orch:plugin/trainer@0.1.0`.
    pub world: &'static str,
    /// `func NAME` / `instance NAME` lines.
    pub imports: Vec<String>,
    pub exports: Vec<String>,
    pub size_bytes: usize,
}

/// Inspects `wasm` (named `name` in errors): it must be a component of the policy world whose
/// imports orch provides, or a trainer; anything else is an error saying what it is instead.
pub fn inspect(host: &mut PolicyHost, name: &str, wasm: &[u8]) -> Result<Inspection, PolicyError> {
    check_component_header(name, wasm)?;
    let component = host
        .component(wasm)
        .map_err(|e| PolicyError::NotComponent {
            plugin: name.to_string(),
            detail: format!("it does not validate: {e}"),
        })?;
    let engine = host.engine().clone();
    let ty = component.component_type();
    let imports = describe(ty.imports(&engine));
    let exports = describe(ty.exports(&engine));
    let names = export_names(&engine, &component);
    // A trainer is told by its exports; its imports are checked by the trainer host when a job
    // loads it (this host links the policy world only).
    if TRAINER_EXPORTS.iter().all(|t| names.iter().any(|e| e == t)) {
        return Ok(Inspection {
            world: orch_wit::TRAINER_WORLD,
            imports,
            exports,
            size_bytes: wasm.len(),
        });
    }
    if !names.iter().any(|e| e == "select") {
        return Err(PolicyError::WrongWorld {
            plugin: name.to_string(),
            detail: format!(
                "it exports {}, and a policy exports `select`",
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
        .instantiate_pre(&component)
        .map_err(|e| PolicyError::Load {
            plugin: name.to_string(),
            detail: format!("{e:#}"),
        })?;
    PolicyPre::new(pre).map_err(|e| PolicyError::WrongWorld {
        plugin: name.to_string(),
        detail: format!("its `select` does not match the contract ({e:#})"),
    })?;
    Ok(Inspection {
        world: orch_wit::POLICY_WORLD,
        imports,
        exports,
        size_bytes: wasm.len(),
    })
}
