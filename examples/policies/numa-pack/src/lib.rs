//! `numa-pack`: fills one NUMA node before the next. Of the NUMA nodes whose free devices can
//! take the whole job, it chooses the fullest (the fewest devices that fit left), so emptier
//! nodes stay whole for wider jobs; within the node, the lowest indices. A job no node can take
//! spans as few nodes as it can (the nodes with the most fitting devices first). An example of a
//! policy that reads `topology`, the argument contract 0.4.0 added; on a machine whose NUMA
//! nodes are unknown it is first-fit.

// (The generated export takes the canonical ABI's flat arguments, more than clippy likes.)
#![allow(clippy::too_many_arguments)]

wit_bindgen::generate!({
    path: "../../../wit",
    world: "policy",
});

use exports::orch::plugin::placement::Guest;
use orch::plugin::types::{Decision, Device, Lease, Refusal, Request, Topology};
use std::collections::BTreeMap;

struct NumaPack;

impl Guest for NumaPack {
    fn select_devices(
        request: Request,
        candidates: Vec<Device>,
        leases: Vec<Lease>,
        topology: Topology,
    ) -> Result<Decision, Refusal> {
        let count = request.count as usize;
        // The fitting candidates by NUMA node (`None`: unknown), each node's in index order.
        let mut nodes: BTreeMap<Option<u32>, Vec<&Device>> = BTreeMap::new();
        let mut fitting = 0;
        for (position, device) in candidates.iter().enumerate() {
            if fits(&request, device, &leases) {
                let node = topology.numa_nodes.get(position).copied().flatten();
                nodes.entry(node).or_default().push(device);
                fitting += 1;
            }
        }
        if fitting < count {
            return Err(Refusal::NoFit(format!(
                "{count} device(s) needed, {fitting} of {} fit the request",
                candidates.len()
            )));
        }
        // The fullest known node that takes the whole job.
        let whole = nodes
            .iter()
            .filter(|(node, devices)| node.is_some() && devices.len() >= count)
            .min_by_key(|(node, devices)| (devices.len(), **node));
        let (chosen, why): (Vec<&Device>, String) = match whole {
            Some((Some(node), devices)) => (
                devices[..count].to_vec(),
                format!(
                    "NUMA node {node}, the fullest that fits ({} of its devices fit)",
                    devices.len()
                ),
            ),
            _ => {
                // Spill over: the nodes with the most fitting devices first (unknown last).
                let mut order: Vec<(&Option<u32>, &Vec<&Device>)> = nodes.iter().collect();
                order.sort_by_key(|(node, devices)| (node.is_none(), usize::MAX - devices.len()));
                let chosen: Vec<&Device> = order
                    .iter()
                    .flat_map(|(_, devices)| devices.iter().copied())
                    .take(count)
                    .collect();
                let why = if nodes.keys().all(Option::is_none) {
                    "no NUMA node known: lowest indices".to_string()
                } else {
                    format!("no NUMA node fits {count} GPUs: as few nodes as possible")
                };
                (chosen, why)
            }
        };
        let picks: Vec<String> = chosen
            .iter()
            .map(|d| format!("GPU {}", d.physical_index))
            .collect();
        Ok(Decision {
            devices: chosen.iter().map(|d| d.index).collect(),
            reason: format!("numa-pack: {why}: {}", picks.join(", ")),
        })
    }
}

/// The request's bounds and the leases. The host checks them again and rejects an answer that
/// breaks them.
fn fits(request: &Request, device: &Device, leases: &[Lease]) -> bool {
    let mut on_it = leases.iter().filter(|l| l.device == device.index);
    let leased = if request.exclusive {
        on_it.next().is_some()
    } else {
        on_it.any(|l| l.exclusive)
    };
    let memory = request
        .min_free_memory
        .is_none_or(|min| device.memory_free.is_some_and(|free| free >= min));
    let busy = request
        .max_utilization
        .is_none_or(|max| device.utilization_gpu.is_some_and(|u| u <= max));
    !leased && memory && busy
}

export!(NumaPack);
