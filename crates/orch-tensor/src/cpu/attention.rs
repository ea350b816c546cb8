//! Fused scaled-dot-product attention (`F.scaled_dot_product_attention`): `q` `[B, H, T, D]`,
//! `k` `[B, H, S, D]`, `v` `[B, H, S, Dv]`, output `[B, H, T, Dv]`; scores
//! `q k^T * scale (+ additive mask)` with `scale = 1/sqrt(D)` by default, a boolean mask
//! (nonzero = attend) and / or a causal mask (query `i` sees keys `j <= i`, PyTorch's top-left
//! `is_causal`; here both may be combined).
//!
//! Forward is FlashAttention's: per head, query blocks of up to [`BLOCK_Q`] rows walk key
//! blocks of up to [`BLOCK_K`] columns (blocks above a causal diagonal are skipped); each score
//! block comes from one gemm, an **online softmax** keeps each row's running maximum and sum and
//! rescales the output rows, which accumulate `P V` by gemm. Only the per-row logsumexp is saved.
//! Backward is FlashAttention-2's: `D_i = rowsum(dO * O)`, then per block the scores are
//! recomputed, `P = exp(S - lse)`, `dV += P^T dO`, `dP = dO V^T`, `dS = P * (dP - D) * scale`,
//! `dQ += dS K`, `dK += dS^T Q`. A row that attends to nothing (all masked) outputs zeros with
//! logsumexp `-inf` and passes no gradient (PyTorch >= 2.5's math kernel gives zeros too).
//! Heads run in parallel, split into one contiguous run per slot.
//!
//! Memory: never more than one `BLOCK_Q x BLOCK_K` score block (two in backward) per slot:
//! forward `bq*bk + 2*bq`, backward `2*bq*bk + bq` elements per slot, whatever `T` and `S`.

use super::simd::{exp_nonpositive, max, multiversion, sum_zip};
use super::slice_gemm::{Mat, sgemm};
use crate::error::{Result, TensorError};
use crate::layout::{checked_numel, contiguous_strides};
use crate::nn_kernels::{bad_arg, check_len, usable_slots, wanted_slots};
use crate::work::{self, Deadline, Meter};
use gemm::Parallelism;
use rayon::prelude::*;
use std::ops::Range;

/// Query rows per block.
pub const BLOCK_Q: usize = 64;
/// Key columns per block.
pub const BLOCK_K: usize = 64;

const OP: &str = "scaled_dot_product_attention";

/// How a mask's values act on the scores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MaskKind {
    /// Added to the scaled scores (`-inf` masks out).
    Additive,
    /// Nonzero attends, zero masks out (PyTorch's boolean `True` / `False`).
    Boolean,
}

/// A mask's kind and its shape, broadcastable to `[B, H, T, S]` (e.g. `[T, S]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttentionMask<'a> {
    pub kind: MaskKind,
    pub shape: &'a [usize],
}

/// A mask broadcast to `[B, H, T, S]`: element strides (0 where broadcast) and data length.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct MaskLayout {
    pub(crate) kind: MaskKind,
    pub(crate) strides: [usize; 4],
    pub(crate) len: usize,
}

/// A validated attention call.
#[derive(Debug, Clone, PartialEq)]
pub struct AttentionSpec {
    pub(crate) b: usize,
    pub(crate) h: usize,
    pub(crate) t: usize,
    pub(crate) s: usize,
    pub(crate) d: usize,
    pub(crate) dv: usize,
    pub(crate) scale: f32,
    pub(crate) causal: bool,
    pub(crate) mask: Option<MaskLayout>,
}

