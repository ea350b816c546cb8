//! The built-in trainers: Wasm components built from `plugins/trainer-*` and embedded in the
//! binary. They run in the same sandbox as anyone's trainer.

use crate::error::TrainError;
use orch_core::PluginRef;

/// One built-in trainer.
#[derive(Debug)]
pub struct BuiltinTrainer {
    /// The name a job's `[train] plugin` uses.
    pub name: &'static str,
    pub summary: &'static str,
    pub wasm: &'static [u8],
}

/// Every built-in trainer.
pub static BUILTIN_TRAINERS: &[BuiltinTrainer] = &[
    BuiltinTrainer {
        name: "mlp",
        summary: "multi-layer perceptron with ReLU and softmax cross-entropy (config hidden, optimizer, lr, momentum, weight_decay, lr_decay)",
        wasm: include_bytes!(concat!(env!("ORCH_TRAINER_WASM_DIR"), "/trainer_mlp.wasm")),
    },
    BuiltinTrainer {
        name: "cnn",
        summary: "convolutional network for images: conv blocks (channels, kernel, pooling, optional batch-norm), then linear layers (config channels, kernel, pool, batch_norm, hidden, optimizer, lr, ...)",
        wasm: include_bytes!(concat!(env!("ORCH_TRAINER_WASM_DIR"), "/trainer_cnn.wasm")),
    },
    BuiltinTrainer {
        name: "gpt",
        summary: "decoder-only transformer over characters (nanoGPT): pre-norm blocks, causal attention, tied head, AdamW, warm-up and cosine decay (config layers, heads, embedding, dropout, bias, lr, ...)",
        wasm: include_bytes!(concat!(env!("ORCH_TRAINER_WASM_DIR"), "/trainer_gpt.wasm")),
    },
];

/// Where the build put the guest components (the trainer test fixtures among them).
#[doc(hidden)]
pub const TRAINER_WASM_DIR: &str = env!("ORCH_TRAINER_WASM_DIR");

pub(crate) fn names() -> Vec<&'static str> {
    BUILTIN_TRAINERS.iter().map(|b| b.name).collect()
}

/// A trainer's name (for messages) and its component bytes.
pub fn load_plugin(plugin: &PluginRef) -> Result<(String, Vec<u8>), TrainError> {
    match plugin {
        PluginRef::Builtin(name) => BUILTIN_TRAINERS
            .iter()
            .find(|b| b.name == name)
            .map(|b| (b.name.to_string(), b.wasm.to_vec()))
            .ok_or_else(|| TrainError::UnknownBuiltin { name: name.clone() }),
        PluginRef::Path(path) => {
            let wasm = std::fs::read(path).map_err(|source| TrainError::Read {
                path: path.clone(),
                source,
            })?;
            let name = path.file_stem().map_or_else(
                || path.display().to_string(),
                |s| s.to_string_lossy().into_owned(),
            );
            Ok((name, wasm))
        }
    }
}
