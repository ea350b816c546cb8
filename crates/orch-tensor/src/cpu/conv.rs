//! 2-D convolution (`torch.nn.functional.conv2d`): NCHW input `[N, C, H, W]`, weight
//! `[O, C/groups, kh, kw]`, optional bias `[O]`, stride, zero padding, dilation and groups.
//!
//! Algorithm: per batch of up to 4 samples (wider products run faster), **im2col** writes the
//! samples' `[C*kh*kw, OH*OW]` column matrices side by side into a workspace slot, then one
//! gemm per group gives `out_g = W_g col_g`, copied back to the samples (plus bias). A 1x1
//! kernel with stride 1 and no padding skips im2col (the input is its own column matrix). With
//! stride and dilation 1 (the common case) each channel is zero-padded once into a plane of the
//! slot, so every column-matrix row is `OH` copies of `OW` contiguous values, and col2im adds
//! them up in that plane before copying its interior out (on CPUs with AVX-512, col2im instead
//! gathers each run of input gradients in registers and stores it once: `conv_avx512.rs`).
//! Backward, per batch: the output gradients side by side, im2col again,
//! `dW_g^T += col_g dY_g^T` into the partial weight gradient of the batch's group, then
//! `dcol_g = W_g^T dY_g` into the same column buffer and **col2im** scatters it into `d_input`.
//! Batches fall into at most 8 groups with their own partial weight and bias gradients, added
//! in order at the end, so gradients are the same bits whatever the thread count. Batches
//! (forward) and groups (backward) are rayon tasks scheduled dynamically (a core slowed by
//! other work takes fewer), each on its thread's workspace slot; each gemm is single-threaded
//! unless there is one slot only.
//!
//! Memory: per slot (thread), a batch's column matrices (`batch*C*kh*kw*OH*OW`, a batch kept
//! within 2 MiB of them), outputs (`batch*O*OH*OW`) and, with stride and dilation 1 and padding,
//! one padded plane (`(H+2ph)*(W+2pw)`), none for the 1x1 case; plus, for
//! backward, a weight-sized and a bias-sized partial gradient per group.

use super::simd::{multiversion, sum_map};
use super::slice_gemm::{Mat, sgemm};
use super::{as_uninit, assume_init};
use crate::error::{Result, TensorError};
use crate::layout::checked_numel;
use crate::nn_kernels::{bad_arg, check_len, checked_product, usable_slots, wanted_slots};
use crate::work::{self, Deadline};
use gemm::Parallelism;
use rayon::prelude::*;
use std::mem::MaybeUninit;
use std::sync::{Mutex, PoisonError};

const OP: &str = "conv2d";

/// Groups of batches with their own partial weight gradients (see `grad_groups`).
const GRAD_GROUPS: usize = 8;

/// Most samples in one gemm.
const SAMPLES_PER_GEMM: usize = 4;

/// Most column-matrix elements a batch may take (2 MiB of f32: about one core's L2).
const COL_BUDGET: usize = 1 << 19;

/// A validated 2-D convolution: shapes, stride, padding, dilation, groups.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conv2dSpec {
    pub(crate) n: usize,
    pub(crate) c: usize,
    pub(crate) h: usize,
    pub(crate) w: usize,
    pub(crate) o: usize,
    pub(crate) kh: usize,
    pub(crate) kw: usize,
    pub(crate) stride: [usize; 2],
    pub(crate) padding: [usize; 2],
    pub(crate) dilation: [usize; 2],
    pub(crate) groups: usize,
    pub(crate) bias: bool,
    pub(crate) oh: usize,
    pub(crate) ow: usize,
}

/// Output length of one spatial dimension, or why there is none.
fn out_len(
    size: usize,
    kernel: usize,
    stride: usize,
    pad: usize,
    dilation: usize,
) -> std::result::Result<usize, String> {
    let padded = pad
        .checked_mul(2)
        .and_then(|p| p.checked_add(size))
        .ok_or("padding overflows")?;
    let reach = (kernel - 1)
        .checked_mul(dilation)
        .and_then(|r| r.checked_add(1))
        .ok_or("dilated kernel overflows")?;
    if reach > padded {
        return Err(format!(
            "the kernel spans {reach} (dilation included) but the padded input is only {padded}"
        ));
    }
    Ok((padded - reach) / stride + 1)
}

