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

/// sqrt(2/pi), for the tanh approximation of GELU.
pub(crate) const GELU_C: f32 = 0.797_884_6;
pub(crate) const GELU_A: f32 = 0.044_715;

#[inline(always)]
pub(crate) fn gelu(x: f32) -> f32 {
    0.5 * x * (1.0 + (GELU_C * (x + GELU_A * x * x * x)).tanh())
}

#[inline(always)]
pub(crate) fn gelu_grad(x: f32) -> f32 {
    let t = (GELU_C * (x + GELU_A * x * x * x)).tanh();
    0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * GELU_C * (1.0 + 3.0 * GELU_A * x * x)
}

#[inline(always)]
pub(crate) fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
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
