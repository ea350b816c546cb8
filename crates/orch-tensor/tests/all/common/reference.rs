//! A slow, obviously-correct f64 tensor used as the oracle for forward values and, through
//! central finite differences, for gradients.

#[derive(Debug, Clone, PartialEq)]
pub struct R {
    pub shape: Vec<usize>,
    pub data: Vec<f64>,
}

pub fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

fn unravel(mut i: usize, shape: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; shape.len()];
    for d in (0..shape.len()).rev() {
        idx[d] = i % shape[d];
        i /= shape[d];
    }
    idx
}

fn ravel(idx: &[usize], shape: &[usize]) -> usize {
    idx.iter().zip(shape).fold(0, |acc, (&i, &d)| acc * d + i)
}

fn broadcast(a: &[usize], b: &[usize]) -> Vec<usize> {
    let rank = a.len().max(b.len());
    (0..rank)
        .map(|i| {
            let da = if i < rank - a.len() {
                1
            } else {
                a[i - (rank - a.len())]
            };
            let db = if i < rank - b.len() {
                1
            } else {
                b[i - (rank - b.len())]
            };
            assert!(
                da == db || da == 1 || db == 1,
                "reference: shapes {a:?} {b:?} do not broadcast"
            );
            da.max(db)
        })
        .collect()
}

impl R {
    pub fn new(shape: &[usize], data: Vec<f64>) -> R {
        assert_eq!(numel(shape), data.len());
        R {
            shape: shape.to_vec(),
            data,
        }
    }

    pub fn scalar(v: f64) -> R {
        R::new(&[], vec![v])
    }

    /// Element at a multi-index of a (possibly larger) broadcast shape.
    fn at_broadcast(&self, idx: &[usize]) -> f64 {
        let lead = idx.len() - self.shape.len();
        let own: Vec<usize> = self
            .shape
            .iter()
            .enumerate()
            .map(|(i, &d)| if d == 1 { 0 } else { idx[lead + i] })
            .collect();
        self.data[ravel(&own, &self.shape)]
    }

    pub fn zip(&self, other: &R, f: impl Fn(f64, f64) -> f64) -> R {
        let shape = broadcast(&self.shape, &other.shape);
        let data = (0..numel(&shape))
            .map(|i| {
                let idx = unravel(i, &shape);
                f(self.at_broadcast(&idx), other.at_broadcast(&idx))
            })
            .collect();
        R::new(&shape, data)
    }

    pub fn map(&self, f: impl Fn(f64) -> f64) -> R {
        R::new(&self.shape, self.data.iter().map(|&v| f(v)).collect())
    }

    pub fn add(&self, o: &R) -> R {
        self.zip(o, |a, b| a + b)
    }
    pub fn sub(&self, o: &R) -> R {
        self.zip(o, |a, b| a - b)
    }
    pub fn mul(&self, o: &R) -> R {
        self.zip(o, |a, b| a * b)
    }
    pub fn div(&self, o: &R) -> R {
        self.zip(o, |a, b| a / b)
    }

    pub fn reshape(&self, shape: &[usize]) -> R {
        R::new(shape, self.data.clone())
    }

    pub fn permute(&self, perm: &[usize]) -> R {
        let shape: Vec<usize> = perm.iter().map(|&p| self.shape[p]).collect();
        let data = (0..numel(&shape))
            .map(|i| {
                let idx = unravel(i, &shape);
                let mut src = vec![0; idx.len()];
                for (k, &p) in perm.iter().enumerate() {
                    src[p] = idx[k];
                }
                self.data[ravel(&src, &self.shape)]
            })
            .collect();
        R::new(&shape, data)
    }

    pub fn transpose_last(&self) -> R {
        let r = self.shape.len();
        let mut perm: Vec<usize> = (0..r).collect();
        perm.swap(r - 2, r - 1);
        self.permute(&perm)
    }

