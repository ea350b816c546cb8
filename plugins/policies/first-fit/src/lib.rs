//! Built-in policy `first-fit`: The lowest CUDA indices that fit.

use orch_policy_kit::{
    Decision, Device, Guest, Input, Lease, Refusal, Request, choose_ranked, export_policy,
};
use std::cmp::Ordering;

struct FirstFit;

impl Guest for FirstFit {
    fn select_devices(
        request: Request,
        candidates: Vec<Device>,
        leases: Vec<Lease>,
        topology: orch_policy_kit::Topology,
    ) -> Result<Decision, Refusal> {
        let input = Input::new(request, candidates, leases, topology);
        choose_ranked(&input, "first fit (lowest CUDA index that fits)", |_, _| {
            Ordering::Equal
        })
    }
}

export_policy!(FirstFit);
