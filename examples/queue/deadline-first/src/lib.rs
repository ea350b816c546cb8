//! `deadline-first`: jobs tagged `paper-deadline` first, oldest first; then everyone else by fair
//! share (the tenant that used least against its share first, then job priority, then age). The
//! queue policy of a lab in the week before a conference, and an example of one written outside
//! orch with nothing but `wit/` and wit-bindgen.

wit_bindgen::generate!({
    path: "../../../wit",
    world: "queue",
});

use exports::orch::plugin::queue_order::Guest;
use orch::plugin::queue_types::{Machine, QueuedJob, Ranked, Tenant};

use std::cmp::Ordering;

/// The tag that puts a job first.
const DEADLINE: &str = "paper-deadline";

struct DeadlineFirst;

impl Guest for DeadlineFirst {
    fn order_jobs(
        jobs: Vec<QueuedJob>,
        tenants: Vec<Tenant>,
        _machine: Machine,
    ) -> Result<Vec<Ranked>, String> {
        // The host passes a job's tenant as an index into `tenants`.
        let tenant = |j: &QueuedJob| tenants.get(j.tenant as usize);
        let factor = |j: &QueuedJob| tenant(j).map_or(0.0, |t| t.fair_share);
        let mut order: Vec<&QueuedJob> = jobs.iter().collect();
        order.sort_by(|a, b| match (has_deadline(a), has_deadline(b)) {
            (true, false) => Ordering::Less,
            (false, true) => Ordering::Greater,
            (true, true) => oldest_first(a, b),
            (false, false) => factor(b)
                .total_cmp(&factor(a))
                .then(b.priority.cmp(&a.priority))
                .then_with(|| oldest_first(a, b)),
        });
        Ok(order
            .into_iter()
            .map(|j| Ranked {
                job: j.id,
                reason: reason(j, tenant(j)),
            })
            .collect())
    }
}

fn has_deadline(job: &QueuedJob) -> bool {
    job.tags.iter().any(|t| t == DEADLINE)
}

/// The longer-waiting job first; ties (the same age) by id, which grows with submission time.
fn oldest_first(a: &QueuedJob, b: &QueuedJob) -> Ordering {
    b.age_s.total_cmp(&a.age_s).then(a.id.cmp(&b.id))
}

/// What `orch status` shows the job's owner.
fn reason(job: &QueuedJob, tenant: Option<&Tenant>) -> String {
    if has_deadline(job) {
        return format!("tagged {DEADLINE}: deadline jobs go first, oldest first");
    }
    match tenant {
        Some(t) => format!(
            "after the deadline jobs, by fair share: tenant {} used {:.0}% against a share of {:.0}%",
            t.name,
            t.normalized_usage * 100.0,
            t.normalized_share * 100.0
        ),
        None => "after the deadline jobs, by fair share".to_string(),
    }
}

export!(DeadlineFirst);
