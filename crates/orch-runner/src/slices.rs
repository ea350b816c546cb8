//! MIG slices as candidates. A job with `[resources] mig = PROFILE` is offered the visible slices
//! of that profile (those of every visible GPU in MIG mode, and slices `CUDA_VISIBLE_DEVICES`
//! names itself), numbered 0..n in that order; any other job is never offered a GPU in MIG mode
//! whole. Each slice is a candidate, and a lease entry, of its own (its `MIG-` uuid).

use orch_core::{InputError, JobSpec};
use orch_devices::{Device, mig};

/// `(logical index, device, MIG uuid)` of a visible device or slice.
pub(crate) type Visible<'a> = (u32, &'a Device, Option<String>);

/// The candidates of `job` among the `visible` devices (in CUDA order).
pub(crate) fn offer<'a>(job: &JobSpec, visible: Vec<Visible<'a>>) -> Vec<Visible<'a>> {
    let Some(profile) = job.resources.mig.as_deref() else {
        // A GPU in MIG mode is only ever leased by its slices.
        return visible
            .into_iter()
            .filter(|(_, device, slice)| slice.is_some() || !device.mig_mode)
            .collect();
    };
    let mut slices: Vec<(&Device, String)> = Vec::new();
    for (_, device, named) in visible {
        match named {
            Some(uuid)
                if device
                    .mig_devices
                    .iter()
                    .any(|m| m.uuid == uuid && mig::is_profile(m, profile)) =>
            {
                slices.push((device, uuid));
            }
            Some(_) => {}
            None if device.mig_mode => slices.extend(
                device
                    .mig_devices
                    .iter()
                    .filter(|m| mig::is_profile(m, profile))
                    .map(|m| (device, m.uuid.clone())),
            ),
            None => {}
        }
    }
    slices
        .into_iter()
        .enumerate()
        .map(|(i, (device, uuid))| (i as u32, device, Some(uuid)))
        .collect()
}

/// A job of slices that asks for more than the visible slices of its profile: one sentence at
/// `gpus` (or, when the machine has none of the profile, the profiles it has).
pub(crate) fn check_count(
    job: &JobSpec,
    devices: &[Device],
    offered: usize,
) -> Result<(), InputError> {
    let Some(profile) = job.resources.mig.as_deref() else {
        return Ok(());
    };
    let gpus = job.resources.gpus as usize;
    if gpus <= offered {
        return Ok(());
    }
    let on_machine = devices
        .iter()
        .flat_map(|d| d.mig_devices.iter())
        .filter(|m| mig::is_profile(m, profile))
        .count();
    let (message, hint) = if on_machine == 0 {
        let have = mig::profiles(devices);
        (
            format!("mig = \"{profile}\", but this machine has no MIG slice of that profile"),
            if have.is_empty() {
                "no GPU here is in MIG mode: leave out mig to lease whole GPUs".to_string()
            } else {
                format!("its slices are {}", have.join(", "))
            },
        )
    } else if offered == on_machine {
        (
            format!(
                "gpus = {gpus} with mig = \"{profile}\", but this machine has {on_machine} slice(s) of that profile"
            ),
            format!("ask for at most {on_machine}"),
        )
    } else {
        (
            format!(
                "gpus = {gpus} with mig = \"{profile}\", but only {offered} of the {on_machine} slice(s) of that profile here are visible"
            ),
            format!(
                "ask for at most {offered}, or widen CUDA_VISIBLE_DEVICES / the Slurm allocation"
            ),
        )
    };
    Err(InputError {
        location: job.resources.gpus_at.clone(),
        message,
        hint: Some(hint),
    })
}

/// A note for a job of whole GPUs that asks for more than it may get because some visible GPUs
/// are in MIG mode.
pub(crate) fn whole_gpu_note(job: &JobSpec, devices: &[Device]) -> Option<String> {
    if job.resources.mig.is_some() {
        return None;
    }
    let cut: Vec<String> = devices
        .iter()
        .filter(|d| d.mig_mode)
        .map(|d| d.index.to_string())
        .collect();
    match cut.as_slice() {
        [] => None,
        [one] => Some(format!(
            "; GPU {one} in MIG mode: its slices are leased with mig = PROFILE, never the GPU whole"
        )),
        many => Some(format!(
            "; GPUs {} in MIG mode: their slices are leased with mig = PROFILE, never the GPUs whole",
            many.join(", ")
        )),
    }
}