impl Conv2dSpec {
    /// Validates a convolution of `input` `[N, C, H, W]` by `weight` `[O, C/groups, kh, kw]`,
    /// with a bias `[O]` when `bias` is given. `stride` and `dilation` are at least 1; `groups`
    /// divides both `C` and `O`; planes are not empty; the dilated kernel fits the padded input.
    pub fn new(
        input: &[usize],
        weight: &[usize],
        bias: Option<&[usize]>,
        stride: [usize; 2],
        padding: [usize; 2],
        dilation: [usize; 2],
        groups: usize,
    ) -> Result<Self> {
        let &[n, c, h, w] = input else {
            return Err(bad_arg(OP, input, "the input must be [N, C, H, W]".into()));
        };
        let &[o, cg, kh, kw] = weight else {
            return Err(bad_arg(
                OP,
                weight,
                "the weight must be [O, C/groups, kh, kw]".into(),
            ));
        };
        checked_numel(OP, input)?;
        checked_numel(OP, weight)?;
        if stride.contains(&0) || dilation.contains(&0) {
            return Err(bad_arg(
                OP,
                input,
                format!("stride {stride:?} and dilation {dilation:?} must be at least 1"),
            ));
        }
        if groups == 0 || c % groups != 0 || o % groups != 0 {
            return Err(bad_arg(
                OP,
                weight,
                format!("groups = {groups} must divide the {c} input and {o} output channels"),
            ));
        }
        if cg * groups != c {
            return Err(bad_arg(
                OP,
                weight,
                format!(
                    "the weight has {cg} input channels per group; {c} channels in {groups} groups need {}",
                    c / groups
                ),
            ));
        }
        if c == 0 || o == 0 {
            return Err(bad_arg(OP, weight, "no input or no output channels".into()));
        }
        if kh == 0 || kw == 0 {
            return Err(bad_arg(OP, weight, "the kernel is empty".into()));
        }
        // An empty plane has no value for a window to read, whatever padding would make of it
        // (pooling refuses empty planes alike).
        if h == 0 || w == 0 {
            return Err(bad_arg(
                OP,
                input,
                "the input planes are empty (H or W is 0); give each plane at least one element"
                    .into(),
            ));
        }
        if let Some(b) = bias
            && b != [o]
        {
            return Err(bad_arg(OP, b, format!("the bias must be [{o}]")));
        }
        let oh = out_len(h, kh, stride[0], padding[0], dilation[0]);
        let ow = out_len(w, kw, stride[1], padding[1], dilation[1]);
        let (oh, ow) = match (oh, ow) {
            (Ok(oh), Ok(ow)) => (oh, ow),
            (Err(why), _) | (_, Err(why)) => return Err(bad_arg(OP, input, why)),
        };
        let spec = Conv2dSpec {
            n,
            c,
            h,
            w,
            o,
            kh,
            kw,
            stride,
            padding,
            dilation,
            groups,
            bias: bias.is_some(),
            oh,
            ow,
        };
        checked_numel(OP, &spec.out_shape())?;
        spec.workspace_for(wanted_slots(n))?;
        Ok(spec)
    }

    /// `[N, O, OH, OW]`.
    pub fn out_shape(&self) -> [usize; 4] {
        [self.n, self.o, self.oh, self.ow]
    }

    /// Multiply-adds of the forward, known before it runs (backward does about twice as
    /// many): every output over its `C/groups * kh * kw` inputs.
    pub(crate) fn work(&self) -> u64 {
        work::product(&[
            self.n,
            self.o,
            self.oh,
            self.ow,
            self.c / self.groups.max(1),
        ])
        .saturating_mul(work::product(&[self.kh, self.kw]))
    }

    /// Multiply-adds of one batch of samples (one gemm per group) of the forward.
    fn batch_work(&self) -> u64 {
        work::product(&[self.batch(), self.o, self.oh, self.ow, self.group_k()])
    }

    /// f32 elements of workspace that [`conv2d_forward`] and [`conv2d_backward`] need for one
    /// slot per thread of the current rayon pool (either accepts fewer slots, at least one):
    /// backward's partial gradients of its batch groups, then the slots.
    pub fn workspace_elems(&self) -> usize {
        // new() checked this sum.
        self.workspace_for(wanted_slots(self.n)).unwrap_or(0)
    }

    fn workspace_for(&self, slots: usize) -> Result<usize> {
        self.slot_len()?
            .checked_mul(slots)
            .and_then(|v| v.checked_add(self.parts_len()))
            .filter(|&v| v <= crate::MAX_NUMEL)
            .ok_or_else(|| bad_arg(OP, &[self.o], "the workspace overflows".into()))
    }

    /// Batches of samples (one gemm each).
    fn batches(&self) -> usize {
        self.n.div_ceil(self.batch())
    }

    /// Groups of batches whose weight and bias gradients are summed apart, then added in
    /// order: a fixed number, so gradients are the same bits for any thread count.
    fn grad_groups(&self) -> usize {
        GRAD_GROUPS.min(self.batches()).max(1)
    }

    /// One group's partial weight and bias gradients.
    fn part_len(&self) -> usize {
        self.weight_len() + self.o
    }

    fn parts_len(&self) -> usize {
        self.grad_groups() * self.part_len()
    }

