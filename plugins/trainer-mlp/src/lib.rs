//! Trainer `mlp`: a multi-layer perceptron with ReLU between layers and softmax cross-entropy,
//! for any classification data set the host loads (MNIST: 784 features, 10 classes). The
//! example a plugin author copies: it uses the `trainer` world of `wit/` and nothing else.
//!
//! Build: `cargo build --release --target wasm32-wasip2` (the component is
//! `target/wasm32-wasip2/release/trainer_mlp.wasm`). Run it from a job file:
//!
//! ```toml
//! [train]
//! plugin = "mlp"            # the built-in copy, or a path to your .wasm
//! [train.config]
//! hidden = "512,256"        # hidden layer widths
//! optimizer = "sgd"         # or "adam"
//! lr = 0.05
//! momentum = 0.9            # sgd only
//! weight_decay = 0
//! lr_decay = 1.0            # the learning rate is multiplied by this after every epoch
//! ```
//!
//! It implements contract 0.3.0's `predicting-trainer` world: `training` and `inference`
//! (`predict`: the logits of a batch), using no 0.3.0 op (so its 0.1.0 and 0.2.0 twins under
//! plugins/compat/ train to the very same parameters).
//!
//! The model holds only handles: weights, gradients and batches stay on the device, and a
//! training step is about twenty host calls.

mod config;
mod model;

use bindings::exports::orch::plugin::training::{EvalReport, Guest, RunInfo, StepInfo, StepReport};

/// The `trainer` world's bindings, generated from wit/ (the contract is all a trainer needs).
// The generated export glue takes `run-info`'s fields as flat arguments.
#[allow(clippy::too_many_arguments)]
mod bindings {
    wit_bindgen::generate!({
        path: "../../wit",
        world: "predicting-trainer",
    });
}

struct Mlp;

impl Guest for Mlp {
    fn init_replica(config: Vec<(String, String)>, info: RunInfo) -> Result<(), String> {
        model::init(config, info)
    }

    fn train_step(step: StepInfo) -> Result<StepReport, String> {
        model::train_step(step)
    }

    fn eval_step(step: StepInfo) -> Result<EvalReport, String> {
        model::eval_step(step)
    }
}

impl bindings::exports::orch::plugin::inference::Guest for Mlp {
    fn predict(
        features: bindings::orch::plugin::tensors::Tensor,
    ) -> Result<bindings::orch::plugin::tensors::Tensor, String> {
        model::predict(features)
    }
}

bindings::export!(Mlp with_types_in bindings);
