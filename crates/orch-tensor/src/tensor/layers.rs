//! Layer ops as differentiable tensor ops: `conv2d`, `max_pool2d`, `avg_pool2d`, `layer_norm`,
//! `batch_norm` and `scaled_dot_product_attention`, over the kernels of [`crate::nn_kernels`].
//!
//! Each op validates its spec from the shapes and arguments (bad ones are error values), then
//! reserves the kernel's workspace (`storage::nn::*_workspace`: `Spec::workspace_elems` on host
//! devices, the CUDA path's temporaries on a GPU) in the job's pool **before**
//! anything else is allocated, makes its inputs dense, reserves every output (through the one
//! shape check), runs the kernel and records an `Op` whose rule (autograd/rules.rs) calls the
//! fused backward kernel, which reserves its workspace and gradients the same way. Backward
//! kernels compute only the gradients of inputs that require grad.
//!
//! Saved state: conv2d and the norms keep their (dense) inputs, and the norms their per-row or
//! per-channel mean and rstd; max pooling keeps its argmax indices (u32 bits in f32 storage,
//! never read as numbers); attention keeps only its logsumexp (the output is the node itself).

use super::Tensor;
use super::elementwise::same_device;
use crate::autograd::{self, Op};
use crate::error::{Result, TensorError};
use crate::nn_kernels::{
    AttentionMask, AttentionSpec, BatchNormMode, BatchNormSpec, Conv2dSpec, LayerNormSpec,
    MaskKind, Pool2dSpec,
};
use crate::storage::nn::{self as kernels, Dense};
use crate::storage::{self, Buffer, Storage};
use crate::work::{self, Kind};
use std::sync::Arc;

fn dense(t: &Tensor) -> Dense<'_> {
    (t.buffer(), t.layout())
}

/// Every given tensor is on `x`'s device.
fn same_devices(op: &'static str, x: &Tensor, others: &[Option<&Tensor>]) -> Result<()> {
    others
        .iter()
        .flatten()
        .try_for_each(|t| same_device(op, x, t))
}

/// The dense form of an optional input.
fn dense_opt(t: Option<&Tensor>) -> Result<Option<Tensor>> {
    t.map(Tensor::contiguous).transpose()
}

/// Exactly `N` buffers from [`storage::alloc_many`].
fn take<const N: usize>(op: &'static str, bufs: Vec<Arc<Buffer>>) -> Result<[Arc<Buffer>; N]> {
    bufs.try_into().map_err(|_| TensorError::Internal {
        op,
        reason: format!("expected {N} outputs"),
    })
}

/// An optional parameter's shape must be `want` (its elements match the kernel's one per column
/// or channel).
fn check_param(op: &'static str, p: Option<&Tensor>, want: &[usize]) -> Result<()> {
    match p {
        Some(p) if p.shape() != want => Err(TensorError::ShapeMismatch {
            op,
            lhs: want.to_vec(),
            rhs: p.shape().to_vec(),
        }),
        _ => Ok(()),
    }
}

/// The gradients of the `targets` that require grad, in order: their shapes are reserved in
/// `pool`, then `make(want)` computes exactly those (`want[i]` for `targets[i]`).
fn layer_grads(
    pool: &Arc<crate::MemoryPool>,
    op: &'static str,
    targets: &[Option<&Tensor>],
    make: impl FnOnce(&[bool]) -> Result<Vec<Storage>>,
) -> Result<Vec<(Tensor, Tensor)>> {
    let want: Vec<bool> = targets
        .iter()
        .map(|t| t.is_some_and(Tensor::requires_grad))
        .collect();
    let chosen: Vec<&Tensor> = targets
        .iter()
        .flatten()
        .copied()
        .filter(|t| t.requires_grad())
        .collect();
    if chosen.is_empty() {
        return Ok(Vec::new());
    }
    let shapes: Vec<&[usize]> = chosen.iter().map(|t| t.shape()).collect();
    let bufs = storage::alloc_many(pool, op, &shapes, || make(&want))?;
    Ok(chosen
        .into_iter()
        .zip(bufs)
        .map(|(t, b)| (t.clone(), Tensor::dense(b, t.shape(), None)))
        .collect())
}

/// Element visits of a norm over `shape`, forward or backward: a few passes over the input.
fn norm_work(shape: &[usize]) -> u64 {
    work::product(shape).saturating_mul(4)
}

fn want3(want: &[bool]) -> [bool; 3] {
    [0, 1, 2].map(|i| want.get(i).copied().unwrap_or(false))
}

