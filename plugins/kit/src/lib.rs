//! What orch's built-in policies share: the `policy` world's guest bindings (generated once,
//! here, and exported by each policy with [`export_policy!`]), the fit check every policy
//! applies, ranking, and device lists (`"0,2"`, UUIDs or UUID prefixes).
//!
//! Design decision: a policy is a ranking. [`choose_ranked`] filters the candidates that fit the
//! request, sorts them with the policy's comparison (ties keep logical-index order, so a
//! decision is deterministic) and takes `count`, or, for several devices on a machine whose
//! topology is known, the set the shared rule of `orch-topology` prefers (one NUMA node, most
//! NVLinks, closest PCIe path, then this ranking); a shortfall becomes a typed `no-fit` refusal
//! that names every candidate that did not fit and why. The host checks all of it again. The
//! fit check allocates nothing and sizes are formatted with integers: in wasm, formatting is
//! what a decision spends most on after the host's copying of its arguments.

// The generated export macro names paths through this crate, from inside it too.
extern crate self as orch_policy_kit;

/// The guest bindings of the `policy` world. In a module: `#[macro_export]` puts the export
/// macros at the crate root, where they would clash with the bindings' own re-exports. The
/// generated `select-devices` takes the canonical ABI's flat arguments, more than clippy likes.
#[allow(clippy::too_many_arguments)]
pub mod bindings {
    wit_bindgen::generate!({
        path: "../../wit",
        world: "policy",
        pub_export_macro: true,
        export_macro_name: "export_policy",
        default_bindings_module: "orch_policy_kit::bindings",
        runtime_path: "orch_policy_kit::wit_bindgen::rt",
    });
}

pub use bindings::export_policy;
pub use bindings::exports::orch::plugin::placement::Guest;
pub use bindings::orch::plugin::types::{
    Decision, Device, Lease, Link, PcieLevel, Refusal, Request, Slice, Topology,
};
pub use wit_bindgen;

mod lists;
mod text;

pub use lists::{parse_device_list, pick_listed};
pub use text::{push_label, push_size, push_slice_summary, push_summary, push_u64, size};

use std::cmp::Ordering;

/// What `select-devices` receives, together.
#[derive(Debug)]
pub struct Input {
    pub request: Request,
    pub candidates: Vec<Device>,
    pub leases: Vec<Lease>,
    pub topology: Topology,
}

impl Input {
    pub fn new(
        request: Request,
        candidates: Vec<Device>,
        leases: Vec<Lease>,
        topology: Topology,
    ) -> Input {
        Input {
            request,
            candidates,
            leases,
            topology,
        }
    }

    /// The candidates' shape for the set rule (positions are indices into `candidates`), or
    /// `None` when the host knows nothing of it.
    pub fn shape(&self) -> Option<orch_topology::Shape> {
        let topology = &self.topology;
        if topology.links.is_empty() && topology.numa_nodes.iter().all(Option::is_none) {
            return None;
        }
        let numa = (0..self.candidates.len())
            .map(|p| topology.numa_nodes.get(p).copied().flatten())
            .collect();
        let mut shape = orch_topology::Shape::new(numa);
        let position = |index: u32| self.candidates.iter().position(|d| d.index == index);
        for link in &topology.links {
            if let (Some(a), Some(b)) = (position(link.a), position(link.b)) {
                let pcie = link.pcie.map(|level| match level {
                    PcieLevel::Pix => orch_topology::Pcie::Pix,
                    PcieLevel::Pxb => orch_topology::Pcie::Pxb,
                    PcieLevel::Phb => orch_topology::Pcie::Phb,
                    PcieLevel::Node => orch_topology::Pcie::Node,
                    PcieLevel::Sys => orch_topology::Pcie::Sys,
                });
                let nvlinks = link.nvlinks;
                shape.set_link(a, b, orch_topology::Link { nvlinks, pcie });
            }
        }
        shape.is_known().then_some(shape)
    }

