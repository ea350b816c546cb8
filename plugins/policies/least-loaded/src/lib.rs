//! Built-in policy `least-loaded`: Lowest utilization first, then most free memory.

use orch_policy_kit::{
    Decision, Device, Guest, Input, Lease, Refusal, Request, busy, choose_ranked, export_policy,
    free,
};

struct LeastLoaded;

impl Guest for LeastLoaded {
    fn select_devices(
        request: Request,
        candidates: Vec<Device>,
        leases: Vec<Lease>,
        topology: orch_policy_kit::Topology,
    ) -> Result<Decision, Refusal> {
        let input = Input::new(request, candidates, leases, topology);
        choose_ranked(
            &input,
            "least loaded (lowest utilization, then most free memory)",
            |a, b| busy(a).cmp(&busy(b)).then(free(b).cmp(&free(a))),
        )
    }
}

export_policy!(LeastLoaded);
