//! The network and the three calls of a trainer. Parameters are named and shaped as PyTorch's
//! modules name and shape them (`conv1.weight` `[C_out, C_in, k, k]`, `bn1.running_mean`,
//! `fc1.weight` `[out, in]`), so a checkpoint's `model.safetensors` loads into the equivalent
//! `nn.Module` with `load_state_dict`; the linear layers therefore compute `x @ W^T + b` with
//! `matmul`'s transpose (no copy) rather than `linear`, whose weight is `[in, out]`.

use crate::config::{Config, OptimizerKind, Pool};
use orch_trainer_kit::{
    AdamConfig, EvalReport, Optimizer, OptimizerConfig, RunInfo, SgdConfig, StepInfo, Tensor,
    TensorError, decay_matrices_only, describe, metrics, ops, params, tensors as t,
};
use orch_trainer_kit::{autograd, data};
use std::cell::RefCell;

/// PyTorch's `BatchNorm2d` defaults.
const BN_MOMENTUM: f32 = 0.1;
const BN_EPS: f32 = 1e-5;

/// A tensor error with the part of the model it came from, as a sentence for the host.
trait At<T> {
    fn at(self, what: &str) -> Result<T, String>;
}

impl<T> At<T> for Result<T, TensorError> {
    fn at(self, what: &str) -> Result<T, String> {
        self.map_err(|e| format!("{what}: {}", describe(&e)))
    }
}

/// Batch normalisation's parameters and running statistics (`bn{i}.*`).
struct Norm {
    name: String,
    weight: Tensor,
    bias: Tensor,
    running_mean: Tensor,
    running_var: Tensor,
}

/// Convolution ("same" padding), then batch-norm when configured, ReLU, pooling.
struct Block {
    name: String,
    weight: Tensor,
    /// None with batch-norm, whose shift makes a bias redundant (PyTorch's `bias=False`).
    bias: Option<Tensor>,
    norm: Option<Norm>,
}

/// A linear layer in PyTorch's layout: `weight` `[out, in]`.
struct Dense {
    name: String,
    weight: Tensor,
    bias: Tensor,
}

struct Model {
    /// One sample as `[C, H, W]`.
    input: [usize; 3],
    /// Features after the last block, flattened: the first linear layer's input.
    flat: usize,
    blocks: Vec<Block>,
    dense: Vec<Dense>,
    padding: usize,
    pool: Pool,
    dropout: f32,
    optimizer: Optimizer,
    config: Config,
    total_steps: u64,
}

thread_local! {
    // A component instance is one replica and single-threaded: the model lives here between
    // calls.
    static MODEL: RefCell<Option<Model>> = const { RefCell::new(None) };
}

/// A seed of its own for each initial tensor (`n` counts them), from the job's seed
/// (SplitMix64's finaliser: neighbouring job seeds share no tensor's values).
fn seed_for(seed: u64, n: u64) -> u64 {
    let mut z = seed
        .wrapping_add(n.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15))
        .wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 30)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The image shape `[C, H, W]` of one sample.
fn input_shape(config: &Config, info: &RunInfo) -> Result<[usize; 3], String> {
    let shape = match (config.input_shape, info.sample_shape.as_slice()) {
        (Some(s), _) => s,
        (None, &[c, h, w]) => [c, h, w],
        (None, &[h, w]) => [1, h, w],
        (None, other) => {
            return Err(format!(
                "the cnn trainer needs images, but one sample of this data set has shape \
                 {other:?}: give `input_shape = \"channels,height,width\"` in [train.config] to \
                 read its {} features as an image",
                info.features
            ));
        }
    };
    let shape = shape.map(|d| d as usize);
    let product = shape.iter().product::<usize>();
    if product != info.features as usize {
        return Err(format!(
            "`input_shape` {:?} holds {product} values but a sample of this data set has {}",
            shape, info.features
        ));
    }
    Ok(shape)
}

