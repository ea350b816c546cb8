//! 2-D convolution (`F.conv2d`): on the CPU the kernels of `cpu/conv.rs` (im2col and gemm per
//! sample and group), on CUDA im2col + one cuBLAS gemm per sample, col2im for the input gradient.
//! Keeps its dense inputs for backward.

use super::{Arg, Gpu, Host, LayerOp, Pass, Saved, computed, same_devices, want3, wanted3};
use crate::cpu::{self, CpuStorage};
use crate::cuda::{self, CudaStorage};
use crate::device::Device;
use crate::error::Result;
use crate::nn_kernels::{self, Conv2dSpec};
use crate::tensor::Tensor;
use crate::work::Kind;

struct Conv2d {
    spec: Conv2dSpec,
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
        same_devices("conv2d", self, &[Some(weight), bias])?;
        let spec = Conv2dSpec::new(
            self.shape(),
            weight.shape(),
            bias.map(Tensor::shape),
            stride,
            padding,
            dilation,
            groups,
        )?;
        let args = [
            Arg::Grad(Some(self)),
            Arg::Grad(Some(weight)),
            Arg::Grad(bias),
        ];
        super::apply(Conv2d { spec }, &args, &[])
    }
}

impl LayerOp for Conv2d {
    fn name(&self, pass: Pass<'_>) -> &'static str {
        match pass {
            Pass::Forward => "conv2d",
            Pass::Backward(_) => "conv2d backward",
        }
    }

    fn work(&self, pass: Pass<'_>) -> (Kind, u64) {
        let work = match pass {
            Pass::Forward => self.spec.work(),
            Pass::Backward(_) => self.spec.work().saturating_mul(2),
        };
        (Kind::MultiplyAdds, work)
    }

    fn workspace(&self, device: Device, _pass: Pass<'_>) -> Result<usize> {
        match device.is_host() {
            true => Ok(self.spec.workspace_elems()),
            false => cuda::conv2d_workspace(&self.spec),
        }
    }

    fn out_shapes(&self) -> Vec<Vec<usize>> {
        vec![self.spec.out_shape().to_vec()]
    }

    fn cpu_forward(&self, io: Host<'_>) -> Result<Vec<CpuStorage>> {
        let (x, w, b) = (*io.inputs.get(0)?, *io.inputs.get(1)?, io.inputs.opt(2));
        let len = self.spec.out_shape().iter().product();
        // Neither the output nor the workspace is zeroed first: the kernel writes every
        // element of the output and of each workspace slot before reading it.
        let out = cpu::try_build(len, |out| {
            cpu::with_scratch(io.workspace, |ws| {
                cpu::conv::conv2d_forward_uninit(&self.spec, x, w, b.copied(), out, ws)
            })
        })?;
        Ok(vec![out])
    }

    fn cuda_forward(&self, io: Gpu<'_>) -> Result<Vec<CudaStorage>> {
        let (x, w, b) = (io.inputs.get(0)?, io.inputs.get(1)?, io.inputs.opt(2));
        Ok(vec![io.dev.conv2d_forward(&self.spec, x, w, b, io.tf32)?])
    }

    fn backward_inputs<'t>(
        &self,
        saved: &'t Saved,
        _out: &'t Tensor,
        g: &'t Tensor,
    ) -> Vec<Option<&'t Tensor>> {
        vec![saved.input(0), saved.input(1), Some(g)]
    }

    fn cpu_backward(&self, io: Host<'_>, want: &[bool]) -> Result<Vec<CpuStorage>> {
        let (x, w, dy) = (*io.inputs.get(0)?, *io.inputs.get(1)?, *io.inputs.get(2)?);
        let lens = [x.len(), w.len(), self.spec.out_shape()[1]];
        let [mut dx, mut dw, mut db] = wanted3(want, lens);
        // The workspace is not zeroed: the kernel zeroes its partial gradients and writes each
        // slot before reading it.
        cpu::with_scratch(io.workspace, |ws| {
            nn_kernels::conv2d_backward(
                &self.spec,
                x,
                w,
                dy,
                dx.as_deref_mut(),
                dw.as_deref_mut(),
                db.as_deref_mut(),
                ws,
            )
        })?;
        Ok(computed([dx, dw, db]))
    }

    fn cuda_backward(&self, io: Gpu<'_>, want: &[bool]) -> Result<Vec<CudaStorage>> {
        let (x, w, dy) = (io.inputs.get(0)?, io.inputs.get(1)?, io.inputs.get(2)?);
        io.dev
            .conv2d_backward(&self.spec, x, w, dy, want3(want), io.tf32)
    }
}
