//! Lookups by index: `index_select` (whole rows of an axis, the embedding lookup) and `gather`
//! (one index per output element), with their gradients, which add into the rows read
//! (scatter-add). Data is dense and seen as `[outer, n, inner]` around the indexed axis.
//! Indices arrive as f32 and are checked once, before any element is read.

use super::{CpuStorage, PAR_MIN, build, each_chunk};
use crate::error::{Result, TensorError};

/// The indices as positions in `0..bound`, or an error naming the first that is not one
/// (negative, fractional, NaN, too large).
pub(crate) fn check_indices(op: &'static str, idx: &[f32], bound: usize) -> Result<Vec<usize>> {
    idx.iter()
        .map(|&v| {
            if v >= 0.0 && v.fract() == 0.0 && (v as usize) < bound {
                Ok(v as usize)
            } else {
                Err(TensorError::InvalidArgument {
                    op,
                    reason: format!("index {v} is not a position in 0..{bound}"),
                })
            }
        })
        .collect()
}

/// `out[o, j, :] = x[o, idx[j], :]` for `x` shaped `[outer, n, inner]`; `out` is
/// `[outer, idx.len(), inner]`.
pub(crate) fn index_select(
    x: &[f32],
    idx: &[f32],
    (outer, n, inner): (usize, usize, usize),
) -> Result<CpuStorage> {
    let idx = check_indices("index_select", idx, n)?;
    let k = idx.len();
    let total = outer * k * inner;
    if total == 0 {
        return Ok(Vec::new());
    }
    // Each output row of `inner` is copied whole from one input row.
    let row = |r: usize, o: &mut [std::mem::MaybeUninit<f32>]| {
        let src = ((r / k) * n + idx[r % k]) * inner;
        for (o, v) in o.iter_mut().zip(&x[src..src + inner]) {
            o.write(*v);
        }
    };
    Ok(build(total, |out| {
        each_chunk(out, inner, total >= PAR_MIN, row)
    }))
}

/// Gradient of `index_select`: zeros `[outer, n, inner]` with each row `g[o, j, :]` added into
/// row `idx[j]`. Rows are summed per destination in index order (a counting sort of the
/// indices), so destinations run in parallel and the sums are the same on every run.
pub(crate) fn index_add(
    g: &[f32],
    idx: &[f32],
    (outer, n, inner): (usize, usize, usize),
) -> Result<CpuStorage> {
    let idx = check_indices("index_select backward", idx, n)?;
    let k = idx.len();
    let mut out = vec![0.0; outer * n * inner];
    if out.is_empty() || k == 0 {
        return Ok(out);
    }
    // sources[starts[d]..starts[d + 1]] are the j with idx[j] == d, ascending.
    let mut starts = vec![0usize; n + 1];
    for &d in &idx {
        starts[d + 1] += 1;
    }
    for d in 0..n {
        starts[d + 1] += starts[d];
    }
    let mut next = starts.clone();
    let mut sources = vec![0usize; k];
    for (j, &d) in idx.iter().enumerate() {
        sources[next[d]] = j;
        next[d] += 1;
    }
    let row = |r: usize, dst: &mut [f32]| {
        let (o, d) = (r / n, r % n);
        for &j in &sources[starts[d]..starts[d + 1]] {
            let src = (o * k + j) * inner;
            for (a, v) in dst.iter_mut().zip(&g[src..src + inner]) {
                *a += *v;
            }
        }
    };
    each_chunk(&mut out, inner, g.len() >= PAR_MIN, row);
    Ok(out)
}

/// `out[o, j, i] = x[o, idx[o, j, i], i]` for `x` shaped `[outer, n, inner]` and `idx`
/// shaped `[outer, k, inner]`.
pub(crate) fn gather(
    x: &[f32],
    idx: &[f32],
    (outer, n, inner): (usize, usize, usize),
) -> Result<CpuStorage> {
    let idx = check_indices("gather", idx, n)?;
    let total = idx.len();
    if total == 0 || inner == 0 {
        return Ok(Vec::new());
    }
    let k = total / (outer * inner);
    let row = |r: usize, o: &mut [std::mem::MaybeUninit<f32>]| {
        let base = (r / k) * n * inner;
        for (i, o) in o.iter_mut().enumerate() {
            o.write(x[base + idx[r * inner + i] * inner + i]);
        }
    };
    Ok(build(total, |out| {
        each_chunk(out, inner, total >= PAR_MIN, row)
    }))
}

/// Gradient of `gather`: zeros `[outer, n, inner]` with `g[o, j, i]` added at
/// `[o, idx[o, j, i], i]` (in order of `j`; in parallel over `outer`).
pub(crate) fn scatter_add(
    g: &[f32],
    idx: &[f32],
    (outer, n, inner): (usize, usize, usize),
) -> Result<CpuStorage> {
    let idx = check_indices("gather backward", idx, n)?;
    let mut out = vec![0.0; outer * n * inner];
    if out.is_empty() || idx.is_empty() {
        return Ok(out);
    }
    let k = idx.len() / (outer * inner);
    let block = |o: usize, dst: &mut [f32]| {
        for j in 0..k {
            let src = (o * k + j) * inner;
            for i in 0..inner {
                dst[idx[src + i] * inner + i] += g[src + i];
            }
        }
    };
    each_chunk(&mut out, n * inner, g.len() >= PAR_MIN && outer > 1, block);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn select_gather_and_their_gradients_by_hand() {
        // x [1, 3, 2]: rows (0, 1), (2, 3), (4, 5).
        let x = [0., 1., 2., 3., 4., 5.];
        assert_eq!(
            index_select(&x, &[2., 0., 2.], (1, 3, 2)).unwrap(),
            vec![4., 5., 0., 1., 4., 5.]
        );
        let g = [1., 1., 2., 2., 3., 3.];
        assert_eq!(
            index_add(&g, &[2., 0., 2.], (1, 3, 2)).unwrap(),
            vec![2., 2., 0., 0., 4., 4.]
        );
        assert_eq!(gather(&x, &[1., 0.], (1, 3, 2)).unwrap(), vec![2., 1.]);
        assert_eq!(
            scatter_add(&[5., 7.], &[1., 1.], (1, 3, 2)).unwrap(),
            vec![0., 0., 5., 7., 0., 0.]
        );
        for bad in [-1.0, 3.0, 0.5, f32::NAN] {
            assert!(index_select(&x, &[bad], (1, 3, 2)).is_err());
            assert!(gather(&x, &[bad, 0.], (1, 3, 2)).is_err());
        }
    }
}
