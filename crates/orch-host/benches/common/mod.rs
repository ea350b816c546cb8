//! What the policy benches share: the candidates (a spread of loads, temperatures and power
//! draws) and the request (2 devices, at least 10 GiB free, at most 90% busy).

use orch_host::types::{Device, Link, PcieLevel, Request, Slice, Topology};

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

/// An 8-GPU HGX box: GPUs 0-3 on NUMA node 0, 4-7 on node 1, every pair NVLinked (NV18), the
/// PCIe path `NODE` within a socket and `SYS` across. (The policy bench's; the languages bench
/// has no use for it.)
#[allow(dead_code)]
pub fn hgx8() -> Topology {
    topology8(|a, b| {
        let level = if a / 4 == b / 4 {
            PcieLevel::Node
        } else {
            PcieLevel::Sys
        };
        (18, level)
    })
}

/// An 8-GPU PCIe box without NVLink, two switches per socket: GPUs 0-1, 2-3 (node 0), 4-5, 6-7
/// (node 1); `PIX` under one switch, `NODE` within a socket, `SYS` across.
#[allow(dead_code)]
pub fn pcie8() -> Topology {
    topology8(|a, b| {
        let level = if a / 2 == b / 2 {
            PcieLevel::Pix
        } else if a / 4 == b / 4 {
            PcieLevel::Node
        } else {
            PcieLevel::Sys
        };
        (0, level)
    })
}

/// Eight GPUs, 0-3 on NUMA node 0 and 4-7 on node 1, each pair linked as `link` says.
#[allow(dead_code)]
fn topology8(link: impl Fn(u32, u32) -> (u32, PcieLevel)) -> Topology {
    let mut links = Vec::new();
    for a in 0..8 {
        for b in a + 1..8 {
            let (nvlinks, level) = link(a, b);
            links.push(Link {
                a,
                b,
                nvlinks,
                pcie: Some(level),
            });
        }
    }
    Topology {
        numa_nodes: (0..8).map(|i| Some(i / 4)).collect(),
        links,
        slices: Vec::new(),
    }
}

/// An 8-GPU box in MIG mode, 7 `1g.10gb` slices per GPU (GPUs 0-3 on NUMA node 0, 4-7 on node
/// 1): the 56 slices as a job of `mig = "1g.10gb"` is offered them (numbered 0..56, each with
/// its own memory and none of its parent's readings) and their topology (NUMA nodes, no links,
/// the slices). (The policy bench's.)
#[allow(dead_code)]
pub fn slices8x7() -> (Vec<Device>, Topology) {
    let mut devices = Vec::with_capacity(56);
    let mut numa_nodes = Vec::with_capacity(56);
    let mut slices = Vec::with_capacity(56);
    for gpu in 0..8u32 {
        for slot in 0..7u32 {
            let index = gpu * 7 + slot;
            devices.push(Device {
                index,
                physical_index: gpu,
                uuid: format!("MIG-{gpu:08x}-{slot:04x}-4000-8000-000000000000"),
                memory_total: Some(10 * GIB),
                memory_used: None,
                memory_free: None,
                utilization_gpu: None,
                utilization_memory: None,
                temperature_c: Some(40),
                power_draw_w: Some(300.0),
                compute_capability: Some((9, 0)),
                process_count: Some(0),
            });
            numa_nodes.push(Some(gpu / 4));
            slices.push(Some(Slice {
                profile: "1g.10gb".to_string(),
                memory_total: Some(10 * GIB),
                parent_index: gpu,
                numa_node: Some(gpu / 4),
                compute_fraction: 1.0 / 7.0,
            }));
        }
    }
    let topology = Topology {
        numa_nodes,
        links: Vec::new(),
        slices,
    };
    (devices, topology)
}
