//! 2-D max and average pooling over NCHW input (`F.max_pool2d`, `F.avg_pool2d`), with kernel,
//! stride and implicit padding, `ceil_mode=False`.
//!
//! Max pooling pads with `-inf`, keeps the first maximum of each window in row-major order (a
//! NaN wins, as in PyTorch) and records its index `ih * W + iw` within the plane as `u32`
//! (`return_indices=True`); backward adds each output gradient to the input at its index.
//! Average pooling counts the padding (`count_include_pad=True`, PyTorch's default), so every
//! window divides by `kh * kw`; backward spreads each gradient evenly over its window.
//! Padding is at most half the kernel, as PyTorch requires. Planes (`N * C`) run in parallel;
//! unpadded 2x2 windows of stride 2 (the usual CNN pooling) run 8 outputs at a time with vector
//! compares and blends on CPUs with AVX2, the same rule without a branch per window.
//!
//! Memory: no workspace; max pooling's indices are one `u32` per output element
//! ([`Pool2dSpec::out_numel`]), kept by the caller from forward to backward.

use super::{PAR_MIN, as_uninit, assume_init};
use crate::error::Result;
use crate::layout::checked_numel;
use crate::nn_kernels::{bad_arg, check_len};
use crate::work::{self, Deadline};
use rayon::prelude::*;
use std::mem::MaybeUninit;

/// A validated 2-D pooling window over `[N, C, H, W]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pool2dSpec {
    pub(crate) n: usize,
    pub(crate) c: usize,
    pub(crate) h: usize,
    pub(crate) w: usize,
    pub(crate) kernel: [usize; 2],
    pub(crate) stride: [usize; 2],
    pub(crate) padding: [usize; 2],
    pub(crate) oh: usize,
    pub(crate) ow: usize,
}

impl Pool2dSpec {
    /// Validates pooling of `input` `[N, C, H, W]` with `kernel` (at least 1), `stride` (at
    /// least 1; PyTorch's default is the kernel) and `padding` (at most half the kernel).
    pub fn new(
        input: &[usize],
        kernel: [usize; 2],
        stride: [usize; 2],
        padding: [usize; 2],
    ) -> Result<Self> {
        const OP: &str = "pool2d";
        let &[n, c, h, w] = input else {
            return Err(bad_arg(OP, input, "the input must be [N, C, H, W]".into()));
        };
        checked_numel(OP, input)?;
        if h == 0 || w == 0 {
            return Err(bad_arg(
                OP,
                input,
                "the planes are empty (H or W is 0)".into(),
            ));
        }
        if kernel.contains(&0) || stride.contains(&0) {
            return Err(bad_arg(
                OP,
                input,
                format!("kernel {kernel:?} and stride {stride:?} must be at least 1"),
            ));
        }
        if padding[0] > kernel[0] / 2 || padding[1] > kernel[1] / 2 {
            return Err(bad_arg(
                OP,
                input,
                format!("padding {padding:?} must be at most half the kernel {kernel:?}"),
            ));
        }
        let mut out = [0; 2];
        for d in 0..2 {
            let size = [h, w][d];
            let padded = (2 * padding[d]) // padding <= kernel / 2: no overflow
                .checked_add(size)
                .ok_or_else(|| bad_arg(OP, input, "the padding overflows".into()))?;
            if kernel[d] > padded {
                return Err(bad_arg(
                    OP,
                    input,
                    format!(
                        "the kernel {kernel:?} is larger than the padded input ({padded} along dimension {})",
                        d + 2
                    ),
                ));
            }
            out[d] = (padded - kernel[d]) / stride[d] + 1;
        }
        if h.checked_mul(w).is_none_or(|p| p > u32::MAX as usize) {
            return Err(bad_arg(
                OP,
                input,
                "a plane of more than 2^32 elements cannot be indexed".into(),
            ));
        }
        let spec = Pool2dSpec {
            n,
            c,
            h,
            w,
            kernel,
            stride,
            padding,
            oh: out[0],
            ow: out[1],
        };
        checked_numel(OP, &spec.out_shape())?;
        Ok(spec)
    }

    /// `[N, C, OH, OW]`.
    pub fn out_shape(&self) -> [usize; 4] {
        [self.n, self.c, self.oh, self.ow]
    }

    /// Output elements (and max pooling's indices).
    pub fn out_numel(&self) -> usize {
        self.n * self.c * self.oh * self.ow
    }

    /// Workspace: none.
    pub fn workspace_elems(&self) -> usize {
        0
    }

    fn plane(&self) -> usize {
        self.h * self.w
    }

    fn out_plane(&self) -> usize {
        self.oh * self.ow
    }

