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
    (!cut.is_empty()).then(|| {
        format!(
            "; GPU {} in MIG mode: its slices are leased with mig = PROFILE, never the GPU whole",
            cut.join(", ")
        )
    })
}

/// The MIG capability nodes a job on `plan` may not open, with their major: every capability
/// minor of the inventory's slices less those of the slices it was granted (slices of one GPU
/// instance share its node). `None` when no slice's capability is known, or the machine has no
/// `nvidia-caps` major ([`mig::caps_major`]).
pub(crate) fn denied_caps(
    plan: &crate::Plan,
    inventory: &orch_devices::Inventory,
) -> Option<(u32, Vec<u32>)> {
    let all: Vec<u32> = inventory
        .devices
        .iter()
        .flat_map(|d| d.mig_devices.iter())
        .flat_map(mig::cap_minors)
        .collect();
    if all.is_empty() {
        return None;
    }
    let granted: Vec<u32> = plan
        .chosen
        .iter()
        .filter_map(|c| mig::find(&inventory.devices, &c.uuid))
        .flat_map(|(_, slice)| mig::cap_minors(slice))
        .collect();
    let denied: Vec<u32> = all.into_iter().filter(|m| !granted.contains(m)).collect();
    if denied.is_empty() {
        return None;
    }
    Some((mig::caps_major()?, denied))
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
