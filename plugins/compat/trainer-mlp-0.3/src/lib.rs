//! The built-in `mlp` trainer, built against contract `orch:plugin@0.3.0`
//! (crates/orch-wit/compat/0.3.0): its model is plugins/trainer-mlp's, with the `training`
//! export and the imports of 0.3.0. A test fixture: the host must keep loading and running
//! trainers built for 0.3.0, to the very parameters the current built-in reaches.

#[path = "../../../trainer-mlp/src/config.rs"]
mod config;
#[path = "../../../trainer-mlp/src/model.rs"]
mod model;

use bindings::exports::orch::plugin::training::{EvalReport, Guest, RunInfo, StepInfo, StepReport};

// The generated export glue takes `run-info`'s fields as flat arguments.
#[allow(clippy::too_many_arguments)]
mod bindings {
    wit_bindgen::generate!({
        path: "../../../crates/orch-wit/compat/0.3.0",
        world: "trainer",
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

bindings::export!(Mlp with_types_in bindings);
