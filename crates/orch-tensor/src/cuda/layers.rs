//! Kernel launches for the layer ops (each op's `cuda_forward` and `cuda_backward` in `layers/`
//! call them on a CUDA pool): conv2d as
//! im2col + one cuBLAS gemm per sample (the groups are the gemm's batch), col2im for the input
//! gradient; pooling and the norms as one-thread-per-element and one-block-per-row kernels;
//! attention composed from batched cuBLAS products and a masked row softmax. The specs are the
//! CPU kernels' (validated there, so every size here is checked); inputs are dense views.
//!
//! Temporaries (the column matrix of one sample; attention's score matrices; batch norm's
//! per-channel sums) are the sizes [`conv2d_workspace`], [`attention_workspace`] and
//! [`batch_norm_workspace`] give, reserved in the job's pool by the caller before any launch.

use super::blas::Gemm;
use super::ops::{grid_for, rows_config};
use super::{CudaDevice, CudaStorage};
use crate::error::Result;
use crate::layout::Layout;
use crate::nn_kernels::{
    AttentionSpec, BatchNormMode, BatchNormSpec, Conv2dSpec, LayerNormSpec, MaskKind, Pool2dSpec,
    checked_product,
};
use cudarc::driver::{CudaView, DeviceRepr, PushKernelArg};

/// Mirrors `struct ConvGeom` in kernels.cu.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct ConvGeom {
    c: u32,
    h: u32,
    w: u32,
    kh: u32,
    kw: u32,
    oh: u32,
    ow: u32,
    sh: u32,
    sw: u32,
    ph: u32,
    pw: u32,
    dh: u32,
    dw: u32,
}

/// Mirrors `struct PoolGeom` in kernels.cu.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct PoolGeom {
    planes: u32,
    h: u32,
    w: u32,
    oh: u32,
    ow: u32,
    kh: u32,
    kw: u32,
    sh: u32,
    sw: u32,
    ph: u32,
    pw: u32,
}

/// Mirrors `struct AttnGeom` in kernels.cu.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct AttnGeom {
    heads: u32,
    h: u32,
    t: u32,
    s: u32,
    causal: u32,
    has_mask: u32,
    kind: u32,
    m0: u32,
    m1: u32,
    m2: u32,
    m3: u32,
}

// SAFETY: plain `repr(C)` structs of u32s, laid out exactly as the C structs in kernels.cu.
unsafe impl DeviceRepr for ConvGeom {}
// SAFETY: as above.
unsafe impl DeviceRepr for PoolGeom {}
// SAFETY: as above.
unsafe impl DeviceRepr for AttnGeom {}

/// f32 temporaries of the CUDA conv2d (forward and backward): one sample's column matrix.
pub(crate) fn conv2d_workspace(s: &Conv2dSpec) -> Result<usize> {
    if s.n == 0 {
        return Ok(0);
    }
    checked_product(
        "conv2d",
        "the column matrix",
        &[s.c, s.kh, s.kw, s.oh, s.ow],
    )
}

/// f32 temporaries of the CUDA attention: the probabilities `[B, H, T, S]`, and in backward
/// their gradient as well.
pub(crate) fn attention_workspace(s: &AttentionSpec, backward: bool) -> Result<usize> {
    let copies = if backward { 2 } else { 1 };
    checked_product(
        "scaled_dot_product_attention",
        "the score matrices",
        &[copies, s.b, s.h, s.t, s.s],
    )
}

/// f32 temporaries of the CUDA batch norm backward: the per-channel sums.
pub(crate) fn batch_norm_workspace(s: &BatchNormSpec) -> usize {
    2 * s.c
}

/// The logsumexp argument of `attn_probs`: computed and written (forward) or read (backward).
enum Lse<'a, 'b> {
    Write(&'a mut CudaStorage),
    Read(&'a CudaView<'b, f32>),
}

/// A raw pointer argument for a kernel's optional input: the view when present, else `fallback`
/// (never read: the kernel's flag is 0).
fn opt<'a>(
    v: Option<&'a CudaView<'a, f32>>,
    fallback: &'a CudaView<'a, f32>,
) -> &'a CudaView<'a, f32> {
    v.unwrap_or(fallback)
}

