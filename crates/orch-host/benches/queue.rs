//! What a scheduling pass's queue order costs: the built-in `fair-share` queue policy over 1,000
//! and 10,000 queued jobs of 50 tenants, as a warm call on a reused instance and as a fresh
//! instance plus call, beside `orch_queue::fair_share` natively on the same input. Run with
//! `cargo bench -p orch-host --bench queue`.
//!
//! Each Wasm number is the whole host path a pass takes: copying the jobs and tenants into WIT
//! records, lowering them into the guest, the guest's conversion and ordering (the very same
//! `orch_queue::fair_share`, compiled to wasm), lifting the answer, cleaning the reasons and
//! checking the order. Per-pass times, p50 and p99 of many passes.
//! Target: a warm pass over 10,000 jobs ≤ 20 ms.

use orch_host::{Limits, PluginRef, QueueHost};
use orch_queue::{Job, Machine, Tenant, TenantInput};
use std::hint::black_box;
use std::time::{Duration, Instant};

const TENANTS: usize = 50;

fn tenants() -> Vec<Tenant> {
    let inputs: Vec<TenantInput> = (0..TENANTS)
        .map(|i| TenantInput {
            name: format!("lab-{i:02}"),
            share: 1.0 + (i % 4) as f64,
            usage_gpu_s: ((i * 7919) % 500) as f64 * 3600.0,
            gpus_held: (i % 3) as u32,
            max_gpus: (i % 2 == 0).then_some(8),
            queued: 0,
            running: (i % 3) as u32,
        })
        .collect();
    Tenant::all(&inputs)
}

/// `n` jobs as a busy lab queues them: sweeps with a name, a tag or two, priorities, a runtime.
fn jobs(n: usize) -> Vec<Job> {
    (0..n)
        .map(|i| Job {
            id: 1_000 + i as u64,
            tenant: ((i * 31) % TENANTS) as u32,
            name: format!("sweep-lr-{}-seed-{}", i % 13, i % 5),
            tags: if i % 3 == 0 {
                vec!["sweep".into(), "paper-deadline".into()]
            } else {
                vec!["sweep".into()]
            },
            gpus: 1 + (i % 4) as u32,
            priority: (i % 5) as i64 - 1,
            age_s: (n - i) as f64 * 2.5,
            runtime_s: (i % 2 == 0).then_some(4.0 * 3600.0),
            preemptible: i % 7 == 0,
        })
        .collect()
}

const MACHINE: Machine = Machine {
    free_gpus: 3,
    total_gpus: 8,
};

/// Per-call times of `passes` calls of `f`, after `warmup` calls, sorted.
fn times(warmup: usize, passes: usize, mut f: impl FnMut()) -> Vec<Duration> {
    for _ in 0..warmup {
        f();
    }
    let mut samples: Vec<Duration> = (0..passes)
        .map(|_| {
            let start = Instant::now();
            f();
            start.elapsed()
        })
        .collect();
    samples.sort();
    samples
}

/// The `p`th percentile of sorted `samples` (nearest rank).
fn percentile(samples: &[Duration], p: f64) -> Duration {
    let rank = ((p / 100.0) * samples.len() as f64).ceil() as usize;
    samples[rank.clamp(1, samples.len()) - 1]
}

fn millis(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

fn main() {
    let cache = std::env::temp_dir().join("orch-bench-cache");
    let limits = Limits::queue_default();
    let mut host = match QueueHost::with_cache_dir(limits, Some(cache)) {
        Ok(host) => host,
        Err(e) => {
            eprintln!("cannot start the queue host: {e}");
            std::process::exit(1);
        }
    };
    let id = match host.load(&PluginRef::Builtin("fair-share".into())) {
        Ok(id) => id,
        Err(e) => {
            eprintln!("cannot load fair-share: {e}");
            std::process::exit(1);
        }
    };
    let tenants = tenants();
    println!(
        "queue policy fair-share, {TENANTS} tenants; limits: deadline {} ms, memory {} MiB",
        limits.deadline.as_millis(),
        limits.memory_bytes >> 20
    );
    println!(
        "{:<7} {:>11} {:>11} {:>11} {:>11} {:>9} {:>11}",
        "jobs", "native p50", "native p99", "warm p50", "warm p99", "warm/nat", "fresh p50"
    );
    let mut warm_10k = Duration::ZERO;
    for (n, passes) in [(1_000, 400), (10_000, 100)] {
        let queue = jobs(n);
        let native_order = orch_queue::fair_share(&queue, &tenants, &MACHINE);
        match host.order(id, &queue, &tenants, &MACHINE) {
            Ok(answer) => {
                let same = answer.len() == native_order.len()
                    && answer.iter().zip(&native_order).all(|(a, b)| {
                        a.job == b.job && a.reason == orch_queue::clean_reason(&b.reason)
                    });
                assert!(same, "wasm and native agree at {n} jobs");
            }
            Err(e) => {
                eprintln!("fair-share failed at {n} jobs: {e}");
                std::process::exit(1);
            }
        }
        let native = times(5, passes, || {
            black_box(orch_queue::fair_share(
                black_box(&queue),
                black_box(&tenants),
                black_box(&MACHINE),
            ));
        });
        let warm = times(5, passes, || {
            black_box(host.order(id, &queue, &tenants, &MACHINE).ok());
        });
        let fresh = times(2, passes / 4, || {
            host.discard_instance(id);
            black_box(host.order(id, &queue, &tenants, &MACHINE).ok());
        });
        let ratio = percentile(&warm, 50.0).as_secs_f64() / percentile(&native, 50.0).as_secs_f64();
        println!(
            "{:<7} {:>11} {:>11} {:>11} {:>11} {:>8.1}x {:>11}",
            n,
            millis(percentile(&native, 50.0)),
            millis(percentile(&native, 99.0)),
            millis(percentile(&warm, 50.0)),
            millis(percentile(&warm, 99.0)),
            ratio,
            millis(percentile(&fresh, 50.0)),
        );
        if n == 10_000 {
            warm_10k = percentile(&warm, 50.0);
        }
    }
    // The fixed cost of a pass: crossing into the sandbox with an empty queue.
    let empty = times(100, 2_000, || {
        black_box(host.order(id, &[], &tenants, &MACHINE).ok());
    });
    println!(
        "a warm pass over an empty queue (50 tenants still copied in): p50 {:.1} µs",
        percentile(&empty, 50.0).as_secs_f64() * 1e6
    );
    if warm_10k <= Duration::from_millis(20) {
        println!("target met: a warm pass over 10,000 jobs <= 20 ms");
    } else {
        println!(
            "target missed: a warm pass over 10,000 jobs {} > 20 ms",
            millis(warm_10k)
        );
    }
}