    /// The MIG slice `device` is (its profile, memory, parent GPU, NUMA node, share of the
    /// GPU), or `None` for a whole GPU.
    pub fn slice(&self, device: &Device) -> Option<&Slice> {
        let position = self.candidates.iter().position(|d| d.index == device.index)?;
        self.topology.slices.get(position)?.as_ref()
    }

    /// The value of `[policy.config]` key `key`, when given.
    pub fn config(&self, key: &str) -> Option<&str> {
        lookup(&self.request.config, key)
    }

    /// The value of environment variable `name`, when the host granted and found it.
    pub fn env(&self, name: &str) -> Option<&str> {
        lookup(&self.request.env, name)
    }

    /// The leases on `device`.
    pub fn leases_on(&self, device: &Device) -> impl Iterator<Item = &Lease> {
        let index = device.index;
        self.leases.iter().filter(move |l| l.device == index)
    }

    /// True when `device` can take the request: no lease in the way, enough free memory, not
    /// too busy. Allocation-free, so ranking many candidates stays cheap; [`Input::misfit`]
    /// says why not.
    pub fn fits(&self, device: &Device) -> bool {
        let request = &self.request;
        let mut leases = self.leases_on(device).peekable();
        let leased = if request.exclusive {
            leases.peek().is_some()
        } else {
            leases.any(|l| l.exclusive)
        };
        let memory = request
            .min_free_memory
            .is_none_or(|min| device.memory_free.is_some_and(|free| free >= min));
        let busy = request
            .max_utilization
            .is_none_or(|max| device.utilization_gpu.is_some_and(|u| u <= max));
        !leased && memory && busy
    }

    /// Why `device` cannot take the request, or `None` when it fits (the host's words).
    pub fn misfit(&self, device: &Device) -> Option<String> {
        if self.fits(device) {
            return None;
        }
        let request = &self.request;
        if let Some(lease) = self.leases_on(device).find(|l| l.exclusive) {
            return Some(format!("held exclusively by job {}", lease.job_name));
        }
        if let (true, Some(lease)) = (request.exclusive, self.leases_on(device).next()) {
            return Some(format!(
                "shared with job {}, and the job asks for exclusive use",
                lease.job_name
            ));
        }
        if let Some(min) = request.min_free_memory {
            match device.memory_free {
                None => return Some("free memory unknown".to_string()),
                Some(free) if free < min => {
                    return Some(format!("{} free < {} requested", size(free), size(min)));
                }
                Some(_) => {}
            }
        }
        match (request.max_utilization, device.utilization_gpu) {
            (Some(_), None) => Some("utilization unknown".to_string()),
            (Some(max), Some(busy)) => Some(format!("{busy}% busy > {max}% allowed")),
            (None, _) => None,
        }
    }

    /// The refusal when only `fitting` candidates fit: how many were needed, and why each
    /// other candidate did not fit.
    pub fn no_fit(&self, fitting: usize) -> Refusal {
        let why: Vec<String> = self
            .candidates
            .iter()
            .filter_map(|d| self.misfit(d).map(|w| format!("{}: {w}", label(d))))
            .collect();
        let mut text = format!(
            "{} device(s) needed, {fitting} of {} candidate(s) fit",
            self.request.count,
            self.candidates.len()
        );
        if !why.is_empty() {
            text.push_str(&format!(" ({})", why.join("; ")));
        }
        Refusal::NoFit(text)
    }
}

fn lookup<'a>(pairs: &'a [(String, String)], key: &str) -> Option<&'a str> {
    pairs
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

/// Utilization for ranking: unknown counts as fully busy.
pub fn busy(device: &Device) -> u32 {
    device.utilization_gpu.unwrap_or(u32::MAX)
}

/// Free memory for ranking: unknown counts as none.
pub fn free(device: &Device) -> u64 {
    device.memory_free.unwrap_or(0)
}