    fn direct(&self) -> bool {
        self.kh == 1 && self.kw == 1 && self.stride == [1, 1] && self.padding == [0, 0]
    }

    /// Samples whose column matrices sit side by side for one gemm (wider products run
    /// faster): up to [`SAMPLES_PER_GEMM`], within [`COL_BUDGET`] elements; 1 when direct.
    fn batch(&self) -> usize {
        if self.direct() {
            return 1;
        }
        let one = (self.c * self.kh * self.kw * self.oh * self.ow).max(1);
        SAMPLES_PER_GEMM.min(COL_BUDGET / one).min(self.n).max(1)
    }

    /// The column matrices of one batch (`C*kh*kw x batch*OH*OW`); none when direct.
    fn col_len(&self) -> usize {
        if self.direct() {
            0
        } else {
            self.batch() * self.c * self.kh * self.kw * self.oh * self.ow
        }
    }

    fn weight_len(&self) -> usize {
        self.o * (self.c / self.groups) * self.kh * self.kw
    }

    /// One slot: a batch's column matrices, its output matrix and (unit stride and dilation
    /// with padding) one zero-padded input plane.
    fn slot_len(&self) -> Result<usize> {
        let one = checked_product(OP, "the column matrix", &[self.c, self.kh, self.kw])?;
        let one = checked_product(OP, "the column matrix", &[one, self.oh, self.ow])?;
        let tmp = checked_product(OP, "the output matrix", &[self.o, self.oh, self.ow])?;
        Ok(if self.direct() {
            0
        } else {
            one.checked_add(tmp)
                .and_then(|v| v.checked_mul(self.batch()))
                .and_then(|v| v.checked_add(self.padded_len()?))
                .filter(|&v| v <= crate::MAX_NUMEL)
                .ok_or_else(|| bad_arg(OP, &[self.o], "the workspace overflows".into()))?
        })
    }

    /// Stride 1 and dilation 1: every column-matrix row is `OH` runs of `OW` contiguous
    /// values of the (padded) input plane.
    fn unit(&self) -> bool {
        self.stride == [1, 1] && self.dilation == [1, 1]
    }

    /// The padded plane's rows and columns (`H + 2*ph`, `W + 2*pw`).
    fn padded_dims(&self) -> (usize, usize) {
        (self.h + 2 * self.padding[0], self.w + 2 * self.padding[1])
    }

    /// Elements of the zero-padded plane a slot keeps for the unit path (none otherwise), or
    /// `None` on overflow.
    pub(super) fn padded_len(&self) -> Option<usize> {
        if !self.unit() || self.padding == [0, 0] {
            return Some(0);
        }
        let hp = self.padding[0].checked_mul(2)?.checked_add(self.h)?;
        let wp = self.padding[1].checked_mul(2)?.checked_add(self.w)?;
        hp.checked_mul(wp)
    }

    /// A slot as (column matrices, output matrix, padded plane).
    fn slot_parts<'a>(&self, slot: &'a mut [f32]) -> (&'a mut [f32], &'a mut [f32], &'a mut [f32]) {
        let (col, rest) = slot.split_at_mut(self.col_len());
        let tmp = if self.direct() {
            0
        } else {
            self.batch() * self.out_len()
        };
        // new() checked padded_len.
        let (tmp, rest) = rest.split_at_mut(tmp);
        (col, tmp, &mut rest[..self.padded_len().unwrap_or(0)])
    }

    fn in_len(&self) -> usize {
        self.c * self.h * self.w
    }

    fn spatial(&self) -> usize {
        self.oh * self.ow
    }

    fn out_len(&self) -> usize {
        self.o * self.spatial()
    }

    /// Rows of one group's column matrix (`C/groups * kh * kw`).
    fn group_k(&self) -> usize {
        self.c / self.groups * self.kh * self.kw
    }

    fn check_common(&self, x: &[f32], weight: &[f32]) -> Result<()> {
        check_len(OP, "the input", x.len(), self.n * self.in_len())?;
        check_len(OP, "the weight", weight.len(), self.weight_len())
    }
}

/// For kernel offset `off` (already dilated) along a dimension: the output positions whose
/// input index `pos * stride + off - pad` lies in `0..size`, as a range `lo..hi`.
fn valid_range(
    out: usize,
    size: usize,
    stride: usize,
    off: usize,
    pad: usize,
) -> std::ops::Range<usize> {
    let lo = if pad > off {
        (pad - off).div_ceil(stride)
    } else {
        0
    };
    let hi = if size + pad > off {
        (size + pad - off).div_ceil(stride)
    } else {
        0
    };
    lo.min(out)..hi.clamp(lo.min(out), out)
}

