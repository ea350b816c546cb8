//! Layer ops: conv2d, max and average pooling, layer and batch norm, fused attention. Each is
//! declared once, in a file of its own here, through the [`LayerOp`] trait (in the spirit of
//! candle's `CustomOp`), as an elementwise op is one entry of the op table (`ops/table.rs`).
//!
//! An op's file holds its struct (the validated spec of one call), the public `Tensor` method
//! that checks the arguments and builds it, and its `LayerOp` impl: the name and work of each
//! pass, the workspace each needs on a device, the output shapes, and the forward and backward
//! on the CPU (calling the kernels of `cpu/`, public as [`crate::nn_kernels`]) and on CUDA
//! (calling the launches of `cuda/layers.rs`). Everything around them is written once, here:
//!
//! - [`apply`] runs a forward: it counts the op's work against the caller's deadline
//!   (`work.rs`) before anything else, reserves the kernel's workspace in the job's pool, makes
//!   the inputs dense, reserves every output (through the one shape check), runs the kernel on
//!   the pool's device (`storage::layer_kernel`, the one place that matches the storage
//!   variant) and records one autograd node, [`Op::Layer`]: the op, its dense inputs and the
//!   outputs it keeps for backward ([`Saved`]).
//! - [`grads`] runs a backward for that node (autograd/rules.rs): the work check, the
//!   workspace, then the gradients of the inputs that require grad, reserved before the kernel
//!   runs; backward kernels compute only those.
//!
//! Saved state: conv2d and the norms keep their dense inputs, and the norms their per-row or
//! per-channel mean and rstd; max pooling keeps its argmax indices (u32 bits in f32 storage,
//! never read as numbers); attention keeps its inputs and its logsumexp (the output is the node
//! itself).

mod attention;
mod batch_norm;
mod conv2d;
mod layer_norm;
mod pool2d;

use crate::autograd::{self, Op};
use crate::cpu::CpuStorage;
use crate::cuda::{CudaDevice, CudaStorage};
use crate::device::Device;
use crate::error::{Result, TensorError};
use crate::storage::{self, Buffer, Dense, Storage};
use crate::tensor::Tensor;
use crate::work::{self, Kind};
use cudarc::driver::CudaView;
use std::sync::Arc;

/// Which pass of an op runs.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Pass<'a> {
    Forward,
    /// Backward, with which of the op's differentiable inputs (in order, an absent optional one
    /// included) want a gradient.
    Backward(&'a [bool]),
}

