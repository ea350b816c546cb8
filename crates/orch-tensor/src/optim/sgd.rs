//! Stochastic gradient descent with momentum, Nesterov momentum and L2 weight decay
//! (PyTorch's `torch.optim.SGD` with dampening 0).

use super::{Optimizer, apply, check_hyper, check_params};
use crate::error::Result;
use crate::ops::UpdateOp;
use crate::tensor::Tensor;

/// Hyper-parameters. Per step: `d = g + weight_decay * p`; with momentum `b = momentum * b + d`
/// and `d = b` (or `d + momentum * b` for Nesterov); then `p -= lr * d`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SgdConfig {
    pub lr: f32,
    pub momentum: f32,
    pub nesterov: bool,
    pub weight_decay: f32,
}

impl SgdConfig {
    /// Plain SGD with learning rate `lr`.
    pub fn new(lr: f32) -> Self {
        SgdConfig {
            lr,
            momentum: 0.0,
            nesterov: false,
            weight_decay: 0.0,
        }
    }
}

/// SGD over a fixed list of parameters.
#[derive(Debug)]
pub struct Sgd {
    params: Vec<Tensor>,
    config: SgdConfig,
    momentum: Vec<Option<Tensor>>,
}

impl Sgd {
    pub fn new(params: Vec<Tensor>, config: SgdConfig) -> Result<Sgd> {
        check_params("sgd", &params)?;
        check_hyper("sgd", "lr", config.lr, config.lr >= 0.0)?;
        check_hyper("sgd", "momentum", config.momentum, config.momentum >= 0.0)?;
        check_hyper(
            "sgd",
            "weight_decay",
            config.weight_decay,
            config.weight_decay >= 0.0,
        )?;
        check_hyper(
            "sgd",
            "momentum (nesterov needs momentum > 0)",
            config.momentum,
            !config.nesterov || config.momentum > 0.0,
        )?;
        let momentum = vec![None; params.len()];
        Ok(Sgd {
            params,
            config,
            momentum,
        })
    }

    pub fn config(&self) -> SgdConfig {
        self.config
    }

    /// Each parameter's momentum buffer, `None` before its first step (or without momentum):
    /// what a checkpoint saves.
    pub fn momentum_buffers(&self) -> &[Option<Tensor>] {
        &self.momentum
    }

    /// Sets parameter `index`'s momentum buffer to a copy of `values` in the parameter's pool
    /// (a checkpoint being loaded).
    pub fn set_momentum_buffer(&mut self, index: usize, values: &Tensor) -> Result<()> {
        let buffer = super::state_copy("sgd", &self.params, index, values)?;
        self.momentum[index] = Some(buffer);
        Ok(())
    }
}

impl Optimizer for Sgd {
    fn step(&mut self) -> Result<()> {
        let grads: Vec<Option<Tensor>> = self.params.iter().map(Tensor::grad).collect();
        if self.config.momentum != 0.0 {
            for ((p, g), buf) in self.params.iter().zip(&grads).zip(self.momentum.iter_mut()) {
                if g.is_some() && buf.is_none() {
                    *buf = Some(p.zeros_like()?);
                }
            }
        }
        let SgdConfig {
            lr,
            momentum,
            nesterov,
            weight_decay,
        } = self.config;
        let op = UpdateOp::Sgd {
            lr,
            momentum,
            weight_decay,
            nesterov,
        };
        for ((p, g), buf) in self.params.iter().zip(&grads).zip(&self.momentum) {
            if let Some(g) = g {
                let buf = if momentum != 0.0 { buf.as_ref() } else { None };
                apply(op, p, g, buf, None)?;
            }
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
