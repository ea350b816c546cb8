//! Bad input is a typed error value, never a panic.

use crate::common::TestResult;
use crate::test_device;
use orch_tensor::{Device, MemoryPool, Tensor, TensorError};
use std::sync::Arc;

fn shape_and_axis_errors(pool: &Arc<MemoryPool>) -> TestResult {
    let a = Tensor::zeros(&[2, 3], pool)?;
    let b = Tensor::zeros(&[4], pool)?;
    assert!(matches!(
        a.add(&b),
        Err(TensorError::ShapeMismatch { op: "add", .. })
    ));
    assert!(matches!(
        a.matmul(&a),
        Err(TensorError::ShapeMismatch { op: "matmul", .. })
    ));
    assert!(matches!(
        a.matmul(&b),
        Err(TensorError::InvalidShape { op: "matmul", .. })
    ));
    assert!(matches!(
        a.sum(&[2], false),
        Err(TensorError::InvalidAxis {
            op: "sum",
            axis: 2,
            rank: 2
        })
    ));
    assert!(matches!(
        a.softmax(-3),
        Err(TensorError::InvalidAxis { .. })
    ));
    assert!(matches!(
        a.reshape(&[4]),
        Err(TensorError::InvalidShape { op: "reshape", .. })
    ));
    assert!(matches!(
        a.narrow(1, 2, 2),
        Err(TensorError::InvalidShape { op: "narrow", .. })
    ));
    assert!(matches!(
        a.permute(&[0, 0]),
        Err(TensorError::InvalidShape { op: "permute", .. })
    ));
    assert!(matches!(
        a.broadcast_to(&[3, 3]),
        Err(TensorError::ShapeMismatch { .. })
    ));
    assert!(matches!(
        a.to_scalar(),
        Err(TensorError::InvalidShape { .. })
    ));
    let labels = Tensor::zeros(&[3], pool)?;
    assert!(matches!(
        a.cross_entropy(&labels),
        Err(TensorError::ShapeMismatch {
            op: "cross_entropy",
            ..
        })
    ));
    assert!(matches!(
        a.mse(&b),
        Err(TensorError::ShapeMismatch { op: "mse", .. })
    ));
    Ok(())
}

fn device_and_autograd_errors(pool: &Arc<MemoryPool>) -> TestResult {
    let other = MemoryPool::new(Device::Sim(7), None)?;
    let a = Tensor::zeros(&[2], pool)?;
    let b = Tensor::zeros(&[2], &other)?;
    assert!(matches!(
        a.add(&b),
        Err(TensorError::DeviceMismatch { op: "add", .. })
    ));
    let w = Tensor::ones(&[2], pool)?.with_requires_grad();
    assert!(
        matches!(w.mul_scalar(2.0)?.backward(), Err(TensorError::Autograd(_))),
        "not a scalar"
    );
    assert!(
        matches!(a.sum_all()?.backward(), Err(TensorError::Autograd(_))),
        "nothing requires grad"
    );
    assert!(matches!(
        w.set_grad(Some(Tensor::zeros(&[3], pool)?)),
        Err(TensorError::ShapeMismatch { .. })
    ));
    // Recording off: no graph, so no backward.
    let y = orch_tensor::no_grad(|| w.mul_scalar(3.0))?;
    assert!(!y.requires_grad());
    assert!(orch_tensor::is_grad_enabled());
    Ok(())
}

#[test]
fn invalid_labels_are_errors_on_the_cpu() -> TestResult {
    let pool = MemoryPool::cpu();
    let logits = Tensor::zeros(&[2, 3], &pool)?;
    for bad in [[0.0, 3.0], [0.5, 1.0], [-1.0, 0.0]] {
        let labels = Tensor::from_slice(&bad, &[2], &pool)?;
        assert!(matches!(
            logits.cross_entropy(&labels),
            Err(TensorError::InvalidLabel { .. })
        ));
    }
    Ok(())
}

#[test]
fn cuda_pool_without_gpu_is_an_error_value() {
    match MemoryPool::new(Device::Cuda(0), None) {
        Ok(pool) => assert_eq!(pool.device(), Device::Cuda(0)),
        Err(e) => {
            assert!(
                !crate::common::gpu_required(),
                "ORCH_REQUIRE_GPU=1 but: {e}"
            );
            assert!(matches!(e, TensorError::CudaUnavailable(_)), "{e}");
            // Asking again must not panic either (cudarc would, had it been called).
            assert!(MemoryPool::new(Device::Cuda(0), None).is_err());
        }
    }
    assert!(MemoryPool::new(Device::Cuda(4096), None).is_err());
}

test_device!(shape_and_axis_errors, device_and_autograd_errors);

/// The CUDA C compiles under NVRTC wherever libnvrtc loads, GPU or not.
#[test]
fn cuda_kernels_compile_with_nvrtc() {
    for arch in ["compute_80", "compute_90"] {
        match orch_tensor::cuda::compile_kernels(arch) {
            Ok(ptx) => {
                for name in orch_tensor::cuda::kernel_names() {
                    assert!(
                        ptx.contains(&format!(".entry {name}(")),
                        "{arch}: kernel {name} missing from the PTX"
                    );
                }
            }
            Err(e) => {
                assert!(
                    !crate::common::nvrtc_required(),
                    "ORCH_REQUIRE_GPU=1 or ORCH_REQUIRE_NVRTC=1 but: {e}"
                );
                println!("skipped (no NVRTC): {e}");
                return;
            }
        }
    }
}

