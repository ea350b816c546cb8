//! Helpers for the row loops of the nn kernels: a `multiversion!` wrapper that compiles a
//! function a second time with AVX2+FMA and picks that copy at run time when the CPU has them
//! (the crate is built for baseline x86-64, 4-wide SSE2), and lane-parallel sums, maxima and a
//! branch-free `exp` that the compiler vectorises.

/// True when this CPU runs AVX2 and FMA (cached by the standard library).
#[cfg(target_arch = "x86_64")]
pub(crate) fn has_avx2_fma() -> bool {
    std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
}

/// Defines `fn name(args) -> ret` whose body is compiled twice, plain and with AVX2+FMA, and
/// runs the AVX2 copy when the CPU has it. Helpers the body calls must be `#[inline(always)]`
/// to be compiled with the features too.
macro_rules! multiversion {
    ($(#[$meta:meta])* $vis:vis fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)? $body:block) => {
        $(#[$meta])*
        #[allow(clippy::too_many_arguments)]
        $vis fn $name($($arg: $ty),*) $(-> $ret)? {
            #[inline(always)]
            #[allow(clippy::too_many_arguments)]
            fn imp($($arg: $ty),*) $(-> $ret)? $body
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx2,fma")]
                #[allow(clippy::too_many_arguments)]
                fn avx2($($arg: $ty),*) $(-> $ret)? { imp($($arg),*) }
                if $crate::cpu::simd::has_avx2_fma() {
                    // SAFETY: the CPU has the features `avx2` was compiled for (checked above).
                    return unsafe { avx2($($arg),*) };
                }
            }
            imp($($arg),*)
        }
    };
}
pub(crate) use multiversion;

/// `out[i] = f(x[i])`, compiled with AVX2+FMA where the CPU has them: the elementwise ops'
/// closures inline into it, so their loops run 8 lanes wide instead of SSE2's 4 and `mul_add`
/// is one instruction rather than a call. The arithmetic is the same (no contraction), so are
/// the results.
pub(crate) fn fill_unary<F: Fn(f32) -> f32>(
    out: &mut [std::mem::MaybeUninit<f32>],
    x: &[f32],
    f: &F,
) {
    #[inline(always)]
    fn imp<F: Fn(f32) -> f32>(out: &mut [std::mem::MaybeUninit<f32>], x: &[f32], f: &F) {
        for (o, v) in out.iter_mut().zip(x) {
            o.write(f(*v));
        }
    }
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx2,fma")]
        fn avx2<F: Fn(f32) -> f32>(out: &mut [std::mem::MaybeUninit<f32>], x: &[f32], f: &F) {
            imp(out, x, f)
        }
        if has_avx2_fma() {
            // SAFETY: the CPU has the features `avx2` was compiled for (checked above).
            return unsafe { avx2(out, x, f) };
        }
    }
    imp(out, x, f)
}

/// `out[i] = f(a[i], b[i])`, compiled as [`fill_unary`] is.
pub(crate) fn fill_binary<F: Fn(f32, f32) -> f32>(
    out: &mut [std::mem::MaybeUninit<f32>],
    a: &[f32],
    b: &[f32],
    f: &F,
) {
    #[inline(always)]
    fn imp<F: Fn(f32, f32) -> f32>(
        out: &mut [std::mem::MaybeUninit<f32>],
        a: &[f32],
        b: &[f32],
        f: &F,
    ) {
        for ((o, x), y) in out.iter_mut().zip(a).zip(b) {
            o.write(f(*x, *y));
        }
    }
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx2,fma")]
        fn avx2<F: Fn(f32, f32) -> f32>(
            out: &mut [std::mem::MaybeUninit<f32>],
            a: &[f32],
            b: &[f32],
            f: &F,
        ) {
            imp(out, a, b, f)
        }
        if has_avx2_fma() {
            // SAFETY: the CPU has the features `avx2` was compiled for (checked above).
            return unsafe { avx2(out, a, b, f) };
        }
    }
    imp(out, a, b, f)
}

/// Lanes of the accumulators below: enough independent sums to fill AVX-512 registers.
pub(crate) const LANES: usize = 16;

/// Sum of `f(a[i], b[i])` over the common length, in `LANES` interleaved partial sums
/// (vectorisable).
#[inline(always)]
pub(crate) fn sum_zip(a: &[f32], b: &[f32], f: impl Fn(f32, f32) -> f32) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0.0f32; LANES];
    let (ac, bc) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let tail: f32 = ac
        .remainder()
        .iter()
        .zip(bc.remainder())
        .map(|(&x, &y)| f(x, y))
        .sum();
    for (ca, cb) in ac.zip(bc) {
        let (ca, cb): (&[f32; LANES], &[f32; LANES]) = (
            ca.try_into().unwrap_or(&[0.0; LANES]),
            cb.try_into().unwrap_or(&[0.0; LANES]),
        );
        for l in 0..LANES {
            acc[l] += f(ca[l], cb[l]);
        }
    }
    tail + acc.iter().sum::<f32>()
}

