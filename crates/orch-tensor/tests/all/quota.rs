//! Memory quotas: every allocation is counted in its (job, device) pool; past the limit an op
//! fails with a typed error and changes nothing; memory comes back when the last handle drops.

use crate::common::TestResult;
use crate::test_device;
use orch_tensor::optim::{Adam, AdamConfig, Optimizer};
use orch_tensor::{MemoryPool, Tensor, TensorError};
use std::sync::Arc;

fn limited(pool: &Arc<MemoryPool>, bytes: u64) -> orch_tensor::Result<Arc<MemoryPool>> {
    MemoryPool::new(pool.device(), Some(bytes))
}

fn exceed_recover_free(pool: &Arc<MemoryPool>) -> TestResult {
    let pool = limited(pool, 1000)?;
    let a = Tensor::ones(&[200], &pool)?; // 800 bytes
    assert_eq!(pool.in_use(), 800);
    let err = Tensor::zeros(&[100], &pool).unwrap_err();
    assert_eq!(
        err,
        TensorError::OutOfMemory {
            requested: 400,
            in_use: 800,
            limit: 1000,
            device: pool.device()
        }
    );
    // An op whose output does not fit fails the same way and leaves its input intact.
    assert!(matches!(
        a.mul_scalar(2.0),
        Err(TensorError::OutOfMemory { requested: 800, .. })
    ));
    assert_eq!(pool.in_use(), 800);
    assert_eq!(a.to_vec()?, vec![1.0; 200]);
    // Views allocate nothing; the storage lives while any view does.
    let view = a.reshape(&[10, 20])?.t()?.narrow(0, 5, 10)?;
    assert_eq!(pool.in_use(), 800);
    drop(a);
    assert_eq!(pool.in_use(), 800, "a view still holds the storage");
    drop(view);
    assert_eq!(pool.in_use(), 0, "freed with the last handle");
    // Recovered: the whole limit is usable again.
    let full = Tensor::zeros(&[250], &pool)?;
    assert_eq!(pool.in_use(), 1000);
    assert_eq!(pool.peak(), 1000);
    drop(full);
    assert_eq!(pool.stats().in_use, 0);
    Ok(())
}

fn gradients_and_graphs_are_counted(pool: &Arc<MemoryPool>) -> TestResult {
    let pool = limited(pool, 1 << 20)?;
    let w = Tensor::randn(&[16, 16], 1, &pool)?.with_requires_grad();
    let base = pool.in_use();
    let loss = w.matmul(&w)?.relu()?.sum_all()?;
    assert!(pool.in_use() > base, "the graph keeps intermediate results");
    loss.backward()?;
    drop(loss);
    assert_eq!(
        pool.in_use(),
        base + 16 * 16 * 4,
        "after the graph goes, only the gradient remains"
    );
    w.zero_grad();
    assert_eq!(pool.in_use(), base);
    Ok(())
}

fn backward_out_of_memory_changes_no_gradient(pool: &Arc<MemoryPool>) -> TestResult {
    let pool = limited(pool, 64 * 1024)?;
    let w = Tensor::randn(&[32, 32], 2, &pool)?.with_requires_grad();
    let x = Tensor::randn(&[8, 32], 3, &pool)?;
    let loss = x.matmul(&w)?.tanh()?.mean_all()?;
    loss.backward()?;
    let first = w.grad().expect("a gradient").to_vec()?;
    let loss = x.matmul(&w)?.tanh()?.mean_all()?;
    let free = pool.limit().unwrap_or(0) - pool.in_use();
    let filler = Tensor::zeros(&[(free / 4) as usize - 8], &pool)?;
    assert!(matches!(
        loss.backward(),
        Err(TensorError::OutOfMemory { .. })
    ));
    assert_eq!(
        w.grad().expect("still there").to_vec()?,
        first,
        "unchanged after the failure"
    );
    drop(filler);
    loss.backward()?;
    let twice: Vec<f32> = first.iter().map(|v| v * 2.0).collect();
    let got = w.grad().expect("accumulated").to_vec()?;
    assert!(
        got.iter()
            .zip(&twice)
            .all(|(a, b)| (a - b).abs() <= 1e-6 * (1.0 + b.abs()))
    );
    Ok(())
}

fn optimizer_out_of_memory_changes_no_parameter(pool: &Arc<MemoryPool>) -> TestResult {
    let pool = limited(pool, 8 * 1024)?;
    let a = Tensor::randn(&[256], 4, &pool)?.with_requires_grad();
    let b = Tensor::randn(&[256], 5, &pool)?.with_requires_grad();
    a.set_grad(Some(Tensor::ones(&[256], &pool)?))?;
    b.set_grad(Some(Tensor::ones(&[256], &pool)?))?;
    let before = (a.to_vec()?, b.to_vec()?);
    let mut adam = Adam::new(vec![a.clone(), b.clone()], AdamConfig::adam(0.1))?;
    // 4 KiB used; Adam needs 4 KiB of state for both parameters; leave room for one.
    let filler = Tensor::zeros(&[512], &pool)?;
    assert!(matches!(adam.step(), Err(TensorError::OutOfMemory { .. })));
    assert_eq!((a.to_vec()?, b.to_vec()?), before, "no parameter moved");
    drop(filler);
    adam.step()?;
    assert_ne!(a.to_vec()?, before.0);
    assert_ne!(b.to_vec()?, before.1);
    Ok(())
}

#[test]
fn replicas_in_threads_each_keep_their_own_quota() -> TestResult {
    let results: Vec<orch_tensor::Result<(f32, u64)>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|i| {
                s.spawn(move || {
                    let pool = MemoryPool::new(orch_tensor::Device::Sim(i), Some(1 << 20))?;
                    let w = Tensor::randn(&[8, 8], 42, &pool)?.with_requires_grad();
                    let x = Tensor::randn(&[4, 8], 7, &pool)?;
                    let loss = x.matmul(&w)?.sqr()?.mean_all()?;
                    loss.backward()?;
                    Ok((loss.to_scalar()?, pool.peak()))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("no panic"))
            .collect()
    });
    let first = results[0].clone()?;
    for r in results {
        assert_eq!(
            r?, first,
            "same seed, same result and peak in every replica"
        );
    }
    Ok(())
}

test_device!(
    exceed_recover_free,
    gradients_and_graphs_are_counted,
    backward_out_of_memory_changes_no_gradient,
    optimizer_out_of_memory_changes_no_parameter,
);
