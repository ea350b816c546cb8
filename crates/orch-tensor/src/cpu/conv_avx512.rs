//! AVX-512 col2im of conv2d for stride 1 and dilation 1 (the common case), used when the CPU
//! has AVX-512F.
//!
//! The portable col2im adds each column-matrix row into a zeroed plane, window by window, so
//! neighbouring windows read back bytes a store just wrote (and wait for it). This one works
//! the other way round: each run of up to 16 input-gradient values gathers its `kh * kw`
//! contributions from the column matrix in registers and is stored once: no zero-fill, no
//! read-modify-write, each input gradient written exactly once. A contribution is one masked
//! load: lanes whose window hangs over the padding are masked off (AVX-512 masked loads do not
//! touch masked-off lanes, so nothing outside the column matrix's row is read). The sum runs
//! over the kernel offsets in row-major order, in four interleaved partial sums.
//!
//! (im2col stays portable: an AVX-512 version measured no faster, its cost being the stores
//! of the column matrix, which both write alike.)

use super::conv::Conv2dSpec;
use std::arch::x86_64::*;

/// Whether this CPU runs the kernels below (cached by the standard library).
pub(super) fn available() -> bool {
    std::arch::is_x86_feature_detected!("avx512f")
}

/// Lanes of one vector.
const V: usize = 16;

/// The first `n` lanes (all when `n >= 16`).
fn lanes(n: usize) -> u16 {
    if n >= V { u16::MAX } else { (1u16 << n) - 1 }
}

/// Lanes `t` of a run starting at column `start` (signed) whose column `start + t` lies in
/// `0..len`, within `store`.
fn inside(start: isize, len: usize, store: u16) -> u16 {
    let lo = (-start).clamp(0, V as isize) as u32;
    let hi = (len as isize - start).clamp(0, V as isize) as u32;
    if hi <= lo {
        return 0;
    }
    let run = (u32::MAX >> (32 - (hi - lo))) << lo;
    run as u16 & store
}

/// [`super::conv`]'s col2im for stride 1 and dilation 1: writes (overwrites) the input
/// gradient `dx` (`[C, H, W]`) of one sample from the column matrix at column `off` of `col`
/// (row stride `ld`).
///
/// # Safety
/// The CPU has AVX-512F ([`available`]).
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn col2im_unit(
    s: &Conv2dSpec,
    col: &[f32],
    ld: usize,
    off: usize,
    dx: &mut [f32],
) {
    let (h, w, oh_n, ow_n) = (s.h, s.w, s.oh, s.ow);
    let [ph, pw] = s.padding;
    let l = oh_n * ow_n;
    let rows = s.c * s.kh * s.kw;
    assert!(
        dx.len() >= s.c * h * w,
        "col2im: the input gradient is too short"
    );
    assert!(
        rows == 0 || (rows - 1) * ld + off + l <= col.len(),
        "col2im: the column matrix is too short"
    );
    let chunks = w.div_ceil(V);
    // The load masks of one run of input columns, by kernel column `j`.
    let mut masks = vec![0u16; s.kw];
    for q in 0..chunks {
        let store = lanes(w - q * V);
        // Input column `q*16 + t` is output column `q*16 + t + pw - j`.
        let start = |j: usize| (q * V + pw) as isize - j as isize;
        for (j, m) in masks.iter_mut().enumerate() {
            *m = inside(start(j), ow_n, store);
        }
        for c in 0..s.c {
            let plane = &mut dx[c * h * w..][..h * w];
            for ih in 0..h {
                let mut acc = [_mm512_setzero_ps(); 4];
                let mut k = 0;
                // Kernel rows `i` whose output row `ih + ph - i` exists.
                let i_lo = (ih + ph + 1).saturating_sub(oh_n);
                for i in i_lo..s.kh.min(ih + ph + 1) {
                    let oh = ih + ph - i;
                    for (j, &load) in masks.iter().enumerate() {
                        let row = (c * s.kh + i) * s.kw + j;
                        let run = &col[row * ld + off + oh * ow_n..][..ow_n];
                        let src = run.as_ptr().wrapping_offset(start(j));
                        // SAFETY: the lanes loaded are output columns in `0..OW` of this run
                        // (`inside`); the others are not read.
                        let v = unsafe { _mm512_maskz_loadu_ps(load, src) };
                        acc[k % 4] = _mm512_add_ps(acc[k % 4], v);
                        k += 1;
                    }
                }
                let sum =
                    _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3]));
                // SAFETY: the lanes stored are columns `q*16 + t < W` of input row `ih`.
                unsafe { _mm512_mask_storeu_ps(plane[ih * w + q * V..].as_mut_ptr(), store, sum) };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inside_masks_the_columns_in_range() {
        assert_eq!(inside(0, 14, lanes(14)), 0x3FFF);
        assert_eq!(inside(-2, 14, lanes(14)), 0x3FFC);
        assert_eq!(inside(2, 14, lanes(14)), 0x0FFF);
        assert_eq!(inside(-20, 14, u16::MAX), 0);
        assert_eq!(inside(14, 14, u16::MAX), 0);
        assert_eq!(inside(16, 28, lanes(12)), 0x0FFF);
        assert_eq!(inside(18, 28, lanes(12)), 0x03FF);
        assert_eq!(inside(-1, 100, u16::MAX), 0xFFFE);
    }

    /// The portable col2im is what CPUs without AVX-512 run; on one with it, both must agree.
    #[test]
    fn col2im_agrees_with_the_portable_one() {
        if !available() {
            return;
        }
        // (input [N, C, H, W], kernel, padding)
        let cases = [
            ([1, 16, 14, 14], [5, 5], [2, 2]),
            ([1, 1, 28, 28], [5, 5], [2, 2]),
            ([1, 2, 5, 37], [3, 5], [1, 2]),
            ([1, 2, 4, 18], [2, 2], [3, 3]),
            ([1, 3, 7, 6], [3, 3], [0, 0]),
        ];
        for (x, k, pad) in cases {
            let w = [2, x[1], k[0], k[1]];
            let s = Conv2dSpec::new(&x, &w, None, [1, 1], pad, [1, 1], 1).unwrap();
            let (rows, l) = (s.c * s.kh * s.kw, s.oh * s.ow);
            let (ld, off) = (l + 3, 2);
            let mut seed = 7u32;
            let col: Vec<f32> = (0..rows * ld)
                .map(|_| {
                    seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                    (seed >> 8) as f32 / (1 << 24) as f32 - 0.5
                })
                .collect();
            let n = s.c * s.h * s.w;
            let (mut want, mut got) = (vec![f32::NAN; n], vec![f32::NAN; n]);
            let mut padded = vec![0.0; s.padded_len().unwrap()];
            super::super::conv::col2im_unit(&s, &col, ld, off, &mut want, &mut padded);
            // SAFETY: the CPU has AVX-512F (checked above).
            unsafe { col2im_unit(&s, &col, ld, off, &mut got) };
            for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (a - b).abs() <= 1e-5,
                    "{x:?} k{k:?} p{pad:?} [{i}]: {a} against {b}"
                );
            }
        }
    }
}
