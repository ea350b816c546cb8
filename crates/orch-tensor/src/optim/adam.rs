//! Adam (Kingma and Ba) and AdamW (decoupled weight decay, Loshchilov and Hutter), with the
//! same update as PyTorch's `torch.optim.Adam` / `AdamW` (amsgrad off).

use super::{Optimizer, apply, check_hyper, check_params};
use crate::error::Result;
use crate::ops::UpdateOp;
use crate::tensor::Tensor;

/// Hyper-parameters. `decoupled` selects AdamW (`p -= lr * weight_decay * p` before the Adam
/// step) instead of L2 decay added to the gradient.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamConfig {
    pub lr: f32,
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
    pub weight_decay: f32,
    pub decoupled: bool,
}

impl AdamConfig {
    /// Adam with PyTorch's defaults (betas 0.9, 0.999; eps 1e-8; no weight decay).
    pub fn adam(lr: f32) -> Self {
        AdamConfig {
            lr,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.0,
            decoupled: false,
        }
    }

    /// AdamW with PyTorch's defaults and the given decoupled weight decay.
    pub fn adamw(lr: f32, weight_decay: f32) -> Self {
        AdamConfig {
            weight_decay,
            decoupled: true,
            ..AdamConfig::adam(lr)
        }
    }
}

#[derive(Debug)]
struct State {
    m: Tensor,
    v: Tensor,
    steps: u32,
}

/// Adam or AdamW over a fixed list of parameters.
#[derive(Debug)]
pub struct Adam {
    params: Vec<Tensor>,
    config: AdamConfig,
    state: Vec<Option<State>>,
}

impl Adam {
    pub fn new(params: Vec<Tensor>, config: AdamConfig) -> Result<Adam> {
        check_params("adam", &params)?;
        check_hyper("adam", "lr", config.lr, config.lr >= 0.0)?;
        check_hyper(
            "adam",
            "beta1",
            config.beta1,
            (0.0..1.0).contains(&config.beta1),
        )?;
        check_hyper(
            "adam",
            "beta2",
            config.beta2,
            (0.0..1.0).contains(&config.beta2),
        )?;
        check_hyper("adam", "eps", config.eps, config.eps >= 0.0)?;
        check_hyper(
            "adam",
            "weight_decay",
            config.weight_decay,
            config.weight_decay >= 0.0,
        )?;
        let state = params.iter().map(|_| None).collect();
        Ok(Adam {
            params,
            config,
            state,
        })
    }

    pub fn config(&self) -> AdamConfig {
        self.config
    }

    /// Each parameter's first and second moments and step count, `None` before its first
    /// step: what a checkpoint saves.
    pub fn moments(&self) -> Vec<Option<(Tensor, Tensor, u32)>> {
        self.state
            .iter()
            .map(|s| s.as_ref().map(|s| (s.m.clone(), s.v.clone(), s.steps)))
            .collect()
    }

    /// Sets parameter `index`'s moments (copies in the parameter's pool) and step count (a
    /// checkpoint being loaded).
    pub fn set_moments(&mut self, index: usize, m: &Tensor, v: &Tensor, steps: u32) -> Result<()> {
        let m = super::state_copy("adam", &self.params, index, m)?;
        let v = super::state_copy("adam", &self.params, index, v)?;
        self.state[index] = Some(State { m, v, steps });
        Ok(())
    }
}

impl Optimizer for Adam {
    fn step(&mut self) -> Result<()> {
        let grads: Vec<Option<Tensor>> = self.params.iter().map(Tensor::grad).collect();
        for ((p, g), state) in self.params.iter().zip(&grads).zip(self.state.iter_mut()) {
            if g.is_some() && state.is_none() {
                *state = Some(State {
                    m: p.zeros_like()?,
                    v: p.zeros_like()?,
                    steps: 0,
                });
            }
        }
        let c = self.config;
        for ((p, g), state) in self.params.iter().zip(&grads).zip(self.state.iter_mut()) {
            let (Some(g), Some(state)) = (g, state.as_mut()) else {
                continue;
            };
            let t = state.steps.saturating_add(1);
            let bias1 = (1.0 - (c.beta1 as f64).powi(t as i32)) as f32;
            let bias2 = (1.0 - (c.beta2 as f64).powi(t as i32)) as f32;
            let op = UpdateOp::Adam {
                lr: c.lr,
                beta1: c.beta1,
                beta2: c.beta2,
                eps: c.eps,
                weight_decay: c.weight_decay,
                decoupled: c.decoupled,
                bias1,
                bias2,
            };
            apply(op, p, g, Some(&state.m), Some(&state.v))?;
            state.steps = t;
        }
        Ok(())
    }

    fn params(&self) -> &[Tensor] {
        &self.params
    }

    fn lr(&self) -> f32 {
        self.config.lr
    }

    fn set_lr(&mut self, lr: f32) {
        self.config.lr = lr;
    }
}
