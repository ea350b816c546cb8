//! Layer normalisation (`F.layer_norm`) and batch normalisation (`F.batch_norm`).
//!
//! **Layer norm** normalises each row (the trailing `normalized_shape` dims): forward computes
//! the row's mean and `rstd = 1/sqrt(var + eps)` (biased variance, two passes over the row held
//! in cache) and writes `y = (x - mean) * rstd * w + b` in the same visit, returning mean and
//! rstd per row (`torch.native_layer_norm`). Backward, per row in one visit:
//! `dx = rstd * (g - mean(g) - xhat * mean(g * xhat))` with `g = dy * w`, while accumulating
//! `dw += dy * xhat` and `db += dy` into the slot's partial sums (summed over slots at the end).
//! Rows are split into at most 8 contiguous groups (rayon tasks), each with its own partial
//! sums, added in order: gradients are the same bits whatever the thread count. Workspace:
//! `2 * cols` per group (backward).
//!
//! **Batch norm** normalises each channel over `N` and the spatial dims of `[N, C, *]`. Training
//! uses the batch's mean and biased variance and updates the running statistics as PyTorch
//! does: `running = (1 - momentum) * running + momentum * stat`, with the **unbiased** variance.
//! Eval uses the running statistics. Either way forward saves the per-channel mean and rstd it
//! used, so backward is the full batch-statistics gradient in training and a per-channel affine
//! map in eval. Per-channel sums run in parallel over channels (sums of each `H*W` block in f32
//! lanes, across blocks in f64), the elementwise pass in parallel over samples.
//! Workspace: `2 * C` (backward's per-channel sums).

use super::PAR_MIN;
use super::simd::{LANES, multiversion, sum_map, sum_zip};
use crate::error::Result;
use crate::layout::checked_numel;
use crate::nn_kernels::{bad_arg, check_len, checked_product};
use rayon::prelude::*;
use std::ops::Range;

/// Row groups of layer norm's backward (see `LayerNormSpec::groups`).
const ROW_GROUPS: usize = 8;

/// A validated layer norm: `rows` rows of `cols` normalised elements.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerNormSpec {
    pub(crate) shape: Vec<usize>,
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    pub(crate) eps: f32,
}

fn check_eps(op: &'static str, shape: &[usize], eps: f32) -> Result<()> {
    if eps.is_finite() && eps >= 0.0 {
        return Ok(());
    }
    Err(bad_arg(
        op,
        shape,
        format!("eps = {eps} must be finite and at least 0"),
    ))
}

/// An optional per-column (or per-channel) parameter's length check.
fn check_param(op: &'static str, what: &str, p: Option<usize>, want: usize) -> Result<()> {
    p.map_or(Ok(()), |len| check_len(op, what, len, want))
}

impl LayerNormSpec {
    /// Validates a layer norm of `input` over its trailing dims `normalized_shape` (non-empty,
    /// equal to the input's last dims) with `eps` finite and at least 0.
    pub fn new(input: &[usize], normalized_shape: &[usize], eps: f32) -> Result<Self> {
        const OP: &str = "layer_norm";
        checked_numel(OP, input)?;
        let k = normalized_shape.len();
        if k == 0 || k > input.len() || input[input.len() - k..] != *normalized_shape {
            return Err(bad_arg(
                OP,
                input,
                format!("normalized_shape {normalized_shape:?} must be the input's last dims"),
            ));
        }
        check_eps(OP, input, eps)?;
        let cols = normalized_shape.iter().product::<usize>();
        let rows = input[..input.len() - k].iter().product::<usize>();
        checked_product(OP, "the workspace", &[2, cols, ROW_GROUPS])?;
        Ok(LayerNormSpec {
            shape: input.to_vec(),
            rows,
            cols,
            eps,
        })
    }

    /// The output's shape: the input's.
    pub fn out_shape(&self) -> &[usize] {
        &self.shape
    }

