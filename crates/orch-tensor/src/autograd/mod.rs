//! Reverse-mode autograd.
//!
//! There is no global tape: a tensor computed from inputs that require grad keeps the `Op`
//! that made it (with handles on its inputs), so the graph of one loss is its own tape and
//! replicas in other threads never share one. `Tensor::backward` orders that graph
//! topologically and applies each op's rule (rules.rs) from the loss down, adding gradients into
//! the leaves.
//! Gradient computations themselves run with recording off ([`no_grad`]).
//!
//! A recorded op is host memory (the node, its layout, the handles it keeps) that no device
//! quota sees, and a graph lives as long as any tensor computed from it. A [`GraphBudget`]
//! bounds how many nodes one holder (a trainer replica) keeps alive: ops run inside
//! [`with_graph_budget`] take a node from it when they record, give it back when the node is
//! dropped, and fail with [`TensorError::GraphLimit`] when none is left.

mod rules;

use crate::error::{Result, TensorError};
use crate::layers::{LayerOp, Saved};
use crate::ops::{BinaryOp, DropoutMask, UnaryOp};
use crate::tensor::Tensor;
use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// How many autograd graph nodes may be alive at once, for the ops run inside
/// [`with_graph_budget`]. Shared by every thread that runs under it.
#[derive(Debug)]
pub struct GraphBudget {
    limit: usize,
    live: AtomicUsize,
}

impl GraphBudget {
    pub fn new(limit: usize) -> Arc<GraphBudget> {
        Arc::new(GraphBudget {
            limit,
            live: AtomicUsize::new(0),
        })
    }

    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Nodes alive now.
    pub fn live(&self) -> usize {
        self.live.load(Ordering::Acquire)
    }

    /// One node, or an error when `limit` are alive; never passes the limit.
    fn take(self: &Arc<Self>) -> Result<NodeToken> {
        self.live
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.limit).then_some(n + 1)
            })
            .map_err(|_| TensorError::GraphLimit { limit: self.limit })?;
        Ok(NodeToken(Arc::clone(self)))
    }
}

/// A node counted in a budget; given back on drop (when the node is).
pub(crate) struct NodeToken(Arc<GraphBudget>);

