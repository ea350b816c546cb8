//! Softmax and what is computed from it: log-softmax, the fused softmax cross-entropy loss, and
//! accuracy; and the mean squared error.

use super::Tensor;
use super::elementwise::same_device;
use crate::autograd::{self, Op};
use crate::error::{Result, TensorError};
use crate::layout::resolve_axis;
use crate::storage;

impl Tensor {
    fn softmax_impl(&self, axis: isize, log: bool) -> Result<Tensor> {
        let name = if log { "log_softmax" } else { "softmax" };
        let a = resolve_axis(name, axis, self.rank())?;
        let last = self.rank() - 1;
        if a != last {
            // The kernels work on rows: move the axis last and back (views; autograd follows).
            let moved = self.transpose(a as isize, last as isize)?;
            return moved
                .softmax_impl(-1, log)?
                .transpose(a as isize, last as isize);
        }
        let x = self.contiguous()?;
        let n = x.shape()[last];
        let pool = x.pool();
        let buffer = storage::alloc(pool, name, x.shape(), || {
            storage::softmax_last(pool, &x.buffer().read(), x.layout(), n, log)
        })?;
        let rec = autograd::record(&[&x], || {
            if log {
                Op::LogSoftmax(x.clone(), a)
            } else {
                Op::Softmax(x.clone(), a)
            }
        })?;
        Ok(Tensor::dense(buffer, x.shape(), rec))
    }

    /// Softmax over `axis` (negative counts from the end).
    pub fn softmax(&self, axis: isize) -> Result<Tensor> {
        self.softmax_impl(axis, false)
    }

    /// Log-softmax over `axis`, computed stably.
    pub fn log_softmax(&self, axis: isize) -> Result<Tensor> {
        self.softmax_impl(axis, true)
    }

    /// Checks logits `[rows, classes]` against labels `[rows]`; returns `classes`.
    fn check_labels(&self, labels: &Tensor, op: &'static str) -> Result<usize> {
        same_device(op, self, labels)?;
        match (self.shape(), labels.shape()) {
            ([_, 0], _) => Err(TensorError::InvalidShape {
                op,
                shape: self.shape().to_vec(),
                reason: "logits with no classes have no label to score".into(),
            }),
            ([rows, classes], [n]) if rows == n => Ok(*classes),
            _ => Err(TensorError::ShapeMismatch {
                op,
                lhs: self.shape().to_vec(),
                rhs: labels.shape().to_vec(),
            }),
        }
    }

    /// Mean over the batch of `-log softmax(logits)[label]`, for logits `[.., classes]` and
    /// labels of the logits' leading shape (`[rows]` for `[rows, classes]`) holding class
    /// indices as f32. Fused: no softmax tensor is kept. An invalid label is an error on the CPU
    /// and a NaN loss on CUDA (checking would need a device sync).
    pub fn cross_entropy(&self, labels: &Tensor) -> Result<Tensor> {
        self.cross_entropy_with(labels, None)
    }

