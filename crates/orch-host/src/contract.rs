//! Which world, and which version of the contract, a component implements, told by what it
//! exports: a plugin of 0.2.0 or later exports one instance (`orch:plugin/placement@0.5.0`,
//! `…/queue-order@0.5.0`, `…/training@0.5.0`), a 0.1.0 plugin bare functions (`select`, `order`,
//! `init` with `train-step` and `eval-step`).
//!
//! Design decision: the exports decide, not the imports: a policy imports nothing of orch's but
//! types (which a toolchain may even leave out), and a component's exports are what the host will
//! call. Every refusal is one sentence that says what was found and what orch loads.

use orch_wit::Version;
use wasmtime::Engine;
use wasmtime::component::Component;
use wasmtime::component::types::ComponentItem;

/// The worlds of `orch:plugin`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WorldKind {
    Policy,
    Queue,
    Trainer,
}

impl WorldKind {
    /// `policy`, `queue`, `trainer`.
    pub fn name(self) -> &'static str {
        match self {
            WorldKind::Policy => "policy",
            WorldKind::Queue => "queue",
            WorldKind::Trainer => "trainer",
        }
    }

    /// `orch:plugin/policy@0.2.0`.
    pub fn id(self, version: Version) -> String {
        format!("orch:plugin/{}@{version}", self.name())
    }

    /// What a plugin of this world exports, per version, for a message.
    pub fn exports(self, version: Version) -> &'static str {
        match (self, version) {
            (WorldKind::Policy, Version::V0_5) => "the instance `orch:plugin/placement@0.5.0`",
            (WorldKind::Queue, Version::V0_5) => "the instance `orch:plugin/queue-order@0.5.0`",
            (WorldKind::Trainer, Version::V0_5) => "the instance `orch:plugin/training@0.5.0`",
            (WorldKind::Policy, Version::V0_4) => "the instance `orch:plugin/placement@0.4.0`",
            (WorldKind::Queue, Version::V0_4) => "the instance `orch:plugin/queue-order@0.4.0`",
            (WorldKind::Trainer, Version::V0_4) => "the instance `orch:plugin/training@0.4.0`",
            (WorldKind::Policy, Version::V0_3) => "the instance `orch:plugin/placement@0.3.0`",
            (WorldKind::Queue, Version::V0_3) => "the instance `orch:plugin/queue-order@0.3.0`",
            (WorldKind::Trainer, Version::V0_3) => "the instance `orch:plugin/training@0.3.0`",
            (WorldKind::Policy, Version::V0_2) => "the instance `orch:plugin/placement@0.2.0`",
            (WorldKind::Queue, Version::V0_2) => "the instance `orch:plugin/queue-order@0.2.0`",
            (WorldKind::Trainer, Version::V0_2) => "the instance `orch:plugin/training@0.2.0`",
            (WorldKind::Policy, Version::V0_1) => "the function `select`",
            (WorldKind::Queue, Version::V0_1) => "the function `order`",
            (WorldKind::Trainer, Version::V0_1) => {
                "the functions `init`, `train-step` and `eval-step`"
            }
        }
    }

    /// "orch:plugin/policy@0.5.0 (or 0.4.0, 0.3.0, 0.2.0, 0.1.0)": what orch expects of a
    /// plugin of this world.
    pub fn expected(self) -> String {
        format!(
            "{} (or {}, {}, {}, {})",
            self.id(Version::CURRENT),
            Version::V0_4,
            Version::V0_3,
            Version::V0_2,
            Version::V0_1
        )
    }
}

/// A world and the version of the contract a component implements.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Found {
    pub world: WorldKind,
    pub version: Version,
}

impl Found {
    /// `orch:plugin/policy@0.2.0`.
    pub fn id(&self) -> String {
        self.world.id(self.version)
    }
}

/// What a component's exports say it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Identity {
    /// A world of a version orch loads.
    Known(Found),
    /// An `orch:plugin` interface of a version orch does not know (`orch:plugin/placement@0.9.0`).
    UnknownVersion { export: String },
    /// Nothing of orch's: the exports, described (`` `wasi:cli/run@0.2.0` (an instance) ``).
    Other { exports: Vec<String> },
}

/// The names 0.2.0 and later export, with the world each marks.
const INTERFACES: [(&str, WorldKind); 3] = [
    ("placement", WorldKind::Policy),
    ("queue-order", WorldKind::Queue),
    ("training", WorldKind::Trainer),
];

/// What `component` implements, by its exports.
pub fn identify(engine: &Engine, component: &Component) -> Identity {
    let ty = component.component_type();
    let exports: Vec<(String, bool)> = ty
        .exports(engine)
        .map(|(name, item)| {
            let is_func = matches!(item.ty, ComponentItem::ComponentFunc(_));
            (name.to_string(), is_func)
        })
        .collect();
    identify_exports(&exports)
}

