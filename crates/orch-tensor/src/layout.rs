//! Shapes, strides and offsets: how a tensor's elements sit in its storage.
//!
//! Views (reshape of contiguous data, transpose, permute, narrow, broadcast) only make a new
//! `Layout` over the same storage. A broadcast dimension has stride 0.

use crate::error::{Result, TensorError};

/// Row-major shape with element strides and a starting offset into the storage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    shape: Vec<usize>,
    strides: Vec<usize>,
    offset: usize,
}

/// Number of elements of a shape (1 for a scalar).
pub fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// Most dimensions a tensor may have (a plugin's shape list is bounded by it, so a layout's
/// host memory is too).
pub const MAX_RANK: usize = 32;

/// Most elements a tensor may have: its f32 bytes must be addressable (`isize::MAX`, Rust's
/// limit on one allocation), so every byte count computed from a shape is exact.
pub const MAX_NUMEL: usize = isize::MAX as usize / std::mem::size_of::<f32>();

/// The one check every new tensor's shape passes (through [`crate::storage::alloc`], which
/// every op's output goes through): at most [`MAX_RANK`] dimensions and at most [`MAX_NUMEL`]
/// elements, a zero dimension included (a shape holding nothing is still refused when its
/// other dimensions multiply past the limit). Returns the element count.
pub fn checked_numel(op: &'static str, shape: &[usize]) -> Result<usize> {
    let invalid = |reason: String| TensorError::InvalidShape {
        op,
        shape: shape.to_vec(),
        reason,
    };
    if shape.len() > MAX_RANK {
        return Err(invalid(format!(
            "{} dimensions; at most {MAX_RANK}",
            shape.len()
        )));
    }
    // The product of the non-zero dimensions: a zero must not hide an overflow elsewhere.
    let nonzero = shape
        .iter()
        .filter(|&&d| d != 0)
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .filter(|&n| n <= MAX_NUMEL)
        .ok_or_else(|| invalid(format!("more than {MAX_NUMEL} elements")))?;
    Ok(if shape.contains(&0) { 0 } else { nonzero })
}

/// Row-major strides of a dense tensor of this shape.
pub fn contiguous_strides(shape: &[usize]) -> Vec<usize> {
    let mut strides = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * shape[i + 1];
    }
    strides
}

/// Resolves a possibly negative axis against a rank.
pub fn resolve_axis(op: &'static str, axis: isize, rank: usize) -> Result<usize> {
    let r = rank as isize;
    let a = if axis < 0 { axis + r } else { axis };
    if a < 0 || a >= r {
        return Err(TensorError::InvalidAxis { op, axis, rank });
    }
    Ok(a as usize)
}

/// Resolves a list of axes, sorted and without repeats. An empty list means all axes.
pub fn resolve_axes(op: &'static str, axes: &[isize], rank: usize) -> Result<Vec<usize>> {
    if axes.is_empty() {
        return Ok((0..rank).collect());
    }
    let mut out = axes
        .iter()
        .map(|&a| resolve_axis(op, a, rank))
        .collect::<Result<Vec<_>>>()?;
    out.sort_unstable();
    if out.windows(2).any(|w| w[0] == w[1]) {
        return Err(TensorError::RepeatedAxis {
            op,
            axes: axes.to_vec(),
            rank,
        });
    }
    Ok(out)
}

/// The numpy broadcast of two shapes.
pub fn broadcast_shape(op: &'static str, lhs: &[usize], rhs: &[usize]) -> Result<Vec<usize>> {
    let rank = lhs.len().max(rhs.len());
    let mut out = vec![0; rank];
    for i in 0..rank {
        let l = if i < rank - lhs.len() {
            1
        } else {
            lhs[i - (rank - lhs.len())]
        };
        let r = if i < rank - rhs.len() {
            1
        } else {
            rhs[i - (rank - rhs.len())]
        };
        out[i] = match (l, r) {
            (a, b) if a == b => a,
            (1, b) => b,
            (a, 1) => a,
            _ => {
                return Err(TensorError::ShapeMismatch {
                    op,
                    lhs: lhs.to_vec(),
                    rhs: rhs.to_vec(),
                });
            }
        };
    }
    Ok(out)
}

