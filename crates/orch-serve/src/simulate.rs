//! `orch simulate`: a trace of submissions replayed through the daemon's scheduler
//! ([`crate::core::sched::Scheduler`]) in virtual time. Labs use it to choose shares and to try a
//! queue policy on their own history before deploying it; tests use it to check fairness.
//!
//! What it models: jobs arrive at their time, wait in the queue, run for their duration on as
//! many devices as they ask, and end; the tenants' limits (`max_gpus`, `max_queued`,
//! `max_priority`, `max_runtime`) apply as in the daemon, whose admission steps
//! ([`crate::core::submit::Ticket`]) refuse the same jobs here; a preempted job goes back to the queue and
//! later runs what it had left (it resumes from a checkpoint). Placement is by device count:
//! every device of the inventory is alike here.

use crate::core::admission;
use crate::core::config::Config;
use crate::core::sched::deps::{Kind, Standing, Wait};
use crate::core::sched::{Attempt, QueuePolicy, QueuedJob, Scheduler, TenantConf};
use crate::core::submit;
use orch_core::InputError;
use orch_queue::Machine;
use serde::{Deserialize, Serialize};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::path::Path;

/// One line of a trace.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TraceJob {
    /// Submission time, seconds from the trace's start.
    pub at: f64,
    pub tenant: String,
    #[serde(default = "one")]
    pub gpus: u32,
    /// How long it runs once started, seconds.
    pub duration: f64,
    #[serde(default)]
    pub priority: i64,
    #[serde(default)]
    pub preemptible: bool,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub tags: Vec<String>,
    /// Jobs (numbered by their line among the trace's jobs, from 1) that must succeed first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub after_ok: Vec<u64>,
    /// Jobs that must end first, however they end.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub after_any: Vec<u64>,
    /// Jobs that must end without succeeding first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub after_failed: Vec<u64>,
    /// At most one running job of its tenant and name at a time.
    #[serde(default)]
    pub singleton: bool,
    /// Its exit status when it runs to its end: any other than 0 fails it.
    #[serde(default)]
    pub exit: i32,
}

fn one() -> u32 {
    1
}

/// Reads a trace from standard input (named `-` in messages).
pub fn read_trace_stdin() -> Result<Vec<TraceJob>, InputError> {
    let path = Path::new("-");
    let mut text = String::new();
    std::io::Read::read_to_string(&mut std::io::stdin(), &mut text).map_err(|e| {
        InputError::at(path, "", 0, format!("cannot read the trace from standard input: {e}"))
            .with_hint("give a file of JSON lines such as {\"at\": 0, \"tenant\": \"vision\", \"gpus\": 1, \"duration\": 3600}")
    })?;
    parse_trace(path, &text)
}

/// Reads a trace: JSON lines (blank lines and lines starting with `#` are skipped).
pub fn read_trace(path: &Path) -> Result<Vec<TraceJob>, InputError> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        InputError::at(path, "", 0, format!("cannot read the trace: {e}"))
            .with_hint("give a file of JSON lines such as {\"at\": 0, \"tenant\": \"vision\", \"gpus\": 1, \"duration\": 3600}")
    })?;
    parse_trace(path, &text)
}

