//! Dispatch of the layer ops (conv2d, pooling, layer / batch norm, attention) to their kernels.
//!
//! The tensor layer (`tensor/layers.rs`) validates each op's spec, reserves the kernel's
//! workspace ([`conv2d_workspace`] and its siblings: the CPU kernels' slots on host devices, the
//! CUDA path's temporaries on a GPU) and every output in the job's pool, and hands dense inputs
//! here. Host devices (`cpu` and `sim`) run the CPU kernels of [`crate::nn_kernels`] over the
//! inputs' slices; CUDA runs the launches of `cuda/layers.rs` over device views of them.

use super::{Buffer, Storage, range_of};
use crate::cpu;
use crate::cuda::{self, CudaDevice};
use crate::error::{Result, TensorError};
use crate::layout::Layout;
use crate::memory::MemoryPool;
use crate::nn_kernels::{
    self, AttentionSpec, BatchNormSpec, Conv2dSpec, LayerNormSpec, Pool2dSpec, RunningStats,
};
use cudarc::driver::CudaView;
use std::sync::RwLockReadGuard;

/// A dense input: its buffer and layout (contiguous).
pub(crate) type Dense<'a> = (&'a Buffer, &'a Layout);

/// Workspace (f32 elements) to reserve for conv2d, forward or backward, on `pool`'s device.
pub(crate) fn conv2d_workspace(pool: &MemoryPool, spec: &Conv2dSpec) -> Result<usize> {
    match pool.device().is_host() {
        true => Ok(spec.workspace_elems()),
        false => cuda::conv2d_workspace(spec),
    }
}

/// Workspace for attention's forward or `backward` on `pool`'s device.
pub(crate) fn attention_workspace(
    pool: &MemoryPool,
    spec: &AttentionSpec,
    backward: bool,
) -> Result<usize> {
    match pool.device().is_host() {
        true => Ok(spec.workspace_elems()),
        false => cuda::attention_workspace(spec, backward),
    }
}

/// Workspace for layer norm's backward (forward needs none) on `pool`'s device.
pub(crate) fn layer_norm_workspace(pool: &MemoryPool, spec: &LayerNormSpec) -> usize {
    match pool.device().is_host() {
        true => spec.workspace_elems(),
        false => 0,
    }
}

/// Workspace for batch norm's backward (forward needs none) on `pool`'s device.
pub(crate) fn batch_norm_workspace(pool: &MemoryPool, spec: &BatchNormSpec) -> usize {
    match pool.device().is_host() {
        true => spec.workspace_elems(),
        false => cuda::batch_norm_workspace(spec),
    }
}

/// Read guards of the inputs' buffers (one per buffer, however many inputs share it) and, per
/// input, the index of its guard.
fn lock_all<'a>(inputs: &[Dense<'a>]) -> (Vec<RwLockReadGuard<'a, Storage>>, Vec<usize>) {
    let mut buffers: Vec<&Buffer> = Vec::new();
    let mut guards = Vec::new();
    let mut which = Vec::with_capacity(inputs.len());
    for (buffer, _) in inputs {
        match buffers.iter().position(|b| std::ptr::eq(*b, *buffer)) {
            Some(i) => which.push(i),
            None => {
                which.push(guards.len());
                buffers.push(buffer);
                guards.push(buffer.read());
            }
        }
    }
    (guards, which)
}

fn mixed(op: &'static str, pool: &MemoryPool) -> TensorError {
    TensorError::Internal {
        op,
        reason: format!("storage of another kind in a pool on {}", pool.device()),
    }
}