    /// Rows (the length of the mean and rstd buffers).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Normalised elements per row (the length of weight and bias).
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Workspace of [`layer_norm_backward`] (the row groups' partial weight and bias
    /// gradients); forward needs none.
    pub fn workspace_elems(&self) -> usize {
        2 * self.cols * self.groups()
    }

    /// Groups of rows whose weight and bias gradients are summed apart, then added in order:
    /// a fixed number (not the thread count), so gradients are the same bits on any machine.
    fn groups(&self) -> usize {
        ROW_GROUPS.min(self.rows).max(1)
    }

    fn min_rows(&self) -> usize {
        (PAR_MIN / self.cols.max(1)).max(1)
    }
}

multiversion! {
    /// One row of layer norm: writes `y`, returns (mean, rstd).
    fn layer_norm_row(
        x: &[f32],
        w: Option<&[f32]>,
        b: Option<&[f32]>,
        eps: f32,
        y: &mut [f32],
    ) -> (f32, f32) {
        let n = x.len().max(1) as f32;
        let mean = sum_map(x, |v| v) / n;
        let var = sum_map(x, |v| (v - mean) * (v - mean)) / n;
        let rstd = 1.0 / (var + eps).sqrt();
        match (w, b) {
            (Some(w), Some(b)) => {
                for (((y, &x), &w), &b) in y.iter_mut().zip(x).zip(w).zip(b) {
                    *y = (x - mean) * rstd * w + b;
                }
            }
            (Some(w), None) => {
                for ((y, &x), &w) in y.iter_mut().zip(x).zip(w) {
                    *y = (x - mean) * rstd * w;
                }
            }
            (None, Some(b)) => {
                for ((y, &x), &b) in y.iter_mut().zip(x).zip(b) {
                    *y = (x - mean) * rstd + b;
                }
            }
            (None, None) => {
                for (y, &x) in y.iter_mut().zip(x) {
                    *y = (x - mean) * rstd;
                }
            }
        }
        (mean, rstd)
    }
}

/// `y = layer_norm(x) * weight + bias` for dense `x` (`rows x cols`), with each row's mean and
/// rstd written to `mean` and `rstd` (`rows` each).
pub fn layer_norm_forward(
    spec: &LayerNormSpec,
    x: &[f32],
    weight: Option<&[f32]>,
    bias: Option<&[f32]>,
    y: &mut [f32],
    mean: &mut [f32],
    rstd: &mut [f32],
) -> Result<()> {
    const OP: &str = "layer_norm";
    let s = spec;
    check_len(OP, "the input", x.len(), s.rows * s.cols)?;
    check_len(OP, "the output", y.len(), s.rows * s.cols)?;
    check_len(OP, "the mean", mean.len(), s.rows)?;
    check_len(OP, "the rstd", rstd.len(), s.rows)?;
    check_param(OP, "the weight", weight.map(<[f32]>::len), s.cols)?;
    check_param(OP, "the bias", bias.map(<[f32]>::len), s.cols)?;
    if s.rows == 0 {
        return Ok(());
    }
    if s.cols == 0 {
        mean.fill(0.0);
        rstd.fill(1.0 / s.eps.sqrt());
        return Ok(());
    }
    y.par_chunks_mut(s.cols)
        .zip(x.par_chunks(s.cols))
        .zip(mean.par_iter_mut().zip(rstd.par_iter_mut()))
        .with_min_len(s.min_rows())
        .for_each(|((y, x), (m, r))| (*m, *r) = layer_norm_row(x, weight, bias, s.eps, y));
    Ok(())
}

multiversion! {
    /// One row of layer norm's backward: writes `dx` when given, adds to `dw` and `db`.
    fn layer_norm_row_backward(
        x: &[f32],
        dy: &[f32],
        w: Option<&[f32]>,
        mean: f32,
        rstd: f32,
        dx: Option<&mut [f32]>,
        dw: &mut [f32],
        db: &mut [f32],
    ) {
        // Equal lengths up front, so the loops below carry no bounds checks.
        let len = x.len();
        let (dy, w) = (&dy[..len], w.map(|w| &w[..len]));
        let (dw, db) = (&mut dw[..len], &mut db[..len]);
        let dx = dx.map(|d| &mut d[..len]);
        let n = len.max(1) as f32;
        let ones = [1.0f32; LANES];
        // Pass 1: sum(g) and sum(g * (x - mean)) with g = dy * w, in lanes.
        let (mut sg, mut sgx) = ([0.0f32; LANES], [0.0f32; LANES]);
        let (mut tg, mut tgx) = (0.0f32, 0.0f32);
        let (xc, dc) = (x.chunks_exact(LANES), dy.chunks_exact(LANES));
        let tail = xc.remainder().len();
        for (i, (xs, ds)) in xc.zip(dc).enumerate() {
            let ws = w.map_or(&ones[..], |w| &w[i * LANES..][..LANES]);
            for l in 0..LANES {
                let g = ds[l] * ws[l];
                sg[l] += g;
                sgx[l] += g * (xs[l] - mean);
            }
        }
        let start = x.len() - tail;
        for i in start..x.len() {
            let g = dy[i] * w.map_or(1.0, |w| w[i]);
            tg += g;
            tgx += g * (x[i] - mean);
        }
        let mg = (tg + sg.iter().sum::<f32>()) / n;
        let mgx = (tgx + sgx.iter().sum::<f32>()) * rstd / n;
        // Pass 2: dx, dw, db.
        let (a, c) = (rstd * rstd * mgx, rstd * (mg - mean * rstd * mgx));
        // dx = rstd * g - rstd^2 * mgx * x - rstd * (mg - mean * rstd * mgx) = rstd*g - a*x - c
        match dx {
            Some(dx) => {
                for i in 0..x.len() {
                    let (xi, di) = (x[i], dy[i]);
                    let g = di * w.map_or(1.0, |w| w[i]);
                    dx[i] = rstd * g - a * xi - c;
                    dw[i] += di * (xi - mean) * rstd;
                    db[i] += di;
                }
            }
            None => {
                for i in 0..x.len() {
                    dw[i] += dy[i] * (x[i] - mean) * rstd;
                    db[i] += dy[i];
                }
            }
        }
    }
}

/// Gradients of [`layer_norm_forward`] given `dy`, the forward's `mean` and `rstd`: whichever
/// of `dx` (input-sized), `d_weight` and `d_bias` (`cols` each) are given, all overwritten.
/// `ws` holds at least one slot of `2 * cols`.
#[allow(clippy::too_many_arguments)]
pub fn layer_norm_backward(
    spec: &LayerNormSpec,
    x: &[f32],
    weight: Option<&[f32]>,
    mean: &[f32],
    rstd: &[f32],
    dy: &[f32],
    dx: Option<&mut [f32]>,
    d_weight: Option<&mut [f32]>,
    d_bias: Option<&mut [f32]>,
    ws: &mut [f32],
) -> Result<()> {
    const OP: &str = "layer_norm_backward";
    let s = spec;
    let numel = s.rows * s.cols;
    check_len(OP, "the input", x.len(), numel)?;
    check_len(OP, "the output gradient", dy.len(), numel)?;
    check_len(OP, "the mean", mean.len(), s.rows)?;
    check_len(OP, "the rstd", rstd.len(), s.rows)?;
    check_param(OP, "the weight", weight.map(<[f32]>::len), s.cols)?;
    check_param(
        OP,
        "the input gradient",
        dx.as_deref().map(<[f32]>::len),
        numel,
    )?;
    check_param(
        OP,
        "the weight gradient",
        d_weight.as_deref().map(<[f32]>::len),
        s.cols,
    )?;
    check_param(
        OP,
        "the bias gradient",
        d_bias.as_deref().map(<[f32]>::len),
        s.cols,
    )?;
    let slot_len = 2 * s.cols;
    let slots = s.groups();
    if ws.len() < slots * slot_len {
        return Err(bad_arg(
            OP,
            &[ws.len()],
            format!(
                "the workspace needs {} elements (see workspace_elems)",
                slots * slot_len
            ),
        ));
    }
    let per = s.rows.div_ceil(slots).max(1);
    let cols = s.cols.max(1);
    let mut tasks = Vec::with_capacity(slots);
    let mut dx_rest = dx;
    for (i, slot) in ws.chunks_mut(slot_len.max(1)).take(slots).enumerate() {
        let rows = (i * per).min(s.rows)..((i + 1) * per).min(s.rows);
        let mine = match dx_rest.take() {
            Some(rest) => {
                let (head, tail) = rest.split_at_mut(rows.len() * s.cols);
                dx_rest = Some(tail);
                Some(head)
            }
            None => None,
        };
        tasks.push((rows, mine, slot));
    }
    let run = |(rows, dx, slot): &mut (Range<usize>, Option<&mut [f32]>, &mut [f32])| {
        let (dw, db) = slot.split_at_mut(s.cols.min(slot.len()));
        dw.fill(0.0);
        db.fill(0.0);
        for (k, r) in rows.clone().enumerate() {
            let xr = &x[r * s.cols..][..s.cols];
            let dyr = &dy[r * s.cols..][..s.cols];
            let dxr = dx.as_deref_mut().map(|d| &mut d[k * cols..][..s.cols]);
            layer_norm_row_backward(xr, dyr, weight, mean[r], rstd[r], dxr, dw, db);
        }
    };
    // Few rows per task cost more in rayon than they compute: one thread then.
    if numel < PAR_MIN {
        tasks.iter_mut().for_each(run);
    } else {
        tasks.par_iter_mut().for_each(run);
    }
    for (out, offset) in [(d_weight, 0), (d_bias, s.cols)] {
        if let Some(out) = out {
            out.fill(0.0);
            for slot in ws.chunks(slot_len.max(1)).take(slots) {
                for (o, p) in out.iter_mut().zip(&slot[offset..offset + s.cols]) {
                    *o += p;
                }
            }
        }
    }
    Ok(())
}

/// Batch norm's mode: batch statistics (training) or running statistics (eval).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchNormMode {
    Train,
    Eval,
}

