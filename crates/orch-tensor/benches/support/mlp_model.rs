//! The benchmark MLP (shared by the CPU and GPU benchmarks).

use orch_tensor::optim::{Optimizer, Sgd, SgdConfig};
use orch_tensor::{MemoryPool, Tensor};
use std::sync::Arc;

#[derive(Debug)]
pub struct Mlp {
    x: Tensor,
    y: Tensor,
    layers: Vec<(Tensor, Tensor)>,
    sgd: Sgd,
    last_loss: Option<Tensor>,
}

impl Mlp {
    pub fn new(pool: &Arc<MemoryPool>, batch: usize) -> orch_tensor::Result<Mlp> {
        let sizes = [784, 512, 256, 10];
        let mut layers = Vec::new();
        for (i, pair) in sizes.windows(2).enumerate() {
            let scale = (2.0 / pair[0] as f32).sqrt();
            let w = Tensor::randn(&[pair[0], pair[1]], i as u64, pool)?
                .mul_scalar(scale)?
                .with_requires_grad();
            let b = Tensor::zeros(&[pair[1]], pool)?.with_requires_grad();
            layers.push((w, b));
        }
        let params = layers
            .iter()
            .flat_map(|(w, b)| [w.clone(), b.clone()])
            .collect();
        let sgd = Sgd::new(
            params,
            SgdConfig {
                momentum: 0.9,
                ..SgdConfig::new(0.01)
            },
        )?;
        let x = Tensor::randn(&[batch, 784], 100, pool)?;
        let labels: Vec<f32> = (0..batch).map(|i| ((i * 7919) % 10) as f32).collect();
        let y = Tensor::from_vec(labels, &[batch], pool)?;
        Ok(Mlp {
            x,
            y,
            layers,
            sgd,
            last_loss: None,
        })
    }

    /// zero grad, forward, cross-entropy, backward, SGD step. Does not wait for the device.
    pub fn step(&mut self) -> orch_tensor::Result<()> {
        self.sgd.zero_grad();
        let mut h = self.x.clone();
        for (i, (w, b)) in self.layers.iter().enumerate() {
            h = h.matmul(w)?.add(b)?;
            if i + 1 < self.layers.len() {
                h = h.relu()?;
            }
        }
        let loss = h.cross_entropy(&self.y)?;
        loss.backward()?;
        self.sgd.step()?;
        self.last_loss = Some(loss.detach());
        Ok(())
    }

    pub fn loss(&self) -> orch_tensor::Result<f32> {
        self.last_loss
            .as_ref()
            .map_or(Ok(f32::NAN), Tensor::to_scalar)
    }
}
