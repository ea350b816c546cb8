//! The scheduling pass with dependencies: 10,000 queued jobs of which half wait on a dependency
//! (a chain, or a running job), against 10,000 that wait on nothing. The pass is the daemon's:
//! the fair-share order over every job and a reason for each, on a machine whose 64 devices are
//! all taken; with dependencies, the reasons of the held jobs too (the engine shows them).
//! Target: at most 5 ms more than without.
//!
//! `cargo bench -p orch-serve --bench deps`

use orch_queue::Machine;
use orch_serve::core::sched::deps::{Kind, Standing, Wait};
use orch_serve::core::sched::{
    Attempt, NativePolicy, QueuedJob, RunningJob, Scheduler, TenantConf,
};
use std::time::Instant;

const QUEUED: u64 = 10_000;
const GPUS: u64 = 64;
const TENANTS: usize = 8;

fn job(id: u64) -> QueuedJob {
    QueuedJob {
        id,
        tenant: (id % TENANTS as u64) as usize,
        name: format!("job-{id}"),
        tags: vec![],
        gpus: 1 + (id % 4) as u32 / 3,
        exclusive: true,
        priority: (id % 3) as i64,
        submitted_s: id as f64,
        queued_s: id as f64,
        runtime_s: None,
        preemptible: id.is_multiple_of(5),
    }
}

/// 64 running jobs (ids 1..=64) and 10,000 queued (65 on); with `held`, every second queued job
/// waits: on the queued job before it (chains), or on a running job.
fn build(held: bool) -> Scheduler {
    let tenants = (0..TENANTS)
        .map(|t| TenantConf {
            name: format!("t{t}"),
            share: 1.0 + (t % 3) as f64,
            max_gpus: None,
        })
        .collect();
    let mut s = Scheduler::new(
        tenants,
        7.0 * 86400.0,
        Box::new(NativePolicy::new("fair-share").expect("a built-in")),
    );
    for id in 1..=GPUS {
        s.add_running(RunningJob {
            id,
            tenant: (id % TENANTS as u64) as usize,
            gpus: 1,
            exclusive: true,
            preemptible: false,
            started_s: 0.0,
            charged_s: 0.0,
            gpu_s: 0.0,
        });
    }
    for id in GPUS + 1..=GPUS + QUEUED {
        let after = if held && id.is_multiple_of(2) {
            let on = if id.is_multiple_of(4) {
                id - 1
            } else {
                id % GPUS + 1
            };
            vec![(Kind::AfterOk, on)]
        } else {
            Vec::new()
        };
        let wait = Wait {
            after,
            singleton: false,
            group: format!("u{}/job-{id}", id % 7),
        };
        s.enqueue_after(job(id), wait, &mut |_| Standing::Active)
            .expect("nothing ended");
    }
    s
}

/// Median and 95th percentile of `runs` timed passes, ms.
fn measure(held: bool, runs: usize) -> (f64, f64, usize, usize) {
    let mut times = Vec::with_capacity(runs);
    let (mut queued, mut waiting) = (0, 0);
    for _ in 0..runs {
        let mut s = build(held);
        queued = s.queued();
        waiting = s.held_back();
        let started = Instant::now();
        let report = s.pass(
            1.0e6,
            Machine {
                free_gpus: 0,
                total_gpus: GPUS as u32,
            },
            &mut |_| Attempt::Started,
        );
        let reasons = s.held_reasons();
        let took = started.elapsed().as_secs_f64() * 1000.0;
        assert!(report.started.is_empty());
        assert_eq!(report.reasons.len() + reasons.len(), QUEUED as usize);
        times.push(took);
    }
    times.sort_by(f64::total_cmp);
    let at = |p: f64| times[((p * runs as f64).ceil() as usize).clamp(1, runs) - 1];
    (at(0.5), at(0.95), queued, waiting)
}

fn main() {
    let runs = std::env::var("ORCH_BENCH_RUNS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(40);
    // Interleaved, so that a busy machine slows both alike.
    let (mut without, mut with) = (Vec::new(), Vec::new());
    for _ in 0..2 {
        without.push(measure(false, runs / 2));
        with.push(measure(true, runs / 2));
    }
    let median = |m: &[(f64, f64, usize, usize)]| (m[0].0 + m[1].0) / 2.0;
    let p95 = |m: &[(f64, f64, usize, usize)]| m[0].1.max(m[1].1);
    let (w, h) = (median(&without), median(&with));
    println!(
        "pass, {QUEUED} queued on {GPUS} busy devices, fair-share, reasons for all: without dependencies: median {w:.2} ms (p95 {:.2}); half waiting on a dependency ({} in the queue, {} held): median {h:.2} ms (p95 {:.2}); difference {:+.2} ms",
        p95(&without),
        with[0].2,
        with[0].3,
        p95(&with),
        h - w
    );
}