/// Calls `f(col_row, channel_plane_offset, row_offset_in_col, ...)` for every (channel, ki, kj)
/// row of the column matrix: shared by im2col and col2im. `f(c, i, j, row)` with `row` the
/// index of the column-matrix row.
fn for_each_col_row(s: &Conv2dSpec, mut f: impl FnMut(usize, usize, usize, usize)) {
    for c in 0..s.c {
        for i in 0..s.kh {
            for j in 0..s.kw {
                f(c, i, j, (c * s.kh + i) * s.kw + j);
            }
        }
    }
}

/// Copies `src` into `dst` (the same length) in runs of 8, the last run overlapping the one
/// before it: short rows without a `memcpy` call each.
#[inline(always)]
fn copy_run(dst: &mut [f32], src: &[f32]) {
    let n = dst.len();
    if n < 8 {
        dst.copy_from_slice(src);
        return;
    }
    let mut k = 0;
    while k + 8 <= n {
        dst[k..k + 8].copy_from_slice(&src[k..k + 8]);
        k += 8;
    }
    if k < n {
        dst[n - 8..].copy_from_slice(&src[n - 8..]);
    }
}

/// `dst += src` (the same length) in runs of 8, then 4, then single elements: short rows as
/// whole vectors where a plain loop would leave most of a row to its scalar remainder.
#[inline(always)]
fn add_run(dst: &mut [f32], src: &[f32]) {
    #[inline(always)]
    fn add<const N: usize>(d: &mut [f32], s: &[f32]) {
        for (v, g) in d[..N].iter_mut().zip(&s[..N]) {
            *v += g;
        }
    }
    let (n, mut k) = (dst.len().min(src.len()), 0);
    while k + 8 <= n {
        add::<8>(&mut dst[k..], &src[k..]);
        k += 8;
    }
    if k + 4 <= n {
        add::<4>(&mut dst[k..], &src[k..]);
        k += 4;
    }
    for (v, g) in dst[k..n].iter_mut().zip(&src[k..n]) {
        *v += g;
    }
}

/// The plane of `x` at `c`, zero-padded into `padded` (`Hp x Wp`, its border already zero)
/// when there is padding, with its row length.
#[inline(always)]
fn padded_plane<'a>(
    s: &Conv2dSpec,
    x: &'a [f32],
    c: usize,
    padded: &'a mut [f32],
) -> (&'a [f32], usize) {
    let plane = &x[c * s.h * s.w..][..s.h * s.w];
    if s.padding == [0, 0] {
        return (plane, s.w);
    }
    let [ph, pw] = s.padding;
    let (_, wp) = s.padded_dims();
    for (ih, row) in plane.chunks_exact(s.w).enumerate() {
        copy_run(&mut padded[(ih + ph) * wp + pw..][..s.w], row);
    }
    (padded, wp)
}

/// [`im2col`] for stride 1 and dilation 1: each channel padded once into `padded`, then every
/// row of the column matrix is `OH` copies of `OW` contiguous values.
#[inline(always)]
fn im2col_unit(
    s: &Conv2dSpec,
    x: &[f32],
    col: &mut [f32],
    ld: usize,
    off: usize,
    padded: &mut [f32],
) {
    let (l, ow) = (s.spatial(), s.ow);
    padded.fill(0.0);
    for c in 0..s.c {
        let (src, wp) = padded_plane(s, x, c, padded);
        for i in 0..s.kh {
            for j in 0..s.kw {
                let row = (c * s.kh + i) * s.kw + j;
                let dst = &mut col[row * ld + off..][..l];
                for (oh, d) in dst.chunks_exact_mut(ow).enumerate() {
                    copy_run(d, &src[(oh + i) * wp + j..][..ow]);
                }
            }
        }
    }
}

/// [`col2im`] for stride 1 and dilation 1: each channel's sums gathered in the padded plane
/// `padded` (none without padding: straight into `dx`), then its interior copied out.
#[inline(always)]
pub(super) fn col2im_unit(
    s: &Conv2dSpec,
    col: &[f32],
    ld: usize,
    off: usize,
    dx: &mut [f32],
    padded: &mut [f32],
) {
    let (l, ow) = (s.spatial(), s.ow);
    let [ph, pw] = s.padding;
    let (_, wp) = s.padded_dims();
    for (c, plane) in dx.chunks_exact_mut(s.h * s.w).enumerate() {
        let acc: &mut [f32] = if s.padding == [0, 0] {
            &mut *plane
        } else {
            &mut *padded
        };
        acc.fill(0.0);
        for i in 0..s.kh {
            for j in 0..s.kw {
                let row = (c * s.kh + i) * s.kw + j;
                let src = &col[row * ld + off..][..l];
                for (oh, g) in src.chunks_exact(ow).enumerate() {
                    add_run(&mut acc[(oh + i) * wp + j..][..ow], g);
                }
            }
        }
        if s.padding != [0, 0] {
            for (ih, row) in plane.chunks_exact_mut(s.w).enumerate() {
                copy_run(row, &padded[(ih + ph) * wp + pw..][..s.w]);
            }
        }
    }
}

