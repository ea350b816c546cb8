//! `[train.config]` of the `cnn` trainer, parsed with a sentence for each bad key: the key, the
//! value given and what is allowed.
//!
//! Every key is optional; [`Config::parse`] of nothing is a small LeNet-like network
//! (`channels = "16,32"`, 5x5 kernels, 2x2 max pooling, no hidden layer, Adam at 1e-3), the
//! reference model `cnn-small`.

/// How each convolution block ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pool {
    /// 2x2 max pooling, stride 2 (`F.max_pool2d(x, 2)`).
    Max,
    /// 2x2 average pooling, stride 2 (`F.avg_pool2d(x, 2)`).
    Avg,
    /// No pooling: the block keeps the image's size.
    None,
}

/// Which optimizer updates the parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OptimizerKind {
    /// PyTorch's `SGD` (with `momentum`).
    Sgd,
    /// PyTorch's `Adam` (L2 weight decay added to the gradient).
    Adam,
    /// PyTorch's `AdamW` (decoupled weight decay).
    AdamW,
}

/// How the learning rate moves over the run (after the optional linear warm-up).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Schedule {
    /// `lr` throughout.
    Constant,
    /// Half a cosine from `lr` down to `lr_min` over the run's training steps.
    Cosine { lr_min: f32 },
    /// `lr * gamma ^ (epoch / every)` (PyTorch's `StepLR` stepped once per epoch).
    Step { every: u32, gamma: f32 },
}

#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Output channels of each convolution block, in order.
    pub channels: Vec<u32>,
    /// The (odd) side of every convolution kernel; padding is `kernel / 2`.
    pub kernel: u32,
    pub pool: Pool,
    pub batch_norm: bool,
    /// Widths of the hidden linear layers between the flattened features and the classes.
    pub hidden: Vec<u32>,
    /// Dropout probability before every linear layer (0: none).
    pub dropout: f32,
    pub optimizer: OptimizerKind,
    pub lr: f32,
    pub momentum: f32,
    pub nesterov: bool,
    pub weight_decay: f32,
    pub schedule: Schedule,
    pub warmup_steps: u64,
    /// Clip the global gradient norm to this (0: no clipping).
    pub max_grad_norm: f32,
    /// `[C, H, W]` to read each sample as, when the data set's own sample shape is flat.
    pub input_shape: Option<[u32; 3]>,
}

/// Every key [`Config::parse`] knows.
pub const KNOWN: [&str; 18] = [
    "channels",
    "kernel",
    "pool",
    "batch_norm",
    "hidden",
    "dropout",
    "optimizer",
    "lr",
    "momentum",
    "nesterov",
    "weight_decay",
    "lr_schedule",
    "lr_min",
    "lr_step_epochs",
    "lr_gamma",
    "warmup_steps",
    "max_grad_norm",
    "input_shape",
];