impl AttentionSpec {
    /// Validates attention of `q` `[B, H, T, D]` over `k` `[B, H, S, D]` and `v`
    /// `[B, H, S, Dv]`, with a causal mask and / or `mask`, and `scale` (finite) or `1/sqrt(D)`.
    pub fn new(
        q: &[usize],
        k: &[usize],
        v: &[usize],
        causal: bool,
        mask: Option<AttentionMask<'_>>,
        scale: Option<f32>,
    ) -> Result<Self> {
        for shape in [q, k, v] {
            checked_numel(OP, shape)?;
        }
        let (&[b, h, t, d], &[kb, kh, s, kd], &[vb, vh, vs, dv]) = (q, k, v) else {
            return Err(bad_arg(
                OP,
                q,
                "q, k and v must each be [B, H, len, dim]".into(),
            ));
        };
        let mismatch = |lhs: &[usize], rhs: &[usize]| TensorError::ShapeMismatch {
            op: OP,
            lhs: lhs.to_vec(),
            rhs: rhs.to_vec(),
        };
        if [kb, kh, kd] != [b, h, d] {
            return Err(mismatch(q, k));
        }
        if [vb, vh, vs] != [b, h, s] {
            return Err(mismatch(k, v));
        }
        let scale = scale.unwrap_or(1.0 / (d as f32).sqrt());
        if !scale.is_finite() && d > 0 {
            return Err(bad_arg(OP, q, format!("scale = {scale} must be finite")));
        }
        let mask = mask.map(|m| mask_layout(m, [b, h, t, s])).transpose()?;
        Ok(AttentionSpec {
            b,
            h,
            t,
            s,
            d,
            dv,
            scale,
            causal,
            mask,
        })
    }

    /// `[B, H, T, Dv]`.
    pub fn out_shape(&self) -> [usize; 4] {
        [self.b, self.h, self.t, self.dv]
    }

    /// Elements of the saved logsumexp, `[B, H, T]`.
    pub fn lse_len(&self) -> usize {
        self.b * self.h * self.t
    }

    /// Elements of the mask's data, when there is a mask.
    pub fn mask_len(&self) -> Option<usize> {
        self.mask.as_ref().map(|m| m.len)
    }

    /// The scale applied to `q k^T`.
    pub fn scale(&self) -> f32 {
        self.scale
    }

    /// Workspace for [`attention_forward`] and [`attention_backward`], one slot per rayon
    /// thread (fewer slots, at least one, also work).
    pub fn workspace_elems(&self) -> usize {
        self.slot_len() * wanted_slots(self.heads())
    }

    fn heads(&self) -> usize {
        self.b * self.h
    }

    fn bq(&self) -> usize {
        self.t.clamp(1, BLOCK_Q)
    }

    fn bk(&self) -> usize {
        self.s.clamp(1, BLOCK_K)
    }

    fn slot_len(&self) -> usize {
        2 * self.bq() * self.bk() + 2 * self.bq()
    }

    /// Keys the query block `rows` may see: all, or up to its last row under a causal mask.
    fn key_end(&self, rows: &Range<usize>) -> usize {
        if self.causal {
            rows.end.min(self.s)
        } else {
            self.s
        }
    }

    fn check_inputs(&self, q: &[f32], k: &[f32], v: &[f32], mask: Option<&[f32]>) -> Result<()> {
        let heads = self.heads();
        check_len(OP, "q", q.len(), heads * self.t * self.d)?;
        check_len(OP, "k", k.len(), heads * self.s * self.d)?;
        check_len(OP, "v", v.len(), heads * self.s * self.dv)?;
        match (&self.mask, mask) {
            (Some(m), Some(data)) => check_len(OP, "the mask", data.len(), m.len),
            (None, None) => Ok(()),
            _ => Err(bad_arg(
                OP,
                &[self.t, self.s],
                "mask given or missing against the spec".into(),
            )),
        }
    }
}

/// Broadcasts a mask shape to `[B, H, T, S]` (numpy rules, leading dims may be absent).
fn mask_layout(m: AttentionMask<'_>, full: [usize; 4]) -> Result<MaskLayout> {
    let len = checked_numel(OP, m.shape)?;
    if m.shape.len() > 4 {
        return Err(bad_arg(OP, m.shape, "a mask has at most 4 dims".into()));
    }
    let own = contiguous_strides(m.shape);
    let lead = 4 - m.shape.len();
    let mut strides = [0; 4];
    for i in lead..4 {
        let dim = m.shape[i - lead];
        strides[i] = match dim {
            d if d == full[i] => own[i - lead],
            1 => 0,
            _ => {
                return Err(TensorError::ShapeMismatch {
                    op: OP,
                    lhs: m.shape.to_vec(),
                    rhs: full.to_vec(),
                });
            }
        };
    }
    Ok(MaskLayout {
        kind: m.kind,
        strides,
        len,
    })
}