multiversion! {
/// Writes the column matrix of one sample `x` (`[C, H, W]`) into `col` (`[C*kh*kw, OH*OW]`),
/// at column `off` of a matrix with row stride `ld`; `padded` is the slot's padded plane.
fn im2col(s: &Conv2dSpec, x: &[f32], col: &mut [f32], ld: usize, off: usize, padded: &mut [f32]) {
    if s.unit() {
        return im2col_unit(s, x, col, ld, off, padded);
    }
    let (l, ow) = (s.spatial(), s.ow);
    let [sh, sw] = s.stride;
    let [ph, pw] = s.padding;
    let [dh, dw] = s.dilation;
    for_each_col_row(s, |c, i, j, row| {
        let dst = &mut col[row * ld + off..][..l];
        let plane = &x[c * s.h * s.w..][..s.h * s.w];
        let rows = valid_range(s.oh, s.h, sh, i * dh, ph);
        let cols = valid_range(ow, s.w, sw, j * dw, pw);
        dst[..rows.start * ow].fill(0.0);
        dst[rows.end * ow..].fill(0.0);
        for oh in rows {
            let ih = oh * sh + i * dh - ph;
            let src = &plane[ih * s.w..][..s.w];
            let d = &mut dst[oh * ow..][..ow];
            d[..cols.start].fill(0.0);
            d[cols.end..].fill(0.0);
            if cols.is_empty() {
                continue;
            }
            let first = cols.start * sw + j * dw - pw;
            if sw == 1 {
                d[cols.clone()].copy_from_slice(&src[first..first + cols.len()]);
            } else {
                for (k, v) in d[cols.clone()].iter_mut().enumerate() {
                    *v = src[first + k * sw];
                }
            }
        }
    });
}
}

multiversion! {
/// Writes the input gradient `dx` (`[C, H, W]`) of one sample from the column matrix at
/// column `off` of `col` (row stride `ld`), adding up overlapping windows.
fn col2im(s: &Conv2dSpec, col: &[f32], ld: usize, off: usize, dx: &mut [f32], padded: &mut [f32]) {
    if s.unit() {
        #[cfg(target_arch = "x86_64")]
        if super::conv_avx512::available() {
            // SAFETY: the CPU has AVX-512F (checked above).
            return unsafe { super::conv_avx512::col2im_unit(s, col, ld, off, dx) };
        }
        return col2im_unit(s, col, ld, off, dx, padded);
    }
    let (l, ow) = (s.spatial(), s.ow);
    let [sh, sw] = s.stride;
    let [ph, pw] = s.padding;
    let [dh, dw] = s.dilation;
    dx.fill(0.0);
    for_each_col_row(s, |c, i, j, row| {
        let src = &col[row * ld + off..][..l];
        let plane = &mut dx[c * s.h * s.w..][..s.h * s.w];
        let cols = valid_range(ow, s.w, sw, j * dw, pw);
        if cols.is_empty() {
            return;
        }
        for oh in valid_range(s.oh, s.h, sh, i * dh, ph) {
            let ih = oh * sh + i * dh - ph;
            let d = &mut plane[ih * s.w..][..s.w];
            let first = cols.start * sw + j * dw - pw;
            let from = &src[oh * ow + cols.start..oh * ow + cols.end];
            if sw == 1 {
                for (v, g) in d[first..first + cols.len()].iter_mut().zip(from) {
                    *v += g;
                }
            } else {
                for (k, g) in from.iter().enumerate() {
                    d[first + k * sw] += g;
                }
            }
        }
    });
}
}

fn gemm_par(slots: usize) -> Parallelism {
    if slots == 1 && rayon::current_num_threads() > 1 {
        Parallelism::Rayon(0)
    } else {
        Parallelism::None
    }
}

/// Runs `f` on the workspace slot of the current rayon thread. Tasks run on their thread
/// from start to end (their products are single-threaded, so a thread never takes up another
/// task inside one), hence each slot is uncontended when there is one per thread; with fewer
/// slots than threads the lock makes threads sharing a slot take turns.
fn with_slot<R>(slots: &[Mutex<&mut [f32]>], f: impl FnOnce(&mut [f32]) -> R) -> R {
    let i = rayon::current_thread_index().unwrap_or(0) % slots.len();
    let mut slot = slots[i].lock().unwrap_or_else(PoisonError::into_inner);
    f(&mut slot)
}

