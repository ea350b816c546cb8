//! `orch simulate` speed: a month of trace with 100,000 jobs on 64 GPUs, eight tenants of
//! unequal shares, under each built-in queue policy. Target: under 10 s.
//!
//! `cargo bench -p orch-serve --bench simulate`

use orch_serve::Config;
use orch_serve::core::sched::NativePolicy;
use orch_serve::simulate::{TraceJob, render, simulate};
use std::path::Path;
use std::time::Instant;

/// A deterministic month of jobs: sizes 1, 2, 4 or 8 GPUs (mostly 1), durations from five
/// minutes to twelve hours (log-uniform), offered load `load` times the machine.
fn trace(jobs: usize, gpus: u32, days: f64, load: f64, tenants: usize) -> Vec<TraceJob> {
    let mut seed = 0x2545f4914f6cdd1du64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed >> 11) as f64 / (1u64 << 53) as f64
    };
    let span = days * 86400.0;
    let mut out: Vec<TraceJob> = (0..jobs)
        .map(|_| {
            let r = next();
            let size = if r < 0.6 {
                1
            } else if r < 0.8 {
                2
            } else if r < 0.95 {
                4
            } else {
                8
            };
            let duration = (300f64.ln() + next() * (43200f64.ln() - 300f64.ln())).exp();
            // Tenant t submits in proportion to t + 1.
            let weights: f64 = (1..=tenants).map(|t| t as f64).sum();
            let mut pick = next() * weights;
            let mut tenant = 0;
            while pick > (tenant + 1) as f64 {
                pick -= (tenant + 1) as f64;
                tenant += 1;
            }
            TraceJob {
                at: next() * span,
                tenant: format!("t{}", tenant.min(tenants - 1)),
                gpus: size,
                duration,
                priority: (next() * 3.0) as i64,
                preemptible: next() < 0.3,
                name: None,
                tags: vec![],
                after_ok: vec![],
                after_any: vec![],
                after_failed: vec![],
                singleton: false,
                exit: 0,
            }
        })
        .collect();
    // Scale durations to the offered load.
    let work: f64 = out.iter().map(|j| f64::from(j.gpus) * j.duration).sum();
    let scale = load * span * f64::from(gpus) / work;
    for j in &mut out {
        j.duration *= scale;
    }
    out
}

fn main() {
    let tenants = 8;
    let mut config_text = String::new();
    for t in 0..tenants {
        config_text.push_str(&format!(
            "[[tenant]]\nname = \"t{t}\"\nusers = [\"u{t}\"]\nshare = {}\n",
            1 + t % 3
        ));
    }
    let config = Config::parse(Path::new("bench.toml"), &config_text).expect("valid config");
    let gpus = 64;
    for load in [0.9, 1.5] {
        let jobs = trace(100_000, gpus, 30.0, load, tenants);
        for policy in ["fair-share", "fifo", "priority"] {
            let started = Instant::now();
            let report = simulate(
                &config,
                gpus,
                &jobs,
                Box::new(NativePolicy::new(policy).expect("a built-in")),
                Some(30.0 * 86400.0),
            )
            .expect("the trace fits the config");
            let took = started.elapsed();
            println!(
                "100,000 jobs, 30 days, 64 GPUs, offered load {load}: {policy:<10} {:>7.2} s  ({} passes, utilization {:.1}%, {} preemptions)",
                took.as_secs_f64(),
                report.passes,
                report.utilization * 100.0,
                report.preemptions
            );
            if policy == "fair-share" && load > 1.0 {
                print!("{}", render(&report));
            }
        }
    }
    // preempt_after: jobs wait a while before preemption is asked for them (fewer preemptions).
    let calm = Config::parse(
        Path::new("bench.toml"),
        &format!("preempt_after = \"10m\"\n{config_text}"),
    )
    .expect("valid config");
    let jobs = trace(100_000, gpus, 30.0, 0.9, tenants);
    let started = Instant::now();
    let report = simulate(
        &calm,
        gpus,
        &jobs,
        Box::new(NativePolicy::new("fair-share").expect("a built-in")),
        Some(30.0 * 86400.0),
    )
    .expect("the trace fits the config");
    println!(
        "100,000 jobs, 30 days, 64 GPUs, offered load 0.9, preempt_after 10m: fair-share {:>7.2} s  ({} preemptions)",
        started.elapsed().as_secs_f64(),
        report.preemptions
    );
}
