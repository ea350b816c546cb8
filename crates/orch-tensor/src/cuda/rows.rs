//! Kernel launches for row-wise work: reductions, argmax, softmax, cross-entropy, and the fused
//! optimizer updates. Inputs are dense ranges of device buffers.

use super::ops::{grid_for, rows_config};
use super::{CudaDevice, CudaStorage};
use crate::error::Result;
use crate::ops::{ReduceOp, UpdateOp};
use cudarc::driver::PushKernelArg;
use std::ops::Range;

impl CudaDevice {
    /// Reduces dense `[outer, n, inner]` over the middle axis.
    pub(crate) fn reduce(
        &self,
        op: ReduceOp,
        x: &CudaStorage,
        range: Range<usize>,
        outer: usize,
        n: usize,
        inner: usize,
    ) -> Result<CudaStorage> {
        let (o, k, i) = (
            self.count("reduce", outer)?,
            self.count("reduce", n)?,
            self.count("reduce", inner)?,
        );
        self.count("reduce", outer * inner)?;
        let mut y = self.alloc("reduce", outer * inner)?;
        if outer * inner == 0 {
            return Ok(y);
        }
        let x = x.slice(range);
        let name = match (op, inner) {
            (ReduceOp::Sum, 1) => "reduce_sum_rows",
            (ReduceOp::Max, 1) => "reduce_max_rows",
            (ReduceOp::Sum, _) => "reduce_sum_cols",
            (ReduceOp::Max, _) => "reduce_max_cols",
        };
        let mut launch = self.stream.launch_builder(self.kernel(name)?);
        launch.arg(&x).arg(&mut y);
        let cfg = if inner == 1 {
            launch.arg(&o).arg(&k);
            rows_config(o, k)
        } else {
            launch.arg(&o).arg(&k).arg(&i);
            grid_for(o * i)
        };
        // SAFETY: `x` holds outer*n*inner floats, `y` outer*inner.
        unsafe { launch.launch(cfg) }.map_err(|e| self.error(name, e))?;
        Ok(y)
    }

    pub(crate) fn argmax(
        &self,
        x: &CudaStorage,
        range: Range<usize>,
        outer: usize,
        n: usize,
        inner: usize,
    ) -> Result<CudaStorage> {
        let (o, k, i) = (
            self.count("argmax", outer)?,
            self.count("argmax", n)?,
            self.count("argmax", inner)?,
        );
        let mut y = self.alloc("argmax", outer * inner)?;
        if outer * inner == 0 {
            return Ok(y);
        }
        let x = x.slice(range);
        let mut launch = self.stream.launch_builder(self.kernel("argmax_cols")?);
        launch.arg(&x).arg(&mut y).arg(&o).arg(&k).arg(&i);
        // SAFETY: as for `reduce`.
        unsafe { launch.launch(grid_for(o * i)) }.map_err(|e| self.error("argmax", e))?;
        Ok(y)
    }

    /// Softmax or log-softmax of each dense row of length `n`.
    pub(crate) fn softmax_last(
        &self,
        x: &CudaStorage,
        range: Range<usize>,
        n: usize,
        log: bool,
    ) -> Result<CudaStorage> {
        let total = range.len();
        let mut y = self.alloc("softmax", total)?;
        if total == 0 || n == 0 {
            return Ok(y);
        }
        let (rows, k) = (self.count("softmax", total / n)?, self.count("softmax", n)?);
        let log_mode = i32::from(log);
        let x = x.slice(range);
        let mut launch = self.stream.launch_builder(self.kernel("softmax_rows")?);
        launch.arg(&x).arg(&mut y).arg(&rows).arg(&k).arg(&log_mode);
        // SAFETY: `x` and `y` hold rows*n floats.
        unsafe { launch.launch(rows_config(rows, k)) }.map_err(|e| self.error("softmax", e))?;
        Ok(y)
    }

    /// Per-row cross-entropy of dense logits `[rows, classes]` (NaN where a label is invalid).
    pub(crate) fn cross_entropy(
        &self,
        x: &CudaStorage,
        xr: Range<usize>,
        labels: &CudaStorage,
        lr: Range<usize>,
        classes: usize,
        ignore: Option<f32>,
    ) -> Result<CudaStorage> {
        let rows = lr.len();
        let (r, c) = (
            self.count("cross_entropy", rows)?,
            self.count("cross_entropy", classes)?,
        );
        let mut loss = self.alloc("cross_entropy", rows)?;
        if rows == 0 {
            return Ok(loss);
        }
        let (x, labels) = (x.slice(xr), labels.slice(lr));
        let mut launch = self.stream.launch_builder(self.kernel("ce_fwd")?);
        let (has_ignore, ignore) = (i32::from(ignore.is_some()), ignore.unwrap_or(0.0));
        launch.arg(&x).arg(&labels).arg(&mut loss).arg(&r).arg(&c);
        launch.arg(&has_ignore).arg(&ignore);
        // SAFETY: `x` holds rows*classes floats, `labels` and `loss` rows.
        unsafe { launch.launch(rows_config(r, c)) }.map_err(|e| self.error("cross_entropy", e))?;
        Ok(loss)
    }