impl CudaDevice {
    fn conv_geom(&self, s: &Conv2dSpec) -> Result<ConvGeom> {
        const OP: &str = "conv2d";
        let c = |v: usize| self.count(OP, v);
        Ok(ConvGeom {
            c: c(s.c)?,
            h: c(s.h)?,
            w: c(s.w)?,
            kh: c(s.kh)?,
            kw: c(s.kw)?,
            oh: c(s.oh)?,
            ow: c(s.ow)?,
            sh: c(s.stride[0])?,
            sw: c(s.stride[1])?,
            ph: c(s.padding[0])?,
            pw: c(s.padding[1])?,
            dh: c(s.dilation[0])?,
            dw: c(s.dilation[1])?,
        })
    }

    /// One sample's column matrix: `x` (the sample, `[C, H, W]`) into `col`.
    fn im2col(
        &self,
        g: &ConvGeom,
        x: &CudaView<'_, f32>,
        col: &mut CudaStorage,
        n: u32,
    ) -> Result<()> {
        let mut launch = self.stream.launch_builder(self.kernel("im2col")?);
        launch.arg(x).arg(col).arg(g);
        // SAFETY: `x` holds C*H*W floats, `col` C*kh*kw*OH*OW (`n`); the struct mirrors kernels.cu.
        unsafe { launch.launch(grid_for(n)) }.map_err(|e| self.error("im2col", e))?;
        Ok(())
    }

    /// `[N, O, OH, OW]` = conv2d of dense `x` by dense `w`, plus `bias`.
    pub(crate) fn conv2d_forward(
        &self,
        s: &Conv2dSpec,
        x: &CudaView<'_, f32>,
        w: &CudaView<'_, f32>,
        bias: Option<&CudaView<'_, f32>>,
        tf32: bool,
    ) -> Result<CudaStorage> {
        const OP: &str = "conv2d";
        let g = self.conv_geom(s)?;
        let (l, in_len) = (s.oh * s.ow, s.c * s.h * s.w);
        let total = s.n * s.o * l;
        self.count(OP, total)?;
        let mut y = self.alloc(OP, total)?;
        if total == 0 {
            return Ok(y);
        }
        let rows = s.c * s.kh * s.kw;
        let col_n = self.count(OP, rows * l)?;
        let mut col = self.alloc(OP, rows * l)?;
        let (og, kg) = (s.o / s.groups, rows / s.groups);
        // out_n,g [O/g, L] = W_g [O/g, Ck] @ col_g [Ck, L], the groups as the batch.
        let gemm = Gemm {
            m: og,
            n: l,
            k: kg,
            batch: s.groups,
            trans_a: false,
            trans_b: false,
            strides: [og * kg, kg * l, og * l],
            alpha: 1.0,
            beta: 0.0,
        };
        for n in 0..s.n {
            self.im2col(&g, &x.slice(n * in_len..(n + 1) * in_len), &mut col, col_n)?;
            let mut out = y.slice_mut(n * s.o * l..(n + 1) * s.o * l);
            self.gemm_into(OP, &gemm, w, &col, &mut out, tf32)?;
        }
        if let Some(b) = bias {
            let (nn, o, ll) = (
                self.count(OP, total)?,
                self.count(OP, s.o)?,
                self.count(OP, l)?,
            );
            let mut launch = self.stream.launch_builder(self.kernel("conv_bias_add")?);
            launch.arg(&mut y).arg(b).arg(&nn).arg(&o).arg(&ll);
            // SAFETY: `y` holds N*O*L floats, `b` O.
            unsafe { launch.launch(grid_for(nn)) }.map_err(|e| self.error(OP, e))?;
        }
        Ok(y)
    }

