//! Reductions over axes: sum, mean, max, argmax, and `sum_to` for broadcasting gradients.

use super::Tensor;
use crate::autograd::{self, Op};
use crate::error::{Result, TensorError};
use crate::layout::{self, Layout, resolve_axes, resolve_axis};
use crate::ops::ReduceOp;
use crate::storage;

/// The shape with `axes` set to 1, and the shape with them removed.
fn reduced_shapes(shape: &[usize], axes: &[usize]) -> (Vec<usize>, Vec<usize>) {
    let kept = shape
        .iter()
        .enumerate()
        .map(|(i, &d)| if axes.contains(&i) { 1 } else { d })
        .collect();
    let dropped = shape
        .iter()
        .enumerate()
        .filter(|(i, _)| !axes.contains(i))
        .map(|(_, &d)| d)
        .collect();
    (kept, dropped)
}

/// The largest of no values (an empty axis reduced into a non-empty result) has no value:
/// an error rather than -inf or an index into nothing.
fn no_value_of_nothing(
    op: &'static str,
    shape: &[usize],
    axes: &[usize],
    kept: &[usize],
) -> Result<()> {
    let empty_axis = axes.iter().any(|&a| shape[a] == 0);
    if empty_axis && layout::numel(kept) > 0 {
        return Err(TensorError::InvalidShape {
            op,
            shape: shape.to_vec(),
            reason: format!("axes {axes:?} hold no values to take the largest of"),
        });
    }
    Ok(())
}

impl Tensor {
    /// Reduces `axes` one at a time (no autograd); the result keeps them as size 1.
    fn reduce_raw(&self, op: ReduceOp, axes: &[usize]) -> Result<Tensor> {
        let mut cur = autograd::no_grad(|| self.contiguous())?;
        for &axis in axes {
            let dims = cur.layout().split_at_axis(axis);
            let mut shape = cur.shape().to_vec();
            shape[axis] = 1;
            let pool = cur.pool();
            let buffer = storage::alloc(pool, op.name(), &shape, || {
                storage::reduce(pool, op, &cur.buffer().read(), cur.layout(), dims)
            })?;
            cur = Tensor::dense(buffer, &shape, None);
        }
        Ok(cur)
    }

    fn reduce(
        &self,
        op: ReduceOp,
        name: &'static str,
        axes: &[isize],
        keepdim: bool,
    ) -> Result<Tensor> {
        let axes = resolve_axes(name, axes, self.rank())?;
        let (kept, dropped) = reduced_shapes(self.shape(), &axes);
        if op == ReduceOp::Max {
            no_value_of_nothing(name, self.shape(), &axes, &kept)?;
        }
        let out = self.reduce_raw(op, &axes)?;
        let rec = autograd::record(&[self], || match op {
            ReduceOp::Sum => Op::Sum(self.clone(), kept.clone()),
            ReduceOp::Max => Op::Max(self.clone(), kept.clone()),
        })?;
        let shape = if keepdim { &kept } else { &dropped };
        Ok(out.view(Layout::contiguous(shape), rec))
    }

    /// Sum over `axes` (negative counts from the end; empty means all axes).
    pub fn sum(&self, axes: &[isize], keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::Sum, "sum", axes, keepdim)
    }

    /// Mean over `axes` (empty means all axes).
    pub fn mean(&self, axes: &[isize], keepdim: bool) -> Result<Tensor> {
        let resolved = resolve_axes("mean", axes, self.rank())?;
        let count: usize = resolved.iter().map(|&a| self.shape()[a]).product();
        self.sum(axes, keepdim)?
            .mul_scalar(1.0 / count.max(1) as f32)
    }

    /// Largest value over `axes`; the gradient is shared equally among tied maxima.
    pub fn max(&self, axes: &[isize], keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::Max, "max", axes, keepdim)
    }

    /// Sum of all elements, as a scalar.
    pub fn sum_all(&self) -> Result<Tensor> {
        self.sum(&[], false)
    }

    /// Mean of all elements, as a scalar.
    pub fn mean_all(&self) -> Result<Tensor> {
        self.mean(&[], false)
    }

    /// Index of the first largest value along `axis`, as f32 (not differentiable).
    pub fn argmax(&self, axis: isize, keepdim: bool) -> Result<Tensor> {
        let a = resolve_axis("argmax", axis, self.rank())?;
        let x = autograd::no_grad(|| self.contiguous())?;
        let dims = x.layout().split_at_axis(a);
        let (kept, dropped) = reduced_shapes(x.shape(), &[a]);
        no_value_of_nothing("argmax", x.shape(), &[a], &kept)?;
        let pool = x.pool();
        let buffer = storage::alloc(pool, "argmax", &kept, || {
            storage::argmax(pool, &x.buffer().read(), x.layout(), dims)
        })?;
        Ok(Tensor::dense(
            buffer,
            if keepdim { &kept } else { &dropped },
            None,
        ))
    }

    /// Sums broadcast dimensions away so the result has `shape` (the gradient of a broadcast).
    pub(crate) fn sum_to(&self, shape: &[usize]) -> Result<Tensor> {
        if self.shape() == shape {
            return Ok(self.clone());
        }
        let Some(lead) = self.rank().checked_sub(shape.len()) else {
            return Err(crate::TensorError::ShapeMismatch {
                op: "sum_to",
                lhs: self.shape().to_vec(),
                rhs: shape.to_vec(),
            });
        };
        let axes: Vec<isize> = (0..self.rank())
            .filter(|&i| i < lead || (shape[i - lead] == 1 && self.shape()[i] != 1))
            .map(|i| i as isize)
            .collect();
        if axes.is_empty() {
            return self.reshape(shape);
        }
        self.sum(&axes, true)?.reshape(shape)
    }
}
