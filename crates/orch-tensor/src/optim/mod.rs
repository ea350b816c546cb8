//! Optimizers applied on the device as one fused kernel per parameter: SGD (momentum, Nesterov,
//! weight decay) and Adam / AdamW. Parameters are updated in place, so every handle on a
//! parameter sees the new values; optimizer state is allocated in the parameter's pool.
//!
//! A step first allocates any missing state for every parameter and only then updates, so a
//! step refused for memory changes no parameter.

mod adam;
mod sgd;

pub use adam::{Adam, AdamConfig};
pub use sgd::{Sgd, SgdConfig};

use crate::error::{Result, TensorError};
use crate::ops::UpdateOp;
use crate::storage;
use crate::tensor::Tensor;
use std::collections::HashSet;
use std::sync::Arc;

/// What a trainer host needs of any optimizer.
pub trait Optimizer: Send + Sync {
    /// Applies one update to every parameter that has a gradient.
    fn step(&mut self) -> Result<()>;
    /// Drops every parameter's gradient.
    fn zero_grad(&self) {
        for p in self.params() {
            p.zero_grad();
        }
    }
    fn params(&self) -> &[Tensor];
    fn lr(&self) -> f32;
    fn set_lr(&mut self, lr: f32);
}

/// Parameters must be dense leaves that require grad, each given once.
fn check_params(op: &'static str, params: &[Tensor]) -> Result<()> {
    let mut buffers = HashSet::new();
    for (i, p) in params.iter().enumerate() {
        let reason = if !p.requires_grad() || p.op().is_some() {
            Some("is not a leaf that requires grad (make it with with_requires_grad())")
        } else if !p.is_contiguous() {
            Some("is not contiguous")
        } else if !buffers.insert(Arc::as_ptr(p.buffer()) as usize) {
            Some("shares its storage with another parameter in the list")
        } else {
            None
        };
        if let Some(reason) = reason {
            return Err(TensorError::Optimizer {
                op,
                reason: format!("parameter {i} (shape {:?}) {reason}", p.shape()),
            });
        }
    }
    Ok(())
}

fn check_hyper(op: &'static str, name: &str, value: f32, ok: bool) -> Result<()> {
    if ok && value.is_finite() {
        Ok(())
    } else {
        Err(TensorError::Optimizer {
            op,
            reason: format!("{name} = {value} is out of range"),
        })
    }
}

/// A copy of `values` in the pool of parameter `index`, as optimizer state for it.
fn state_copy(
    op: &'static str,
    params: &[Tensor],
    index: usize,
    values: &Tensor,
) -> Result<Tensor> {
    let p = params.get(index).ok_or_else(|| TensorError::Optimizer {
        op,
        reason: format!("no parameter {index}: the optimizer has {}", params.len()),
    })?;
    let state = p.zeros_like()?;
    state.assign(values)?;
    Ok(state)
}

/// Runs the fused update `op` on parameter `p` with gradient `g` and state tensors.
fn apply(
    op: UpdateOp,
    p: &Tensor,
    g: &Tensor,
    s1: Option<&Tensor>,
    s2: Option<&Tensor>,
) -> Result<()> {
    let name = "optimizer step";
    if g.shape() != p.shape() {
        return Err(TensorError::ShapeMismatch {
            op: name,
            lhs: p.shape().to_vec(),
            rhs: g.shape().to_vec(),
        });
    }
    // A gradient sharing the parameter's storage would deadlock the locks below: copy it.
    let g = if g.shares_storage(p) || !g.is_contiguous() {
        crate::no_grad(|| g.affine(1.0, 0.0))?
    } else {
        g.clone()
    };
    let (Some(pr), Some(gr)) = (p.layout().contiguous_range(), g.layout().contiguous_range())
    else {
        return Err(TensorError::Internal {
            op: name,
            reason: "parameter or gradient not dense".into(),
        });
    };
    let mut ps = p.buffer().write();
    let gs = g.buffer().read();
    let mut s1 = s1.map(|t| t.buffer().write());
    let mut s2 = s2.map(|t| t.buffer().write());
    storage::update(
        p.pool(),
        op,
        (&mut ps, pr),
        (&gs, gr),
        s1.as_deref_mut(),
        s2.as_deref_mut(),
    )
}
