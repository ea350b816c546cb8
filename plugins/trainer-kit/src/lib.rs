//! What orch's trainers written in Rust share: the guest bindings of contract 0.3.0's
//! `predicting-trainer` world (generated once, here, and exported by a trainer with
//! [`export_trainer!`]) and safe wrappers over the tensor ops ([`ops`]).
//!
//! Design decision: the wrappers add no semantics. Each is one host call (the same op, the same
//! error values), taking Rust's types (`usize`, `isize`, ranges) where the contract takes `u32`
//! and `s32`, so a trainer never casts; a size past `u32` is a `bad-argument` value made here,
//! not a silent wrap. Errors read as sentences with [`describe`]. A trainer that has no
//! `predict` implements it as an `Err` saying so.
//!
//! ```ignore
//! use orch_trainer_kit::{export_trainer, ops, Guest, InferenceGuest};
//! struct Gpt;
//! impl Guest for Gpt { /* init-replica, train-step, eval-step */ }
//! impl InferenceGuest for Gpt { /* predict */ }
//! export_trainer!(Gpt);
//! ```

// The generated export macro names paths through this crate, from inside it too.
extern crate self as orch_trainer_kit;

/// The guest bindings of the `predicting-trainer` world. The generated export glue takes
/// `run-info`'s fields as flat arguments, more than clippy likes.
#[allow(clippy::too_many_arguments)]
pub mod bindings {
    wit_bindgen::generate!({
        path: "../../wit",
        world: "predicting-trainer",
        pub_export_macro: true,
        export_macro_name: "export_trainer",
        default_bindings_module: "orch_trainer_kit::bindings",
        runtime_path: "orch_trainer_kit::wit_bindgen::rt",
    });
}

pub mod ops;

pub use bindings::export_trainer;
pub use bindings::exports::orch::plugin::inference::Guest as InferenceGuest;
pub use bindings::exports::orch::plugin::training::{
    EvalReport, Guest, RunInfo, StepInfo, StepReport,
};
pub use bindings::orch::plugin::optim::{
    AdamConfig, Optimizer, OptimizerConfig, ParamGroup, SgdConfig,
};
pub use bindings::orch::plugin::tensors::{Tensor, TensorError};
pub use bindings::orch::plugin::{autograd, data, devices, metrics, params, tensors};
pub use wit_bindgen;

/// A tensor error in words, for a trainer's error message.
pub fn describe(e: &TensorError) -> String {
    match e {
        TensorError::OutOfMemory(o) => format!(
            "out of memory on device {}: {} bytes requested, {} in use, limit {}",
            o.device, o.requested, o.in_use, o.limit
        ),
        TensorError::ShapeMismatch(s) => {
            format!("{}: shapes {:?} and {:?} do not fit", s.op, s.lhs, s.rhs)
        }
        TensorError::DeviceMismatch((a, b)) => format!("tensors on devices {a} and {b}"),
        TensorError::NoSuchDevice(d) => format!("no device {d} in the job's grant"),
        TensorError::TooManyTensors(n) => format!("more than {n} tensors held"),
        TensorError::BadHandle(m)
        | TensorError::BadArgument(m)
        | TensorError::NotNow(m)
        | TensorError::Failed(m) => m.clone(),
    }
}

/// Two parameter groups as nanoGPT makes them: the parameters of rank 2 or more (matrices,
/// embeddings) decayed by `weight_decay`, the others (biases, norms' gains) not; both at `lr`.
/// `params` are `(name, tensor)` as registered. An empty group is left out.
pub fn decay_matrices_only(
    params: &[(String, &Tensor)],
    lr: f32,
    weight_decay: f32,
) -> Vec<ParamGroup> {
    let (matrices, others): (Vec<_>, Vec<_>) =
        params.iter().partition(|(_, t)| t.shape().len() >= 2);
    let names = |list: Vec<&(String, &Tensor)>| list.into_iter().map(|(n, _)| n.clone()).collect();
    [
        ParamGroup {
            params: names(matrices),
            lr,
            weight_decay,
        },
        ParamGroup {
            params: names(others),
            lr,
            weight_decay: 0.0,
        },
    ]
    .into_iter()
    .filter(|g| !g.params.is_empty())
    .collect()
}
