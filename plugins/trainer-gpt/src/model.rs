//! The transformer of nanoGPT's `model.py` on the host's tensor ops, and the three calls of a
//! trainer.
//!
//! Design decisions:
//! - Parameters carry nanoGPT's `state_dict` names and PyTorch's layouts (a linear weight is
//!   `[out, in]`, applied as `x @ W^T` by `matmul` with transpose-b, which copies nothing), so a
//!   checkpoint's `model.safetensors` loads into nanoGPT's `GPT` as it is. The head is tied to
//!   `transformer.wte.weight` (nanoGPT's weight tying), so no `lm_head.weight` is registered.
//! - The residual stream is kept as `[B * T, C]`: every linear layer is one 2-D product and the
//!   layer norms normalise the last axis. It becomes `[B, T, C]` (a view) only for dropout,
//!   whose mask the host draws per row of axis 0, which must be the batch's samples.
//! - Attention: `c_attn`'s output `[B*T, 3C]` is viewed as `[B, T, 3, H, D]`, permuted to
//!   `[3, B, H, T, D]` (a view) and made dense once as `[3B, H, T, D]`; q, k and v are then
//!   dense views of it (`split` along axis 0), so the fused attention copies nothing more; its
//!   output `[B, H, T, D]` is made dense once more as `[B * T, C]` for `c_proj` (nanoGPT's
//!   `.transpose(1, 2).contiguous()`). These two are the forward pass's only copies.
//!   nanoGPT drops attention weights inside `F.scaled_dot_product_attention(dropout_p=..)`; the
//!   host's attention has no dropout, so a training step with `dropout > 0` computes attention
//!   unfused (`q k^T`, mask, softmax, dropout, `@ v`), as nanoGPT's own non-flash path does.

use crate::config::Config;
use orch_trainer_kit::{
    AdamConfig, EvalReport, Optimizer, OptimizerConfig, RunInfo, StepInfo, Tensor, TensorError,
    autograd, data, decay_matrices_only, describe, metrics, ops, params, tensors as t,
};
use std::cell::RefCell;

type Result<T> = std::result::Result<T, TensorError>;

/// PyTorch's `LayerNorm` epsilon, as nanoGPT's `LayerNorm` uses.
const LN_EPS: f32 = 1e-5;
/// nanoGPT's initial standard deviation for linear weights and embeddings.
const INIT_STD: f32 = 0.02;
/// PyTorch's `AdamW` default.
const ADAM_EPS: f32 = 1e-8;

/// `x @ weight^T + bias`, `weight` `[out, in]` as PyTorch's `nn.Linear` keeps it.
struct Linear {
    weight: Tensor,
    bias: Option<Tensor>,
}

impl Linear {
    /// `x` is `[rows, in]`.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let y = t::matmul(x, &self.weight, false, true)?;
        match &self.bias {
            Some(b) => ops::add(&y, b),
            None => Ok(y),
        }
    }
}

/// nanoGPT's `LayerNorm`: a gain, and a bias only when the model has biases.
struct LayerNorm {
    weight: Tensor,
    bias: Option<Tensor>,
}

impl LayerNorm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        ops::layer_norm(x, 1, Some(&self.weight), self.bias.as_ref(), LN_EPS)
    }
}

struct Block {
    ln_1: LayerNorm,
    c_attn: Linear,
    attn_proj: Linear,
    ln_2: LayerNorm,
    c_fc: Linear,
    mlp_proj: Linear,
}

struct Gpt {
    config: Config,
    /// Context length: the longest sequence, and the rows of `wpe`.
    block: usize,
    wte: Tensor,
    wpe: Tensor,
    blocks: Vec<Block>,
    ln_f: LayerNorm,
    optimizer: Optimizer,
    /// `[block, block]`, 1.0 above the diagonal: the unfused attention's mask (dropout only).
    causal: Option<Tensor>,
}

thread_local! {
    // A component instance is one replica and single-threaded: the model lives here between
    // calls.
    static MODEL: RefCell<Option<Gpt>> = const { RefCell::new(None) };
}

/// Registers parameters in nanoGPT's `state_dict` order, each drawn from a seed of its own.
struct Registry {
    seed: u64,
    drawn: u64,
    names: Vec<String>,
}

impl Registry {
    /// A normal(0, std) parameter.
    fn normal(&mut self, name: String, shape: &[usize], std: f32) -> Result<Tensor> {
        self.drawn += 1;
        let init = ops::randn(shape, std, tensor_seed(self.seed, self.drawn))?;
        self.register(name, &init)
    }

