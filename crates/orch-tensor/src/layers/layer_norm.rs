//! Layer normalisation (`F.layer_norm`): fused forward and backward, on the CPU the kernels of
//! `cpu/norm.rs`, on CUDA one block per row. Keeps its dense inputs and each row's mean and rstd.

use super::wanted3;
use super::{Arg, Gpu, Host, LayerOp, Pass, Saved, check_param, computed, same_devices, want3};
use crate::cpu::CpuStorage;
use crate::cuda::CudaStorage;
use crate::device::Device;
use crate::error::{Result, TensorError};
use crate::nn_kernels::{self, LayerNormSpec};
use crate::tensor::Tensor;
use crate::work::{self, Kind};

struct LayerNorm {
    spec: LayerNormSpec,
}

impl Tensor {
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
        check_param(OP, weight, normalized)?;
        check_param(OP, bias, normalized)?;
        let args = [Arg::Grad(Some(self)), Arg::Grad(weight), Arg::Grad(bias)];
        super::apply(LayerNorm { spec }, &args, &[])
    }
}

impl LayerOp for LayerNorm {
    fn name(&self, pass: Pass<'_>) -> &'static str {
        match pass {
            Pass::Forward => "layer_norm",
            Pass::Backward(_) => "layer_norm backward",
        }
    }

    /// A few passes over the input, forward or backward.
    fn work(&self, _pass: Pass<'_>) -> (Kind, u64) {
        let visits = work::product(self.spec.out_shape()).saturating_mul(4);
        (Kind::Visits, visits)
    }

    /// Backward's per-group partial sums on host devices; none on CUDA or in forward.
    fn workspace(&self, device: Device, pass: Pass<'_>) -> Result<usize> {
        Ok(match pass {
            Pass::Backward(_) if device.is_host() => self.spec.workspace_elems(),
            _ => 0,
        })
    }

    /// The output, then each row's mean and rstd.
    fn out_shapes(&self) -> Vec<Vec<usize>> {
        let rows = vec![self.spec.rows()];
        vec![self.spec.out_shape().to_vec(), rows.clone(), rows]
    }

    fn cpu_forward(&self, io: Host<'_>) -> Result<Vec<CpuStorage>> {
        let x = *io.inputs.get(0)?;
        let (w, b) = (io.inputs.opt(1).copied(), io.inputs.opt(2).copied());
        let rows = self.spec.rows();
        let (mut y, mut mean, mut rstd) = (vec![0.0; x.len()], vec![0.0; rows], vec![0.0; rows]);
        nn_kernels::layer_norm_forward(&self.spec, x, w, b, &mut y, &mut mean, &mut rstd)?;
        Ok(vec![y, mean, rstd])
    }

    fn cuda_forward(&self, io: Gpu<'_>) -> Result<Vec<CudaStorage>> {
        let (x, w, b) = (io.inputs.get(0)?, io.inputs.opt(1), io.inputs.opt(2));
        Ok(io.dev.layer_norm_forward(&self.spec, x, w, b)?.into())
    }

    /// (x, mean, rstd, dy, weight).
    fn backward_inputs<'t>(
        &self,
        saved: &'t Saved,
        _out: &'t Tensor,
        g: &'t Tensor,
    ) -> Vec<Option<&'t Tensor>> {
        let (x, w) = (saved.input(0), saved.input(1));
        vec![x, saved.kept(0), saved.kept(1), Some(g), w]
    }

    fn cpu_backward(&self, io: Host<'_>, want: &[bool]) -> Result<Vec<CpuStorage>> {
        let i = &io.inputs;
        let (x, mean, rstd, dy) = (*i.get(0)?, *i.get(1)?, *i.get(2)?, *i.get(3)?);
        let cols = self.spec.cols();
        let [mut dx, mut dw, mut db] = wanted3(want, [x.len(), cols, cols]);
        let mut ws = vec![0.0; io.workspace];
        nn_kernels::layer_norm_backward(
            &self.spec,
            x,
            i.opt(4).copied(),
            mean,
            rstd,
            dy,
            dx.as_deref_mut(),
            dw.as_deref_mut(),
            db.as_deref_mut(),
            &mut ws,
        )?;
        Ok(computed([dx, dw, db]))
    }

    fn cuda_backward(&self, io: Gpu<'_>, want: &[bool]) -> Result<Vec<CudaStorage>> {
        let i = &io.inputs;
        let xs = (i.get(0)?, i.get(1)?, i.get(2)?, i.get(3)?);
        io.dev
            .layer_norm_backward(&self.spec, xs, i.opt(4), want3(want))
    }
}
