//! 2-D max and average pooling (`F.max_pool2d`, `F.avg_pool2d`), both on [`Pool2dSpec`]: on the
//! CPU the kernels of `cpu/pool.rs`, on CUDA one thread per element. Max pooling keeps its
//! argmax indices (u32 bits in f32 storage, never read as numbers) and its input; average
//! pooling its input.

use super::{Arg, Gpu, Host, LayerOp, Pass, Saved};
use crate::cpu::{self, CpuStorage};
use crate::cuda::CudaStorage;
use crate::error::{Result, TensorError};
use crate::nn_kernels::{self, Pool2dSpec};
use crate::tensor::Tensor;
use crate::work::Kind;

struct MaxPool2d {
    spec: Pool2dSpec,
}

struct AvgPool2d {
    spec: Pool2dSpec,
}

/// Elements of the pooled input (its shape was a tensor's: no overflow).
fn input_len(s: &Pool2dSpec) -> usize {
    s.n * s.c * s.h * s.w
}

/// Element visits of either pass: each window's.
fn pool_work(s: &Pool2dSpec) -> (Kind, u64) {
    (Kind::Visits, s.work())
}

impl Tensor {
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
        let spec = Pool2dSpec::new(self.shape(), kernel, stride, padding)?;
        super::apply(MaxPool2d { spec }, &[Arg::Grad(Some(self))], &[])
    }

    /// 2-D average pooling, as [`Tensor::max_pool2d`] but each window's mean with the padding
    /// counted (`count_include_pad=True`: every window divides by `kh * kw`).
    pub fn avg_pool2d(
        &self,
        kernel: [usize; 2],
        stride: [usize; 2],
        padding: [usize; 2],
    ) -> Result<Tensor> {
        let spec = Pool2dSpec::new(self.shape(), kernel, stride, padding)?;
        super::apply(AvgPool2d { spec }, &[Arg::Grad(Some(self))], &[])
    }
}

impl LayerOp for MaxPool2d {
    fn name(&self, pass: Pass<'_>) -> &'static str {
        match pass {
            Pass::Forward => "max_pool2d",
            Pass::Backward(_) => "max_pool2d backward",
        }
    }

    fn work(&self, _pass: Pass<'_>) -> (Kind, u64) {
        pool_work(&self.spec)
    }

    /// The output, then the indices.
    fn out_shapes(&self) -> Vec<Vec<usize>> {
        let shape = self.spec.out_shape().to_vec();
        vec![shape.clone(), shape]
    }

    fn cpu_forward(&self, io: Host<'_>) -> Result<Vec<CpuStorage>> {
        let x = *io.inputs.get(0)?;
        // Written by the kernel without zeroing first; the indices straight into f32 storage
        // as their bits.
        let n = self.spec.out_numel();
        let mut out = Vec::new();
        let bits = cpu::try_build(n, |bits| {
            out = cpu::try_build(n, |o| {
                cpu::pool::max_pool2d_forward_uninit(&self.spec, x, o, cpu::uninit_bits(bits))
            })?;
            Ok::<_, TensorError>(())
        })?;
        Ok(vec![out, bits])
    }

    fn cuda_forward(&self, io: Gpu<'_>) -> Result<Vec<CudaStorage>> {
        Ok(io
            .dev
            .max_pool2d_forward(&self.spec, io.inputs.get(0)?)?
            .into())
    }

    fn backward_inputs<'t>(
        &self,
        saved: &'t Saved,
        _out: &'t Tensor,
        g: &'t Tensor,
    ) -> Vec<Option<&'t Tensor>> {
        vec![Some(g), saved.kept(0)]
    }

    /// No workspace: every backend reads the indices' bits in place.
    fn cpu_backward(&self, io: Host<'_>, _want: &[bool]) -> Result<Vec<CpuStorage>> {
        let (dy, indices) = (*io.inputs.get(0)?, *io.inputs.get(1)?);
        // `dx` zeroed by the kernel plane by plane.
        let idx = cpu::bits_as_u32(indices);
        let dx = cpu::try_build(input_len(&self.spec), |dx| {
            cpu::pool::max_pool2d_backward_uninit(&self.spec, dy, idx, dx)
        })?;
        Ok(vec![dx])
    }

    fn cuda_backward(&self, io: Gpu<'_>, _want: &[bool]) -> Result<Vec<CudaStorage>> {
        let (dy, indices) = (io.inputs.get(0)?, io.inputs.get(1)?);
        let len = input_len(&self.spec);
        Ok(vec![io.dev.pool2d_backward(
            &self.spec,
            dy,
            Some(indices),
            len,
        )?])
    }
}

impl LayerOp for AvgPool2d {
    fn name(&self, pass: Pass<'_>) -> &'static str {
        match pass {
            Pass::Forward => "avg_pool2d",
            Pass::Backward(_) => "avg_pool2d backward",
        }
    }

    fn work(&self, _pass: Pass<'_>) -> (Kind, u64) {
        pool_work(&self.spec)
    }

    fn out_shapes(&self) -> Vec<Vec<usize>> {
        vec![self.spec.out_shape().to_vec()]
    }

    fn cpu_forward(&self, io: Host<'_>) -> Result<Vec<CpuStorage>> {
        let mut out = vec![0.0; self.spec.out_numel()];
        nn_kernels::avg_pool2d_forward(&self.spec, io.inputs.get(0)?, &mut out)?;
        Ok(vec![out])
    }

    fn cuda_forward(&self, io: Gpu<'_>) -> Result<Vec<CudaStorage>> {
        Ok(vec![
            io.dev.avg_pool2d_forward(&self.spec, io.inputs.get(0)?)?,
        ])
    }

    fn backward_inputs<'t>(
        &self,
        _saved: &'t Saved,
        _out: &'t Tensor,
        g: &'t Tensor,
    ) -> Vec<Option<&'t Tensor>> {
        vec![Some(g)]
    }

    fn cpu_backward(&self, io: Host<'_>, _want: &[bool]) -> Result<Vec<CpuStorage>> {
        let mut dx = vec![0.0; input_len(&self.spec)];
        nn_kernels::avg_pool2d_backward(&self.spec, io.inputs.get(0)?, &mut dx)?;
        Ok(vec![dx])
    }

    fn cuda_backward(&self, io: Gpu<'_>, _want: &[bool]) -> Result<Vec<CudaStorage>> {
        let len = input_len(&self.spec);
        Ok(vec![io.dev.pool2d_backward(
            &self.spec,
            io.inputs.get(0)?,
            None,
            len,
        )?])
    }
}
