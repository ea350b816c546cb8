//! Trainer `cnn`: a convolutional network for image classification (MNIST: `[1, 28, 28]`
//! samples, 10 classes). Convolution blocks (a "same" convolution, optional batch-norm, ReLU,
//! optional 2x2 pooling) then linear layers with ReLU between them, softmax cross-entropy, and
//! an optimizer (Adam, AdamW or SGD) with an optional warm-up and cosine or step decay.
//!
//! Why it looks as it does: every parameter is named and shaped as PyTorch's `nn.Conv2d`,
//! `nn.BatchNorm2d` and `nn.Linear` would be (`conv1.weight` `[16, 1, 5, 5]`, `bn1.running_var`,
//! `fc1.weight` `[10, 1568]`), and initialised as their defaults, so a checkpoint's
//! `model.safetensors` loads into the equivalent PyTorch module with `load_state_dict` and the
//! two train alike. The learning rate is computed from `step-info` alone, so a resumed run
//! follows the same schedule.
//!
//! ```toml
//! [train]
//! plugin = "cnn"            # the built-in copy, or a path to your .wasm
//! [train.config]
//! channels = "16,32"        # output channels of each convolution block
//! kernel = 5                # odd; padding kernel / 2 keeps the size
//! pool = "max"              # or "avg", "none": 2x2, stride 2, after each block
//! batch_norm = false        # conv -> batch-norm -> ReLU (convs then have no bias)
//! hidden = ""               # hidden linear widths between flatten and the classes layer
//! dropout = 0               # before every linear layer
//! optimizer = "adam"        # or "adamw", "sgd"
//! lr = 0.001
//! lr_schedule = "constant"  # or "cosine" (to lr_min over the run), "step" (lr_gamma every lr_step_epochs)
//! warmup_steps = 0
//! ```
//!
//! `momentum` and `nesterov` are read with `optimizer = "sgd"` only, `lr_min` with the cosine
//! schedule only, `lr_step_epochs` and `lr_gamma` with the step schedule only: given otherwise
//! they are refused rather than ignored. `weight_decay` (Adam: L2 added to the gradient, as
//! PyTorch's `Adam`; AdamW: decoupled, default 0.01) applies to the convolution and linear
//! weights, not to biases and batch-norm's scale and shift.
//!
//! It implements contract 0.3.0's `predicting-trainer` world through `orch-trainer-kit`: the
//! model holds only handles (weights, activations and gradients stay on the device), and a
//! training step of cnn-small is about thirty host calls, handle drops included.

mod config;
mod model;

use orch_trainer_kit::{
    EvalReport, Guest, InferenceGuest, RunInfo, StepInfo, StepReport, Tensor, export_trainer,
};

struct Cnn;

impl Guest for Cnn {
    fn init_replica(config: Vec<(String, String)>, info: RunInfo) -> Result<(), String> {
        model::init(config, info)
    }

    fn train_step(step: StepInfo) -> Result<StepReport, String> {
        model::train_step(step).map(|loss| StepReport { loss })
    }

    fn eval_step(_step: StepInfo) -> Result<EvalReport, String> {
        model::eval_step()
    }
}

impl InferenceGuest for Cnn {
    fn predict(features: Tensor) -> Result<Tensor, String> {
        model::predict(features)
    }
}

export_trainer!(Cnn);