    /// The window of output `(oh, ow)` clipped to the input: row and column ranges.
    fn window(&self, oh: usize, ow: usize) -> (std::ops::Range<usize>, std::ops::Range<usize>) {
        let clip = |o: usize, d: usize, size: usize| {
            let start = o * self.stride[d];
            let lo = start.saturating_sub(self.padding[d]);
            let hi = (start + self.kernel[d])
                .saturating_sub(self.padding[d])
                .min(size);
            lo..hi
        };
        (clip(oh, 0, self.h), clip(ow, 1, self.w))
    }

    fn check(&self, op: &'static str, x: usize, out: usize) -> Result<()> {
        check_len(op, "the input", x, self.n * self.c * self.plane())?;
        check_len(op, "the output", out, self.out_numel())
    }

    /// Whether max pooling takes the vector path: unpadded 2x2 windows of stride 2 (the usual
    /// CNN pooling) on a CPU with AVX2. Everything else runs the general loop.
    fn max_2x2_vector(&self) -> bool {
        #[cfg(target_arch = "x86_64")]
        if self.kernel == [2, 2] && self.stride == [2, 2] && self.padding == [0, 0] {
            return super::simd::has_avx2_fma();
        }
        false
    }

    /// Element visits of the op, forward or backward, known before it runs: every window of
    /// every output (unclipped) and every input element.
    pub(crate) fn work(&self) -> u64 {
        work::product(&[self.n, self.c, self.oh, self.ow])
            .saturating_mul(work::product(&self.kernel))
            .saturating_add(work::product(&[self.n, self.c, self.h, self.w]))
    }

    /// Planes per rayon task: enough that a task does about [`PAR_MIN`] element visits.
    fn min_planes(&self) -> usize {
        let visits = (self.out_plane())
            .saturating_mul(self.kernel[0] * self.kernel[1])
            .saturating_add(self.plane());
        (PAR_MIN / visits).max(1)
    }
}

/// Max pooling of dense `x` `[N, C, H, W]` into `out` `[N, C, OH, OW]`, with the argmax of each
/// window (`ih * W + iw`) in `indices` (one per output).
pub fn max_pool2d_forward(
    spec: &Pool2dSpec,
    x: &[f32],
    out: &mut [f32],
    indices: &mut [u32],
) -> Result<()> {
    // SAFETY: max_pool2d_forward_uninit writes only computed values.
    unsafe { max_pool2d_forward_uninit(spec, x, as_uninit(out), as_uninit(indices)) }
}

/// [`max_pool2d_forward`] into outputs that need not be initialised: on `Ok` every element of
/// `out` and `indices` is written.
pub(crate) fn max_pool2d_forward_uninit(
    spec: &Pool2dSpec,
    x: &[f32],
    out: &mut [MaybeUninit<f32>],
    indices: &mut [MaybeUninit<u32>],
) -> Result<()> {
    const OP: &str = "max_pool2d";
    spec.check(OP, x.len(), out.len())?;
    check_len(OP, "the indices", indices.len(), spec.out_numel())?;
    if spec.out_numel() == 0 {
        return Ok(());
    }
    let s = spec;
    let op = s.out_plane();
    let tasks = out.par_chunks_mut(op).zip(indices.par_chunks_mut(op));
    let tasks = tasks
        .zip(x.par_chunks(s.plane()))
        .with_min_len(s.min_planes());
    #[cfg(target_arch = "x86_64")]
    let vector = s.max_2x2_vector();
    let deadline = Deadline::current();
    let window = work::product(&s.kernel);
    tasks.try_for_each_init(
        || deadline.meter(OP),
        |meter, ((out, idx), x)| {
            #[cfg(target_arch = "x86_64")]
            if vector {
                max_2x2_plane(s, x, out, idx);
                return meter.add(s.plane() as u64);
            }
            for oh in 0..s.oh {
                for ow in 0..s.ow {
                    meter.add(window)?;
                    let (rows, cols) = s.window(oh, ow);
                    let (mut best, mut at) = (f32::NEG_INFINITY, rows.start * s.w + cols.start);
                    for ih in rows {
                        for iw in cols.clone() {
                            let v = x[ih * s.w + iw];
                            if v > best || v.is_nan() {
                                best = v;
                                at = ih * s.w + iw;
                            }
                        }
                    }
                    out[oh * s.ow + ow].write(best);
                    idx[oh * s.ow + ow].write(at as u32);
                }
            }
            Ok(())
        },
    )
}

