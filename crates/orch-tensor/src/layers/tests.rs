//! A layer op declared only through [`LayerOp`] (a test op, CPU only) gets its forward, its
//! autograd node, its backward, its work check and its workspace reservation from this module.

use super::*;
use crate::MemoryPool;
use crate::work::with_deadline;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// `y[i, j] = x[i, j]^2 * w[j] + m[i, j]` for `x` and `m` `[rows, cols]` and an optional `w`
/// `[cols]` (1 when absent); `m` is never differentiated. Keeps `x^2` for backward.
struct SquareScale {
    rows: usize,
    cols: usize,
    /// What it claims against the deadline.
    work: u64,
    /// The f32 workspace it asks for.
    workspace: usize,
    /// Kernel calls (forward and backward).
    calls: Arc<AtomicUsize>,
}

impl SquareScale {
    fn new(rows: usize, cols: usize) -> Self {
        SquareScale {
            rows,
            cols,
            work: 1,
            workspace: 0,
            calls: Arc::default(),
        }
    }
}

impl LayerOp for SquareScale {
    fn name(&self, pass: Pass<'_>) -> &'static str {
        match pass {
            Pass::Forward => "square_scale",
            Pass::Backward(_) => "square_scale backward",
        }
    }

    fn work(&self, _pass: Pass<'_>) -> (Kind, u64) {
        (Kind::Visits, self.work)
    }

    fn workspace(&self, _device: Device, _pass: Pass<'_>) -> Result<usize> {
        Ok(self.workspace)
    }

    fn out_shapes(&self) -> Vec<Vec<usize>> {
        vec![vec![self.rows, self.cols], vec![self.rows, self.cols]]
    }

    fn cpu_forward(&self, io: Host<'_>) -> Result<Vec<CpuStorage>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let (x, m, w) = (*io.inputs.get(0)?, *io.inputs.get(2)?, io.inputs.opt(1));
        let sq: Vec<f32> = x.iter().map(|v| v * v).collect();
        let y = sq
            .iter()
            .zip(m)
            .enumerate()
            .map(|(i, (s, m))| s * w.map_or(1.0, |w| w[i % self.cols]) + m)
            .collect();
        Ok(vec![y, sq])
    }

    fn cuda_forward(&self, _io: Gpu<'_>) -> Result<Vec<CudaStorage>> {
        Err(TensorError::CudaUnavailable("a test op".into()))
    }

    /// (x, x^2, dy, w).
    fn backward_inputs<'t>(
        &self,
        saved: &'t Saved,
        _out: &'t Tensor,
        g: &'t Tensor,
    ) -> Vec<Option<&'t Tensor>> {
        vec![saved.input(0), saved.kept(0), Some(g), saved.input(1)]
    }

    fn cpu_backward(&self, io: Host<'_>, want: &[bool]) -> Result<Vec<CpuStorage>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let i = &io.inputs;
        let (x, sq, dy, w) = (*i.get(0)?, *i.get(1)?, *i.get(2)?, i.opt(3));
        let mut grads = Vec::new();
        if want[0] {
            let dx = (0..x.len())
                .map(|k| 2.0 * x[k] * w.map_or(1.0, |w| w[k % self.cols]) * dy[k])
                .collect();
            grads.push(dx);
        }
        if want.get(1) == Some(&true) {
            let mut dw = vec![0.0; self.cols];
            for k in 0..x.len() {
                dw[k % self.cols] += sq[k] * dy[k];
            }
            grads.push(dw);
        }
        Ok(grads)
    }

    fn cuda_backward(&self, _io: Gpu<'_>, _want: &[bool]) -> Result<Vec<CudaStorage>> {
        Err(TensorError::CudaUnavailable("a test op".into()))
    }
}

fn values(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| ((i as u32 * 7 + seed * 13) % 17) as f32 / 8.0 - 1.0)
        .collect()
}

/// `sum(square_scale(x, w, m) * r)` with recording off (the loss the gradients are of).
fn loss(x: &[f32], w: &[f32], m: &Tensor, r: &[f32], pool: &Arc<MemoryPool>) -> f64 {
    no_grad_loss(x, w, m, pool)
        .iter()
        .zip(r)
        .map(|(y, r)| f64::from(*y) * f64::from(*r))
        .sum()
}

fn no_grad_loss(x: &[f32], w: &[f32], m: &Tensor, pool: &Arc<MemoryPool>) -> Vec<f32> {
    let x = Tensor::from_slice(x, &[3, 4], pool).unwrap();
    let w = Tensor::from_slice(w, &[4], pool).unwrap();
    let args = [
        Arg::Grad(Some(&x)),
        Arg::Grad(Some(&w)),
        Arg::Const(Some(m)),
    ];
    apply(SquareScale::new(3, 4), &args, &[])
        .unwrap()
        .to_vec()
        .unwrap()
}

