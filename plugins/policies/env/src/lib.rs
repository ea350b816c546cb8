//! Built-in policy `env`: The devices an environment variable lists, as clusters that hand out `CLOUD_GPU_ID`
//! do. `[policy.config] var` names the variable (default `CLOUD_GPU_ID`); the host reads it
//! and passes it in `request.env`, since a plugin has no environment of its own.

use orch_policy_kit::{
    Decision, Device, Guest, Input, Lease, Refusal, Request, export_policy, pick_listed,
};

struct FromEnv;

impl Guest for FromEnv {
    fn select_devices(
        request: Request,
        candidates: Vec<Device>,
        leases: Vec<Lease>,
        topology: orch_policy_kit::Topology,
    ) -> Result<Decision, Refusal> {
        let input = Input::new(request, candidates, leases, topology);
        let var = input.config("var").unwrap_or("CLOUD_GPU_ID");
        let Some(list) = input.env(var) else {
            return Err(Refusal::BadConfig(format!(
                "{var} is not set in orch's environment; set it to the granted devices (\"0,2\" or GPU- uuids)"
            )));
        };
        pick_listed(&input, list, var)
    }
}

export_policy!(FromEnv);
