//! The queue-ordering rules of orch, shared by the host and the built-in queue policies.
//!
//! A queue policy sees the queued jobs, the tenants (share, decayed usage, what they hold) and the
//! machine, and answers with the jobs in the order to try, each with a reason `orch status`
//! shows. The host computes the fair-share figures once per pass ([`Tenant::new`]), so every
//! policy sees the same numbers; it checks the answer ([`check_order`]) and enforces the limits
//! itself, whatever the order says.
//!
//! Design decision: the built-in orders live here, in a crate with no dependencies, and the
//! built-in Wasm components in `plugins/queue/` are thin wrappers around them. The daemon runs
//! the components (sandboxed, like any plugin); the host's fallback when a plugin fails is
//! [`fifo`] natively; benchmarks compare the two faces of [`fair_share`].

use std::cmp::Ordering;
use std::collections::HashSet;
use std::fmt::Write;

/// A queued job, as a queue policy sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    /// The daemon's job id (ids grow with submission time).
    pub id: u64,
    /// Index into the tenants list.
    pub tenant: u32,
    /// `[job] name`.
    pub name: String,
    /// `[job] tags`.
    pub tags: Vec<String>,
    /// GPUs asked for.
    pub gpus: u32,
    /// `[job] priority` (within the tenant's `max_priority`).
    pub priority: i64,
    /// Seconds since it was submitted.
    pub age_s: f64,
    /// `[job] max_runtime` (or the tenant's), in seconds, when one is set.
    pub runtime_s: Option<f64>,
    /// `[job] preemptible`.
    pub preemptible: bool,
}

/// A tenant, with the fair-share figures of this pass.
#[derive(Debug, Clone, PartialEq)]
pub struct Tenant {
    pub name: String,
    /// The configured weight.
    pub share: f64,
    /// `share` over the sum of every tenant's share: the fraction of the machine it is owed.
    pub normalized_share: f64,
    /// Decayed usage in GPU-seconds.
    pub usage_gpu_s: f64,
    /// `usage_gpu_s` over every tenant's: the fraction of recent use that was its (0 when nobody
    /// used anything).
    pub normalized_usage: f64,
    /// Slurm's classic fair-share factor, `2^(-normalized_usage / normalized_share)`: 1 for a
    /// tenant that used nothing, 0.5 for one that used exactly its share, towards 0 beyond.
    pub fair_share: f64,
    /// GPUs its running jobs hold.
    pub gpus_held: u32,
    /// Its `max_gpus`, when set.
    pub max_gpus: Option<u32>,
    /// Its jobs queued and running.
    pub queued: u32,
    pub running: u32,
}

/// What the tenants' figures are computed from.
#[derive(Debug, Clone, PartialEq)]
pub struct TenantInput {
    pub name: String,
    pub share: f64,
    pub usage_gpu_s: f64,
    pub gpus_held: u32,
    pub max_gpus: Option<u32>,
    pub queued: u32,
    pub running: u32,
}

impl Tenant {
    /// Every tenant's figures, normalized against the others'.
    pub fn all(inputs: &[TenantInput]) -> Vec<Tenant> {
        let total_share: f64 = inputs.iter().map(|t| t.share.max(0.0)).sum();
        let total_usage: f64 = inputs.iter().map(|t| t.usage_gpu_s.max(0.0)).sum();
        inputs
            .iter()
            .map(|t| {
                let normalized_share = if total_share > 0.0 {
                    t.share.max(0.0) / total_share
                } else {
                    0.0
                };
                let normalized_usage = if total_usage > 0.0 {
                    t.usage_gpu_s.max(0.0) / total_usage
                } else {
                    0.0
                };
                Tenant {
                    name: t.name.clone(),
                    share: t.share,
                    normalized_share,
                    usage_gpu_s: t.usage_gpu_s.max(0.0),
                    normalized_usage,
                    fair_share: fair_share_factor(normalized_usage, normalized_share),
                    gpus_held: t.gpus_held,
                    max_gpus: t.max_gpus,
                    queued: t.queued,
                    running: t.running,
                }
            })
            .collect()
    }

    /// Whether it used less than it is owed.
    pub fn under_share(&self) -> bool {
        self.normalized_usage < self.normalized_share
    }

    /// "tenant vision is over its share: 62% used of 50%".
    pub fn standing(&self) -> String {
        let side = if self.under_share() { "under" } else { "over" };
        let side = if (self.normalized_usage - self.normalized_share).abs() < 0.005 {
            "at"
        } else {
            side
        };
        format!(
            "tenant {} is {side} its share: {} used of {}",
            self.name,
            percent(self.normalized_usage),
            percent(self.normalized_share)
        )
    }
}