impl Drop for NodeToken {
    fn drop(&mut self) {
        self.0.live.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A recorded op and the budget node it holds (none outside any budget).
pub(crate) struct Recorded {
    pub op: Op,
    pub node: Option<NodeToken>,
}

thread_local! {
    static BUDGET: RefCell<Option<Arc<GraphBudget>>> = const { RefCell::new(None) };
}

/// Runs `f` with every op it records on this thread counted in `budget` (the previous budget,
/// if any, is restored afterwards, also on a panic).
pub fn with_graph_budget<T>(budget: &Arc<GraphBudget>, f: impl FnOnce() -> T) -> T {
    struct Restore(Option<Arc<GraphBudget>>);
    impl Drop for Restore {
        fn drop(&mut self) {
            BUDGET.with(|b| *b.borrow_mut() = self.0.take());
        }
    }
    let _restore = Restore(BUDGET.with(|b| b.borrow_mut().replace(Arc::clone(budget))));
    f()
}

/// How a tensor was computed, with the inputs its gradient rule needs.
pub(crate) enum Op {
    /// A binary op of the op table (broadcasting), recorded when either side has a rule.
    Binary(BinaryOp, Tensor, Tensor),
    /// A unary op of the op table (affine and scalar arithmetic included).
    Unary(UnaryOp, Tensor),
    Matmul(Tensor, Tensor),
    /// Sum over axes; `kept` is the output shape with the reduced axes kept as 1.
    Sum(Tensor, Vec<usize>),
    Max(Tensor, Vec<usize>),
    Softmax(Tensor, usize),
    LogSoftmax(Tensor, usize),
    /// Mean softmax cross-entropy of logits `[rows, classes]` against labels `[rows]`, labels
    /// equal to `ignore` left out; `denom` is the count of the others (at least 1).
    CrossEntropy {
        logits: Tensor,
        labels: Tensor,
        ignore: Option<f32>,
        denom: Tensor,
    },
    Reshape(Tensor),
    Permute(Tensor, Vec<usize>),
    /// Narrow of `dim` starting at `start`.
    Narrow(Tensor, usize, usize),
    /// Slice of `dim` from `start` every `step`.
    Slice(Tensor, usize, usize, usize),
    /// Inputs joined along an axis.
    Concat(Vec<Tensor>, usize),
    /// Padding with the `before` widths of every axis.
    Pad(Tensor, Vec<usize>),
    /// `index_select(axis, index)` of the tensor.
    IndexSelect(Tensor, Tensor, usize),
    /// `gather(axis, index)` of the tensor (already cut to the index along other axes).
    Gather(Tensor, Tensor, usize),
    Dropout(Tensor, DropoutMask),
    Broadcast(Tensor),
    Contiguous(Tensor),
    ToDevice(Tensor),
    /// A layer op (conv2d, pooling, the norms, attention; see `layers`) with what it keeps
    /// for backward.
    Layer(Arc<dyn LayerOp>, Box<Saved>),
}

impl Op {
    /// The op's tensors, moved out (used to drop long graphs without recursion).
    pub(crate) fn into_tensors(self) -> Vec<Tensor> {
        match self {
            Op::Binary(_, a, b)
            | Op::Matmul(a, b)
            | Op::IndexSelect(a, b, _)
            | Op::Gather(a, b, _) => vec![a, b],
            Op::CrossEntropy {
                logits,
                labels,
                denom,
                ..
            } => vec![logits, labels, denom],
            Op::Concat(xs, _) => xs,
            Op::Unary(_, x)
            | Op::Sum(x, _)
            | Op::Max(x, _)
            | Op::Softmax(x, _)
            | Op::LogSoftmax(x, _)
            | Op::Reshape(x)
            | Op::Permute(x, _)
            | Op::Narrow(x, _, _)
            | Op::Slice(x, ..)
            | Op::Pad(x, _)
            | Op::Dropout(x, _)
            | Op::Broadcast(x)
            | Op::Contiguous(x)
            | Op::ToDevice(x) => vec![x],
            Op::Layer(_, saved) => (*saved).into_tensors(),
        }
    }

    fn inputs(&self) -> Vec<&Tensor> {
        match self {
            Op::Binary(_, a, b) | Op::Matmul(a, b) => vec![a, b],
            Op::CrossEntropy { logits, .. } => vec![logits],
            Op::IndexSelect(x, ..) | Op::Gather(x, ..) => vec![x],
            Op::Concat(xs, _) => xs.iter().collect(),
            Op::Unary(_, x)
            | Op::Sum(x, _)
            | Op::Max(x, _)
            | Op::Softmax(x, _)
            | Op::LogSoftmax(x, _)
            | Op::Reshape(x)
            | Op::Permute(x, _)
            | Op::Narrow(x, _, _)
            | Op::Slice(x, ..)
            | Op::Pad(x, _)
            | Op::Dropout(x, _)
            | Op::Broadcast(x)
            | Op::Contiguous(x)
            | Op::ToDevice(x) => vec![x],
            Op::Layer(_, saved) => saved.differentiable(),
        }
    }
}

thread_local! {
    static GRAD_ENABLED: Cell<bool> = const { Cell::new(true) };
}

/// Runs `f` with autograd recording off on this thread (evaluation, optimizer internals).
pub fn no_grad<T>(f: impl FnOnce() -> T) -> T {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            GRAD_ENABLED.with(|g| g.set(self.0));
        }
    }
    let _restore = Restore(GRAD_ENABLED.with(|g| g.replace(false)));
    f()
}

/// Whether ops on this thread record their inputs now.
pub fn is_grad_enabled() -> bool {
    GRAD_ENABLED.with(Cell::get)
}

/// `Some(op)` when recording is on and any input requires grad, counted in the thread's
/// [`GraphBudget`] (an error when it is spent).
pub(crate) fn record(inputs: &[&Tensor], op: impl FnOnce() -> Op) -> Result<Option<Recorded>> {
    if !(is_grad_enabled() && inputs.iter().any(|t| t.requires_grad())) {
        return Ok(None);
    }
    let node = BUDGET
        .with(|b| b.borrow().as_ref().map(GraphBudget::take))
        .transpose()?;
    Ok(Some(Recorded { op: op(), node }))
}

