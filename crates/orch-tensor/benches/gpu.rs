//! CUDA benchmarks: SGEMM (FP32 and TF32) TFLOP/s and the MLP training step. Skips (exit 0) when
//! CUDA is not usable. Run: `cargo bench -p orch-tensor --bench gpu`.

#[path = "support/common.rs"]
mod common;
#[path = "support/mlp_model.rs"]
mod mlp_model;

use orch_tensor::{Device, MemoryPool, Tensor};
use std::time::Duration;

fn main() -> orch_tensor::Result<()> {
    let pool = match orch_tensor::cuda::device_count() {
        Ok(n) if n > 0 => MemoryPool::new(Device::Cuda(0), None)?,
        Ok(_) => return skip("no CUDA device"),
        Err(e) => return skip(&e.to_string()),
    };
    let sync = || pool.synchronize().expect("synchronize");
    println!("GPU SGEMM on cuda:0, C = A B with n x n operands, TFLOP/s (median, synced)");
    println!("{:>6} {:>10} {:>10}", "n", "FP32", "TF32");
    for n in [1024usize, 2048, 4096, 8192] {
        let a = Tensor::randn(&[n, n], 1, &pool)?;
        let b = Tensor::randn(&[n, n], 2, &pool)?;
        let flops = 2.0 * (n as f64).powi(3);
        let mut row = Vec::new();
        for tf32 in [false, true] {
            pool.set_allow_tf32(tf32);
            let secs = common::median_secs(
                3,
                10,
                Duration::from_millis(800),
                || drop(a.matmul(&b).expect("matmul")),
                sync,
            );
            let tflops = flops / secs / 1e12;
            common::kv(
                &format!("gpu_sgemm/{n}/{}", if tf32 { "tf32" } else { "fp32" }),
                tflops,
            );
            row.push(tflops);
        }
        println!("{n:>6} {:>10.2} {:>10.2}", row[0], row[1]);
    }
    pool.set_allow_tf32(false);
    println!("MLP 784-512-256-10 ReLU, SGD momentum, on cuda:0: ms per step (median, synced)");
    for batch in [128usize, 1024] {
        let mut model = mlp_model::Mlp::new(&pool, batch)?;
        let secs = common::median_secs(
            5,
            20,
            Duration::from_secs(1),
            || model.step().expect("step"),
            sync,
        );
        common::kv(&format!("gpu_mlp/{batch}"), secs * 1e3);
        println!(
            "  batch {batch:>5}: {:.3} ms/step (loss {:.4})",
            secs * 1e3,
            model.loss()?
        );
    }
    Ok(())
}

fn skip(reason: &str) -> orch_tensor::Result<()> {
    assert!(
        std::env::var("ORCH_REQUIRE_GPU").as_deref() != Ok("1"),
        "ORCH_REQUIRE_GPU=1 but CUDA is not usable: {reason}"
    );
    println!("GPU benchmarks skipped: {reason}");
    Ok(())
}
