//! Placement as a dry run: which devices the job's policy picks now, its reason, and why every
//! other visible device was not picked.
//!
//! Candidates are the visible devices (their logical index is their CUDA index) that no
//! exclusive lease holds (nor, for an exclusive request, any lease). Shared leases reduce a
//! device's free memory by what they reserve; other people's processes already count in its
//! used memory.

use orch_core::MachineLimits;
use orch_core::limits::PluginKind as LimitKind;
use orch_core::{DeviceLease, InputError, JobSpec};
use orch_devices::{Device, Visibility};
use orch_host::types::{Device as WitDevice, Lease, Link, PcieLevel, Request, Topology};
use orch_host::{PluginError, PolicyHost, misfit};

/// What a plan is made from.
#[derive(Debug, Clone, Copy)]
pub struct PlanInput<'a> {
    pub job: &'a JobSpec,
    /// The inventory's devices, in physical order.
    pub devices: &'a [Device],
    pub visibility: &'a Visibility,
    /// Leases held now (the lease store's live leases).
    pub leases: &'a [DeviceLease],
}

/// The policy's choice.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Plan {
    pub job: String,
    /// The policy's name (built-in name or file name).
    pub policy: String,
    /// The chosen devices, best first.
    pub chosen: Vec<PlannedDevice>,
    pub reason: String,
    /// Every visible device not chosen, in CUDA order, and why.
    pub rejected: Vec<Rejection>,
    /// Devices of the inventory that are not visible (`CUDA_VISIBLE_DEVICES`, Slurm).
    pub hidden: usize,
}

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PlannedDevice {
    /// CUDA index among the visible devices.
    pub index: u32,
    /// nvidia-smi's index.
    pub physical_index: u32,
    pub uuid: String,
    pub name: String,
    pub memory_free: Option<u64>,
    pub utilization_gpu: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Rejection {
    pub index: u32,
    pub physical_index: u32,
    pub why: String,
}

impl PlannedDevice {
    /// The inventory's reading of this device.
    pub fn in_inventory<'a>(
        &self,
        inventory: &'a orch_devices::Inventory,
    ) -> Option<&'a orch_devices::Device> {
        inventory
            .devices
            .iter()
            .find(|d| d.index == self.physical_index)
    }
}