/// [`identify`] over `(name, is a function)` pairs.
pub fn identify_exports(exports: &[(String, bool)]) -> Identity {
    let has_func = |name: &str| exports.iter().any(|(n, f)| *f && n == name);
    for (name, _) in exports {
        let Some(rest) = name.strip_prefix("orch:plugin/") else {
            continue;
        };
        let (interface, version) = rest.split_once('@').unwrap_or((rest, ""));
        let Some(&(_, world)) = INTERFACES.iter().find(|(i, _)| *i == interface) else {
            continue;
        };
        if let Some(version) = [Version::V0_2, Version::V0_3, Version::V0_4, Version::V0_5]
            .into_iter()
            .find(|v| v.as_str() == version)
        {
            return Identity::Known(Found { world, version });
        }
        return Identity::UnknownVersion {
            export: name.clone(),
        };
    }
    let v1 = |world| {
        Identity::Known(Found {
            world,
            version: Version::V0_1,
        })
    };
    if has_func("init") && has_func("train-step") && has_func("eval-step") {
        return v1(WorldKind::Trainer);
    }
    if has_func("select") {
        return v1(WorldKind::Policy);
    }
    if has_func("order") {
        return v1(WorldKind::Queue);
    }
    Identity::Other {
        exports: exports
            .iter()
            .map(|(name, is_func)| {
                format!(
                    "`{name}` ({})",
                    if *is_func {
                        "a function"
                    } else {
                        "an instance"
                    }
                )
            })
            .collect(),
    }
}

/// Why a component is not a plugin of world `wanted`, in one clause for "… is not a plugin orch
/// can load: CLAUSE"; `None` when it is one.
pub fn mismatch(identity: &Identity, wanted: WorldKind) -> Option<String> {
    match identity {
        Identity::Known(found) if found.world == wanted => None,
        Identity::Known(found) => Some(format!(
            "it implements {}, and orch expected {}",
            found.id(),
            wanted.expected()
        )),
        Identity::UnknownVersion { export } => Some(format!(
            "it exports `{export}`, a version of the contract this orch does not know; \
             orch expected {}: rebuild it against this orch's wit/, or upgrade orch",
            wanted.expected()
        )),
        Identity::Other { exports } => Some(format!(
            "it exports {}, and orch expected {}, which exports {} (0.1.0: {})",
            if exports.is_empty() {
                "nothing".to_string()
            } else {
                exports.join(", ")
            },
            wanted.id(Version::CURRENT),
            wanted.exports(Version::CURRENT),
            wanted.exports(Version::V0_1)
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(exports: &[(&str, bool)]) -> Identity {
        let owned: Vec<(String, bool)> = exports.iter().map(|(n, f)| (n.to_string(), *f)).collect();
        identify_exports(&owned)
    }

    fn found(world: WorldKind, version: Version) -> Identity {
        Identity::Known(Found { world, version })
    }

    #[test]
    fn the_exports_tell_world_and_version() {
        assert_eq!(
            of(&[("orch:plugin/placement@0.2.0", false)]),
            found(WorldKind::Policy, Version::V0_2)
        );
        assert_eq!(
            of(&[("orch:plugin/queue-order@0.2.0", false)]),
            found(WorldKind::Queue, Version::V0_2)
        );
        assert_eq!(
            of(&[("orch:plugin/training@0.2.0", false)]),
            found(WorldKind::Trainer, Version::V0_2)
        );
        assert_eq!(
            of(&[("select", true)]),
            found(WorldKind::Policy, Version::V0_1)
        );
        assert_eq!(
            of(&[("order", true)]),
            found(WorldKind::Queue, Version::V0_1)
        );
        assert_eq!(
            of(&[("init", true), ("train-step", true), ("eval-step", true)]),
            found(WorldKind::Trainer, Version::V0_1)
        );
        assert_eq!(
            of(&[("orch:plugin/training@0.3.0", false)]),
            found(WorldKind::Trainer, Version::V0_3)
        );
        assert_eq!(
            of(&[("orch:plugin/placement@0.4.0", false)]),
            found(WorldKind::Policy, Version::V0_4)
        );
        assert_eq!(
            of(&[("orch:plugin/placement@0.5.0", false)]),
            found(WorldKind::Policy, Version::V0_5)
        );
        assert_eq!(
            of(&[("orch:plugin/placement@0.9.0", false)]),
            Identity::UnknownVersion {
                export: "orch:plugin/placement@0.9.0".into()
            }
        );
        // An instance named `select` is not the 0.1.0 function.
        assert!(matches!(of(&[("select", false)]), Identity::Other { .. }));
    }

    #[test]
    fn a_mismatch_says_what_was_found_and_what_was_expected() {
        let queue = of(&[("orch:plugin/queue-order@0.2.0", false)]);
        assert_eq!(
            mismatch(&queue, WorldKind::Policy).unwrap(),
            "it implements orch:plugin/queue@0.2.0, and orch expected orch:plugin/policy@0.5.0 (or 0.4.0, 0.3.0, 0.2.0, 0.1.0)"
        );
        assert_eq!(mismatch(&queue, WorldKind::Queue), None);
        let cli = of(&[("wasi:cli/run@0.2.0", false)]);
        let text = mismatch(&cli, WorldKind::Policy).unwrap();
        assert!(
            text.starts_with("it exports `wasi:cli/run@0.2.0` (an instance), and orch expected orch:plugin/policy@0.5.0, which exports the instance `orch:plugin/placement@0.5.0` (0.1.0: the function `select`)"),
            "{text}"
        );
        let future = of(&[("orch:plugin/placement@0.9.0", false)]);
        assert!(
            mismatch(&future, WorldKind::Policy)
                .unwrap()
                .contains("a version of the contract this orch does not know")
        );
    }
}
