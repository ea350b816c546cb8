//! Hostile queue fixture `hostile-queue-trap`: Panics, as a buggy queue policy would (a panic ends in `unreachable`).

orch_queue_kit::export_order!(|jobs, _tenants, _machine| {
    panic!(
        "queue policy bug: {} jobs and no idea what to do",
        jobs.len()
    )
});
