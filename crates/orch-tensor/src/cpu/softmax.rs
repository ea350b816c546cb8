//! Row-wise kernels: softmax, log-softmax and the fused softmax cross-entropy.

use super::{CpuStorage, PAR_MIN};
use crate::error::{Result, TensorError};
use rayon::prelude::*;

fn row_max(x: &[f32]) -> f32 {
    x.iter().fold(f32::NEG_INFINITY, |m, v| m.max(*v))
}

/// log(sum(exp(x))) computed stably.
fn log_sum_exp(x: &[f32]) -> f32 {
    let m = row_max(x);
    if m == f32::NEG_INFINITY {
        return m;
    }
    m + x.iter().map(|v| (v - m).exp()).sum::<f32>().ln()
}

fn softmax_row(x: &[f32], y: &mut [f32]) {
    let m = row_max(x);
    let mut total = 0.0;
    for (y, v) in y.iter_mut().zip(x) {
        *y = (v - m).exp();
        total += *y;
    }
    let inv = 1.0 / total;
    y.iter_mut().for_each(|v| *v *= inv);
}

fn log_softmax_row(x: &[f32], y: &mut [f32]) {
    let lse = log_sum_exp(x);
    for (y, v) in y.iter_mut().zip(x) {
        *y = v - lse;
    }
}

/// Softmax (or log-softmax) of each row of length `n` of dense `x`.
pub(crate) fn softmax_last(x: &[f32], n: usize, log: bool) -> CpuStorage {
    let mut out = vec![0.0; x.len()];
    if x.is_empty() || n == 0 {
        return out;
    }
    let f = if log { log_softmax_row } else { softmax_row };
    if x.len() >= PAR_MIN {
        out.par_chunks_mut(n)
            .zip(x.par_chunks(n))
            .for_each(|(y, x)| f(x, y));
    } else {
        out.chunks_mut(n)
            .zip(x.chunks(n))
            .for_each(|(y, x)| f(x, y));
    }
    out
}

/// `label` as a class index in `0..classes`, or an error (NaN, negative, fractional, too big).
pub(crate) fn label_index(op: &'static str, label: f32, classes: usize) -> Result<usize> {
    if label >= 0.0 && label.fract() == 0.0 && (label as usize) < classes {
        Ok(label as usize)
    } else {
        Err(TensorError::InvalidLabel { op, label, classes })
    }
}

/// Per-row loss `logsumexp(x_r) - x_r[label_r]` of dense logits `[rows, classes]`; 0 for a row
/// whose label equals `ignore`.
pub(crate) fn cross_entropy(
    x: &[f32],
    labels: &[f32],
    classes: usize,
    ignore: Option<f32>,
) -> Result<CpuStorage> {
    x.chunks(classes)
        .zip(labels)
        .map(|(row, &label)| {
            if Some(label) == ignore {
                return Ok(0.0);
            }
            let k = label_index("cross_entropy", label, classes)?;
            Ok(log_sum_exp(row) - row[k])
        })
        .collect()
}

/// Gradient of the summed loss scaled by `scale` (the upstream gradient over the count of
/// labels): `(softmax(x_r) - onehot(label_r)) * scale`, 0 for ignored rows.
pub(crate) fn cross_entropy_grad(
    x: &[f32],
    labels: &[f32],
    classes: usize,
    scale: f32,
    ignore: Option<f32>,
) -> Result<CpuStorage> {
    let mut out = vec![0.0; x.len()];
    let row = |(dst, row, &label): (&mut [f32], &[f32], &f32)| -> Result<()> {
        if Some(label) == ignore {
            return Ok(());
        }
        let k = label_index("cross_entropy", label, classes)?;
        softmax_row(row, dst);
        dst[k] -= 1.0;
        dst.iter_mut().for_each(|v| *v *= scale);
        Ok(())
    };
    if x.len() >= PAR_MIN {
        out.par_chunks_mut(classes)
            .zip(x.par_chunks(classes))
            .zip(labels.par_iter())
            .try_for_each(|((d, r), l)| row((d, r, l)))?;
    } else {
        out.chunks_mut(classes)
            .zip(x.chunks(classes))
            .zip(labels)
            .try_for_each(|((d, r), l)| row((d, r, l)))?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn softmax_rows_sum_to_one_and_log_matches() {
        let x = [1.0, 2.0, 3.0, -1.0, 0.0, 1000.0];
        let y = softmax_last(&x, 3, false);
        assert!((y[..3].iter().sum::<f32>() - 1.0).abs() < 1e-6);
        assert!((y[5] - 1.0).abs() < 1e-6, "stable for large inputs");
        let l = softmax_last(&x, 3, true);
        assert!((l[0].exp() - y[0]).abs() < 1e-6);
    }

    #[test]
    fn cross_entropy_rejects_bad_labels() {
        let x = [0.0, 0.0];
        assert!((cross_entropy(&x, &[1.0], 2, None).unwrap()[0] - 2f32.ln()).abs() < 1e-6);
        assert!(cross_entropy(&x, &[2.0], 2, None).is_err());
        assert!(cross_entropy(&x, &[0.5], 2, None).is_err());
        assert!(cross_entropy(&x, &[-1.0], 2, None).is_err());
        assert_eq!(
            cross_entropy(&x, &[-100.0], 2, Some(-100.0)).unwrap(),
            vec![0.0]
        );
    }
}