/// `2^(-usage / share)`; 0 for a tenant with no share.
pub fn fair_share_factor(normalized_usage: f64, normalized_share: f64) -> f64 {
    if normalized_share <= 0.0 || !normalized_share.is_finite() {
        return 0.0;
    }
    let f = (-normalized_usage.max(0.0) / normalized_share).exp2();
    if f.is_finite() { f } else { 0.0 }
}

fn percent(x: f64) -> String {
    format!("{:.0}%", (x * 100.0).clamp(0.0, 100.0))
}

/// The machine, as the pass starts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Machine {
    /// Devices no exclusive lease holds.
    pub free_gpus: u32,
    /// Devices the daemon places on.
    pub total_gpus: u32,
}

/// One entry of an answer: a job to try, and why it stands where it does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ranked {
    pub job: u64,
    pub reason: String,
}

/// The built-in queue policies by name, with a line each for the docs and `orch serve`.
pub const BUILTINS: &[(&str, &str)] = &[
    (
        "fair-share",
        "tenant fair-share factor (share against decayed usage), then job priority, then age",
    ),
    ("fifo", "submission order"),
    ("priority", "job priority, then age"),
];

/// An order: the jobs to try, best first, each with its reason.
pub type Order = fn(&[Job], &[Tenant], &Machine) -> Vec<Ranked>;

/// A built-in order by name.
pub fn builtin(name: &str) -> Option<Order> {
    match name {
        "fair-share" => Some(fair_share),
        "fifo" => Some(fifo),
        "priority" => Some(priority),
        _ => None,
    }
}

/// Oldest first; ties (the same age) by id.
fn by_age(a: &Job, b: &Job) -> Ordering {
    b.age_s
        .partial_cmp(&a.age_s)
        .unwrap_or(Ordering::Equal)
        .then(a.id.cmp(&b.id))
}

/// `fair-share`: Slurm's multifactor idea. Tenants first by fair-share factor (the least served
/// against its share first), then jobs by priority, then by age.
pub fn fair_share(jobs: &[Job], tenants: &[Tenant], _machine: &Machine) -> Vec<Ranked> {
    let factor = |j: &Job| tenants.get(j.tenant as usize).map_or(0.0, |t| t.fair_share);
    let mut order: Vec<&Job> = jobs.iter().collect();
    order.sort_by(|a, b| {
        factor(b)
            .partial_cmp(&factor(a))
            .unwrap_or(Ordering::Equal)
            .then(b.priority.cmp(&a.priority))
            .then_with(|| by_age(a, b))
    });
    // One standing line per tenant, shared by its jobs.
    let standing: Vec<String> = tenants
        .iter()
        .map(|t| format!("{} (fair-share factor {:.2})", t.standing(), t.fair_share))
        .collect();
    order
        .into_iter()
        .map(|j| {
            let mut reason = standing.get(j.tenant as usize).cloned().unwrap_or_default();
            if j.priority != 0 {
                let _ = write!(reason, "; priority {}", j.priority);
            }
            Ranked { job: j.id, reason }
        })
        .collect()
}

/// `fifo`: submission order.
pub fn fifo(jobs: &[Job], _tenants: &[Tenant], _machine: &Machine) -> Vec<Ranked> {
    let mut order: Vec<&Job> = jobs.iter().collect();
    order.sort_by_key(|j| j.id);
    order
        .into_iter()
        .map(|j| Ranked {
            job: j.id,
            reason: "first in, first out".into(),
        })
        .collect()
}

/// `priority`: job priority, then age.
pub fn priority(jobs: &[Job], _tenants: &[Tenant], _machine: &Machine) -> Vec<Ranked> {
    let mut order: Vec<&Job> = jobs.iter().collect();
    order.sort_by(|a, b| b.priority.cmp(&a.priority).then_with(|| by_age(a, b)));
    order
        .into_iter()
        .map(|j| Ranked {
            job: j.id,
            reason: format!("priority {}", j.priority),
        })
        .collect()
}

/// The longest reason kept from a plugin's answer, in bytes.
pub const MAX_REASON: usize = 200;

/// Checks a policy's answer: only jobs it was offered, each at most once (a permutation of a
/// subset). Returns one sentence naming the first fault.
pub fn check_order(offered: &[Job], answer: &[Ranked]) -> Result<(), String> {
    let ids: HashSet<u64> = offered.iter().map(|j| j.id).collect();
    let mut seen = HashSet::with_capacity(answer.len());
    for r in answer {
        if !ids.contains(&r.job) {
            return Err(format!(
                "it named job {}, which is not in the queue it was given",
                r.job
            ));
        }
        if !seen.insert(r.job) {
            return Err(format!("it named job {} twice", r.job));
        }
    }
    Ok(())
}

