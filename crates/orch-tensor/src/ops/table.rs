//! The op table: every elementwise op, declared once. An entry is the op's name, its CPU kernel
//! (an f32 expression), its CUDA kernel (a CUDA C expression; the kernel is generated from it)
//! and its gradient rule. The shape rule is the table's: unary ops keep the shape, binary ops
//! broadcast (numpy). The macros (ops/macros.rs) reject an entry missing any part; adding an op
//! here and a public method in tensor/elementwise.rs is all an elementwise op needs
//! (docs/TENSOR.md, "Adding an op").

use super::{gelu, gelu_grad, sigmoid};
use crate::error::Result;
use crate::tensor::Tensor;

unary_ops! {
    Neg => "neg",
        cpu |v| -v,
        cuda "-v",
        grad |x, y, g| g.neg();
    Relu => "relu",
        cpu |v| if v > 0.0 { v } else { 0.0 },
        cuda "v > 0.0f ? v : 0.0f",
        grad |x, y, g| g.binary(x, BinaryOp::ReluGrad);
    /// GELU, tanh approximation.
    Gelu => "gelu",
        cpu |v| gelu(v),
        cuda "gelu_f(v)",
        grad |x, y, g| g.binary(x, BinaryOp::GeluGrad);
    Tanh => "tanh",
        cpu |v| v.tanh(),
        cuda "tanhf(v)",
        grad |x, y, g| g.binary(y, BinaryOp::TanhGrad);
    Sigmoid => "sigmoid",
        cpu |v| sigmoid(v),
        cuda "1.0f / (1.0f + expf(-v))",
        grad |x, y, g| g.binary(y, BinaryOp::SigmoidGrad);
    Exp => "exp",
        cpu |v| v.exp(),
        cuda "expf(v)",
        grad |x, y, g| g.mul(y);
    Log => "log",
        cpu |v| v.ln(),
        cuda "logf(v)",
        grad |x, y, g| g.div(x);
    Sqr => "sqr",
        cpu |v| v * v,
        cuda "v * v",
        grad |x, y, g| g.mul(x)?.mul_scalar(2.0);
    /// `x * mul + add` (all scalar arithmetic is this op).
    Affine { mul, add } => "affine",
        cpu |v| v.mul_add(mul, add),
        cuda "fmaf(v, p0, p1)",
        grad |x, y, g| g.mul_scalar(mul);
    Sqrt => "sqrt",
        cpu |v| v.sqrt(),
        cuda "sqrtf(v)",
        grad |x, y, g| g.div(y)?.mul_scalar(0.5);
    /// `1 / sqrt(x)`, computed as that division on both backends (not CUDA's approximate rsqrtf).
    Rsqrt => "rsqrt",
        cpu |v| 1.0 / v.sqrt(),
        cuda "1.0f / sqrtf(v)",
        // d/dx x^(-1/2) = -1/2 x^(-3/2) = -1/2 y^3
        grad |x, y, g| g.mul(&y.sqr()?.mul(y)?)?.mul_scalar(-0.5);
    /// `x ^ exponent` (C `pow`: a negative base with a fractional exponent is NaN).
    Pow { exponent } => "pow",
        cpu |v| v.powf(exponent),
        cuda "powf(v, p0)",
        // The power rule; x^0 is constant (its rule would give 0 * x^-1, NaN at 0).
        grad |x, y, g| if exponent == 0.0 {
            g.mul_scalar(0.0)
        } else {
            g.mul(&x.pow(exponent - 1.0)?)?.mul_scalar(exponent)
        };
    /// `|x|`; the gradient at 0 is 0 (as PyTorch's).
    Abs => "abs",
        cpu |v| v.abs(),
        cuda "fabsf(v)",
        grad |x, y, g| g.binary(x, BinaryOp::AbsGrad);
    /// `min(max(x, min), max)`; NaN stays NaN. The gradient flows where the input was strictly
    /// inside `(min, max)`: 0 on a bound, the minimum-norm subgradient, as `relu` at 0 and as
    /// PyTorch's scalar-bound `clamp` since it changed (pytorch#191142; earlier releases passed
    /// the gradient on the bounds). Checked against torch in tests/all/torch_agreement.rs.
    Clamp { min, max } => "clamp",
        cpu |v| if v.is_nan() { v } else { v.max(min).min(max) },
        cuda "v != v ? v : fminf(fmaxf(v, p0), p1)",
        grad |x, y, g| {
            let above = x.gt(&Tensor::scalar(min, x.pool())?)?;
            let below = x.lt(&Tensor::scalar(max, x.pool())?)?;
            g.mul(&above.mul(&below)?)
        };
    /// `x * sigmoid(x)` (SiLU, swish).
    Silu => "silu",
        cpu |v| v / (1.0 + (-v).exp()),
        cuda "v / (1.0f + expf(-v))",
        grad |x, y, g| g.binary(x, BinaryOp::SiluGrad);
}