/// The MIG capability nodes a job on `plan` may not open, with their major: every capability
/// minor the driver lists (`mig-minors`: every GPU and compute instance that could exist, and
/// the `config` and `monitor` capabilities) and every one the inventory's slices name, less
/// those of the slices it was granted (slices of one GPU instance share its node). `None` when
/// none is known, or the machine has no `nvidia-caps` major ([`mig::caps_major`]).
pub(crate) fn denied_caps(
    plan: &crate::Plan,
    inventory: &orch_devices::Inventory,
) -> Option<(u32, Vec<u32>)> {
    let mut all: Vec<u32> = inventory
        .devices
        .iter()
        .flat_map(|d| d.mig_devices.iter())
        .flat_map(mig::cap_minors)
        .collect();
    // Only where slices are in play: a machine without MIG has nothing under nvidia-caps a job
    // needs to be kept from, and reads no file for it.
    if all.is_empty() && !holds_slices(plan) {
        return None;
    }
    all.extend(mig::read_mig_minors().into_values());
    all.sort_unstable();
    all.dedup();
    let granted = granted_caps(plan, inventory);
    let denied: Vec<u32> = all.into_iter().filter(|m| !granted.contains(m)).collect();
    if denied.is_empty() {
        return None;
    }
    Some((mig::caps_major()?, denied))
}

/// The capability minors of the slices `plan` was granted.
fn granted_caps(plan: &crate::Plan, inventory: &orch_devices::Inventory) -> Vec<u32> {
    plan.chosen
        .iter()
        .filter_map(|c| mig::find(&inventory.devices, &c.uuid))
        .flat_map(|(_, slice)| mig::cap_minors(slice))
        .collect()
}

fn holds_slices(plan: &crate::Plan) -> bool {
    plan.chosen.iter().any(|c| c.uuid.starts_with("MIG-"))
}

/// Why a job on `plan` cannot be kept to its own MIG slices on this machine, when orch confines
/// devices: the driver has capability nodes (an `nvidia-caps` major) but the granted slices'
/// minors are unknown, so the device rule could not let the job open its own slices while
/// keeping it from the others. A driver without capability nodes (`nv_cap_enable_devfs=0`)
/// guards them through `/proc` instead, and is not refused.
pub(crate) fn caps_problem(
    plan: &crate::Plan,
    inventory: &orch_devices::Inventory,
) -> Option<String> {
    if !holds_slices(plan) || mig::caps_major().is_none() {
        return None;
    }
    let slices = plan.chosen.iter().filter(|c| c.uuid.starts_with("MIG-"));
    let unknown: Vec<&str> = slices
        .filter(|c| {
            mig::find(&inventory.devices, &c.uuid)
                .is_none_or(|(_, slice)| mig::cap_minors(slice).next().is_none())
        })
        .map(|c| c.uuid.as_str())
        .collect();
    (!unknown.is_empty()).then(|| {
        format!(
            "the capability nodes of MIG slice {} are unknown ({} lists none for it), so the job could not be kept from the GPU's other slices: it is not started; check that the driver's MIG capabilities are listed there",
            unknown.join(", "),
            mig::mig_minors_path().display()
        )
    })
}

/// Why `plan` cannot run as one process, when it holds several MIG slices: a CUDA process
/// enumerates at most one MIG instance, so the others would go unused.
pub(crate) fn single_launch_problem(plan: &crate::Plan) -> Option<String> {
    let slices = plan
        .chosen
        .iter()
        .filter(|c| c.uuid.starts_with("MIG-"))
        .count();
    (slices > 1).then(|| {
        format!(
            "the job holds {slices} MIG slices and launch = \"single\", but a CUDA process enumerates at most one MIG instance: use launch = \"per-device\" (--per-device), one process per slice"
        )
    })
}

/// For each of the `offered` candidates, in their order, the MIG slice it is, as a policy sees
/// it (profile, memory, parent, NUMA node, share of the GPU); empty when none is a slice.
pub(crate) fn topology_slices(
    offered: &[orch_host::types::Device],
    visible: &[Visible<'_>],
) -> Vec<Option<orch_host::types::Slice>> {
    let slices: Vec<Option<orch_host::types::Slice>> = offered
        .iter()
        .map(|w| {
            let (_, device, uuid) = visible.iter().find(|(index, _, _)| *index == w.index)?;
            let slice = device
                .mig_devices
                .iter()
                .find(|m| Some(&m.uuid) == uuid.as_ref())?;
            Some(orch_host::types::Slice {
                profile: mig::short_profile(mig::profile(slice)).to_string(),
                memory_total: slice.memory_total_bytes,
                parent_index: device.index,
                numa_node: device.numa_node,
                compute_fraction: mig::compute_fraction(device, slice),
            })
        })
        .collect();
    if slices.iter().all(Option::is_none) {
        return Vec::new();
    }
    slices
}