impl Layout {
    /// A dense row-major layout starting at offset 0.
    pub fn contiguous(shape: &[usize]) -> Self {
        Layout {
            shape: shape.to_vec(),
            strides: contiguous_strides(shape),
            offset: 0,
        }
    }

    /// A layout from explicit parts (callers guarantee they address valid elements).
    pub(crate) fn from_parts(shape: &[usize], strides: &[usize], offset: usize) -> Self {
        Layout {
            shape: shape.to_vec(),
            strides: strides.to_vec(),
            offset,
        }
    }

    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    pub fn strides(&self) -> &[usize] {
        &self.strides
    }

    pub fn offset(&self) -> usize {
        self.offset
    }

    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    pub fn numel(&self) -> usize {
        numel(&self.shape)
    }

    /// True when the elements are dense and in row-major order (any offset).
    pub fn is_contiguous(&self) -> bool {
        let mut expected = 1;
        for (&dim, &stride) in self.shape.iter().zip(&self.strides).rev() {
            if dim != 1 && stride != expected {
                return false;
            }
            expected *= dim;
        }
        true
    }

    /// The contiguous range this layout covers, when it is contiguous.
    pub fn contiguous_range(&self) -> Option<std::ops::Range<usize>> {
        self.is_contiguous()
            .then(|| self.offset..self.offset + self.numel())
    }

    /// Swaps two dimensions.
    #[cfg(test)]
    pub fn transpose(&self, d0: usize, d1: usize) -> Layout {
        let mut out = self.clone();
        out.shape.swap(d0, d1);
        out.strides.swap(d0, d1);
        out
    }

    /// Reorders dimensions: new dimension `i` is old dimension `perm[i]`.
    pub fn permute(&self, perm: &[usize]) -> Layout {
        Layout {
            shape: perm.iter().map(|&p| self.shape[p]).collect(),
            strides: perm.iter().map(|&p| self.strides[p]).collect(),
            offset: self.offset,
        }
    }

    /// Keeps `len` entries of dimension `dim` starting at `start` (bounds checked by the caller).
    pub fn narrow(&self, dim: usize, start: usize, len: usize) -> Layout {
        let mut out = self.clone();
        out.shape[dim] = len;
        if len > 0 {
            out.offset += start * self.strides[dim];
        }
        out
    }

    /// Keeps `len` entries of dimension `dim`, every `step`-th from `start` (bounds checked by
    /// the caller: `start + (len - 1) * step` is inside the dimension when `len > 0`).
    pub fn slice(&self, dim: usize, start: usize, len: usize, step: usize) -> Layout {
        let mut out = self.narrow(dim, start, len);
        out.strides[dim] *= step;
        out
    }

    /// The same data under a new shape, when the data is contiguous.
    pub fn reshape(&self, shape: &[usize]) -> Option<Layout> {
        self.is_contiguous().then(|| Layout {
            shape: shape.to_vec(),
            strides: contiguous_strides(shape),
            offset: self.offset,
        })
    }

    /// Broadcasts to `shape` (numpy rules) with stride 0 on repeated dimensions.
    pub fn broadcast_as(&self, op: &'static str, shape: &[usize]) -> Result<Layout> {
        checked_numel(op, shape)?;
        let mismatch = || TensorError::ShapeMismatch {
            op,
            lhs: self.shape.clone(),
            rhs: shape.to_vec(),
        };
        if shape.len() < self.rank() {
            return Err(mismatch());
        }
        let lead = shape.len() - self.rank();
        let mut strides = vec![0; shape.len()];
        for (i, &dim) in shape.iter().enumerate().skip(lead) {
            let own = self.shape[i - lead];
            strides[i] = match own {
                d if d == dim => self.strides[i - lead],
                1 => 0,
                _ => return Err(mismatch()),
            };
        }
        Ok(Layout {
            shape: shape.to_vec(),
            strides,
            offset: self.offset,
        })
    }

    /// For a contiguous layout and an axis: (outer, axis length, inner) sizes.
    pub fn split_at_axis(&self, axis: usize) -> (usize, usize, usize) {
        let outer = numel(&self.shape[..axis]);
        let inner = numel(&self.shape[axis + 1..]);
        (outer, self.shape[axis], inner)
    }

