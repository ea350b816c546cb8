//! Candidates and requests for host tests: the 8-GPU lab of examples/sim/lab-8gpu.toml.

use orch_host::types::{Device, Request};
use orch_host::{Limits, PluginRef, PolicyHost};
use std::path::PathBuf;

const GIB: u64 = 1 << 30;

/// (free GiB ×10, utilization %, processes) of GPUs 0-7.
const LAB: [(u64, u32, u32); 8] = [
    (90, 97, 1),
    (795, 0, 0),
    (600, 45, 1),
    (21, 88, 2),
    (795, 0, 0),
    (700, 12, 1),
    (400, 60, 0),
    (790, 3, 0),
];

pub fn lab() -> Vec<Device> {
    LAB.iter()
        .enumerate()
        .map(|(i, &(free_tenths, busy, procs))| {
            let free = free_tenths * GIB / 10;
            Device {
                index: i as u32,
                physical_index: i as u32,
                uuid: format!("GPU-{i:08x}-0000-4000-8000-000000000000"),
                memory_total: Some(80 * GIB),
                memory_used: Some(80 * GIB - free),
                memory_free: Some(free),
                utilization_gpu: Some(busy),
                utilization_memory: None,
                temperature_c: Some(40),
                power_draw_w: Some(100.0),
                compute_capability: Some((9, 0)),
                process_count: Some(procs),
            }
        })
        .collect()
}

pub fn request(count: u32) -> Request {
    Request {
        count,
        min_free_memory: Some(10 * GIB),
        max_utilization: None,
        exclusive: true,
        memory_limit: None,
        config: vec![],
        env: vec![],
    }
}

/// A host with the default limits, its compile cache in the target folder (compiling in a
/// debug build is slow; the cache itself is tested in `cache.rs`).
pub fn host() -> PolicyHost {
    PolicyHost::with_cache_dir(Limits::default(), Some(cache_dir())).expect("host")
}

pub fn cache_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("orch-cache")
}

pub fn fixture(name: &str) -> PluginRef {
    PluginRef::Path(PathBuf::from(orch_host::PLUGIN_WASM_DIR).join(format!("{name}.wasm")))
}

pub fn builtin(name: &str) -> PluginRef {
    PluginRef::Builtin(name.into())
}