/// `out = conv2d(x, weight) + bias` for dense `x` `[N, C, H, W]`, `weight`, `bias` `[O]` and
/// `out` `[N, O, OH, OW]` (see [`Conv2dSpec::out_shape`]); `ws` holds at least one slot
/// (see [`Conv2dSpec::workspace_elems`]).
pub fn conv2d_forward(
    spec: &Conv2dSpec,
    x: &[f32],
    weight: &[f32],
    bias: Option<&[f32]>,
    out: &mut [f32],
    ws: &mut [f32],
) -> Result<()> {
    // SAFETY: conv2d_forward_uninit writes only computed values.
    conv2d_forward_uninit(spec, x, weight, bias, unsafe { as_uninit(out) }, ws)
}

/// [`conv2d_forward`] into an output that need not be initialised: on `Ok` every element of
/// `out` is written. The workspace's contents do not matter either (each slot is written before
/// it is read).
pub(crate) fn conv2d_forward_uninit(
    spec: &Conv2dSpec,
    x: &[f32],
    weight: &[f32],
    bias: Option<&[f32]>,
    out: &mut [MaybeUninit<f32>],
    ws: &mut [f32],
) -> Result<()> {
    let s = spec;
    s.check_common(x, weight)?;
    check_len(OP, "the output", out.len(), s.n * s.out_len())?;
    match bias {
        Some(b) if s.bias => check_len(OP, "the bias", b.len(), s.o)?,
        None if !s.bias => {}
        _ => {
            return Err(bad_arg(
                OP,
                &[s.o],
                "bias given or missing against the spec".into(),
            ));
        }
    }
    if s.n == 0 || s.out_len() == 0 {
        return Ok(());
    }
    let slot_len = s.slot_len()?;
    let slots = usable_slots(OP, ws.len(), slot_len, s.n)?;
    let (l, og, kg, batch) = (s.spatial(), s.o / s.groups, s.group_k(), s.batch());
    admit_used_threads(s, slots, 1)?;
    let deadline = Deadline::current();
    // Output channels per gemm call: all of a group's, or under a deadline blocks of about
    // PART_WORK multiply-adds, the clock looked at between them.
    let rows_per = |ld: usize| match deadline.is_set() {
        true => match usize::try_from(PART_WORK / work::product(&[kg, ld]).max(1)) {
            // Whole multiples of 16 channels where there are that many.
            Ok(rows) if rows < og && rows >= 16 => rows / 16 * 16,
            Ok(rows) => rows.clamp(1, og.max(1)),
            Err(_) => og.max(1),
        },
        false => og.max(1),
    };
    // One batch of samples: `y` and `xs` hold its outputs and inputs.
    let run = |y: &mut [MaybeUninit<f32>],
               xs: &[f32],
               slot: &mut [f32],
               par: Parallelism,
               meter: &mut work::Meter|
     -> Result<()> {
        if s.direct() {
            // One sample, its own column matrix, added straight into `y` set to the bias.
            for (o, row) in y.chunks_mut(l).enumerate() {
                row.fill(MaybeUninit::new(bias.map_or(0.0, |b| b[o])));
            }
            // SAFETY: every element of `y` was written just above.
            let y = unsafe { assume_init(y) };
            let per = rows_per(l);
            for g in 0..s.groups {
                for r0 in (0..og).step_by(per) {
                    let rows = per.min(og - r0);
                    let o0 = g * og + r0;
                    sgemm(
                        &mut y[o0 * l..(o0 + rows) * l],
                        l,
                        Mat::rows(&weight[o0 * kg..], rows, kg),
                        Mat::rows(&xs[g * kg * l..], kg, l),
                        1.0,
                        true,
                        par,
                    );
                    meter.add(work::product(&[rows, kg, l]))?;
                }
            }
            return Ok(());
        }
        let (col, tmp, padded) = s.slot_parts(slot);
        let nb = xs.len() / s.in_len();
        let ld = nb * l;
        for (b, xb) in xs.chunks(s.in_len()).enumerate() {
            im2col(s, xb, col, ld, b * l, padded);
        }
        let per = rows_per(ld);
        for g in 0..s.groups {
            for r0 in (0..og).step_by(per) {
                let rows = per.min(og - r0);
                let o0 = g * og + r0;
                sgemm(
                    &mut tmp[o0 * ld..(o0 + rows) * ld],
                    ld,
                    Mat::rows(&weight[o0 * kg..], rows, kg),
                    Mat::rows(&col[g * kg * ld..], kg, ld),
                    1.0,
                    false,
                    par,
                );
                meter.add(work::product(&[rows, kg, ld]))?;
            }
        }
        // The batch's `O x nb*L` product back to `nb` samples of `O x L`, plus bias.
        for (b, yb) in y.chunks_mut(s.out_len()).enumerate() {
            for (o, row) in yb.chunks_mut(l).enumerate() {
                let src = &tmp[o * ld + b * l..][..l];
                let bv = bias.map_or(0.0, |bias| bias[o]);
                for (d, &v) in row.iter_mut().zip(src) {
                    d.write(v + bv);
                }
            }
        }
        Ok(())
    };
    let (out_batch, in_batch) = (batch * s.out_len(), batch * s.in_len());
    let batch_work = s.batch_work();
    if slots == 1 {
        let slot = &mut ws[..slot_len];
        let mut meter = deadline.meter(OP);
        for (y, xs) in out.chunks_mut(out_batch).zip(x.chunks(in_batch)) {
            meter.add(batch_work)?;
            run(y, xs, slot, gemm_par(1), &mut meter)?;
        }
        Ok(())
    } else {
        let locks = split_slots(ws, slot_len, slots);
        out.par_chunks_mut(out_batch)
            .zip(x.par_chunks(in_batch))
            .try_for_each_init(
                || deadline.meter(OP),
                |meter, (y, xs)| {
                    meter.add(batch_work)?;
                    with_slot(&locks, |slot| run(y, xs, slot, Parallelism::None, meter))
                },
            )
    }
}