/// Max pooling of one plane by unpadded 2x2 windows of stride 2 (see
/// [`Pool2dSpec::max_2x2_vector`]), output rows in runs of 8, the last run overlapping the one
/// before it (it writes the same values again). Rows of fewer than 8 outputs (a 14x14 plane
/// pools to 7x7) go through a run of 8 whose missing inputs are `-inf`.
#[cfg(target_arch = "x86_64")]
fn max_2x2_plane(
    s: &Pool2dSpec,
    x: &[f32],
    out: &mut [MaybeUninit<f32>],
    idx: &mut [MaybeUninit<u32>],
) {
    let (w, n) = (s.w, s.ow);
    let rows = out.chunks_exact_mut(n).zip(idx.chunks_exact_mut(n));
    for (oh, (out, idx)) in rows.enumerate() {
        let top = 2 * oh * w;
        if n < 8 {
            let mut r = [[f32::NEG_INFINITY; 16]; 2];
            r[0][..2 * n].copy_from_slice(&x[top..][..2 * n]);
            r[1][..2 * n].copy_from_slice(&x[top + w..][..2 * n]);
            let (mut o, mut i) = ([0.0; 8], [0; 8]);
            // SAFETY: the CPU has AVX2 (max_2x2_vector checked it), the one requirement of
            // the function (it asserts the lengths of the slices it reads and writes); it
            // stores computed values only, so `o` and `i` stay initialised.
            unsafe {
                let (o, i) = (as_uninit(&mut o), as_uninit(&mut i));
                max_2x2_avx2(&r[0], &r[1], w as u32, top as u32, o, i)
            };
            out.write_copy_of_slice(&o[..n]);
            idx.write_copy_of_slice(&i[..n]);
            continue;
        }
        for k in (0..n).step_by(8) {
            let start = k.min(n - 8);
            let p0 = &x[top + 2 * start..][..16];
            let p1 = &x[top + w + 2 * start..][..16];
            let (o, i) = (&mut out[start..][..8], &mut idx[start..][..8]);
            // SAFETY: the CPU has AVX2 (max_2x2_vector checked it), the one requirement of
            // the function (it asserts the lengths of the slices it reads and writes).
            unsafe { max_2x2_avx2(p0, p1, w as u32, (top + 2 * start) as u32, o, i) };
        }
    }
}

/// Eight outputs of [`max_2x2_plane`] from 16 values of each of its two input rows (the first
/// maximum in the order `r0[2k], r0[2k+1], r1[2k], r1[2k+1]`, a NaN winning: the last one if
/// several), with vector compares and blends: branches per window would mispredict on real
/// data.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn max_2x2_avx2(
    r0: &[f32],
    r1: &[f32],
    w: u32,
    base: u32,
    out: &mut [MaybeUninit<f32>],
    idx: &mut [MaybeUninit<u32>],
) {
    use std::arch::x86_64::*;
    assert!(r0.len() >= 16 && r1.len() >= 16 && out.len() >= 8 && idx.len() >= 8);
    // Even and odd columns of 16 values, in order: the in-lane shuffle gives
    // [0 2 8 10 | 4 6 12 14], the 64-bit permute puts the pairs back in order.
    let split = |p: &[f32]| {
        // SAFETY: `p` holds 16 values (asserted above).
        let (lo, hi) = unsafe {
            (
                _mm256_loadu_ps(p.as_ptr()),
                _mm256_loadu_ps(p.as_ptr().add(8)),
            )
        };
        let fix = |v: __m256| {
            _mm256_castpd_ps(_mm256_permute4x64_pd::<0b11_01_10_00>(_mm256_castps_pd(v)))
        };
        (
            fix(_mm256_shuffle_ps::<0b10_00_10_00>(lo, hi)),
            fix(_mm256_shuffle_ps::<0b11_01_11_01>(lo, hi)),
        )
    };
    let ((e0, o0), (e1, o1)) = (split(r0), split(r1));
    let (mut best, mut arg) = (e0, _mm256_setzero_ps());
    for (c, off) in [(o0, 1), (e1, w), (o1, w + 1)] {
        let take = _mm256_or_ps(
            _mm256_cmp_ps::<_CMP_GT_OQ>(c, best),
            _mm256_cmp_ps::<_CMP_UNORD_Q>(c, c),
        );
        best = _mm256_blendv_ps(best, c, take);
        arg = _mm256_blendv_ps(
            arg,
            _mm256_castsi256_ps(_mm256_set1_epi32(off as i32)),
            take,
        );
    }
    let lanes = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
    let at = _mm256_add_epi32(_mm256_set1_epi32(base as i32), lanes);
    let at = _mm256_add_epi32(at, _mm256_castps_si256(arg));
    // SAFETY: `out` and `idx` hold 8 elements (asserted above).
    unsafe {
        _mm256_storeu_ps(out.as_mut_ptr().cast(), best);
        _mm256_storeu_si256(idx.as_mut_ptr().cast(), at);
    }
}

/// `d_input` (`[N, C, H, W]`, overwritten) from `d_out` and the forward's `indices`; an index
/// outside its plane is an error.
pub fn max_pool2d_backward(
    spec: &Pool2dSpec,
    d_out: &[f32],
    indices: &[u32],
    d_input: &mut [f32],
) -> Result<()> {
    // SAFETY: max_pool2d_backward_uninit writes only computed values.
    max_pool2d_backward_uninit(spec, d_out, indices, unsafe { as_uninit(d_input) })
}

