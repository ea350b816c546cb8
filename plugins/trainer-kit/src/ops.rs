//! The tensor ops with Rust's integer types: every function is one host call of the op of the
//! same name in `orch:plugin/tensors` (docs/TRAINERS.md has the table: shapes, errors, the
//! PyTorch function each matches). Sizes past `u32` and axes past `s32` are `bad-argument`
//! values made here.

use crate::bindings::orch::plugin::tensors::{
    self as t, BinaryOp, ReduceOp, Tensor, TensorError, UnaryOp,
};
use std::ops::Range;

type Result<T> = std::result::Result<T, TensorError>;

fn dim(what: &str, n: usize) -> Result<u32> {
    u32::try_from(n).map_err(|_| TensorError::BadArgument(format!("{what} = {n} is past u32")))
}

fn axis(a: isize) -> Result<i32> {
    i32::try_from(a).map_err(|_| TensorError::BadArgument(format!("axis {a} is past s32")))
}

fn dims(what: &str, list: &[usize]) -> Result<Vec<u32>> {
    list.iter().map(|&n| dim(what, n)).collect()
}

/// A tensor of `values` with `shape` on the current device.
pub fn from_slice(values: &[f32], shape: &[usize]) -> Result<Tensor> {
    t::from_list(values, &dims("shape", shape)?, None)
}

/// Every element `value`.
pub fn full(shape: &[usize], value: f32) -> Result<Tensor> {
    t::full(&dims("shape", shape)?, value, None)
}

/// Normal values with standard deviation `std` from `seed`.
pub fn randn(shape: &[usize], std: f32, seed: u64) -> Result<Tensor> {
    t::randn(&dims("shape", shape)?, std, seed, None)
}

pub fn add(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    t::binary(BinaryOp::Add, a, b)
}

pub fn sub(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    t::binary(BinaryOp::Sub, a, b)
}

pub fn mul(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    t::binary(BinaryOp::Mul, a, b)
}

pub fn div(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    t::binary(BinaryOp::Div, a, b)
}

/// `x * value`.
pub fn scale(x: &Tensor, value: f32) -> Result<Tensor> {
    t::scalar(BinaryOp::Mul, x, value)
}

pub fn relu(x: &Tensor) -> Result<Tensor> {
    t::unary(UnaryOp::Relu, x)
}

pub fn gelu(x: &Tensor) -> Result<Tensor> {
    t::unary(UnaryOp::Gelu, x)
}

pub fn exp(x: &Tensor) -> Result<Tensor> {
    t::unary(UnaryOp::Exp, x)
}

pub fn sqrt(x: &Tensor) -> Result<Tensor> {
    t::sqrt(x)
}

pub fn rsqrt(x: &Tensor) -> Result<Tensor> {
    t::rsqrt(x)
}

pub fn pow(x: &Tensor, exponent: f32) -> Result<Tensor> {
    t::pow(x, exponent)
}

pub fn abs(x: &Tensor) -> Result<Tensor> {
    t::abs(x)
}

/// `min(max(x, min), max)`; `min > max` is a bad argument.
pub fn clamp(x: &Tensor, min: f32, max: f32) -> Result<Tensor> {
    t::clamp(x, min, max)
}

pub fn silu(x: &Tensor) -> Result<Tensor> {
    t::silu(x)
}

pub fn maximum(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    t::maximum(a, b)
}

pub fn minimum(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    t::minimum(a, b)
}

/// `a == b` as 1.0 / 0.0.
pub fn eq(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    t::eq(a, b)
}

pub fn lt(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    t::lt(a, b)
}

pub fn gt(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    t::gt(a, b)
}

/// `a` where `condition` is non-zero, else `b` (PyTorch's `torch.where`).
pub fn where_(condition: &Tensor, a: &Tensor, b: &Tensor) -> Result<Tensor> {
    t::where_(condition, a, b)
}