impl Config {
    pub fn parse(pairs: &[(String, String)]) -> Result<Config, String> {
        for (key, _) in pairs {
            if !KNOWN.contains(&key.as_str()) {
                return Err(format!(
                    "unknown config key `{key}` (the cnn trainer knows {})",
                    KNOWN.join(", ")
                ));
            }
        }
        let get = |key: &str| pairs.iter().find(|(k, _)| k == key).map(|(_, v)| v.trim());

        let channels = match get("channels") {
            None => vec![16, 32],
            Some(list) => widths(list).filter(|w| !w.is_empty()).ok_or_else(|| {
                format!(
                    "config `channels` = \"{list}\" is not a list of one or more channel counts \
                     such as \"16,32\""
                )
            })?,
        };
        let kernel = match get("kernel") {
            None => 5,
            Some(v) => v
                .parse::<u32>()
                .ok()
                .filter(|k| k % 2 == 1)
                .ok_or_else(|| {
                    format!(
                        "config `kernel` = \"{v}\" is not an odd kernel size such as 3 or 5 \
                         (the padding is kernel / 2, which keeps the image's size only for odd \
                         kernels)"
                    )
                })?,
        };
        let pool = match get("pool") {
            None | Some("max") => Pool::Max,
            Some("avg") => Pool::Avg,
            Some("none") => Pool::None,
            Some(other) => {
                return Err(format!(
                    "config `pool` = \"{other}\": use \"max\", \"avg\" or \"none\""
                ));
            }
        };
        let batch_norm = boolean(get("batch_norm"), "batch_norm")?;
        let hidden = match get("hidden") {
            None | Some("") => Vec::new(),
            Some(list) => widths(list).ok_or_else(|| {
                format!(
                    "config `hidden` = \"{list}\" is not a list of layer widths such as \"128\" \
                     or \"256,128\" (or \"\" for none)"
                )
            })?,
        };
        let dropout = number(get("dropout"), "dropout", 0.0)?;
        if dropout >= 1.0 {
            return Err(format!(
                "config `dropout` = {dropout} is not a probability in [0, 1)"
            ));
        }
        let optimizer = match get("optimizer") {
            None | Some("adam") => OptimizerKind::Adam,
            Some("adamw") => OptimizerKind::AdamW,
            Some("sgd") => OptimizerKind::Sgd,
            Some(other) => {
                return Err(format!(
                    "config `optimizer` = \"{other}\": use \"adam\", \"adamw\" or \"sgd\""
                ));
            }
        };
        let (default_lr, default_decay) = match optimizer {
            OptimizerKind::Adam => (1e-3, 0.0),
            // PyTorch's AdamW default.
            OptimizerKind::AdamW => (1e-3, 0.01),
            OptimizerKind::Sgd => (0.05, 0.0),
        };
        let lr = number(get("lr"), "lr", default_lr)?;
        if lr == 0.0 {
            return Err("config `lr` = 0 would never change the model: give a rate > 0".into());
        }
        let lr_min = number(get("lr_min"), "lr_min", 0.0)?;
        let schedule = match get("lr_schedule") {
            None | Some("constant") => Schedule::Constant,
            Some("cosine") => {
                if lr_min > lr {
                    return Err(format!(
                        "config `lr_min` = {lr_min} is above `lr` = {lr}: the cosine schedule \
                         decays from lr to lr_min"
                    ));
                }
                Schedule::Cosine { lr_min }
            }
            Some("step") => {
                let every = integer(get("lr_step_epochs"), "lr_step_epochs", 1)?;
                if every == 0 {
                    return Err(
                        "config `lr_step_epochs` = 0: give the epochs between decays, 1 or more"
                            .into(),
                    );
                }
                let every = u32::try_from(every).map_err(|_| {
                    format!("config `lr_step_epochs` = {every} is more epochs than a run has")
                })?;
                Schedule::Step {
                    every,
                    gamma: number(get("lr_gamma"), "lr_gamma", 0.1)?,
                }
            }
            Some(other) => {
                return Err(format!(
                    "config `lr_schedule` = \"{other}\": use \"constant\", \"cosine\" or \"step\""
                ));
            }
        };
        let input_shape = match get("input_shape") {
            None | Some("") => None,
            Some(list) => Some(
                widths(list)
                    .and_then(|w| <[u32; 3]>::try_from(w).ok())
                    .ok_or_else(|| {
                        format!(
                            "config `input_shape` = \"{list}\" is not an image shape \
                             \"channels,height,width\" such as \"1,8,8\""
                        )
                    })?,
            ),
        };
        // Keys that only one choice reads are refused with the others: a `lr_gamma` beside a
        // cosine schedule would otherwise be silently ignored.
        let only = |key: &str, applies: bool, to: &str| match get(key) {
            Some(_) if !applies => Err(format!("config `{key}` applies only to {to}")),
            _ => Ok(()),
        };
        let sgd = optimizer == OptimizerKind::Sgd;
        let cosine = matches!(schedule, Schedule::Cosine { .. });
        let step = matches!(schedule, Schedule::Step { .. });
        only(
            "momentum",
            sgd,
            "optimizer = \"sgd\" (Adam's betas are PyTorch's defaults, 0.9 and 0.999)",
        )?;
        only("nesterov", sgd, "optimizer = \"sgd\"")?;
        only("lr_min", cosine, "lr_schedule = \"cosine\"")?;
        only("lr_step_epochs", step, "lr_schedule = \"step\"")?;
        only("lr_gamma", step, "lr_schedule = \"step\"")?;
        let momentum = number(get("momentum"), "momentum", 0.9)?;
        let nesterov = boolean(get("nesterov"), "nesterov")?;
        if nesterov && momentum == 0.0 {
            return Err("config `nesterov` = true needs a `momentum` above 0".into());
        }
        Ok(Config {
            channels,
            kernel,
            pool,
            batch_norm,
            hidden,
            dropout,
            optimizer,
            lr,
            momentum,
            nesterov,
            weight_decay: number(get("weight_decay"), "weight_decay", default_decay)?,
            schedule,
            warmup_steps: integer(get("warmup_steps"), "warmup_steps", 0)?,
            max_grad_norm: number(get("max_grad_norm"), "max_grad_norm", 0.0)?,
            input_shape,
        })
    }