pub fn parse_trace(path: &Path, text: &str) -> Result<Vec<TraceJob>, InputError> {
    let mut jobs: Vec<TraceJob> = Vec::new();
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        let start = offset;
        offset += line.len();
        let trimmed = line.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        let job: TraceJob = serde_json::from_str(trimmed).map_err(|e| {
            let column = e.column().saturating_sub(1);
            InputError::at(path, text, start + column.min(line.len()), format!("not a trace line: {e}"))
                .with_hint("each line is {\"at\": SECONDS, \"tenant\": NAME, \"gpus\": N, \"duration\": SECONDS, \"priority\": 0, \"preemptible\": false}")
        })?;
        let bad = |what: String| {
            InputError::at(path, text, start, what)
                .with_hint("times and durations are seconds: finite and not negative")
        };
        if !(job.at.is_finite() && job.at >= 0.0) {
            return Err(bad(format!("at = {} is not a time", job.at)));
        }
        if !(job.duration.is_finite() && job.duration >= 0.0) {
            return Err(bad(format!(
                "duration = {} is not a duration",
                job.duration
            )));
        }
        if job.gpus == 0 {
            return Err(bad("gpus = 0: a job asks for at least one device".into()));
        }
        let number = jobs.len() as u64 + 1;
        for (key, list) in [
            ("after_ok", &job.after_ok),
            ("after_any", &job.after_any),
            ("after_failed", &job.after_failed),
        ] {
            for &on in list {
                let earlier = on
                    .checked_sub(1)
                    .and_then(|i| jobs.get(i as usize))
                    .filter(|_| on < number);
                let Some(earlier) = earlier else {
                    return Err(InputError::at(
                        path,
                        text,
                        start,
                        format!("{key} names job {on}, which is not a job before this one (job {number})"),
                    )
                    .with_hint("jobs are numbered by their line among the trace's jobs, from 1; a job waits only on one before it"));
                };
                if earlier.at > job.at {
                    return Err(InputError::at(
                        path,
                        text,
                        start,
                        format!(
                            "{key} names job {on}, submitted later (at {}) than this one (at {})",
                            earlier.at, job.at
                        ),
                    )
                    .with_hint("a job waits only on one submitted before it, as the daemon refuses an id it does not know"));
                }
            }
        }
        jobs.push(job);
    }
    Ok(jobs)
}

/// What the simulator reports per tenant.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TenantReport {
    pub name: String,
    /// Jobs it submitted (rejected ones included).
    pub jobs: u64,
    pub gpu_hours: f64,
    /// Its part of every tenant's GPU-hours.
    pub share_of_gpu_hours: f64,
    /// Wait from submission to first start, of the jobs that started.
    pub wait_p50_s: f64,
    pub wait_p95_s: f64,
    /// Its configured share, normalized: what fair share aims at.
    pub target_share: f64,
    /// Its part of the GPU-hours used while every tenant of the trace had work queued.
    pub share_while_contended: Option<f64>,
    pub finished: u64,
    /// Jobs still queued or running when the simulation stopped.
    pub unfinished: u64,
    /// Refused at submission, as the daemon would refuse it ([`crate::core::admission`]): over
    /// `max_queued`, above `max_priority`, or more devices than the machine has.
    pub rejected: u64,
    /// Stopped by `max_runtime`.
    pub time_limited: u64,
    /// Times its jobs were preempted.
    pub preempted: u64,
    /// Ended by a dependency that could no longer be met.
    #[serde(default)]
    pub cancelled: u64,
}

/// The simulator's report (`orch simulate --json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    pub tenants: Vec<TenantReport>,
    /// Device-seconds used over device-seconds there were, from the first submission to the end.
    pub utilization: f64,
    pub preemptions: u64,
    /// From the first submission to the last end (or `--until`).
    pub makespan_s: f64,
    pub gpus: u32,
    pub queue_policy: String,
    /// Hours during which every tenant of the trace had work queued.
    pub contended_hours: f64,
    /// Scheduling passes run.
    pub passes: u64,
    /// Each job's life, in trace order (with `--jobs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jobs: Option<Vec<JobReport>>,
}

/// One job of the trace, as the simulation ran it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobReport {
    /// Its line among the trace's jobs, from 1.
    pub job: u64,
    pub tenant: String,
    pub at: f64,
    /// First start, when it started.
    pub started: Option<f64>,
    /// Its end, when it ended.
    pub ended: Option<f64>,
    pub preempted: u32,
    pub rejected: bool,
    /// Why it was cancelled: a dependency that could no longer be met.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cancelled: Option<String>,
}

struct SimJob {
    tenant: usize,
    at: f64,
    remaining: f64,
    limit: Option<f64>,
    run: u32,
    started: Option<f64>,
    first_start: Option<f64>,
    ended: Option<f64>,
    preempted: u32,
    queued: QueuedJob,
    /// Its exit status at its end.
    exit: i32,
    cancelled: Option<String>,
}

use crate::core::sched::Secs as T;

/// Replays `trace` on a machine of `gpus` devices under `config`'s tenants and limits, with
/// `policy` ordering the queue, until every job ended or `until` seconds.
pub fn simulate(
    config: &Config,
    gpus: u32,
    trace: &[TraceJob],
    policy: Box<dyn QueuePolicy>,
    until: Option<f64>,
) -> Result<Report, String> {
    simulate_with(config, gpus, trace, policy, until, false)
}