    /// [`Tensor::cross_entropy`] where labels equal to `ignore_index` (PyTorch's, e.g. -100 for
    /// padding) count neither in the loss nor in the mean's denominator. When every label is
    /// ignored (or there are none) the loss is 0 and so is its gradient (PyTorch gives NaN).
    pub fn cross_entropy_with(&self, labels: &Tensor, ignore_index: Option<i64>) -> Result<Tensor> {
        let op = "cross_entropy";
        same_device(op, self, labels)?;
        let Some((&classes, lead)) = self.shape().split_last() else {
            return Err(TensorError::InvalidShape {
                op,
                shape: vec![],
                reason: "logits need a class dimension".into(),
            });
        };
        if classes == 0 {
            return Err(TensorError::InvalidShape {
                op,
                shape: self.shape().to_vec(),
                reason: "logits with no classes have no label to score".into(),
            });
        }
        if labels.shape() != lead {
            return Err(TensorError::ShapeMismatch {
                op,
                lhs: self.shape().to_vec(),
                rhs: labels.shape().to_vec(),
            });
        }
        let rows = labels.numel();
        let x = self.reshape(&[rows, classes])?;
        let y = autograd::no_grad(|| labels.reshape(&[rows]))?;
        let ignore = ignore_index.map(|i| i as f32);
        let pool = x.pool();
        let losses = storage::alloc(pool, op, &[rows], || {
            storage::read_two(x.buffer(), y.buffer(), |xs, ys| {
                storage::cross_entropy(pool, (xs, x.layout()), (ys, y.layout()), classes, ignore)
            })
        })?;
        let losses = Tensor::dense(losses, &[rows], None);
        let (mean, denom) = autograd::no_grad(|| -> Result<(Tensor, Tensor)> {
            // The count of labels that score, at least 1 (kept on the device: no sync).
            let denom = match ignore {
                None => Tensor::scalar(rows.max(1) as f32, pool)?,
                Some(v) => {
                    let ignored = y.eq(&Tensor::scalar(v, pool)?)?.sum_all()?;
                    Tensor::scalar(rows as f32, pool)?
                        .sub(&ignored)?
                        .maximum(&Tensor::scalar(1.0, pool)?)?
                }
            };
            Ok((losses.sum_all()?.div(&denom)?, denom))
        })?;
        let rec = autograd::record(&[&x], || Op::CrossEntropy {
            logits: x.clone(),
            labels: y.clone(),
            ignore,
            denom,
        })?;
        Ok(mean.view(mean.layout().clone(), rec))
    }

    /// Gradient of [`Tensor::cross_entropy_with`] (for 2-D logits `self` and 1-D labels) for
    /// upstream scalar gradient `g` and the count of scoring labels `denom`.
    pub(crate) fn cross_entropy_backward(
        &self,
        labels: &Tensor,
        ignore: Option<f32>,
        denom: &Tensor,
        g: &Tensor,
    ) -> Result<Tensor> {
        let classes = self.check_labels(labels, "cross_entropy backward")?;
        let scale = g.div(denom)?;
        let pool = self.pool();
        let buffer = storage::alloc(pool, "cross_entropy backward", self.shape(), || {
            let (xs, ys, gs) = (
                self.buffer().read(),
                labels.buffer().read(),
                scale.buffer().read(),
            );
            storage::cross_entropy_grad(
                pool,
                (&xs, self.layout()),
                (&ys, labels.layout()),
                (&gs, scale.layout()),
                classes,
                ignore,
            )
        })?;
        Ok(Tensor::dense(buffer, self.shape(), None))
    }

    /// Mean squared error against a target of the same shape.
    pub fn mse(&self, target: &Tensor) -> Result<Tensor> {
        if self.shape() != target.shape() {
            return Err(TensorError::ShapeMismatch {
                op: "mse",
                lhs: self.shape().to_vec(),
                rhs: target.shape().to_vec(),
            });
        }
        self.sub(target)?.sqr()?.mean_all()
    }

    /// How many rows of logits `[rows, classes]` have their largest value at the label. Labels
    /// are checked as [`Tensor::cross_entropy`] checks them on the CPU, on every backend (they
    /// are copied to the host): a count over labels that are not class indices means nothing.
    pub fn correct(&self, labels: &Tensor) -> Result<usize> {
        let classes = self.check_labels(labels, "correct")?;
        for label in labels.to_vec()? {
            crate::cpu::label_index("correct", label, classes)?;
        }
        let hits =
            autograd::no_grad(|| self.argmax(-1, false)?.eq(labels)?.sum_all()?.to_scalar())?;
        // Exact: a sum of ones below 2^24 rows, and the rows fit far below that.
        Ok(hits.round().clamp(0.0, labels.numel() as f32) as usize)
    }

    /// Fraction of rows whose largest logit is at the label's index, as a scalar tensor.
    pub fn accuracy(&self, labels: &Tensor) -> Result<Tensor> {
        self.check_labels(labels, "accuracy")?;
        autograd::no_grad(|| self.argmax(-1, false)?.eq(labels)?.mean_all())
    }
}