    fn constant(&mut self, name: String, shape: &[usize], value: f32) -> Result<Tensor> {
        let init = ops::full(shape, value)?;
        self.register(name, &init)
    }

    fn register(&mut self, name: String, init: &Tensor) -> Result<Tensor> {
        let p = params::register(&name, init)?;
        self.names.push(name);
        Ok(p)
    }

    /// `{prefix}.weight` `[out, in]` (normal(0, std)) and, with biases, `{prefix}.bias` (zeros).
    fn linear(
        &mut self,
        prefix: &str,
        out: usize,
        inp: usize,
        std: f32,
        bias: bool,
    ) -> Result<Linear> {
        Ok(Linear {
            weight: self.normal(format!("{prefix}.weight"), &[out, inp], std)?,
            bias: match bias {
                true => Some(self.constant(format!("{prefix}.bias"), &[out], 0.0)?),
                false => None,
            },
        })
    }

    /// `{prefix}.weight` (ones) and, with biases, `{prefix}.bias` (zeros), both `[width]`.
    fn layer_norm(&mut self, prefix: &str, width: usize, bias: bool) -> Result<LayerNorm> {
        Ok(LayerNorm {
            weight: self.constant(format!("{prefix}.weight"), &[width], 1.0)?,
            bias: match bias {
                true => Some(self.constant(format!("{prefix}.bias"), &[width], 0.0)?),
                false => None,
            },
        })
    }
}

