//! Matrix products through the `gemm` crate, which picks AVX-512 / AVX2+FMA / scalar kernels at
//! run time. Threads: a large product is cut into one column block per rayon thread, each a
//! single-threaded gemm call; small batched products run one product per task.

use super::CpuStorage;
use crate::error::{Result, TensorError};
use crate::layout::Layout;
use crate::work::{self, Deadline};
use gemm::Parallelism;
use rayon::prelude::*;
use std::mem::MaybeUninit;
use std::ops::Range;

const OP: &str = "matmul";

/// Products this small (m*n*k) gain nothing from threads inside one product.
const SMALL_PRODUCT: usize = 64 * 64 * 64;

/// Narrowest column block worth a thread of its own.
const MIN_COLS: usize = 64;

/// Least work (m * k * columns) per column block for the split to pay: a block must outlast a
/// sleeping rayon worker's wake-up, or the calling thread ends up running every block itself
/// (measured: 256^3 split in two ran at one thread's speed).
const MIN_BLOCK_WORK: usize = 1 << 24;

/// Element offset of batch entry `b` for a layout whose leading `batch.len()` dims are the batch.
fn batch_offset(mut b: usize, batch: &[usize], layout: &Layout) -> usize {
    let mut offset = layout.offset();
    for (&dim, &stride) in batch.iter().zip(layout.strides()).rev() {
        offset += (b % dim) * stride;
        b /= dim;
    }
    offset
}

/// Highest element index a layout reaches (for the bounds check before raw-pointer kernels).
fn last_index(layout: &Layout) -> usize {
    layout.offset()
        + layout
            .shape()
            .iter()
            .zip(layout.strides())
            .map(|(&d, &s)| d.saturating_sub(1) * s)
            .sum::<usize>()
}

/// `[batch.., m, k] @ [batch.., k, n]` where both layouts are already broadcast to the batch
/// shape; any strides (transposed views cost nothing). Output is dense `[batch.., m, n]`, not
/// zero-filled first: every product overwrites its block (an empty inner dimension gives zeros).
pub(crate) fn matmul(
    a: &[f32],
    la: &Layout,
    b: &[f32],
    lb: &Layout,
    m: usize,
    k: usize,
    n: usize,
) -> Result<CpuStorage> {
    let count: usize = la.shape()[..la.rank() - 2].iter().product();
    let deadline = Deadline::current();
    let work = work::product(&[count, m, k, n]);
    if deadline.is_set() && work > CHUNK_WORK {
        return super::try_build(count * m * n, |dst| {
            matmul_chunked(dst, a, la, b, lb, (m, k, n), deadline)
        });
    }
    Ok(super::build(count * m * n, |dst| {
        matmul_into(dst, a, la, b, lb, m, k, n)
    }))
}

/// Multiply-adds of one chunk of a product run under a deadline: a few milliseconds on a core.
const CHUNK_WORK: u64 = 1 << 28;

/// Multiply-adds of one chunk of the inner dimension, when one row is more than a chunk.
const INNER_CHUNK_WORK: u64 = 1 << 25;

