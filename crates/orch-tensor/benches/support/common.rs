//! Timing helpers shared by the benchmarks (included with `#[path]`; not every bench uses all).
#![allow(dead_code)]

use std::time::{Duration, Instant};

/// Median seconds per call of `f`, after `warmup` calls, over at least `min_reps` calls and
/// at least `min_time` of wall time. `sync` runs before each clock stop.
pub fn median_secs(
    warmup: usize,
    min_reps: usize,
    min_time: Duration,
    mut f: impl FnMut(),
    mut sync: impl FnMut(),
) -> f64 {
    for _ in 0..warmup {
        f();
    }
    sync();
    let mut times = Vec::new();
    let start = Instant::now();
    while times.len() < min_reps || start.elapsed() < min_time {
        let t = Instant::now();
        f();
        sync();
        times.push(t.elapsed().as_secs_f64());
    }
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

/// A rayon pool of `threads` threads (gemm and the CPU kernels use the current rayon pool).
pub fn threads(n: usize) -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new()
        .num_threads(n)
        .build()
        .expect("a rayon thread pool")
}

/// Machine-readable result line, parsed by scripts/bench-tensor.sh.
pub fn kv(key: &str, value: f64) {
    println!("kv {key} {value:.4}");
}