impl Tensor {
    /// 2-D convolution of NCHW `self` `[N, C, H, W]` by `weight` `[O, C/groups, kh, kw]`, plus
    /// `bias` `[O]`, with `stride` and `dilation` (at least 1), zero `padding` and `groups`
    /// (dividing `C` and `O`), as `torch.nn.functional.conv2d`: output `[N, O, OH, OW]`.
    /// Gradients to the input, the weight and the bias.
    pub fn conv2d(
        &self,
        weight: &Tensor,
        bias: Option<&Tensor>,
        stride: [usize; 2],
        padding: [usize; 2],
        dilation: [usize; 2],
        groups: usize,
    ) -> Result<Tensor> {
        const OP: &str = "conv2d";
        same_devices(OP, self, &[Some(weight), bias])?;
        let spec = Conv2dSpec::new(
            self.shape(),
            weight.shape(),
            bias.map(Tensor::shape),
            stride,
            padding,
            dilation,
            groups,
        )?;
        work::admit(OP, self.device(), Kind::MultiplyAdds, spec.work())?;
        let pool = self.pool();
        let ws = kernels::conv2d_workspace(pool, &spec)?;
        let _ws = storage::reserve_workspace(pool, ws)?;
        let (x, w, b) = (self.contiguous()?, weight.contiguous()?, dense_opt(bias)?);
        let shape = spec.out_shape();
        let [out] = take(
            OP,
            storage::alloc_many(pool, OP, &[&shape], || {
                kernels::conv2d_forward(
                    pool,
                    &spec,
                    (dense(&x), dense(&w)),
                    b.as_ref().map(dense),
                    ws,
                )
            })?,
        )?;
        let rec = autograd::record(&[&x, &w, b.as_ref().unwrap_or(&x)], || Op::Conv2d {
            x: x.clone(),
            weight: w.clone(),
            bias: b.clone(),
            spec: Box::new(spec.clone()),
        })?;
        Ok(Tensor::dense(out, &shape, rec))
    }

    /// Gradients of [`Tensor::conv2d`] for the inputs that require grad.
    pub(crate) fn conv2d_grads(
        g: &Tensor,
        (x, weight, bias): (&Tensor, &Tensor, Option<&Tensor>),
        spec: &Conv2dSpec,
    ) -> Result<Vec<(Tensor, Tensor)>> {
        const OP: &str = "conv2d backward";
        let pool = x.pool();
        let work = spec.work().saturating_mul(2);
        work::admit(OP, pool.device(), Kind::MultiplyAdds, work)?;
        let ws = kernels::conv2d_workspace(pool, spec)?;
        let _ws = storage::reserve_workspace(pool, ws)?;
        let g = g.contiguous()?;
        layer_grads(pool, OP, &[Some(x), Some(weight), bias], |want| {
            let io = (dense(x), dense(weight), dense(&g));
            kernels::conv2d_backward(pool, spec, io, want3(want), ws)
        })
    }

    /// 2-D max pooling of NCHW `self` over `kernel` windows moved by `stride`, with implicit
    /// `-inf` `padding` (at most half the kernel), as `F.max_pool2d` (`ceil_mode=False`): the
    /// first maximum of each window wins, NaN propagates. The gradient goes to each window's
    /// argmax (indices kept from forward).
    pub fn max_pool2d(
        &self,
        kernel: [usize; 2],
        stride: [usize; 2],
        padding: [usize; 2],
    ) -> Result<Tensor> {
        const OP: &str = "max_pool2d";
        let spec = Pool2dSpec::new(self.shape(), kernel, stride, padding)?;
        work::admit(OP, self.device(), Kind::Visits, spec.work())?;
        let pool = self.pool();
        let x = self.contiguous()?;
        let shape = spec.out_shape();
        let [out, indices] = take(
            OP,
            storage::alloc_many(pool, OP, &[&shape, &shape], || {
                kernels::max_pool2d_forward(pool, &spec, dense(&x))
            })?,
        )?;
        let indices = Tensor::dense(indices, &shape, None);
        let rec = autograd::record(&[&x], || Op::MaxPool2d {
            x: x.clone(),
            indices,
            spec: Box::new(spec.clone()),
        })?;
        Ok(Tensor::dense(out, &shape, rec))
    }

