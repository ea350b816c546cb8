//! Built-in policy `pack`: Best fit: the fullest devices that still fit (least free memory first), so
//! large free devices stay whole for large jobs: against fragmentation.

use orch_policy_kit::{
    Decision, Device, Guest, Input, Lease, Refusal, Request, busy, choose_ranked, export_policy,
    free,
};

struct Pack;

impl Guest for Pack {
    fn select_devices(
        request: Request,
        candidates: Vec<Device>,
        leases: Vec<Lease>,
        topology: orch_policy_kit::Topology,
    ) -> Result<Decision, Refusal> {
        let input = Input::new(request, candidates, leases, topology);
        choose_ranked(&input, "packed (fullest device that fits first)", |a, b| {
            free(a).cmp(&free(b)).then(busy(b).cmp(&busy(a)))
        })
    }
}

export_policy!(Pack);
