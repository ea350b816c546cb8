//! Elementwise ops: broadcasting binary ops, scalar ops and activations.

use super::Tensor;
use crate::autograd::{self, Op};
use crate::error::{Result, TensorError};
use crate::layout::broadcast_shape;
use crate::ops::{BinaryOp, UnaryOp};
use crate::storage;

pub(crate) fn same_device(op: &'static str, a: &Tensor, b: &Tensor) -> Result<()> {
    if a.device() != b.device() {
        return Err(TensorError::DeviceMismatch {
            op,
            lhs: a.device(),
            rhs: b.device(),
        });
    }
    Ok(())
}

impl Tensor {
    /// `op` with numpy broadcasting; records autograd when the op table gives either operand
    /// a gradient.
    pub(crate) fn binary(&self, rhs: &Tensor, op: BinaryOp) -> Result<Tensor> {
        let name = op.name();
        same_device(name, self, rhs)?;
        let shape = broadcast_shape(name, self.shape(), rhs.shape())?;
        let la = self.layout().broadcast_as(name, &shape)?;
        let lb = rhs.layout().broadcast_as(name, &shape)?;
        let pool = self.pool();
        let buffer = storage::alloc(pool, name, &shape, || {
            storage::read_two(self.buffer(), rhs.buffer(), |a, b| {
                storage::binary(pool, op, a, &la, b, &lb)
            })
        })?;
        let rec = match op.differentiable() {
            (false, false) => None,
            _ => autograd::record(&[self, rhs], || Op::Binary(op, self.clone(), rhs.clone()))?,
        };
        Ok(Tensor::dense(buffer, &shape, rec))
    }

    pub fn add(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary(rhs, BinaryOp::Add)
    }

    pub fn sub(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary(rhs, BinaryOp::Sub)
    }

    pub fn mul(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary(rhs, BinaryOp::Mul)
    }

    pub fn div(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary(rhs, BinaryOp::Div)
    }

    /// 1.0 where the elements are equal, else 0.0 (broadcasting; not differentiable).
    pub fn eq(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary(rhs, BinaryOp::Eq)
    }

    /// 1.0 where `self < rhs`, else 0.0 (broadcasting; not differentiable).
    pub fn lt(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary(rhs, BinaryOp::Lt)
    }

    /// 1.0 where `self > rhs`, else 0.0 (broadcasting; not differentiable).
    pub fn gt(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary(rhs, BinaryOp::Gt)
    }

    /// The larger of the two, elementwise (broadcasting); NaN where either is NaN. At ties the
    /// gradient is split in half (as PyTorch's `maximum`).
    pub fn maximum(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary(rhs, BinaryOp::Maximum)
    }

    /// The smaller of the two, elementwise; as [`Tensor::maximum`] otherwise.
    pub fn minimum(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary(rhs, BinaryOp::Minimum)
    }

    /// `a` where `cond` is non-zero, else `b`; all three broadcast together (numpy
    /// `where`). Gradients flow to `a` and `b`, never to `cond`.
    pub fn where_(cond: &Tensor, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        let shape = broadcast_shape("where", cond.shape(), a.shape())?;
        let shape = broadcast_shape("where", &shape, b.shape())?;
        // Two selections that never multiply (an infinity in the unselected side stays out).
        let picked_a = cond.binary(a, BinaryOp::Select)?;
        let picked_b = cond.binary(b, BinaryOp::SelectNot)?;
        picked_a.add(&picked_b)?.broadcast_to(&shape)
    }

    /// This tensor with `value` where `mask` is non-zero (`mask` broadcasts to this tensor's
    /// shape; the result has this tensor's shape). The gradient flows where the mask is zero.
    pub fn masked_fill(&self, mask: &Tensor, value: f32) -> Result<Tensor> {
        if broadcast_shape("masked_fill", self.shape(), mask.shape())? != self.shape() {
            return Err(TensorError::ShapeMismatch {
                op: "masked_fill",
                lhs: self.shape().to_vec(),
                rhs: mask.shape().to_vec(),
            });
        }
        let fill = Tensor::scalar(value, self.pool())?;
        Tensor::where_(mask, &fill, self)
    }

    /// `op` of a dense copy of this tensor, recorded when autograd wants it.
    fn unary(&self, op: UnaryOp) -> Result<Tensor> {
        let x = self.contiguous()?;
        let pool = x.pool();
        let buffer = storage::alloc(pool, op.name(), x.shape(), || {
            storage::unary(pool, op, &x.buffer().read(), x.layout())
        })?;
        let rec = autograd::record(&[&x], || Op::Unary(op, x.clone()))?;
        Ok(Tensor::dense(buffer, x.shape(), rec))
    }

    /// `self * mul + add`, elementwise.
    pub fn affine(&self, mul: f32, add: f32) -> Result<Tensor> {
        self.unary(UnaryOp::Affine { mul, add })
    }

    pub fn add_scalar(&self, value: f32) -> Result<Tensor> {
        self.affine(1.0, value)
    }

    pub fn sub_scalar(&self, value: f32) -> Result<Tensor> {
        self.affine(1.0, -value)
    }

    pub fn mul_scalar(&self, value: f32) -> Result<Tensor> {
        self.affine(value, 0.0)
    }

    /// Multiplies by `1 / value` (one rounding more than a true division).
    pub fn div_scalar(&self, value: f32) -> Result<Tensor> {
        self.affine(1.0 / value, 0.0)
    }

    pub fn neg(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Neg)
    }

    pub fn relu(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Relu)
    }

    /// GELU, tanh approximation: `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`.
    pub fn gelu(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Gelu)
    }

    pub fn tanh(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Tanh)
    }

    pub fn sigmoid(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Sigmoid)
    }

    pub fn exp(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Exp)
    }

    /// Natural logarithm.
    pub fn log(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Log)
    }

    /// Elementwise square.
    pub fn sqr(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Sqr)
    }

    /// Square root (NaN below 0).
    pub fn sqrt(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Sqrt)
    }

    /// `1 / sqrt(x)`.
    pub fn rsqrt(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Rsqrt)
    }

    /// `x ^ exponent` for a scalar exponent (C `pow`: a negative base with a fractional exponent
    /// gives NaN). The gradient is the power rule; for exponent 0 it is 0.
    pub fn pow(&self, exponent: f32) -> Result<Tensor> {
        self.unary(UnaryOp::Pow { exponent })
    }

    /// Absolute value; the gradient at 0 is 0.
    pub fn abs(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Abs)
    }

    /// Each element limited to `[min, max]`; NaN stays NaN. `min > max` (or a NaN bound) is an
    /// error. The gradient flows where the input lies strictly inside `(min, max)`: 0 on a bound
    /// (PyTorch's minimum-norm subgradient, as `relu` at 0).
    pub fn clamp(&self, min: f32, max: f32) -> Result<Tensor> {
        // Also refuses a NaN bound.
        if min.partial_cmp(&max).is_none_or(|o| o.is_gt()) {
            return Err(TensorError::InvalidArgument {
                op: "clamp",
                reason: format!("the lower bound {min} is not at most the upper bound {max}"),
            });
        }
        self.unary(UnaryOp::Clamp { min, max })
    }

    /// SiLU (swish): `x * sigmoid(x)`.
    pub fn silu(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Silu)
    }
}