binary_ops! {
    Add => "add",
        cpu |l, r| l + r,
        cuda "x + z",
        grad |a, b, y, g| lhs: { g.clone() }, rhs: { g.clone() };
    Sub => "sub",
        cpu |l, r| l - r,
        cuda "x - z",
        grad |a, b, y, g| lhs: { g.clone() }, rhs: { g.neg()? };
    Mul => "mul",
        cpu |l, r| l * r,
        cuda "x * z",
        grad |a, b, y, g| lhs: { g.mul(b)? }, rhs: { g.mul(a)? };
    Div => "div",
        cpu |l, r| l / r,
        cuda "x / z",
        // d(a/b)/db = -(a/b)/b = -y/b
        grad |a, b, y, g| lhs: { g.div(b)? }, rhs: { g.mul(y)?.div(b)?.neg()? };
    /// The larger operand; NaN when either is. At ties the gradient is split in half between
    /// the operands (as PyTorch's).
    Maximum => "maximum",
        cpu |l, r| if l > r || l.is_nan() { l } else { r },
        cuda "(x > z || x != x) ? x : z",
        grad |a, b, y, g|
            lhs: { g.mul(&a.binary(b, BinaryOp::WinMask)?)? },
            rhs: { g.mul(&b.binary(a, BinaryOp::WinMask)?)? };
    /// The smaller operand; as `Maximum` otherwise.
    Minimum => "minimum",
        cpu |l, r| if l < r || l.is_nan() { l } else { r },
        cuda "(x < z || x != x) ? x : z",
        grad |a, b, y, g|
            lhs: { g.mul(&b.binary(a, BinaryOp::WinMask)?)? },
            rhs: { g.mul(&a.binary(b, BinaryOp::WinMask)?)? };
    /// 1.0 where equal, else 0.0: a comparison, through which no gradient flows.
    Eq => "eq",
        cpu |l, r| if l == r { 1.0 } else { 0.0 },
        cuda "x == z ? 1.0f : 0.0f",
        grad |a, b, y, g| lhs: none, rhs: none;
    /// 1.0 where `l < r`, else 0.0 (no gradient).
    Lt => "lt",
        cpu |l, r| if l < r { 1.0 } else { 0.0 },
        cuda "x < z ? 1.0f : 0.0f",
        grad |a, b, y, g| lhs: none, rhs: none;
    /// 1.0 where `l > r`, else 0.0 (no gradient).
    Gt => "gt",
        cpu |l, r| if l > r { 1.0 } else { 0.0 },
        cuda "x > z ? 1.0f : 0.0f",
        grad |a, b, y, g| lhs: none, rhs: none;
    /// `r` where the condition `l` is non-zero, else 0 (half of `where_`; the condition gets no
    /// gradient).
    Select => "select",
        cpu |l, r| if l != 0.0 { r } else { 0.0 },
        cuda "x != 0.0f ? z : 0.0f",
        grad |a, b, y, g| lhs: none, rhs: { a.binary(g, BinaryOp::Select)? };
    /// `r` where the condition `l` is zero, else 0 (the other half of `where_`).
    SelectNot => "select_not",
        cpu |l, r| if l != 0.0 { 0.0 } else { r },
        cuda "x != 0.0f ? 0.0f : z",
        grad |a, b, y, g| lhs: none, rhs: { a.binary(g, BinaryOp::SelectNot)? };
    // Backward helpers: `(upstream gradient, saved value)`. They run with recording off, and
    // second derivatives are not supported, so they declare no gradient.
    /// 1 where `l > r`, 0.5 where equal, 0 below: the share of a maximum's gradient `l` gets.
    WinMask => "win_mask",
        cpu |l, r| if l > r { 1.0 } else if l == r { 0.5 } else { 0.0 },
        cuda "x > z ? 1.0f : (x == z ? 0.5f : 0.0f)",
        grad |a, b, y, g| lhs: none, rhs: none;
    ReluGrad => "relu_grad",
        cpu |g, x| if x > 0.0 { g } else { 0.0 },
        cuda "z > 0.0f ? x : 0.0f",
        grad |a, b, y, g| lhs: none, rhs: none;
    GeluGrad => "gelu_grad",
        cpu |g, x| g * gelu_grad(x),
        cuda "x * gelu_grad_f(z)",
        grad |a, b, y, g| lhs: none, rhs: none;
    /// Takes tanh's output.
    TanhGrad => "tanh_grad",
        cpu |g, y| g * (1.0 - y * y),
        cuda "x * (1.0f - z * z)",
        grad |a, b, y, g| lhs: none, rhs: none;
    /// Takes sigmoid's output.
    SigmoidGrad => "sigmoid_grad",
        cpu |g, y| g * y * (1.0 - y),
        cuda "x * z * (1.0f - z)",
        grad |a, b, y, g| lhs: none, rhs: none;
    AbsGrad => "abs_grad",
        cpu |g, x| if x > 0.0 { g } else if x < 0.0 { -g } else { 0.0 },
        cuda "z > 0.0f ? x : (z < 0.0f ? -x : 0.0f)",
        grad |a, b, y, g| lhs: none, rhs: none;
    SiluGrad => "silu_grad",
        cpu |g, x| {
            let s = sigmoid(x);
            g * s * (1.0 + x * (1.0 - s))
        },
        cuda "x * (1.0f / (1.0f + expf(-z))) * (1.0f + z * (1.0f - 1.0f / (1.0f + expf(-z))))",
        grad |a, b, y, g| lhs: none, rhs: none;
}
