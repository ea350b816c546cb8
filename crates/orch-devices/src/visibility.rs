//! Which devices a CUDA program would see, and under which numbers.
//!
//! The rules are CUDA's own (the driver parses `CUDA_VISIBLE_DEVICES` the way PyTorch's
//! `torch.cuda._parse_visible_devices` mirrors it), so `orch devices` can show the physical
//! (nvidia-smi) index and the CUDA index side by side:
//!
//! - **unset**: every device, in CUDA's enumeration order.
//! - **empty** (or only spaces): no device.
//! - **renumbering**: visible devices are numbered 0..n-1 in list order.
//! - **integers** are indices into CUDA's enumeration order, read like `strtoul`: the leading digits
//!   count (`1gpu` is 1); an entry with no leading digit (`-1`, `x`) ends the list.
//! - **UUIDs**: a list that starts with `GPU-` is a list of UUIDs or unique UUID prefixes
//!   (`GPU-8932f937`); an entry matching no device, or more than one, ends the list, and so does
//!   an entry without the `GPU-` prefix.
//! - **MIG**: a list that starts with `MIG-` names MIG instances the same way.
//! - **truncation**: everything after the first invalid or unknown entry is ignored (an index past
//!   the last device is unknown).
//! - **repetition**: a device named twice makes the whole list empty.
//! - **order**: `CUDA_DEVICE_ORDER=PCI_BUS_ID` enumerates in PCI bus order (NVML's, the physical
//!   index); the default `FASTEST_FIRST` puts the fastest device first. CUDA does not publish its
//!   heuristic: orch ranks by compute capability, then memory, then PCI order, which equals PCI order
//!   on a box of identical GPUs. Jobs orch launches get `PCI_BUS_ID`, so there is no guess there.
//! - **Slurm**: inside an allocation (`SLURM_STEP_GPUS`, else `SLURM_JOB_GPUS`: physical indices)
//!   only the granted devices are visible; when the grant names indices the inventory does not
//!   have, the node confines devices with cgroups and the inventory already is the grant.

use crate::Device;
use std::collections::HashSet;

/// The environment variables visibility depends on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VisibilityEnv {
    pub cuda_visible_devices: Option<String>,
    pub cuda_device_order: Option<String>,
    pub slurm_step_gpus: Option<String>,
    pub slurm_job_gpus: Option<String>,
}

impl VisibilityEnv {
    /// Reads the variables of this process.
    pub fn from_process() -> VisibilityEnv {
        let var = |name| std::env::var(name).ok();
        VisibilityEnv {
            cuda_visible_devices: var("CUDA_VISIBLE_DEVICES"),
            cuda_device_order: var("CUDA_DEVICE_ORDER"),
            slurm_step_gpus: var("SLURM_STEP_GPUS"),
            slurm_job_gpus: var("SLURM_JOB_GPUS"),
        }
    }
}

/// One device a CUDA program would see; its CUDA index is its position in [`Visibility::devices`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VisibleDevice {
    /// Physical index of the GPU (or of the MIG instance's parent).
    pub physical: u32,
    /// The MIG instance, when the entry named one.
    pub mig_uuid: Option<String>,
}

/// The visible devices in CUDA order, and notes on entries that were ignored and why.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Visibility {
    pub devices: Vec<VisibleDevice>,
    pub notes: Vec<String>,
}

impl Visibility {
    /// The CUDA index of physical device `physical`, when visible.
    pub fn visible_index(&self, physical: u32) -> Option<usize> {
        self.devices.iter().position(|v| v.physical == physical)
    }

