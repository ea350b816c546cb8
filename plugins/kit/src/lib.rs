//! What orch's built-in policies share: the `policy` world's guest bindings (generated once,
//! here, and exported by each policy with [`export_policy!`]), the fit check every policy
//! applies, ranking, and device lists (`"0,2"`, UUIDs or UUID prefixes).
//!
//! Design decision: a policy is a ranking. [`choose_ranked`] filters the candidates that fit the
//! request, sorts them with the policy's comparison (ties keep logical-index order, so a
//! decision is deterministic) and takes `count`; a shortfall becomes a typed `no-fit` refusal
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
pub use bindings::orch::plugin::types::{Decision, Device, Lease, Refusal, Request};
pub use wit_bindgen;

mod lists;
mod text;

pub use lists::{parse_device_list, pick_listed};
pub use text::{push_label, push_size, push_summary, push_u64, size};

use std::cmp::Ordering;

/// What `select-devices` receives, together.
#[derive(Debug)]
pub struct Input {
    pub request: Request,
    pub candidates: Vec<Device>,
    pub leases: Vec<Lease>,
}

impl Input {
    pub fn new(request: Request, candidates: Vec<Device>, leases: Vec<Lease>) -> Input {
        Input {
            request,
            candidates,
            leases,
        }
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
/// logical-index order) and takes `request.count`. `rule` says the ranking in words.
pub fn choose_ranked(
    input: &Input,
    rule: &str,
    order: impl Fn(&Device, &Device) -> Ordering,
) -> Result<Decision, Refusal> {
    let mut fitting: Vec<&Device> = input.candidates.iter().filter(|d| input.fits(d)).collect();
    let count = input.request.count as usize;
    if fitting.len() < count {
        return Err(input.no_fit(fitting.len()));
    }
    fitting.sort_by(|a, b| order(a, b).then(a.index.cmp(&b.index)));
    fitting.truncate(count);
    Ok(decision(rule, &fitting))
}

/// A decision for `chosen` (already ranked), its reason the rule and a summary of each.
pub fn decision(rule: &str, chosen: &[&Device]) -> Decision {
    let mut reason = String::with_capacity(rule.len() + 40 * chosen.len() + 2);
    reason.push_str(rule);
    reason.push(':');
    for (i, d) in chosen.iter().enumerate() {
        reason.push_str(if i == 0 { " " } else { ", " });
        push_summary(
            &mut reason,
            d.physical_index,
            d.index,
            d.utilization_gpu,
            d.memory_free,
        );
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