/// Sum of `f(a[i])`.
#[inline(always)]
pub(crate) fn sum_map(a: &[f32], f: impl Fn(f32) -> f32) -> f32 {
    sum_zip(a, a, |x, _| f(x))
}

/// Largest element (`-inf` for an empty slice; NaN elements are skipped).
#[inline(always)]
pub(crate) fn max(x: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; LANES];
    let mut chunks = x.chunks_exact(LANES);
    for c in &mut chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a = if v > *a { v } else { *a };
        }
    }
    let tail = chunks
        .remainder()
        .iter()
        .fold(f32::NEG_INFINITY, |m, &v| if v > m { v } else { m });
    acc.iter().fold(tail, |m, &v| if v > m { v } else { m })
}

/// `exp(x)` for `x <= 0` (what softmax needs once the row maximum is subtracted): Cephes'
/// degree-6 polynomial after range reduction by `ln 2`, about 2 ulp; exactly 0 below -87.3
/// (and for `-inf`). Branch-free, so loops over it vectorise.
#[inline(always)]
pub(crate) fn exp_nonpositive(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // 1.5 * 2^23: adding it rounds to an integer held in the low mantissa bits.
    const MAGIC: f32 = 12_582_912.0;
    let xc = x.clamp(-87.0, 0.0);
    let k = xc * LOG2E + MAGIC;
    let n = k - MAGIC;
    let r = xc - n * LN2_HI - n * LN2_LO;
    let mut p = 1.987_569_1e-4_f32;
    p = p * r + 1.398_2e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 0.166_666_65;
    p = p * r + 0.5;
    let p = p * r * r + r + 1.0;
    // 2^n from n's bits in `k` (n in -126..=0 here).
    let pow2 = f32::from_bits((k.to_bits().wrapping_sub(0x4B40_0000).wrapping_add(127)) << 23);
    if x < -87.0 { 0.0 } else { p * pow2 }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bits(v: &[std::mem::MaybeUninit<f32>]) -> Vec<u32> {
        // SAFETY: every element was written by the fill before this is called.
        v.iter()
            .map(|e| unsafe { e.assume_init() }.to_bits())
            .collect()
    }

    /// `fill_unary` with `f` (a closure it inlines, so compiled into its AVX2 copy) against the
    /// plain loop, to the bit.
    fn same_bits_unary<F: Fn(f32) -> f32>(x: &[f32], f: F) {
        let mut out = vec![std::mem::MaybeUninit::<f32>::uninit(); x.len()];
        fill_unary(&mut out, x, &f);
        let want: Vec<u32> = x.iter().map(|v| f(*v).to_bits()).collect();
        assert_eq!(bits(&out), want);
    }

    /// The AVX2 copies compute what the plain loop does, to the bit: GELU (exp, division,
    /// branches), its gradient, and `mul_add` (a call without FMA, one instruction with it).
    #[test]
    fn the_vector_fills_give_the_plain_loops_bits() {
        let x: Vec<f32> = (0..1003).map(|i| (i as f32 - 501.5) * 0.0173).collect();
        let y: Vec<f32> = x.iter().map(|v| v * 0.7 - 0.2).collect();
        same_bits_unary(&x, crate::ops::gelu);
        same_bits_unary(&x, |v| v.mul_add(1.37, -0.25));
        same_bits_unary(&x, |v| v * 1.37 + -0.25);
        let binary = |g: f32, v: f32| g * crate::ops::gelu_grad(v);
        let mut out = vec![std::mem::MaybeUninit::<f32>::uninit(); x.len()];
        fill_binary(&mut out, &y, &x, &binary);
        let want: Vec<u32> = y
            .iter()
            .zip(&x)
            .map(|(g, v)| binary(*g, *v).to_bits())
            .collect();
        assert_eq!(bits(&out), want);
    }

    #[test]
    fn exp_is_accurate_over_its_range() {
        let mut worst = 0.0f64;
        let mut x = -87.0f32;
        while x <= 0.0 {
            let want = (x as f64).exp();
            let rel = ((exp_nonpositive(x) as f64 - want) / want).abs();
            worst = worst.max(rel);
            x += 0.001_3;
        }
        assert!(worst < 5e-7, "worst relative error {worst}");
        assert_eq!(exp_nonpositive(0.0), 1.0);
        assert_eq!(exp_nonpositive(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_nonpositive(-100.0), 0.0);
    }

    #[test]
    fn lane_sums_and_maxima() {
        let x: Vec<f32> = (0..37).map(|i| i as f32).collect();
        assert_eq!(sum_map(&x, |v| v), 666.0);
        assert_eq!(sum_zip(&x, &x[1..], |a, b| b - a), 36.0);
        assert_eq!(max(&x), 36.0);
        assert_eq!(max(&[]), f32::NEG_INFINITY);
    }
}
