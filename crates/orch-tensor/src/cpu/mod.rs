//! The CPU backend: plain `Vec<f32>` storage, loops over contiguous slices that the compiler
//! vectorises, rayon over rows or chunks when the work is large enough to pay for it, and
//! matrix products through the `gemm` crate on all cores.

pub(crate) mod attention;
pub(crate) mod conv;
#[cfg(target_arch = "x86_64")]
mod conv_avx512;
mod dropout;
mod elementwise;
mod index;
mod matmul;
mod nn;
pub(crate) mod norm;
mod optim;
pub(crate) mod pool;
mod reduce;
pub(crate) mod simd;
mod slice_gemm;
mod strided;

pub(crate) use dropout::dropout;
pub(crate) use elementwise::{binary, map, unary};
pub(crate) use index::{
    check_indices, gather as gather_axis, index_add, index_select, scatter_add,
};
pub(crate) use matmul::matmul;
pub(crate) use nn::{cross_entropy, cross_entropy_grad, label_index, softmax_last};
pub(crate) use optim::update;
pub(crate) use reduce::{argmax, reduce};
pub(crate) use strided::{gather, scatter, zip_map};

/// CPU tensor data.
pub(crate) type CpuStorage = Vec<f32>;

/// Below this many elements a loop runs on the calling thread: rayon's fork/join costs a few
/// microseconds, about what 32k simple float ops take on one core.
pub(crate) const PAR_MIN: usize = 1 << 15;

/// Elements per rayon task for flat loops.
pub(crate) const PAR_CHUNK: usize = 1 << 14;

/// Runs `f(r, chunk)` on each chunk `r` of `width` elements of `out`, on rayon's threads when
/// `parallel` (the caller's size rule: usually at least [`PAR_MIN`] elements of work).
pub(crate) fn each_chunk<T: Send>(
    out: &mut [T],
    width: usize,
    parallel: bool,
    f: impl Fn(usize, &mut [T]) + Sync,
) {
    use rayon::prelude::*;
    if parallel {
        out.par_chunks_mut(width)
            .enumerate()
            .for_each(|(r, o)| f(r, o));
    } else {
        out.chunks_mut(width).enumerate().for_each(|(r, o)| f(r, o));
    }
}

/// A vector of `n` floats written by `fill`, without zeroing it first (one memory pass saved
/// per op). `fill` must write every element; all callers write each index exactly once.
pub(crate) fn build(n: usize, fill: impl FnOnce(&mut [std::mem::MaybeUninit<f32>])) -> CpuStorage {
    let mut out = Vec::with_capacity(n);
    fill(&mut out.spare_capacity_mut()[..n]);
    // SAFETY: `fill` initialised elements 0..n (see above) and the capacity is at least n.
    unsafe { out.set_len(n) };
    out
}
