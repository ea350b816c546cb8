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
