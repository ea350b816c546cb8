//! `GET /metrics`: the daemon in Prometheus' text format (version 0.0.4), names as Prometheus'
//! conventions want them: an `orch_` prefix, base units (bytes, seconds, ratios 0-1, watts,
//! celsius), `_total` for counters, histograms in `_seconds`.
//!
//! What the engine and the API count as they work lives in [`Counters`]; the rest (devices, jobs
//! by state, leases, usage) is read when the page is asked for.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;

/// Buckets for waits in the queue: a second to a week.
const WAIT_BUCKETS: &[f64] = &[
    1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 3600.0, 14400.0, 43200.0, 86400.0, 259200.0, 604800.0,
];
/// Buckets for a scheduling pass or a policy decision: 100 µs to 2.5 s.
const FAST_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];

/// A cumulative histogram over fixed buckets.
#[derive(Debug, Clone)]
pub struct Histogram {
    bounds: &'static [f64],
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Histogram {
        Histogram {
            bounds,
            counts: vec![0; bounds.len()],
            sum: 0.0,
            count: 0,
        }
    }

    pub fn observe(&mut self, value: f64) {
        if !value.is_finite() {
            return;
        }
        for (bound, count) in self.bounds.iter().zip(&mut self.counts) {
            if value <= *bound {
                *count += 1;
            }
        }
        self.sum += value;
        self.count += 1;
    }

    fn render(&self, out: &mut String, name: &str, labels: &str) {
        let sep = if labels.is_empty() { "" } else { "," };
        for (bound, count) in self.bounds.iter().zip(&self.counts) {
            let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"{bound}\"}} {count}");
        }
        let _ = writeln!(
            out,
            "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {}",
            self.count
        );
        let braces = if labels.is_empty() {
            String::new()
        } else {
            format!("{{{labels}}}")
        };
        let _ = writeln!(out, "{name}_sum{braces} {}", self.sum);
        let _ = writeln!(out, "{name}_count{braces} {}", self.count);
    }
}

#[derive(Debug)]
struct Inner {
    submits: BTreeMap<String, u64>,
    waits: BTreeMap<String, Histogram>,
    passes: Histogram,
    decisions: BTreeMap<&'static str, Histogram>,
    preemptions: u64,
    idle_stops: u64,
    /// Per tenant, the GPU-seconds of the jobs that ended (`orch_job_gpu_seconds_total`).
    job_gpu_seconds: BTreeMap<String, f64>,
    /// Per (tenant, state), the jobs that ended.
    finished: BTreeMap<(String, &'static str), u64>,
    /// Per tenant, the queue waits of the jobs that ended.
    job_waits: BTreeMap<String, Histogram>,
}

/// What the daemon counts as it works.
#[derive(Debug)]
pub struct Counters {
    inner: Mutex<Inner>,
}

impl Default for Counters {
    fn default() -> Counters {
        Counters {
            inner: Mutex::new(Inner {
                submits: BTreeMap::new(),
                waits: BTreeMap::new(),
                passes: Histogram::new(FAST_BUCKETS),
                decisions: BTreeMap::new(),
                preemptions: 0,
                idle_stops: 0,
                job_gpu_seconds: BTreeMap::new(),
                finished: BTreeMap::new(),
                job_waits: BTreeMap::new(),
            }),
        }
    }
}

impl Counters {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        orch_core::sync::lock(&self.inner)
    }

    pub fn submitted(&self, tenant: &str) {
        *self.lock().submits.entry(tenant.to_string()).or_default() += 1;
    }

    /// A job of `tenant` started after waiting `seconds` in the queue.
    pub fn started(&self, tenant: &str, seconds: f64) {
        self.lock()
            .waits
            .entry(tenant.to_string())
            .or_insert_with(|| Histogram::new(WAIT_BUCKETS))
            .observe(seconds);
    }

    pub fn pass(&self, seconds: f64) {
        self.lock().passes.observe(seconds);
    }

    /// A policy decision: `kind` is `queue` or `placement`.
    pub fn decision(&self, kind: &'static str, seconds: f64) {
        self.lock()
            .decisions
            .entry(kind)
            .or_insert_with(|| Histogram::new(FAST_BUCKETS))
            .observe(seconds);
    }

    pub fn preempted(&self) {
        self.lock().preemptions += 1;
    }

    pub fn idle_stopped(&self) {
        self.lock().idle_stops += 1;
    }

