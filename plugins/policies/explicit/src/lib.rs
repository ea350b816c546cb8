//! Built-in policy `explicit`: The devices `[policy.config] devices` lists (`"0,2"`: CUDA indices, or UUIDs / unique
//! UUID prefixes), in list order; listed devices that do not fit are skipped.

use orch_policy_kit::{
    Decision, Device, Guest, Input, Lease, Refusal, Request, export_policy, pick_listed,
};

struct Explicit;

impl Guest for Explicit {
    fn select_devices(
        request: Request,
        candidates: Vec<Device>,
        leases: Vec<Lease>,
        topology: orch_policy_kit::Topology,
    ) -> Result<Decision, Refusal> {
        let input = Input::new(request, candidates, leases, topology);
        let Some(list) = input.config("devices") else {
            return Err(Refusal::BadConfig(
                "explicit needs [policy.config] devices, such as devices = \"0,2\" or a GPU- uuid"
                    .to_string(),
            ));
        };
        pick_listed(&input, list, "config devices")
    }
}

export_policy!(Explicit);
