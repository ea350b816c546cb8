//! Shared test machinery: the backends to run on, the `test_device!` macro, the f64 oracle and
//! the finite-difference gradient checker.

pub mod gradcheck;
pub mod reference;

use orch_tensor::{Device, MemoryPool};
use std::sync::Arc;

pub type TestResult = Result<(), Box<dyn std::error::Error>>;

/// True when `ORCH_REQUIRE_GPU=1`: CUDA variants fail instead of skipping.
pub fn gpu_required() -> bool {
    std::env::var("ORCH_REQUIRE_GPU").as_deref() == Ok("1")
}

/// `ORCH_REQUIRE_NVRTC=1`: the CUDA sources must compile here, GPU or not (`.ci/run` sets it
/// with PyTorch's libnvrtc on the loader path). `ORCH_REQUIRE_GPU=1` implies it.
pub fn nvrtc_required() -> bool {
    gpu_required() || std::env::var("ORCH_REQUIRE_NVRTC").as_deref() == Ok("1")
}

/// A pool on CUDA device 0, or `None` (after printing why) when CUDA is not usable here.
/// Panics instead under `ORCH_REQUIRE_GPU=1`.
pub fn cuda_pool() -> Option<Arc<MemoryPool>> {
    let reason = match orch_tensor::cuda::device_count() {
        Ok(0) => "no CUDA device".to_string(),
        Ok(_) => match MemoryPool::new(Device::Cuda(0), None) {
            Ok(pool) => return Some(pool),
            Err(e) => e.to_string(),
        },
        Err(e) => e.to_string(),
    };
    assert!(
        !gpu_required(),
        "ORCH_REQUIRE_GPU=1 but CUDA is not usable: {reason}"
    );
    println!("skipped (no GPU): {reason}");
    None
}

pub fn sim_pool() -> Arc<MemoryPool> {
    MemoryPool::new(Device::Sim(0), Some(1 << 30)).expect("a sim pool never fails")
}

/// Runs one test body on every backend: `cpu`, `sim` (CPU kernels, own quota) and `cuda`
/// (skips without a GPU, fails instead under `ORCH_REQUIRE_GPU=1`). The body is a function
/// `fn(&Arc<MemoryPool>) -> TestResult`; the tests are named `<body>::cpu`, `<body>::sim`,
/// `<body>::cuda`.
#[macro_export]
macro_rules! test_device {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[test]
            fn cpu() -> $crate::common::TestResult {
                super::$name(&orch_tensor::MemoryPool::cpu())
            }

            #[test]
            fn sim() -> $crate::common::TestResult {
                super::$name(&$crate::common::sim_pool())
            }

            #[test]
            fn cuda() -> $crate::common::TestResult {
                match $crate::common::cuda_pool() {
                    Some(pool) => super::$name(&pool),
                    None => Ok(()),
                }
            }
        }
    )*};
}

/// Asserts two float slices agree within `tol * (1 + |expected|)` per element.
#[track_caller]
pub fn assert_close(actual: &[f32], expected: &[f64], tol: f64, what: &str) {
    assert_eq!(actual.len(), expected.len(), "{what}: lengths differ");
    for (i, (&a, &e)) in actual.iter().zip(expected).enumerate() {
        let err = (a as f64 - e).abs();
        assert!(
            err <= tol * (1.0 + e.abs()),
            "{what}: element {i}: got {a}, expected {e} (error {err:.3e})"
        );
    }
}
