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
    /// `op` with numpy broadcasting; records autograd for the four arithmetic ops.
    pub(crate) fn binary(&self, rhs: &Tensor, op: BinaryOp, name: &'static str) -> Result<Tensor> {
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
        let differentiable = matches!(
            op,
            BinaryOp::Add | BinaryOp::Sub | BinaryOp::Mul | BinaryOp::Div
        );
        let rec = if differentiable {
            autograd::record(&[self, rhs], || Op::Binary(op, self.clone(), rhs.clone()))?
        } else {
            None
        };
        Ok(Tensor::dense(buffer, &shape, rec))
    }

    pub fn add(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary(rhs, BinaryOp::Add, "add")
    }

    pub fn sub(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary(rhs, BinaryOp::Sub, "sub")
    }

    pub fn mul(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary(rhs, BinaryOp::Mul, "mul")
    }

    pub fn div(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary(rhs, BinaryOp::Div, "div")
    }

    /// 1.0 where the elements are equal, else 0.0 (broadcasting; not differentiable).
    pub fn eq(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary(rhs, BinaryOp::Eq, "eq")
    }

    /// `op` of a dense copy of this tensor; records `record_as` when autograd wants it.
    fn unary(&self, op: UnaryOp, record_as: impl FnOnce(Tensor) -> Op) -> Result<Tensor> {
        let x = self.contiguous()?;
        let pool = x.pool();
        let buffer = storage::alloc(pool, op.name(), x.shape(), || {
            storage::unary(pool, op, &x.buffer().read(), x.layout())
        })?;
        let rec = autograd::record(&[&x], || record_as(x.clone()))?;
        Ok(Tensor::dense(buffer, x.shape(), rec))
    }

    fn activation(&self, op: UnaryOp) -> Result<Tensor> {
        self.unary(op, |x| Op::Unary(op, x))
    }

    /// `self * mul + add`, elementwise.
    pub fn affine(&self, mul: f32, add: f32) -> Result<Tensor> {
        self.unary(UnaryOp::Affine { mul, add }, |x| Op::Affine(x, mul))
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
        self.activation(UnaryOp::Neg)
    }

    pub fn relu(&self) -> Result<Tensor> {
        self.activation(UnaryOp::Relu)
    }

    /// GELU, tanh approximation: `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`.
    pub fn gelu(&self) -> Result<Tensor> {
        self.activation(UnaryOp::Gelu)
    }

    pub fn tanh(&self) -> Result<Tensor> {
        self.activation(UnaryOp::Tanh)
    }

    pub fn sigmoid(&self) -> Result<Tensor> {
        self.activation(UnaryOp::Sigmoid)
    }

    pub fn exp(&self) -> Result<Tensor> {
        self.activation(UnaryOp::Exp)
    }

    /// Natural logarithm.
    pub fn log(&self) -> Result<Tensor> {
        self.activation(UnaryOp::Log)
    }

    /// Elementwise square.
    pub fn sqr(&self) -> Result<Tensor> {
        self.activation(UnaryOp::Sqr)
    }
}