/// Runs `host` over the host slices of the dense `inputs` on a host device, or `gpu` over
/// device views of them on CUDA (each buffer read-locked once).
fn run<T>(
    pool: &MemoryPool,
    op: &'static str,
    inputs: &[Dense<'_>],
    host: impl FnOnce(&[&[f32]]) -> Result<T>,
    gpu: impl FnOnce(&CudaDevice, &[CudaView<'_, f32>]) -> Result<T>,
) -> Result<T> {
    let (guards, which) = lock_all(inputs);
    if pool.device().is_host() {
        let mut slices = Vec::with_capacity(inputs.len());
        for ((_, layout), &i) in inputs.iter().zip(&which) {
            match &*guards[i] {
                Storage::Cpu(v) => slices.push(&v[range_of(layout)]),
                Storage::Cuda(_) => return Err(mixed(op, pool)),
            }
        }
        return host(&slices);
    }
    let dev = pool.cuda(op)?;
    let mut views = Vec::with_capacity(inputs.len());
    for ((_, layout), &i) in inputs.iter().zip(&which) {
        match &*guards[i] {
            Storage::Cuda(v) => views.push(v.slice(range_of(layout))),
            Storage::Cpu(_) => return Err(mixed(op, pool)),
        }
    }
    gpu(dev, &views)
}

fn cuda_storages(outs: impl IntoIterator<Item = cuda::CudaStorage>) -> Vec<Storage> {
    outs.into_iter().map(Storage::Cuda).collect()
}

/// `n` zeroed host vectors of the given lengths (their bytes already reserved by the caller).
pub(crate) fn host_vecs<const N: usize>(lens: [usize; N]) -> [Vec<f32>; N] {
    lens.map(|n| vec![0.0; n])
}

/// Zeroed host vectors for the outputs that are wanted.
fn wanted(want: &[bool], lens: &[usize]) -> Vec<Option<Vec<f32>>> {
    want.iter()
        .zip(lens)
        .map(|(&w, &n)| w.then(|| vec![0.0; n]))
        .collect()
}

fn storages(outs: impl IntoIterator<Item = Option<Vec<f32>>>) -> Vec<Storage> {
    outs.into_iter().flatten().map(Storage::Cpu).collect()
}

fn three(mut v: Vec<Option<Vec<f32>>>) -> [Option<Vec<f32>>; 3] {
    let c = v.pop().flatten();
    let b = v.pop().flatten();
    let a = v.pop().flatten();
    [a, b, c]
}

fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// Inputs with an optional last one.
fn with_opt<'a>(mut inputs: Vec<Dense<'a>>, last: Option<Dense<'a>>) -> Vec<Dense<'a>> {
    inputs.extend(last);
    inputs
}

pub(crate) fn conv2d_forward(
    pool: &MemoryPool,
    spec: &Conv2dSpec,
    (x, w): (Dense<'_>, Dense<'_>),
    bias: Option<Dense<'_>>,
    ws: usize,
) -> Result<Vec<Storage>> {
    let tf32 = pool.allow_tf32();
    run(
        pool,
        "conv2d",
        &with_opt(vec![x, w], bias),
        |s| {
            // Neither the output nor the workspace is zeroed first: the kernel writes every
            // element of the output and of each workspace slot before reading it.
            let out = cpu::try_build(numel(&spec.out_shape()), |out| {
                cpu::with_scratch(ws, |ws| {
                    cpu::conv::conv2d_forward_uninit(spec, s[0], s[1], s.get(2).copied(), out, ws)
                })
            })?;
            Ok(vec![Storage::Cpu(out)])
        },
        |dev, v| {
            let y = dev.conv2d_forward(spec, &v[0], &v[1], v.get(2), tf32)?;
            Ok(vec![Storage::Cuda(y)])
        },
    )
}

/// The gradients `want`ed of (input, weight, bias), in that order.
pub(crate) fn conv2d_backward(
    pool: &MemoryPool,
    spec: &Conv2dSpec,
    (x, w, dy): (Dense<'_>, Dense<'_>, Dense<'_>),
    want: [bool; 3],
    ws: usize,
) -> Result<Vec<Storage>> {
    let tf32 = pool.allow_tf32();
    run(
        pool,
        "conv2d backward",
        &[x, w, dy],
        |s| {
            let lens = [s[0].len(), s[1].len(), spec.out_shape()[1]];
            let [mut dx, mut dw, mut db] = three(wanted(&want, &lens));
            // The workspace is not zeroed: the kernel zeroes its partial gradients and
            // writes each slot before reading it.
            cpu::with_scratch(ws, |ws| {
                nn_kernels::conv2d_backward(
                    spec,
                    s[0],
                    s[1],
                    s[2],
                    dx.as_deref_mut(),
                    dw.as_deref_mut(),
                    db.as_deref_mut(),
                    ws,
                )
            })?;
            Ok(storages([dx, dw, db]))
        },
        |dev, v| {
            let grads = dev.conv2d_backward(spec, &v[0], &v[1], &v[2], want, tf32)?;
            Ok(cuda_storages(grads))
        },
    )
}

/// Max pooling: the output and its argmax indices, as `u32` bits in f32 storage.
pub(crate) fn max_pool2d_forward(
    pool: &MemoryPool,
    spec: &Pool2dSpec,
    x: Dense<'_>,
) -> Result<Vec<Storage>> {
    run(
        pool,
        "max_pool2d",
        &[x],
        |s| {
            // Written by the kernel without zeroing first; the indices straight into f32
            // storage as their bits.
            let n = spec.out_numel();
            let mut out = Vec::new();
            let bits = cpu::try_build(n, |bits| {
                out = cpu::try_build(n, |o| {
                    cpu::pool::max_pool2d_forward_uninit(spec, s[0], o, cpu::uninit_bits(bits))
                })?;
                Ok::<_, TensorError>(())
            })?;
            Ok(vec![Storage::Cpu(out), Storage::Cpu(bits)])
        },
        |dev, v| Ok(cuda_storages(dev.max_pool2d_forward(spec, &v[0])?)),
    )
}

/// The input gradient of max pooling (the indices' `u32` bits read in place, no workspace).
pub(crate) fn max_pool2d_backward(
    pool: &MemoryPool,
    spec: &Pool2dSpec,
    (dy, indices): (Dense<'_>, Dense<'_>),
    input_len: usize,
) -> Result<Vec<Storage>> {
    run(
        pool,
        "max_pool2d backward",
        &[dy, indices],
        |s| {
            // The indices read in place; `dx` zeroed by the kernel plane by plane.
            let idx = cpu::bits_as_u32(s[1]);
            let dx = cpu::try_build(input_len, |dx| {
                cpu::pool::max_pool2d_backward_uninit(spec, s[0], idx, dx)
            })?;
            Ok(vec![Storage::Cpu(dx)])
        },
        |dev, v| {
            let dx = dev.pool2d_backward(spec, &v[0], Some(&v[1]), input_len)?;
            Ok(vec![Storage::Cuda(dx)])
        },
    )
}

pub(crate) fn avg_pool2d_forward(
    pool: &MemoryPool,
    spec: &Pool2dSpec,
    x: Dense<'_>,
) -> Result<Vec<Storage>> {
    run(
        pool,
        "avg_pool2d",
        &[x],
        |s| {
            let [mut out] = host_vecs([spec.out_numel()]);
            nn_kernels::avg_pool2d_forward(spec, s[0], &mut out)?;
            Ok(vec![Storage::Cpu(out)])
        },
        |dev, v| Ok(vec![Storage::Cuda(dev.avg_pool2d_forward(spec, &v[0])?)]),
    )
}

pub(crate) fn avg_pool2d_backward(
    pool: &MemoryPool,
    spec: &Pool2dSpec,
    dy: Dense<'_>,
    input_len: usize,
) -> Result<Vec<Storage>> {
    run(
        pool,
        "avg_pool2d backward",
        &[dy],
        |s| {
            let [mut dx] = host_vecs([input_len]);
            nn_kernels::avg_pool2d_backward(spec, s[0], &mut dx)?;
            Ok(vec![Storage::Cpu(dx)])
        },
        |dev, v| {
            let dx = dev.pool2d_backward(spec, &v[0], None, input_len)?;
            Ok(vec![Storage::Cuda(dx)])
        },
    )
}

/// Layer norm: the output, then each row's mean and rstd.
pub(crate) fn layer_norm_forward(
    pool: &MemoryPool,
    spec: &LayerNormSpec,
    x: Dense<'_>,
    (w, b): (Option<Dense<'_>>, Option<Dense<'_>>),
) -> Result<Vec<Storage>> {
    let inputs = with_opt(with_opt(vec![x], w), b);
    let (has_w, has_b) = (w.is_some(), b.is_some());
    run(
        pool,
        "layer_norm",
        &inputs,
        |s| {
            let (ws, bs) = affine(s, has_w, has_b);
            let (ws, bs) = (ws.copied(), bs.copied());
            let [mut y, mut mean, mut rstd] = host_vecs([s[0].len(), spec.rows(), spec.rows()]);
            nn_kernels::layer_norm_forward(spec, s[0], ws, bs, &mut y, &mut mean, &mut rstd)?;
            Ok(vec![
                Storage::Cpu(y),
                Storage::Cpu(mean),
                Storage::Cpu(rstd),
            ])
        },
        |dev, v| {
            let (wv, bv) = affine(v, has_w, has_b);
            Ok(cuda_storages(dev.layer_norm_forward(spec, &v[0], wv, bv)?))
        },
    )
}

/// The optional weight and bias after the input (`s[0]`).
fn affine<T>(s: &[T], w: bool, b: bool) -> (Option<&T>, Option<&T>) {
    let ws = w.then(|| &s[1]);
    let bs = b.then(|| &s[1 + usize::from(w)]);
    (ws, bs)
}

/// The gradients `want`ed of (input, weight, bias) of a layer norm.
pub(crate) fn layer_norm_backward(
    pool: &MemoryPool,
    spec: &LayerNormSpec,
    io: (Dense<'_>, Dense<'_>, Dense<'_>, Dense<'_>),
    w: Option<Dense<'_>>,
    want: [bool; 3],
    ws: usize,
) -> Result<Vec<Storage>> {
    let op = "layer_norm backward";
    let kernel = nn_kernels::layer_norm_backward;
    norm_backward(
        pool,
        op,
        spec,
        spec.cols(),
        io,
        w,
        want,
        ws,
        kernel,
        |dev, v, w| dev.layer_norm_backward(spec, (&v[0], &v[1], &v[2], &v[3]), w, want),
    )
}

/// The shape of both norms' backward kernels: (spec, x, weight, mean, rstd, dy) in, the
/// wanted (dx, d_weight, d_bias) and a workspace out.
type NormBackward<S> = fn(
    &S,
    &[f32],
    Option<&[f32]>,
    &[f32],
    &[f32],
    &[f32],
    Option<&mut [f32]>,
    Option<&mut [f32]>,
    Option<&mut [f32]>,
    &mut [f32],
) -> Result<()>;

/// A norm's backward: on host slices `params` elements each for the weight and bias
/// gradients; on CUDA `gpu` over the views of (x, mean, rstd, dy) and the weight's.
#[allow(clippy::too_many_arguments)]
fn norm_backward<S>(
    pool: &MemoryPool,
    op: &'static str,
    spec: &S,
    params: usize,
    (x, mean, rstd, dy): (Dense<'_>, Dense<'_>, Dense<'_>, Dense<'_>),
    w: Option<Dense<'_>>,
    want: [bool; 3],
    ws: usize,
    kernel: NormBackward<S>,
    gpu: impl FnOnce(
        &CudaDevice,
        &[CudaView<'_, f32>],
        Option<&CudaView<'_, f32>>,
    ) -> Result<Vec<cuda::CudaStorage>>,
) -> Result<Vec<Storage>> {
    let has_w = w.is_some();
    let inputs = with_opt(vec![x, mean, rstd, dy], w);
    run(
        pool,
        op,
        &inputs,
        |s| {
            let [mut dx, mut dw, mut db] = three(wanted(&want, &[s[0].len(), params, params]));
            let [mut ws] = host_vecs([ws]);
            let weight = has_w.then(|| s[4]);
            kernel(
                spec,
                s[0],
                weight,
                s[1],
                s[2],
                s[3],
                dx.as_deref_mut(),
                dw.as_deref_mut(),
                db.as_deref_mut(),
                &mut ws,
            )?;
            Ok(storages([dx, dw, db]))
        },
        |dev, v| Ok(cuda_storages(gpu(dev, v, has_w.then(|| &v[4]))?)),
    )
}

/// Batch norm: the output, then the per-channel mean and rstd used. `running` holds dense
/// copies of the running mean and variance, read (eval) or updated (training) in place.
pub(crate) fn batch_norm_forward(
    pool: &MemoryPool,
    spec: &BatchNormSpec,
    x: Dense<'_>,
    (w, b): (Option<Dense<'_>>, Option<Dense<'_>>),
    running: (&Buffer, &Buffer),
) -> Result<Vec<Storage>> {
    const OP: &str = "batch_norm";
    let inputs = with_opt(with_opt(vec![x], w), b);
    let (has_w, has_b) = (w.is_some(), b.is_some());
    run(
        pool,
        OP,
        &inputs,
        |s| {
            let (ws, bs) = affine(s, has_w, has_b);
            let (ws, bs) = (ws.copied(), bs.copied());
            let c = spec.channels();
            let [mut y, mut mean, mut rstd] = host_vecs([s[0].len(), c, c]);
            let (mut rm, mut rv) = (running.0.write(), running.1.write());
            let (Storage::Cpu(rm), Storage::Cpu(rv)) = (&mut *rm, &mut *rv) else {
                return Err(mixed(OP, pool));
            };
            let stats = RunningStats { mean: rm, var: rv };
            nn_kernels::batch_norm_forward(
                spec,
                s[0],
                ws,
                bs,
                Some(stats),
                &mut y,
                &mut mean,
                &mut rstd,
            )?;
            Ok(vec![
                Storage::Cpu(y),
                Storage::Cpu(mean),
                Storage::Cpu(rstd),
            ])
        },
        |dev, v| {
            let (mut rm, mut rv) = (running.0.write(), running.1.write());
            let (Storage::Cuda(rm), Storage::Cuda(rv)) = (&mut *rm, &mut *rv) else {
                return Err(mixed(OP, pool));
            };
            let out = dev.batch_norm_forward(spec, &v[0], affine(v, has_w, has_b), (rm, rv))?;
            Ok(cuda_storages(out))
        },
    )
}

/// The gradients `want`ed of (input, weight, bias) of a batch norm.
pub(crate) fn batch_norm_backward(
    pool: &MemoryPool,
    spec: &BatchNormSpec,
    io: (Dense<'_>, Dense<'_>, Dense<'_>, Dense<'_>),
    w: Option<Dense<'_>>,
    want: [bool; 3],
    ws: usize,
) -> Result<Vec<Storage>> {
    let op = "batch_norm backward";
    let kernel = nn_kernels::batch_norm_backward;
    norm_backward(
        pool,
        op,
        spec,
        spec.channels(),
        io,
        w,
        want,
        ws,
        kernel,
        |dev, v, w| dev.batch_norm_backward(spec, (&v[0], &v[1], &v[2], &v[3]), w, want),
    )
}

/// Attention: the output, then the per-row logsumexp.
pub(crate) fn attention_forward(
    pool: &MemoryPool,
    spec: &AttentionSpec,
    (q, k, v): (Dense<'_>, Dense<'_>, Dense<'_>),
    mask: Option<Dense<'_>>,
    ws: usize,
) -> Result<Vec<Storage>> {
    let tf32 = pool.allow_tf32();
    run(
        pool,
        "scaled_dot_product_attention",
        &with_opt(vec![q, k, v], mask),
        |s| {
            let [mut out, mut lse, mut ws] =
                host_vecs([numel(&spec.out_shape()), spec.lse_len(), ws]);
            let m = s.get(3).copied();
            nn_kernels::attention_forward(spec, s[0], s[1], s[2], m, &mut out, &mut lse, &mut ws)?;
            Ok(vec![Storage::Cpu(out), Storage::Cpu(lse)])
        },
        |dev, v| {
            let out = dev.attention_forward(spec, (&v[0], &v[1], &v[2]), v.get(3), tf32)?;
            Ok(cuda_storages(out))
        },
    )
}

/// Gradients of q, k and v.
pub(crate) fn attention_backward(
    pool: &MemoryPool,
    spec: &AttentionSpec,
    (q, k, v): (Dense<'_>, Dense<'_>, Dense<'_>),
    (out, lse, dy): (Dense<'_>, Dense<'_>, Dense<'_>),
    mask: Option<Dense<'_>>,
    ws: usize,
) -> Result<Vec<Storage>> {
    let tf32 = pool.allow_tf32();
    let inputs = with_opt(vec![q, k, v, out, lse, dy], mask);
    run(
        pool,
        "scaled_dot_product_attention backward",
        &inputs,
        |s| {
            let [mut dq, mut dk, mut dv, mut ws] =
                host_vecs([s[0].len(), s[1].len(), s[2].len(), ws]);
            let m = s.get(6).copied();
            nn_kernels::attention_backward(
                spec, s[0], s[1], s[2], m, s[3], s[4], s[5], &mut dq, &mut dk, &mut dv, &mut ws,
            )?;
            Ok(vec![Storage::Cpu(dq), Storage::Cpu(dk), Storage::Cpu(dv)])
        },
        |dev, v| {
            let grads = dev.attention_backward(
                spec,
                (&v[0], &v[1], &v[2]),
                (&v[3], &v[4], &v[5]),
                v.get(6),
                tf32,
            )?;
            Ok(cuda_storages(grads))
        },
    )
}