    pub fn narrow(&self, dim: usize, start: usize, len: usize) -> R {
        let mut shape = self.shape.clone();
        shape[dim] = len;
        let data = (0..numel(&shape))
            .map(|i| {
                let mut idx = unravel(i, &shape);
                idx[dim] += start;
                self.data[ravel(&idx, &self.shape)]
            })
            .collect();
        R::new(&shape, data)
    }

    pub fn broadcast_to(&self, shape: &[usize]) -> R {
        R::new(shape, vec![0.0; numel(shape)]).zip(self, |_, b| b)
    }

    /// Reduction over `axes` (empty: all) with `init` and `f`.
    pub fn reduce(
        &self,
        axes: &[usize],
        keepdim: bool,
        init: f64,
        f: impl Fn(f64, f64) -> f64,
    ) -> R {
        let axes: Vec<usize> = if axes.is_empty() {
            (0..self.shape.len()).collect()
        } else {
            axes.to_vec()
        };
        let kept: Vec<usize> = self
            .shape
            .iter()
            .enumerate()
            .map(|(i, &d)| if axes.contains(&i) { 1 } else { d })
            .collect();
        let mut out = vec![init; numel(&kept)];
        for i in 0..self.data.len() {
            let mut idx = unravel(i, &self.shape);
            for &a in &axes {
                idx[a] = 0;
            }
            let o = ravel(&idx, &kept);
            out[o] = f(out[o], self.data[i]);
        }
        let shape: Vec<usize> = if keepdim {
            kept
        } else {
            self.shape
                .iter()
                .enumerate()
                .filter(|(i, _)| !axes.contains(i))
                .map(|(_, &d)| d)
                .collect()
        };
        R::new(&shape, out)
    }

    pub fn sum(&self, axes: &[usize], keepdim: bool) -> R {
        self.reduce(axes, keepdim, 0.0, |a, b| a + b)
    }

    pub fn mean(&self, axes: &[usize], keepdim: bool) -> R {
        let all: Vec<usize> = if axes.is_empty() {
            (0..self.shape.len()).collect()
        } else {
            axes.to_vec()
        };
        let count: usize = all.iter().map(|&a| self.shape[a]).product();
        self.sum(axes, keepdim).map(|v| v / count as f64)
    }

    pub fn max(&self, axes: &[usize], keepdim: bool) -> R {
        self.reduce(axes, keepdim, f64::NEG_INFINITY, f64::max)
    }

    pub fn softmax(&self, axis: usize) -> R {
        let m = self.max(&[axis], true);
        let e = self.sub(&m).map(f64::exp);
        e.div(&e.sum(&[axis], true))
    }

    pub fn log_softmax(&self, axis: usize) -> R {
        let m = self.max(&[axis], true);
        let shifted = self.sub(&m);
        let lse = shifted.map(f64::exp).sum(&[axis], true).map(f64::ln);
        shifted.sub(&lse)
    }

    /// Mean cross-entropy of logits [rows, classes] with integer labels.
    pub fn cross_entropy(&self, labels: &[usize]) -> R {
        let ls = self.log_softmax(1);
        let classes = self.shape[1];
        let total: f64 = labels
            .iter()
            .enumerate()
            .map(|(r, &k)| -ls.data[r * classes + k])
            .sum();
        R::scalar(total / labels.len() as f64)
    }

    /// numpy matmul of rank >= 2 operands with broadcast batch dims.
    pub fn matmul(&self, o: &R) -> R {
        let (ra, rb) = (self.shape.len(), o.shape.len());
        let (m, k, n) = (self.shape[ra - 2], self.shape[ra - 1], o.shape[rb - 1]);
        assert_eq!(k, o.shape[rb - 2]);
        let batch = broadcast(&self.shape[..ra - 2], &o.shape[..rb - 2]);
        let a = self.broadcast_to(&[batch.as_slice(), &[m, k]].concat());
        let b = o.broadcast_to(&[batch.as_slice(), &[k, n]].concat());
        let count = numel(&batch);
        let mut out = vec![0.0; count * m * n];
        for bi in 0..count {
            for i in 0..m {
                for j in 0..n {
                    out[(bi * m + i) * n + j] = (0..k)
                        .map(|p| a.data[(bi * m + i) * k + p] * b.data[(bi * k + p) * n + j])
                        .sum();
                }
            }
        }
        R::new(&[batch.as_slice(), &[m, n]].concat(), out)
    }
}