multiversion! {
    /// Online softmax step for one score row `srow` (overwritten with its exponentials): updates
    /// the row's running max `m` and sum `l` and rescales its output row.
    fn online_row(srow: &mut [f32], m: &mut f32, l: &mut f32, orow: &mut [f32]) {
        let new_max = max(srow).max(*m);
        if new_max == f32::NEG_INFINITY {
            srow.fill(0.0);
            return;
        }
        let alpha = exp_nonpositive(*m - new_max);
        for v in srow.iter_mut() {
            *v = exp_nonpositive(*v - new_max);
        }
        let sum = sum_zip(srow, srow, |p, _| p);
        *l = *l * alpha + sum;
        if alpha != 1.0 {
            orow.iter_mut().for_each(|o| *o *= alpha);
        }
        *m = new_max;
    }
}

multiversion! {
    /// Probabilities of one recomputed score row from its logsumexp.
    fn probs_row(srow: &mut [f32], lse: f32) {
        if lse == f32::NEG_INFINITY {
            srow.fill(0.0);
            return;
        }
        for v in srow.iter_mut() {
            *v = exp_nonpositive((*v - lse).min(0.0));
        }
    }
}

multiversion! {
    /// `dS = P * (dP - D) * scale` for one row, into `dp`.
    fn ds_row(p: &[f32], dp: &mut [f32], di: f32, scale: f32) {
        for (d, &p) in dp.iter_mut().zip(p) {
            *d = p * (*d - di) * scale;
        }
    }
}

multiversion! {
    fn dot(a: &[f32], b: &[f32]) -> f32 {
        sum_zip(a, b, |x, y| x * y)
    }
}

/// One head's tensors (q, k, v rows of this head only).
struct Head<'a> {
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    /// Index of the head in `0..B*H` (for the mask).
    index: usize,
}

