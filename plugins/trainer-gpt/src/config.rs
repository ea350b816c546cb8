//! `[train.config]` of the `gpt` trainer, parsed with a sentence naming the key for each bad
//! value, and the learning-rate schedule it describes.
//!
//! Design decision: the defaults are nanoGPT's `config/train_shakespeare_char.py` as its README
//! runs it on a CPU (4 layers, 4 heads, 128 wide, no dropout, no biases, lr 1e-3 decayed to
//! 1e-4, 100 warm-up steps, betas 0.9 / 0.99, weight decay 0.1, clipping at 1.0), so a job file
//! that names only the data trains the model nanoGPT's README trains. `decay_steps` defaults to
//! the run's `total-steps` (nanoGPT's `lr_decay_iters = max_iters`).

/// Every key the trainer reads; any other is refused (a typo must not silently train with a
/// default).
pub const KEYS: [&str; 13] = [
    "layers",
    "heads",
    "embedding",
    "dropout",
    "bias",
    "lr",
    "min_lr",
    "warmup_steps",
    "decay_steps",
    "weight_decay",
    "beta1",
    "beta2",
    "grad_clip",
];

#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Transformer blocks (nanoGPT `n_layer`).
    pub layers: usize,
    /// Attention heads per block (`n_head`); divides `embedding`.
    pub heads: usize,
    /// Width of the residual stream (`n_embd`).
    pub embedding: usize,
    /// Dropout probability after the embeddings, on the attention weights and on both
    /// residual branches (`dropout`); 0 is no dropout.
    pub dropout: f32,
    /// Biases in the linear layers and layer norms (`bias`).
    pub bias: bool,
    /// Peak learning rate, reached after the warm-up (`learning_rate`).
    pub lr: f64,
    /// Learning rate at the end of the cosine decay and after it (`min_lr`).
    pub min_lr: f64,
    /// Steps of linear warm-up (`warmup_iters`).
    pub warmup_steps: u64,
    /// The step the cosine decay ends at (`lr_decay_iters`).
    pub decay_steps: u64,
    /// AdamW's decoupled weight decay, on matrices and embeddings only (`weight_decay`).
    pub weight_decay: f32,
    pub beta1: f32,
    pub beta2: f32,
    /// Largest global gradient norm before clipping (`grad_clip`); 0 turns clipping off.
    pub grad_clip: f32,
}

impl Config {
    /// The configuration from `[train.config]`'s pairs; `total_steps` is the run's length (the
    /// default `decay_steps`).
    pub fn parse(pairs: &[(String, String)], total_steps: u64) -> Result<Config, String> {
        for (key, _) in pairs {
            if !KEYS.contains(&key.as_str()) {
                return Err(format!(
                    "unknown config key `{key}` (the gpt trainer knows {})",
                    KEYS.join(", ")
                ));
            }
        }
        let get = |key: &str| pairs.iter().find(|(k, _)| k == key).map(|(_, v)| v.trim());
        let count = |key: &str, default: usize, least: usize| -> Result<usize, String> {
            match get(key) {
                None => Ok(default),
                Some(v) => v
                    .parse::<usize>()
                    .ok()
                    .filter(|n| *n >= least && *n <= 1 << 20)
                    .ok_or_else(|| {
                        format!("config `{key}` = \"{v}\" is not a whole number >= {least}")
                    }),
            }
        };
        let steps = |key: &str, default: u64| -> Result<u64, String> {
            match get(key) {
                None => Ok(default),
                Some(v) => v.parse::<u64>().map_err(|_| {
                    format!("config `{key}` = \"{v}\" is not a whole number of steps >= 0")
                }),
            }
        };
        // A number in `range` (its text in the message says which bounds are open).
        let number = |key: &str, default: f64, ok: fn(f64) -> bool, range: &str| match get(key) {
            None => Ok(default),
            Some(v) => v
                .parse::<f64>()
                .ok()
                .filter(|x| x.is_finite() && ok(*x))
                .ok_or_else(|| format!("config `{key}` = \"{v}\" is not a number {range}")),
        };
        let probability = |x: f64| (0.0..1.0).contains(&x);
        let non_negative = |x: f64| x >= 0.0;

        let layers = count("layers", 4, 1)?;
        let heads = count("heads", 4, 1)?;
        let embedding = count("embedding", 128, 1)?;
        if embedding % heads != 0 {
            return Err(format!(
                "config `embedding` = {embedding} is not a multiple of `heads` = {heads}: every head \
                 takes embedding / heads of the width"
            ));
        }
        let bias = match get("bias") {
            None | Some("false") => false,
            Some("true") => true,
            Some(other) => {
                return Err(format!("config `bias` = \"{other}\" is not true or false"));
            }
        };
        let lr = number("lr", 1e-3, |x| x > 0.0, "> 0")?;
        let min_lr = number("min_lr", lr / 10.0, non_negative, ">= 0")?;
        if min_lr > lr {
            return Err(format!(
                "config `min_lr` = {min_lr} is above `lr` = {lr}: the schedule decays from lr to min_lr"
            ));
        }
        Ok(Config {
            layers,
            heads,
            embedding,
            dropout: number("dropout", 0.0, probability, "in [0, 1)")? as f32,
            bias,
            lr,
            min_lr,
            warmup_steps: steps("warmup_steps", 100)?,
            decay_steps: steps("decay_steps", total_steps)?,
            weight_decay: number("weight_decay", 0.1, non_negative, ">= 0")? as f32,
            beta1: number("beta1", 0.9, probability, "in [0, 1)")? as f32,
            beta2: number("beta2", 0.99, probability, "in [0, 1)")? as f32,
            grad_clip: number("grad_clip", 1.0, non_negative, ">= 0 (0: no clipping)")? as f32,
        })
    }