/// Whether two narrows' ranges `(dimension, start, length)` of one shape share no element:
/// ranges of one dimension that do not overlap, or an empty one.
fn disjoint(a: (usize, usize, usize), b: (usize, usize, usize)) -> bool {
    a.2 == 0 || b.2 == 0 || (a.0 == b.0 && (a.1 + a.2 <= b.1 || b.1 + b.2 <= a.1))
}

/// Every tensor the root depends on through tensors that require grad, inputs before outputs.
fn topological_order(root: &Tensor) -> Vec<Tensor> {
    let mut order = Vec::new();
    let mut seen = HashSet::new();
    let mut stack = vec![(root.clone(), false)];
    while let Some((t, expanded)) = stack.pop() {
        if expanded {
            order.push(t);
            continue;
        }
        if !seen.insert(t.id()) {
            continue;
        }
        stack.push((t.clone(), true));
        if let Some(op) = t.op() {
            for input in op.inputs() {
                if input.requires_grad() && !seen.contains(&input.id()) {
                    stack.push((input.clone(), false));
                }
            }
        }
    }
    order
}

pub(crate) fn backward(root: &Tensor) -> Result<()> {
    if root.numel() != 1 {
        return Err(TensorError::Autograd(format!(
            "the loss must have one element; this tensor has shape {:?} (reduce it first)",
            root.shape()
        )));
    }
    if !root.requires_grad() {
        return Err(TensorError::Autograd(
            "the loss does not depend on any tensor that requires grad".into(),
        ));
    }
    let order = topological_order(root);
    no_grad(|| {
        let mut grads: HashMap<u64, Tensor> = HashMap::new();
        // Gradients made here from narrows' gradients, held by nothing but `grads`: zeros
        // except the ranges listed (dimension, start, length), which were written.
        let mut placed: HashMap<u64, Vec<(usize, usize, usize)>> = HashMap::new();
        let mut leaves: Vec<(&Tensor, Tensor)> = Vec::new();
        grads.insert(root.id(), root.ones_like()?);
        for t in order.iter().rev() {
            let Some(g) = grads.remove(&t.id()) else {
                continue;
            };
            placed.remove(&t.id());
            let Some(op) = t.op() else {
                leaves.push((t, g));
                continue;
            };
            if let Op::Narrow(x, dim, start) = op {
                // The pieces of a split (q, k and v of one product) each write their own range
                // of one gradient instead of adding a mostly-zero tensor of the whole shape.
                if x.requires_grad() {
                    let range = (*dim, *start, t.shape()[*dim]);
                    let total = match (grads.remove(&x.id()), placed.get_mut(&x.id())) {
                        (Some(prev), Some(ranges))
                            if ranges.iter().all(|r| disjoint(*r, range)) =>
                        {
                            g.write_narrow_into(&prev, *dim, *start)?;
                            ranges.push(range);
                            prev
                        }
                        (Some(prev), _) => {
                            placed.remove(&x.id());
                            prev.add(&g.narrow_backward(x.shape(), *dim, *start)?)?
                        }
                        (None, _) => {
                            placed.insert(x.id(), vec![range]);
                            g.narrow_backward(x.shape(), *dim, *start)?
                        }
                    };
                    grads.insert(x.id(), total);
                }
                continue;
            }
            for (input, gi) in rules::input_grads(op, t, &g)? {
                let total = match grads.remove(&input.id()) {
                    Some(prev) => {
                        placed.remove(&input.id());
                        prev.add(&gi)?
                    }
                    None => gi,
                };
                grads.insert(input.id(), total);
            }
        }
        // All new gradients are computed before any leaf changes, so a failure (out of memory)
        // leaves every leaf's gradient as it was.
        let updated = leaves
            .iter()
            .map(|(leaf, g)| leaf.grad_plus(g))
            .collect::<Result<Vec<_>>>()?;
        for ((leaf, _), g) in leaves.iter().zip(updated) {
            leaf.store_grad(g);
        }
        Ok(())
    })
}
