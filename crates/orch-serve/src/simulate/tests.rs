use super::*;
use crate::core::sched::NativePolicy;
use std::path::Path;

/// A trace line: `at`, tenant, devices, duration, preemptible.
fn tj(at: f64, tenant: &str, gpus: u32, duration: f64, preemptible: bool) -> TraceJob {
    TraceJob {
        at,
        tenant: tenant.into(),
        gpus,
        duration,
        priority: 0,
        preemptible,
        name: None,
        tags: vec![],
        after_ok: vec![],
        after_any: vec![],
        after_failed: vec![],
        singleton: false,
        exit: 0,
    }
}

fn config(text: &str) -> Config {
    Config::parse(Path::new("serve.toml"), text).unwrap()
}

fn two_tenants(share_a: u32, share_b: u32) -> Config {
    config(&format!(
        "[[tenant]]\nname = \"a\"\nusers = [\"a\"]\nshare = {share_a}\n\
         [[tenant]]\nname = \"b\"\nusers = [\"b\"]\nshare = {share_b}\n"
    ))
}

/// A week of one-hour, one-device jobs: `b` submits ten times as many as `a`, and both more
/// than their share of eight devices, so both always have work queued.
fn week(a_per_hour: u32, b_per_hour: u32) -> Vec<TraceJob> {
    let mut jobs = Vec::new();
    for hour in 0..24 * 7 {
        for (tenant, n) in [("a", a_per_hour), ("b", b_per_hour)] {
            for k in 0..n {
                jobs.push(tj(
                    f64::from(hour) * 3600.0 + f64::from(k),
                    tenant,
                    1,
                    3600.0,
                    false,
                ));
            }
        }
    }
    jobs
}

fn run(config: &Config, gpus: u32, trace: &[TraceJob], until: Option<f64>) -> Report {
    simulate(
        config,
        gpus,
        trace,
        Box::new(NativePolicy::new("fair-share").unwrap()),
        until,
    )
    .unwrap()
}

#[test]
fn shares_one_to_one_split_the_machine_in_half() {
    let report = run(&two_tenants(1, 1), 8, &week(6, 60), Some(7.0 * 86400.0));
    for t in &report.tenants {
        assert!(
            (t.share_of_gpu_hours - 0.5).abs() <= 0.05,
            "{}: {:.3}\n{}",
            t.name,
            t.share_of_gpu_hours,
            render(&report)
        );
    }
    assert!(report.utilization > 0.99, "{}", render(&report));
}

#[test]
fn shares_three_to_one_split_it_75_25() {
    let report = run(&two_tenants(3, 1), 8, &week(6, 60), Some(7.0 * 86400.0));
    let a = &report.tenants[0];
    assert!(
        (a.share_of_gpu_hours - 0.75).abs() <= 0.05,
        "{}",
        render(&report)
    );
}

#[test]
fn fifo_does_not_share() {
    let report = simulate(
        &two_tenants(1, 1),
        8,
        &week(6, 60),
        Box::new(NativePolicy::new("fifo").unwrap()),
        Some(7.0 * 86400.0),
    )
    .unwrap();
    assert!(
        report.tenants[0].share_of_gpu_hours < 0.2,
        "{}",
        render(&report)
    );
}

#[test]
fn a_tenant_back_from_a_week_away_is_served_first() {
    // `b` keeps the machine busy for two weeks; `a` used it heavily in week one, then was away.
    let mut trace = week(0, 40);
    trace.extend(week(0, 40).into_iter().map(|mut j| {
        j.at += 7.0 * 86400.0;
        j
    }));
    let back = 14.0 * 86400.0;
    for k in 0..4 {
        trace.push(tj(back + f64::from(k), "a", 1, 600.0, false));
    }
    let report = run(&two_tenants(1, 1), 8, &trace, None);
    let a = &report.tenants[0];
    // It waits only for the first devices to free up (jobs of an hour), not behind b's backlog.
    assert!(a.wait_p95_s <= 3600.0, "{}", render(&report));
    assert_eq!(a.finished, 4);
}

#[test]
fn preemption_serves_a_tenant_under_its_share_at_once() {
    let mut trace: Vec<TraceJob> = (0..8)
        .map(|k| tj(f64::from(k), "b", 1, 86400.0, true))
        .collect();
    trace.push(tj(3600.0, "a", 2, 600.0, false));
    let report = run(&two_tenants(1, 1), 8, &trace, None);
    assert_eq!(report.preemptions, 2, "{}", render(&report));
    assert_eq!(report.tenants[0].wait_p50_s, 0.0);
    // The preempted jobs ran what they had left: all of b's work was done.
    assert!((report.tenants[1].gpu_hours - 8.0 * 24.0).abs() < 1e-6);
    assert_eq!(report.tenants[1].finished, 8);
}