/// `uniform(-bound, bound)`, PyTorch's default initialisation of convolutions and linear
/// layers with `bound = 1 / sqrt(fan_in)` (`kaiming_uniform_(a=sqrt(5))` for the weight).
fn uniform(shape: &[usize], fan_in: usize, seed: u64) -> Result<Tensor, TensorError> {
    let bound = 1.0 / (fan_in as f32).sqrt();
    let dims = shape
        .iter()
        .map(|&d| {
            u32::try_from(d).map_err(|_| {
                TensorError::BadArgument(format!(
                    "a dimension of {d} is past u32 (shape {shape:?})"
                ))
            })
        })
        .collect::<Result<Vec<u32>, _>>()?;
    t::uniform(&dims, -bound, bound, seed, None)
}

impl Model {
    fn new(config: Config, info: &RunInfo) -> Result<Model, String> {
        let input = input_shape(&config, info)?;
        let k = config.kernel as usize;
        let mut tensors = 0u64;
        let mut seed = || {
            tensors += 1;
            seed_for(info.seed, tensors)
        };
        let (mut c, mut h, mut w) = (input[0], input[1], input[2]);
        let mut blocks = Vec::new();
        for (i, &out) in config.channels.iter().enumerate() {
            let out = out as usize;
            let name = format!("conv{}", i + 1);
            let fan_in = c * k * k;
            let weight = uniform(&[out, c, k, k], fan_in, seed()).at(&name)?;
            let weight = params::register(&format!("{name}.weight"), &weight).at(&name)?;
            let (bias, norm) = if config.batch_norm {
                let bn = format!("bn{}", i + 1);
                let make = |what: &str, value: f32, buffer: bool| {
                    let init = ops::full(&[out], value).at(&bn)?;
                    let full = format!("{bn}.{what}");
                    if buffer {
                        params::register_buffer(&full, &init).at(&bn)
                    } else {
                        params::register(&full, &init).at(&bn)
                    }
                };
                let norm = Norm {
                    weight: make("weight", 1.0, false)?,
                    bias: make("bias", 0.0, false)?,
                    running_mean: make("running_mean", 0.0, true)?,
                    running_var: make("running_var", 1.0, true)?,
                    name: bn,
                };
                (None, Some(norm))
            } else {
                let bias = uniform(&[out], fan_in, seed()).at(&name)?;
                let bias = params::register(&format!("{name}.bias"), &bias).at(&name)?;
                (Some(bias), None)
            };
            blocks.push(Block {
                name,
                weight,
                bias,
                norm,
            });
            c = out;
            if config.pool != Pool::None {
                if h < 2 || w < 2 {
                    return Err(format!(
                        "block {} would pool a {h}x{w} image: the {}x{} input allows at most \
                         {} pooled blocks (fewer `channels`, or pool = \"none\")",
                        i + 1,
                        input[1],
                        input[2],
                        i
                    ));
                }
                (h, w) = (h / 2, w / 2);
            }
        }
        let mut widths = vec![c * h * w];
        widths.extend(config.hidden.iter().map(|&w| w as usize));
        widths.push(info.classes as usize);
        let mut dense = Vec::new();
        for (j, pair) in widths.windows(2).enumerate() {
            let (fan_in, out) = (pair[0], pair[1]);
            let name = format!("fc{}", j + 1);
            let weight = uniform(&[out, fan_in], fan_in, seed()).at(&name)?;
            let bias = uniform(&[out], fan_in, seed()).at(&name)?;
            dense.push(Dense {
                weight: params::register(&format!("{name}.weight"), &weight).at(&name)?,
                bias: params::register(&format!("{name}.bias"), &bias).at(&name)?,
                name,
            });
        }
        let optimizer = optimizer(&config, &blocks, &dense).at("the optimizer")?;
        if info.replica == 0 {
            metrics::log(
                metrics::Level::Info,
                &describe_model(&config, input, &widths),
            );
        }
        Ok(Model {
            input,
            flat: widths[0],
            blocks,
            dense,
            padding: k / 2,
            pool: config.pool,
            dropout: config.dropout,
            optimizer,
            total_steps: info.total_steps,
            config,
        })
    }

