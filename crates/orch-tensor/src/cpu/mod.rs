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
pub(crate) mod norm;
mod optim;
pub(crate) mod pool;
mod reduce;
pub(crate) mod simd;
mod slice_gemm;
mod softmax;
mod strided;

pub(crate) use dropout::dropout;
pub(crate) use elementwise::{binary, map, unary};
pub(crate) use index::{
    check_indices, gather as gather_axis, index_add, index_select, scatter_add,
};
pub(crate) use matmul::matmul;
pub(crate) use optim::update;
pub(crate) use reduce::{argmax, reduce};
pub(crate) use softmax::{cross_entropy, cross_entropy_grad, label_index, softmax_last};
pub(crate) use strided::{gather, scatter, zip_map};

use std::mem::MaybeUninit;

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

/// A vector of `n` floats written by `fill`, like [`build`], for kernels that may refuse their
/// arguments: on `Err` nothing is kept (the vector is dropped before it has a length). On `Ok`,
/// `fill` must have written every element.
pub(crate) fn try_build<E>(
    n: usize,
    fill: impl FnOnce(&mut [MaybeUninit<f32>]) -> Result<(), E>,
) -> Result<CpuStorage, E> {
    let mut out = Vec::with_capacity(n);
    fill(&mut out.spare_capacity_mut()[..n])?;
    // SAFETY: on Ok `fill` initialised elements 0..n (its contract) and the capacity is at
    // least n.
    unsafe { out.set_len(n) };
    Ok(out)
}

/// `s` as possibly uninitialised values, for a kernel that writes its output through
/// `MaybeUninit` (so that fresh outputs need no zeroing) called on an initialised slice.
///
/// # Safety
/// The caller writes only initialised values through the view (never `MaybeUninit::uninit()`),
/// so `s` stays initialised.
pub(crate) unsafe fn as_uninit<T: Copy>(s: &mut [T]) -> &mut [MaybeUninit<T>] {
    // SAFETY: `MaybeUninit<T>` has the layout of `T`; the caller keeps every element
    // initialised (above).
    unsafe { std::slice::from_raw_parts_mut(s.as_mut_ptr().cast(), s.len()) }
}

/// `s` once every element has been written.
///
/// # Safety
/// Every element of `s` is initialised.
pub(crate) unsafe fn assume_init<T: Copy>(s: &mut [MaybeUninit<T>]) -> &mut [T] {
    // SAFETY: the layouts agree and the caller initialised every element.
    unsafe { std::slice::from_raw_parts_mut(s.as_mut_ptr().cast(), s.len()) }
}

/// Fresh f32 storage to be written as `u32` bits (max pooling's indices).
pub(crate) fn uninit_bits(s: &mut [MaybeUninit<f32>]) -> &mut [MaybeUninit<u32>] {
    // SAFETY: `u32` and `f32` have the same size and alignment, and any `u32` written is a
    // valid `f32` bit pattern.
    unsafe { std::slice::from_raw_parts_mut(s.as_mut_ptr().cast(), s.len()) }
}

/// Max pooling's indices, kept as `u32` bits in f32 storage, read back in place.
pub(crate) fn bits_as_u32(s: &[f32]) -> &[u32] {
    // SAFETY: `u32` and `f32` have the same size and alignment and every bit pattern is a
    // valid `u32`.
    unsafe { std::slice::from_raw_parts(s.as_ptr().cast(), s.len()) }
}

/// Most f32 elements of workspace a thread keeps for the next op ([`with_scratch`]): 16 MiB.
const SCRATCH_KEEP: usize = 1 << 22;

/// Runs `f` on `n` elements of the calling thread's scratch memory, whose contents are what
/// the thread's last op left there (the kernels that take it write every element before they
/// read it). A thread keeps up to [`SCRATCH_KEEP`] elements between ops, so a training step's
/// convolutions reuse one buffer instead of allocating and zeroing their workspace each time;
/// a larger one is freed when `f` returns. A nested call gets a buffer of its own.
pub(crate) fn with_scratch<R>(n: usize, f: impl FnOnce(&mut [f32]) -> R) -> R {
    thread_local! {
        static SCRATCH: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
    }
    let mut buf = SCRATCH.take();
    if buf.len() < n {
        // Freed first: the old and the new buffer are never held together.
        drop(std::mem::take(&mut buf));
        buf = vec![0.0; n];
    }
    let out = f(&mut buf[..n]);
    if buf.len() <= SCRATCH_KEEP {
        SCRATCH.set(buf);
    }
    out
}

/// A vector of `n` floats written by `fill`, without zeroing it first (one memory pass saved
/// per op). `fill` must write every element; all callers write each index exactly once.
pub(crate) fn build(n: usize, fill: impl FnOnce(&mut [MaybeUninit<f32>])) -> CpuStorage {
    let mut out = Vec::with_capacity(n);
    fill(&mut out.spare_capacity_mut()[..n]);
    // SAFETY: `fill` initialised elements 0..n (see above) and the capacity is at least n.
    unsafe { out.set_len(n) };
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scratch_is_kept_for_the_next_op_and_a_nested_call_gets_its_own() {
        let first = with_scratch(1000, |s| s.as_ptr() as usize);
        // A smaller request reuses the kept buffer, with what the last op left in it.
        with_scratch(500, |s| {
            assert_eq!(s.as_ptr() as usize, first);
            s[0] = 7.0;
        });
        with_scratch(10, |outer| {
            assert_eq!(outer[0], 7.0);
            with_scratch(10, |inner| assert_ne!(inner.as_ptr(), outer.as_ptr()));
        });
        // A buffer over the cap is not kept: the next call starts from a fresh, zeroed one.
        with_scratch(SCRATCH_KEEP + 1, |s| s[0] = 1.0);
        with_scratch(4, |s| assert_eq!(s, [0.0; 4]));
    }
}