    /// The learning rate of the step that has `step` steps before it, in (0-based) `epoch`, in
    /// a run of `total` steps: a linear warm-up over `warmup_steps`, then the schedule.
    /// Computed from the step alone, so a resumed run gets the same rates. A `total` of 0 (no
    /// training planned) or within the warm-up leaves the cosine at `lr`.
    pub fn lr_at(&self, step: u64, epoch: u32, total: u64) -> f32 {
        if step < self.warmup_steps {
            return self.lr * (step + 1) as f32 / self.warmup_steps as f32;
        }
        match self.schedule {
            Schedule::Constant => self.lr,
            Schedule::Cosine { lr_min } => {
                let span = total.saturating_sub(self.warmup_steps);
                if span == 0 {
                    return self.lr;
                }
                let progress = ((step - self.warmup_steps) as f64 / span as f64).min(1.0);
                let cos = 0.5 * (1.0 + (std::f64::consts::PI * progress).cos());
                (f64::from(lr_min) + f64::from(self.lr - lr_min) * cos) as f32
            }
            Schedule::Step { every, gamma } => {
                self.lr * gamma.powi(i32::try_from(epoch / every).unwrap_or(i32::MAX))
            }
        }
    }

    /// Whether the learning rate ever differs from `lr`.
    pub fn scheduled(&self) -> bool {
        self.warmup_steps > 0 || self.schedule != Schedule::Constant
    }
}

/// Positive integers separated by commas, or `None` when one is not.
fn widths(list: &str) -> Option<Vec<u32>> {
    list.split(',')
        .map(|w| w.trim().parse::<u32>().ok().filter(|w| *w > 0))
        .collect()
}

fn number(value: Option<&str>, key: &str, default: f32) -> Result<f32, String> {
    match value {
        None => Ok(default),
        Some(v) => v
            .parse::<f32>()
            .ok()
            .filter(|x| x.is_finite() && *x >= 0.0)
            .ok_or_else(|| format!("config `{key}` = \"{v}\" is not a number >= 0")),
    }
}

fn integer(value: Option<&str>, key: &str, default: u64) -> Result<u64, String> {
    match value {
        None => Ok(default),
        Some(v) => v
            .parse::<u64>()
            .map_err(|_| format!("config `{key}` = \"{v}\" is not a whole number >= 0")),
    }
}