pub fn masked_fill(x: &Tensor, mask: &Tensor, value: f32) -> Result<Tensor> {
    t::masked_fill(x, mask, value)
}

/// Joins `tensors` along `axis` (PyTorch's `torch.cat`).
pub fn cat(tensors: &[&Tensor], axis_: isize) -> Result<Tensor> {
    t::concat(tensors, axis(axis_)?)
}

/// Pieces of `sizes` along `axis` (PyTorch's `torch.split` with a list).
pub fn split(x: &Tensor, sizes: &[usize], axis_: isize) -> Result<Vec<Tensor>> {
    t::split(x, &dims("size", sizes)?, axis(axis_)?)
}

/// `len` entries of `axis` from `start`.
pub fn narrow(x: &Tensor, axis_: isize, start: usize, len: usize) -> Result<Tensor> {
    t::narrow(x, axis(axis_)?, dim("start", start)?, dim("len", len)?)
}

pub fn permute(x: &Tensor, order: &[usize]) -> Result<Tensor> {
    t::permute(x, &dims("dimension", order)?)
}

/// `x` broadcast to `shape`; `None` keeps a dimension (PyTorch's `-1`).
pub fn expand(x: &Tensor, shape: &[Option<usize>]) -> Result<Tensor> {
    let shape = shape
        .iter()
        .map(|d| match d {
            None => Ok(-1),
            Some(n) => i32::try_from(*n)
                .map_err(|_| TensorError::BadArgument(format!("expand: {n} is past s32"))),
        })
        .collect::<Result<Vec<i32>>>()?;
    t::expand(x, &shape)
}

/// Constant padding, one `(before, after)` per dimension, first to last.
pub fn pad(x: &Tensor, widths: &[(usize, usize)], value: f32) -> Result<Tensor> {
    let widths = widths
        .iter()
        .map(|&(b, a)| Ok((dim("pad", b)?, dim("pad", a)?)))
        .collect::<Result<Vec<_>>>()?;
    t::pad(x, &widths, value)
}

/// `x[range.start:range.end:step]` along `axis`.
pub fn slice(x: &Tensor, axis_: isize, range: Range<usize>, step: usize) -> Result<Tensor> {
    t::slice(
        x,
        axis(axis_)?,
        dim("start", range.start)?,
        dim("end", range.end)?,
        dim("step", step)?,
    )
}

/// Rows of `table` `[V, D]` picked by `indices`.
pub fn embedding(table: &Tensor, indices: &Tensor) -> Result<Tensor> {
    t::embedding(table, indices)
}

pub fn gather(x: &Tensor, axis_: isize, index: &Tensor) -> Result<Tensor> {
    t::gather(x, axis(axis_)?, index)
}

pub fn index_select(x: &Tensor, axis_: isize, index: &Tensor) -> Result<Tensor> {
    t::index_select(x, axis(axis_)?, index)
}

/// Dropout with probability `p` (training steps only; the host seeds the mask).
pub fn dropout(x: &Tensor, p: f32) -> Result<Tensor> {
    t::dropout(x, p)
}

/// Mean cross-entropy of `logits` `[.., C]` against `labels` `[..]`, skipping `ignore_index`.
pub fn cross_entropy(
    logits: &Tensor,
    labels: &Tensor,
    ignore_index: Option<i64>,
) -> Result<Tensor> {
    t::cross_entropy_with(logits, labels, ignore_index)
}

/// `x @ w + b` for `x` `[rows, in]`.
pub fn linear(x: &Tensor, w: &Tensor, b: Option<&Tensor>) -> Result<Tensor> {
    t::linear(x, w, b)
}

/// `a @ b` over the last two dimensions.
pub fn matmul(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    t::matmul(a, b, false, false)
}

pub fn reshape(x: &Tensor, shape: &[usize]) -> Result<Tensor> {
    t::reshape(x, &dims("shape", shape)?)
}

