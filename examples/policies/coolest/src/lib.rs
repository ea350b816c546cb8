//! `coolest`: the coolest GPUs that fit, then the least power-hungry. A thermal-aware policy of
//! the kind a lab writes for a box whose top cards run hot, and an example of a policy written
//! outside orch with nothing but `wit/` and wit-bindgen.

// (The generated export takes the canonical ABI's flat arguments, more than clippy likes.)
#![allow(clippy::too_many_arguments)]

wit_bindgen::generate!({
    path: "../../../wit",
    world: "policy",
});

use exports::orch::plugin::placement::Guest;
use orch::plugin::types::{Decision, Device, Lease, Refusal, Request, Topology};

struct Coolest;

impl Guest for Coolest {
    fn select_devices(
        request: Request,
        candidates: Vec<Device>,
        leases: Vec<Lease>,
        // A thermal choice needs no topology (see ../numa-pack for one that does).
        _topology: Topology,
    ) -> Result<Decision, Refusal> {
        let mut fitting: Vec<&Device> = candidates
            .iter()
            .filter(|d| fits(&request, d, &leases))
            .collect();
        if fitting.len() < request.count as usize {
            return Err(Refusal::NoFit(format!(
                "{} device(s) needed, {} of {} fit the request",
                request.count,
                fitting.len(),
                candidates.len()
            )));
        }
        // Unknown temperature or power counts as hottest: prefer what we can see is cool.
        fitting.sort_by(|a, b| {
            let key = |d: &Device| {
                (
                    d.temperature_c.unwrap_or(u32::MAX),
                    d.power_draw_w.unwrap_or(f64::MAX),
                )
            };
            key(a)
                .partial_cmp(&key(b))
                .unwrap_or(std::cmp::Ordering::Equal)
        });
        fitting.truncate(request.count as usize);
        let picks: Vec<String> = fitting
            .iter()
            .map(|d| match d.temperature_c {
                Some(t) => format!("GPU {} ({t} C)", d.physical_index),
                None => format!("GPU {} (temperature unknown)", d.physical_index),
            })
            .collect();
        Ok(Decision {
            devices: fitting.iter().map(|d| d.index).collect(),
            reason: format!("coolest first: {}", picks.join(", ")),
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

export!(Coolest);