impl R {
    /// The tensors joined along `axis`.
    pub fn concat(parts: &[R], axis: usize) -> R {
        let mut shape = parts[0].shape.clone();
        shape[axis] = parts.iter().map(|p| p.shape[axis]).sum();
        let data = (0..numel(&shape))
            .map(|i| {
                let mut idx = unravel(i, &shape);
                let mut part = 0;
                while idx[axis] >= parts[part].shape[axis] {
                    idx[axis] -= parts[part].shape[axis];
                    part += 1;
                }
                parts[part].data[ravel(&idx, &parts[part].shape)]
            })
            .collect();
        R::new(&shape, data)
    }

    /// Python's `x[start:end:step]` along `dim`.
    pub fn slice(&self, dim: usize, start: usize, end: usize, step: usize) -> R {
        let end = end.min(self.shape[dim]);
        let picked: Vec<usize> = (start..end).step_by(step).collect();
        self.select(dim, &picked)
    }

    /// Entries `index` of dimension `dim`, in order.
    pub fn select(&self, dim: usize, index: &[usize]) -> R {
        let mut shape = self.shape.clone();
        shape[dim] = index.len();
        let data = (0..numel(&shape))
            .map(|i| {
                let mut idx = unravel(i, &shape);
                idx[dim] = index[idx[dim]];
                self.data[ravel(&idx, &self.shape)]
            })
            .collect();
        R::new(&shape, data)
    }

    /// `value` around every dimension, `widths[d] = (before, after)`.
    pub fn pad(&self, widths: &[(usize, usize)], value: f64) -> R {
        let shape: Vec<usize> = self
            .shape
            .iter()
            .zip(widths)
            .map(|(&n, &(b, a))| n + b + a)
            .collect();
        let data = (0..numel(&shape))
            .map(|i| {
                let idx = unravel(i, &shape);
                let inner: Option<Vec<usize>> = idx
                    .iter()
                    .zip(widths)
                    .zip(&self.shape)
                    .map(|((&j, &(b, _)), &n)| j.checked_sub(b).filter(|&k| k < n))
                    .collect();
                inner.map_or(value, |k| self.data[ravel(&k, &self.shape)])
            })
            .collect();
        R::new(&shape, data)
    }

    /// PyTorch's `gather` along `dim` (index of the output's shape).
    pub fn gather(&self, dim: usize, index: &[usize], index_shape: &[usize]) -> R {
        let data = (0..numel(index_shape))
            .map(|i| {
                let mut idx = unravel(i, index_shape);
                idx[dim] = index[i];
                self.data[ravel(&idx, &self.shape)]
            })
            .collect();
        R::new(index_shape, data)
    }

    /// Mean cross-entropy of logits `[.., classes]` with integer labels of the leading shape,
    /// labels equal to `ignore` left out (0 when none is left).
    pub fn cross_entropy_ignoring(&self, labels: &[i64], ignore: Option<i64>) -> R {
        let classes = *self.shape.last().unwrap();
        let rows = labels.len();
        let ls = self.reshape(&[rows, classes]).log_softmax(1);
        let (mut total, mut count) = (0.0, 0usize);
        for (r, &k) in labels.iter().enumerate() {
            if Some(k) != ignore {
                total -= ls.data[r * classes + k as usize];
                count += 1;
            }
        }
        R::scalar(if count == 0 {
            0.0
        } else {
            total / count as f64
        })
    }
}

pub fn gelu(x: f64) -> f64 {
    let c = (2.0 / std::f64::consts::PI).sqrt();
    0.5 * x * (1.0 + (c * (x + 0.044715 * x * x * x)).tanh())
}

pub fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}
