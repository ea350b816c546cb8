//! The gradient rule of every op: given the op, its output and the gradient of the loss with
//! respect to that output, the gradients with respect to the inputs that require grad.
//! Runs with recording off; rules are written with the public tensor ops.

use super::Op;
use crate::error::Result;
use crate::layers;
use crate::ops::{BinaryOp, IndexOp};
use crate::tensor::Tensor;

/// Pushes `(input, grad)` when the input wants a gradient; computes the gradient only then.
fn push(
    out: &mut Vec<(Tensor, Tensor)>,
    input: &Tensor,
    grad: impl FnOnce() -> Result<Tensor>,
) -> Result<()> {
    if input.requires_grad() {
        out.push((input.clone(), grad()?));
    }
    Ok(())
}

/// The axes where `kept` (a reduction's output with reduced axes kept as 1) differs from the
/// input's shape, or is 1: the reduced axes.
fn reduced_axes(input: &Tensor, kept: &[usize]) -> Vec<isize> {
    input
        .shape()
        .iter()
        .zip(kept)
        .enumerate()
        .filter(|(_, (d, k))| **k == 1 && **d != 1)
        .map(|(i, _)| i as isize)
        .collect()
}

pub(super) fn input_grads(op: &Op, out: &Tensor, g: &Tensor) -> Result<Vec<(Tensor, Tensor)>> {
    let mut grads = Vec::with_capacity(2);
    match op {
        Op::Binary(kind, a, b) => binary(&mut grads, *kind, a, b, out, g)?,
        Op::Unary(kind, x) => push(&mut grads, x, || kind.grad(x, out, g))?,
        Op::Matmul(a, b) => {
            push(&mut grads, a, || g.matmul(&b.t()?)?.sum_to(a.shape()))?;
            push(&mut grads, b, || a.t()?.matmul(g)?.sum_to(b.shape()))?;
        }
        Op::Sum(x, kept) => push(&mut grads, x, || g.reshape(kept)?.broadcast_to(x.shape()))?,
        Op::Max(x, kept) => push(&mut grads, x, || {
            let axes = reduced_axes(x, kept);
            let mask = x.eq(&out.reshape(kept)?)?;
            let g = g.reshape(kept)?;
            if axes.is_empty() {
                // Only size-1 axes were reduced: every element is its own maximum.
                return mask.mul(&g);
            }
            let ties = mask.sum(&axes, true)?;
            mask.mul(&g.div(&ties)?)
        })?,
        Op::Softmax(x, axis) => push(&mut grads, x, || {
            let axis = *axis as isize;
            let dot = g.mul(out)?.sum(&[axis], true)?;
            out.mul(&g.sub(&dot)?)
        })?,
        Op::LogSoftmax(x, axis) => push(&mut grads, x, || {
            let total = g.sum(&[*axis as isize], true)?;
            g.sub(&out.exp()?.mul(&total)?)
        })?,
        Op::CrossEntropy {
            logits,
            labels,
            ignore,
            denom,
        } => push(&mut grads, logits, || {
            logits.cross_entropy_backward(labels, *ignore, denom, g)
        })?,
        Op::Reshape(x) => push(&mut grads, x, || g.reshape(x.shape()))?,
        Op::Permute(x, perm) => push(&mut grads, x, || {
            let mut inverse = vec![0; perm.len()];
            for (i, &p) in perm.iter().enumerate() {
                inverse[p] = i;
            }
            g.permute(&inverse)
        })?,
        Op::Narrow(x, dim, start) => {
            push(&mut grads, x, || g.narrow_backward(x.shape(), *dim, *start))?
        }
        Op::Slice(x, dim, start, step) => push(&mut grads, x, || {
            g.slice_backward(x.shape(), *dim, *start, *step)
        })?,
        Op::Concat(xs, axis) => {
            let mut start = 0;
            for x in xs {
                let len = x.shape()[*axis];
                push(&mut grads, x, || g.narrow(*axis as isize, start, len))?;
                start += len;
            }
        }
        Op::Pad(x, befores) => push(&mut grads, x, || g.pad_backward(x.shape(), befores))?,
        Op::IndexSelect(x, index, axis) => push(&mut grads, x, || {
            g.index_backward(index, IndexOp::Select, *axis, x.shape())
        })?,
        Op::Gather(x, index, axis) => push(&mut grads, x, || {
            g.index_backward(index, IndexOp::Gather, *axis, x.shape())
        })?,
        Op::Dropout(x, mask) => push(&mut grads, x, || g.dropout_raw(mask))?,
        Op::Broadcast(x) => push(&mut grads, x, || g.sum_to(x.shape()))?,
        Op::Contiguous(x) => push(&mut grads, x, || Ok(g.clone()))?,
        Op::ToDevice(x) => push(&mut grads, x, || g.to(x.pool()))?,
        Op::Layer(layer, saved) => grads.extend(layers::grads(layer.as_ref(), saved, out, g)?),
    }
    Ok(grads)
}

/// A binary op's rules come from the op table; each side's gradient (in the output's shape) is
/// summed down to that operand's shape. A side the table declares without a rule gets nothing.
fn binary(
    grads: &mut Vec<(Tensor, Tensor)>,
    kind: BinaryOp,
    a: &Tensor,
    b: &Tensor,
    out: &Tensor,
    g: &Tensor,
) -> Result<()> {
    if a.requires_grad()
        && let Some(ga) = kind.grad_lhs(a, b, out, g)?
    {
        grads.push((a.clone(), ga.sum_to(a.shape())?));
    }
    if b.requires_grad()
        && let Some(gb) = kind.grad_rhs(a, b, out, g)?
    {
        grads.push((b.clone(), gb.sum_to(b.shape())?));
    }
    Ok(())
}