pub fn softmax(x: &Tensor, axis_: isize) -> Result<Tensor> {
    t::softmax(x, axis(axis_)?, false)
}

pub fn mean(x: &Tensor, axes: &[isize], keepdim: bool) -> Result<Tensor> {
    let axes = axes.iter().map(|&a| axis(a)).collect::<Result<Vec<_>>>()?;
    t::reduce(ReduceOp::Mean, x, &axes, keepdim)
}

/// A `[n, n]` mask, 1.0 above the diagonal (the future a causal model must not see), for
/// `masked_fill` before a softmax.
pub fn causal_mask(n: usize) -> Result<Tensor> {
    let mut values = vec![0.0f32; n * n];
    for row in 0..n {
        for col in row + 1..n {
            values[row * n + col] = 1.0;
        }
    }
    from_slice(&values, &[n, n])
}

fn pair(what: &str, (a, b): (usize, usize)) -> Result<(u32, u32)> {
    Ok((dim(what, a)?, dim(what, b)?))
}

/// 2-D convolution of `x` `[N, C_in, H, W]` by `weight` `[C_out, C_in / groups, kH, kW]` plus
/// `bias` `[C_out]` (PyTorch's `F.conv2d`); each pair is (rows, columns).
pub fn conv2d(
    x: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    stride: (usize, usize),
    padding: (usize, usize),
    dilation: (usize, usize),
    groups: usize,
) -> Result<Tensor> {
    t::conv2d(
        x,
        weight,
        bias,
        pair("stride", stride)?,
        pair("padding", padding)?,
        pair("dilation", dilation)?,
        dim("groups", groups)?,
    )
}

/// Window maxima of `x` `[N, C, H, W]` (PyTorch's `F.max_pool2d`).
pub fn max_pool2d(
    x: &Tensor,
    kernel: (usize, usize),
    stride: (usize, usize),
    padding: (usize, usize),
) -> Result<Tensor> {
    t::max_pool2d(
        x,
        pair("kernel", kernel)?,
        pair("stride", stride)?,
        pair("padding", padding)?,
    )
}

/// Window means of `x` `[N, C, H, W]`, the padding counted (PyTorch's `F.avg_pool2d`).
pub fn avg_pool2d(
    x: &Tensor,
    kernel: (usize, usize),
    stride: (usize, usize),
    padding: (usize, usize),
) -> Result<Tensor> {
    t::avg_pool2d(
        x,
        pair("kernel", kernel)?,
        pair("stride", stride)?,
        pair("padding", padding)?,
    )
}

/// Normalises the last `normalized_dims` dimensions of `x` (PyTorch's `F.layer_norm`).
pub fn layer_norm(
    x: &Tensor,
    normalized_dims: usize,
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    eps: f32,
) -> Result<Tensor> {
    t::layer_norm(
        x,
        dim("normalized_dims", normalized_dims)?,
        weight,
        bias,
        eps,
    )
}

/// Batch normalisation over the channels (axis 1) of `x` (PyTorch's `F.batch_norm`): batch
/// statistics in `train-step` (updating `running_mean` and `running_var`, best registered as
/// buffers, in place), the running statistics elsewhere.
pub fn batch_norm(
    x: &Tensor,
    running_mean: &Tensor,
    running_var: &Tensor,
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    momentum: f32,
    eps: f32,
) -> Result<Tensor> {
    t::batch_norm(x, running_mean, running_var, weight, bias, momentum, eps)
}

/// `softmax(q @ k^T * scale + mask) @ v` over `[B, H, T, D]` queries (PyTorch's
/// `F.scaled_dot_product_attention`); `mask` is additive, `scale` `1 / sqrt(D)` when `None`.
pub fn scaled_dot_product_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    causal: bool,
    mask: Option<&Tensor>,
    scale: Option<f32>,
) -> Result<Tensor> {
    t::scaled_dot_product_attention(q, k, v, causal, mask, scale)
}
