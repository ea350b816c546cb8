//! Views: new layouts over the same storage, and `contiguous` when a kernel needs dense data.

use super::Tensor;
use crate::autograd::{self, Op};
use crate::error::{Result, TensorError};
use crate::layout::{self, Layout, resolve_axis};
use crate::storage;

impl Tensor {
    /// The same elements under `shape` (same element count). A view when the data is dense,
    /// else a dense copy first.
    pub fn reshape(&self, shape: &[usize]) -> Result<Tensor> {
        if layout::checked_numel("reshape", shape)? != self.numel() {
            return Err(TensorError::InvalidShape {
                op: "reshape",
                shape: shape.to_vec(),
                reason: format!(
                    "has {} elements, the tensor {:?} has {}",
                    layout::numel(shape),
                    self.shape(),
                    self.numel()
                ),
            });
        }
        let src = self.contiguous()?;
        let Some(view) = src.layout().reshape(shape) else {
            return Err(TensorError::Internal {
                op: "reshape",
                reason: "contiguous() gave strided data".into(),
            });
        };
        Ok(src.view(
            view,
            autograd::record(&[&src], || Op::Reshape(src.clone()))?,
        ))
    }

    /// Reorders dimensions: dimension `i` of the result is dimension `perm[i]` of this tensor.
    pub fn permute(&self, perm: &[usize]) -> Result<Tensor> {
        let rank = self.rank();
        let mut seen = vec![false; rank];
        let valid = perm.len() == rank
            && perm
                .iter()
                .all(|&p| p < rank && !std::mem::replace(&mut seen[p], true));
        if !valid {
            return Err(TensorError::InvalidShape {
                op: "permute",
                shape: self.shape().to_vec(),
                reason: format!("{perm:?} is not a permutation of 0..{rank}"),
            });
        }
        let view = self.layout().permute(perm);
        Ok(self.view(
            view,
            autograd::record(&[self], || Op::Permute(self.clone(), perm.to_vec()))?,
        ))
    }

    /// Swaps two dimensions (negative counts from the end).
    pub fn transpose(&self, d0: isize, d1: isize) -> Result<Tensor> {
        let rank = self.rank();
        let (a, b) = (
            resolve_axis("transpose", d0, rank)?,
            resolve_axis("transpose", d1, rank)?,
        );
        let mut perm: Vec<usize> = (0..rank).collect();
        perm.swap(a, b);
        self.permute(&perm)
    }

    /// Swaps the last two dimensions (matrix transpose, batched).
    pub fn t(&self) -> Result<Tensor> {
        if self.rank() < 2 {
            return Err(TensorError::InvalidShape {
                op: "t",
                shape: self.shape().to_vec(),
                reason: "a matrix transpose needs at least two dimensions".into(),
            });
        }
        self.transpose(-2, -1)
    }

    /// Entries `start..start + len` of dimension `dim`.
    pub fn narrow(&self, dim: isize, start: usize, len: usize) -> Result<Tensor> {
        let d = resolve_axis("narrow", dim, self.rank())?;
        let size = self.shape()[d];
        if start.checked_add(len).is_none_or(|end| end > size) {
            return Err(TensorError::InvalidShape {
                op: "narrow",
                shape: self.shape().to_vec(),
                reason: format!(
                    "range {start}..{} is outside 0..{size} of dimension {d}",
                    start.saturating_add(len)
                ),
            });
        }
        let view = self.layout().narrow(d, start, len);
        Ok(self.view(
            view,
            autograd::record(&[self], || Op::Narrow(self.clone(), d, start))?,
        ))
    }

    /// Every `step`-th entry of dimension `axis` from `start` up to (not including) `end`, as
    /// Python's `x[start:end:step]`: `end` past the dimension is cut to it, `start >= end`
    /// gives an empty dimension. `step` must be at least 1. A view.
    pub fn slice(&self, axis: isize, start: usize, end: usize, step: usize) -> Result<Tensor> {
        let d = resolve_axis("slice", axis, self.rank())?;
        if step == 0 {
            return Err(TensorError::InvalidArgument {
                op: "slice",
                reason: "the step must be at least 1".into(),
            });
        }
        let size = self.shape()[d];
        let end = end.min(size);
        let len = end.saturating_sub(start).div_ceil(step);
        // One entry or none: the step is irrelevant (and must not scale the stride past usize).
        let step = if len <= 1 { 1 } else { step };
        let view = self.layout().slice(d, start.min(size), len, step);
        Ok(self.view(
            view,
            autograd::record(&[self], || Op::Slice(self.clone(), d, start, step))?,
        ))
    }

