//! Fused optimizer updates: one pass over parameter, gradient and state.

use crate::ops::UpdateOp;
use rayon::prelude::*;

const CHUNK: usize = 1 << 14;

/// Parameter, gradient and the two moments of one chunk, as rayon's zips nest them.
type AdamChunk<'a> = (((&'a mut [f32], &'a [f32]), &'a mut [f32]), &'a mut [f32]);

super::simd::multiversion! {
    /// Plain SGD, momentum and Nesterov over one chunk.
    fn sgd(p: &mut [f32], g: &[f32], buf: &mut [f32], lr: f32, momentum: f32, wd: f32, nesterov: bool) {
        if momentum == 0.0 {
            for (p, g) in p.iter_mut().zip(g) {
                *p -= lr * (g + wd * *p);
            }
            return;
        }
        for ((p, g), b) in p.iter_mut().zip(g).zip(buf.iter_mut()) {
            let d = g + wd * *p;
            *b = momentum * *b + d;
            let step = if nesterov { d + momentum * *b } else { *b };
            *p -= lr * step;
        }
    }
}

super::simd::multiversion! {
    /// Adam and AdamW over one chunk.
    fn adam(p: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32], op: UpdateOp) {
        let UpdateOp::Adam {
            lr,
            beta1,
            beta2,
            eps,
            weight_decay,
            decoupled,
            bias1,
            bias2,
        } = op
        else {
            return;
        };
        for (((p, g), m), v) in p.iter_mut().zip(g).zip(m.iter_mut()).zip(v.iter_mut()) {
            let mut g = *g;
            if decoupled {
                *p -= lr * weight_decay * *p;
            } else {
                g += weight_decay * *p;
            }
            *m = beta1 * *m + (1.0 - beta1) * g;
            *v = beta2 * *v + (1.0 - beta2) * g * g;
            *p -= lr * (*m / bias1) / ((*v / bias2).sqrt() + eps);
        }
    }
}

/// Applies one update in place. `s1`/`s2` are the optimizer state (SGD's momentum buffer; Adam's
/// first and second moments), each the parameter's length, or empty when unused.
pub(crate) fn update(op: UpdateOp, p: &mut [f32], g: &[f32], s1: &mut [f32], s2: &mut [f32]) {
    let par = p.len() >= super::PAR_MIN;
    match op {
        UpdateOp::Sgd {
            lr,
            momentum,
            weight_decay,
            nesterov,
        } if momentum == 0.0 || s1.is_empty() => {
            let f =
                |(p, g): (&mut [f32], &[f32])| sgd(p, g, &mut [], lr, 0.0, weight_decay, nesterov);
            if par {
                p.par_chunks_mut(CHUNK).zip(g.par_chunks(CHUNK)).for_each(f);
            } else {
                f((p, g));
            }
        }
        UpdateOp::Sgd {
            lr,
            momentum,
            weight_decay,
            nesterov,
        } => {
            let f = |((p, g), b): ((&mut [f32], &[f32]), &mut [f32])| {
                sgd(p, g, b, lr, momentum, weight_decay, nesterov)
            };
            if par {
                p.par_chunks_mut(CHUNK)
                    .zip(g.par_chunks(CHUNK))
                    .zip(s1.par_chunks_mut(CHUNK))
                    .for_each(f);
            } else {
                f(((p, g), s1));
            }
        }
        UpdateOp::Adam { .. } => {
            let f = |(((p, g), m), v): AdamChunk<'_>| adam(p, g, m, v, op);
            if par {
                p.par_chunks_mut(CHUNK)
                    .zip(g.par_chunks(CHUNK))
                    .zip(s1.par_chunks_mut(CHUNK))
                    .zip(s2.par_chunks_mut(CHUNK))
                    .for_each(f);
            } else {
                f((((p, g), s1), s2));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sgd_with_momentum_by_hand() {
        let mut p = [1.0, -2.0];
        let mut buf = [0.0, 0.0];
        let op = UpdateOp::Sgd {
            lr: 0.1,
            momentum: 0.9,
            weight_decay: 0.0,
            nesterov: false,
        };
        update(op, &mut p, &[0.5, 1.0], &mut buf, &mut []);
        assert_eq!(buf, [0.5, 1.0]);
        update(op, &mut p, &[0.5, 1.0], &mut buf, &mut []);
        assert!((buf[0] - 0.95).abs() < 1e-6 && (p[0] - (1.0 - 0.05 - 0.095)).abs() < 1e-6);
    }
}
