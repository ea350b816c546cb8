//! A placement policy built against contract `orch:plugin@0.4.0` (the `placement` interface of
//! that version, whose `topology` has no MIG slices): the lowest logical indices that fit, as the
//! built-in `first-fit` chooses, saying how many candidates' NUMA nodes it was told. A test
//! fixture: the host must keep loading and asking policies built for 0.4.0.

wit_bindgen::generate!({
    path: "../../../crates/orch-wit/compat/0.4.0",
    world: "policy",
});

use exports::orch::plugin::placement::Guest;
use orch::plugin::types::{Decision, Device, Lease, Refusal, Request, Topology};

struct FirstFit;

impl Guest for FirstFit {
    fn select_devices(
        request: Request,
        candidates: Vec<Device>,
        leases: Vec<Lease>,
        topology: Topology,
    ) -> Result<Decision, Refusal> {
        let fits = |d: &&Device| {
            let mut on_it = leases.iter().filter(|l| l.device == d.index);
            let leased = if request.exclusive {
                on_it.next().is_some()
            } else {
                on_it.any(|l| l.exclusive)
            };
            let memory = request
                .min_free_memory
                .is_none_or(|min| d.memory_free.is_some_and(|free| free >= min));
            let busy = request
                .max_utilization
                .is_none_or(|max| d.utilization_gpu.is_some_and(|u| u <= max));
            !leased && memory && busy
        };
        let chosen: Vec<u32> = candidates
            .iter()
            .filter(fits)
            .take(request.count as usize)
            .map(|d| d.index)
            .collect();
        if chosen.len() < request.count as usize {
            return Err(Refusal::NoFit(format!(
                "{} device(s) needed, {} fit",
                request.count,
                chosen.len()
            )));
        }
        let known = topology.numa_nodes.iter().flatten().count();
        Ok(Decision {
            devices: chosen,
            reason: format!("first fit (a 0.4.0 plugin; {known} NUMA node(s) known)"),
        })
    }
}

export!(FirstFit);