impl AttentionSpec {
    fn head<'a>(&self, i: usize, q: &'a [f32], k: &'a [f32], v: &'a [f32]) -> Head<'a> {
        let (t, s, d, dv) = (self.t, self.s, self.d, self.dv);
        Head {
            q: &q[i * t * d..][..t * d],
            k: &k[i * s * d..][..s * d],
            v: &v[i * s * dv..][..s * dv],
            index: i,
        }
    }

    /// Scaled, masked scores of query block `rows` against key block `keys` into `sc`
    /// (row stride `bk`).
    fn scores(
        &self,
        hd: &Head<'_>,
        mask: Option<&[f32]>,
        rows: &Range<usize>,
        keys: &Range<usize>,
        sc: &mut [f32],
    ) {
        let (d, bk) = (self.d, self.bk());
        sgemm(
            sc,
            bk,
            Mat::rows(&hd.q[rows.start * d..], rows.len(), d),
            Mat::rows(&hd.k[keys.start * d..], keys.len(), d).t(),
            self.scale,
            false,
            Parallelism::None,
        );
        let (bi, hi) = (hd.index / self.h, hd.index % self.h);
        for (r, qi) in rows.clone().enumerate() {
            let srow = &mut sc[r * bk..][..keys.len()];
            if let (Some(m), Some(data)) = (&self.mask, mask) {
                let base = bi * m.strides[0] + hi * m.strides[1] + qi * m.strides[2];
                let ss = m.strides[3];
                match m.kind {
                    MaskKind::Additive => {
                        for (c, v) in srow.iter_mut().enumerate() {
                            *v += data[base + (keys.start + c) * ss];
                        }
                    }
                    MaskKind::Boolean => {
                        for (c, v) in srow.iter_mut().enumerate() {
                            if data[base + (keys.start + c) * ss] == 0.0 {
                                *v = f32::NEG_INFINITY;
                            }
                        }
                    }
                }
            }
            if self.causal {
                let first_hidden = (qi + 1).saturating_sub(keys.start).min(keys.len());
                srow[first_hidden..].fill(f32::NEG_INFINITY);
            }
        }
    }

    /// Query blocks of the head, and the key blocks each one visits.
    fn blocks(&self) -> impl Iterator<Item = (Range<usize>, impl Iterator<Item = Range<usize>>)> {
        let (t, bq, bk) = (self.t, self.bq(), self.bk());
        (0..t).step_by(bq).map(move |q0| {
            let rows = q0..(q0 + bq).min(t);
            let end = self.key_end(&rows);
            let keys = (0..end).step_by(bk).map(move |k0| k0..(k0 + bk).min(end));
            (rows, keys)
        })
    }

    fn forward_head(
        &self,
        hd: &Head<'_>,
        mask: Option<&[f32]>,
        out: &mut [f32],
        lse: &mut [f32],
        ws: &mut [f32],
        meter: &mut Meter,
    ) -> Result<()> {
        let (dv, bk) = (self.dv, self.bk());
        let (sc, rest) = ws.split_at_mut(self.bq() * bk);
        let (m, l) = rest.split_at_mut(self.bq());
        out.fill(0.0);
        for (rows, keys) in self.blocks() {
            let n = rows.len();
            m[..n].fill(f32::NEG_INFINITY);
            l[..n].fill(0.0);
            let orows = &mut out[rows.start * dv..rows.end * dv];
            for keys in keys {
                meter.add(self.block_work(n, keys.len()))?;
                self.scores(hd, mask, &rows, &keys, sc);
                for r in 0..n {
                    let srow = &mut sc[r * bk..][..keys.len()];
                    online_row(srow, &mut m[r], &mut l[r], &mut orows[r * dv..][..dv]);
                }
                sgemm(
                    orows,
                    dv,
                    Mat {
                        data: sc,
                        rows: n,
                        cols: keys.len(),
                        rs: bk,
                        cs: 1,
                    },
                    Mat::rows(&hd.v[keys.start * dv..], keys.len(), dv),
                    1.0,
                    true,
                    Parallelism::None,
                );
            }
            for r in 0..n {
                let orow = &mut orows[r * dv..][..dv];
                if l[r] > 0.0 {
                    let inv = 1.0 / l[r];
                    orow.iter_mut().for_each(|o| *o *= inv);
                    lse[rows.start + r] = m[r] + l[r].ln();
                } else {
                    orow.fill(0.0);
                    lse[rows.start + r] = f32::NEG_INFINITY;
                }
            }
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn backward_head(
        &self,
        hd: &Head<'_>,
        mask: Option<&[f32]>,
        (out, lse, d_out): (&[f32], &[f32], &[f32]),
        dq: &mut [f32],
        dk: &mut [f32],
        dvv: &mut [f32],
        ws: &mut [f32],
        meter: &mut Meter,
    ) -> Result<()> {
        let (d, dv, bk) = (self.d, self.dv, self.bk());
        let block = self.bq() * bk;
        let (p, rest) = ws.split_at_mut(block);
        let (dp, rest) = rest.split_at_mut(block);
        let di = &mut rest[..self.bq()];
        dq.fill(0.0);
        dk.fill(0.0);
        dvv.fill(0.0);
        for (rows, keys) in self.blocks() {
            let n = rows.len();
            let do_rows = &d_out[rows.start * dv..rows.end * dv];
            for (r, d) in di[..n].iter_mut().enumerate() {
                let at = (rows.start + r) * dv;
                *d = dot(&d_out[at..at + dv], &out[at..at + dv]);
            }
            for keys in keys {
                // Backward does about twice forward's products.
                meter.add(self.block_work(n, keys.len()).saturating_mul(2))?;
                let c = keys.len();
                self.scores(hd, mask, &rows, &keys, p);
                for r in 0..n {
                    probs_row(&mut p[r * bk..][..c], lse[rows.start + r]);
                }
                let pm = Mat {
                    data: p,
                    rows: n,
                    cols: c,
                    rs: bk,
                    cs: 1,
                };
                // dV += P^T dO
                sgemm(
                    &mut dvv[keys.start * dv..keys.end * dv],
                    dv,
                    pm.t(),
                    Mat::rows(do_rows, n, dv),
                    1.0,
                    true,
                    Parallelism::None,
                );
                // dP = dO V^T, then dS in place.
                sgemm(
                    dp,
                    bk,
                    Mat::rows(do_rows, n, dv),
                    Mat::rows(&hd.v[keys.start * dv..], c, dv).t(),
                    1.0,
                    false,
                    Parallelism::None,
                );
                for r in 0..n {
                    ds_row(&p[r * bk..][..c], &mut dp[r * bk..][..c], di[r], self.scale);
                }
                let dsm = Mat {
                    data: dp,
                    rows: n,
                    cols: c,
                    rs: bk,
                    cs: 1,
                };
                // dQ += dS K, dK += dS^T Q
                sgemm(
                    &mut dq[rows.start * d..rows.end * d],
                    d,
                    dsm,
                    Mat::rows(&hd.k[keys.start * d..], c, d),
                    1.0,
                    true,
                    Parallelism::None,
                );
                sgemm(
                    &mut dk[keys.start * d..keys.end * d],
                    d,
                    dsm.t(),
                    Mat::rows(&hd.q[rows.start * d..], n, d),
                    1.0,
                    true,
                    Parallelism::None,
                );
            }
        }
        Ok(())
    }

    /// Multiply-adds of `rows` queries over a block of `keys` (`q k^T`, the softmax, then
    /// `p v`): one more per score than the head dims, so a head of no dims still costs its
    /// scores.
    fn block_work(&self, rows: usize, keys: usize) -> u64 {
        work::product(&[rows, keys, self.d + self.dv + 1])
    }

    /// Multiply-adds of the forward, known before it runs (backward does about twice as
    /// many): each query row over the keys it sees.
    pub(crate) fn work(&self) -> u64 {
        // Keys seen by all T rows: S each, or under the causal mask min(i + 1, S) for row i.
        let (t, s) = (self.t as u64, self.s as u64);
        let keys = match self.causal {
            false => t.saturating_mul(s),
            true => {
                let full = t.min(s);
                let tri = full.saturating_mul(full.saturating_add(1)) / 2;
                tri.saturating_add((t - full).saturating_mul(s))
            }
        };
        work::product(&[self.b, self.h, self.d + self.dv + 1]).saturating_mul(keys)
    }
}

/// Splits `buf` into one run per slot: slot `i` gets units `i*per .. (i+1)*per` of `unit`
/// elements each (the last run may be shorter or empty).
fn runs<T>(buf: &mut [T], unit: usize, per: usize, slots: usize) -> Vec<&mut [T]> {
    let mut out = Vec::with_capacity(slots);
    let mut rest = buf;
    for _ in 0..slots {
        let take = (per * unit).min(rest.len());
        let (head, tail) = rest.split_at_mut(take);
        out.push(head);
        rest = tail;
    }
    out
}

/// Attention forward: `out` `[B, H, T, Dv]` and the per-row logsumexp `lse` `[B, H, T]` (kept
/// for backward), from dense `q`, `k`, `v` and the spec's mask data. `ws` holds at least one
/// slot (see [`AttentionSpec::workspace_elems`]).
#[allow(clippy::too_many_arguments)]
pub fn attention_forward(
    spec: &AttentionSpec,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    mask: Option<&[f32]>,
    out: &mut [f32],
    lse: &mut [f32],
    ws: &mut [f32],
) -> Result<()> {
    let s = spec;
    s.check_inputs(q, k, v, mask)?;
    check_len(OP, "the output", out.len(), s.heads() * s.t * s.dv)?;
    check_len(OP, "the logsumexp", lse.len(), s.lse_len())?;
    if s.heads() == 0 || s.t == 0 {
        return Ok(());
    }
    let slot_len = s.slot_len();
    let slots = usable_slots(OP, ws.len(), slot_len, s.heads())?;
    let per = s.heads().div_ceil(slots);
    let outs = runs(out, s.t * s.dv, per, slots);
    let lses = runs(lse, s.t, per, slots);
    let wss = runs(ws, slot_len, 1, slots);
    let deadline = Deadline::current();
    outs.into_par_iter()
        .zip(lses)
        .zip(wss)
        .enumerate()
        .try_for_each(|(i, ((out, lse), ws))| {
            let mut meter = deadline.meter(OP);
            for (j, head) in (i * per..((i + 1) * per).min(s.heads())).enumerate() {
                let hd = s.head(head, q, k, v);
                let o = &mut out[j * s.t * s.dv..][..s.t * s.dv];
                let l = &mut lse[j * s.t..][..s.t];
                s.forward_head(&hd, mask, o, l, ws, &mut meter)?;
            }
            Ok(())
        })
}

/// Attention backward from `d_out` and the forward's `out` and `lse`: `dq`, `dk`, `dv`
/// (shaped as `q`, `k`, `v`; overwritten). `ws` holds at least one slot.
#[allow(clippy::too_many_arguments)]
pub fn attention_backward(
    spec: &AttentionSpec,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    mask: Option<&[f32]>,
    out: &[f32],
    lse: &[f32],
    d_out: &[f32],
    dq: &mut [f32],
    dk: &mut [f32],
    dv: &mut [f32],
    ws: &mut [f32],
) -> Result<()> {
    const BOP: &str = "scaled_dot_product_attention_backward";
    let s = spec;
    s.check_inputs(q, k, v, mask)?;
    let o_len = s.heads() * s.t * s.dv;
    check_len(BOP, "the output", out.len(), o_len)?;
    check_len(BOP, "the output gradient", d_out.len(), o_len)?;
    check_len(BOP, "the logsumexp", lse.len(), s.lse_len())?;
    check_len(BOP, "dq", dq.len(), q.len())?;
    check_len(BOP, "dk", dk.len(), k.len())?;
    check_len(BOP, "dv", dv.len(), v.len())?;
    dk.fill(0.0);
    dv.fill(0.0);
    dq.fill(0.0);
    if s.heads() == 0 || s.t == 0 {
        return Ok(());
    }
    let slot_len = s.slot_len();
    let slots = usable_slots(BOP, ws.len(), slot_len, s.heads())?;
    let per = s.heads().div_ceil(slots);
    let dqs = runs(dq, s.t * s.d, per, slots);
    let dks = runs(dk, s.s * s.d, per, slots);
    let dvs = runs(dv, s.s * s.dv, per, slots);
    let wss = runs(ws, slot_len, 1, slots);
    let deadline = Deadline::current();
    dqs.into_par_iter()
        .zip(dks)
        .zip(dvs)
        .zip(wss)
        .enumerate()
        .try_for_each(|(i, (((dq, dk), dv), ws))| {
            let mut meter = deadline.meter(BOP);
            for (j, head) in (i * per..((i + 1) * per).min(s.heads())).enumerate() {
                let hd = s.head(head, q, k, v);
                let (t, sl, dv_) = (s.t, s.s, s.dv);
                let o = &out[head * t * dv_..][..t * dv_];
                let g = &d_out[head * t * dv_..][..t * dv_];
                let l = &lse[head * t..][..t];
                s.backward_head(
                    &hd,
                    mask,
                    (o, l, g),
                    &mut dq[j * t * s.d..][..t * s.d],
                    &mut dk[j * sl * s.d..][..sl * s.d],
                    &mut dv[j * sl * dv_..][..sl * dv_],
                    ws,
                    &mut meter,
                )?;
            }
            Ok(())
        })
}