/// [`max_pool2d_backward`] into a `d_input` that need not be initialised: on `Ok` every
/// element is written (each plane is zeroed, then the gradients are added in).
pub(crate) fn max_pool2d_backward_uninit(
    spec: &Pool2dSpec,
    d_out: &[f32],
    indices: &[u32],
    d_input: &mut [MaybeUninit<f32>],
) -> Result<()> {
    const OP: &str = "max_pool2d_backward";
    spec.check(OP, d_input.len(), d_out.len())?;
    check_len(OP, "the indices", indices.len(), spec.out_numel())?;
    let plane = spec.plane();
    if let Some(&bad) = indices.iter().find(|&&i| i as usize >= plane) {
        return Err(bad_arg(
            OP,
            &spec.out_shape(),
            format!("index {bad} is outside a plane of {plane} elements"),
        ));
    }
    if spec.out_numel() == 0 {
        d_input.fill(MaybeUninit::new(0.0));
        return Ok(());
    }
    let op = spec.out_plane();
    let tasks = d_input.par_chunks_mut(plane).zip(d_out.par_chunks(op));
    let tasks = tasks
        .zip(indices.par_chunks(op))
        .with_min_len(spec.min_planes());
    let deadline = Deadline::current();
    let visits = (plane as u64).saturating_add(op as u64);
    tasks.try_for_each_init(
        || deadline.meter(OP),
        |meter, ((dx, dy), idx)| {
            // Zeroed plane by plane, so the sums land in a plane still in cache.
            dx.fill(MaybeUninit::new(0.0));
            // SAFETY: every element of the plane was written just above.
            let dx = unsafe { assume_init(dx) };
            for (&g, &i) in dy.iter().zip(idx) {
                dx[i as usize] += g;
            }
            meter.add(visits)
        },
    )
}

/// Average pooling (padding counted) of dense `x` into `out` `[N, C, OH, OW]`.
pub fn avg_pool2d_forward(spec: &Pool2dSpec, x: &[f32], out: &mut [f32]) -> Result<()> {
    const OP: &str = "avg_pool2d";
    spec.check(OP, x.len(), out.len())?;
    if spec.out_numel() == 0 {
        return Ok(());
    }
    let s = spec;
    let scale = 1.0 / (s.kernel[0] * s.kernel[1]) as f32;
    let tasks = out
        .par_chunks_mut(s.out_plane())
        .zip(x.par_chunks(s.plane()));
    let deadline = Deadline::current();
    let window = work::product(&s.kernel);
    let tasks = tasks.with_min_len(s.min_planes());
    tasks.try_for_each_init(
        || deadline.meter(OP),
        |meter, (out, x)| {
            for oh in 0..s.oh {
                for ow in 0..s.ow {
                    meter.add(window)?;
                    let (rows, cols) = s.window(oh, ow);
                    let total: f32 = rows
                        .map(|ih| {
                            x[ih * s.w + cols.start..ih * s.w + cols.end]
                                .iter()
                                .sum::<f32>()
                        })
                        .sum();
                    out[oh * s.ow + ow] = total * scale;
                }
            }
            Ok(())
        },
    )
}

/// `d_input` (`[N, C, H, W]`, overwritten) of [`avg_pool2d_forward`] from `d_out`.
pub fn avg_pool2d_backward(spec: &Pool2dSpec, d_out: &[f32], d_input: &mut [f32]) -> Result<()> {
    const OP: &str = "avg_pool2d_backward";
    spec.check(OP, d_input.len(), d_out.len())?;
    d_input.fill(0.0);
    if spec.out_numel() == 0 {
        return Ok(());
    }
    let s = spec;
    let scale = 1.0 / (s.kernel[0] * s.kernel[1]) as f32;
    let tasks = d_input
        .par_chunks_mut(s.plane())
        .zip(d_out.par_chunks(s.out_plane()));
    let deadline = Deadline::current();
    let window = work::product(&s.kernel);
    let tasks = tasks.with_min_len(s.min_planes());
    tasks.try_for_each_init(
        || deadline.meter(OP),
        |meter, (dx, dy)| {
            for oh in 0..s.oh {
                for ow in 0..s.ow {
                    meter.add(window)?;
                    let (rows, cols) = s.window(oh, ow);
                    let g = dy[oh * s.ow + ow] * scale;
                    for ih in rows {
                        dx[ih * s.w + cols.start..ih * s.w + cols.end]
                            .iter_mut()
                            .for_each(|v| *v += g);
                    }
                }
            }
            Ok(())
        },
    )
}
