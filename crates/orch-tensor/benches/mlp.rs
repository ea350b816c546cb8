//! One training step of a 784-512-256-10 ReLU MLP at batch 128 on the CPU: forward,
//! cross-entropy, backward, SGD with momentum. Run: `cargo bench -p orch-tensor --bench mlp`.

#[path = "support/common.rs"]
mod common;
#[path = "support/mlp_model.rs"]
mod mlp_model;

use orch_tensor::MemoryPool;
use std::time::Duration;

fn main() -> orch_tensor::Result<()> {
    let all = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!("MLP 784-512-256-10 ReLU, batch 128, SGD momentum 0.9: ms per training step (median)");
    println!("{:>10} {:>10}", "threads", "ms/step");
    for t in [1, all] {
        let pool = MemoryPool::cpu();
        let mut model = mlp_model::Mlp::new(&pool, 128)?;
        let secs = common::threads(t).install(|| {
            common::median_secs(
                5,
                20,
                Duration::from_secs(2),
                || model.step().expect("step"),
                || {},
            )
        });
        let label = if t == 1 { "1" } else { "all" };
        common::kv(&format!("mlp/{label}"), secs * 1e3);
        println!("{t:>10} {:>10.3}", secs * 1e3);
        println!(
            "  (peak memory {:.1} MiB, final loss {:.4})",
            pool.peak() as f64 / 1048576.0,
            model.loss()?
        );
    }
    Ok(())
}
