//! Built-in policy `spread`: The opposite of pack: the devices carrying the fewest jobs (orch leases plus other
//! compute processes) first, then the least utilized, then the most free memory, so jobs
//! spread over the box.

use orch_policy_kit::{
    Decision, Device, Guest, Input, Lease, Refusal, Request, busy, choose_ranked, export_policy,
    free,
};

struct Spread;

impl Guest for Spread {
    fn select_devices(
        request: Request,
        candidates: Vec<Device>,
        leases: Vec<Lease>,
        topology: orch_policy_kit::Topology,
    ) -> Result<Decision, Refusal> {
        let input = Input::new(request, candidates, leases, topology);
        let occupants = |d: &Device| {
            // Jobs on the device: orch's leases plus compute processes (unknown: none).
            input.leases_on(d).count() + d.process_count.unwrap_or(0) as usize
        };
        choose_ranked(
            &input,
            "spread (fewest jobs on the device, then lowest utilization)",
            |a, b| {
                occupants(a)
                    .cmp(&occupants(b))
                    .then(busy(a).cmp(&busy(b)))
                    .then(free(b).cmp(&free(a)))
            },
        )
    }
}

export_policy!(Spread);