/// A layer op: one call's validated spec and how to run it. See the module docs.
pub(crate) trait LayerOp: Send + Sync + 'static {
    /// The op's name in errors, per pass ("conv2d", "conv2d backward").
    fn name(&self, pass: Pass<'_>) -> &'static str;

    /// What a pass counts against the caller's deadline, from the shapes alone.
    fn work(&self, pass: Pass<'_>) -> (Kind, u64);

    /// The f32 workspace a pass needs on `device` (the CPU kernels' slots on host devices, the
    /// CUDA launches' temporaries on a GPU), reserved before anything else is allocated.
    fn workspace(&self, _device: Device, _pass: Pass<'_>) -> Result<usize> {
        Ok(0)
    }

    /// The forward's output shapes: the result, then the outputs kept for backward.
    fn out_shapes(&self) -> Vec<Vec<usize>>;

    /// Forward on a host device: one vector per output shape, in order.
    fn cpu_forward(&self, io: Host<'_>) -> Result<Vec<CpuStorage>>;

    /// Forward on CUDA: one buffer per output shape, in order.
    fn cuda_forward(&self, io: Gpu<'_>) -> Result<Vec<CudaStorage>>;

    /// Whether the forward's state (dense copies of the `state` tensors given to [`apply`],
    /// which the kernel may update) is written back to those tensors. No by default.
    fn writes_state(&self) -> bool {
        false
    }

    /// Backward's inputs, in the order its kernels read them, from the saved inputs and kept
    /// outputs, the result `out` (the node) and its dense gradient `g`.
    fn backward_inputs<'t>(
        &self,
        saved: &'t Saved,
        out: &'t Tensor,
        g: &'t Tensor,
    ) -> Vec<Option<&'t Tensor>>;

    /// Backward on a host device: the gradients `want`ed of the differentiable inputs, one per
    /// `true`, in order.
    fn cpu_backward(&self, io: Host<'_>, want: &[bool]) -> Result<Vec<CpuStorage>>;

    /// Backward on CUDA, as [`LayerOp::cpu_backward`].
    fn cuda_backward(&self, io: Gpu<'_>, want: &[bool]) -> Result<Vec<CudaStorage>>;
}

/// An input of [`apply`]; `None` is an optional input not given.
pub(crate) enum Arg<'a> {
    /// An input that gets a gradient.
    Grad(Option<&'a Tensor>),
    /// An input read but never differentiated (attention's mask): made dense with recording
    /// off and detached.
    Const(Option<&'a Tensor>),
}

/// A kernel's inputs by position (`None` where an optional input is not given).
pub(crate) struct Inputs<T> {
    op: &'static str,
    items: Vec<Option<T>>,
}

impl<T> Inputs<T> {
    pub(crate) fn new(op: &'static str, items: Vec<Option<T>>) -> Self {
        Inputs { op, items }
    }

    /// Input `i`, which the op always passes.
    pub(crate) fn get(&self, i: usize) -> Result<&T> {
        self.opt(i).ok_or_else(|| TensorError::Internal {
            op: self.op,
            reason: format!("input {i} is missing"),
        })
    }

    /// Optional input `i`.
    pub(crate) fn opt(&self, i: usize) -> Option<&T> {
        self.items.get(i).and_then(Option::as_ref)
    }
}

/// What a pass's kernel gets on a host device: the inputs' slices, the state's (written in
/// place) and the f32 workspace reserved for it.
pub(crate) struct Host<'a> {
    pub inputs: Inputs<&'a [f32]>,
    pub state: Vec<&'a mut [f32]>,
    pub workspace: usize,
}

/// What a pass's kernel gets on CUDA: the device, views of the inputs, the state's buffers
/// (written in place) and whether TF32 products are allowed.
pub(crate) struct Gpu<'a> {
    pub dev: &'a CudaDevice,
    pub inputs: Inputs<CudaView<'a, f32>>,
    pub state: Vec<&'a mut CudaStorage>,
    pub tf32: bool,
}

/// What a layer op's autograd node keeps for backward.
pub(crate) struct Saved {
    /// The inputs as the kernel read them (dense), in the op's order.
    inputs: Vec<Option<Tensor>>,
    /// Which of them get a gradient.
    grad: Vec<bool>,
    /// The outputs after the result (norms' mean and rstd, max pooling's indices, attention's
    /// logsumexp).
    kept: Vec<Tensor>,
}

impl Saved {
    /// Input `i` (dense), if given.
    pub(crate) fn input(&self, i: usize) -> Option<&Tensor> {
        self.inputs.get(i).and_then(Option::as_ref)
    }

    /// Kept output `i` (output `i + 1` of the forward).
    pub(crate) fn kept(&self, i: usize) -> Option<&Tensor> {
        self.kept.get(i)
    }

    /// The differentiable inputs in order, an absent optional one as `None`.
    fn targets(&self) -> Vec<Option<&Tensor>> {
        self.inputs
            .iter()
            .zip(&self.grad)
            .filter(|(_, g)| **g)
            .map(|(t, _)| t.as_ref())
            .collect()
    }

    /// The inputs the graph walks through: the differentiable ones given.
    pub(crate) fn differentiable(&self) -> Vec<&Tensor> {
        self.targets().into_iter().flatten().collect()
    }

    /// Every tensor held, moved out (to drop long graphs without recursion).
    pub(crate) fn into_tensors(self) -> Vec<Tensor> {
        self.inputs.into_iter().flatten().chain(self.kept).collect()
    }
}

/// Every given tensor is on `x`'s device.
pub(crate) fn same_devices(op: &'static str, x: &Tensor, others: &[Option<&Tensor>]) -> Result<()> {
    others
        .iter()
        .flatten()
        .try_for_each(|t| crate::tensor::same_device(op, x, t))
}

/// An optional parameter's shape must be `want` (its elements match the kernel's one per column
/// or channel).
pub(crate) fn check_param(op: &'static str, p: Option<&Tensor>, want: &[usize]) -> Result<()> {
    match p {
        Some(p) if p.shape() != want => Err(TensorError::ShapeMismatch {
            op,
            lhs: want.to_vec(),
            rhs: p.shape().to_vec(),
        }),
        _ => Ok(()),
    }
}

/// `want` for an op of three differentiable inputs (an absent one never wants a gradient).
pub(crate) fn want3(want: &[bool]) -> [bool; 3] {
    std::array::from_fn(|i| want.get(i).copied().unwrap_or(false))
}

/// Zeroed host vectors for the gradients `want`ed of three inputs of the given lengths (their
/// bytes already reserved).
pub(crate) fn wanted3(want: &[bool], lens: [usize; 3]) -> [Option<Vec<f32>>; 3] {
    let want = want3(want);
    std::array::from_fn(|i| want[i].then(|| vec![0.0; lens[i]]))
}

/// The gradients computed, in order.
pub(crate) fn computed<const N: usize>(grads: [Option<Vec<f32>>; N]) -> Vec<CpuStorage> {
    grads.into_iter().flatten().collect()
}

fn dense(t: &Tensor) -> Dense<'_> {
    (t.buffer(), t.layout())
}

/// Runs `op`'s forward on `args` (the first one given and on the op's device) and, where
/// autograd wants it, records its node. `state` tensors are copied dense before the kernel runs
/// (it reads or updates the copies) and the copies written back when the op says so.
pub(crate) fn apply<O: LayerOp>(op: O, args: &[Arg<'_>], state: &[&Tensor]) -> Result<Tensor> {
    let name = op.name(Pass::Forward);
    let first = args
        .iter()
        .find_map(|a| match a {
            Arg::Grad(t) | Arg::Const(t) => *t,
        })
        .ok_or_else(|| TensorError::Internal {
            op: name,
            reason: "a layer op without inputs".into(),
        })?;
    let (kind, amount) = op.work(Pass::Forward);
    work::admit(name, first.device(), kind, amount)?;
    let pool = first.pool();
    let ws = op.workspace(pool.device(), Pass::Forward)?;
    let _ws = storage::reserve_workspace(pool, ws)?;
    let mut inputs = Vec::with_capacity(args.len());
    let mut grad = Vec::with_capacity(args.len());
    for arg in args {
        let (t, g) = match arg {
            Arg::Grad(t) => (t.map(Tensor::contiguous).transpose()?, true),
            Arg::Const(t) => {
                let t = autograd::no_grad(|| t.map(Tensor::contiguous).transpose())?;
                (t.map(|t| t.detach()), false)
            }
        };
        inputs.push(t);
        grad.push(g);
    }
    // Fresh dense copies of the state: the kernel updates them while it reads the inputs (no
    // lock can alias), and they go back with `assign` (any layout).
    let copies = state
        .iter()
        .map(|t| -> Result<Tensor> {
            let buffer = storage::alloc(pool, name, t.shape(), || {
                storage::gather(pool, &t.buffer().read(), t.layout())
            })?;
            Ok(Tensor::dense(buffer, t.shape(), None))
        })
        .collect::<Result<Vec<_>>>()?;
    let shapes = op.out_shapes();
    let shape_refs: Vec<&[usize]> = shapes.iter().map(Vec::as_slice).collect();
    let buffers = storage::alloc_many(pool, name, &shape_refs, || {
        let dense_inputs: Vec<_> = inputs.iter().map(|t| t.as_ref().map(dense)).collect();
        let state_buffers: Vec<&Buffer> = copies.iter().map(|t| t.buffer().as_ref()).collect();
        storage::layer_kernel(
            pool,
            name,
            &dense_inputs,
            &state_buffers,
            |inputs, state| {
                let io = Host {
                    inputs,
                    state,
                    workspace: ws,
                };
                Ok(op.cpu_forward(io)?.into_iter().map(Storage::Cpu).collect())
            },
            |dev, inputs, state| {
                let io = Gpu {
                    dev,
                    inputs,
                    state,
                    tf32: pool.allow_tf32(),
                };
                Ok(op
                    .cuda_forward(io)?
                    .into_iter()
                    .map(Storage::Cuda)
                    .collect())
            },
        )
    })?;
    if op.writes_state() {
        for (t, copy) in state.iter().zip(&copies) {
            t.assign(copy)?;
        }
    }
    let mut buffers = buffers.into_iter();
    let (Some(out), Some((shape, kept_shapes))) = (buffers.next(), shapes.split_first()) else {
        return Err(TensorError::Internal {
            op: name,
            reason: "a layer op without outputs".into(),
        });
    };
    let kept: Vec<Tensor> = buffers
        .zip(kept_shapes)
        .map(|(b, shape)| Tensor::dense(b, shape, None))
        .collect();
    let differentiable: Vec<&Tensor> = inputs
        .iter()
        .zip(&grad)
        .filter(|(_, g)| **g)
        .filter_map(|(t, _)| t.as_ref())
        .collect();
    let rec = autograd::record(&differentiable, || {
        let saved = Saved {
            inputs: inputs.clone(),
            grad,
            kept,
        };
        Op::Layer(Arc::new(op), Box::new(saved))
    })?;
    Ok(Tensor::dense(out, shape, rec))
}

/// The gradients of the node `out` of `op` (with gradient `g`) for its inputs that require
/// grad: their shapes are reserved in the pool, then the backward kernel computes exactly those.
pub(crate) fn grads(
    op: &dyn LayerOp,
    saved: &Saved,
    out: &Tensor,
    g: &Tensor,
) -> Result<Vec<(Tensor, Tensor)>> {
    let targets = saved.targets();
    let want: Vec<bool> = targets
        .iter()
        .map(|t| t.is_some_and(Tensor::requires_grad))
        .collect();
    let pass = Pass::Backward(&want);
    let name = op.name(pass);
    let pool = saved
        .input(0)
        .ok_or_else(|| TensorError::Internal {
            op: name,
            reason: "the first input was not saved".into(),
        })?
        .pool();
    let (kind, amount) = op.work(pass);
    work::admit(name, pool.device(), kind, amount)?;
    let ws = op.workspace(pool.device(), pass)?;
    let _ws = storage::reserve_workspace(pool, ws)?;
    let g = g.contiguous()?;
    let chosen: Vec<&Tensor> = targets
        .into_iter()
        .flatten()
        .filter(|t| t.requires_grad())
        .collect();
    if chosen.is_empty() {
        return Ok(Vec::new());
    }
    let shapes: Vec<&[usize]> = chosen.iter().map(|t| t.shape()).collect();
    let buffers = storage::alloc_many(pool, name, &shapes, || {
        let inputs = op.backward_inputs(saved, out, &g);
        let dense_inputs: Vec<_> = inputs.iter().map(|t| t.map(dense)).collect();
        storage::layer_kernel(
            pool,
            name,
            &dense_inputs,
            &[],
            |inputs, state| {
                let io = Host {
                    inputs,
                    state,
                    workspace: ws,
                };
                let grads = op.cpu_backward(io, &want)?;
                Ok(grads.into_iter().map(Storage::Cpu).collect())
            },
            |dev, inputs, state| {
                let io = Gpu {
                    dev,
                    inputs,
                    state,
                    tf32: pool.allow_tf32(),
                };
                let grads = op.cuda_backward(io, &want)?;
                Ok(grads.into_iter().map(Storage::Cuda).collect())
            },
        )
    })?;
    Ok(chosen
        .into_iter()
        .zip(buffers)
        .map(|(t, b)| (t.clone(), Tensor::dense(b, t.shape(), None)))
        .collect())
}

#[cfg(test)]
mod tests;