    /// Pieces of `sizes` entries along `axis`, in order (views); the sizes must add up to the
    /// dimension.
    pub fn split(&self, sizes: &[usize], axis: isize) -> Result<Vec<Tensor>> {
        let d = resolve_axis("split", axis, self.rank())?;
        let total = sizes.iter().try_fold(0usize, |a, &s| a.checked_add(s));
        if total != Some(self.shape()[d]) {
            return Err(TensorError::InvalidShape {
                op: "split",
                shape: self.shape().to_vec(),
                reason: format!(
                    "sizes {sizes:?} do not add up to dimension {d}'s {}",
                    self.shape()[d]
                ),
            });
        }
        let mut start = 0;
        sizes
            .iter()
            .map(|&len| {
                let piece = self.narrow(d as isize, start, len);
                start += len;
                piece
            })
            .collect()
    }

    /// This tensor broadcast to `shape`, where `-1` keeps this tensor's dimension (PyTorch's
    /// `expand`; new leading dimensions must be given). A view.
    pub fn expand(&self, shape: &[isize]) -> Result<Tensor> {
        let invalid = |reason: String| TensorError::InvalidArgument {
            op: "expand",
            reason,
        };
        let lead = shape.len().checked_sub(self.rank()).ok_or_else(|| {
            invalid(format!(
                "{shape:?} has fewer dimensions than the tensor {:?}",
                self.shape()
            ))
        })?;
        let resolved = shape
            .iter()
            .enumerate()
            .map(|(i, &s)| match s {
                -1 if i >= lead => Ok(self.shape()[i - lead]),
                s if s >= 0 => Ok(s as usize),
                _ => Err(invalid(format!(
                    "size {s} at dimension {i} of {shape:?} (only -1, on an existing dimension, keeps it)"
                ))),
            })
            .collect::<Result<Vec<_>>>()?;
        self.broadcast_to(&resolved)
    }

    /// This tensor repeated (numpy broadcasting, stride 0) to `shape`.
    pub fn broadcast_to(&self, shape: &[usize]) -> Result<Tensor> {
        if shape == self.shape() {
            return Ok(self.clone());
        }
        let view = self.layout().broadcast_as("broadcast_to", shape)?;
        Ok(self.view(
            view,
            autograd::record(&[self], || Op::Broadcast(self.clone()))?,
        ))
    }

    /// This tensor when already dense, else a dense copy.
    pub fn contiguous(&self) -> Result<Tensor> {
        if self.is_contiguous() {
            return Ok(self.clone());
        }
        let pool = self.pool();
        let buffer = storage::alloc(pool, "contiguous", self.shape(), || {
            storage::gather(pool, &self.buffer().read(), self.layout())
        })?;
        Ok(Tensor::dense(
            buffer,
            self.shape(),
            autograd::record(&[self], || Op::Contiguous(self.clone()))?,
        ))
    }

    /// Gradient of `narrow`: zeros of `shape` with `self` written at `start..` of `dim`.
    pub(crate) fn narrow_backward(
        &self,
        shape: &[usize],
        dim: usize,
        start: usize,
    ) -> Result<Tensor> {
        let target = Layout::contiguous(shape).narrow(dim, start, self.shape()[dim]);
        self.written_into(shape, 0.0, &target)
    }

    /// Writes this tensor into `dst` (dense, of the shape this one narrows) at `start..` of
    /// `dim`, in place: the elements of that range become this tensor's, the rest stay.
    pub(crate) fn write_narrow_into(&self, dst: &Tensor, dim: usize, start: usize) -> Result<()> {
        let target = Layout::contiguous(dst.shape()).narrow(dim, start, self.shape()[dim]);
        self.scatter_into(dst, &target)
    }

    /// Writes this tensor's elements into the elements of the dense `dst` that `target` views.
    fn scatter_into(&self, dst: &Tensor, target: &Layout) -> Result<()> {
        let g = self.contiguous()?;
        let mut out = dst.buffer().write();
        storage::scatter(
            self.pool(),
            &mut out,
            target,
            (&g.buffer().read(), g.layout()),
        )
    }

    /// Gradient of `slice`: zeros of `shape` with `self` written at every `step`-th entry of
    /// `dim` from `start`.
    pub(crate) fn slice_backward(
        &self,
        shape: &[usize],
        dim: usize,
        start: usize,
        step: usize,
    ) -> Result<Tensor> {
        let target = Layout::contiguous(shape).slice(dim, start, self.shape()[dim], step);
        self.written_into(shape, 0.0, &target)
    }

    /// A dense tensor of `shape` filled with `value`, with this tensor's elements written into
    /// the elements `target` views (a layout over that shape, no broadcast dimensions).
    pub(crate) fn written_into(
        &self,
        shape: &[usize],
        value: f32,
        target: &Layout,
    ) -> Result<Tensor> {
        let out = Tensor::full(shape, value, self.pool())?;
        self.scatter_into(&out, target)?;
        Ok(out)
    }
}