#[test]
fn an_op_declared_through_the_trait_gets_forward_and_a_numerically_right_backward() {
    let pool = MemoryPool::cpu();
    let (xs, ws, ms, rs) = (values(12, 1), values(4, 2), values(12, 3), values(12, 4));
    let x = Tensor::from_slice(&xs, &[3, 4], &pool)
        .unwrap()
        .with_requires_grad();
    let w = Tensor::from_slice(&ws, &[4], &pool)
        .unwrap()
        .with_requires_grad();
    // Requires grad, but is passed as an input that is never differentiated.
    let m = Tensor::from_slice(&ms, &[3, 4], &pool)
        .unwrap()
        .with_requires_grad();
    let r = Tensor::from_slice(&rs, &[3, 4], &pool).unwrap();
    let op = SquareScale::new(3, 4);
    let calls = Arc::clone(&op.calls);
    let args = [
        Arg::Grad(Some(&x)),
        Arg::Grad(Some(&w)),
        Arg::Const(Some(&m)),
    ];
    let y = apply(op, &args, &[]).unwrap();
    assert!(
        matches!(y.op(), Some(Op::Layer(..))),
        "one autograd variant"
    );
    let expected: Vec<f32> = (0..12).map(|k| xs[k] * xs[k] * ws[k % 4] + ms[k]).collect();
    assert_eq!(y.to_vec().unwrap(), expected);
    y.mul(&r).unwrap().sum_all().unwrap().backward().unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 2, "one forward, one backward");
    assert!(m.grad().is_none(), "the constant input gets no gradient");

    let eps = 1e-2;
    let check = |analytic: Vec<f32>, which: &str, perturb: &dyn Fn(usize, f32) -> f64| {
        for (k, a) in analytic.iter().enumerate() {
            let numeric = (perturb(k, eps) - perturb(k, -eps)) / (2.0 * f64::from(eps));
            assert!(
                (f64::from(*a) - numeric).abs() < 1e-3,
                "d loss / d {which}[{k}]: backward {a}, numerically {numeric}"
            );
        }
    };
    let md = m.detach();
    let gx = x.grad().unwrap().to_vec().unwrap();
    check(gx, "x", &|k, e| {
        let mut xp = xs.clone();
        xp[k] += e;
        loss(&xp, &ws, &md, &rs, &pool)
    });
    let gw = w.grad().unwrap().to_vec().unwrap();
    check(gw, "w", &|k, e| {
        let mut wp = ws.clone();
        wp[k] += e;
        loss(&xs, &wp, &md, &rs, &pool)
    });
}

#[test]
fn an_absent_optional_input_and_an_input_without_grad_get_no_gradient() {
    let pool = MemoryPool::cpu();
    let x = Tensor::from_vec(values(12, 1), &[3, 4], &pool)
        .unwrap()
        .with_requires_grad();
    let m = Tensor::from_vec(values(12, 3), &[3, 4], &pool).unwrap();
    let args = [Arg::Grad(Some(&x)), Arg::Grad(None), Arg::Const(Some(&m))];
    let y = apply(SquareScale::new(3, 4), &args, &[]).unwrap();
    y.sum_all().unwrap().backward().unwrap();
    let expected: Vec<f32> = values(12, 1).iter().map(|v| 2.0 * v).collect();
    assert_eq!(x.grad().unwrap().to_vec().unwrap(), expected);
    // Nothing requires grad: no node is recorded and nothing can go backward.
    let plain = Tensor::from_vec(values(12, 1), &[3, 4], &pool).unwrap();
    let args = [
        Arg::Grad(Some(&plain)),
        Arg::Grad(None),
        Arg::Const(Some(&m)),
    ];
    let y = apply(SquareScale::new(3, 4), &args, &[]).unwrap();
    assert!(y.op().is_none() && !y.requires_grad());
}

#[test]
fn the_work_check_and_the_workspace_reservation_come_before_the_kernel() {
    let pool = MemoryPool::new(Device::Sim(0), Some(1024)).unwrap();
    let x = Tensor::from_vec(values(12, 1), &[3, 4], &pool).unwrap();
    let args = [Arg::Grad(Some(&x)), Arg::Grad(None), Arg::Const(Some(&x))];

    let mut op = SquareScale::new(3, 4);
    op.work = u64::MAX;
    let calls = Arc::clone(&op.calls);
    let soon = Some(Instant::now() + Duration::from_secs(60));
    let e = with_deadline(soon, || apply(op, &args, &[])).unwrap_err();
    assert!(e.to_string().starts_with("square_scale: "), "{e}");
    assert_eq!(calls.load(Ordering::SeqCst), 0, "refused before it ran");

    let mut op = SquareScale::new(3, 4);
    op.workspace = 1024;
    let calls = Arc::clone(&op.calls);
    let e = apply(op, &args, &[]).unwrap_err();
    assert!(matches!(e, TensorError::OutOfMemory { .. }), "{e}");
    assert_eq!(calls.load(Ordering::SeqCst), 0, "refused before it ran");
    assert_eq!(pool.in_use(), 48, "only the input is left in the pool");
}
