//! Dispatch of the layer ops (conv2d, pooling, layer / batch norm, attention) to their kernels.
//!
//! The tensor layer (`tensor/layers.rs`) validates each op's spec, reserves the kernel's
//! workspace and every output in the job's pool, and hands dense inputs here. Host devices (`cpu`
//! and `sim`) run the CPU kernels of [`crate::nn_kernels`] over the inputs' slices; CUDA has no
//! kernels for these ops yet, which is an error value naming the op and the device.

use super::{Buffer, Storage, range_of};
use crate::error::{Result, TensorError};
use crate::layout::Layout;
use crate::memory::MemoryPool;
use crate::nn_kernels::{
    self, AttentionSpec, BatchNormSpec, Conv2dSpec, LayerNormSpec, Pool2dSpec, RunningStats,
};
use std::sync::RwLockReadGuard;

/// A dense input: its buffer and layout (contiguous).
pub(crate) type Dense<'a> = (&'a Buffer, &'a Layout);

/// The error for a layer op on a device without its kernel.
pub(crate) fn no_kernel(op: &'static str, pool: &MemoryPool) -> TensorError {
    TensorError::Cuda {
        op,
        device: pool.device(),
        reason: format!(
            "{op} has no CUDA kernel yet; run it on cpu or a sim device (move tensors with `to`)"
        ),
    }
}