    /// `(softmax(x) - onehot(labels)) * g[0]` (`g` is the upstream gradient over the count of
    /// labels); 0 for ignored rows.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn cross_entropy_grad(
        &self,
        x: &CudaStorage,
        xr: Range<usize>,
        labels: &CudaStorage,
        lr: Range<usize>,
        g: &CudaStorage,
        gr: Range<usize>,
        classes: usize,
        ignore: Option<f32>,
    ) -> Result<CudaStorage> {
        let rows = lr.len();
        let (r, c) = (
            self.count("cross_entropy", rows)?,
            self.count("cross_entropy", classes)?,
        );
        let mut dx = self.alloc("cross_entropy backward", xr.len())?;
        if rows == 0 {
            return Ok(dx);
        }
        // The caller has divided the upstream gradient by the count of labels.
        let inv_rows = 1.0f32;
        let (has_ignore, ignore) = (i32::from(ignore.is_some()), ignore.unwrap_or(0.0));
        let (x, labels, g) = (x.slice(xr), labels.slice(lr), g.slice(gr));
        let mut launch = self.stream.launch_builder(self.kernel("ce_bwd")?);
        launch
            .arg(&x)
            .arg(&labels)
            .arg(&g)
            .arg(&mut dx)
            .arg(&r)
            .arg(&c)
            .arg(&inv_rows)
            .arg(&has_ignore)
            .arg(&ignore);
        // SAFETY: as for `cross_entropy`; `g` holds one float.
        unsafe { launch.launch(rows_config(r, c)) }
            .map_err(|e| self.error("cross_entropy backward", e))?;
        Ok(dx)
    }

    /// One fused optimizer update of the dense range `pr` of `p`.
    pub(crate) fn update(
        &self,
        op: UpdateOp,
        p: &mut CudaStorage,
        pr: Range<usize>,
        (g, gr): (&CudaStorage, Range<usize>),
        s1: Option<&mut CudaStorage>,
        s2: Option<&mut CudaStorage>,
    ) -> Result<()> {
        let n = self.count("optimizer step", pr.len())?;
        if n == 0 {
            return Ok(());
        }
        let g = g.slice(gr);
        let mut p = p.slice_mut(pr);
        match op {
            UpdateOp::Sgd {
                lr,
                momentum,
                weight_decay,
                nesterov,
            } => {
                let nesterov = i32::from(nesterov);
                let mut launch = self.stream.launch_builder(self.kernel("sgd_step")?);
                launch.arg(&mut p).arg(&g);
                let buf = s1.filter(|_| momentum != 0.0);
                let momentum = if buf.is_some() { momentum } else { 0.0 };
                match buf {
                    Some(buf) => launch.arg(buf),
                    // Not read when momentum is 0; any valid pointer will do.
                    None => launch.arg(&g),
                };
                launch
                    .arg(&n)
                    .arg(&lr)
                    .arg(&momentum)
                    .arg(&weight_decay)
                    .arg(&nesterov);
                // SAFETY: p, g (and buf when read) hold `n` floats.
                unsafe { launch.launch(grid_for(n)) }.map_err(|e| self.error("sgd step", e))?;
            }
            UpdateOp::Adam {
                lr,
                beta1,
                beta2,
                eps,
                weight_decay,
                decoupled,
                bias1,
                bias2,
            } => {
                let (Some(m), Some(v)) = (s1, s2) else {
                    return Err(self.error("adam step", "internal: moment buffers missing"));
                };
                let decoupled = i32::from(decoupled);
                let mut launch = self.stream.launch_builder(self.kernel("adam_step")?);
                launch.arg(&mut p).arg(&g).arg(m).arg(v).arg(&n);
                launch
                    .arg(&lr)
                    .arg(&beta1)
                    .arg(&beta2)
                    .arg(&eps)
                    .arg(&weight_decay);
                launch.arg(&decoupled).arg(&bias1).arg(&bias2);
                // SAFETY: p, g, m and v hold `n` floats.
                unsafe { launch.launch(grid_for(n)) }.map_err(|e| self.error("adam step", e))?;
            }
        }
        Ok(())
    }
}
