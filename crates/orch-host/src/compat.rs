//! Asking a policy of contract 0.4.0: its `topology` has no `slices`, so its types are its own
//! ([`orch_wit::v0_4::policy`]); the request, candidates, leases and topology are copied into
//! them field for field (less the slices), and its answer back.

use crate::sandbox::PluginState;
use crate::types::{Decision, Device, Lease, PcieLevel, Refusal, Request, Topology};
use orch_wit::v0_4::policy::Policy;
use orch_wit::v0_4::policy::orch::plugin::types as old;
use wasmtime::Store;

/// `placement.select-devices` of a 0.4.0 policy, with the 0.5.0 arguments.
pub(crate) fn select_0_4(
    policy: &Policy,
    store: &mut Store<PluginState>,
    request: &Request,
    candidates: &[Device],
    leases: &[Lease],
    topology: &Topology,
) -> wasmtime::Result<Result<Decision, Refusal>> {
    let request = old::Request {
        count: request.count,
        min_free_memory: request.min_free_memory,
        max_utilization: request.max_utilization,
        exclusive: request.exclusive,
        memory_limit: request.memory_limit,
        config: request.config.clone(),
        env: request.env.clone(),
    };
    let candidates: Vec<old::Device> = candidates
        .iter()
        .map(|d| old::Device {
            index: d.index,
            physical_index: d.physical_index,
            uuid: d.uuid.clone(),
            memory_total: d.memory_total,
            memory_used: d.memory_used,
            memory_free: d.memory_free,
            utilization_gpu: d.utilization_gpu,
            utilization_memory: d.utilization_memory,
            temperature_c: d.temperature_c,
            power_draw_w: d.power_draw_w,
            compute_capability: d.compute_capability,
            process_count: d.process_count,
        })
        .collect();
    let leases: Vec<old::Lease> = leases
        .iter()
        .map(|l| old::Lease {
            device: l.device,
            job_name: l.job_name.clone(),
            exclusive: l.exclusive,
            memory_reserved: l.memory_reserved,
        })
        .collect();
    let topology = old::Topology {
        numa_nodes: topology.numa_nodes.clone(),
        links: topology
            .links
            .iter()
            .map(|l| old::Link {
                a: l.a,
                b: l.b,
                nvlinks: l.nvlinks,
                pcie: l.pcie.map(|p| match p {
                    PcieLevel::Pix => old::PcieLevel::Pix,
                    PcieLevel::Pxb => old::PcieLevel::Pxb,
                    PcieLevel::Phb => old::PcieLevel::Phb,
                    PcieLevel::Node => old::PcieLevel::Node,
                    PcieLevel::Sys => old::PcieLevel::Sys,
                }),
            })
            .collect(),
    };
    let answer = policy.orch_plugin_placement().call_select_devices(
        store,
        &request,
        &candidates,
        &leases,
        &topology,
    )?;
    Ok(match answer {
        Ok(d) => Ok(Decision {
            devices: d.devices,
            reason: d.reason,
        }),
        Err(old::Refusal::NoFit(why)) => Err(Refusal::NoFit(why)),
        Err(old::Refusal::BadConfig(why)) => Err(Refusal::BadConfig(why)),
    })
}