    /// 2-D average pooling, as [`Tensor::max_pool2d`] but each window's mean with the padding
    /// counted (`count_include_pad=True`: every window divides by `kh * kw`).
    pub fn avg_pool2d(
        &self,
        kernel: [usize; 2],
        stride: [usize; 2],
        padding: [usize; 2],
    ) -> Result<Tensor> {
        const OP: &str = "avg_pool2d";
        let spec = Pool2dSpec::new(self.shape(), kernel, stride, padding)?;
        work::admit(OP, self.device(), Kind::Visits, spec.work())?;
        let pool = self.pool();
        let x = self.contiguous()?;
        let shape = spec.out_shape();
        let [out] = take(
            OP,
            storage::alloc_many(pool, OP, &[&shape], || {
                kernels::avg_pool2d_forward(pool, &spec, dense(&x))
            })?,
        )?;
        let rec = autograd::record(&[&x], || Op::AvgPool2d {
            x: x.clone(),
            spec: Box::new(spec.clone()),
        })?;
        Ok(Tensor::dense(out, &shape, rec))
    }

    /// Gradient of max pooling (`indices` given) or average pooling (`None`) of `x`.
    pub(crate) fn pool2d_grads(
        g: &Tensor,
        x: &Tensor,
        indices: Option<&Tensor>,
        spec: &Pool2dSpec,
    ) -> Result<Vec<(Tensor, Tensor)>> {
        let pool = x.pool();
        work::admit("pool2d backward", pool.device(), Kind::Visits, spec.work())?;
        let g = g.contiguous()?;
        let len = x.numel();
        match indices {
            Some(idx) => {
                const OP: &str = "max_pool2d backward";
                // No workspace: every backend reads the indices' bits in place.
                layer_grads(pool, OP, &[Some(x)], |_| {
                    kernels::max_pool2d_backward(pool, spec, (dense(&g), dense(idx)), len)
                })
            }
            None => layer_grads(pool, "avg_pool2d backward", &[Some(x)], |_| {
                kernels::avg_pool2d_backward(pool, spec, dense(&g), len)
            }),
        }
    }

    /// Layer normalisation over the last `normalized_dims` dims (at least 1, at most the rank),
    /// as `F.layer_norm` with `normalized_shape` those dims: `(x - mean) / sqrt(var + eps) *
    /// weight + bias` per row, biased variance, `eps` finite and at least 0; `weight` and
    /// `bias` have the normalised shape. Fused forward and backward; gradients to the input,
    /// weight and bias.
    pub fn layer_norm(
        &self,
        normalized_dims: usize,
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        eps: f32,
    ) -> Result<Tensor> {
        const OP: &str = "layer_norm";
        same_devices(OP, self, &[weight, bias])?;
        let rank = self.rank();
        if normalized_dims == 0 || normalized_dims > rank {
            return Err(TensorError::InvalidArgument {
                op: OP,
                reason: format!(
                    "normalized_dims = {normalized_dims} must be in 1..={rank} (the input's rank)"
                ),
            });
        }
        let normalized = &self.shape()[rank - normalized_dims..];
        let spec = LayerNormSpec::new(self.shape(), normalized, eps)?;
        work::admit(OP, self.device(), Kind::Visits, norm_work(self.shape()))?;
        check_param(OP, weight, normalized)?;
        check_param(OP, bias, normalized)?;
        let pool = self.pool();
        let (x, w, b) = (self.contiguous()?, dense_opt(weight)?, dense_opt(bias)?);
        let shape = x.shape().to_vec();
        let rows = [spec.rows()];
        let [out, mean, rstd] = take(
            OP,
            storage::alloc_many(pool, OP, &[&shape, &rows, &rows], || {
                let wb = (w.as_ref().map(dense), b.as_ref().map(dense));
                kernels::layer_norm_forward(pool, &spec, dense(&x), wb)
            })?,
        )?;
        let (mean, rstd) = (
            Tensor::dense(mean, &rows, None),
            Tensor::dense(rstd, &rows, None),
        );
        let mut inputs = vec![&x];
        inputs.extend(w.as_ref());
        inputs.extend(b.as_ref());
        let rec = autograd::record(&inputs, || Op::LayerNorm {
            x: x.clone(),
            weight: w.clone(),
            bias: b.clone(),
            mean,
            rstd,
            spec: Box::new(spec.clone()),
        })?;
        Ok(Tensor::dense(out, &shape, rec))
    }

