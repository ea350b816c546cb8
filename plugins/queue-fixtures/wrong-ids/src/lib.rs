//! Hostile queue fixture `hostile-queue-wrong-ids`: Answers a job id it was not offered.

use orch_queue_kit::Ranked;

orch_queue_kit::export_order!(|jobs, _tenants, _machine| {
    let unknown = jobs.iter().map(|j| j.id).max().unwrap_or(0) + 1000;
    Ok(vec![Ranked {
        job: unknown,
        reason: "a job from nowhere".into(),
    }])
});
