//! Reductions over one axis of dense data seen as `[outer, n, inner]`.

use super::{CpuStorage, PAR_MIN, each_chunk};
use crate::ops::ReduceOp;

const LANES: usize = 16;

/// Sum of a dense run with independent lanes, so the loop vectorises (f32 addition is not
/// associative, so the compiler will not reorder a plain fold).
fn sum_run(x: &[f32]) -> f32 {
    let mut acc = [0.0f32; LANES];
    let chunks = x.chunks_exact(LANES);
    let tail = chunks.remainder();
    for c in chunks {
        for (a, v) in acc.iter_mut().zip(c) {
            *a += *v;
        }
    }
    acc.iter().sum::<f32>() + tail.iter().sum::<f32>()
}

fn max_run(x: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; LANES];
    let chunks = x.chunks_exact(LANES);
    let tail = chunks.remainder();
    for c in chunks {
        for (a, v) in acc.iter_mut().zip(c) {
            *a = a.max(*v);
        }
    }
    acc.iter()
        .chain(tail)
        .fold(f32::NEG_INFINITY, |m, v| m.max(*v))
}

/// Reduces axis of length `n` of dense `x` shaped `[outer, n, inner]` to `[outer, inner]`.
pub(crate) fn reduce(op: ReduceOp, x: &[f32], outer: usize, n: usize, inner: usize) -> CpuStorage {
    let mut out = vec![0.0; outer * inner];
    if out.is_empty() {
        return out;
    }
    let block = n * inner;
    let body = |o: usize, dst: &mut [f32]| {
        let src = &x[o * block..(o + 1) * block];
        if inner == 1 {
            dst[0] = match op {
                ReduceOp::Sum => sum_run(src),
                ReduceOp::Max => max_run(src),
            };
            return;
        }
        match op {
            ReduceOp::Sum => dst.fill(0.0),
            ReduceOp::Max => dst.fill(f32::NEG_INFINITY),
        }
        for row in src.chunks_exact(inner) {
            match op {
                ReduceOp::Sum => dst.iter_mut().zip(row).for_each(|(d, v)| *d += *v),
                ReduceOp::Max => dst.iter_mut().zip(row).for_each(|(d, v)| *d = d.max(*v)),
            }
        }
    };
    each_chunk(&mut out, inner, x.len() >= PAR_MIN && outer > 1, body);
    out
}

/// Index (as f32) of the first largest value along the axis, shaped `[outer, inner]`.
pub(crate) fn argmax(x: &[f32], outer: usize, n: usize, inner: usize) -> CpuStorage {
    let mut out = vec![0.0; outer * inner];
    for o in 0..outer {
        for i in 0..inner {
            let mut best = 0;
            let mut best_value = f32::NEG_INFINITY;
            for k in 0..n {
                let v = x[(o * n + k) * inner + i];
                if v > best_value || (k == 0 && v.is_nan()) {
                    best = k;
                    best_value = v;
                }
            }
            out[o * inner + i] = best as f32;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reduces_middle_and_last_axes() {
        let x: Vec<f32> = (0..24).map(|v| v as f32).collect(); // [2, 3, 4]
        assert_eq!(
            reduce(ReduceOp::Sum, &x, 2, 3, 4),
            vec![12., 15., 18., 21., 48., 51., 54., 57.]
        );
        assert_eq!(
            reduce(ReduceOp::Max, &x, 6, 4, 1),
            vec![3., 7., 11., 15., 19., 23.]
        );
        let long: Vec<f32> = (0..100).map(|v| v as f32).collect();
        assert_eq!(reduce(ReduceOp::Sum, &long, 1, 100, 1), vec![4950.0]);
        assert_eq!(argmax(&[1., 5., 5., 0.], 1, 4, 1), vec![1.0]);
    }
}
