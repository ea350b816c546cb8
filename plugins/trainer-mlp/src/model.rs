//! The model and the three calls of a trainer, on the contract's imports: what the `training`
//! export of lib.rs calls (a copy of this crate built for contract 0.1.0, under
//! plugins/compat/, calls it from that contract's bare exports).

use crate::bindings::orch::plugin::optim::{AdamConfig, Optimizer, OptimizerConfig, SgdConfig};
use crate::bindings::orch::plugin::tensors::{self as t, Tensor, TensorError, UnaryOp};
use crate::bindings::orch::plugin::{autograd, data, metrics, params};
use crate::config::{Config, OptimizerKind};
use crate::{EvalReport, RunInfo, StepInfo, StepReport};
use std::cell::RefCell;

/// One linear layer: `x @ weight + bias`, `weight` `[in, out]`.
struct Layer {
    weight: Tensor,
    bias: Tensor,
}

struct Model {
    layers: Vec<Layer>,
    optimizer: Optimizer,
    base_lr: f32,
    lr_decay: f32,
}

thread_local! {
    // A component instance is one replica and single-threaded: the model lives here between
    // calls.
    static MODEL: RefCell<Option<Model>> = const { RefCell::new(None) };
}

impl Model {
    fn new(config: &Config, info: &RunInfo) -> Result<Model, TensorError> {
        let mut widths = vec![info.features];
        widths.extend(&config.hidden);
        widths.push(info.classes);
        let mut layers = Vec::new();
        for (i, pair) in widths.windows(2).enumerate() {
            let (fan_in, fan_out) = (pair[0], pair[1]);
            // He initialisation for ReLU layers. Every replica draws the same values from the
            // job's seed; the host broadcasts replica 0's anyway.
            let std = (2.0 / fan_in as f32).sqrt();
            let weight = t::randn(&[fan_in, fan_out], std, info.seed + i as u64, None)?;
            let bias = t::full(&[fan_out], 0.0, None)?;
            layers.push(Layer {
                weight: params::register(&format!("layers.{i}.weight"), &weight)?,
                bias: params::register(&format!("layers.{i}.bias"), &bias)?,
            });
        }
        // Created after the parameters: it updates every parameter registered so far.
        let optimizer = Optimizer::create(match config.optimizer {
            OptimizerKind::Sgd => OptimizerConfig::Sgd(SgdConfig {
                lr: config.lr,
                momentum: config.momentum,
                weight_decay: config.weight_decay,
                nesterov: false,
            }),
            OptimizerKind::Adam => OptimizerConfig::Adam(AdamConfig {
                lr: config.lr,
                beta1: 0.9,
                beta2: 0.999,
                eps: 1e-8,
                weight_decay: config.weight_decay,
                decoupled: false,
            }),
        })?;
        Ok(Model {
            layers,
            optimizer,
            base_lr: config.lr,
            lr_decay: config.lr_decay,
        })
    }

    /// Logits `[rows, classes]` for features `[rows, features]`.
    fn forward(&self, x: &Tensor) -> Result<Tensor, TensorError> {
        let last = self.layers.len() - 1;
        let mut h = t::linear(x, &self.layers[0].weight, Some(&self.layers[0].bias))?;
        for layer in &self.layers[1..=last] {
            h = t::unary(UnaryOp::Relu, &h)?;
            h = t::linear(&h, &layer.weight, Some(&layer.bias))?;
        }
        Ok(h)
    }

    fn train_step(&mut self, step: &StepInfo) -> Result<f32, TensorError> {
        if step.batch == 0 {
            let lr = self.base_lr * self.lr_decay.powi(step.epoch as i32);
            self.optimizer.set_lr(lr)?;
            metrics::scalar("lr", f64::from(lr));
        }
        let batch = data::train_batch()?;
        let logits = self.forward(&batch.features)?;
        let loss = t::cross_entropy(&logits, &batch.labels)?;
        self.optimizer.zero_grad();
        autograd::backward(&loss)?;
        // With several replicas, `step` averages the gradients over them first.
        self.optimizer.step()?;
        loss.item()
    }

    fn eval_step(&self) -> Result<EvalReport, TensorError> {
        let batch = data::eval_batch()?;
        let logits = self.forward(&batch.features)?;
        Ok(EvalReport {
            loss: t::cross_entropy(&logits, &batch.labels)?.item()?,
            correct: t::correct(&logits, &batch.labels)?,
            rows: batch.rows,
        })
    }
}

/// `init-replica`: builds this replica's model from `[train.config]`.
pub fn init(config: Vec<(String, String)>, info: RunInfo) -> Result<(), String> {
    let config = Config::parse(&config)?;
    let model = Model::new(&config, &info).map_err(|e| describe(&e))?;
    if info.replica == 0 {
        let widths: Vec<String> = config.hidden.iter().map(u32::to_string).collect();
        metrics::log(
            metrics::Level::Info,
            &format!(
                "mlp {}-{}-{}, {:?} lr {}",
                info.features,
                widths.join("-"),
                info.classes,
                config.optimizer,
                config.lr
            ),
        );
    }
    MODEL.with(|m| *m.borrow_mut() = Some(model));
    Ok(())
}

/// `inference.predict`: the logits for `features` `[rows, features]` (the host calls it with
/// autograd off).
#[allow(dead_code)] // the copies under plugins/compat/ predate `predict`
pub fn predict(features: Tensor) -> Result<Tensor, String> {
    with_model(|model| model.forward(&features))
}

/// `train-step`: one optimisation step on this replica's shard of the batch.
pub fn train_step(step: StepInfo) -> Result<StepReport, String> {
    with_model(|model| model.train_step(&step).map(|loss| StepReport { loss }))
}

/// `eval-step`: the loss and the rows predicted right on this replica's evaluation shard.
pub fn eval_step(_step: StepInfo) -> Result<EvalReport, String> {
    with_model(|model| model.eval_step())
}

fn with_model<T>(f: impl FnOnce(&mut Model) -> Result<T, TensorError>) -> Result<T, String> {
    MODEL.with(|m| match m.borrow_mut().as_mut() {
        Some(model) => f(model).map_err(|e| describe(&e)),
        None => Err("called before init".to_string()),
    })
}

/// A tensor error in words, for the host's error message.
fn describe(e: &TensorError) -> String {
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
