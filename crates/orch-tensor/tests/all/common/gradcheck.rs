//! Gradient checking: autograd's f32 gradients against central finite differences of the f64
//! reference, for a loss `sum(op(inputs) * w)` with random weights `w` (so every output element
//! gets a different upstream gradient).

use super::TestResult;
use super::reference::R;
use orch_tensor::{MemoryPool, Tensor};
use proptest::strategy::Strategy;
use proptest::test_runner::{Config, TestCaseError, TestRng, TestRunner};
use std::sync::Arc;

/// Step of the central differences (f64, so truncation and rounding are both far below 1e-6).
const H: f64 = 1e-6;

/// A differentiable input: its shape and values.
#[derive(Debug, Clone)]
pub struct Input {
    pub shape: Vec<usize>,
    pub data: Vec<f64>,
}

/// SplitMix64: deterministic test data without touching the crate's own generator.
pub fn values(n: usize, seed: u64, low: f64, high: f64) -> Vec<f64> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15).wrapping_add(1);
    (0..n)
        .map(|_| {
            state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            low + (high - low) * ((z >> 11) as f64 / (1u64 << 53) as f64)
        })
        .collect()
}

impl Input {
    pub fn random(shape: &[usize], seed: u64) -> Input {
        Input::range(shape, seed, -2.0, 2.0)
    }

    pub fn range(shape: &[usize], seed: u64, low: f64, high: f64) -> Input {
        let n = shape.iter().product();
        // Round through f32 so the tensor and the reference see the same numbers.
        let data = values(n, seed, low, high)
            .into_iter()
            .map(|v| v as f32 as f64)
            .collect();
        Input {
            shape: shape.to_vec(),
            data,
        }
    }

    /// Values nudged at least `margin` away from zero (kinks of relu, poles of div).
    pub fn away_from_zero(mut self, margin: f64) -> Input {
        for v in &mut self.data {
            if v.abs() < margin {
                *v = if *v < 0.0 { -margin } else { margin };
            }
        }
        self
    }

    pub fn tensor(&self, pool: &Arc<MemoryPool>) -> orch_tensor::Result<Tensor> {
        let data: Vec<f32> = self.data.iter().map(|&v| v as f32).collect();
        Tensor::from_vec(data, &self.shape, pool)
    }

    pub fn reference(&self) -> R {
        R::new(&self.shape, self.data.clone())
    }
}

fn weighted(r: &R, w: &[f64]) -> f64 {
    r.data.iter().zip(w).map(|(a, b)| a * b).sum()
}

/// Checks forward values and every input's gradient of `ft` against the reference `fr`.
pub fn check(
    pool: &Arc<MemoryPool>,
    inputs: impl AsRef<[Input]>,
    ft: impl Fn(&[Tensor]) -> orch_tensor::Result<Tensor>,
    fr: impl Fn(&[R]) -> R,
) -> Result<(), String> {
    let inputs = inputs.as_ref();
    let fail = |e: orch_tensor::TensorError| e.to_string();
    let tensors = inputs
        .iter()
        .map(|i| i.tensor(pool).map(|t| t.with_requires_grad()))
        .collect::<orch_tensor::Result<Vec<_>>>()
        .map_err(fail)?;
    let refs: Vec<R> = inputs.iter().map(Input::reference).collect();
    let out = ft(&tensors).map_err(fail)?;
    let expected = fr(&refs);
    if out.shape() != expected.shape.as_slice() {
        return Err(format!(
            "forward shape {:?}, reference {:?}",
            out.shape(),
            expected.shape
        ));
    }
    let got = out.to_vec().map_err(fail)?;
    compare(&got, &expected.data, 1e-4, "forward")?;

    let w = values(expected.data.len(), 99, -1.0, 1.0);
    let w_t = Tensor::from_vec(w.iter().map(|&v| v as f32).collect(), &expected.shape, pool)
        .map_err(fail)?;
    out.mul(&w_t)
        .and_then(|l| l.sum_all())
        .and_then(|l| l.backward())
        .map_err(fail)?;

    for (i, t) in tensors.iter().enumerate() {
        let grad = t
            .grad()
            .ok_or_else(|| format!("input {i} got no gradient"))?;
        if grad.shape() != t.shape() {
            return Err(format!(
                "input {i}: gradient shape {:?}, input {:?}",
                grad.shape(),
                t.shape()
            ));
        }
        let autograd = grad.to_vec().map_err(fail)?;
        let mut numeric = Vec::with_capacity(autograd.len());
        for j in 0..inputs[i].data.len() {
            let mut plus = refs.clone();
            plus[i].data[j] += H;
            let mut minus = refs.clone();
            minus[i].data[j] -= H;
            numeric.push((weighted(&fr(&plus), &w) - weighted(&fr(&minus), &w)) / (2.0 * H));
        }
        compare(
            &autograd,
            &numeric,
            2e-4,
            &format!("gradient of input {i} (shape {:?})", t.shape()),
        )?;
    }
    Ok(())
}

fn compare(actual: &[f32], expected: &[f64], tol: f64, what: &str) -> Result<(), String> {
    for (k, (&a, &e)) in actual.iter().zip(expected).enumerate() {
        let err = (a as f64 - e).abs();
        if err.is_nan() || err > tol * (1.0 + e.abs()) {
            return Err(format!(
                "{what}: element {k}: got {a}, expected {e} (error {err:.3e})"
            ));
        }
    }
    Ok(())
}

/// Runs `test` on `cases` values of `strategy` (deterministic seed, no regression files).
pub fn run_cases<S: Strategy>(
    cases: u32,
    strategy: S,
    test: impl Fn(S::Value) -> Result<(), String>,
) -> TestResult
where
    S::Value: std::fmt::Debug,
{
    let config = Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    };
    let mut runner = TestRunner::new_with_rng(
        config.clone(),
        TestRng::deterministic_rng(config.rng_algorithm),
    );
    runner
        .run(&strategy, |value| test(value).map_err(TestCaseError::fail))
        .map_err(|e| e.to_string().into())
}