    /// Gradients of [`Tensor::layer_norm`] for the inputs that require grad.
    pub(crate) fn layer_norm_grads(
        g: &Tensor,
        (x, weight, bias): (&Tensor, Option<&Tensor>, Option<&Tensor>),
        (mean, rstd): (&Tensor, &Tensor),
        spec: &LayerNormSpec,
    ) -> Result<Vec<(Tensor, Tensor)>> {
        const OP: &str = "layer_norm backward";
        let pool = x.pool();
        work::admit(OP, pool.device(), Kind::Visits, norm_work(x.shape()))?;
        let ws = kernels::layer_norm_workspace(pool, spec);
        let _ws = storage::reserve_workspace(pool, ws)?;
        let g = g.contiguous()?;
        layer_grads(pool, OP, &[Some(x), weight, bias], |want| {
            let io = (dense(x), dense(mean), dense(rstd), dense(&g));
            kernels::layer_norm_backward(pool, spec, io, weight.map(dense), want3(want), ws)
        })
    }

    /// Batch normalisation of `self` `[N, C, *]` per channel, as `F.batch_norm`. Training:
    /// the batch's mean and biased variance normalise, and `running_mean` / `running_var`
    /// (`[C]`) are updated **in place**, outside autograd (buffers, not parameters):
    /// `running = (1 - momentum) * running + momentum * stat` with the unbiased variance;
    /// a zero-size batch leaves them as they were. Eval: the running statistics normalise and
    /// are not changed. `weight` and `bias` are `[C]`; gradients to the input, weight and bias
    /// (through the batch statistics in training).
    #[allow(clippy::too_many_arguments)]
    pub fn batch_norm(
        &self,
        running_mean: &Tensor,
        running_var: &Tensor,
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        training: bool,
        momentum: f32,
        eps: f32,
    ) -> Result<Tensor> {
        const OP: &str = "batch_norm";
        let stats = [Some(running_mean), Some(running_var)];
        same_devices(OP, self, &[stats[0], stats[1], weight, bias])?;
        let mode = match training {
            true => BatchNormMode::Train,
            false => BatchNormMode::Eval,
        };
        let spec = BatchNormSpec::new(self.shape(), mode, momentum, eps)?;
        work::admit(OP, self.device(), Kind::Visits, norm_work(self.shape()))?;
        let channels = [spec.channels()];
        for p in [stats[0], stats[1], weight, bias] {
            check_param(OP, p, &channels)?;
        }
        let pool = self.pool();
        let (x, w, b) = (self.contiguous()?, dense_opt(weight)?, dense_opt(bias)?);
        // Fresh dense copies of the running statistics: the kernel updates them while it reads
        // the inputs (no lock can alias), and they go back with `assign` (any layout).
        let copy = |t: &Tensor| -> Result<Tensor> {
            let buffer = storage::alloc(pool, OP, t.shape(), || {
                storage::gather(pool, &t.buffer().read(), t.layout())
            })?;
            Ok(Tensor::dense(buffer, t.shape(), None))
        };
        let (rm, rv) = (copy(running_mean)?, copy(running_var)?);
        let shape = x.shape().to_vec();
        let [out, mean, rstd] = take(
            OP,
            storage::alloc_many(pool, OP, &[&shape, &channels, &channels], || {
                let wb = (w.as_ref().map(dense), b.as_ref().map(dense));
                kernels::batch_norm_forward(pool, &spec, dense(&x), wb, (rm.buffer(), rv.buffer()))
            })?,
        )?;
        if training {
            running_mean.assign(&rm)?;
            running_var.assign(&rv)?;
        }
        let (mean, rstd) = (
            Tensor::dense(mean, &channels, None),
            Tensor::dense(rstd, &channels, None),
        );
        let mut inputs = vec![&x];
        inputs.extend(w.as_ref());
        inputs.extend(b.as_ref());
        let rec = autograd::record(&inputs, || Op::BatchNorm {
            x: x.clone(),
            weight: w.clone(),
            bias: b.clone(),
            mean,
            rstd,
            spec: Box::new(spec.clone()),
        })?;
        Ok(Tensor::dense(out, &shape, rec))
    }

    /// Gradients of [`Tensor::batch_norm`] for the inputs that require grad.
    pub(crate) fn batch_norm_grads(
        g: &Tensor,
        (x, weight, bias): (&Tensor, Option<&Tensor>, Option<&Tensor>),
        (mean, rstd): (&Tensor, &Tensor),
        spec: &BatchNormSpec,
    ) -> Result<Vec<(Tensor, Tensor)>> {
        const OP: &str = "batch_norm backward";
        let pool = x.pool();
        work::admit(OP, pool.device(), Kind::Visits, norm_work(x.shape()))?;
        let ws = kernels::batch_norm_workspace(pool, spec);
        let _ws = storage::reserve_workspace(pool, ws)?;
        let g = g.contiguous()?;
        layer_grads(pool, OP, &[Some(x), weight, bias], |want| {
            let io = (dense(x), dense(mean), dense(rstd), dense(&g));
            kernels::batch_norm_backward(pool, spec, io, weight.map(dense), want3(want), ws)
        })
    }