/// Multiply-adds of one part of a forward gemm call under a deadline (a block of output
/// channels): ten to twenty milliseconds of a core.
const PART_WORK: u64 = 1 << 30;

/// Refuses a conv2d (its products `times` over) whose work cannot be done before the deadline
/// on the threads it will really use: the pool's when one slot runs gemm's own threads, else
/// one per slot and batch of samples, each product single-threaded (the op's admission
/// assumed every thread of the pool).
fn admit_used_threads(s: &Conv2dSpec, slots: usize, times: u64) -> Result<()> {
    let threads = rayon::current_num_threads();
    let used = match slots {
        1 => threads,
        _ => slots.min(s.n.div_ceil(s.batch())).min(threads),
    };
    let batches = s.n.div_ceil(s.batch()) as u64;
    let work = s.batch_work().saturating_mul(batches).saturating_mul(times);
    work::admit_threads(OP, work::Kind::MultiplyAdds, work, used)
}

/// The workspace as `slots` locked slots of `len` (empty ones when `len` is 0).
fn split_slots(ws: &mut [f32], len: usize, slots: usize) -> Vec<Mutex<&mut [f32]>> {
    if len == 0 {
        return (0..slots).map(|_| Mutex::new(Default::default())).collect();
    }
    ws.chunks_mut(len).take(slots).map(Mutex::new).collect()
}

