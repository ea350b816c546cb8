//! Hostile queue fixture `hostile-queue-refuses`: Refuses with an error value, control characters and all.

orch_queue_kit::export_order!(|jobs, _tenants, _machine| {
    Err(format!(
        "cannot order {} jobs:\u{1b}[31m the moon is\nin the wrong phase",
        jobs.len()
    ))
});