/// [`matmul`] of a large product under a deadline: in chunks of rows of each product, each
/// run as a product of its own by [`matmul_into`] (its threading included), or, when one row
/// is itself more than a chunk, one row at a time in chunks of the inner dimension added up in
/// place; the clock is looked at between chunks. Past the deadline it stops with an error and
/// `dst` is dropped by the caller. Products of honest shapes are cut by rows only.
fn matmul_chunked(
    dst: &mut [MaybeUninit<f32>],
    a: &[f32],
    la: &Layout,
    b: &[f32],
    lb: &Layout,
    (m, k, n): (usize, usize, usize),
    deadline: Deadline,
) -> Result<()> {
    let rank = la.rank();
    let batch = &la.shape()[..rank - 2];
    let count: usize = batch.iter().product();
    if dst.len() != count * m * n {
        return Err(TensorError::Internal {
            op: OP,
            reason: "matmul destination of the wrong size".into(),
        });
    }
    if dst.is_empty() || k == 0 {
        dst.fill(MaybeUninit::new(0.0));
        return Ok(());
    }
    if last_index(la) >= a.len() || last_index(lb) >= b.len() {
        return Err(TensorError::Internal {
            op: OP,
            reason: "matmul operand out of bounds".into(),
        });
    }
    let (a_rs, a_cs) = (la.strides()[rank - 2], la.strides()[rank - 1]);
    let (b_rs, b_cs) = (lb.strides()[rank - 2], lb.strides()[rank - 1]);
    let row_work = work::product(&[k, n]);
    let rows_per = usize::try_from(CHUNK_WORK / row_work.max(1))
        .unwrap_or(m)
        .clamp(1, m);
    // Only crafted shapes (an inner dimension of millions) come here: smaller chunks, a single
    // row each, stop them sooner.
    let k_per = match row_work > CHUNK_WORK {
        true => usize::try_from(INNER_CHUNK_WORK / n as u64)
            .unwrap_or(k)
            .clamp(1, k),
        false => k,
    };
    let par = match rayon::current_num_threads() > 1 {
        true => Parallelism::Rayon(0),
        false => Parallelism::None,
    };
    let mut meter = deadline.meter(OP);
    let product_work = work::product(&[m, k, n]);
    if product_work <= CHUNK_WORK {
        // Whole products, as many per chunk as fit, through the usual paths.
        let per = usize::try_from(CHUNK_WORK / product_work.max(1))
            .unwrap_or(count)
            .clamp(1, count);
        for (c, group) in dst.chunks_mut(per * m * n).enumerate() {
            let products = c * per..(c * per + per).min(count);
            let done = work::product(&[products.len(), m, k, n]);
            matmul_products(group, a, la, b, lb, (m, k, n), products);
            meter.add(done)?;
        }
        return Ok(());
    }
    for (i, product) in dst.chunks_mut(m * n).enumerate() {
        let (oa, ob) = (batch_offset(i, batch, la), batch_offset(i, batch, lb));
        for (c, block) in product.chunks_mut(rows_per * n).enumerate() {
            let (r0, rows) = (c * rows_per, block.len() / n);
            if k_per == k {
                // Rows alone: the block is a product of its own, through the usual paths.
                let la = Layout::from_parts(&[rows, k], &[a_rs, a_cs], oa + r0 * a_rs);
                let lb = Layout::from_parts(&[k, n], &[b_rs, b_cs], ob);
                matmul_into(block, a, &la, b, &lb, rows, k, n);
                meter.add(work::product(&[rows, k, n]))?;
                continue;
            }
            let out = DstPtr(block.as_mut_ptr().cast());
            for k0 in (0..k).step_by(k_per) {
                let inner = k_per.min(k - k0);
                // SAFETY: `out` is this block of `rows x n` elements, written by one call at a
                // time; every index the strides reach from these offsets is at most the
                // operands' last index, bounds-checked above. A chunk after the first reads what
                // the one before it wrote (`read_dst`), so every read is initialised.
                unsafe {
                    gemm::gemm(
                        rows,
                        n,
                        inner,
                        out.at(0),
                        1,
                        n as isize,
                        k0 > 0,
                        a.as_ptr().add(oa + r0 * a_rs + k0 * a_cs),
                        a_cs as isize,
                        a_rs as isize,
                        b.as_ptr().add(ob + k0 * b_rs),
                        b_cs as isize,
                        b_rs as isize,
                        1.0,
                        1.0,
                        false,
                        false,
                        false,
                        par,
                    )
                }
                meter.add(work::product(&[rows, inner, n]))?;
            }
        }
    }
    Ok(())
}

/// [`matmul`] into `dst` (`batch * m * n` elements), which need not be initialised: every
/// element is written (gemm's `read_dst = false` stores `lhs * rhs` without reading `dst`).
#[allow(clippy::too_many_arguments)]
fn matmul_into(
    dst: &mut [MaybeUninit<f32>],
    a: &[f32],
    la: &Layout,
    b: &[f32],
    lb: &Layout,
    m: usize,
    k: usize,
    n: usize,
) {
    let count: usize = la.shape()[..la.rank() - 2].iter().product();
    matmul_products(dst, a, la, b, lb, (m, k, n), 0..count);
}

/// [`matmul_into`] of the products `products` of the batch only, into `dst` (their
/// `products.len() * m * n` elements).
fn matmul_products(
    dst: &mut [MaybeUninit<f32>],
    a: &[f32],
    la: &Layout,
    b: &[f32],
    lb: &Layout,
    (m, k, n): (usize, usize, usize),
    products: Range<usize>,
) {
    let rank = la.rank();
    let batch = &la.shape()[..rank - 2];
    let first = products.start;
    let count = products.len();
    assert_eq!(
        dst.len(),
        count * m * n,
        "matmul destination of the wrong size"
    );
    if dst.is_empty() || k == 0 {
        dst.fill(MaybeUninit::new(0.0));
        return;
    }
    assert!(
        last_index(la) < a.len() && last_index(lb) < b.len(),
        "matmul operand out of bounds"
    );
    let (a_rs, a_cs) = (
        la.strides()[rank - 2] as isize,
        la.strides()[rank - 1] as isize,
    );
    let (b_rs, b_cs) = (
        lb.strides()[rank - 2] as isize,
        lb.strides()[rank - 1] as isize,
    );
    let dst = DstPtr(dst.as_mut_ptr().cast());
    // Computes columns `cols` of product `i` into its m x n block of `dst`.
    let block = |i: usize, cols: Range<usize>, par: Parallelism| {
        let (oa, ob) = (batch_offset(i, batch, la), batch_offset(i, batch, lb));
        // SAFETY: blocks written by different calls never overlap (distinct products or distinct
        // column ranges), `dst` holds every block (its length was checked above) and outlives
        // every call (they all finish before this function returns), and every index the
        // strides reach in `a` and `b` was bounds-checked above.
        unsafe {
            gemm::gemm(
                m,
                cols.len(),
                k,
                dst.at((i - first) * m * n + cols.start),
                1,
                n as isize,
                false,
                a.as_ptr().add(oa),
                a_cs,
                a_rs,
                b.as_ptr().add(ob).offset(cols.start as isize * b_cs),
                b_cs,
                b_rs,
                0.0,
                1.0,
                false,
                false,
                false,
                par,
            )
        }
    };
    let threads = rayon::current_num_threads();
    if m.saturating_mul(n).saturating_mul(k) < SMALL_PRODUCT {
        // Small products: one per task, no threads inside.
        products
            .into_par_iter()
            .for_each(|i| block(i, 0..n, Parallelism::None));
    } else if threads > 1
        && n >= 2 * MIN_COLS
        && m.saturating_mul(k).saturating_mul(n / threads) >= MIN_BLOCK_WORK
    {
        // One independent single-threaded product per column block and thread: gemm's own
        // threading synchronises several times per product, which costs more than it gains at
        // training shapes (m = batch = 128). Blocks are multiples of 16 columns.
        let parts = threads.min(n / MIN_COLS);
        let width = n.div_ceil(parts).next_multiple_of(16);
        let jobs: Vec<(usize, Range<usize>)> = products
            .flat_map(|i| {
                (0..n)
                    .step_by(width)
                    .map(move |c| (i, c..(c + width).min(n)))
            })
            .collect();
        jobs.into_par_iter()
            .for_each(|(i, cols)| block(i, cols, Parallelism::None));
    } else {
        let par = if threads > 1 {
            Parallelism::Rayon(0)
        } else {
            Parallelism::None
        };
        products.for_each(|i| block(i, 0..n, par));
    }
}