/// Gradients of [`conv2d_forward`] given `d_out` `[N, O, OH, OW]`: whichever of `d_input`
/// (`[N, C, H, W]`, overwritten), `d_weight` (weight-sized, overwritten) and `d_bias` (`[O]`,
/// overwritten) are given. `ws` holds at least one slot.
#[allow(clippy::too_many_arguments)]
pub fn conv2d_backward(
    spec: &Conv2dSpec,
    x: &[f32],
    weight: &[f32],
    d_out: &[f32],
    d_input: Option<&mut [f32]>,
    d_weight: Option<&mut [f32]>,
    d_bias: Option<&mut [f32]>,
    ws: &mut [f32],
) -> Result<()> {
    let s = spec;
    s.check_common(x, weight)?;
    check_len(OP, "the output gradient", d_out.len(), s.n * s.out_len())?;
    if let Some(dx) = d_input.as_deref() {
        check_len(OP, "the input gradient", dx.len(), s.n * s.in_len())?;
    }
    if let Some(dw) = d_weight.as_deref() {
        check_len(OP, "the weight gradient", dw.len(), s.weight_len())?;
    }
    if let Some(db) = d_bias.as_deref() {
        check_len(OP, "the bias gradient", db.len(), s.o)?;
    }
    let (parts_len, part_len) = (s.parts_len(), s.part_len());
    if ws.len() < parts_len {
        return Err(bad_arg(
            OP,
            &[ws.len()],
            format!(
                "the workspace holds {} elements; at least {} are needed",
                ws.len(),
                parts_len
            ),
        ));
    }
    let (parts, ws) = ws.split_at_mut(parts_len);
    parts.fill(0.0);
    let slot_len = s.slot_len()?;
    let slots = usable_slots(OP, ws.len(), slot_len, s.n)?;
    let (l, og, kg, batch) = (s.spatial(), s.o / s.groups, s.group_k(), s.batch());
    // Backward does about twice forward's products.
    admit_used_threads(s, slots, 2)?;
    let (want_dw, want_db) = (d_weight.is_some(), d_bias.is_some());
    let w_len = s.weight_len();
    // One batch: its index, its input gradients, a slot, its group's partial gradients.
    let run = |bi: usize, dx: Option<&mut [f32]>, slot: &mut [f32], part: &mut [f32], par| {
        let (col, tmp, padded) = s.slot_parts(slot);
        let (dw, db) = part.split_at_mut(w_len);
        let first = bi * batch;
        let nb = batch.min(s.n - first);
        let ld = nb * l;
        let xs = &x[first * s.in_len()..][..nb * s.in_len()];
        let dys = &d_out[first * s.out_len()..][..nb * s.out_len()];
        // The batch's output gradients as one `O x nb*L` matrix.
        let dyb: &[f32] = if s.direct() {
            dys
        } else {
            for (b, dyb) in dys.chunks(s.out_len()).enumerate() {
                for (o, row) in dyb.chunks(l).enumerate() {
                    tmp[o * ld + b * l..][..l].copy_from_slice(row);
                }
            }
            tmp
        };
        if want_dw {
            let cols: &[f32] = if s.direct() {
                xs
            } else {
                for (b, xb) in xs.chunks(s.in_len()).enumerate() {
                    im2col(s, xb, col, ld, b * l, padded);
                }
                col
            };
            // The slot's partial is dW^T per group (`kg x og`): the column matrix is then the
            // left operand with its contraction dim contiguous (measured faster).
            for g in 0..s.groups {
                sgemm(
                    &mut dw[g * og * kg..(g + 1) * og * kg],
                    og,
                    Mat::rows(&cols[g * kg * ld..], kg, ld),
                    Mat::rows(&dyb[g * og * ld..], og, ld).t(),
                    1.0,
                    true,
                    par,
                );
            }
        }
        if want_db {
            for dy in dys.chunks(s.out_len()) {
                for (b, row) in db.iter_mut().zip(dy.chunks(l)) {
                    *b += sum_map(row, |v| v);
                }
            }
        }
        if let Some(dxs) = dx {
            // dcol = W^T dY, straight into dx when the input is its own column matrix.
            let dcol: &mut [f32] = if s.direct() { dxs } else { col };
            for g in 0..s.groups {
                sgemm(
                    &mut dcol[g * kg * ld..(g + 1) * kg * ld],
                    ld,
                    Mat::rows(&weight[g * og * kg..], og, kg).t(),
                    Mat::rows(&dyb[g * og * ld..], og, ld),
                    1.0,
                    false,
                    par,
                );
            }
            if !s.direct() {
                for (b, dxb) in dxs.chunks_mut(s.in_len()).enumerate() {
                    col2im(s, col, ld, b * l, dxb, padded);
                }
            }
        }
    };
    let n_batches = s.batches();
    let per_group = n_batches.div_ceil(s.grad_groups());
    let mut dx_batches: Vec<Option<&mut [f32]>> = match d_input {
        Some(dx) if s.in_len() > 0 => dx.chunks_mut(batch * s.in_len()).map(Some).collect(),
        _ => (0..n_batches).map(|_| None).collect(),
    };
    // Each group: its partial gradients and its batches' input gradients, in batch order.
    // (first batch, partial gradients, the batches' input gradients)
    type Group<'a> = (usize, &'a mut [f32], Vec<Option<&'a mut [f32]>>);
    let mut groups: Vec<Group<'_>> = Vec::new();
    for (g, part) in parts.chunks_mut(part_len).enumerate() {
        let take = per_group.min(dx_batches.len());
        let rest = dx_batches.split_off(take);
        groups.push((
            g * per_group,
            part,
            std::mem::replace(&mut dx_batches, rest),
        ));
    }
    let deadline = Deadline::current();
    // Backward does about twice forward's products.
    let batch_work = s.batch_work().saturating_mul(2);
    let run_group = |(first, part, dxs): Group<'_>, slot: &mut [f32], par: Parallelism| {
        let mut meter = deadline.meter(OP);
        for (k, dx) in dxs.into_iter().enumerate() {
            meter.add(batch_work)?;
            run(first + k, dx, slot, part, par);
        }
        Ok::<(), TensorError>(())
    };
    if slots == 1 {
        let slot = &mut ws[..slot_len];
        for group in groups {
            run_group(group, slot, gemm_par(1))?;
        }
    } else {
        let locks = split_slots(ws, slot_len, slots);
        groups.into_par_iter().try_for_each(|group| {
            with_slot(&locks, |slot| run_group(group, slot, Parallelism::None))
        })?;
    }
    // Sum the groups' partial gradients, in order.
    if let Some(dw) = d_weight {
        dw.fill(0.0);
        for part in parts.chunks(part_len) {
            for (dw, part) in dw.chunks_mut(og * kg).zip(part[..w_len].chunks(og * kg)) {
                // `part` is this group's dW^T, kg x og.
                for (o, row) in dw.chunks_mut(kg).enumerate() {
                    for (k, d) in row.iter_mut().enumerate() {
                        *d += part[k * og + o];
                    }
                }
            }
        }
    }
    if let Some(db) = d_bias {
        db.fill(0.0);
        for part in parts.chunks(part_len) {
            for (d, p) in db.iter_mut().zip(&part[w_len..]) {
                *d += p;
            }
        }
    }
    Ok(())
}