    /// A job ended with this accounting record.
    pub fn job_finished(&self, record: &crate::core::accounting::Record) {
        let mut inner = self.lock();
        *inner
            .job_gpu_seconds
            .entry(record.tenant.clone())
            .or_default() += record.gpu_seconds;
        *inner
            .finished
            .entry((record.tenant.clone(), record.state.as_str()))
            .or_default() += 1;
        inner
            .job_waits
            .entry(record.tenant.clone())
            .or_insert_with(|| Histogram::new(WAIT_BUCKETS))
            .observe(record.queue_wait_s);
    }
}

/// A device as the metrics show it.
#[derive(Debug, Clone, Default)]
pub struct DeviceSample {
    pub uuid: String,
    pub index: u32,
    pub name: String,
    pub utilization: Option<f64>,
    pub memory_used_bytes: Option<u64>,
    pub memory_total_bytes: Option<u64>,
    pub temperature_c: Option<u32>,
    pub power_w: Option<f64>,
    /// `(job id, tenant)` of the daemon's job holding it, or `("", "")`-less `None`.
    pub held_by: Option<(String, String)>,
    /// Held by a lease the daemon did not make (`orch run` on the same machine).
    pub leased: bool,
    pub foreign_processes: usize,
    /// No problem read or recorded (Xid, ECC, remapped rows, lost).
    pub healthy: bool,
    /// An admin drained it (`orch drain`).
    pub drained: bool,
}

/// A tenant as the metrics show it.
#[derive(Debug, Clone, Default)]
pub struct TenantSample {
    pub name: String,
    pub share: f64,
    pub usage_gpu_seconds: f64,
    pub fair_share: f64,
    pub gpus_held: u32,
    /// CPU time its placement policies took in its policy workers since the daemon started.
    pub policy_cpu_seconds: f64,
}

/// What one scrape shows.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub devices: Vec<DeviceSample>,
    /// `(state, tenant, count)`.
    pub jobs: Vec<(String, String, u64)>,
    pub tenants: Vec<TenantSample>,
    pub leases: usize,
    /// `(tenant, running jobs held by a process of their user)`.
    pub interactive: Vec<(String, u64)>,
    /// `(tenant, running interactive allocations: orch alloc)`.
    pub alloc: Vec<(String, u64)>,
    /// The state folder's file system (the job database, leases, logs), when it can be read.
    pub state_space: Option<orch_core::fsutil::Space>,
}