/// Runs `f` over the host slices of the dense `inputs` (each buffer read-locked once, however
/// many inputs share it), or fails with [`no_kernel`] on a device whose data is not on the host.
pub(crate) fn with_host_slices<T>(
    pool: &MemoryPool,
    op: &'static str,
    inputs: &[Dense<'_>],
    f: impl FnOnce(&[&[f32]]) -> Result<T>,
) -> Result<T> {
    if !pool.device().is_host() {
        return Err(no_kernel(op, pool));
    }
    let mut guards: Vec<(&Buffer, RwLockReadGuard<'_, Storage>)> = Vec::new();
    let mut which = Vec::with_capacity(inputs.len());
    for (buffer, _) in inputs {
        match guards.iter().position(|(b, _)| std::ptr::eq(*b, *buffer)) {
            Some(i) => which.push(i),
            None => {
                which.push(guards.len());
                guards.push((buffer, buffer.read()));
            }
        }
    }
    let mut slices = Vec::with_capacity(inputs.len());
    for ((_, layout), &i) in inputs.iter().zip(&which) {
        match &*guards[i].1 {
            Storage::Cpu(v) => slices.push(&v[range_of(layout)]),
            Storage::Cuda(_) => {
                return Err(TensorError::Internal {
                    op,
                    reason: format!("CUDA storage in a pool on {}", pool.device()),
                });
            }
        }
    }
    f(&slices)
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
    with_host_slices(pool, "conv2d", &with_opt(vec![x, w], bias), |s| {
        let [mut out, mut ws] = host_vecs([numel(&spec.out_shape()), ws]);
        nn_kernels::conv2d_forward(spec, s[0], s[1], s.get(2).copied(), &mut out, &mut ws)?;
        Ok(vec![Storage::Cpu(out)])
    })
}

/// The gradients `want`ed of (input, weight, bias), in that order.
pub(crate) fn conv2d_backward(
    pool: &MemoryPool,
    spec: &Conv2dSpec,
    (x, w, dy): (Dense<'_>, Dense<'_>, Dense<'_>),
    want: [bool; 3],
    ws: usize,
) -> Result<Vec<Storage>> {
    with_host_slices(pool, "conv2d backward", &[x, w, dy], |s| {
        let lens = [s[0].len(), s[1].len(), spec.out_shape()[1]];
        let [mut dx, mut dw, mut db] = three(wanted(&want, &lens));
        let [mut ws] = host_vecs([ws]);
        nn_kernels::conv2d_backward(
            spec,
            s[0],
            s[1],
            s[2],
            dx.as_deref_mut(),
            dw.as_deref_mut(),
            db.as_deref_mut(),
            &mut ws,
        )?;
        Ok(storages([dx, dw, db]))
    })
}

/// Max pooling: the output and its argmax indices, as `u32` bits in f32 storage.
pub(crate) fn max_pool2d_forward(
    pool: &MemoryPool,
    spec: &Pool2dSpec,
    x: Dense<'_>,
) -> Result<Vec<Storage>> {
    with_host_slices(pool, "max_pool2d", &[x], |s| {
        let [mut out] = host_vecs([spec.out_numel()]);
        let mut indices = vec![0u32; spec.out_numel()];
        nn_kernels::max_pool2d_forward(spec, s[0], &mut out, &mut indices)?;
        // Same size and alignment: collected in place, no second allocation.
        let bits: Vec<f32> = indices.into_iter().map(f32::from_bits).collect();
        Ok(vec![Storage::Cpu(out), Storage::Cpu(bits)])
    })
}

/// The input gradient of max pooling; the caller reserved `out_numel` elements of workspace
/// for the indices read back as `u32`.
pub(crate) fn max_pool2d_backward(
    pool: &MemoryPool,
    spec: &Pool2dSpec,
    (dy, indices): (Dense<'_>, Dense<'_>),
    input_len: usize,
) -> Result<Vec<Storage>> {
    with_host_slices(pool, "max_pool2d backward", &[dy, indices], |s| {
        let idx: Vec<u32> = s[1].iter().map(|v| v.to_bits()).collect();
        let [mut dx] = host_vecs([input_len]);
        nn_kernels::max_pool2d_backward(spec, s[0], &idx, &mut dx)?;
        Ok(vec![Storage::Cpu(dx)])
    })
}

pub(crate) fn avg_pool2d_forward(
    pool: &MemoryPool,
    spec: &Pool2dSpec,
    x: Dense<'_>,
) -> Result<Vec<Storage>> {
    with_host_slices(pool, "avg_pool2d", &[x], |s| {
        let [mut out] = host_vecs([spec.out_numel()]);
        nn_kernels::avg_pool2d_forward(spec, s[0], &mut out)?;
        Ok(vec![Storage::Cpu(out)])
    })
}

pub(crate) fn avg_pool2d_backward(
    pool: &MemoryPool,
    spec: &Pool2dSpec,
    dy: Dense<'_>,
    input_len: usize,
) -> Result<Vec<Storage>> {
    with_host_slices(pool, "avg_pool2d backward", &[dy], |s| {
        let [mut dx] = host_vecs([input_len]);
        nn_kernels::avg_pool2d_backward(spec, s[0], &mut dx)?;
        Ok(vec![Storage::Cpu(dx)])
    })
}

/// Layer norm: the output, then each row's mean and rstd.
pub(crate) fn layer_norm_forward(
    pool: &MemoryPool,
    spec: &LayerNormSpec,
    x: Dense<'_>,
    (w, b): (Option<Dense<'_>>, Option<Dense<'_>>),
) -> Result<Vec<Storage>> {
    let inputs = with_opt(with_opt(vec![x], w), b);
    with_host_slices(pool, "layer_norm", &inputs, |s| {
        let (ws, bs) = affine_slices(s, w.is_some(), b.is_some());
        let [mut y, mut mean, mut rstd] = host_vecs([s[0].len(), spec.rows(), spec.rows()]);
        nn_kernels::layer_norm_forward(spec, s[0], ws, bs, &mut y, &mut mean, &mut rstd)?;
        Ok(vec![
            Storage::Cpu(y),
            Storage::Cpu(mean),
            Storage::Cpu(rstd),
        ])
    })
}

/// The optional weight and bias slices after the input (`s[0]`).
fn affine_slices<'a>(s: &[&'a [f32]], w: bool, b: bool) -> (Option<&'a [f32]>, Option<&'a [f32]>) {
    let ws = w.then(|| s[1]);
    let bs = b.then(|| s[1 + usize::from(w)]);
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
    norm_backward(pool, op, spec, spec.cols(), io, w, want, ws, kernel)
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

/// A norm's backward on host slices: `params` elements each for the weight and bias gradients.
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
) -> Result<Vec<Storage>> {
    let has_w = w.is_some();
    let inputs = with_opt(vec![x, mean, rstd, dy], w);
    with_host_slices(pool, op, &inputs, |s| {
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
    })
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
    let inputs = with_opt(with_opt(vec![x], w), b);
    with_host_slices(pool, "batch_norm", &inputs, |s| {
        let (ws, bs) = affine_slices(s, w.is_some(), b.is_some());
        let c = spec.channels();
        let [mut y, mut mean, mut rstd] = host_vecs([s[0].len(), c, c]);
        let (mut rm, mut rv) = (running.0.write(), running.1.write());
        let (Storage::Cpu(rm), Storage::Cpu(rv)) = (&mut *rm, &mut *rv) else {
            return Err(no_kernel("batch_norm", pool));
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
    })
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
    norm_backward(pool, op, spec, spec.channels(), io, w, want, ws, kernel)
}

/// Attention: the output, then the per-row logsumexp.
pub(crate) fn attention_forward(
    pool: &MemoryPool,
    spec: &AttentionSpec,
    (q, k, v): (Dense<'_>, Dense<'_>, Dense<'_>),
    mask: Option<Dense<'_>>,
    ws: usize,
) -> Result<Vec<Storage>> {
    let op = "scaled_dot_product_attention";
    with_host_slices(pool, op, &with_opt(vec![q, k, v], mask), |s| {
        let [mut out, mut lse, mut ws] = host_vecs([numel(&spec.out_shape()), spec.lse_len(), ws]);
        let m = s.get(3).copied();
        nn_kernels::attention_forward(spec, s[0], s[1], s[2], m, &mut out, &mut lse, &mut ws)?;
        Ok(vec![Storage::Cpu(out), Storage::Cpu(lse)])
    })
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
    let op = "scaled_dot_product_attention backward";
    let inputs = with_opt(vec![q, k, v, out, lse, dy], mask);
    with_host_slices(pool, op, &inputs, |s| {
        let [mut dq, mut dk, mut dv, mut ws] = host_vecs([s[0].len(), s[1].len(), s[2].len(), ws]);
        let m = s.get(6).copied();
        nn_kernels::attention_backward(
            spec, s[0], s[1], s[2], m, s[3], s[4], s[5], &mut dq, &mut dk, &mut dv, &mut ws,
        )?;
        Ok(vec![Storage::Cpu(dq), Storage::Cpu(dk), Storage::Cpu(dv)])
    })
}