    /// Dimensions merged where every given layout allows it, size-1 dimensions dropped.
    /// Returns (shape, strides per layout). Used by strided loops on both backends.
    pub fn coalesce(shape: &[usize], layouts: &[&Layout]) -> (Vec<usize>, Vec<Vec<usize>>) {
        let mut dims: Vec<usize> = Vec::with_capacity(shape.len());
        let mut strides: Vec<Vec<usize>> = vec![Vec::with_capacity(shape.len()); layouts.len()];
        for (i, &dim) in shape.iter().enumerate() {
            if dim == 1 {
                continue;
            }
            let mergeable = !dims.is_empty()
                && layouts.iter().enumerate().all(|(k, l)| {
                    let prev = *strides[k].last().unwrap_or(&0);
                    prev == l.strides[i] * dim
                });
            if mergeable {
                let last = dims.len() - 1;
                dims[last] *= dim;
                for (k, l) in layouts.iter().enumerate() {
                    strides[k][last] = l.strides[i];
                }
            } else {
                dims.push(dim);
                for (k, l) in layouts.iter().enumerate() {
                    strides[k].push(l.strides[i]);
                }
            }
        }
        if dims.is_empty() {
            dims.push(1);
            for s in &mut strides {
                s.push(1);
            }
        }
        (dims, strides)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strides_views_and_contiguity() {
        let l = Layout::contiguous(&[2, 3, 4]);
        assert_eq!(l.strides(), &[12, 4, 1]);
        assert!(l.is_contiguous());
        let t = l.transpose(1, 2);
        assert_eq!(t.shape(), &[2, 4, 3]);
        assert!(!t.is_contiguous());
        let n = l.narrow(1, 1, 2);
        assert_eq!(n.offset(), 4);
        assert!(!n.is_contiguous());
        assert!(l.narrow(0, 1, 1).is_contiguous());
        assert!(t.reshape(&[24]).is_none());
    }

    #[test]
    fn broadcasting_follows_numpy() {
        assert_eq!(
            broadcast_shape("t", &[3, 1, 5], &[4, 1]).unwrap(),
            vec![3, 4, 5]
        );
        assert!(broadcast_shape("t", &[3], &[4]).is_err());
        let b = Layout::contiguous(&[4, 1])
            .broadcast_as("t", &[3, 4, 5])
            .unwrap();
        assert_eq!(b.strides(), &[0, 1, 0]);
    }

    #[test]
    fn coalesce_merges_dense_runs() {
        let a = Layout::contiguous(&[2, 3, 4]);
        let (dims, strides) = Layout::coalesce(a.shape(), &[&a]);
        assert_eq!((dims, strides), (vec![24], vec![vec![1]]));
        let b = Layout::contiguous(&[4])
            .broadcast_as("t", &[2, 3, 4])
            .unwrap();
        let (dims, strides) = Layout::coalesce(a.shape(), &[&a, &b]);
        assert_eq!(dims, vec![6, 4]);
        assert_eq!(strides, vec![vec![4, 1], vec![0, 1]]);
    }

    #[test]
    fn axes_resolve_negative_and_reject_repeats() {
        assert_eq!(resolve_axis("t", -1, 3).unwrap(), 2);
        assert!(resolve_axis("t", 3, 3).is_err());
        let repeated = resolve_axes("t", &[0, -3], 3).unwrap_err();
        assert_eq!(
            repeated.to_string(),
            "t: axis list [0, -3] names an axis twice (a tensor of rank 3)"
        );
        assert_eq!(resolve_axes("t", &[], 2).unwrap(), vec![0, 1]);
    }

    #[test]
    fn shapes_are_checked_for_rank_and_element_count() {
        assert_eq!(checked_numel("t", &[2, 3]).unwrap(), 6);
        assert_eq!(checked_numel("t", &[]).unwrap(), 1);
        assert_eq!(checked_numel("t", &[4, 0]).unwrap(), 0);
        // 2^64 elements that hold nothing (a zero) are refused all the same.
        let huge = [65536, 65536, 65536, 65536, 0];
        assert!(checked_numel("t", &huge).is_err());
        assert!(checked_numel("t", &[1 << 62, 1]).is_err(), "bytes overflow");
        assert!(checked_numel("t", &[MAX_NUMEL]).is_ok());
        assert!(checked_numel("t", &[1; MAX_RANK]).is_ok());
        let err = checked_numel("t", &[1; MAX_RANK + 1]).unwrap_err();
        assert!(err.to_string().contains("at most 32"), "{err}");
    }
}