/// [`simulate`], with each job's life in the report when `per_job`.
pub fn simulate_with(
    config: &Config,
    gpus: u32,
    trace: &[TraceJob],
    policy: Box<dyn QueuePolicy>,
    until: Option<f64>,
    per_job: bool,
) -> Result<Report, String> {
    let policy_name = policy.name().to_string();
    let mut sched = Scheduler::for_config(config, policy);
    let tenants: Vec<TenantConf> = sched.tenants().to_vec();
    sched.keep_reasons = false;
    // Victims stop at once in virtual time: the devices go to their job in the same moment.
    sched.reservation_s = 0.0;
    let n = tenants.len();
    let index: HashMap<&str, usize> = tenants
        .iter()
        .enumerate()
        .map(|(i, t)| (t.name.as_str(), i))
        .collect();
    let mut order: Vec<usize> = (0..trace.len()).collect();
    order.sort_by(|&a, &b| T(trace[a].at).cmp(&T(trace[b].at)).then(a.cmp(&b)));
    for (line, job) in trace.iter().enumerate() {
        if !index.contains_key(job.tenant.as_str()) {
            return Err(format!(
                "trace job {} (line {} of the jobs) names tenant \"{}\", which the config does not list",
                line + 1,
                line + 1,
                job.tenant
            ));
        }
    }
    let in_trace: Vec<bool> = (0..n)
        .map(|t| trace.iter().any(|j| index[j.tenant.as_str()] == t))
        .collect();

    let mut jobs: HashMap<u64, SimJob> = HashMap::new();
    let mut ends: BinaryHeap<Reverse<(T, u64, u32)>> = BinaryHeap::new();
    let mut used = vec![0.0f64; n];
    let mut contended_used = vec![0.0f64; n];
    let mut contended_s = 0.0;
    let mut submitted = vec![0u64; n];
    let mut rejected = vec![0u64; n];
    let mut finished = vec![0u64; n];
    let mut time_limited = vec![0u64; n];
    let mut preempted = vec![0u64; n];
    let mut waits: Vec<Vec<f64>> = vec![Vec::new(); n];
    let mut cancelled = vec![0u64; n];
    // How each job that ended did (`ok`, how), for the jobs that wait on it.
    let mut ended: HashMap<u64, (bool, String)> = HashMap::new();
    // Ends the jobs a dependency's end cancels (their reasons say which).
    let mut cancel = |jobs: &mut HashMap<u64, SimJob>,
                      ended: &mut HashMap<u64, (bool, String)>,
                      gone: Vec<(u64, String)>,
                      now: f64| {
        for (id, reason) in gone {
            if let Some(job) = jobs.get_mut(&id) {
                job.cancelled = Some(reason);
                job.ended = Some(now);
                cancelled[job.tenant] += 1;
            }
            ended.insert(id, (false, "was cancelled".into()));
        }
    };
    let mut passes = 0u64;
    let start = order.first().map_or(0.0, |&i| trace[i].at);
    let mut now = start;
    let mut next = 0usize;

    loop {
        let next_arrival = order.get(next).map(|&i| trace[i].at);
        let next_end = ends.peek().map(|Reverse((t, _, _))| t.0);
        let Some(mut t) = [next_arrival, next_end]
            .into_iter()
            .flatten()
            .reduce(f64::min)
        else {
            break;
        };
        let stop = until.is_some_and(|u| t > u);
        if let Some(u) = until
            && stop
        {
            t = u.max(now);
        }
        // Advance the clock: use and contention over [now, t).
        let dt = t - now;
        if dt > 0.0 {
            let contended = (0..n).all(|i| !in_trace[i] || sched.queued_of(i) > 0);
            if contended {
                contended_s += dt;
            }
            for i in 0..n {
                let g = f64::from(sched.held(i)) * dt;
                used[i] += g;
                if contended {
                    contended_used[i] += g;
                }
            }
        }
        now = t;
        if stop {
            break;
        }
        // Ends first: the devices they free go to this moment's pass.
        while let Some(&Reverse((end, id, run))) = ends.peek() {
            if end.0 > now {
                break;
            }
            ends.pop();
            let Some(job) = jobs.get_mut(&id) else {
                continue;
            };
            if job.run != run || job.started.is_none() {
                continue; // preempted since
            }
            sched.end(id, now);
            let ran = now - job.started.take().unwrap_or(now);
            job.remaining -= ran;
            let how = if job.remaining > 1e-9 {
                time_limited[job.tenant] += 1;
                (false, "failed (time limit)".to_string())
            } else if job.exit != 0 {
                (false, format!("failed (exit {})", job.exit))
            } else {
                (true, "succeeded".to_string())
            };
            job.ended = Some(now);
            finished[job.tenant] += 1;
            ended.insert(id, how.clone());
            let gone = sched.dependency_ended(id, how.0, how.1);
            cancel(&mut jobs, &mut ended, gone, now);
        }
        while let Some(&i) = order.get(next) {
            if trace[i].at > now {
                break;
            }
            next += 1;
            let tj = &trace[i];
            let tenant = index[tj.tenant.as_str()];
            submitted[tenant] += 1;
            let limits = &config.tenants[tenant];
            let place = format!("trace job {}", i + 1);
            let ticket = submit::Ticket {
                asked: admission::Asked {
                    place: &place,
                    gpus_at: &place,
                    gpus: tj.gpus,
                    priority: tj.priority,
                },
                tasks: None,
            };
            let queued = sched.queued_of(tenant) as u64;
            // The daemon's own admission: what it would refuse is rejected here.
            let id = i as u64 + 1;
            if ticket.admit(limits, gpus as usize, queued).is_err() {
                rejected[tenant] += 1;
                let how = "was rejected at submission".to_string();
                ended.insert(id, (false, how.clone()));
                let gone = sched.dependency_ended(id, false, how);
                cancel(&mut jobs, &mut ended, gone, now);
                continue;
            }
            let queued = QueuedJob {
                id,
                tenant,
                name: tj.name.clone().unwrap_or_else(|| format!("job-{id}")),
                tags: tj.tags.clone(),
                gpus: tj.gpus,
                exclusive: true,
                priority: tj.priority,
                submitted_s: tj.at,
                queued_s: tj.at,
                runtime_s: limits.max_runtime.map(|d| d.as_secs_f64()),
                preemptible: tj.preemptible,
            };
            let name = queued.name.clone();
            let wait = Wait {
                after: [
                    (Kind::AfterOk, &tj.after_ok),
                    (Kind::AfterAny, &tj.after_any),
                    (Kind::AfterFailed, &tj.after_failed),
                ]
                .into_iter()
                .flat_map(|(kind, ids)| ids.iter().map(move |&on| (kind, on)))
                .collect(),
                singleton: tj.singleton,
                group: format!("{}/{name}", tj.tenant),
            };
            let mut standing = |on: u64| match ended.get(&on) {
                Some((ok, how)) => Standing::Ended {
                    ok: *ok,
                    how: how.clone(),
                },
                None => Standing::Active,
            };
            let never = sched
                .enqueue_after(queued.clone(), wait, &mut standing)
                .err();
            jobs.insert(
                id,
                SimJob {
                    exit: tj.exit,
                    cancelled: None,
                    tenant,
                    at: tj.at,
                    remaining: tj.duration,
                    limit: limits.max_runtime.map(|d| d.as_secs_f64()),
                    run: 0,
                    started: None,
                    first_start: None,
                    ended: None,
                    preempted: 0,
                    queued,
                },
            );
            if let Some(reason) = never {
                let gone = sched.dependency_ended(id, false, "was cancelled".into());
                cancel(&mut jobs, &mut ended, vec![(id, reason)], now);
                cancel(&mut jobs, &mut ended, gone, now);
            }
        }
        // Passes until nothing more starts or is preempted at this moment.
        for _ in 0..4 {
            if sched.queued() == 0 {
                break;
            }
            passes += 1;
            let machine = Machine {
                free_gpus: gpus.saturating_sub((0..n).map(|i| sched.held(i)).sum()),
                total_gpus: gpus,
            };
            let report = sched.pass(now, machine, &mut |_| Attempt::Started);
            if let Some(failure) = &report.policy_failure {
                tracing::warn!("{failure}");
            }
            for &id in &report.started {
                let Some(job) = jobs.get_mut(&id) else {
                    continue;
                };
                job.run += 1;
                job.started = Some(now);
                if job.first_start.is_none() {
                    job.first_start = Some(now);
                    waits[job.tenant].push(now - job.at);
                }
                let runs_for = job.limit.map_or(job.remaining, |l| job.remaining.min(l));
                ends.push(Reverse((T(now + runs_for), id, job.run)));
            }
            for p in &report.preempt {
                let Some(job) = jobs.get_mut(&p.victim) else {
                    continue;
                };
                let Some(started) = job.started.take() else {
                    continue;
                };
                sched.end(p.victim, now);
                job.remaining -= now - started;
                preempted[job.tenant] += 1;
                job.preempted += 1;
                job.queued.queued_s = now;
                sched.enqueue(job.queued.clone());
            }
            if report.preempt.is_empty() {
                break;
            }
        }
    }

    let total: f64 = used.iter().sum();
    let contended_total: f64 = contended_used.iter().sum();
    let total_share: f64 = tenants.iter().map(|t| t.share).sum();
    let makespan = (now - start).max(0.0);
    let tenants_report = (0..n)
        .map(|i| {
            let mut w = std::mem::take(&mut waits[i]);
            w.sort_by(f64::total_cmp);
            TenantReport {
                name: tenants[i].name.clone(),
                jobs: submitted[i],
                gpu_hours: used[i] / 3600.0,
                share_of_gpu_hours: if total > 0.0 { used[i] / total } else { 0.0 },
                wait_p50_s: percentile(&w, 0.50),
                wait_p95_s: percentile(&w, 0.95),
                target_share: if total_share > 0.0 {
                    tenants[i].share / total_share
                } else {
                    0.0
                },
                share_while_contended: (contended_total > 0.0)
                    .then(|| contended_used[i] / contended_total),
                finished: finished[i],
                unfinished: submitted[i] - rejected[i] - finished[i] - cancelled[i],
                cancelled: cancelled[i],
                rejected: rejected[i],
                time_limited: time_limited[i],
                preempted: preempted[i],
            }
        })
        .collect();
    let job_reports = per_job.then(|| {
        (0..trace.len())
            .map(|i| {
                let id = i as u64 + 1;
                let job = jobs.get(&id);
                JobReport {
                    job: id,
                    tenant: trace[i].tenant.clone(),
                    at: trace[i].at,
                    started: job.and_then(|j| j.first_start),
                    ended: job.and_then(|j| j.ended),
                    preempted: job.map_or(0, |j| j.preempted),
                    rejected: job.is_none(),
                    cancelled: job.and_then(|j| j.cancelled.clone()),
                }
            })
            .collect()
    });
    Ok(Report {
        jobs: job_reports,
        tenants: tenants_report,
        utilization: if makespan > 0.0 && gpus > 0 {
            total / (makespan * f64::from(gpus))
        } else {
            0.0
        },
        preemptions: preempted.iter().sum(),
        makespan_s: makespan,
        gpus,
        queue_policy: policy_name,
        contended_hours: contended_s / 3600.0,
        passes,
    })
}

