//! Elementwise kernels. Each op is matched once per call and runs a monomorphised loop.

use super::strided::zip_map;
use super::{CpuStorage, PAR_CHUNK, PAR_MIN, build};
use crate::layout::Layout;
use crate::ops::{self, BinaryOp, UnaryOp};
use rayon::prelude::*;
use std::mem::MaybeUninit;

fn map<F: Fn(f32) -> f32 + Sync>(x: &[f32], f: F) -> CpuStorage {
    // Every chunk of the output is written in full from the matching chunk of `x`.
    let body = |i: usize, o: &mut [MaybeUninit<f32>]| {
        for (o, v) in o.iter_mut().zip(&x[i * PAR_CHUNK..]) {
            o.write(f(*v));
        }
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
    match op {
        UnaryOp::Neg => map(x, |v| -v),
        UnaryOp::Relu => map(x, |v| if v > 0.0 { v } else { 0.0 }),
        UnaryOp::Gelu => map(x, ops::gelu),
        UnaryOp::Tanh => map(x, f32::tanh),
        UnaryOp::Sigmoid => map(x, ops::sigmoid),
        UnaryOp::Exp => map(x, f32::exp),
        UnaryOp::Log => map(x, f32::ln),
        UnaryOp::Sqr => map(x, |v| v * v),
        UnaryOp::Affine { mul, add } => map(x, |v| v.mul_add(mul, add)),
    }
}

/// `op` over two layouts broadcast to the same shape.
pub(crate) fn binary(op: BinaryOp, a: &[f32], la: &Layout, b: &[f32], lb: &Layout) -> CpuStorage {
    match op {
        BinaryOp::Add => zip_map(a, la, b, lb, |x, y| x + y),
        BinaryOp::Sub => zip_map(a, la, b, lb, |x, y| x - y),
        BinaryOp::Mul => zip_map(a, la, b, lb, |x, y| x * y),
        BinaryOp::Div => zip_map(a, la, b, lb, |x, y| x / y),
        BinaryOp::Eq => zip_map(a, la, b, lb, |x, y| if x == y { 1.0 } else { 0.0 }),
        BinaryOp::ReluGrad => zip_map(a, la, b, lb, |g, x| if x > 0.0 { g } else { 0.0 }),
        BinaryOp::GeluGrad => zip_map(a, la, b, lb, |g, x| g * ops::gelu_grad(x)),
        BinaryOp::TanhGrad => zip_map(a, la, b, lb, |g, y| g * (1.0 - y * y)),
        BinaryOp::SigmoidGrad => zip_map(a, la, b, lb, |g, y| g * y * (1.0 - y)),
    }
}