/// A label value, escaped as the text format wants (backslash, quote, newline).
fn esc(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// The whole page.
pub fn render(snapshot: &Snapshot, counters: &Counters) -> String {
    let mut out = String::with_capacity(16 * 1024 + snapshot.devices.len() * 1024);
    let device_labels = |d: &DeviceSample| {
        format!(
            "uuid=\"{}\",index=\"{}\",name=\"{}\"",
            esc(&d.uuid),
            d.index,
            esc(&d.name)
        )
    };
    type Field = fn(&DeviceSample) -> Option<f64>;
    let gauges: [(&str, &str, Field); 5] = [
        (
            "orch_device_utilization_ratio",
            "GPU utilization over the last sample period, 0-1.",
            |d| d.utilization,
        ),
        (
            "orch_device_memory_used_bytes",
            "Device memory in use.",
            |d| d.memory_used_bytes.map(|v| v as f64),
        ),
        (
            "orch_device_memory_total_bytes",
            "Device memory in all.",
            |d| d.memory_total_bytes.map(|v| v as f64),
        ),
        ("orch_device_temperature_celsius", "GPU temperature.", |d| {
            d.temperature_c.map(f64::from)
        }),
        ("orch_device_power_watts", "Power draw.", |d| d.power_w),
    ];
    for (name, help, field) in gauges {
        header(&mut out, name, "gauge", help);
        for d in &snapshot.devices {
            if let Some(v) = field(d) {
                let _ = writeln!(out, "{name}{{{}}} {v}", device_labels(d));
            }
        }
    }
    header(
        &mut out,
        "orch_device_held",
        "gauge",
        "1 for each device a daemon job holds, labelled with the job and its tenant.",
    );
    for d in &snapshot.devices {
        if let Some((job, tenant)) = &d.held_by {
            let _ = writeln!(
                out,
                "orch_device_held{{{},job=\"{}\",tenant=\"{}\"}} 1",
                device_labels(d),
                esc(job),
                esc(tenant)
            );
        }
    }
    header(
        &mut out,
        "orch_device_leased",
        "gauge",
        "1 when any lease (a daemon job or orch run) holds the device, else 0.",
    );
    for d in &snapshot.devices {
        let _ = writeln!(
            out,
            "orch_device_leased{{{}}} {}",
            device_labels(d),
            u8::from(d.leased || d.held_by.is_some())
        );
    }
    header(
        &mut out,
        "orch_device_foreign_processes",
        "gauge",
        "Compute processes on the device that no lease covers.",
    );
    for d in &snapshot.devices {
        let _ = writeln!(
            out,
            "orch_device_foreign_processes{{{}}} {}",
            device_labels(d),
            d.foreign_processes
        );
    }
    render_service(&mut out, &snapshot.devices, device_labels);
    header(&mut out, "orch_jobs", "gauge", "Jobs by state and tenant.");
    for (state, tenant, n) in &snapshot.jobs {
        let _ = writeln!(
            out,
            "orch_jobs{{state=\"{}\",tenant=\"{}\"}} {n}",
            esc(state),
            esc(tenant)
        );
    }
    header(
        &mut out,
        "orch_interactive_jobs",
        "gauge",
        "Running jobs held by a process of their user (orch run, import orch), per tenant.",
    );
    for (tenant, n) in &snapshot.interactive {
        let _ = writeln!(
            out,
            "orch_interactive_jobs{{tenant=\"{}\"}} {n}",
            esc(tenant)
        );
    }
    header(
        &mut out,
        "orch_alloc_jobs",
        "gauge",
        "Running interactive allocations (orch alloc), per tenant; counted in orch_interactive_jobs too.",
    );
    for (tenant, n) in &snapshot.alloc {
        let _ = writeln!(out, "orch_alloc_jobs{{tenant=\"{}\"}} {n}", esc(tenant));
    }
    header(
        &mut out,
        "orch_queue_length",
        "gauge",
        "Jobs queued, per tenant.",
    );
    for t in &snapshot.tenants {
        let queued = snapshot
            .jobs
            .iter()
            .filter(|(s, tenant, _)| s == "queued" && *tenant == t.name)
            .map(|(_, _, n)| n)
            .sum::<u64>();
        let _ = writeln!(
            out,
            "orch_queue_length{{tenant=\"{}\"}} {queued}",
            esc(&t.name)
        );
    }
    header(
        &mut out,
        "orch_leases",
        "gauge",
        "Live leases in the lease store (daemon jobs and orch run).",
    );
    let _ = writeln!(out, "orch_leases {}", snapshot.leases);
    if let Some(space) = snapshot.state_space {
        header(
            &mut out,
            "orch_state_free_bytes",
            "gauge",
            "Bytes free on the state folder's file system (job database, leases, job logs).",
        );
        let _ = writeln!(out, "orch_state_free_bytes {}", space.free);
        header(
            &mut out,
            "orch_state_size_bytes",
            "gauge",
            "Size of the state folder's file system.",
        );
        let _ = writeln!(out, "orch_state_size_bytes {}", space.total);
    }
    type TenantField = fn(&TenantSample) -> f64;
    let tenant_gauges: [(&str, &str, TenantField); 4] = [
        (
            "orch_tenant_usage_gpu_seconds",
            "Decayed usage (half-life usage_half_life), GPU-seconds.",
            |t| t.usage_gpu_seconds,
        ),
        (
            "orch_tenant_share_ratio",
            "The tenant's share over all shares, 0-1.",
            |t| t.share,
        ),
        (
            "orch_tenant_fair_share_factor",
            "2^(-normalized usage / normalized share): 1 unused, 0.5 at its share.",
            |t| t.fair_share,
        ),
        (
            "orch_tenant_gpus_held",
            "Devices the tenant's running jobs hold.",
            |t| f64::from(t.gpus_held),
        ),
    ];
    for (name, help, field) in tenant_gauges {
        header(&mut out, name, "gauge", help);
        for t in &snapshot.tenants {
            let _ = writeln!(out, "{name}{{tenant=\"{}\"}} {}", esc(&t.name), field(t));
        }
    }
    header(
        &mut out,
        "orch_tenant_policy_cpu_seconds_total",
        "counter",
        "CPU time the tenant's placement policies took in its policy workers since the daemon started.",
    );
    for t in &snapshot.tenants {
        let _ = writeln!(
            out,
            "orch_tenant_policy_cpu_seconds_total{{tenant=\"{}\"}} {}",
            esc(&t.name),
            t.policy_cpu_seconds
        );
    }
    let inner = counters.lock();
    header(
        &mut out,
        "orch_submits_total",
        "counter",
        "Jobs accepted since the daemon started, per tenant.",
    );
    for (tenant, n) in &inner.submits {
        let _ = writeln!(out, "orch_submits_total{{tenant=\"{}\"}} {n}", esc(tenant));
    }
    header(
        &mut out,
        "orch_preemptions_total",
        "counter",
        "Jobs stopped and queued again for a tenant under its share.",
    );
    let _ = writeln!(out, "orch_preemptions_total {}", inner.preemptions);
    header(
        &mut out,
        "orch_idle_reclaims_total",
        "counter",
        "Jobs stopped because their devices stayed idle (idle_timeout).",
    );
    let _ = writeln!(out, "orch_idle_reclaims_total {}", inner.idle_stops);
    header(
        &mut out,
        "orch_queue_wait_seconds",
        "histogram",
        "Time from submission to start, per tenant.",
    );
    for (tenant, h) in &inner.waits {
        h.render(
            &mut out,
            "orch_queue_wait_seconds",
            &format!("tenant=\"{}\"", esc(tenant)),
        );
    }
    header(
        &mut out,
        "orch_job_gpu_seconds_total",
        "counter",
        "GPU-seconds (devices x wall time) of the jobs that ended since the daemon started, per tenant.",
    );
    for (tenant, seconds) in &inner.job_gpu_seconds {
        let _ = writeln!(
            out,
            "orch_job_gpu_seconds_total{{tenant=\"{}\"}} {seconds}",
            esc(tenant)
        );
    }
    header(
        &mut out,
        "orch_jobs_finished_total",
        "counter",
        "Jobs that ended since the daemon started, per tenant and final state.",
    );
    for ((tenant, state), n) in &inner.finished {
        let _ = writeln!(
            out,
            "orch_jobs_finished_total{{tenant=\"{}\",state=\"{state}\"}} {n}",
            esc(tenant)
        );
    }
    header(
        &mut out,
        "orch_job_queue_wait_seconds",
        "histogram",
        "Time from submission to the last start of the jobs that ended (to their end for those that never started), per tenant.",
    );
    for (tenant, h) in &inner.job_waits {
        h.render(
            &mut out,
            "orch_job_queue_wait_seconds",
            &format!("tenant=\"{}\"", esc(tenant)),
        );
    }
    header(
        &mut out,
        "orch_scheduling_pass_duration_seconds",
        "histogram",
        "One scheduling pass: order, limits, placement, preemption.",
    );
    inner
        .passes
        .render(&mut out, "orch_scheduling_pass_duration_seconds", "");
    header(
        &mut out,
        "orch_policy_decision_duration_seconds",
        "histogram",
        "One plugin decision: the queue policy's order, or a placement policy's choice.",
    );
    for (kind, h) in &inner.decisions {
        h.render(
            &mut out,
            "orch_policy_decision_duration_seconds",
            &format!("kind=\"{kind}\""),
        );
    }
    out
}

/// `orch_device_healthy` and `orch_device_drained`: 0 or 1 per GPU.
fn render_service(
    out: &mut String,
    devices: &[DeviceSample],
    labels: impl Fn(&DeviceSample) -> String,
) {
    type Flag = fn(&DeviceSample) -> bool;
    let flags: [(&str, &str, Flag); 2] = [
        (
            "orch_device_healthy",
            "1 when the GPU has no Xid, ECC, row-remapping or lost problem, else 0.",
            |d| d.healthy,
        ),
        (
            "orch_device_drained",
            "1 when an admin drained the GPU (orch drain): it takes no new job, else 0.",
            |d| d.drained,
        ),
    ];
    for (name, help, flag) in flags {
        header(out, name, "gauge", help);
        for d in devices {
            let _ = writeln!(out, "{name}{{{}}} {}", labels(d), u8::from(flag(d)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histograms_are_cumulative_and_labels_escaped() {
        let counters = Counters::default();
        counters.started("a\"b", 3.0);
        counters.started("a\"b", 100.0);
        counters.pass(0.002);
        let snapshot = Snapshot {
            devices: vec![DeviceSample {
                uuid: "GPU-1".into(),
                name: "H100\n80GB".into(),
                utilization: Some(0.5),
                ..DeviceSample::default()
            }],
            tenants: vec![TenantSample {
                name: "vision".into(),
                policy_cpu_seconds: 1.5,
                ..TenantSample::default()
            }],
            state_space: Some(orch_core::fsutil::Space {
                free: 10 << 20,
                total: 1 << 30,
            }),
            ..Snapshot::default()
        };
        let text = render(&snapshot, &counters);
        assert!(text.contains("# TYPE orch_tenant_policy_cpu_seconds_total counter"));
        assert!(text.contains("orch_tenant_policy_cpu_seconds_total{tenant=\"vision\"} 1.5"));
        assert!(text.contains("orch_queue_wait_seconds_bucket{tenant=\"a\\\"b\",le=\"5\"} 1"));
        assert!(text.contains("orch_queue_wait_seconds_bucket{tenant=\"a\\\"b\",le=\"+Inf\"} 2"));
        assert!(text.contains("orch_queue_wait_seconds_sum{tenant=\"a\\\"b\"} 103"));
        assert!(text.contains("name=\"H100\\n80GB\"} 0.5"));
        assert!(text.contains("orch_scheduling_pass_duration_seconds_count 1"));
        assert!(text.contains("orch_state_free_bytes 10485760\n"));
        assert!(text.contains("orch_state_size_bytes 1073741824\n"));
    }

    #[test]
    fn each_ended_job_adds_its_gpu_seconds_state_and_queue_wait_to_its_tenants_counters() {
        let counters = Counters::default();
        let record =
            |tenant: &str, state, gpu_seconds, queue_wait_s| crate::core::accounting::Record {
                job_id: 1,
                name: "j".into(),
                tenant: tenant.into(),
                user: "u".into(),
                state,
                submitted_at_ms: 0,
                started_at_ms: None,
                ended_at_ms: 0,
                attempt: 1,
                devices: Vec::new(),
                gpu_seconds,
                wall_s: 0.0,
                queue_wait_s,
                cpu_seconds: None,
                peak_rss_bytes: None,
                peak_gpu_memory_bytes: None,
                mean_gpu_utilization: None,
                exit_code: None,
                signal: None,
                reason: None,
            };
        use crate::core::db::State;
        counters.job_finished(&record("nlp", State::Succeeded, 3.0, 2.0));
        counters.job_finished(&record("nlp", State::Failed, 1.5, 400.0));
        counters.job_finished(&record("cv", State::Succeeded, 0.0, 0.5));
        let text = render(&Snapshot::default(), &counters);
        assert!(text.contains("# TYPE orch_job_gpu_seconds_total counter"));
        assert!(text.contains("orch_job_gpu_seconds_total{tenant=\"nlp\"} 4.5\n"));
        assert!(text.contains("orch_jobs_finished_total{tenant=\"nlp\",state=\"failed\"} 1\n"));
        assert!(text.contains("orch_jobs_finished_total{tenant=\"nlp\",state=\"succeeded\"} 1\n"));
        assert!(text.contains("orch_job_queue_wait_seconds_bucket{tenant=\"nlp\",le=\"5\"} 1\n"));
        assert!(text.contains("orch_job_queue_wait_seconds_count{tenant=\"cv\"} 1\n"));
    }

    /// The alert rules and the dashboard the package installs name only metrics this page has.
    #[test]
    fn the_packaged_alerts_and_dashboard_name_metrics_that_exist() {
        let source = include_str!("metrics.rs");
        for (file, text) in [
            (
                "orch-alerts.yml",
                include_str!("../../../orch-cli/package/orch-alerts.yml"),
            ),
            (
                "orch-dashboard.json",
                include_str!("../../../orch-cli/package/orch-dashboard.json"),
            ),
        ] {
            let mut named = 0;
            let mut rest = text;
            while let Some(at) = rest.find("orch_") {
                let tail = &rest[at..];
                let end = tail
                    .find(|c: char| !(c.is_ascii_lowercase() || c == '_'))
                    .unwrap_or(tail.len());
                let name = &tail[..end];
                let base = ["_bucket", "_count", "_sum"]
                    .iter()
                    .find_map(|s| name.strip_suffix(s))
                    .unwrap_or(name);
                assert!(
                    source.contains(&format!("\"{base}\"")),
                    "{file} names {name}, which /metrics does not have"
                );
                named += 1;
                rest = &tail[end..];
            }
            assert!(named > 5, "{file} names only {named} metrics");
        }
    }
}
