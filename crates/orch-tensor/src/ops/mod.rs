//! Backend-neutral names of the kernels both backends implement. The elementwise ops are the op
//! table (table.rs): one declaration per op, from which their enums, kernels and gradient rules
//! are generated (macros.rs).

#[macro_use]
mod macros;
mod table;

pub(crate) use table::{BinaryOp, UnaryOp};

/// Reductions over one axis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReduceOp {
    Sum,
    Max,
}

impl ReduceOp {
    /// The op's name in errors.
    pub(crate) fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Max => "max",
        }
    }
}

/// The fused optimizer updates, with their hyper-parameters for one step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum UpdateOp {
    /// `buf` is used when `momentum != 0`.
    Sgd {
        lr: f32,
        momentum: f32,
        weight_decay: f32,
        nesterov: bool,
    },
    /// `bias1 = 1 - beta1^t`, `bias2 = 1 - beta2^t`; `decoupled` is AdamW.
    Adam {
        lr: f32,
        beta1: f32,
        beta2: f32,
        eps: f32,
        weight_decay: f32,
        decoupled: bool,
        bias1: f32,
        bias2: f32,
    },
}

/// sqrt(2/pi) and 0.044715, the constants of GELU's tanh approximation.
pub(crate) const GELU_C: f32 = 0.797_884_6;
pub(crate) const GELU_A: f32 = 0.044_715;

/// `0.5 * (1 + tanh(u))` with `u = sqrt(2/pi) * (x + 0.044715 x^3)`: GELU's gate, computed as
/// the equal `sigmoid(2u)` so that it needs one branch-free `exp` (which loops vectorise) rather
/// than a call of libm's `tanhf` per element. Within 1e-6 of the tanh form.
#[inline(always)]
fn gelu_gate(x: f32) -> f32 {
    sigmoid(2.0 * GELU_C * (x + GELU_A * x * x * x))
}

/// GELU, tanh approximation: `x * 0.5 * (1 + tanh(u))`.
#[inline(always)]
pub(crate) fn gelu(x: f32) -> f32 {
    x * gelu_gate(x)
}

/// d/dx GELU. With the gate `s = 0.5 (1 + tanh u)`, `1 - tanh^2 u = 4 s (1 - s)`, so the
/// derivative `0.5 (1 + t) + 0.5 x (1 - t^2) u'` is `s + 2 x s (1 - s) u'`.
#[inline(always)]
pub(crate) fn gelu_grad(x: f32) -> f32 {
    let s = gelu_gate(x);
    s + 2.0 * x * s * (1.0 - s) * GELU_C * (1.0 + 3.0 * GELU_A * x * x)
}

/// `1 / (1 + exp(-x))`, from `e = exp(-|x|)` (never overflows): `1 / (1 + e)` for `x >= 0`,
/// `e / (1 + e)` below. Branch-free.
#[inline(always)]
pub(crate) fn sigmoid(x: f32) -> f32 {
    let e = crate::cpu::simd::exp_nonpositive(-x.abs());
    let r = 1.0 / (1.0 + e);
    if x >= 0.0 { r } else { e * r }
}

/// The parameters that decide a dropout mask. Element `e` of sample (row) `r` of a batch is
/// kept when the hash of `(seed, step, site, sample_offset + r, e)` maps to `u >= p` with `u`
/// uniform in `[0, 1)` (24 bits), and kept values are scaled by `1 / (1 - p)`. The same
/// function is written in kernels.cu (`dropout`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct DropoutMask {
    pub p: f32,
    pub seed: u64,
    pub step: u64,
    pub site: u64,
    pub sample_offset: u64,
}

const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