    /// Fused scaled-dot-product attention, as `F.scaled_dot_product_attention`: `q`
    /// `[B, H, T, D]`, `k` `[B, H, S, D]`, `v` `[B, H, S, Dv]`, output `[B, H, T, Dv]` =
    /// `softmax(q k^T * scale + mask) v` with `scale` (finite) or `1/sqrt(D)`; `causal` lets
    /// query `i` see keys `j <= i` (top-left aligned, combinable with a mask). `mask` is
    /// **additive** (`-inf` masks out), broadcastable to `[B, H, T, S]` (e.g. `[T, S]`), and
    /// gets no gradient (it is not differentiated even when it requires grad). A row that sees
    /// no key gives zeros and passes no gradient. Only the logsumexp per row is kept for
    /// backward (with the output); the score matrix is never stored.
    pub fn scaled_dot_product_attention(
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        causal: bool,
        mask: Option<&Tensor>,
        scale: Option<f32>,
    ) -> Result<Tensor> {
        const OP: &str = "scaled_dot_product_attention";
        same_devices(OP, q, &[Some(k), Some(v), mask])?;
        let m = mask.map(|m| AttentionMask {
            kind: MaskKind::Additive,
            shape: m.shape(),
        });
        let spec = AttentionSpec::new(q.shape(), k.shape(), v.shape(), causal, m, scale)?;
        work::admit(OP, q.device(), Kind::MultiplyAdds, spec.work())?;
        let pool = q.pool();
        let ws = kernels::attention_workspace(pool, &spec, false)?;
        let _ws = storage::reserve_workspace(pool, ws)?;
        let (qd, kd, vd) = (q.contiguous()?, k.contiguous()?, v.contiguous()?);
        let md = autograd::no_grad(|| dense_opt(mask))?.map(|m| m.detach());
        let shape = spec.out_shape();
        let lse_shape = [shape[0], shape[1], shape[2]];
        let [out, lse] = take(
            OP,
            storage::alloc_many(pool, OP, &[&shape, &lse_shape], || {
                let qkv = (dense(&qd), dense(&kd), dense(&vd));
                kernels::attention_forward(pool, &spec, qkv, md.as_ref().map(dense), ws)
            })?,
        )?;
        let lse = Tensor::dense(lse, &lse_shape, None);
        let rec = autograd::record(&[&qd, &kd, &vd], || Op::Attention {
            q: qd.clone(),
            k: kd.clone(),
            v: vd.clone(),
            mask: md.clone(),
            lse,
            spec: Box::new(spec.clone()),
        })?;
        Ok(Tensor::dense(out, &shape, rec))
    }

    /// Gradients of [`Tensor::scaled_dot_product_attention`] (output `out`, this node) for
    /// the inputs that require grad. The kernel computes all three; the ones not wanted are
    /// counted as workspace.
    pub(crate) fn attention_grads(
        g: &Tensor,
        out: &Tensor,
        (q, k, v, mask): (&Tensor, &Tensor, &Tensor, Option<&Tensor>),
        lse: &Tensor,
        spec: &AttentionSpec,
    ) -> Result<Vec<(Tensor, Tensor)>> {
        const OP: &str = "scaled_dot_product_attention backward";
        let pool = q.pool();
        let work = spec.work().saturating_mul(2);
        work::admit(OP, pool.device(), Kind::MultiplyAdds, work)?;
        let ws = kernels::attention_workspace(pool, spec, true)?;
        let unwanted: usize = [q, k, v]
            .iter()
            .filter(|t| !t.requires_grad())
            .map(|t| t.numel())
            .sum();
        let _ws = storage::reserve_workspace(pool, ws.saturating_add(unwanted))?;
        let (g, out) = (g.contiguous()?, out.contiguous()?);
        layer_grads(pool, OP, &[Some(q), Some(k), Some(v)], |want| {
            let all = kernels::attention_backward(
                pool,
                spec,
                (dense(q), dense(k), dense(v)),
                (dense(&out), dense(lse), dense(&g)),
                mask.map(dense),
                ws,
            )?;
            Ok(all
                .into_iter()
                .zip(want)
                .filter_map(|(s, &w)| w.then_some(s))
                .collect())
        })
    }
}
