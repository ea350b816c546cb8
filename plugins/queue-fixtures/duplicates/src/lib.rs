//! Hostile queue fixture `hostile-queue-duplicates`: Answers the same job twice.

use orch_queue_kit::Ranked;

orch_queue_kit::export_order!(|jobs, _tenants, _machine| {
    let first = jobs.first().map_or(0, |j| j.id);
    let twice = || Ranked {
        job: first,
        reason: "twice the fun".into(),
    };
    Ok(vec![twice(), twice()])
});