#[test]
fn limits_apply_in_simulation() {
    let c = config(
        "[[tenant]]\nname = \"a\"\nusers = [\"a\"]\nmax_gpus = 2\nmax_queued = 3\nmax_runtime = \"30m\"\n",
    );
    let trace: Vec<TraceJob> = (0..6)
        .map(|k| tj(0.0, "a", 1, if k == 0 { 7200.0 } else { 60.0 }, false))
        .collect();
    let report = run(&c, 8, &trace, None);
    let a = &report.tenants[0];
    // Six at once: three wait in the queue at most (max_queued counts queued jobs).
    assert_eq!(a.rejected, 3, "{}", render(&report));
    assert_eq!(a.time_limited, 1);
    assert!((a.gpu_hours - (1800.0 + 2.0 * 60.0) / 3600.0).abs() < 1e-9);
}

#[test]
fn traces_with_mistakes_name_the_line() {
    let e = parse_trace(
        Path::new("t.jsonl"),
        "{\"at\": 0, \"tenant\": \"a\", \"duration\": 1}\n{\"at\": 0, \"tenant\": \"a\"}\n",
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("t.jsonl:2") && e.contains("duration"), "{e}");
    let e = parse_trace(
        Path::new("t.jsonl"),
        "{\"at\": -1, \"tenant\": \"a\", \"duration\": 1}\n",
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("t.jsonl:1") && e.contains("not a time"), "{e}");
    let c = two_tenants(1, 1);
    let bad = vec![tj(0.0, "zed", 1, 1.0, false)];
    let e = simulate(
        &c,
        8,
        &bad,
        Box::new(NativePolicy::new("fifo").unwrap()),
        None,
    )
    .unwrap_err();
    assert!(e.contains("zed"), "{e}");
}

/// The daemon refuses a job above its tenant's `max_priority` (403); the simulator, with the
/// same admission, rejects it.
#[test]
fn a_priority_above_max_priority_is_rejected_as_the_daemon_refuses_it() {
    let c = config("[[tenant]]\nname = \"a\"\nusers = [\"a\"]\nmax_priority = 5\n");
    let mut high = tj(0.0, "a", 1, 60.0, false);
    high.priority = 6;
    let mut fine = tj(0.0, "a", 1, 60.0, false);
    fine.priority = 5;
    let report = run(&c, 8, &[high, fine], None);
    let a = &report.tenants[0];
    assert_eq!((a.rejected, a.finished), (1, 1), "{}", render(&report));
}

#[test]
fn a_trace_honours_dependencies_and_singleton() {
    let c = two_tenants(1, 1);
    let trace = parse_trace(
        Path::new("t.jsonl"),
        concat!(
            "{\"at\": 0, \"tenant\": \"a\", \"duration\": 100, \"exit\": 1}\n",
            "{\"at\": 1, \"tenant\": \"a\", \"duration\": 10, \"after_ok\": [1]}\n",
            "{\"at\": 1, \"tenant\": \"a\", \"duration\": 10, \"after_any\": [1]}\n",
            "{\"at\": 2, \"tenant\": \"b\", \"duration\": 10, \"after_ok\": [3]}\n",
            "{\"at\": 2, \"tenant\": \"b\", \"duration\": 10, \"after_ok\": [2]}\n",
            "{\"at\": 3, \"tenant\": \"b\", \"duration\": 50, \"name\": \"n\", \"singleton\": true}\n",
            "{\"at\": 4, \"tenant\": \"b\", \"duration\": 50, \"name\": \"n\", \"singleton\": true}\n",
        ),
    )
    .unwrap();
    let report = simulate_with(
        &c,
        8,
        &trace,
        Box::new(NativePolicy::new("fifo").unwrap()),
        None,
        true,
    )
    .unwrap();
    let jobs = report.jobs.unwrap();
    let started = |n: usize| jobs[n - 1].started;
    assert_eq!(started(1), Some(0.0));
    assert_eq!(started(2), None);
    assert_eq!(
        jobs[1].cancelled.as_deref(),
        Some("dependency never satisfied: job 1 failed (exit 1)")
    );
    assert_eq!(
        jobs[4].cancelled.as_deref(),
        Some("dependency never satisfied: job 2 was cancelled")
    );
    assert_eq!(started(3), Some(100.0));
    assert_eq!(started(4), Some(110.0));
    assert_eq!(started(6), Some(3.0));
    assert_eq!(started(7), Some(53.0));
    let b = &report.tenants[1];
    assert_eq!((b.cancelled, b.unfinished), (1, 0));
}

#[test]
fn a_trace_dependency_on_a_later_job_names_the_line() {
    let e = parse_trace(
        Path::new("t.jsonl"),
        "{\"at\": 0, \"tenant\": \"a\", \"duration\": 1, \"after_ok\": [2]}\n{\"at\": 0, \"tenant\": \"a\", \"duration\": 1}\n",
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("t.jsonl:1")
            && e.contains("after_ok names job 2, which is not a job before this one (job 1)"),
        "{e}"
    );
    let e = parse_trace(
        Path::new("t.jsonl"),
        "{\"at\": 5, \"tenant\": \"a\", \"duration\": 1}\n{\"at\": 0, \"tenant\": \"a\", \"duration\": 1, \"after_any\": [1]}\n",
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("t.jsonl:2") && e.contains("submitted later (at 5)"),
        "{e}"
    );
}
