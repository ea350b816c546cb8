//! The built-in plugins of every world: the placement policies (`plugins/policies/`), the queue
//! policies (`plugins/queue/`) and the trainers (`plugins/trainer-*`), Wasm components built by
//! this crate's build script and embedded in the binary. They run in the same sandbox as
//! anyone's plugin. Their names are distinct across worlds, so a name alone finds one
//! ([`builtin_plugin`], what `orch plugin inspect NAME` reads).

use crate::error::PluginKind;

/// One built-in policy (or trainer).
#[derive(Debug)]
pub struct Builtin {
    /// The name a job's `[policy] plugin` uses.
    pub name: &'static str,
    /// One line for `orch plugin inspect` and the docs.
    pub summary: &'static str,
    /// The component.
    pub wasm: &'static [u8],
    /// `[policy.config]` keys the host fills in when the job leaves them out.
    pub default_config: &'static [(&'static str, &'static str)],
}

/// Every built-in, in the order the docs list them.
pub static BUILTINS: &[Builtin] = &[
    Builtin {
        name: "least-loaded",
        summary: "lowest utilization, then most free memory",
        wasm: wasm!("least_loaded.wasm"),
        default_config: &[],
    },
    Builtin {
        name: "most-free-memory",
        summary: "most free memory, then lowest utilization",
        wasm: wasm!("most_free_memory.wasm"),
        default_config: &[],
    },
    Builtin {
        name: "pack",
        summary: "best fit: the fullest device that fits, against fragmentation",
        wasm: wasm!("pack.wasm"),
        default_config: &[],
    },
    Builtin {
        name: "spread",
        summary: "fewest jobs on the device (leases and processes), then lowest utilization",
        wasm: wasm!("spread.wasm"),
        default_config: &[],
    },
    Builtin {
        name: "first-fit",
        summary: "lowest CUDA index that fits",
        wasm: wasm!("first_fit.wasm"),
        default_config: &[],
    },
    Builtin {
        name: "explicit",
        summary: "the devices config `devices` lists (\"0,2\", UUIDs or prefixes)",
        wasm: wasm!("explicit.wasm"),
        default_config: &[],
    },
    Builtin {
        name: "env",
        summary: "the devices an environment variable lists (config `var`, default CLOUD_GPU_ID)",
        wasm: wasm!("env.wasm"),
        default_config: &[("var", "CLOUD_GPU_ID")],
    },
];

/// Every built-in trainer: what a job's `[train] plugin` names.
pub static TRAINER_BUILTINS: &[Builtin] = &[
    Builtin {
        name: "mlp",
        summary: "multi-layer perceptron with ReLU and softmax cross-entropy (config hidden, optimizer, lr, momentum, weight_decay, lr_decay)",
        wasm: wasm!("trainer_mlp.wasm"),
        default_config: &[],
    },
    Builtin {
        name: "cnn",
        summary: "convolutional network for images: conv blocks (channels, kernel, pooling, optional batch-norm), then linear layers (config channels, kernel, pool, batch_norm, hidden, optimizer, lr, ...)",
        wasm: wasm!("trainer_cnn.wasm"),
        default_config: &[],
    },
    Builtin {
        name: "gpt",
        summary: "decoder-only transformer over characters (nanoGPT): pre-norm blocks, causal attention, tied head, AdamW, warm-up and cosine decay (config layers, heads, embedding, dropout, bias, lr, ...)",
        wasm: wasm!("trainer_gpt.wasm"),
        default_config: &[],
    },
];

/// The built-in policy called `name`.
pub fn builtin(name: &str) -> Option<&'static Builtin> {
    BUILTINS.iter().find(|b| b.name == name)
}

/// The built-in trainer called `name`.
pub fn trainer_builtin(name: &str) -> Option<&'static Builtin> {
    TRAINER_BUILTINS.iter().find(|b| b.name == name)
}

/// The component of built-in `name` of `kind`.
pub fn builtin_wasm(kind: PluginKind, name: &str) -> Option<&'static [u8]> {
    match kind {
        PluginKind::Placement => builtin(name).map(|b| b.wasm),
        PluginKind::Queue => queue_wasm(name),
        PluginKind::Trainer => trainer_builtin(name).map(|b| b.wasm),
    }
}

/// The built-in plugin called `name`, whatever its world: its kind and component.
pub fn builtin_plugin(name: &str) -> Option<(PluginKind, &'static [u8])> {
    [
        PluginKind::Placement,
        PluginKind::Queue,
        PluginKind::Trainer,
    ]
    .into_iter()
    .find_map(|kind| builtin_wasm(kind, name).map(|wasm| (kind, wasm)))
}

/// The built-ins' names of `kind`, in the order the docs list them, for an error message.
pub fn builtin_names(kind: PluginKind) -> Vec<&'static str> {
    match kind {
        PluginKind::Placement => BUILTINS.iter().map(|b| b.name).collect(),
        PluginKind::Queue => queue_names(),
        PluginKind::Trainer => TRAINER_BUILTINS.iter().map(|b| b.name).collect(),
    }
}

/// The built-in queue policies by name, with a line each for the docs and `orch serve`.
pub const QUEUE_BUILTINS: &[(&str, &str)] = orch_queue::BUILTINS;

/// The component of built-in queue policy `name`.
pub(crate) fn queue_wasm(name: &str) -> Option<&'static [u8]> {
    match name {
        "fair-share" => Some(wasm!("queue_fair_share.wasm")),
        "fifo" => Some(wasm!("queue_fifo.wasm")),
        "priority" => Some(wasm!("queue_priority.wasm")),
        _ => None,
    }
}

/// The built-in queue policies' names, for an error message.
pub(crate) fn queue_names() -> Vec<&'static str> {
    QUEUE_BUILTINS.iter().map(|&(name, _)| name).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_finds_one_built_in_of_any_world() {
        let mut names: Vec<&str> = [
            PluginKind::Placement,
            PluginKind::Queue,
            PluginKind::Trainer,
        ]
        .into_iter()
        .flat_map(builtin_names)
        .collect();
        let count = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(
            names.len(),
            count,
            "built-in names are distinct across worlds"
        );
        assert_eq!(
            builtin_plugin("gpt").map(|(k, _)| k),
            Some(PluginKind::Trainer)
        );
        assert_eq!(
            builtin_plugin("fifo").map(|(k, _)| k),
            Some(PluginKind::Queue)
        );
        assert_eq!(
            builtin_plugin("pack").map(|(k, _)| k),
            Some(PluginKind::Placement)
        );
        assert_eq!(builtin_plugin("nope"), None);
    }
}