fn boolean(value: Option<&str>, key: &str) -> Result<bool, String> {
    match value {
        None | Some("false") => Ok(false),
        Some("true") => Ok(true),
        Some(other) => Err(format!("config `{key}` = \"{other}\": use true or false")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(pairs: &[(&str, &str)]) -> Result<Config, String> {
        let pairs: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::parse(&pairs)
    }

    #[test]
    fn defaults_are_cnn_small() {
        let c = parse(&[]).unwrap();
        assert_eq!(c.channels, [16, 32]);
        assert_eq!((c.kernel, c.pool, c.batch_norm), (5, Pool::Max, false));
        assert!(c.hidden.is_empty());
        assert_eq!(
            (c.optimizer, c.lr, c.weight_decay),
            (OptimizerKind::Adam, 1e-3, 0.0)
        );
        assert!(!c.scheduled());
    }

    #[test]
    fn errors_name_the_key_and_what_is_allowed() {
        let err = |pairs: &[(&str, &str)]| parse(pairs).unwrap_err();
        assert!(err(&[("chanels", "8")]).contains("unknown config key `chanels`"));
        assert!(err(&[("channels", "")]).contains("`channels`"));
        assert!(err(&[("channels", "16,x")]).contains("\"16,32\""));
        assert!(err(&[("kernel", "4")]).contains("odd"));
        assert!(err(&[("pool", "mean")]).contains("\"max\", \"avg\" or \"none\""));
        assert!(err(&[("batch_norm", "yes")]).contains("true or false"));
        assert!(err(&[("dropout", "1")]).contains("[0, 1)"));
        assert!(err(&[("optimizer", "lamb")]).contains("\"adamw\""));
        assert!(err(&[("lr", "-1")]).contains("`lr`"));
        assert!(err(&[("lr", "0")]).contains("`lr` = 0"));
        assert!(err(&[("lr_schedule", "linear")]).contains("\"cosine\""));
        assert!(err(&[("lr_schedule", "step"), ("lr_step_epochs", "0")]).contains("1 or more"));
        assert!(err(&[("warmup_steps", "1.5")]).contains("whole number"));
        assert!(err(&[("input_shape", "8,8")]).contains("channels,height,width"));
        assert!(err(&[("momentum", "0.9")]).contains("applies only to optimizer = \"sgd\""));
        assert!(err(&[("lr_gamma", "0.5")]).contains("applies only to lr_schedule = \"step\""));
        assert!(err(&[("lr_min", "0")]).contains("applies only to lr_schedule = \"cosine\""));
        assert!(
            err(&[
                ("optimizer", "sgd"),
                ("momentum", "0"),
                ("nesterov", "true")
            ])
            .contains("needs a `momentum`")
        );
        let sgd = parse(&[("optimizer", "sgd"), ("nesterov", "true")]).unwrap();
        assert_eq!((sgd.lr, sgd.momentum, sgd.nesterov), (0.05, 0.9, true));
    }

    #[test]
    fn schedules() {
        let c = parse(&[
            ("lr", "1"),
            ("lr_schedule", "cosine"),
            ("warmup_steps", "10"),
        ])
        .unwrap();
        assert_eq!(c.lr_at(0, 0, 110), 0.1);
        assert_eq!(c.lr_at(9, 0, 110), 1.0);
        assert_eq!(c.lr_at(10, 0, 110), 1.0);
        assert!((c.lr_at(60, 0, 110) - 0.5).abs() < 1e-6);
        assert!(c.lr_at(110, 0, 110).abs() < 1e-6);
        assert_eq!(c.lr_at(50, 0, 0), 1.0, "no total (predict): no decay");
        let s = parse(&[
            ("lr", "1"),
            ("lr_schedule", "step"),
            ("lr_step_epochs", "2"),
        ])
        .unwrap();
        assert_eq!(
            [0, 1, 2, 3, 4].map(|e| s.lr_at(100, e, 1000)),
            [1.0, 1.0, 0.1, 0.1, 0.1f32.powi(2)]
        );
    }
}