/// SplitMix64's output function (a bijection of u64 with good avalanche).
#[inline(always)]
fn finalize(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl DropoutMask {
    pub(crate) fn scale(&self) -> f32 {
        1.0 / (1.0 - self.p)
    }

    /// The hash key of row `r` of this batch (sample `sample_offset + r`).
    #[inline]
    pub(crate) fn row_key(&self, r: u64) -> u64 {
        let mut k = finalize(self.seed.wrapping_add(GOLDEN));
        k = finalize(k ^ self.step.wrapping_add(GOLDEN));
        k = finalize(k ^ self.site.wrapping_add(GOLDEN));
        finalize(k ^ self.sample_offset.wrapping_add(r).wrapping_add(GOLDEN))
    }

    /// Whether element `e` of the row with key `key` is kept.
    #[inline(always)]
    pub(crate) fn keeps(&self, key: u64, e: u64) -> bool {
        let bits = finalize(key.wrapping_add(e.wrapping_add(1).wrapping_mul(GOLDEN)));
        // 24 bits: exact in f32, so both backends compare the same number with `p`.
        ((bits >> 40) as f32) * (1.0 / (1u32 << 24) as f32) >= self.p
    }
}

/// Lookups by index of dense data seen as `[outer, n, inner]` around the indexed axis, and
/// their gradients (which add into the rows read).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum IndexOp {
    /// `out[o, j, :] = x[o, idx[j], :]`.
    Select,
    /// `out[o, idx[j], :] += g[o, j, :]` into zeros.
    SelectBackward,
    /// `out[o, j, i] = x[o, idx[o, j, i], i]`.
    Gather,
    /// `out[o, idx[o, j, i], i] += g[o, j, i]` into zeros.
    GatherBackward,
}

impl IndexOp {
    /// The op's name in errors.
    pub(crate) fn name(self) -> &'static str {
        match self {
            IndexOp::Select => "index_select",
            IndexOp::SelectBackward => "index_select backward",
            IndexOp::Gather => "gather",
            IndexOp::GatherBackward => "gather backward",
        }
    }

    /// The CUDA kernel (kernels.cu).
    pub(crate) fn kernel(self) -> &'static str {
        match self {
            IndexOp::Select => "index_select",
            IndexOp::SelectBackward => "index_add",
            IndexOp::Gather => "gather_axis",
            IndexOp::GatherBackward => "scatter_add",
        }
    }

    /// Whether the output is the source's `[outer, n, inner]` (the gradients) rather than the
    /// index-driven shape.
    pub(crate) fn writes_source_shape(self) -> bool {
        matches!(self, IndexOp::SelectBackward | IndexOp::GatherBackward)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// GELU and its derivative in the tanh form, in f64.
    fn reference(x: f64) -> (f64, f64) {
        let (c, a) = ((2.0 / std::f64::consts::PI).sqrt(), 0.044_715);
        let t = (c * (x + a * x * x * x)).tanh();
        let y = 0.5 * x * (1.0 + t);
        let dy = 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * c * (1.0 + 3.0 * a * x * x);
        (y, dy)
    }

    #[test]
    fn gelu_and_its_gradient_match_the_tanh_form() {
        let mut x = -12.0f32;
        while x <= 12.0 {
            let (y, dy) = reference(f64::from(x));
            let tol = |want: f64| 2e-6 * want.abs().max(1.0);
            assert!((f64::from(gelu(x)) - y).abs() <= tol(y), "gelu({x})");
            assert!(
                (f64::from(gelu_grad(x)) - dy).abs() <= tol(dy),
                "gelu'({x})"
            );
            x += 0.0037;
        }
        assert_eq!(gelu(0.0), 0.0);
        assert_eq!(gelu(200.0), 200.0);
        assert_eq!(gelu(-200.0), 0.0);
        assert!(gelu(f32::NAN).is_nan() && gelu_grad(f32::NAN).is_nan());
    }

    #[test]
    fn sigmoid_is_accurate_and_saturates_without_overflow() {
        let mut x = -40.0f32;
        while x <= 40.0 {
            let want = 1.0 / (1.0 + (-f64::from(x)).exp());
            let got = f64::from(sigmoid(x));
            assert!((got - want).abs() <= 1e-6 * want.max(1e-30), "sigmoid({x})");
            x += 0.011;
        }
        assert_eq!(sigmoid(1000.0), 1.0);
        assert_eq!(sigmoid(-1000.0), 0.0);
        assert_eq!(sigmoid(0.0), 0.5);
    }
}
