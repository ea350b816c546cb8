//! What the policy benches share: the candidates (a spread of loads, temperatures and power
//! draws) and the request (2 devices, at least 10 GiB free, at most 90% busy).

use orch_host::types::{Device, Request};

pub const GIB: u64 = 1 << 30;

/// `n` candidates, deterministic: some full, some busy, some idle.
pub fn candidates(n: usize) -> Vec<Device> {
    (0..n)
        .map(|i| {
            let free = ((i * 37) % 80) as u64 * GIB + GIB / 2;
            let busy = ((i * 53) % 101) as u32;
            Device {
                index: i as u32,
                physical_index: i as u32,
                uuid: format!("GPU-{i:08x}-d72c-4106-c12f-20bd9faed9f6"),
                memory_total: Some(80 * GIB),
                memory_used: Some(80 * GIB - free),
                memory_free: Some(free),
                utilization_gpu: Some(busy),
                utilization_memory: Some(busy / 2),
                temperature_c: Some(30 + busy / 3),
                power_draw_w: Some(70.0 + f64::from(busy) * 6.0),
                compute_capability: Some((9, 0)),
                process_count: Some(u32::from(busy > 0)),
            }
        })
        .collect()
}

pub fn request() -> Request {
    Request {
        count: 2,
        min_free_memory: Some(10 * GIB),
        max_utilization: Some(90),
        exclusive: true,
        memory_limit: None,
        config: vec![],
        env: vec![],
    }
}