/// Why there is no plan.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// The job asks for the impossible, or names a policy that cannot be used.
    #[error(transparent)]
    Input(#[from] InputError),
    /// The policy refused, or failed.
    #[error(transparent)]
    Policy(#[from] PluginError),
}

impl PlanError {
    /// True for the user's input (exit 2), false for no fit or a failing plugin (exit 1).
    pub fn is_bad_input(&self) -> bool {
        match self {
            PlanError::Input(_) => true,
            PlanError::Policy(e) => e.is_bad_input(),
        }
    }
}

/// Asks the job's policy for devices. `env` reads the environment variables the job's policy
/// config names (`var`), the only environment a plugin gets.
pub fn plan(
    input: PlanInput<'_>,
    host: &mut PolicyHost,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Plan, PlanError> {
    let job = input.job;
    let visible = visible_devices(input);
    check_count(input, visible.len())?;
    // The job's `[policy] deadline` and `memory`, within the machine's maxima.
    let bounds = MachineLimits::current()
        .and_then(|machine| machine.resolve(LimitKind::Policy, &job.policy.limits))
        .map_err(PlanError::Input)?;
    let limits = host.limits().with_bounds(bounds);
    let policy = host.load_with_limits(&job.policy.plugin, &limits).map_err(|e| {
        if e.is_bad_input() {
            let hint = match e {
                PluginError::UnknownBuiltin { .. } => "check the spelling",
                _ => "`orch plugin inspect FILE` says what a file is; docs/PLUGINS.md shows how to build a policy",
            };
            PlanError::Input(InputError {
                location: job.policy.plugin_at.clone(),
                message: e.to_string(),
                hint: Some(hint.to_string()),
            })
        } else {
            PlanError::Policy(e)
        }
    })?;
    let request = request(job, host.default_config(policy), env);
    let (all, leases) = policy_view(&visible, input.leases);
    let out_of_service = crate::service::out_of_service(&visible);
    let offered: Vec<WitDevice> = all
        .iter()
        .filter(|d| !leases_exclude(&request, d, &leases))
        .filter(|d| !out_of_service.iter().any(|(i, _)| *i == d.index))
        .cloned()
        .collect();
    let offered_leases: Vec<Lease> = leases
        .iter()
        .filter(|l| offered.iter().any(|d| d.index == l.device))
        .cloned()
        .collect();
    let topology = topology(&offered, &visible);
    let decision = host
        .decide_on(policy, &request, &offered, &offered_leases, &topology)
        .map_err(|e| crate::service::explain(e, &out_of_service))?;
    let name = host.name(policy).to_string();
    // One line per decision (`RUST_LOG=orch::policy=debug`): how often a job's policy ran.
    tracing::debug!(
        target: "orch::policy",
        "job {}: policy {name} chose devices {:?}",
        job.name,
        decision.devices
    );
    let chosen = decision
        .devices
        .iter()
        .filter_map(|i| visible.iter().zip(&all).find(|(_, d)| d.index == *i))
        .map(|((_, device, _), wit)| planned(wit, device))
        .collect();
    let mut rejected = rejections(&all, &decision.devices, &request, &leases, &name);
    crate::service::reject(&mut rejected, &out_of_service);
    Ok(Plan {
        job: job.name.clone(),
        policy: name,
        chosen,
        reason: decision.reason,
        rejected,
        hidden: input
            .devices
            .len()
            .saturating_sub(input.visibility.devices.len()),
    })
}

/// A plan made earlier (a policy asked on a snapshot of the machine, away from the lease
/// transaction) checked against the machine now: the devices it chose, found again by UUID, must
/// all still be visible and meet the request with the leases held now, as the host checks a
/// policy's answer. `Ok`: the plan with the current readings; `Err`: why it no longer holds (the
/// policy is to be asked again). The policy itself is not run.
pub fn recheck(
    input: PlanInput<'_>,
    proposal: &Plan,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Plan, String> {
    let job = input.job;
    let visible = visible_devices(input);
    // A policy sent by a tenant has no defaults of its own: its config is the job's.
    let request = request(job, &[], env);
    let (all, leases) = policy_view(&visible, input.leases);
    if proposal.chosen.len() != job.resources.gpus as usize {
        return Err(format!(
            "it chose {} device(s) for a request of {}",
            proposal.chosen.len(),
            job.resources.gpus
        ));
    }
    let mut chosen: Vec<PlannedDevice> = Vec::with_capacity(proposal.chosen.len());
    for planned_device in &proposal.chosen {
        if chosen.iter().any(|d| d.uuid == planned_device.uuid) {
            return Err(format!(
                "it chose device {} more than once",
                planned_device.uuid
            ));
        }
        let Some(((_, device, _), wit)) = visible
            .iter()
            .zip(&all)
            .find(|(_, wit)| wit.uuid == planned_device.uuid)
        else {
            return Err(format!(
                "device {} is no longer one it may be placed on",
                planned_device.uuid
            ));
        };
        if let Some(why) = misfit(&request, wit, &leases) {
            return Err(format!("device {} is now {why}", wit.index));
        }
        if let Some(why) = device.out_of_service(&wit.uuid) {
            return Err(why);
        }
        chosen.push(planned(wit, device));
    }
    let indices: Vec<u32> = chosen.iter().map(|d| d.index).collect();
    let rejected = rejections(&all, &indices, &request, &leases, &proposal.policy);
    Ok(Plan {
        job: job.name.clone(),
        policy: proposal.policy.clone(),
        chosen,
        reason: proposal.reason.clone(),
        rejected,
        hidden: input
            .devices
            .len()
            .saturating_sub(input.visibility.devices.len()),
    })
}

/// The visible devices as a policy sees them, and the leases held on them: what a policy is
/// asked about, and what its answer is checked against.
fn policy_view(
    visible: &[(u32, &Device, Option<String>)],
    held: &[DeviceLease],
) -> (Vec<WitDevice>, Vec<Lease>) {
    let all: Vec<WitDevice> = visible
        .iter()
        .map(|(index, device, mig)| wit_device(*index, device, mig.as_deref(), held))
        .collect();
    let leases: Vec<Lease> = visible
        .iter()
        .zip(&all)
        .flat_map(|((_, device, mig), wit)| {
            leases_on(wit.index, mig.as_deref().unwrap_or(&device.uuid), held)
        })
        .collect();
    (all, leases)
}

/// Every device of `all` not in `chosen` (CUDA indices), and why: its misfit, or that `policy`
/// did not choose it.
fn rejections(
    all: &[WitDevice],
    chosen: &[u32],
    request: &Request,
    leases: &[Lease],
    policy: &str,
) -> Vec<Rejection> {
    all.iter()
        .filter(|d| !chosen.contains(&d.index))
        .map(|d| Rejection {
            index: d.index,
            physical_index: d.physical_index,
            why: misfit(request, d, leases)
                .unwrap_or_else(|| format!("fits, not chosen by {policy}")),
        })
        .collect()
}

/// `(logical index, device, MIG uuid)` of every visible device the job may be offered: its CUDA
/// index, or for a job of MIG slices the visible slices of its profile, numbered in order
/// ([`crate::slices::offer`]).
fn visible_devices<'a>(input: PlanInput<'a>) -> Vec<(u32, &'a Device, Option<String>)> {
    let visible = input
        .visibility
        .devices
        .iter()
        .enumerate()
        .filter_map(|(cuda, v)| {
            let device = input.devices.iter().find(|d| d.index == v.physical)?;
            Some((cuda as u32, device, v.mig_uuid.clone()))
        })
        .collect();
    crate::slices::offer(input.job, visible)
}

/// More devices than are visible is an impossible request, reported at `gpus`.
fn check_count(input: PlanInput<'_>, visible: usize) -> Result<(), InputError> {
    crate::slices::check_count(input.job, input.devices, visible)?;
    let gpus = input.job.resources.gpus as usize;
    if gpus <= visible {
        return Ok(());
    }
    let cut = crate::slices::whole_gpu_note(input.job, input.devices).unwrap_or_default();
    // GPUs in MIG mode are never leased whole.
    let total = input.devices.iter().filter(|d| !d.mig_mode).count();
    let (message, hint) = if total == 0 && !cut.is_empty() {
        // Every GPU is in MIG mode: only slices can be had.
        let profiles = orch_devices::mig::profiles(input.devices);
        (
            format!("gpus = {gpus}, but this machine has no whole GPU{cut}"),
            if profiles.is_empty() {
                "no GPU here has slices yet: an admin makes them (nvidia-smi mig -cgi)".to_string()
            } else {
                format!(
                    "ask for slices with mig = PROFILE; this machine's profiles are {}",
                    profiles.join(", ")
                )
            },
        )
    } else if visible == total {
        (
            format!("gpus = {gpus}, but this machine has {total} device(s){cut}"),
            format!("ask for at most {total}"),
        )
    } else {
        (
            format!(
                "gpus = {gpus}, but only {visible} of the {total} device(s) here are visible{cut}"
            ),
            format!(
                "ask for at most {visible}, or widen CUDA_VISIBLE_DEVICES / the Slurm allocation"
            ),
        )
    };
    Err(InputError {
        location: input.job.resources.gpus_at.clone(),
        message,
        hint: Some(hint),
    })
}

/// The request the policy sees: the job's resources, its config with the plugin's defaults
/// filled in, and the environment variables config `var` names.
fn request(
    job: &JobSpec,
    defaults: &[(&str, &str)],
    env: &dyn Fn(&str) -> Option<String>,
) -> Request {
    let mut config = job.policy.config.clone();
    for (key, value) in defaults {
        if !config.iter().any(|(k, _)| k == key) {
            config.push((key.to_string(), value.to_string()));
        }
    }
    let granted = config
        .iter()
        .filter(|(k, _)| k == "var")
        .filter_map(|(_, name)| env(name).map(|value| (name.clone(), value)))
        .collect();
    let r = &job.resources;
    Request {
        count: r.gpus,
        min_free_memory: r.min_free_memory.map(|s| s.bytes()),
        max_utilization: r.max_utilization,
        exclusive: r.exclusive,
        memory_limit: r.memory_limit.map(|s| s.bytes()),
        config,
        env: granted,
    }
}

/// The device as a policy sees it: its telemetry (a MIG instance's own memory, and none of its
/// parent's other readings: NVML has no utilization of an instance), free memory less what
/// shared leases on it reserve.
fn wit_device(index: u32, device: &Device, mig: Option<&str>, leases: &[DeviceLease]) -> WitDevice {
    let uuid = mig.unwrap_or(&device.uuid);
    let reserved: u64 = leases
        .iter()
        .filter(|l| l.device_uuid == uuid && !l.exclusive)
        .map(|l| l.memory_reserved_bytes)
        .sum();
    let whole = mig.is_none();
    let (memory_total, memory_used, memory_free) = match mig {
        None => (
            device.memory_total_bytes,
            device.memory_used_bytes,
            device.memory_free_bytes,
        ),
        Some(m) => match device.mig_devices.iter().find(|d| d.uuid == m) {
            Some(slice) => (
                slice.memory_total_bytes,
                slice.memory_used_bytes,
                slice.memory_free_bytes(),
            ),
            None => (None, None, None),
        },
    };
    WitDevice {
        index,
        physical_index: device.index,
        uuid: uuid.to_string(),
        memory_total,
        memory_used,
        memory_free: memory_free.map(|free| free.saturating_sub(reserved)),
        utilization_gpu: device.utilization_gpu_percent.filter(|_| whole),
        utilization_memory: device.utilization_memory_percent.filter(|_| whole),
        temperature_c: device.temperature_c,
        power_draw_w: device.power_draw_w,
        compute_capability: device.compute_capability_pair(),
        process_count: device.processes.as_ref().map(|p| p.len() as u32),
    }
}

/// Where the `offered` candidates sit: each one's NUMA node (in candidate order; an empty list
/// when no node is known) and the link between every pair the inventory knows, by logical
/// index. A MIG instance sits on its GPU's NUMA node but has no link to anything: MIG has
/// neither NVLink nor peer-to-peer, so its parent's links would only spread a job of several
/// instances across GPUs; the NUMA node and then the policy's own order decide for them. Which
/// candidates are MIG slices, and of what, is in `slices` (contract 0.5.0).
fn topology(offered: &[WitDevice], visible: &[(u32, &Device, Option<String>)]) -> Topology {
    let placed: Vec<Option<&Device>> = offered
        .iter()
        .map(|w| {
            visible
                .iter()
                .find(|(index, _, _)| *index == w.index)
                .map(|(_, device, _)| *device)
        })
        .collect();
    let is_mig: Vec<bool> = offered
        .iter()
        .map(|w| {
            visible
                .iter()
                .any(|(index, _, mig)| *index == w.index && mig.is_some())
        })
        .collect();
    let mut numa_nodes: Vec<Option<u32>> =
        placed.iter().map(|d| d.and_then(|d| d.numa_node)).collect();
    if numa_nodes.iter().all(Option::is_none) {
        numa_nodes.clear();
    }
    let mut links = Vec::new();
    for (i, (a, device_a)) in offered.iter().zip(&placed).enumerate() {
        for (j, (b, device_b)) in offered.iter().zip(&placed).enumerate().skip(i + 1) {
            let (Some(device_a), Some(device_b)) = (device_a, device_b) else {
                continue;
            };
            if is_mig[i] || is_mig[j] {
                continue;
            }
            let Some(link) = device_a.link_to(device_b.index) else {
                continue;
            };
            if device_a.index == device_b.index {
                continue;
            }
            links.push(Link {
                a: a.index.min(b.index),
                b: a.index.max(b.index),
                nvlinks: link.nvlinks,
                pcie: link.pcie.map(|level| match level {
                    orch_devices::PcieLevel::Pix => PcieLevel::Pix,
                    orch_devices::PcieLevel::Pxb => PcieLevel::Pxb,
                    orch_devices::PcieLevel::Phb => PcieLevel::Phb,
                    orch_devices::PcieLevel::Node => PcieLevel::Node,
                    orch_devices::PcieLevel::Sys => PcieLevel::Sys,
                }),
            });
        }
    }
    let slices = crate::slices::topology_slices(offered, visible);
    Topology {
        numa_nodes,
        links,
        slices,
    }
}

/// The leases on the device `uuid`, numbered by its logical `index`.
fn leases_on(index: u32, uuid: &str, leases: &[DeviceLease]) -> Vec<Lease> {
    leases
        .iter()
        .filter(|l| l.device_uuid == uuid)
        .map(|l| Lease {
            device: index,
            job_name: l.job_name.clone(),
            exclusive: l.exclusive,
            memory_reserved: l.memory_reserved_bytes,
        })
        .collect()
}

/// True when leases keep the device from this request altogether: an exclusive lease, or any
/// lease when the request is exclusive.
fn leases_exclude(request: &Request, device: &WitDevice, leases: &[Lease]) -> bool {
    let mut on_it = leases.iter().filter(|l| l.device == device.index);
    if request.exclusive {
        on_it.next().is_some()
    } else {
        on_it.any(|l| l.exclusive)
    }
}

fn planned(wit: &WitDevice, device: &Device) -> PlannedDevice {
    PlannedDevice {
        index: wit.index,
        physical_index: wit.physical_index,
        uuid: wit.uuid.clone(),
        name: device.name.clone(),
        memory_free: wit.memory_free,
        utilization_gpu: wit.utilization_gpu,
    }
}
