//! `[train.config]` of the `mlp` trainer, parsed with a clear message for each bad key.

/// Which optimizer updates the weights.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum OptimizerKind {
    Sgd,
    Adam,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub hidden: Vec<u32>,
    pub optimizer: OptimizerKind,
    pub lr: f32,
    pub momentum: f32,
    pub weight_decay: f32,
    pub lr_decay: f32,
}

impl Config {
    pub fn parse(pairs: &[(String, String)]) -> Result<Config, String> {
        let get = |key: &str| pairs.iter().find(|(k, _)| k == key).map(|(_, v)| v.trim());
        let number = |key: &str, default: f32| -> Result<f32, String> {
            match get(key) {
                None => Ok(default),
                Some(v) => v
                    .parse::<f32>()
                    .ok()
                    .filter(|x| x.is_finite() && *x >= 0.0)
                    .ok_or_else(|| format!("config `{key}` = \"{v}\" is not a number >= 0")),
            }
        };
        for (key, _) in pairs {
            const KNOWN: [&str; 6] = [
                "hidden",
                "optimizer",
                "lr",
                "momentum",
                "weight_decay",
                "lr_decay",
            ];
            if !KNOWN.contains(&key.as_str()) {
                return Err(format!(
                    "unknown config key `{key}` (the mlp trainer knows {})",
                    KNOWN.join(", ")
                ));
            }
        }
        let hidden = match get("hidden") {
            None => vec![512, 256],
            Some("") => Vec::new(),
            Some(list) => list
                .split(',')
                .map(|w| w.trim().parse::<u32>().ok().filter(|w| *w > 0))
                .collect::<Option<Vec<u32>>>()
                .ok_or_else(|| {
                    format!(
                        "config `hidden` = \"{list}\" is not a list of widths such as \"512,256\""
                    )
                })?,
        };
        let optimizer = match get("optimizer") {
            None | Some("sgd") => OptimizerKind::Sgd,
            Some("adam") => OptimizerKind::Adam,
            Some(other) => {
                return Err(format!(
                    "config `optimizer` = \"{other}\": use \"sgd\" or \"adam\""
                ));
            }
        };
        let default_lr = match optimizer {
            OptimizerKind::Sgd => 0.05,
            OptimizerKind::Adam => 0.001,
        };
        Ok(Config {
            hidden,
            optimizer,
            lr: number("lr", default_lr)?,
            momentum: number("momentum", 0.9)?,
            weight_decay: number("weight_decay", 0.0)?,
            lr_decay: number("lr_decay", 1.0)?,
        })
    }
}
