//! Batch normalisation (`F.batch_norm`), training (batch statistics, running statistics
//! updated) or eval (running statistics): on the CPU the kernels of `cpu/norm.rs`, on CUDA one
//! block per channel for the sums and one thread per element to apply them. Keeps its dense
//! inputs and the per-channel mean and rstd it used.

use super::wanted3;
use super::{Arg, Gpu, Host, LayerOp, Pass, Saved, check_param, computed, same_devices, want3};
use crate::cpu::CpuStorage;
use crate::cuda::{self, CudaStorage};
use crate::device::Device;
use crate::error::{Result, TensorError};
use crate::nn_kernels::{self, BatchNormMode, BatchNormSpec, RunningStats};
use crate::tensor::Tensor;
use crate::work::{self, Kind};

struct BatchNorm {
    spec: BatchNormSpec,
}

impl Tensor {
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
        let channels = [spec.channels()];
        for p in [stats[0], stats[1], weight, bias] {
            check_param(OP, p, &channels)?;
        }
        let args = [Arg::Grad(Some(self)), Arg::Grad(weight), Arg::Grad(bias)];
        super::apply(BatchNorm { spec }, &args, &[running_mean, running_var])
    }
}

fn internal(reason: &str) -> TensorError {
    TensorError::Internal {
        op: "batch_norm",
        reason: reason.into(),
    }
}

impl LayerOp for BatchNorm {
    fn name(&self, pass: Pass<'_>) -> &'static str {
        match pass {
            Pass::Forward => "batch_norm",
            Pass::Backward(_) => "batch_norm backward",
        }
    }

    /// A few passes over the input, forward or backward.
    fn work(&self, _pass: Pass<'_>) -> (Kind, u64) {
        let visits = work::product(self.spec.out_shape()).saturating_mul(4);
        (Kind::Visits, visits)
    }

    /// Backward's per-channel sums; none in forward.
    fn workspace(&self, device: Device, pass: Pass<'_>) -> Result<usize> {
        Ok(match (pass, device.is_host()) {
            (Pass::Forward, _) => 0,
            (Pass::Backward(_), true) => self.spec.workspace_elems(),
            (Pass::Backward(_), false) => cuda::batch_norm_workspace(&self.spec),
        })
    }

    /// The output, then the per-channel mean and rstd used.
    fn out_shapes(&self) -> Vec<Vec<usize>> {
        let channels = vec![self.spec.channels()];
        vec![self.spec.out_shape().to_vec(), channels.clone(), channels]
    }

    /// The running statistics (the state) are updated in training only.
    fn writes_state(&self) -> bool {
        self.spec.mode == BatchNormMode::Train
    }

    /// Reads (eval) or updates (training) the running mean and variance in place.
    fn cpu_forward(&self, io: Host<'_>) -> Result<Vec<CpuStorage>> {
        let x = *io.inputs.get(0)?;
        let (w, b) = (io.inputs.opt(1).copied(), io.inputs.opt(2).copied());
        let c = self.spec.channels();
        let (mut y, mut mean, mut rstd) = (vec![0.0; x.len()], vec![0.0; c], vec![0.0; c]);
        let [rm, rv]: [&mut [f32]; 2] = io
            .state
            .try_into()
            .map_err(|_| internal("the running statistics are missing"))?;
        let stats = RunningStats { mean: rm, var: rv };
        nn_kernels::batch_norm_forward(
            &self.spec,
            x,
            w,
            b,
            Some(stats),
            &mut y,
            &mut mean,
            &mut rstd,
        )?;
        Ok(vec![y, mean, rstd])
    }

    fn cuda_forward(&self, io: Gpu<'_>) -> Result<Vec<CudaStorage>> {
        let (x, w, b) = (io.inputs.get(0)?, io.inputs.opt(1), io.inputs.opt(2));
        let [rm, rv]: [&mut CudaStorage; 2] = io
            .state
            .try_into()
            .map_err(|_| internal("the running statistics are missing"))?;
        Ok(io
            .dev
            .batch_norm_forward(&self.spec, x, (w, b), (rm, rv))?
            .into())
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
        let c = self.spec.channels();
        let [mut dx, mut dw, mut db] = wanted3(want, [x.len(), c, c]);
        let mut ws = vec![0.0; io.workspace];
        nn_kernels::batch_norm_backward(
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
            .batch_norm_backward(&self.spec, xs, i.opt(4), want3(want))
    }
}
