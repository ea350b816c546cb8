//! Dropout whose masks are reproducible across resumes and replica splits.

use super::Tensor;
use crate::autograd::{self, Op};
use crate::error::{Result, TensorError};
use crate::ops::DropoutMask;
use crate::storage;

/// How one dropout call draws its mask. Element `e` (row-major position within the sample) of
/// the batch's row `r` (the sample with global index `sample_offset + r` in the step's global
/// batch) is dropped or kept by a pure function of `(seed, step, site, sample_offset + r, e)`.
/// So a resumed run draws the same masks as an uninterrupted one, and replicas that each hold a
/// slice of the global batch (passing the global index of their first row) draw together
/// exactly the masks of one replica holding the whole batch.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Dropout {
    /// Probability of dropping an element, in `[0, 1)`; kept elements are scaled by `1/(1-p)`.
    pub p: f32,
    /// The job's seed.
    pub seed: u64,
    /// The training step (so each step draws new masks).
    pub step: u64,
    /// Which dropout of the model this is (so two layers in one step draw different masks).
    pub site: u64,
    /// The global index, in the step's batch, of this tensor's first row (axis 0).
    pub sample_offset: u64,
    /// Dropout is applied only in training; otherwise it is the identity.
    pub training: bool,
}

impl Dropout {
    /// Training-mode dropout with probability `p` at `step`, site 0, for a batch starting at
    /// global sample 0.
    pub fn new(p: f32, seed: u64, step: u64) -> Dropout {
        Dropout {
            p,
            seed,
            step,
            site: 0,
            sample_offset: 0,
            training: true,
        }
    }
}

impl Tensor {
    /// Zeroes each element with probability `d.p` and scales the others by `1 / (1 - p)`
    /// (PyTorch's dropout), by a mask drawn as [`Dropout`] describes; the samples are the rows of
    /// axis 0 (a scalar is one sample). The identity when not training or when `p` is 0. `p`
    /// outside `[0, 1)` is an error. The gradient goes through the same mask (recomputed, not
    /// stored).
    pub fn dropout(&self, d: &Dropout) -> Result<Tensor> {
        if !(0.0..1.0).contains(&d.p) {
            return Err(TensorError::InvalidArgument {
                op: "dropout",
                reason: format!("the probability {} is not in [0, 1)", d.p),
            });
        }
        if !d.training || d.p == 0.0 {
            return Ok(self.clone());
        }
        let mask = DropoutMask {
            p: d.p,
            seed: d.seed,
            step: d.step,
            site: d.site,
            sample_offset: d.sample_offset,
        };
        let out = autograd::no_grad(|| self.dropout_raw(&mask))?;
        let rec = autograd::record(&[self], || Op::Dropout(self.clone(), mask))?;
        Ok(out.view(out.layout().clone(), rec))
    }

    /// Dropout under `mask` (no recording): also the gradient, dropout being linear given it.
    pub(crate) fn dropout_raw(&self, mask: &DropoutMask) -> Result<Tensor> {
        let x = self.contiguous()?;
        let rows = x.shape().first().copied().unwrap_or(1);
        let pool = x.pool();
        let buffer = storage::alloc(pool, "dropout", x.shape(), || {
            storage::dropout(pool, &x.buffer().read(), x.layout(), rows, mask)
        })?;
        Ok(Tensor::dense(buffer, x.shape(), None))
    }
}