    /// Logits `[rows, classes]` for flat features `[rows, C*H*W]` (batch-norm and dropout
    /// take their mode from the phase the host calls in).
    fn forward(&self, features: &Tensor, rows: usize) -> Result<Tensor, String> {
        let [c, h, w] = self.input;
        let mut x = ops::reshape(features, &[rows, c, h, w]).at("the input")?;
        let p = self.padding;
        for block in &self.blocks {
            x = ops::conv2d(
                &x,
                &block.weight,
                block.bias.as_ref(),
                (1, 1),
                (p, p),
                (1, 1),
                1,
            )
            .at(&block.name)?;
            if let Some(n) = &block.norm {
                x = ops::batch_norm(
                    &x,
                    &n.running_mean,
                    &n.running_var,
                    Some(&n.weight),
                    Some(&n.bias),
                    BN_MOMENTUM,
                    BN_EPS,
                )
                .at(&n.name)?;
            }
            x = ops::relu(&x).at(&block.name)?;
            x = match self.pool {
                Pool::Max => ops::max_pool2d(&x, (2, 2), (2, 2), (0, 0)).at(&block.name)?,
                Pool::Avg => ops::avg_pool2d(&x, (2, 2), (2, 2), (0, 0)).at(&block.name)?,
                Pool::None => x,
            };
        }
        x = ops::reshape(&x, &[rows, self.flat]).at("flatten")?;
        let last = self.dense.len() - 1;
        for (j, layer) in self.dense.iter().enumerate() {
            if self.dropout > 0.0 {
                x = ops::dropout(&x, self.dropout).at(&layer.name)?;
            }
            x = t::matmul(&x, &layer.weight, false, true).at(&layer.name)?;
            x = ops::add(&x, &layer.bias).at(&layer.name)?;
            if j < last {
                x = ops::relu(&x).at(&layer.name)?;
            }
        }
        Ok(x)
    }

    fn train_step(&mut self, step: &StepInfo) -> Result<f32, String> {
        if self.config.scheduled() {
            let lr = self.config.lr_at(step.step, step.epoch, self.total_steps);
            self.optimizer.set_lr(lr).at("the learning rate")?;
            metrics::scalar("lr", f64::from(lr));
        }
        let batch = data::train_batch().at("the training batch")?;
        let logits = self.forward(&batch.features, batch.rows as usize)?;
        let loss = t::cross_entropy(&logits, &batch.labels).at("the loss")?;
        self.optimizer.zero_grad();
        autograd::backward(&loss).at("backward")?;
        // With several replicas, the step averages the gradients over them first.
        if self.config.max_grad_norm > 0.0 {
            let norm = self
                .optimizer
                .step_clipped(self.config.max_grad_norm)
                .at("the optimizer step")?;
            metrics::scalar("grad_norm", f64::from(norm));
        } else {
            self.optimizer.step().at("the optimizer step")?;
        }
        loss.item().at("the loss")
    }

    fn eval_step(&self) -> Result<EvalReport, String> {
        let batch = data::eval_batch().at("the evaluation batch")?;
        let logits = self.forward(&batch.features, batch.rows as usize)?;
        Ok(EvalReport {
            loss: t::cross_entropy(&logits, &batch.labels)
                .and_then(|l| l.item())
                .at("the loss")?,
            correct: t::correct(&logits, &batch.labels).at("the accuracy")?,
            rows: batch.rows,
        })
    }
}

