//! Hostile queue fixture `hostile-queue-spin`: Never returns: an infinite loop the host must stop at its deadline.

orch_queue_kit::export_order!(|_jobs, _tenants, _machine| {
    let mut turns: u64 = 0;
    loop {
        turns = std::hint::black_box(turns.wrapping_add(1));
    }
});
