//! Fused scaled-dot-product attention (`F.scaled_dot_product_attention`): on the CPU the
//! blocked kernels of `cpu/attention.rs` (the score matrix never stored), on CUDA batched
//! cuBLAS products and a masked row softmax. Keeps its dense inputs (the mask undifferentiated)
//! and the logsumexp of each row; the output is the node itself.

use super::{Arg, Gpu, Host, LayerOp, Pass, Saved, same_devices};
use crate::cpu::CpuStorage;
use crate::cuda::{self, CudaStorage};
use crate::device::Device;
use crate::error::Result;
use crate::nn_kernels::{self, AttentionMask, AttentionSpec, MaskKind};
use crate::tensor::Tensor;
use crate::work::Kind;

struct Attention {
    spec: AttentionSpec,
}

impl Tensor {
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
        same_devices("scaled_dot_product_attention", q, &[Some(k), Some(v), mask])?;
        let m = mask.map(|m| AttentionMask {
            kind: MaskKind::Additive,
            shape: m.shape(),
        });
        let spec = AttentionSpec::new(q.shape(), k.shape(), v.shape(), causal, m, scale)?;
        let args = [
            Arg::Grad(Some(q)),
            Arg::Grad(Some(k)),
            Arg::Grad(Some(v)),
            Arg::Const(mask),
        ];
        super::apply(Attention { spec }, &args, &[])
    }
}

impl LayerOp for Attention {
    fn name(&self, pass: Pass<'_>) -> &'static str {
        match pass {
            Pass::Forward => "scaled_dot_product_attention",
            Pass::Backward(_) => "scaled_dot_product_attention backward",
        }
    }

    fn work(&self, pass: Pass<'_>) -> (Kind, u64) {
        let work = match pass {
            Pass::Forward => self.spec.work(),
            Pass::Backward(_) => self.spec.work().saturating_mul(2),
        };
        (Kind::MultiplyAdds, work)
    }

    /// The kernels' slots on host devices, the score matrices on CUDA; in backward also the
    /// gradients not wanted, which the kernels compute all the same.
    fn workspace(&self, device: Device, pass: Pass<'_>) -> Result<usize> {
        let s = &self.spec;
        let ws = match device.is_host() {
            true => s.workspace_elems(),
            false => cuda::attention_workspace(s, matches!(pass, Pass::Backward(_)))?,
        };
        let Pass::Backward(want) = pass else {
            return Ok(ws);
        };
        let lens = [
            s.b * s.h * s.t * s.d,
            s.b * s.h * s.s * s.d,
            s.b * s.h * s.s * s.dv,
        ];
        let unwanted: usize = lens
            .iter()
            .enumerate()
            .filter(|(i, _)| !want.get(*i).copied().unwrap_or(false))
            .map(|(_, n)| n)
            .sum();
        Ok(ws.saturating_add(unwanted))
    }

    /// The output, then the logsumexp of each row.
    fn out_shapes(&self) -> Vec<Vec<usize>> {
        let shape = self.spec.out_shape();
        vec![shape.to_vec(), shape[..3].to_vec()]
    }

    fn cpu_forward(&self, io: Host<'_>) -> Result<Vec<CpuStorage>> {
        let i = &io.inputs;
        let (q, k, v, mask) = (*i.get(0)?, *i.get(1)?, *i.get(2)?, i.opt(3).copied());
        let s = &self.spec;
        let len = s.out_shape().iter().product();
        let (mut out, mut lse) = (vec![0.0; len], vec![0.0; s.lse_len()]);
        let mut ws = vec![0.0; io.workspace];
        nn_kernels::attention_forward(s, q, k, v, mask, &mut out, &mut lse, &mut ws)?;
        Ok(vec![out, lse])
    }

    fn cuda_forward(&self, io: Gpu<'_>) -> Result<Vec<CudaStorage>> {
        let i = &io.inputs;
        let qkv = (i.get(0)?, i.get(1)?, i.get(2)?);
        Ok(io
            .dev
            .attention_forward(&self.spec, qkv, i.opt(3), io.tf32)?
            .into())
    }

    /// (q, k, v, out, lse, dy, mask).
    fn backward_inputs<'t>(
        &self,
        saved: &'t Saved,
        out: &'t Tensor,
        g: &'t Tensor,
    ) -> Vec<Option<&'t Tensor>> {
        let (q, k, v) = (saved.input(0), saved.input(1), saved.input(2));
        vec![q, k, v, Some(out), saved.kept(0), Some(g), saved.input(3)]
    }

    /// The kernel computes all three gradients; the ones not wanted were counted as workspace.
    fn cpu_backward(&self, io: Host<'_>, want: &[bool]) -> Result<Vec<CpuStorage>> {
        let i = &io.inputs;
        let (q, k, v) = (*i.get(0)?, *i.get(1)?, *i.get(2)?);
        let (out, lse, dy) = (*i.get(3)?, *i.get(4)?, *i.get(5)?);
        let (mut dq, mut dk, mut dv) = (vec![0.0; q.len()], vec![0.0; k.len()], vec![0.0; v.len()]);
        // The kernel's slots: the reservation also covers the gradients not wanted.
        let mut ws = vec![0.0; self.spec.workspace_elems()];
        nn_kernels::attention_backward(
            &self.spec,
            q,
            k,
            v,
            i.opt(6).copied(),
            out,
            lse,
            dy,
            &mut dq,
            &mut dk,
            &mut dv,
            &mut ws,
        )?;
        Ok(only_wanted([dq, dk, dv], want))
    }

    fn cuda_backward(&self, io: Gpu<'_>, want: &[bool]) -> Result<Vec<CudaStorage>> {
        let i = &io.inputs;
        let qkv = (i.get(0)?, i.get(1)?, i.get(2)?);
        let saved = (i.get(3)?, i.get(4)?, i.get(5)?);
        let all = io
            .dev
            .attention_backward(&self.spec, qkv, saved, i.opt(6), io.tf32)?;
        Ok(only_wanted(all, want))
    }
}

fn only_wanted<T>(all: [T; 3], want: &[bool]) -> Vec<T> {
    all.into_iter()
        .zip(want)
        .filter_map(|(g, &w)| w.then_some(g))
        .collect()
}