/// A validated batch norm over `[N, C, *]` (or `[N, C]`).
#[derive(Debug, Clone, PartialEq)]
pub struct BatchNormSpec {
    pub(crate) shape: Vec<usize>,
    pub(crate) n: usize,
    pub(crate) c: usize,
    pub(crate) spatial: usize,
    pub(crate) mode: BatchNormMode,
    pub(crate) momentum: f32,
    pub(crate) eps: f32,
}

/// The running statistics a batch norm reads (eval) or updates (training), `[C]` each.
#[derive(Debug)]
pub struct RunningStats<'a> {
    pub mean: &'a mut [f32],
    pub var: &'a mut [f32],
}

impl BatchNormSpec {
    /// Validates a batch norm of `input` `[N, C, *]` in `mode`, with `momentum` (PyTorch's
    /// default is 0.1) and `eps` finite (eps at least 0). Training needs more than one value
    /// per channel unless the input is empty (PyTorch's rule).
    pub fn new(input: &[usize], mode: BatchNormMode, momentum: f32, eps: f32) -> Result<Self> {
        const OP: &str = "batch_norm";
        checked_numel(OP, input)?;
        if input.len() < 2 {
            return Err(bad_arg(OP, input, "the input must be [N, C, *]".into()));
        }
        check_eps(OP, input, eps)?;
        if !momentum.is_finite() {
            return Err(bad_arg(
                OP,
                input,
                format!("momentum = {momentum} must be finite"),
            ));
        }
        let (n, c) = (input[0], input[1]);
        let spatial = input[2..].iter().product::<usize>();
        if mode == BatchNormMode::Train && n * spatial == 1 && c > 0 {
            return Err(bad_arg(
                OP,
                input,
                "training needs more than one value per channel".into(),
            ));
        }
        Ok(BatchNormSpec {
            shape: input.to_vec(),
            n,
            c,
            spatial,
            mode,
            momentum,
            eps,
        })
    }