    /// Applies the rules (see the module documentation) to `devices`, given in physical order.
    pub fn resolve(devices: &[Device], env: &VisibilityEnv) -> Visibility {
        let mut notes = Vec::new();
        let order = enumeration_order(devices, env.cuda_device_order.as_deref(), &mut notes);
        let mut visible = match env.cuda_visible_devices.as_deref() {
            None => order
                .iter()
                .map(|&physical| VisibleDevice {
                    physical,
                    mig_uuid: None,
                })
                .collect(),
            Some(list) => parse_list(devices, &order, list, &mut notes),
        };
        if let Some(grant) = slurm_grant(devices, env, &mut notes) {
            let before = visible.len();
            visible.retain(|v| grant.contains(&v.physical));
            if visible.len() < before {
                notes.push(format!(
                    "{} device(s) outside the Slurm allocation are hidden",
                    before - visible.len()
                ));
            }
        }
        Visibility {
            devices: visible,
            notes,
        }
    }
}

/// Physical indices in CUDA's enumeration order.
fn enumeration_order(devices: &[Device], order: Option<&str>, notes: &mut Vec<String>) -> Vec<u32> {
    let mut indices: Vec<&Device> = devices.iter().collect();
    indices.sort_by_key(|d| d.index);
    match order.map(str::trim) {
        Some("PCI_BUS_ID") => {}
        None | Some("FASTEST_FIRST") | Some("") => fastest_first(&mut indices),
        Some(other) => {
            notes.push(format!(
                "CUDA_DEVICE_ORDER={other:?} is not PCI_BUS_ID or FASTEST_FIRST; CUDA uses FASTEST_FIRST"
            ));
            fastest_first(&mut indices);
        }
    }
    indices.into_iter().map(|d| d.index).collect()
}

fn fastest_first(devices: &mut [&Device]) {
    // Stable: ties keep PCI order.
    devices.sort_by(|a, b| {
        let key = |d: &Device| (d.compute_capability_pair(), d.memory_total_bytes);
        key(b).cmp(&key(a))
    });
}

fn parse_list(
    devices: &[Device],
    order: &[u32],
    list: &str,
    notes: &mut Vec<String>,
) -> Vec<VisibleDevice> {
    let list = list.trim();
    if list.is_empty() {
        return Vec::new();
    }
    let mut out: Vec<VisibleDevice> = Vec::new();
    let mut seen: HashSet<(u32, Option<String>)> = HashSet::new();
    let kind = if list.starts_with("GPU-") {
        EntryKind::Gpu
    } else if list.starts_with("MIG-") {
        EntryKind::Mig
    } else {
        EntryKind::Index
    };
    for (position, raw) in list.split(',').enumerate() {
        let entry = raw.trim();
        let resolved = match kind {
            EntryKind::Index => resolve_index(order, entry),
            EntryKind::Gpu => resolve_gpu_uuid(devices, entry),
            EntryKind::Mig => resolve_mig_uuid(devices, entry),
        };
        let device = match resolved {
            Ok(device) => device,
            Err(why) => {
                notes.push(format!(
                    "CUDA_VISIBLE_DEVICES entry {} ({entry:?}) {why}: CUDA ignores it and every entry after it",
                    position + 1
                ));
                break;
            }
        };
        if !seen.insert((device.physical, device.mig_uuid.clone())) {
            notes.push(format!(
                "CUDA_VISIBLE_DEVICES names a device twice ({entry:?}): CUDA then shows no device at all"
            ));
            return Vec::new();
        }
        out.push(device);
    }
    out
}

#[derive(Clone, Copy)]
enum EntryKind {
    Index,
    Gpu,
    Mig,
}

fn resolve_index(order: &[u32], entry: &str) -> Result<VisibleDevice, String> {
    let digits: String = entry.chars().take_while(char::is_ascii_digit).collect();
    if digits.is_empty() {
        return Err("is not a device index".to_string());
    }
    let index: usize = digits
        .parse()
        .map_err(|_| "is not a device index".to_string())?;
    let physical = *order
        .get(index)
        .ok_or_else(|| format!("is past the last device ({} present)", order.len()))?;
    Ok(VisibleDevice {
        physical,
        mig_uuid: None,
    })
}

