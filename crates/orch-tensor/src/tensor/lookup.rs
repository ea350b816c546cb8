//! Lookups by index: `index_select`, `embedding` and `gather`, differentiable in the tensor read
//! (their gradients add into the rows read: scatter-add). Indices are f32 tensors holding
//! integers; one that is negative, fractional, NaN or outside the axis is an error value, and
//! nothing is read out of bounds.

use super::Tensor;
use super::elementwise::same_device;
use crate::autograd::{self, Op};
use crate::error::{Result, TensorError};
use crate::layout::resolve_axis;
use crate::ops::IndexOp;
use crate::storage;

impl Tensor {
    /// Runs `op` on dense copies of `src` and `index`, with `[outer, n, inner]` taken around
    /// `axis` of `source_shape` (the looked-up tensor's shape; for the gradients `src` is the
    /// upstream gradient).
    fn index_op(
        src: &Tensor,
        index: &Tensor,
        op: IndexOp,
        axis: usize,
        source_shape: &[usize],
        out_shape: &[usize],
    ) -> Result<Tensor> {
        let (s, i) =
            autograd::no_grad(|| Ok::<_, TensorError>((src.contiguous()?, index.contiguous()?)))?;
        let outer = source_shape[..axis].iter().product();
        let inner = source_shape[axis + 1..].iter().product();
        let dims = (outer, source_shape[axis], inner);
        let pool = s.pool();
        let buffer = storage::alloc(pool, op.name(), out_shape, || {
            storage::read_two(s.buffer(), i.buffer(), |sb, ib| {
                storage::index(pool, op, (sb, s.layout()), (ib, i.layout()), dims)
            })
        })?;
        Ok(Tensor::dense(buffer, out_shape, None))
    }

    /// Entries `index[j]` of dimension `axis`, in that order: `[.., n, ..]` with an index of `k`
    /// entries gives `[.., k, ..]` (PyTorch's `index_select`; the index is 1-D).
    pub fn index_select(&self, axis: isize, index: &Tensor) -> Result<Tensor> {
        let d = resolve_axis("index_select", axis, self.rank())?;
        same_device("index_select", self, index)?;
        if index.rank() != 1 {
            return Err(TensorError::InvalidShape {
                op: "index_select",
                shape: index.shape().to_vec(),
                reason: "the index must be 1-D".into(),
            });
        }
        let mut shape = self.shape().to_vec();
        shape[d] = index.numel();
        let out = Tensor::index_op(self, index, IndexOp::Select, d, self.shape(), &shape)?;
        let rec = autograd::record(&[self], || Op::IndexSelect(self.clone(), index.detach(), d))?;
        Ok(out.view(out.layout().clone(), rec))
    }

    /// Rows of this table `[V, D]` picked by `indices` (any shape, f32 integers in `0..V`):
    /// `[.., D]` with the indices' shape in front. The gradient adds into the rows picked.
    pub fn embedding(&self, indices: &Tensor) -> Result<Tensor> {
        if self.rank() != 2 {
            return Err(TensorError::InvalidShape {
                op: "embedding",
                shape: self.shape().to_vec(),
                reason: "the table must be [rows, dim]".into(),
            });
        }
        let flat = autograd::no_grad(|| indices.reshape(&[indices.numel()]))?;
        let rows = self.index_select(0, &flat)?;
        let shape = [indices.shape(), &self.shape()[1..]].concat();
        rows.reshape(&shape)
    }

    /// `out[.., j, ..] = self[.., index[.., j, ..], ..]` along `axis` (PyTorch's `gather`): the
    /// index has this tensor's rank and the result its shape; along the other axes the index
    /// may be shorter than this tensor, never longer.
    pub fn gather(&self, axis: isize, index: &Tensor) -> Result<Tensor> {
        let d = resolve_axis("gather", axis, self.rank())?;
        same_device("gather", self, index)?;
        let fits = index.rank() == self.rank()
            && (0..self.rank()).all(|i| i == d || index.shape()[i] <= self.shape()[i]);
        if !fits {
            return Err(TensorError::ShapeMismatch {
                op: "gather",
                lhs: self.shape().to_vec(),
                rhs: index.shape().to_vec(),
            });
        }
        // Cut the other axes to the index's (views; gradients flow through them), so the kernel
        // sees `[outer, n, inner]` and `[outer, k, inner]` over the same outer and inner.
        let mut src = self.clone();
        for i in (0..self.rank()).filter(|&i| i != d) {
            if index.shape()[i] < self.shape()[i] {
                src = src.narrow(i as isize, 0, index.shape()[i])?;
            }
        }
        let src = src.contiguous()?;
        let out = Tensor::index_op(&src, index, IndexOp::Gather, d, src.shape(), index.shape())?;
        let rec = autograd::record(&[&src], || Op::Gather(src.clone(), index.detach(), d))?;
        Ok(out.view(out.layout().clone(), rec))
    }

    /// Gradient of `index_select` (for `index_select` with `op` Select) or of `gather`: `self`
    /// is the upstream gradient, added into zeros of `source_shape` at the rows read.
    pub(crate) fn index_backward(
        &self,
        index: &Tensor,
        op: IndexOp,
        axis: usize,
        source_shape: &[usize],
    ) -> Result<Tensor> {
        let backward = match op {
            IndexOp::Select | IndexOp::SelectBackward => IndexOp::SelectBackward,
            IndexOp::Gather | IndexOp::GatherBackward => IndexOp::GatherBackward,
        };
        // The kernel sees the gradient as `[outer, k, inner]` and writes `[outer, n, inner]`.
        Tensor::index_op(self, index, backward, axis, source_shape, source_shape)
    }
}