/// A reason fit to show: control characters gone, at most [`MAX_REASON`] bytes.
pub fn clean_reason(reason: &str) -> String {
    let mut out = String::with_capacity(reason.len().min(MAX_REASON));
    for c in reason.chars() {
        let c = if c.is_control() { ' ' } else { c };
        if out.len() + c.len_utf8() > MAX_REASON {
            break;
        }
        out.push(c);
    }
    out.trim().to_string()
}

/// [`clean_reason`] of an owned reason: the same text, without a copy when the reason is clean
/// already (the usual case, and what a host checking thousands of reasons a pass wants).
pub fn clean_reason_owned(reason: String) -> String {
    let clean = reason.len() <= MAX_REASON
        && !reason.chars().any(char::is_control)
        && reason.trim().len() == reason.len();
    if clean { reason } else { clean_reason(&reason) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(id: u64, tenant: u32, priority: i64, age_s: f64) -> Job {
        Job {
            id,
            tenant,
            name: format!("j{id}"),
            tags: vec![],
            gpus: 1,
            priority,
            age_s,
            runtime_s: None,
            preemptible: false,
        }
    }

    fn tenants(usage: &[(f64, f64)]) -> Vec<Tenant> {
        let inputs: Vec<TenantInput> = usage
            .iter()
            .enumerate()
            .map(|(i, &(share, used))| TenantInput {
                name: format!("t{i}"),
                share,
                usage_gpu_s: used,
                gpus_held: 0,
                max_gpus: None,
                queued: 0,
                running: 0,
            })
            .collect();
        Tenant::all(&inputs)
    }

    const M: Machine = Machine {
        free_gpus: 1,
        total_gpus: 1,
    };

    #[test]
    fn factor_is_slurms() {
        assert_eq!(fair_share_factor(0.0, 0.5), 1.0);
        assert!((fair_share_factor(0.5, 0.5) - 0.5).abs() < 1e-12);
        assert!((fair_share_factor(1.0, 0.5) - 0.25).abs() < 1e-12);
        assert_eq!(fair_share_factor(0.3, 0.0), 0.0);
    }

    #[test]
    fn the_least_served_tenant_goes_first_then_priority_then_age() {
        // t0 used 62% with a 50% share; t1 used 38%.
        let t = tenants(&[(1.0, 62.0), (1.0, 38.0)]);
        let jobs = [
            job(1, 0, 5, 100.0),
            job(2, 1, 0, 10.0),
            job(3, 1, 1, 5.0),
            job(4, 1, 1, 50.0),
        ];
        let order: Vec<u64> = fair_share(&jobs, &t, &M).iter().map(|r| r.job).collect();
        assert_eq!(order, vec![4, 3, 2, 1]);
        let r = &fair_share(&jobs, &t, &M)[3].reason;
        assert!(
            r.starts_with("tenant t0 is over its share: 62% used of 50%"),
            "{r}"
        );
    }

    #[test]
    fn fifo_and_priority() {
        let t = tenants(&[(1.0, 0.0)]);
        let jobs = [job(3, 0, 0, 1.0), job(1, 0, 0, 3.0), job(2, 0, 9, 2.0)];
        let ids = |v: Vec<Ranked>| v.iter().map(|r| r.job).collect::<Vec<_>>();
        assert_eq!(ids(fifo(&jobs, &t, &M)), vec![1, 2, 3]);
        assert_eq!(ids(priority(&jobs, &t, &M)), vec![2, 1, 3]);
    }

    #[test]
    fn answers_are_checked() {
        let jobs = [job(1, 0, 0, 0.0), job(2, 0, 0, 0.0)];
        let r = |job| Ranked {
            job,
            reason: String::new(),
        };
        assert!(check_order(&jobs, &[r(2)]).is_ok());
        assert!(check_order(&jobs, &[]).is_ok());
        assert!(
            check_order(&jobs, &[r(2), r(2)])
                .unwrap_err()
                .contains("twice")
        );
        assert!(
            check_order(&jobs, &[r(7)])
                .unwrap_err()
                .contains("not in the queue")
        );
        assert_eq!(clean_reason("a\nb"), "a b");
        assert_eq!(clean_reason(&"é".repeat(300)).len(), MAX_REASON);
    }

    #[test]
    fn owned_reasons_are_cleaned_alike() {
        for reason in [
            "priority 3",
            " padded ",
            "a\u{1b}[31mb",
            "c\u{85}d",
            "trailing\n",
            "",
            &"é".repeat(300),
            &"x".repeat(MAX_REASON),
            &"x".repeat(MAX_REASON + 1),
        ] {
            assert_eq!(clean_reason_owned(reason.to_string()), clean_reason(reason));
        }
    }
}