fn resolve_gpu_uuid(devices: &[Device], entry: &str) -> Result<VisibleDevice, String> {
    if !entry.starts_with("GPU-") {
        return Err("does not start with GPU- like the first entry".to_string());
    }
    let matches: Vec<&Device> = devices
        .iter()
        .filter(|d| has_prefix(&d.uuid, entry))
        .collect();
    match matches.as_slice() {
        [one] => Ok(VisibleDevice {
            physical: one.index,
            mig_uuid: None,
        }),
        [] => Err("matches no GPU".to_string()),
        many => Err(format!("matches {} GPUs", many.len())),
    }
}

fn resolve_mig_uuid(devices: &[Device], entry: &str) -> Result<VisibleDevice, String> {
    if !entry.starts_with("MIG-") {
        return Err("does not start with MIG- like the first entry".to_string());
    }
    // The older form MIG-GPU-<uuid>/<gi>/<ci> names the parent GPU and the instance ids.
    if let Some(rest) = entry.strip_prefix("MIG-").filter(|r| r.starts_with("GPU-")) {
        let parent = rest.split('/').next().unwrap_or(rest);
        return resolve_gpu_uuid(devices, parent).map(|v| VisibleDevice {
            physical: v.physical,
            mig_uuid: Some(entry.to_string()),
        });
    }
    let matches: Vec<(u32, &str)> = devices
        .iter()
        .flat_map(|d| {
            d.mig_devices
                .iter()
                .map(move |m| (d.index, m.uuid.as_str()))
        })
        .filter(|(_, uuid)| has_prefix(uuid, entry))
        .collect();
    match matches.as_slice() {
        [(physical, uuid)] => Ok(VisibleDevice {
            physical: *physical,
            mig_uuid: Some(uuid.to_string()),
        }),
        [] => Err("matches no MIG instance".to_string()),
        many => Err(format!("matches {} MIG instances", many.len())),
    }
}

/// Compared as bytes: a prefix may end inside a non-ASCII character of a (sim) uuid.
fn has_prefix(uuid: &str, prefix: &str) -> bool {
    uuid.len() >= prefix.len()
        && uuid.as_bytes()[..prefix.len()].eq_ignore_ascii_case(prefix.as_bytes())
}

/// The physical indices Slurm granted, when inside an allocation whose grant applies here.
fn slurm_grant(
    devices: &[Device],
    env: &VisibilityEnv,
    notes: &mut Vec<String>,
) -> Option<HashSet<u32>> {
    let (name, value) = match (&env.slurm_step_gpus, &env.slurm_job_gpus) {
        (Some(step), _) => ("SLURM_STEP_GPUS", step),
        (None, Some(job)) => ("SLURM_JOB_GPUS", job),
        (None, None) => return None,
    };
    let mut ranges = Vec::new();
    for part in value.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let range = match part.split_once('-') {
            Some((a, b)) => a.parse::<u32>().ok().zip(b.parse::<u32>().ok()),
            None => part.parse::<u32>().ok().map(|i| (i, i)),
        };
        match range {
            Some((a, b)) if a <= b => ranges.push((a, b)),
            _ => {
                notes.push(format!(
                    "{name}={value:?} is not a list of GPU indices; ignored"
                ));
                return None;
            }
        }
    }
    // Ranges are checked against the inventory before they are expanded, so `0-4294967295`
    // costs no more than the inventory's size.
    let known: HashSet<u32> = devices.iter().map(|d| d.index).collect();
    let inside = ranges
        .iter()
        .all(|&(a, b)| ((b - a) as usize) < known.len() && (a..=b).all(|i| known.contains(&i)));
    if !inside {
        notes.push(format!(
            "{name}={value:?} names GPUs this inventory does not have: the node confines devices, so every device here is the grant"
        ));
        return None;
    }
    Some(ranges.into_iter().flat_map(|(a, b)| a..=b).collect())
}

#[cfg(test)]
mod tests;
