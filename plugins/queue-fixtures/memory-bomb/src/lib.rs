//! Hostile queue fixture `hostile-queue-memory-bomb`: Allocates until the linear-memory cap stops it.

orch_queue_kit::export_order!(|_jobs, _tenants, _machine| {
    let mut hoard: Vec<Vec<u8>> = Vec::new();
    loop {
        hoard.push(vec![0xA5; 1 << 20]);
        std::hint::black_box(&hoard);
    }
});