    /// The learning rate of step `it` (steps done before it), nanoGPT's `get_lr`: linear
    /// warm-up `lr * (it + 1) / (warmup + 1)` over the first `warmup_steps`, then a cosine from
    /// `lr` down to `min_lr` at `decay_steps`, `min_lr` after.
    pub fn lr_at(&self, it: u64) -> f64 {
        if it < self.warmup_steps {
            return self.lr * (it + 1) as f64 / (self.warmup_steps + 1) as f64;
        }
        // nanoGPT returns min_lr for it > decay; at it == decay its cosine is min_lr too, and
        // taking that branch here leaves out the 0 / 0 of decay == warmup.
        if it >= self.decay_steps {
            return self.min_lr;
        }
        let ratio = (it - self.warmup_steps) as f64 / (self.decay_steps - self.warmup_steps) as f64;
        let coeff = 0.5 * (1.0 + (std::f64::consts::PI * ratio).cos());
        self.min_lr + coeff * (self.lr - self.min_lr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn defaults_are_nanogpts_cpu_run() {
        let c = Config::parse(&[], 2000).unwrap();
        assert_eq!((c.layers, c.heads, c.embedding, c.bias), (4, 4, 128, false));
        assert_eq!(
            (c.lr, c.min_lr, c.warmup_steps, c.decay_steps),
            (1e-3, 1e-4, 100, 2000)
        );
        assert_eq!(
            (c.weight_decay, c.beta1, c.beta2, c.grad_clip),
            (0.1, 0.9, 0.99, 1.0)
        );
        assert_eq!(c.dropout, 0.0);
    }

    #[test]
    fn bad_keys_and_values_are_sentences_naming_the_key() {
        let err = Config::parse(&pairs(&[("layer", "2")]), 10).unwrap_err();
        assert!(err.contains("unknown config key `layer`"), "{err}");
        let err = Config::parse(&pairs(&[("heads", "3")]), 10).unwrap_err();
        assert!(
            err.contains("`embedding` = 128 is not a multiple of `heads` = 3"),
            "{err}"
        );
        let err = Config::parse(&pairs(&[("dropout", "1")]), 10).unwrap_err();
        assert!(err.contains("`dropout`"), "{err}");
        let err = Config::parse(&pairs(&[("bias", "yes")]), 10).unwrap_err();
        assert!(err.contains("`bias`"), "{err}");
        let err = Config::parse(&pairs(&[("lr", "1e-4"), ("min_lr", "1e-3")]), 10).unwrap_err();
        assert!(err.contains("`min_lr`"), "{err}");
    }

    #[test]
    fn schedule_is_nanogpts_get_lr() {
        let c = Config::parse(&pairs(&[("warmup_steps", "100")]), 2000).unwrap();
        assert!((c.lr_at(0) - 1e-3 / 101.0).abs() < 1e-15);
        assert!((c.lr_at(99) - 1e-3 * 100.0 / 101.0).abs() < 1e-15);
        assert!((c.lr_at(100) - 1e-3).abs() < 1e-15);
        assert!((c.lr_at(1050) - 5.5e-4).abs() < 1e-12);
        assert_eq!(c.lr_at(2000), 1e-4);
        assert_eq!(c.lr_at(5000), 1e-4);
        let flat = Config::parse(&pairs(&[("warmup_steps", "0"), ("decay_steps", "0")]), 9);
        assert_eq!(flat.unwrap().lr_at(0), 1e-4);
    }
}