/// The output pointer, shared by the tasks that write disjoint blocks of it.
#[derive(Clone, Copy)]
struct DstPtr(*mut f32);
impl DstPtr {
    /// The pointer `offset` elements in (a method, so closures capture the whole wrapper).
    ///
    /// # Safety
    /// `offset` must stay inside the output buffer.
    unsafe fn at(self, offset: usize) -> *mut f32 {
        // SAFETY: per the caller's contract.
        unsafe { self.0.add(offset) }
    }
}

// SAFETY: tasks only write disjoint blocks through it, and all finish before the buffer is used.
unsafe impl Send for DstPtr {}
// SAFETY: as above.
unsafe impl Sync for DstPtr {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_and_transposed_operands() {
        let a = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]; // [2, 3]
        let b = [1.0, 0.0, 0.0, 1.0, 1.0, 1.0]; // [3, 2]
        let la = Layout::contiguous(&[2, 3]);
        let lb = Layout::contiguous(&[3, 2]);
        assert_eq!(
            matmul(&a, &la, &b, &lb, 2, 3, 2).unwrap(),
            vec![4.0, 5.0, 10.0, 11.0]
        );
        // a^T a via a transposed view: [3, 2] @ [2, 3]
        let at = la.transpose(0, 1);
        let r = matmul(&a, &at, &a, &la, 3, 2, 3).unwrap();
        assert_eq!(r, vec![17., 22., 27., 22., 29., 36., 27., 36., 45.]);
    }

    /// Every path (one product per task, column blocks per thread, gemm's own threads) writes
    /// every element without reading the destination: the output starts as NaN.
    #[test]
    fn every_element_is_written_over_a_destination_of_nan() {
        let shapes = [
            (1, 1, 1, 1),
            (1, 1, 7, 3),
            (2, 5, 4, 1),
            (3, 3, 2, 17),
            (1, 70, 70, 70),
            (1, 128, 128, 512),
            // Column blocks, one per thread, from 2 threads on (m * k * n / 2 = 2^24).
            (1, 256, 256, 512),
            (2, 9, 300, 260),
        ];
        for threads in [1, 2, 3] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            for &(batch, m, k, n) in &shapes {
                let a: Vec<f32> = (0..batch * m * k).map(|i| (i % 13) as f32 - 6.0).collect();
                let b: Vec<f32> = (0..batch * k * n).map(|i| (i % 7) as f32 - 3.0).collect();
                let la = Layout::contiguous(&[batch, m, k]);
                // `b` as the transpose of an `[batch, n, k]` tensor: strided operands too.
                let lb = Layout::contiguous(&[batch, n, k]).transpose(1, 2);
                let mut got = vec![f32::NAN; batch * m * n];
                // SAFETY: matmul_into writes only computed values.
                let dst = unsafe { super::super::as_uninit(&mut got) };
                pool.install(|| matmul_into(dst, &a, &la, &b, &lb, m, k, n));
                for (idx, g) in got.iter().enumerate() {
                    let (p, i, j) = (idx / (m * n), idx / n % m, idx % n);
                    let want: f32 = (0..k)
                        .map(|t| a[(p * m + i) * k + t] * b[(p * n + j) * k + t])
                        .sum();
                    assert_eq!(
                        *g, want,
                        "[{batch}, {m}, {k}] @ [{k}, {n}] at {idx}, {threads} threads"
                    );
                }
            }
        }
    }
}
