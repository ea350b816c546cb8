//! CPU SGEMM throughput of `Tensor::matmul` (the `gemm` crate, AVX-512 kernels where the CPU
//! has them) at n = 256, 1024, 2048 on one thread and on all threads.
//! Run: `cargo bench -p orch-tensor --bench sgemm`.

#[path = "support/common.rs"]
mod common;

use orch_tensor::{MemoryPool, Tensor};
use std::time::Duration;

fn main() -> orch_tensor::Result<()> {
    let all = std::thread::available_parallelism().map_or(1, |n| n.get());
    let pool = MemoryPool::cpu();
    println!("CPU SGEMM, f32, C = A B with n x n operands, GFLOP/s (median)");
    println!(
        "{:>6} {:>12} {:>12}",
        "n",
        "1 thread",
        format!("{all} threads")
    );
    for n in [256usize, 1024, 2048] {
        let a = Tensor::randn(&[n, n], 1, &pool)?;
        let b = Tensor::randn(&[n, n], 2, &pool)?;
        let flops = 2.0 * (n as f64).powi(3);
        let mut row = Vec::new();
        for t in [1, all] {
            let secs = common::threads(t).install(|| {
                common::median_secs(
                    2,
                    5,
                    Duration::from_millis(1500),
                    || drop(a.matmul(&b).expect("matmul")),
                    || {},
                )
            });
            let gflops = flops / secs / 1e9;
            common::kv(
                &format!("sgemm/{n}/{}", if t == 1 { "1" } else { "all" }),
                gflops,
            );
            row.push(gflops);
        }
        println!("{n:>6} {:>12.1} {:>12.1}", row[0], row[1]);
    }
    Ok(())
}