    /// The `want`ed gradients of (input, weight, bias) of conv2d, in that order.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn conv2d_backward(
        &self,
        s: &Conv2dSpec,
        x: &CudaView<'_, f32>,
        w: &CudaView<'_, f32>,
        dy: &CudaView<'_, f32>,
        want: [bool; 3],
        tf32: bool,
    ) -> Result<Vec<CudaStorage>> {
        const OP: &str = "conv2d backward";
        let g = self.conv_geom(s)?;
        let (l, in_len, out_len) = (s.oh * s.ow, s.c * s.h * s.w, s.o * s.oh * s.ow);
        let rows = s.c * s.kh * s.kw;
        let (og, kg) = (s.o / s.groups, rows / s.groups);
        let w_len = s.o * kg;
        let mut dx = want[0].then(|| self.alloc(OP, s.n * in_len)).transpose()?;
        let mut dw = match want[1] {
            // Zeros: the per-sample products below add into it (and none run for N = 0).
            true => Some(self.fill(w_len, 0.0)?),
            false => None,
        };
        if (dx.is_some() || dw.is_some()) && s.n > 0 {
            let col_n = self.count(OP, rows * l)?;
            let in_n = self.count(OP, in_len)?;
            let mut col = self.alloc(OP, rows * l)?;
            // dW_g [O/g, Ck] += dY_n,g [O/g, L] @ col_g^T.
            let wgrad = Gemm {
                m: og,
                n: kg,
                k: l,
                batch: s.groups,
                trans_a: false,
                trans_b: true,
                strides: [og * l, kg * l, og * kg],
                alpha: 1.0,
                beta: 1.0,
            };
            // dcol_g [Ck, L] = W_g^T @ dY_n,g.
            let igrad = Gemm {
                m: kg,
                n: l,
                k: og,
                batch: s.groups,
                trans_a: true,
                trans_b: false,
                strides: [og * kg, og * l, kg * l],
                alpha: 1.0,
                beta: 0.0,
            };
            for n in 0..s.n {
                let dyn_ = dy.slice(n * out_len..(n + 1) * out_len);
                if let Some(dw) = dw.as_mut() {
                    self.im2col(&g, &x.slice(n * in_len..(n + 1) * in_len), &mut col, col_n)?;
                    self.gemm_into(OP, &wgrad, &dyn_, &col, dw, tf32)?;
                }
                if let Some(dx) = dx.as_mut() {
                    // The one stream orders this after the weight gradient's read of `col`.
                    self.gemm_into(OP, &igrad, w, &dyn_, &mut col, tf32)?;
                    let mut dxn = dx.slice_mut(n * in_len..(n + 1) * in_len);
                    let mut launch = self.stream.launch_builder(self.kernel("col2im")?);
                    launch.arg(&col).arg(&mut dxn).arg(&g);
                    // SAFETY: `col` holds C*kh*kw*L floats, `dxn` C*H*W (`in_n`).
                    unsafe { launch.launch(grid_for(in_n)) }.map_err(|e| self.error(OP, e))?;
                }
            }
        }
        let db = match want[2] {
            true => {
                let mut db = self.alloc(OP, s.o)?;
                let (nn, o, ll) = (
                    self.count(OP, s.n)?,
                    self.count(OP, s.o)?,
                    self.count(OP, l)?,
                );
                let mut launch = self.stream.launch_builder(self.kernel("conv_bias_grad")?);
                launch.arg(dy).arg(&mut db).arg(&nn).arg(&o).arg(&ll);
                // SAFETY: `dy` holds N*O*L floats, `db` O; one block per channel.
                unsafe { launch.launch(rows_config(o, nn.saturating_mul(ll))) }
                    .map_err(|e| self.error(OP, e))?;
                Some(db)
            }
            false => None,
        };
        Ok([dx, dw, db].into_iter().flatten().collect())
    }

    fn pool_geom(&self, op: &'static str, s: &Pool2dSpec) -> Result<PoolGeom> {
        let c = |v: usize| self.count(op, v);
        self.count(op, s.n * s.c * s.h * s.w)?;
        self.count(op, s.n * s.c * s.oh * s.ow)?;
        Ok(PoolGeom {
            planes: c(s.n * s.c)?,
            h: c(s.h)?,
            w: c(s.w)?,
            oh: c(s.oh)?,
            ow: c(s.ow)?,
            kh: c(s.kernel[0])?,
            kw: c(s.kernel[1])?,
            sh: c(s.stride[0])?,
            sw: c(s.stride[1])?,
            ph: c(s.padding[0])?,
            pw: c(s.padding[1])?,
        })
    }

    /// Max pooling: the output and the argmax offsets (u32 bits in f32 storage).
    pub(crate) fn max_pool2d_forward(
        &self,
        s: &Pool2dSpec,
        x: &CudaView<'_, f32>,
    ) -> Result<[CudaStorage; 2]> {
        const OP: &str = "max_pool2d";
        let g = self.pool_geom(OP, s)?;
        let n = s.out_numel();
        let (mut y, mut idx) = (self.alloc(OP, n)?, self.alloc(OP, n)?);
        if n > 0 {
            let mut launch = self.stream.launch_builder(self.kernel("max_pool_fwd")?);
            launch.arg(x).arg(&mut y).arg(&mut idx).arg(&g);
            // SAFETY: `x` holds planes*H*W floats, `y` and `idx` planes*OH*OW (`n`).
            unsafe { launch.launch(grid_for(n as u32)) }.map_err(|e| self.error(OP, e))?;
        }
        Ok([y, idx])
    }

    /// Input gradient of pooling: max (`indices` given) or average.
    pub(crate) fn pool2d_backward(
        &self,
        s: &Pool2dSpec,
        dy: &CudaView<'_, f32>,
        indices: Option<&CudaView<'_, f32>>,
        input_len: usize,
    ) -> Result<CudaStorage> {
        let op = match indices {
            Some(_) => "max_pool2d backward",
            None => "avg_pool2d backward",
        };
        let g = self.pool_geom(op, s)?;
        let n = self.count(op, input_len)?;
        let mut dx = self.alloc(op, input_len)?;
        if input_len == 0 {
            return Ok(dx);
        }
        if s.out_numel() == 0 {
            self.stream
                .memset_zeros(&mut dx)
                .map_err(|e| self.error(op, e))?;
            return Ok(dx);
        }
        let name = if indices.is_some() {
            "max_pool_bwd"
        } else {
            "avg_pool_bwd"
        };
        let mut launch = self.stream.launch_builder(self.kernel(name)?);
        launch.arg(dy);
        if let Some(idx) = indices {
            launch.arg(idx);
        }
        launch.arg(&mut dx).arg(&g);
        // SAFETY: `dy` (and `idx`) hold planes*OH*OW floats, `dx` planes*H*W (`n`).
        unsafe { launch.launch(grid_for(n)) }.map_err(|e| self.error(op, e))?;
        Ok(dx)
    }

    /// Average pooling (padding counted).
    pub(crate) fn avg_pool2d_forward(
        &self,
        s: &Pool2dSpec,
        x: &CudaView<'_, f32>,
    ) -> Result<CudaStorage> {
        const OP: &str = "avg_pool2d";
        let g = self.pool_geom(OP, s)?;
        let n = s.out_numel();
        let mut y = self.alloc(OP, n)?;
        if n > 0 {
            let mut launch = self.stream.launch_builder(self.kernel("avg_pool_fwd")?);
            launch.arg(x).arg(&mut y).arg(&g);
            // SAFETY: `x` holds planes*H*W floats, `y` planes*OH*OW (`n`).
            unsafe { launch.launch(grid_for(n as u32)) }.map_err(|e| self.error(OP, e))?;
        }
        Ok(y)
    }

    /// Layer norm: the output, each row's mean and rstd.
    pub(crate) fn layer_norm_forward(
        &self,
        s: &LayerNormSpec,
        x: &CudaView<'_, f32>,
        w: Option<&CudaView<'_, f32>>,
        b: Option<&CudaView<'_, f32>>,
    ) -> Result<[CudaStorage; 3]> {
        const OP: &str = "layer_norm";
        let (rows, cols) = (self.count(OP, s.rows)?, self.count(OP, s.cols)?);
        self.count(OP, s.rows * s.cols)?;
        let mut y = self.alloc(OP, s.rows * s.cols)?;
        let (mut mean, mut rstd) = (self.alloc(OP, s.rows)?, self.alloc(OP, s.rows)?);
        if rows > 0 {
            let (has_w, has_b) = (i32::from(w.is_some()), i32::from(b.is_some()));
            let mut launch = self.stream.launch_builder(self.kernel("layer_norm_fwd")?);
            launch.arg(x).arg(opt(w, x)).arg(opt(b, x)).arg(&mut y);
            launch.arg(&mut mean).arg(&mut rstd).arg(&rows).arg(&cols);
            launch.arg(&s.eps).arg(&has_w).arg(&has_b);
            // SAFETY: `x` and `y` hold rows*cols floats, `w` and `b` cols (read when flagged),
            // `mean` and `rstd` rows.
            unsafe { launch.launch(rows_config(rows, cols)) }.map_err(|e| self.error(OP, e))?;
        }
        Ok([y, mean, rstd])
    }

    /// The `want`ed gradients of (input, weight, bias) of a layer norm.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn layer_norm_backward(
        &self,
        s: &LayerNormSpec,
        (x, mean, rstd, dy): (
            &CudaView<'_, f32>,
            &CudaView<'_, f32>,
            &CudaView<'_, f32>,
            &CudaView<'_, f32>,
        ),
        w: Option<&CudaView<'_, f32>>,
        want: [bool; 3],
    ) -> Result<Vec<CudaStorage>> {
        const OP: &str = "layer_norm backward";
        let (rows, cols) = (self.count(OP, s.rows)?, self.count(OP, s.cols)?);
        let numel = s.rows * s.cols;
        let mut dx = want[0].then(|| self.alloc(OP, numel)).transpose()?;
        let mut dw = want[1].then(|| self.alloc(OP, s.cols)).transpose()?;
        let mut db = want[2].then(|| self.alloc(OP, s.cols)).transpose()?;
        if let Some(dx) = dx.as_mut()
            && rows > 0
        {
            let has_w = i32::from(w.is_some());
            let mut launch = self
                .stream
                .launch_builder(self.kernel("layer_norm_bwd_dx")?);
            launch
                .arg(x)
                .arg(opt(w, x))
                .arg(mean)
                .arg(rstd)
                .arg(dy)
                .arg(dx);
            launch.arg(&rows).arg(&cols).arg(&has_w);
            // SAFETY: `x`, `dy` and `dx` hold rows*cols floats, `w` cols, `mean`, `rstd` rows.
            unsafe { launch.launch(rows_config(rows, cols)) }.map_err(|e| self.error(OP, e))?;
        }
        if (dw.is_some() || db.is_some()) && cols > 0 {
            let (want_w, want_b) = (i32::from(dw.is_some()), i32::from(db.is_some()));
            let mut launch = self
                .stream
                .launch_builder(self.kernel("layer_norm_bwd_params")?);
            launch.arg(x).arg(mean).arg(rstd).arg(dy);
            // A gradient not wanted is not written; any valid pointer will do.
            match dw.as_mut() {
                Some(dw) => launch.arg(dw),
                None => launch.arg(x),
            };
            match db.as_mut() {
                Some(db) => launch.arg(db),
                None => launch.arg(x),
            };
            launch.arg(&rows).arg(&cols).arg(&want_w).arg(&want_b);
            // SAFETY: `x` and `dy` hold rows*cols floats, `mean`, `rstd` rows; `dw` and `db`
            // cols, written only when flagged.
            unsafe { launch.launch(grid_for(cols)) }.map_err(|e| self.error(OP, e))?;
        }
        Ok([dx, dw, db].into_iter().flatten().collect())
    }

    /// Batch norm: the output, the per-channel mean and rstd used; `running` is read (eval) or
    /// updated in place (training).
    pub(crate) fn batch_norm_forward(
        &self,
        s: &BatchNormSpec,
        x: &CudaView<'_, f32>,
        (w, b): (Option<&CudaView<'_, f32>>, Option<&CudaView<'_, f32>>),
        (rm, rv): (&mut CudaStorage, &mut CudaStorage),
    ) -> Result<[CudaStorage; 3]> {
        const OP: &str = "batch_norm";
        let numel = s.n * s.c * s.spatial;
        let (total, c, sp) = (
            self.count(OP, numel)?,
            self.count(OP, s.c)?,
            self.count(OP, s.spatial)?,
        );
        let nn = self.count(OP, s.n)?;
        let count = s.n * s.spatial;
        let mut y = self.alloc(OP, numel)?;
        let (mut mean, mut rstd) = (self.alloc(OP, s.c)?, self.alloc(OP, s.c)?);
        if c == 0 {
            return Ok([y, mean, rstd]);
        }
        match s.mode {
            BatchNormMode::Eval => {
                let mut launch = self
                    .stream
                    .launch_builder(self.kernel("batch_norm_eval_stats")?);
                launch
                    .arg(&*rm)
                    .arg(&*rv)
                    .arg(&mut mean)
                    .arg(&mut rstd)
                    .arg(&c)
                    .arg(&s.eps);
                // SAFETY: every buffer holds C floats.
                unsafe { launch.launch(grid_for(c)) }.map_err(|e| self.error(OP, e))?;
            }
            BatchNormMode::Train if count == 0 => {
                // Nothing to normalise: the running statistics stay as they are.
                mean = self.fill(s.c, 0.0)?;
                rstd = self.fill(s.c, 1.0 / s.eps.sqrt())?;
                return Ok([y, mean, rstd]);
            }
            BatchNormMode::Train => {
                self.count(OP, count)?;
                let has_running = 1i32;
                let mut launch = self.stream.launch_builder(self.kernel("batch_norm_stats")?);
                launch.arg(x).arg(&mut mean).arg(&mut rstd).arg(rm).arg(rv);
                launch
                    .arg(&nn)
                    .arg(&c)
                    .arg(&sp)
                    .arg(&s.momentum)
                    .arg(&s.eps)
                    .arg(&has_running);
                // SAFETY: `x` holds N*C*S floats, the others C; one block per channel.
                unsafe { launch.launch(rows_config(c, nn.saturating_mul(sp))) }
                    .map_err(|e| self.error(OP, e))?;
            }
        }
        if total > 0 {
            let (has_w, has_b) = (i32::from(w.is_some()), i32::from(b.is_some()));
            let mut launch = self.stream.launch_builder(self.kernel("batch_norm_apply")?);
            launch
                .arg(x)
                .arg(opt(w, x))
                .arg(opt(b, x))
                .arg(&mean)
                .arg(&rstd)
                .arg(&mut y);
            launch.arg(&total).arg(&c).arg(&sp).arg(&has_w).arg(&has_b);
            // SAFETY: `x` and `y` hold N*C*S floats, the others C (w, b read when flagged).
            unsafe { launch.launch(grid_for(total)) }.map_err(|e| self.error(OP, e))?;
        }
        Ok([y, mean, rstd])
    }

    /// The `want`ed gradients of (input, weight, bias) of a batch norm.
    pub(crate) fn batch_norm_backward(
        &self,
        s: &BatchNormSpec,
        (x, mean, rstd, dy): (
            &CudaView<'_, f32>,
            &CudaView<'_, f32>,
            &CudaView<'_, f32>,
            &CudaView<'_, f32>,
        ),
        w: Option<&CudaView<'_, f32>>,
        want: [bool; 3],
    ) -> Result<Vec<CudaStorage>> {
        const OP: &str = "batch_norm backward";
        let numel = s.n * s.c * s.spatial;
        let (total, c, sp) = (
            self.count(OP, numel)?,
            self.count(OP, s.c)?,
            self.count(OP, s.spatial)?,
        );
        let nn = self.count(OP, s.n)?;
        let mut sums = self.alloc(OP, batch_norm_workspace(s))?;
        if c > 0 {
            let mut launch = self
                .stream
                .launch_builder(self.kernel("batch_norm_bwd_sums")?);
            launch.arg(x).arg(dy).arg(mean).arg(rstd).arg(&mut sums);
            launch.arg(&nn).arg(&c).arg(&sp);
            // SAFETY: `x` and `dy` hold N*C*S floats, `mean`, `rstd` C, `sums` 2C.
            unsafe { launch.launch(rows_config(c, nn.saturating_mul(sp))) }
                .map_err(|e| self.error(OP, e))?;
        }
        let dense = Layout::contiguous(&[s.c]);
        let part = |offset: usize| -> Result<CudaStorage> {
            let mut out = self.alloc(OP, s.c)?;
            if s.c > 0 {
                let from = Layout::from_parts(&[s.c], &[1], offset);
                self.copy_strided(&sums, &from, &mut out, &dense)?;
            }
            Ok(out)
        };
        let dx = match want[0] {
            true => {
                let mut dx = self.alloc(OP, numel)?;
                if total > 0 {
                    let count = (s.n * s.spatial).max(1) as f32;
                    let has_w = i32::from(w.is_some());
                    let train = i32::from(s.mode == BatchNormMode::Train);
                    let mut launch = self
                        .stream
                        .launch_builder(self.kernel("batch_norm_bwd_dx")?);
                    launch
                        .arg(x)
                        .arg(opt(w, x))
                        .arg(mean)
                        .arg(rstd)
                        .arg(&sums)
                        .arg(dy);
                    launch.arg(&mut dx).arg(&total).arg(&c).arg(&sp).arg(&count);
                    launch.arg(&has_w).arg(&train);
                    // SAFETY: `x`, `dy` and `dx` hold N*C*S floats, the others C (`sums` 2C).
                    unsafe { launch.launch(grid_for(total)) }.map_err(|e| self.error(OP, e))?;
                }
                Some(dx)
            }
            false => None,
        };
        let dw = want[1].then(|| part(s.c)).transpose()?;
        let db = want[2].then(|| part(0)).transpose()?;
        Ok([dx, dw, db].into_iter().flatten().collect())
    }

    fn attn_geom(&self, s: &AttentionSpec) -> Result<AttnGeom> {
        const OP: &str = "scaled_dot_product_attention";
        let c = |v: usize| self.count(OP, v);
        let (has_mask, kind, m) = match &s.mask {
            Some(m) => (1, u32::from(m.kind == MaskKind::Boolean), m.strides),
            None => (0, 0, [0; 4]),
        };
        Ok(AttnGeom {
            heads: c(s.b * s.h)?,
            h: c(s.h)?,
            t: c(s.t)?,
            s: c(s.s)?,
            causal: u32::from(s.causal),
            has_mask,
            kind,
            m0: c(m[0])?,
            m1: c(m[1])?,
            m2: c(m[2])?,
            m3: c(m[3])?,
        })
    }

    /// The masked probabilities into `p` (holding the scaled scores): forward computes each
    /// row's logsumexp and writes it, backward reads the saved one. `fallback` is any valid
    /// pointer for an absent mask (never read).
    fn attn_probs(
        &self,
        g: &AttnGeom,
        p: &mut CudaStorage,
        mask: Option<&CudaView<'_, f32>>,
        lse: Lse<'_, '_>,
        fallback: &CudaView<'_, f32>,
    ) -> Result<()> {
        let rows = self.count(
            "scaled_dot_product_attention",
            g.heads as usize * g.t as usize,
        )?;
        let backward = i32::from(matches!(lse, Lse::Read(_)));
        let mut launch = self.stream.launch_builder(self.kernel("attn_probs")?);
        launch.arg(&mut *p).arg(mask.unwrap_or(fallback));
        match lse {
            Lse::Write(l) => launch.arg(l),
            // Only read when `backward` is set.
            Lse::Read(l) => launch.arg(l),
        };
        launch.arg(g).arg(&backward);
        // SAFETY: `p` holds rows*S floats, `lse` rows; the mask's strides (validated by the
        // spec against its length) stay inside it.
        unsafe { launch.launch(rows_config(rows, g.s)) }
            .map_err(|e| self.error("scaled_dot_product_attention", e))?;
        Ok(())
    }

    /// `P = softmax(scale * q k^T + mask)` into a fresh `[B*H, T, S]` buffer.
    fn attn_scores(
        &self,
        s: &AttentionSpec,
        (q, k): (&CudaView<'_, f32>, &CudaView<'_, f32>),
        tf32: bool,
    ) -> Result<CudaStorage> {
        const OP: &str = "scaled_dot_product_attention";
        let heads = s.b * s.h;
        let mut p = self.alloc(OP, heads * s.t * s.s)?;
        let gemm = Gemm {
            m: s.t,
            n: s.s,
            k: s.d,
            batch: heads,
            trans_a: false,
            trans_b: true,
            strides: [s.t * s.d, s.s * s.d, s.t * s.s],
            alpha: s.scale,
            beta: 0.0,
        };
        self.gemm_into(OP, &gemm, q, k, &mut p, tf32)?;
        Ok(p)
    }

    /// Attention: the output `[B, H, T, Dv]` and the per-row logsumexp `[B, H, T]`.
    pub(crate) fn attention_forward(
        &self,
        s: &AttentionSpec,
        (q, k, v): (&CudaView<'_, f32>, &CudaView<'_, f32>, &CudaView<'_, f32>),
        mask: Option<&CudaView<'_, f32>>,
        tf32: bool,
    ) -> Result<[CudaStorage; 2]> {
        const OP: &str = "scaled_dot_product_attention";
        let g = self.attn_geom(s)?;
        let heads = s.b * s.h;
        let (rows, out_len) = (heads * s.t, heads * s.t * s.dv);
        self.count(OP, out_len)?;
        self.count(OP, rows * s.s)?;
        if rows == 0 || s.s == 0 {
            // No key at all: zero outputs, logsumexp -inf (as the CPU kernel).
            let out = self.fill(out_len, 0.0)?;
            return Ok([out, self.fill(rows, f32::NEG_INFINITY)?]);
        }
        let mut out = self.alloc(OP, out_len)?;
        let mut lse = self.alloc(OP, rows)?;
        let mut p = self.attn_scores(s, (q, k), tf32)?;
        self.attn_probs(&g, &mut p, mask, Lse::Write(&mut lse), q)?;
        let gemm = Gemm {
            m: s.t,
            n: s.dv,
            k: s.s,
            batch: heads,
            trans_a: false,
            trans_b: false,
            strides: [s.t * s.s, s.s * s.dv, s.t * s.dv],
            alpha: 1.0,
            beta: 0.0,
        };
        self.gemm_into(OP, &gemm, &p, v, &mut out, tf32)?;
        Ok([out, lse])
    }

    /// Gradients of q, k and v.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn attention_backward(
        &self,
        s: &AttentionSpec,
        (q, k, v): (&CudaView<'_, f32>, &CudaView<'_, f32>, &CudaView<'_, f32>),
        (out, lse, dout): (&CudaView<'_, f32>, &CudaView<'_, f32>, &CudaView<'_, f32>),
        mask: Option<&CudaView<'_, f32>>,
        tf32: bool,
    ) -> Result<[CudaStorage; 3]> {
        const OP: &str = "scaled_dot_product_attention backward";
        let g = self.attn_geom(s)?;
        let heads = s.b * s.h;
        let rows = heads * s.t;
        let (q_len, k_len, v_len) = (rows * s.d, heads * s.s * s.d, heads * s.s * s.dv);
        let mut dq = self.fill(q_len, 0.0)?;
        let mut dk = self.fill(k_len, 0.0)?;
        let mut dv = self.fill(v_len, 0.0)?;
        if rows == 0 || s.s == 0 {
            return Ok([dq, dk, dv]);
        }
        let rows_n = self.count(OP, rows)?;
        let mut p = self.attn_scores(s, (q, k), tf32)?;
        self.attn_probs(&g, &mut p, mask, Lse::Read(lse), q)?;
        let batched = |m, n, k, trans_a, trans_b, strides| Gemm {
            m,
            n,
            k,
            batch: heads,
            trans_a,
            trans_b,
            strides,
            alpha: 1.0,
            beta: 0.0,
        };
        let (t, sk, d, dvv) = (s.t, s.s, s.d, s.dv);
        // dV = P^T dO.
        let g_dv = batched(sk, dvv, t, true, false, [t * sk, t * dvv, sk * dvv]);
        self.gemm_into(OP, &g_dv, &p, dout, &mut dv, tf32)?;
        // dP = dO V^T, then dS = P * (dP - rowsum(dO * O)) * scale in place.
        let mut ds = self.alloc(OP, rows * sk)?;
        let g_dp = batched(t, sk, dvv, false, true, [t * dvv, sk * dvv, t * sk]);
        self.gemm_into(OP, &g_dp, dout, v, &mut ds, tf32)?;
        let (sn, dvn) = (self.count(OP, sk)?, self.count(OP, dvv)?);
        let mut launch = self.stream.launch_builder(self.kernel("attn_dscores")?);
        launch.arg(&p).arg(&mut ds).arg(out).arg(dout);
        launch.arg(&rows_n).arg(&sn).arg(&dvn).arg(&s.scale);
        // SAFETY: `p` and `ds` hold rows*S floats, `out` and `dout` rows*Dv.
        unsafe { launch.launch(rows_config(rows_n, sn.max(dvn))) }
            .map_err(|e| self.error(OP, e))?;
        // dQ = dS K, dK = dS^T Q.
        let g_dq = batched(t, d, sk, false, false, [t * sk, sk * d, t * d]);
        self.gemm_into(OP, &g_dq, &ds, k, &mut dq, tf32)?;
        let g_dk = batched(sk, d, t, true, false, [t * sk, t * d, sk * d]);
        self.gemm_into(OP, &g_dk, &ds, q, &mut dk, tf32)?;
        Ok([dq, dk, dv])
    }
}