/// The seed of the `n`-th drawn tensor: SplitMix64's output function of the job's seed and `n`,
/// so the tensors are independent of each other and all follow from the job's seed.
fn tensor_seed(seed: u64, n: u64) -> u64 {
    let mut z = seed ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Gpt {
    fn new(config: Config, info: &RunInfo) -> std::result::Result<Gpt, String> {
        let block = match (info.sample_shape.as_slice(), info.label_shape.as_slice()) {
            ([b], [l]) if b == l && *b > 0 => *b as usize,
            _ => {
                return Err(format!(
                    "the gpt trainer needs text data (`format = \"text\"` in [train.data]): \
                     samples and labels of [block_size] tokens, not samples {:?} with labels {:?}",
                    info.sample_shape, info.label_shape
                ));
            }
        };
        let vocab = info.classes as usize;
        Gpt::build(config, info.seed, vocab, block).map_err(|e| describe(&e))
    }

    fn build(config: Config, seed: u64, vocab: usize, block: usize) -> Result<Gpt> {
        let (c, bias) = (config.embedding, config.bias);
        // nanoGPT: normal(0, 0.02) everywhere, the residual projections scaled down by
        // sqrt(2 * n_layer) (GPT-2), biases 0, layer-norm gains 1.
        let proj_std = INIT_STD / (2.0 * config.layers as f32).sqrt();
        let mut r = Registry {
            seed,
            drawn: 0,
            names: Vec::new(),
        };
        let wte = r.normal("transformer.wte.weight".into(), &[vocab, c], INIT_STD)?;
        let wpe = r.normal("transformer.wpe.weight".into(), &[block, c], INIT_STD)?;
        let mut blocks = Vec::with_capacity(config.layers);
        for i in 0..config.layers {
            let p = format!("transformer.h.{i}");
            blocks.push(Block {
                ln_1: r.layer_norm(&format!("{p}.ln_1"), c, bias)?,
                c_attn: r.linear(&format!("{p}.attn.c_attn"), 3 * c, c, INIT_STD, bias)?,
                attn_proj: r.linear(&format!("{p}.attn.c_proj"), c, c, proj_std, bias)?,
                ln_2: r.layer_norm(&format!("{p}.ln_2"), c, bias)?,
                c_fc: r.linear(&format!("{p}.mlp.c_fc"), 4 * c, c, INIT_STD, bias)?,
                mlp_proj: r.linear(&format!("{p}.mlp.c_proj"), c, 4 * c, proj_std, bias)?,
            });
        }
        let ln_f = r.layer_norm("transformer.ln_f", c, bias)?;

        // AdamW, matrices and embeddings decayed, gains and biases not (nanoGPT's two groups).
        let tensors = all_params(&wte, &wpe, &blocks, &ln_f);
        debug_assert_eq!(tensors.len(), r.names.len());
        let named: Vec<(String, &Tensor)> = r.names.into_iter().zip(tensors).collect();
        let lr = config.lr_at(0) as f32;
        let groups = decay_matrices_only(&named, lr, config.weight_decay);
        let optimizer = Optimizer::create_grouped(
            OptimizerConfig::Adam(AdamConfig {
                lr,
                beta1: config.beta1,
                beta2: config.beta2,
                eps: ADAM_EPS,
                weight_decay: config.weight_decay,
                decoupled: true,
            }),
            &groups,
        )?;
        let causal = match config.dropout > 0.0 {
            true => Some(ops::causal_mask(block)?),
            false => None,
        };
        Ok(Gpt {
            config,
            block,
            wte,
            wpe,
            blocks,
            ln_f,
            optimizer,
            causal,
        })
    }

    fn parameters(&self) -> usize {
        let numel = |t: &Tensor| t.shape().iter().map(|&d| d as usize).product::<usize>();
        all_params(&self.wte, &self.wpe, &self.blocks, &self.ln_f)
            .into_iter()
            .map(numel)
            .sum()
    }

    /// Dropout of `x` `[B * T, C]` (viewed as `[B, T, C]`, rows being samples) in training.
    fn dropout(&self, x: Tensor, b: usize, tt: usize, train: bool) -> Result<Tensor> {
        if !train || self.config.dropout == 0.0 {
            return Ok(x);
        }
        let y = ops::dropout(
            &ops::reshape(&x, &[b, tt, self.config.embedding])?,
            self.config.dropout,
        )?;
        ops::reshape(&y, &[b * tt, self.config.embedding])
    }

    /// Logits `[B, T, vocab]` for token ids `[B, T]` (`T <= block`).
    fn forward(&self, ids: &Tensor, train: bool) -> Result<Tensor> {
        let shape = ids.shape();
        let (b, tt) = (shape[0] as usize, shape[1] as usize);
        let c = self.config.embedding;
        let tok = ops::embedding(&self.wte, ids)?; // [B, T, C]
        let pos = ops::narrow(&self.wpe, 0, 0, tt)?; // [T, C], a view
        let x = ops::add(&tok, &pos)?;
        let mut x = self.dropout(ops::reshape(&x, &[b * tt, c])?, b, tt, train)?;
        for block in &self.blocks {
            let h = block.ln_1.forward(&x)?;
            let y = self.attention(block, &h, b, tt, train)?;
            x = ops::add(
                &x,
                &self.dropout(block.attn_proj.forward(&y)?, b, tt, train)?,
            )?;
            let h = block.ln_2.forward(&x)?;
            let h = ops::gelu(&block.c_fc.forward(&h)?)?;
            x = ops::add(
                &x,
                &self.dropout(block.mlp_proj.forward(&h)?, b, tt, train)?,
            )?;
        }
        let x = self.ln_f.forward(&x)?;
        // The tied head: x @ wte^T.
        let logits = t::matmul(&x, &self.wte, false, true)?; // [B * T, vocab]
        let vocab = self.wte.shape()[0] as usize;
        ops::reshape(&logits, &[b, tt, vocab])
    }

    /// Causal self-attention of `h` `[B * T, C]`, before `c_proj`: `[B * T, C]`.
    fn attention(
        &self,
        block: &Block,
        h: &Tensor,
        b: usize,
        tt: usize,
        train: bool,
    ) -> Result<Tensor> {
        let (c, heads) = (self.config.embedding, self.config.heads);
        let d = c / heads;
        let qkv = block.c_attn.forward(h)?; // [B * T, 3C]
        let qkv = ops::reshape(&qkv, &[b, tt, 3, heads, d])?;
        let qkv = ops::permute(&qkv, &[2, 0, 3, 1, 4])?; // [3, B, H, T, D], a view
        let qkv = ops::reshape(&qkv, &[3 * b, heads, tt, d])?; // the one copy
        let parts = ops::split(&qkv, &[b, b, b], 0)?;
        let (q, k, v) = (&parts[0], &parts[1], &parts[2]);
        let y = match (&self.causal, train) {
            (Some(mask), true) => {
                // Unfused, to drop attention weights as nanoGPT does.
                let att = t::matmul(q, k, false, true)?; // [B, H, T, T]
                let att = ops::scale(&att, 1.0 / (d as f32).sqrt())?;
                let mask = ops::narrow(&ops::narrow(mask, 0, 0, tt)?, 1, 0, tt)?;
                let att = ops::masked_fill(&att, &mask, f32::NEG_INFINITY)?;
                let att = ops::dropout(&ops::softmax(&att, -1)?, self.config.dropout)?;
                ops::matmul(&att, v)?
            }
            _ => ops::scaled_dot_product_attention(q, k, v, true, None, None)?,
        }; // [B, H, T, D]
        let y = t::transpose(&y, 1, 2)?; // [B, T, H, D]
        ops::reshape(&y, &[b * tt, c])
    }

    fn train_step(&mut self, step: &StepInfo) -> Result<f32> {
        let lr = self.config.lr_at(step.step);
        self.optimizer.set_lr(lr as f32)?;
        let batch = data::train_batch()?;
        let logits = self.forward(&batch.features, true)?;
        let loss = ops::cross_entropy(&logits, &batch.labels, None)?;
        self.optimizer.zero_grad();
        autograd::backward(&loss)?;
        // With several replicas, the gradients are averaged over them first.
        if self.config.grad_clip > 0.0 {
            let norm = self.optimizer.step_clipped(self.config.grad_clip)?;
            metrics::scalar("grad_norm", f64::from(norm));
        } else {
            self.optimizer.step()?;
        }
        metrics::scalar("lr", lr);
        loss.item()
    }

    fn eval_step(&self) -> Result<EvalReport> {
        let batch = data::eval_batch()?;
        let logits = self.forward(&batch.features, false)?;
        Ok(EvalReport {
            loss: ops::cross_entropy(&logits, &batch.labels, None)?.item()?,
            // The host shows no accuracy for text.
            correct: 0,
            rows: batch.rows,
        })
    }

    fn predict(&self, features: &Tensor) -> std::result::Result<Tensor, String> {
        match features.shape().as_slice() {
            [_, tt] if (1..=self.block).contains(&(*tt as usize)) => {}
            shape => {
                return Err(format!(
                    "gpt predict takes token ids [rows, t] with 1 <= t <= {} (the block size), not {shape:?}",
                    self.block
                ));
            }
        }
        self.forward(features, false).map_err(|e| describe(&e))
    }
}

/// Every parameter in registration order (the order of `Registry::names`).
fn all_params<'a>(
    wte: &'a Tensor,
    wpe: &'a Tensor,
    blocks: &'a [Block],
    ln_f: &'a LayerNorm,
) -> Vec<&'a Tensor> {
    fn norm<'a>(list: &mut Vec<&'a Tensor>, n: &'a LayerNorm) {
        list.push(&n.weight);
        list.extend(&n.bias);
    }
    fn linear<'a>(list: &mut Vec<&'a Tensor>, l: &'a Linear) {
        list.push(&l.weight);
        list.extend(&l.bias);
    }
    let mut list = vec![wte, wpe];
    for b in blocks {
        norm(&mut list, &b.ln_1);
        linear(&mut list, &b.c_attn);
        linear(&mut list, &b.attn_proj);
        norm(&mut list, &b.ln_2);
        linear(&mut list, &b.c_fc);
        linear(&mut list, &b.mlp_proj);
    }
    norm(&mut list, ln_f);
    list
}

