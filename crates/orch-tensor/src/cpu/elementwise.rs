//! Elementwise kernels. The op table (ops/table.rs) gives each op's f32 expression; the loops
//! here are generic over it, so each op is matched once per call and runs a monomorphised loop.

use super::{CpuStorage, PAR_CHUNK, PAR_MIN, build};
use crate::layout::Layout;
use crate::ops::{BinaryOp, UnaryOp};
use rayon::prelude::*;
use std::mem::MaybeUninit;

/// `f` over a dense slice, in parallel chunks when large.
pub(crate) fn map<F: Fn(f32) -> f32 + Sync>(x: &[f32], f: F) -> CpuStorage {
    // Every chunk of the output is written in full from the matching chunk of `x`.
    let body = |i: usize, o: &mut [MaybeUninit<f32>]| {
        super::simd::fill_unary(o, &x[i * PAR_CHUNK..], &f);
    };
    build(x.len(), |out| {
        if x.len() >= PAR_MIN {
            out.par_chunks_mut(PAR_CHUNK)
                .enumerate()
                .for_each(|(i, o)| body(i, o));
        } else {
            body(0, out);
        }
    })
}

/// `op` over a dense slice.
pub(crate) fn unary(op: UnaryOp, x: &[f32]) -> CpuStorage {
    op.cpu(x)
}

/// `op` over two layouts broadcast to the same shape.
pub(crate) fn binary(op: BinaryOp, a: &[f32], la: &Layout, b: &[f32], lb: &Layout) -> CpuStorage {
    op.cpu(a, la, b, lb)
}
