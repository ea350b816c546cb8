//! The built-in `mlp` trainer, built against contract `orch:plugin@0.4.0`
//! (crates/orch-wit/compat/0.4.0): its model is plugins/trainer-mlp's, with the `training`
//! and `inference` exports and the imports of 0.4.0 (world `predicting-trainer`). A test
//! fixture: the host must keep loading, running and asking trainers built for 0.4.0, to the very
//! parameters and logits the current built-in reaches.

#[path = "../../../trainer-mlp/src/config.rs"]
mod config;
#[path = "../../../trainer-mlp/src/model.rs"]
mod model;

use bindings::exports::orch::plugin::training::{EvalReport, Guest, RunInfo, StepInfo, StepReport};

// The generated export glue takes `run-info`'s fields as flat arguments.
#[allow(clippy::too_many_arguments)]
mod bindings {
    wit_bindgen::generate!({
        path: "../../../crates/orch-wit/compat/0.4.0",
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