    /// The output's shape: the input's.
    pub fn out_shape(&self) -> &[usize] {
        &self.shape
    }

    /// Channels (the length of weight, bias, running and saved statistics).
    pub fn channels(&self) -> usize {
        self.c
    }

    /// Workspace of [`batch_norm_backward`] (per-channel sums); forward needs none.
    pub fn workspace_elems(&self) -> usize {
        2 * self.c
    }

    fn numel(&self) -> usize {
        self.n * self.c * self.spatial
    }

    fn count(&self) -> usize {
        self.n * self.spatial
    }

    /// Samples per rayon task of the elementwise passes.
    fn min_samples(&self) -> usize {
        (PAR_MIN / (self.c * self.spatial).max(1)).max(1)
    }

    /// Channels per rayon task of the per-channel sums.
    fn min_channels(&self) -> usize {
        (PAR_MIN / self.count().max(1)).max(1)
    }

    /// Channel `ch`'s blocks of `spatial` elements in `x`, one per sample.
    fn blocks<'a>(&self, x: &'a [f32], ch: usize) -> impl Iterator<Item = &'a [f32]> + 'a {
        let (c, sp) = (self.c, self.spatial);
        (0..self.n).map(move |n| &x[(n * c + ch) * sp..][..sp])
    }
}

multiversion! {
    /// (sum, sum of squared deviations from `mean`) of one block, in f32 lanes.
    fn block_sums(x: &[f32], mean: f32) -> (f32, f32) {
        (sum_map(x, |v| v), sum_map(x, |v| (v - mean) * (v - mean)))
    }
}

