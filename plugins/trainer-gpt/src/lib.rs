//! Trainer `gpt`: a decoder-only transformer over characters, nanoGPT's `model.py`
//! (Karpathy) on orch's tensor ops: token and learned position embeddings, pre-norm blocks of
//! causal self-attention and a 4x GELU MLP, a final layer norm and a head tied to the token
//! embedding; trained with AdamW (weight decay on matrices only), nanoGPT's warm-up and cosine
//! schedule and gradient clipping. For the `text` data format, whose batches are windows of
//! `block_size` token ids labelled with the next token at every position.
//!
//! Run it from a job file (examples/gpt/job.toml is nanoGPT's CPU run on Shakespeare):
//!
//! ```toml
//! [train]
//! plugin = "gpt"            # the built-in copy, or a path to your .wasm
//! steps = 2000
//! [train.data]
//! format = "text"
//! train = "data/train.txt.gz"
//! val = "data/val.txt.gz"
//! block_size = 64
//! [train.config]
//! layers = 4                # transformer blocks
//! heads = 4                 # attention heads (divide embedding)
//! embedding = 128           # residual width
//! dropout = 0.0
//! bias = false              # biases in linear layers and layer norms
//! lr = 1e-3                 # peak, after warmup_steps; cosine down to min_lr at decay_steps
//! min_lr = 1e-4
//! warmup_steps = 100
//! decay_steps = 2000        # default: the run's steps
//! weight_decay = 0.1        # AdamW, on matrices and embeddings only
//! beta1 = 0.9
//! beta2 = 0.99
//! grad_clip = 1.0           # 0: no clipping
//! ```
//!
//! Why it is written as it is: the parameters have nanoGPT's `state_dict` names and PyTorch's
//! layouts, so a checkpoint loads into nanoGPT's `GPT` (tests/python/gpt_torch.py does, and
//! checks the same loss and logits); the host's GELU is the tanh approximation, so that model
//! uses `nn.GELU(approximate="tanh")` where nanoGPT uses the exact one. The plugin holds only
//! handles: a training step of the example is about 160 host calls (each ~1.5 µs) around the
//! host's fused kernels (layer norm, attention, cross-entropy, AdamW).
//!
//! It implements contract 0.3.0's `predicting-trainer` world: `predict` gives the logits
//! `[rows, t, vocab]` of token ids `[rows, t]`, `t <= block_size` (`orch sample`, `orch
//! predict`).

mod config;
mod model;

use orch_trainer_kit::{
    EvalReport, Guest, InferenceGuest, RunInfo, StepInfo, StepReport, Tensor, export_trainer,
};

struct Gpt;

impl Guest for Gpt {
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

impl InferenceGuest for Gpt {
    fn predict(features: Tensor) -> Result<Tensor, String> {
        model::predict(features)
    }
}

export_trainer!(Gpt);
