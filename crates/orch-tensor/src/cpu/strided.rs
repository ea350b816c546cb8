//! Loops over strided (viewed or broadcast) data: dimensions are coalesced first, then each run of
//! the innermost dimension is one tight loop specialised on its strides (1, 0 or other).

use super::{CpuStorage, PAR_MIN, build};
use crate::layout::Layout;
use rayon::prelude::*;
use std::mem::MaybeUninit;

/// Storage offset of the start of row `row` (a run of the innermost dimension).
#[inline]
fn row_offset(mut row: usize, outer_dims: &[usize], strides: &[usize], base: usize) -> usize {
    let mut offset = base;
    for (&dim, &stride) in outer_dims.iter().zip(strides).rev() {
        offset += (row % dim) * stride;
        row /= dim;
    }
    offset
}

/// Runs `body(row, out_row)` over every innermost run of `out`, in parallel when large.
fn for_each_row(
    out: &mut [MaybeUninit<f32>],
    inner: usize,
    body: impl Fn(usize, &mut [MaybeUninit<f32>]) + Sync,
) {
    if out.len() >= PAR_MIN && out.len() > inner {
        out.par_chunks_mut(inner)
            .enumerate()
            .for_each(|(r, o)| body(r, o));
    } else {
        out.chunks_mut(inner)
            .enumerate()
            .for_each(|(r, o)| body(r, o));
    }
}

/// A dense row-major copy of the viewed elements.
pub(crate) fn gather(x: &[f32], layout: &Layout) -> CpuStorage {
    if let Some(range) = layout.contiguous_range() {
        return x[range].to_vec();
    }
    let n = layout.numel();
    if n == 0 {
        return Vec::new();
    }
    let (dims, strides) = Layout::coalesce(layout.shape(), &[layout]);
    let (outer, inner) = dims.split_at(dims.len() - 1);
    let inner = inner[0];
    let s = strides[0][dims.len() - 1];
    // Each row of `inner` outputs is written in full.
    build(n, |out| {
        for_each_row(out, inner, |row, o| {
            let start = row_offset(row, outer, &strides[0], layout.offset());
            if s == 1 {
                for (o, v) in o.iter_mut().zip(&x[start..start + inner]) {
                    o.write(*v);
                }
            } else {
                for (j, o) in o.iter_mut().enumerate() {
                    o.write(x[start + j * s]);
                }
            }
        })
    })
}

/// Writes the dense `src` into the elements `dst_layout` views (no broadcast dims allowed).
pub(crate) fn scatter(dst: &mut [f32], dst_layout: &Layout, src: &[f32]) {
    if src.is_empty() {
        return;
    }
    if let Some(range) = dst_layout.contiguous_range() {
        dst[range].copy_from_slice(src);
        return;
    }
    let (dims, strides) = Layout::coalesce(dst_layout.shape(), &[dst_layout]);
    let inner = dims[dims.len() - 1];
    let s = strides[0][dims.len() - 1];
    for (row, chunk) in src.chunks(inner).enumerate() {
        let start = row_offset(
            row,
            &dims[..dims.len() - 1],
            &strides[0],
            dst_layout.offset(),
        );
        for (j, v) in chunk.iter().enumerate() {
            dst[start + j * s] = *v;
        }
    }
}

/// `f(a, b)` over two layouts already broadcast to one shape. Every branch below writes each
/// output element exactly once.
pub(crate) fn zip_map<F>(a: &[f32], la: &Layout, b: &[f32], lb: &Layout, f: F) -> CpuStorage
where
    F: Fn(f32, f32) -> f32 + Sync,
{
    let n = la.numel();
    if n == 0 {
        return Vec::new();
    }
    if let (Some(ra), Some(rb)) = (la.contiguous_range(), lb.contiguous_range()) {
        let (a, b) = (&a[ra], &b[rb]);
        let chunk = super::PAR_CHUNK;
        let body = |i: usize, o: &mut [MaybeUninit<f32>]| {
            let start = i * chunk;
            super::simd::fill_binary(o, &a[start..], &b[start..], &f);
        };
        return build(n, |out| {
            if n >= PAR_MIN {
                out.par_chunks_mut(chunk)
                    .enumerate()
                    .for_each(|(i, o)| body(i, o));
            } else {
                body(0, out);
            }
        });
    }
    let (dims, strides) = Layout::coalesce(la.shape(), &[la, lb]);
    let last = dims.len() - 1;
    let (outer, inner) = (&dims[..last], dims[last]);
    let (sa, sb) = (strides[0][last], strides[1][last]);
    build(n, |out| {
        for_each_row(out, inner, |row, o| {
            let oa = row_offset(row, outer, &strides[0], la.offset());
            let ob = row_offset(row, outer, &strides[1], lb.offset());
            match (sa, sb) {
                (1, 1) => {
                    super::simd::fill_binary(o, &a[oa..oa + inner], &b[ob..ob + inner], &f);
                }
                (1, 0) => {
                    let y = b[ob];
                    super::simd::fill_unary(o, &a[oa..oa + inner], &|x| f(x, y));
                }
                (0, 1) => {
                    let x = a[oa];
                    super::simd::fill_unary(o, &b[ob..ob + inner], &|y| f(x, y));
                }
                _ => {
                    for (j, o) in o.iter_mut().enumerate() {
                        o.write(f(a[oa + j * sa], b[ob + j * sb]));
                    }
                }
            }
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gather_transposed_and_narrowed() {
        let x: Vec<f32> = (0..6).map(|v| v as f32).collect();
        let t = Layout::contiguous(&[2, 3]).transpose(0, 1);
        assert_eq!(gather(&x, &t), vec![0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
        let n = Layout::contiguous(&[2, 3]).narrow(1, 1, 2);
        assert_eq!(gather(&x, &n), vec![1.0, 2.0, 4.0, 5.0]);
        let mut d = vec![0.0; 6];
        scatter(&mut d, &n, &[9.0, 8.0, 7.0, 6.0]);
        assert_eq!(d, vec![0.0, 9.0, 8.0, 0.0, 7.0, 6.0]);
    }

    #[test]
    fn zip_map_broadcasts_rows_and_columns() {
        let a: Vec<f32> = (0..6).map(|v| v as f32).collect();
        let la = Layout::contiguous(&[2, 3]);
        let row = Layout::contiguous(&[3]).broadcast_as("t", &[2, 3]).unwrap();
        let col = Layout::contiguous(&[2, 1])
            .broadcast_as("t", &[2, 3])
            .unwrap();
        let b = [10.0, 20.0, 30.0];
        assert_eq!(
            zip_map(&a, &la, &b, &row, |x, y| x + y),
            vec![10., 21., 32., 13., 24., 35.]
        );
        assert_eq!(
            zip_map(&a, &la, &b, &col, |x, y| x + y),
            vec![10., 11., 12., 23., 24., 25.]
        );
        assert_eq!(
            zip_map(&b, &col, &a, &la, |x, y| x - y),
            vec![10., 9., 8., 17., 16., 15.]
        );
    }
}