multiversion! {
    /// (sum dy, sum dy * (x - mean)) of one block.
    fn block_grad_sums(x: &[f32], dy: &[f32], mean: f32) -> (f32, f32) {
        (sum_map(dy, |d| d), sum_zip(dy, x, |d, x| d * (x - mean)))
    }
}

/// Runs `f(channel, in_block, out_block)` over every sample's channel blocks, in parallel over
/// samples.
fn per_block(
    s: &BatchNormSpec,
    input: &[f32],
    out: &mut [f32],
    f: impl Fn(usize, &[f32], &mut [f32]) + Sync,
) {
    let sample = s.c * s.spatial;
    if sample == 0 || s.spatial == 0 {
        return;
    }
    out.par_chunks_mut(sample)
        .zip(input.par_chunks(sample))
        .with_min_len(s.min_samples())
        .for_each(|(o, i)| {
            for (ch, (o, i)) in o.chunks_mut(s.spatial).zip(i.chunks(s.spatial)).enumerate() {
                f(ch, i, o);
            }
        });
}

/// Batch norm of dense `x` `[N, C, *]` into `y`, with optional `weight` and `bias` `[C]`.
/// Training: batch statistics, `running` (if given) updated. Eval: `running` is required and
/// read. Either way `save_mean` and `save_rstd` (`[C]`) get the statistics used, for backward.
#[allow(clippy::too_many_arguments)]
pub fn batch_norm_forward(
    spec: &BatchNormSpec,
    x: &[f32],
    weight: Option<&[f32]>,
    bias: Option<&[f32]>,
    running: Option<RunningStats<'_>>,
    y: &mut [f32],
    save_mean: &mut [f32],
    save_rstd: &mut [f32],
) -> Result<()> {
    const OP: &str = "batch_norm";
    let s = spec;
    check_len(OP, "the input", x.len(), s.numel())?;
    check_len(OP, "the output", y.len(), s.numel())?;
    check_len(OP, "the saved mean", save_mean.len(), s.c)?;
    check_len(OP, "the saved rstd", save_rstd.len(), s.c)?;
    check_param(OP, "the weight", weight.map(<[f32]>::len), s.c)?;
    check_param(OP, "the bias", bias.map(<[f32]>::len), s.c)?;
    if let Some(r) = &running {
        check_len(OP, "the running mean", r.mean.len(), s.c)?;
        check_len(OP, "the running var", r.var.len(), s.c)?;
    }
    match (s.mode, running) {
        (BatchNormMode::Eval, None) => {
            return Err(bad_arg(
                OP,
                &[s.c],
                "eval mode needs the running statistics".into(),
            ));
        }
        (BatchNormMode::Eval, Some(r)) => {
            save_mean.copy_from_slice(r.mean);
            for (o, &v) in save_rstd.iter_mut().zip(r.var.iter()) {
                *o = 1.0 / (v + s.eps).sqrt();
            }
        }
        (BatchNormMode::Train, running) => {
            let count = s.count();
            if count == 0 {
                // Nothing to normalise: running statistics stay as they are.
                save_mean.fill(0.0);
                save_rstd.fill(1.0 / s.eps.sqrt());
                return Ok(());
            }
            save_mean
                .par_iter_mut()
                .zip(save_rstd.par_iter_mut())
                .enumerate()
                .with_min_len(s.min_channels())
                .for_each(|(ch, (m, r))| {
                    let total: f64 = s.blocks(x, ch).map(|b| block_sums(b, 0.0).0 as f64).sum();
                    let mean = (total / count as f64) as f32;
                    let sq: f64 = s.blocks(x, ch).map(|b| block_sums(b, mean).1 as f64).sum();
                    *m = mean;
                    // The biased variance for now; rstd below, once the running var has it.
                    *r = (sq / count as f64) as f32;
                });
            if let Some(r) = running {
                let m = s.momentum;
                let unbias = count as f32 / (count - 1).max(1) as f32;
                for ch in 0..s.c {
                    r.mean[ch] = (1.0 - m) * r.mean[ch] + m * save_mean[ch];
                    r.var[ch] = (1.0 - m) * r.var[ch] + m * save_rstd[ch] * unbias;
                }
            }
            for r in save_rstd.iter_mut() {
                *r = (1.0 / (*r as f64 + s.eps as f64).sqrt()) as f32;
            }
        }
    }
    let (mean, rstd): (&[f32], &[f32]) = (save_mean, save_rstd);
    per_block(s, x, y, |ch, x, y| {
        let scale = rstd[ch] * weight.map_or(1.0, |w| w[ch]);
        let shift = bias.map_or(0.0, |b| b[ch]) - mean[ch] * scale;
        for (y, &x) in y.iter_mut().zip(x) {
            *y = x * scale + shift;
        }
    });
    Ok(())
}