/// The nearest-rank percentile of sorted values (0 when there are none).
fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (p * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// The report as a table for people.
pub fn render(report: &Report) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<16} {:>7} {:>11} {:>8} {:>8} {:>11} {:>11} {:>9}",
        "TENANT", "JOBS", "GPU-HOURS", "SHARE", "TARGET", "WAIT-P50", "WAIT-P95", "PREEMPTED"
    );
    for t in &report.tenants {
        let _ = writeln!(
            out,
            "{:<16} {:>7} {:>11.1} {:>7.1}% {:>7.1}% {:>11} {:>11} {:>9}",
            t.name,
            t.jobs,
            t.gpu_hours,
            t.share_of_gpu_hours * 100.0,
            t.target_share * 100.0,
            human_secs(t.wait_p50_s),
            human_secs(t.wait_p95_s),
            t.preempted
        );
    }
    let _ = writeln!(
        out,
        "{} GPUs, queue policy {}: utilization {:.1}%, makespan {}, {} preemption(s), contended for {:.1} h",
        report.gpus,
        report.queue_policy,
        report.utilization * 100.0,
        human_secs(report.makespan_s),
        report.preemptions,
        report.contended_hours
    );
    out
}

fn human_secs(s: f64) -> String {
    if s < 60.0 {
        format!("{s:.0}s")
    } else if s < 3600.0 {
        format!("{:.1}m", s / 60.0)
    } else if s < 86400.0 {
        format!("{:.1}h", s / 3600.0)
    } else {
        format!("{:.1}d", s / 86400.0)
    }
}

#[cfg(test)]
mod tests;