/// Filters the candidates that fit, ranks them with `order` (best first; ties keep
/// logical-index order) and takes `request.count`; for two or more devices on a machine whose
/// topology is known, takes the set the shared rule prefers instead (`orch_topology::choose`:
/// one NUMA node where the set fits, most NVLinks, closest PCIe path, then this ranking), and
/// the reason starts with why. `rule` says the ranking in words.
pub fn choose_ranked(
    input: &Input,
    rule: &str,
    order: impl Fn(&Device, &Device) -> Ordering,
) -> Result<Decision, Refusal> {
    let candidates = &input.candidates;
    let mut fitting: Vec<usize> = (0..candidates.len())
        .filter(|&p| input.fits(&candidates[p]))
        .collect();
    let count = input.request.count as usize;
    if fitting.len() < count {
        return Err(input.no_fit(fitting.len()));
    }
    fitting.sort_by(|&a, &b| {
        let (a, b) = (&candidates[a], &candidates[b]);
        order(a, b).then(a.index.cmp(&b.index))
    });
    if count >= 2
        && let Some(shape) = input.shape()
        && let Some(choice) = orch_topology::choose(&shape, &fitting, count)
    {
        let words = orch_topology::explain(&shape, &choice, |p| candidates[p].physical_index);
        let chosen: Vec<&Device> = choice.set.iter().map(|&p| &candidates[p]).collect();
        return Ok(input.decision_why(Some(&words), rule, &chosen));
    }
    let chosen: Vec<&Device> = fitting[..count].iter().map(|&p| &candidates[p]).collect();
    Ok(input.decision_why(None, rule, &chosen))
}

impl Input {
    /// [`decision_why`], naming each chosen MIG slice by its profile and GPU:
    /// `MIG 1g.10gb of GPU 0 (9.8 GiB free)`.
    pub fn decision_why(&self, topology: Option<&str>, rule: &str, chosen: &[&Device]) -> Decision {
        if self.topology.slices.is_empty() {
            return decision_why(topology, rule, chosen);
        }
        reason_for(topology, rule, chosen, |out, d| match self.slice(d) {
            Some(slice) => {
                push_slice_summary(out, &slice.profile, slice.parent_index, d.memory_free)
            }
            None => push_summary(out, d.physical_index, d.index, d.utilization_gpu, d.memory_free),
        })
    }
}

/// A decision for `chosen` (already ranked), its reason the rule and a summary of each.
pub fn decision(rule: &str, chosen: &[&Device]) -> Decision {
    decision_why(None, rule, chosen)
}

/// [`decision`], its reason led by `topology` (why this set) when given.
pub fn decision_why(topology: Option<&str>, rule: &str, chosen: &[&Device]) -> Decision {
    reason_for(topology, rule, chosen, |out, d| {
        push_summary(out, d.physical_index, d.index, d.utilization_gpu, d.memory_free)
    })
}

/// The decision for `chosen`, its reason `topology; rule: ` and `summary` of each device.
fn reason_for(
    topology: Option<&str>,
    rule: &str,
    chosen: &[&Device],
    summary: impl Fn(&mut String, &Device),
) -> Decision {
    let lead = topology.map_or(0, |t| t.len() + 2);
    let mut reason = String::with_capacity(lead + rule.len() + 40 * chosen.len() + 2);
    if let Some(topology) = topology {
        reason.push_str(topology);
        reason.push_str("; ");
    }
    reason.push_str(rule);
    reason.push(':');
    for (i, d) in chosen.iter().enumerate() {
        reason.push_str(if i == 0 { " " } else { ", " });
        summary(&mut reason, d);
    }
    Decision {
        devices: chosen.iter().map(|d| d.index).collect(),
        reason,
    }
}

/// `GPU 3`, or `GPU 3 (CUDA 0)` when the numbers differ.
pub fn label(device: &Device) -> String {
    let mut out = String::new();
    push_label(&mut out, device.physical_index, device.index);
    out
}