/// Gradients of [`batch_norm_forward`] from `dy` and the forward's `save_mean` / `save_rstd`:
/// whichever of `dx` (input-sized), `d_weight` and `d_bias` (`[C]`) are given, overwritten.
/// `ws` holds [`BatchNormSpec::workspace_elems`] elements.
#[allow(clippy::too_many_arguments)]
pub fn batch_norm_backward(
    spec: &BatchNormSpec,
    x: &[f32],
    weight: Option<&[f32]>,
    save_mean: &[f32],
    save_rstd: &[f32],
    dy: &[f32],
    dx: Option<&mut [f32]>,
    d_weight: Option<&mut [f32]>,
    d_bias: Option<&mut [f32]>,
    ws: &mut [f32],
) -> Result<()> {
    const OP: &str = "batch_norm_backward";
    let s = spec;
    check_len(OP, "the input", x.len(), s.numel())?;
    check_len(OP, "the output gradient", dy.len(), s.numel())?;
    check_len(OP, "the saved mean", save_mean.len(), s.c)?;
    check_len(OP, "the saved rstd", save_rstd.len(), s.c)?;
    check_param(OP, "the weight", weight.map(<[f32]>::len), s.c)?;
    check_param(
        OP,
        "the input gradient",
        dx.as_deref().map(<[f32]>::len),
        s.numel(),
    )?;
    check_param(
        OP,
        "the weight gradient",
        d_weight.as_deref().map(<[f32]>::len),
        s.c,
    )?;
    check_param(
        OP,
        "the bias gradient",
        d_bias.as_deref().map(<[f32]>::len),
        s.c,
    )?;
    if ws.len() < 2 * s.c {
        return Err(bad_arg(
            OP,
            &[ws.len()],
            format!("the workspace needs {} elements", 2 * s.c),
        ));
    }
    let (sum_dy, sum_dyx) = ws[..2 * s.c].split_at_mut(s.c);
    // Per channel: sum(dy) and sum(dy * xhat). No values per channel (an empty sample, or
    // none): the sums are 0, without a loop over N empty blocks per channel (N may be huge).
    sum_dy.fill(0.0);
    sum_dyx.fill(0.0);
    let sums = if s.count() == 0 { 0 } else { s.c };
    sum_dy[..sums]
        .par_iter_mut()
        .zip(sum_dyx[..sums].par_iter_mut())
        .enumerate()
        .with_min_len(s.min_channels())
        .for_each(|(ch, (sd, sdx))| {
            let (mut a, mut b) = (0.0f64, 0.0f64);
            for (xb, db) in s.blocks(x, ch).zip(s.blocks(dy, ch)) {
                let (p, q) = block_grad_sums(xb, db, save_mean[ch]);
                a += p as f64;
                b += q as f64;
            }
            *sd = a as f32;
            *sdx = (b * save_rstd[ch] as f64) as f32;
        });
    if let Some(db) = d_bias {
        db.copy_from_slice(sum_dy);
    }
    if let Some(dw) = d_weight {
        dw.copy_from_slice(sum_dyx);
    }
    let Some(dx) = dx else { return Ok(()) };
    let (sum_dy, sum_dyx): (&[f32], &[f32]) = (sum_dy, sum_dyx);
    let count = s.count().max(1) as f32;
    let train = s.mode == BatchNormMode::Train;
    // dx = k * (dy - [sum_dy / n + xhat * sum_dyx / n] in training), k = w * rstd; the bracket
    // is `dy * k - x * a - c` per channel with the constants folded below.
    per_block_grad(s, x, dy, dx, |ch| {
        let rstd = save_rstd[ch];
        let k = rstd * weight.map_or(1.0, |w| w[ch]);
        if !train {
            return (k, 0.0, 0.0);
        }
        let (m1, m2) = (sum_dy[ch] / count, sum_dyx[ch] / count);
        // dx = k*dy - k*m1 - k*m2*rstd*(x - mean) = k*dy + a*x + c
        let a = -k * m2 * rstd;
        (k, a, -k * m1 - a * save_mean[ch])
    });
    Ok(())
}

/// `dx = k * dy + a * x + c` per channel with `(k, a, c) = coef(channel)`, in parallel over
/// samples.
fn per_block_grad(
    s: &BatchNormSpec,
    x: &[f32],
    dy: &[f32],
    dx: &mut [f32],
    coef: impl Fn(usize) -> (f32, f32, f32) + Sync,
) {
    let sample = s.c * s.spatial;
    if sample == 0 {
        return;
    }
    dx.par_chunks_mut(sample)
        .zip(x.par_chunks(sample).zip(dy.par_chunks(sample)))
        .with_min_len(s.min_samples())
        .for_each(|(dx, (x, dy))| {
            let blocks = dx
                .chunks_mut(s.spatial)
                .zip(x.chunks(s.spatial).zip(dy.chunks(s.spatial)));
            for (ch, (dx, (x, dy))) in blocks.enumerate() {
                let (k, a, c) = coef(ch);
                for ((dx, &x), &dy) in dx.iter_mut().zip(x).zip(dy) {
                    *dx = k * dy + a * x + c;
                }
            }
        });
}
