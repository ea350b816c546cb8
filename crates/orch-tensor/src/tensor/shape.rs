//! Ops that build a new dense tensor from the elements of others without arithmetic: `concat`
//! and `pad`. (Views, which copy nothing, are in view.rs.)

use super::Tensor;
use super::elementwise::same_device;
use crate::autograd::{self, Op};
use crate::error::{Result, TensorError};
use crate::layout::{Layout, resolve_axis};
use crate::storage;

impl Tensor {
    /// The tensors joined along `axis` (negative counts from the end): same rank, same
    /// dimensions but `axis`, same device. Differentiable in every input.
    pub fn concat(tensors: &[Tensor], axis: isize) -> Result<Tensor> {
        let Some(first) = tensors.first() else {
            return Err(TensorError::InvalidArgument {
                op: "concat",
                reason: "no tensors to join".into(),
            });
        };
        let d = resolve_axis("concat", axis, first.rank())?;
        let mut shape = first.shape().to_vec();
        shape[d] = 0;
        for t in tensors {
            same_device("concat", first, t)?;
            let fits = t.rank() == first.rank()
                && (0..t.rank()).all(|i| i == d || t.shape()[i] == first.shape()[i]);
            if !fits {
                return Err(TensorError::ShapeMismatch {
                    op: "concat",
                    lhs: first.shape().to_vec(),
                    rhs: t.shape().to_vec(),
                });
            }
            shape[d] =
                shape[d]
                    .checked_add(t.shape()[d])
                    .ok_or_else(|| TensorError::InvalidShape {
                        op: "concat",
                        shape: t.shape().to_vec(),
                        reason: "the joined dimension overflows".into(),
                    })?;
        }
        let pool = first.pool();
        let dense = Layout::contiguous(&shape);
        let buffer = storage::alloc(pool, "concat", &shape, || {
            let mut out = storage::fill(pool, crate::layout::numel(&shape), 0.0)?;
            let mut start = 0;
            for t in tensors {
                let len = t.shape()[d];
                let part = autograd::no_grad(|| t.contiguous())?;
                let target = dense.narrow(d, start, len);
                storage::scatter(
                    pool,
                    &mut out,
                    &target,
                    (&part.buffer().read(), part.layout()),
                )?;
                start += len;
            }
            Ok(out)
        })?;
        let inputs: Vec<&Tensor> = tensors.iter().collect();
        let rec = autograd::record(&inputs, || Op::Concat(tensors.to_vec(), d))?;
        Ok(Tensor::dense(buffer, &shape, rec))
    }

    /// This tensor with `widths[i] = (before, after)` entries of `value` added around dimension
    /// `i` (one pair per dimension). Differentiable in this tensor.
    pub fn pad(&self, widths: &[(usize, usize)], value: f32) -> Result<Tensor> {
        if widths.len() != self.rank() {
            return Err(TensorError::InvalidArgument {
                op: "pad",
                reason: format!(
                    "{} (before, after) pairs for a tensor of rank {}; give one per dimension",
                    widths.len(),
                    self.rank()
                ),
            });
        }
        let shape = self
            .shape()
            .iter()
            .zip(widths)
            .map(|(&n, &(before, after))| n.checked_add(before)?.checked_add(after))
            .collect::<Option<Vec<usize>>>()
            .ok_or_else(|| TensorError::InvalidShape {
                op: "pad",
                shape: self.shape().to_vec(),
                reason: format!("padding {widths:?} overflows a dimension"),
            })?;
        crate::layout::checked_numel("pad", &shape)?;
        let mut interior = Layout::contiguous(&shape);
        for (i, &(before, _)) in widths.iter().enumerate() {
            interior = interior.narrow(i, before, self.shape()[i]);
        }
        let out = autograd::no_grad(|| self.written_into(&shape, value, &interior))?;
        let befores: Vec<usize> = widths.iter().map(|w| w.0).collect();
        let rec = autograd::record(&[self], || Op::Pad(self.clone(), befores))?;
        Ok(out.view(out.layout().clone(), rec))
    }

    /// Gradient of `pad`: the interior of `self` (a view) that the padded input filled.
    pub(crate) fn pad_backward(&self, input_shape: &[usize], befores: &[usize]) -> Result<Tensor> {
        let mut g = self.clone();
        for (i, (&before, &n)) in befores.iter().zip(input_shape).enumerate() {
            g = g.narrow(i as isize, before, n)?;
        }
        Ok(g)
    }
}
