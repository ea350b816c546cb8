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
    if deadline.is_set() && work > chunk_work() {
        return super::try_build(count * m * n, |dst| {
            matmul_chunked(dst, a, la, b, lb, (m, k, n), deadline)
        });
    }
    Ok(super::build(count * m * n, |dst| {
        matmul_into(dst, a, la, b, lb, m, k, n)
    }))
}

/// Multiply-adds of one chunk of a product run under a deadline, per thread of the pool: 20
/// to 40 milliseconds of a core, large enough that a chunk is a cache-friendly product of
/// its own (its operands' blocks read a few times over, not once per row).
const CHUNK_WORK_PER_THREAD: u64 = 1 << 31;

/// Multiply-adds of one chunk when the inner dimension has to be cut: such blocks are narrow
/// (a row or a few), gemv-like and memory-bound, far below the peak rate, so smaller chunks
/// keep a crafted product's stop near its deadline.
const INNER_CHUNK_WORK: u64 = 1 << 25;

/// Fewest rows (and columns) of a chunk's block of the output, where the product has them:
/// below this a block's operands are read again too often for the work done on them.
const MIN_TILE: usize = 256;

/// Multiply-adds of one chunk under a deadline, in the pool the op runs in.
fn chunk_work() -> u64 {
    CHUNK_WORK_PER_THREAD.saturating_mul(rayon::current_num_threads().max(1) as u64)
}

/// `want` clamped to `lo..=hi`; below `hi`, rounded down to a multiple of 16 (not below `lo`).
fn fit(want: u64, lo: usize, hi: usize, round: bool) -> usize {
    let v = usize::try_from(want).unwrap_or(hi).clamp(lo, hi);
    match round && v < hi && v >= 16 {
        true => (v / 16 * 16).max(lo),
        false => v,
    }
}

/// The block `(rows, columns, inner)` each chunk of an `m x k @ k x n` product computes, about
/// `chunk` multiply-adds: the longer side of the output is cut first, down to [`MIN_TILE`],
/// then the other; the inner dimension only when a `MIN_TILE`-square block is still more than
/// a chunk (crafted shapes: an inner dimension of millions), in [`INNER_CHUNK_WORK`] parts.
fn tile(m: usize, k: usize, n: usize, chunk: u64) -> (usize, usize, usize) {
    let work = |r: usize, c: usize, i: usize| work::product(&[r, c, i]);
    let (mut r, mut c, mut i) = (m, n, k);
    let cut_rows_first = m >= n;
    for cut_rows in [cut_rows_first, !cut_rows_first] {
        if work(r, c, i) <= chunk {
            break;
        }
        if cut_rows {
            r = fit(chunk / work(1, c, i), m.min(MIN_TILE), m, false);
        } else {
            c = fit(chunk / work(r, 1, i), n.min(MIN_TILE), n, true);
        }
    }
    if work(r, c, i) > chunk {
        i = fit(INNER_CHUNK_WORK / work(r, c, 1), 1, k, false);
    }
    (r, c, i)
}

/// [`matmul`] of a large product under a deadline: whole products, as many per chunk as fit,
/// or, for a product larger than a chunk, blocks of its output ([`tile`]), each computed by
/// large single-threaded gemm calls on the pool's threads (a block's columns, or rows, shared
/// out), in chunks of the inner dimension added up in place where a block has to be cut that
/// way too; the clock is looked at between chunks. Past the deadline it stops with an error and
/// `dst` is dropped by the caller.
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
    let chunk = chunk_work();
    let mut meter = deadline.meter(OP);
    let product_work = work::product(&[m, k, n]);
    if product_work <= chunk {
        // Whole products, as many per chunk as fit, through the usual paths.
        let per = usize::try_from(chunk / product_work.max(1))
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
    let (rows_per, cols_per, k_per) = tile(m, k, n, chunk);
    let threads = rayon::current_num_threads();
    let out = DstPtr(dst.as_mut_ptr().cast());
    for p in 0..count {
        let (oa, ob) = (batch_offset(p, batch, la), batch_offset(p, batch, lb));
        for r0 in (0..m).step_by(rows_per) {
            let rows = rows_per.min(m - r0);
            for c0 in (0..n).step_by(cols_per) {
                let cols = cols_per.min(n - c0);
                for k0 in (0..k).step_by(k_per) {
                    let inner = k_per.min(k - k0);
                    // Rows r0.. and columns c0.. of product p, inner indices k0..k0 + inner.
                    let part = |rs: Range<usize>, cs: Range<usize>, par: Parallelism| {
                        // SAFETY: parts written at the same time are disjoint blocks of product
                        // p's `m x n` block of `dst` (which holds `count * m * n` elements,
                        // checked above, and outlives every call); every index the strides
                        // reach in `a` and `b` was bounds-checked above. A part with k0 > 0
                        // reads what the part with the inner indices before it wrote
                        // (`read_dst`), so every read is initialised.
                        unsafe {
                            gemm::gemm(
                                rs.len(),
                                cs.len(),
                                inner,
                                out.at(p * m * n + rs.start * n + cs.start),
                                1,
                                n as isize,
                                k0 > 0,
                                a.as_ptr().add(oa + rs.start * a_rs + k0 * a_cs),
                                a_cs as isize,
                                a_rs as isize,
                                b.as_ptr().add(ob + k0 * b_rs + cs.start * b_cs),
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
                    };
                    let per_thread = work::product(&[rows, inner, cols]) / threads.max(1) as u64;
                    if threads > 1 && per_thread >= MIN_BLOCK_WORK as u64 && cols >= 2 * MIN_COLS {
                        // The block's columns shared out, one single-threaded gemm per thread.
                        let parts = threads.min(cols / MIN_COLS);
                        let width = cols.div_ceil(parts).next_multiple_of(16);
                        (c0..c0 + cols)
                            .step_by(width)
                            .collect::<Vec<_>>()
                            .into_par_iter()
                            .for_each(|c| {
                                part(
                                    r0..r0 + rows,
                                    c..(c + width).min(c0 + cols),
                                    Parallelism::None,
                                )
                            });
                    } else if threads > 1 && per_thread >= MIN_BLOCK_WORK as u64 && rows >= 2 * 16 {
                        // Too few columns: the rows shared out instead.
                        let height = rows.div_ceil(threads).max(16);
                        (r0..r0 + rows)
                            .step_by(height)
                            .collect::<Vec<_>>()
                            .into_par_iter()
                            .for_each(|r| {
                                part(
                                    r..(r + height).min(r0 + rows),
                                    c0..c0 + cols,
                                    Parallelism::None,
                                )
                            });
                    } else {
                        let par = match threads > 1 {
                            true => Parallelism::Rayon(0),
                            false => Parallelism::None,
                        };
                        part(r0..r0 + rows, c0..c0 + cols, par);
                    }
                    meter.add(work::product(&[rows, inner, cols]))?;
                }
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