/// `init-replica`: builds this replica's model and optimizer from `[train.config]`.
pub fn init(config: Vec<(String, String)>, info: RunInfo) -> std::result::Result<(), String> {
    let config = Config::parse(&config, info.total_steps)?;
    let model = Gpt::new(config, &info)?;
    if info.replica == 0 {
        let c = &model.config;
        metrics::log(
            metrics::Level::Info,
            &format!(
                "gpt: {} layers, {} heads, width {}, block {}, vocab {}, {} parameters{}; AdamW lr {} -> {} (warm-up {} steps, cosine decay to step {})",
                c.layers,
                c.heads,
                c.embedding,
                model.block,
                info.classes,
                model.parameters(),
                if c.bias { ", biases" } else { "" },
                c.lr as f32,
                c.min_lr as f32,
                c.warmup_steps,
                c.decay_steps
            ),
        );
    }
    MODEL.with(|m| *m.borrow_mut() = Some(model));
    Ok(())
}

/// `train-step`: one optimisation step on this replica's shard of the batch.
pub fn train_step(step: StepInfo) -> std::result::Result<f32, String> {
    with_model(|model| model.train_step(&step).map_err(|e| describe(&e)))
}

/// `eval-step`: the mean cross-entropy over the evaluation batch's tokens.
pub fn eval_step() -> std::result::Result<EvalReport, String> {
    with_model(|model| model.eval_step().map_err(|e| describe(&e)))
}

/// `inference.predict`: logits `[rows, t, vocab]` for token ids `[rows, t]`.
pub fn predict(features: Tensor) -> std::result::Result<Tensor, String> {
    with_model(|model| model.predict(&features))
}

fn with_model<T>(
    f: impl FnOnce(&mut Gpt) -> std::result::Result<T, String>,
) -> std::result::Result<T, String> {
    MODEL.with(|m| match m.borrow_mut().as_mut() {
        Some(model) => f(model),
        None => Err("called before init-replica".to_string()),
    })
}