#[test]
fn overflowing_shapes_are_errors() -> TestResult {
    let pool = MemoryPool::cpu();
    let huge = [1usize << 40, 1 << 40];
    assert!(matches!(
        Tensor::zeros(&huge, &pool),
        Err(TensorError::InvalidShape { .. })
    ));
    assert!(matches!(
        Tensor::randn(&huge, 0, &pool),
        Err(TensorError::InvalidShape { .. })
    ));
    let t = Tensor::zeros(&[1], &pool)?;
    assert!(t.reshape(&huge).is_err());
    assert!(t.broadcast_to(&huge).is_err());
    // A quota is checked before anything is allocated, even for generated data.
    let small = MemoryPool::new(Device::Sim(0), Some(1 << 20))?;
    assert!(matches!(
        Tensor::randn(&[1 << 30], 0, &small),
        Err(TensorError::OutOfMemory { .. })
    ));
    Ok(())
}

/// A graph far deeper than the stack could hold with recursive drops, built, differentiated and
/// dropped on a thread with a small stack.
#[test]
fn very_long_graphs_neither_overflow_nor_leak() {
    let outcome = std::thread::Builder::new()
        .stack_size(256 * 1024)
        .spawn(|| -> orch_tensor::Result<(f32, u64)> {
            let pool = MemoryPool::new(Device::Sim(3), None)?;
            let x = Tensor::ones(&[1], &pool)?.with_requires_grad();
            let mut y = x.clone();
            for _ in 0..50_000 {
                y = y.mul_scalar(1.0)?.add_scalar(0.0)?;
            }
            y.sum_all()?.backward()?;
            let grad = x
                .grad()
                .map(|g| g.to_scalar())
                .transpose()?
                .unwrap_or(f32::NAN);
            drop(y);
            x.zero_grad();
            drop(x);
            Ok((grad, pool.in_use()))
        })
        .expect("spawn")
        .join()
        .expect("no stack overflow");
    assert_eq!(outcome.expect("no error"), (1.0, 0));
}

/// Recorded ops count against the thread's graph budget: past it an op is an error value, the
/// nodes go back when the graph is dropped, and ops outside autograd cost nothing.
#[test]
fn graph_nodes_are_bounded_by_the_budget() -> TestResult {
    let pool = MemoryPool::cpu();
    let budget = orch_tensor::GraphBudget::new(100);
    let x = Tensor::zeros(&[0], &pool)?.with_requires_grad();
    let (made, err) = orch_tensor::with_graph_budget(&budget, || {
        let mut y = x.clone();
        let mut made = 0;
        loop {
            match y.add_scalar(1.0) {
                Ok(next) => y = next,
                Err(e) => return (made, e),
            }
            made += 1;
            assert!(made <= 100, "the budget is never passed");
        }
    });
    assert_eq!(made, 100);
    assert_eq!(err, TensorError::GraphLimit { limit: 100 });
    assert_eq!(budget.live(), 0, "the dropped chain gave its nodes back");
    orch_tensor::with_graph_budget(&budget, || -> TestResult {
        let kept = x.exp()?;
        assert_eq!(budget.live(), 1);
        for _ in 0..1000 {
            orch_tensor::no_grad(|| kept.add_scalar(1.0))?;
        }
        assert_eq!(budget.live(), 1, "ops outside autograd record nothing");
        drop(kept);
        assert_eq!(budget.live(), 0);
        Ok(())
    })?;
    // Outside any budget, graphs are unbounded (the 50,000-node test above).
    Ok(())
}

/// Every op's output shape passes the one shape check: a product whose shape has 2^64 elements
/// (holding nothing) is refused, as are too many dimensions.
#[test]
fn every_op_checks_the_shape_it_makes() -> TestResult {
    let pool = MemoryPool::cpu();
    let big = 65536;
    let a = Tensor::zeros(&[big, big, big, 0], &pool)?;
    let b = Tensor::zeros(&[0, big], &pool)?;
    let err = a.matmul(&b).unwrap_err();
    assert!(
        matches!(err, TensorError::InvalidShape { op: "matmul", .. }),
        "{err}"
    );
    let rank = orch_tensor::MAX_RANK;
    assert!(Tensor::zeros(&vec![1; rank], &pool).is_ok());
    for made in [
        Tensor::zeros(&vec![1; rank + 1], &pool),
        Tensor::from_slice(&[1.0], &vec![1; rank + 1], &pool),
        Tensor::zeros(&[1], &pool)?.reshape(&vec![1; rank + 1]),
    ] {
        assert!(
            matches!(made, Err(TensorError::InvalidShape { .. })),
            "{made:?}"
        );
    }
    // A broadcast to a shape of 2^64 elements is refused by `add` and by every view.
    let empty = Tensor::zeros(&[big, big, big, big, 0], &pool);
    assert!(empty.is_err(), "{empty:?}");
    Ok(())
}

#[test]
fn a_repeated_axis_is_named() -> TestResult {
    let pool = MemoryPool::cpu();
    let x = Tensor::zeros(&[2, 3], &pool)?;
    let err = x.sum(&[1, -1], false).unwrap_err();
    assert_eq!(
        err.to_string(),
        "sum: axis list [1, -1] names an axis twice (a tensor of rank 2)"
    );
    Ok(())
}
