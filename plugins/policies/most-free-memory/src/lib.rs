//! Built-in policy `most-free-memory`: Most free memory first, then lowest utilization.

use orch_policy_kit::{
    Decision, Device, Guest, Input, Lease, Refusal, Request, busy, choose_ranked, export_policy,
    free,
};

struct MostFreeMemory;

impl Guest for MostFreeMemory {
    fn select_devices(
        request: Request,
        candidates: Vec<Device>,
        leases: Vec<Lease>,
        topology: orch_policy_kit::Topology,
    ) -> Result<Decision, Refusal> {
        let input = Input::new(request, candidates, leases, topology);
        choose_ranked(
            &input,
            "most free memory (then lowest utilization)",
            |a, b| free(b).cmp(&free(a)).then(busy(a).cmp(&busy(b))),
        )
    }
}

export_policy!(MostFreeMemory);