/// The configured optimizer over every parameter. With weight decay, two groups: the
/// convolution and linear weights decayed, biases and batch-norm's scales not.
fn optimizer(config: &Config, blocks: &[Block], dense: &[Dense]) -> Result<Optimizer, TensorError> {
    let kind = match config.optimizer {
        OptimizerKind::Sgd => OptimizerConfig::Sgd(SgdConfig {
            lr: config.lr,
            momentum: config.momentum,
            weight_decay: config.weight_decay,
            nesterov: config.nesterov,
        }),
        OptimizerKind::Adam | OptimizerKind::AdamW => OptimizerConfig::Adam(AdamConfig {
            lr: config.lr,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: config.weight_decay,
            decoupled: config.optimizer == OptimizerKind::AdamW,
        }),
    };
    if config.weight_decay == 0.0 {
        return Optimizer::create(kind);
    }
    let mut named: Vec<(String, &Tensor)> = Vec::new();
    for b in blocks {
        named.push((format!("{}.weight", b.name), &b.weight));
        if let Some(bias) = &b.bias {
            named.push((format!("{}.bias", b.name), bias));
        }
        if let Some(n) = &b.norm {
            named.push((format!("{}.weight", n.name), &n.weight));
            named.push((format!("{}.bias", n.name), &n.bias));
        }
    }
    for d in dense {
        named.push((format!("{}.weight", d.name), &d.weight));
        named.push((format!("{}.bias", d.name), &d.bias));
    }
    let groups = decay_matrices_only(&named, config.lr, config.weight_decay);
    Optimizer::create_grouped(kind, &groups)
}

/// One line for the job's log: the layers, the parameter count, the optimizer.
fn describe_model(config: &Config, input: [usize; 3], widths: &[usize]) -> String {
    let k = config.kernel;
    let pool = match config.pool {
        Pool::Max => ", max-pool 2",
        Pool::Avg => ", avg-pool 2",
        Pool::None => "",
    };
    let bn = if config.batch_norm {
        ", batch-norm"
    } else {
        ""
    };
    let mut c = input[0];
    let mut count = 0;
    let mut parts = vec![format!("{}x{}x{}", input[0], input[1], input[2])];
    for &out in &config.channels {
        let out = out as usize;
        count += out * c * (k * k) as usize + if config.batch_norm { 2 * out } else { out };
        parts.push(format!("conv{k}x{k} {out}{bn}{pool}"));
        c = out;
    }
    for pair in widths.windows(2) {
        count += pair[0] * pair[1] + pair[1];
    }
    let widths: Vec<String> = widths.iter().map(usize::to_string).collect();
    parts.push(widths.join("-"));
    format!(
        "cnn {} ({count} parameters), {:?} lr {}, schedule {:?}, warm-up {} steps{}",
        parts.join(" -> "),
        config.optimizer,
        config.lr,
        config.schedule,
        config.warmup_steps,
        if config.dropout > 0.0 {
            format!(", dropout {}", config.dropout)
        } else {
            String::new()
        }
    )
}

/// `init-replica`: builds this replica's model and optimizer from `[train.config]`.
pub fn init(config: Vec<(String, String)>, info: RunInfo) -> Result<(), String> {
    let config = Config::parse(&config)?;
    let model = Model::new(config, &info)?;
    MODEL.with(|m| *m.borrow_mut() = Some(model));
    Ok(())
}

/// `train-step`: one optimisation step on this replica's shard of the batch.
pub fn train_step(step: StepInfo) -> Result<f32, String> {
    with_model(|model| model.train_step(&step))
}

/// `eval-step`: the mean loss and the rows predicted right on this replica's shard.
pub fn eval_step() -> Result<EvalReport, String> {
    with_model(|model| model.eval_step())
}

/// `inference.predict`: the logits for flat features `[rows, features]`.
pub fn predict(features: Tensor) -> Result<Tensor, String> {
    with_model(|model| {
        let rows = features.shape().first().copied().unwrap_or(0) as usize;
        model.forward(&features, rows)
    })
}

fn with_model<T>(f: impl FnOnce(&mut Model) -> Result<T, String>) -> Result<T, String> {
    MODEL.with(|m| match m.borrow_mut().as_mut() {
        Some(model) => f(model),
        None => Err("called before init-replica".to_string()),
    })
}
