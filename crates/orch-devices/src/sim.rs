//! Simulated GPUs described by a TOML file (`sim:PATH`).
//!
//! Used for tests, demos, capacity planning and trying policies. The format is docs/DEVICES.md's; sizes
//! take units. A malformed file is rejected with file, line and column and what was expected.

use crate::{Backend, Device, DeviceError, GpuProcess, MigDevice};
use orch_core::{ByteSize, InputError};
use serde::Deserialize;
use std::path::Path;
use toml::Spanned;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SimFile {
    #[serde(default)]
    gpu: Vec<SimGpu>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SimGpu {
    name: String,
    memory_total: Spanned<ByteSize>,
    /// Default: the sum of the listed processes' memory (0 with none).
    memory_used: Option<Spanned<ByteSize>>,
    utilization: Option<Spanned<u32>>,
    memory_utilization: Option<Spanned<u32>>,
    uuid: Option<Spanned<String>>,
    /// `DOMAIN:BUS:DEVICE.FUNCTION` in hex, as NVML prints it; derived from the position if absent.
    pci_bus_id: Option<Spanned<String>>,
    compute_capability: Option<Spanned<String>>,
    temperature: Option<u32>,
    power_draw_w: Option<f64>,
    /// The minor number of the GPU's device node (`/dev/nvidiaN`).
    minor_number: Option<Spanned<u32>>,
    #[serde(default)]
    process: Vec<SimProcess>,
    #[serde(default)]
    mig: Vec<SimMig>,
    /// The NUMA node the GPU hangs off.
    numa_node: Option<Spanned<u32>>,
    /// The CPUs close to the GPU, a Linux CPU list (`0-47,96-143`).
    cpus: Option<Spanned<String>>,
    /// GPUs with the same value sit under one PCIe switch.
    pcie_switch: Option<u32>,
    #[serde(default)]
    nvlink: Vec<SimNvlink>,
    /// Xid errors the GPU reported, oldest first: a new entry is a new event (docs/DEVICES.md).
    #[serde(default)]
    xid_errors: Vec<u32>,
    /// Volatile uncorrected ECC errors (more than 0: unhealthy).
    ecc_uncorrected: Option<u64>,
    /// A row remapping waits for a GPU reset.
    row_remap_pending: Option<bool>,
    /// A row remapping failed.
    row_remap_failure: Option<bool>,
    /// Memory pages wait to be retired at the next reset.
    retired_pages_pending: Option<bool>,
    /// The GPU no longer answers.
    #[serde(default)]
    lost: bool,
    /// MIG mode; implied by `[[gpu.mig]]` tables when left out.
    mig_mode: Option<Spanned<bool>>,
    /// The compute slices the GPU is cut into in MIG mode (default 7).
    mig_slots: Option<Spanned<u32>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SimNvlink {
    /// The peer's position among the file's GPUs, from 0.
    peer: Spanned<u32>,
    /// How many NVLinks join the two.
    links: Spanned<u32>,
}

/// The most NVLinks two GPUs have (NVSwitch boxes of today: 18 per GPU).
const MAX_NVLINKS: u32 = 64;
/// The most GPUs of one file whose links are worked out (every pair is a link).
const MAX_TOPOLOGY_GPUS: usize = 256;
/// The highest NUMA node number Linux numbers (`MAX_NUMNODES` is 1024).
const MAX_NUMA_NODE: u32 = 1023;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SimProcess {
    pid: u32,
    used_memory: ByteSize,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SimMig {
    uuid: Spanned<String>,
    name: Option<String>,
    memory_total: Option<ByteSize>,
    /// Memory in use on the slice (default 0: nothing runs there).
    memory_used: Option<Spanned<ByteSize>>,
    gpu_instance_id: Option<u32>,
    compute_instance_id: Option<u32>,
    /// The minor of `/dev/nvidia-caps/nvidia-cap<N>` of the GPU instance's `access` capability.
    gpu_instance_cap_minor: Option<Spanned<u32>>,
    /// The same for the compute instance.
    compute_instance_cap_minor: Option<Spanned<u32>>,
}

/// The highest minor number of an `nvidia-caps` node (the driver's `NV_CAP_DRV_MINOR_COUNT` is
/// 2^20; real listings stay in the hundreds).
const MAX_CAP_MINOR: u32 = (1 << 20) - 1;
/// The most compute slices a GPU in MIG mode has (7 on A100, H100, H200).
const MAX_MIG_SLOTS: u32 = 8;

/// Reads and validates a sim file.
pub fn read(path: &Path) -> Result<Vec<Device>, DeviceError> {
    let text = std::fs::read_to_string(path).map_err(|source| DeviceError::SimRead {
        path: path.to_path_buf(),
        source,
    })?;
    parse(path, &text)
}

/// Parses a sim file's text; `path` is used in error locations only.
pub fn parse(path: &Path, text: &str) -> Result<Vec<Device>, DeviceError> {
    let file: SimFile = toml::from_str(text).map_err(|e| InputError::from_toml(path, text, &e))?;
    if file.gpu.is_empty() {
        return Err(InputError::at(path, text, 0, "the file describes no GPU")
            .with_hint("add at least one [[gpu]] table with name and memory_total")
            .into());
    }
    let topology = read_topology(path, text, &file.gpu)?;
    let mut devices: Vec<Device> = Vec::with_capacity(file.gpu.len());
    let minor_spans: Vec<Option<usize>> = file
        .gpu
        .iter()
        .map(|g| g.minor_number.as_ref().map(|m| m.span().start))
        .collect();
    let bus_spans: Vec<Option<usize>> = file
        .gpu
        .iter()
        .map(|g| g.pci_bus_id.as_ref().map(|m| m.span().start))
        .collect();
    for (position, gpu) in file.gpu.into_iter().enumerate() {
        let mut device = to_device(path, text, position, gpu)?;
        device.links = topology.links[position].clone();
        devices.push(device);
    }
    check_unique_uuids(path, text, &devices)?;
    check_unique_cap_minors(path, text, &devices)?;
    check_unique_bus_ids(path, text, &bus_spans, &devices)?;
    check_unique_minors(path, text, &minor_spans, &devices)?;
    Ok(devices)
}

fn to_device(path: &Path, text: &str, position: usize, gpu: SimGpu) -> Result<Device, InputError> {
    let at = |span: std::ops::Range<usize>, message: String| {
        InputError::at(path, text, span.start, message)
    };
    let (mig_mode, mig_slots) = read_mig_mode(path, text, &gpu)?;
    if let Some(slots) = mig_slots {
        check_slices_fit(path, text, &gpu, slots)?;
    }
    let total = gpu.memory_total.get_ref().bytes();
    // Saturating: sizes near 2^64 must be refused as too large, not overflow.
    let process_sum = gpu
        .process
        .iter()
        .fold(0u64, |sum, p| sum.saturating_add(p.used_memory.bytes()));
    let used = match &gpu.memory_used {
        Some(used) if used.get_ref().bytes() > total => {
            return Err(at(
                used.span(),
                format!(
                    "memory_used ({}) exceeds memory_total ({})",
                    used.get_ref(),
                    ByteSize(total)
                ),
            ));
        }
        Some(used) => used.get_ref().bytes(),
        None if process_sum > total => {
            return Err(at(
                gpu.memory_total.span(),
                format!(
                    "the processes use {} but memory_total is {}",
                    ByteSize(process_sum),
                    ByteSize(total)
                ),
            ));
        }
        None => process_sum,
    };
    for percent in gpu
        .utilization
        .iter()
        .chain(gpu.memory_utilization.as_ref())
    {
        if *percent.get_ref() > 100 {
            return Err(at(
                percent.span(),
                format!(
                    "a utilization is a percent from 0 to 100, found {}",
                    percent.get_ref()
                ),
            ));
        }
    }
    let uuid = match gpu.uuid {
        Some(uuid) if !uuid.get_ref().starts_with("GPU-") || uuid.get_ref().len() < 12 => {
            return Err(at(
                uuid.span(),
                format!(
                    "a GPU uuid starts with \"GPU-\" and has at least 8 hex digits, found \"{}\"",
                    uuid.get_ref()
                ),
            ));
        }
        Some(uuid) => uuid.into_inner(),
        None => derived_uuid(position),
    };
    if let Some(cc) = &gpu.compute_capability {
        let valid = cc.get_ref().split_once('.').is_some_and(|(a, b)| {
            !a.is_empty() && !b.is_empty() && a.bytes().chain(b.bytes()).all(|c| c.is_ascii_digit())
        });
        if !valid {
            return Err(at(
                cc.span(),
                format!(
                    "compute_capability is \"MAJOR.MINOR\" such as \"9.0\", found \"{}\"",
                    cc.get_ref()
                ),
            ));
        }
    }
    if let Some(minor) = &gpu.minor_number
        && *minor.get_ref() > crate::MAX_GPU_MINOR
    {
        return Err(at(
            minor.span(),
            format!(
                "a GPU's minor_number is 0 to {} (the N of /dev/nvidiaN; 254 and 255 are the control nodes), found {}",
                crate::MAX_GPU_MINOR,
                minor.get_ref()
            ),
        ));
    }
    if let Some(node) = &gpu.numa_node
        && *node.get_ref() > MAX_NUMA_NODE
    {
        return Err(at(
            node.span(),
            format!(
                "numa_node is a NUMA node number from 0 to {MAX_NUMA_NODE}, found {}",
                node.get_ref()
            ),
        ));
    }
    let cpus = match &gpu.cpus {
        Some(list) => match list.get_ref().parse::<orch_core::CpuList>() {
            Ok(cpus) if cpus.is_empty() => {
                return Err(at(
                    list.span(),
                    "cpus names no CPU; leave it out when the GPU has no CPUs of its own".into(),
                ));
            }
            Ok(cpus) => Some(cpus),
            Err(e) => return Err(at(list.span(), e.to_string())),
        },
        None => None,
    };
    let pci_bus_id = match &gpu.pci_bus_id {
        Some(id) => match normalize_pci_bus_id(id.get_ref()) {
            Some(normalized) if is_reserved_pci_bus_id(&normalized) => {
                return Err(at(
                    id.span(),
                    format!(
                        "pci_bus_id \"{}\" is in domain 5130xxxx or 5131xxxx, which orch keeps for the ids it derives (GPUs without one, simulated NVSwitches); give another domain",
                        id.get_ref()
                    ),
                ));
            }
            Some(normalized) => normalized,
            None => {
                return Err(at(
                    id.span(),
                    format!(
                        "pci_bus_id is DOMAIN:BUS:DEVICE.FUNCTION in hex such as \"00000000:18:00.0\", found \"{}\"",
                        id.get_ref()
                    ),
                ));
            }
        },
        None => derived_pci_bus_id(position),
    };
    let mut mig_devices = Vec::with_capacity(gpu.mig.len());
    for mig in gpu.mig {
        for minor in mig
            .gpu_instance_cap_minor
            .iter()
            .chain(&mig.compute_instance_cap_minor)
        {
            if *minor.get_ref() > MAX_CAP_MINOR {
                return Err(at(
                    minor.span(),
                    format!(
                        "a capability minor is the N of /dev/nvidia-caps/nvidia-capN, 0 to {MAX_CAP_MINOR}, found {}",
                        minor.get_ref()
                    ),
                ));
            }
        }
        if !mig.uuid.get_ref().starts_with("MIG-") {
            return Err(at(
                mig.uuid.span(),
                format!(
                    "a MIG uuid starts with \"MIG-\", found \"{}\"",
                    mig.uuid.get_ref()
                ),
            ));
        }
        let memory_total = mig.memory_total.map(ByteSize::bytes);
        let memory_used = match (&mig.memory_used, memory_total) {
            (Some(used), Some(total)) if used.get_ref().bytes() > total => {
                return Err(at(
                    used.span(),
                    format!(
                        "memory_used ({}) exceeds the slice's memory_total ({})",
                        used.get_ref(),
                        ByteSize(total)
                    ),
                ));
            }
            (Some(used), _) => Some(used.get_ref().bytes()),
            (None, Some(_)) => Some(0),
            (None, None) => None,
        };
        mig_devices.push(MigDevice {
            uuid: mig.uuid.into_inner(),
            name: mig.name,
            memory_total_bytes: memory_total,
            memory_used_bytes: memory_used,
            gpu_instance_id: mig.gpu_instance_id,
            compute_instance_id: mig.compute_instance_id,
            gpu_instance_cap_minor: mig.gpu_instance_cap_minor.map(Spanned::into_inner),
            compute_instance_cap_minor: mig.compute_instance_cap_minor.map(Spanned::into_inner),
        });
    }
    Ok(Device {
        index: position as u32,
        uuid,
        name: gpu.name,
        backend: Backend::Sim,
        memory_total_bytes: Some(total),
        memory_used_bytes: Some(used),
        memory_free_bytes: Some(total - used),
        utilization_gpu_percent: Some(gpu.utilization.map_or(0, Spanned::into_inner)),
        // NVML reports both utilizations or neither: the default is 0, as for `utilization`.
        utilization_memory_percent: Some(gpu.memory_utilization.map_or(0, Spanned::into_inner)),
        temperature_c: gpu.temperature,
        power_draw_w: gpu.power_draw_w,
        compute_capability: gpu.compute_capability.map(Spanned::into_inner),
        pci_bus_id: Some(pci_bus_id),
        processes: Some(
            gpu.process
                .into_iter()
                .map(|p| GpuProcess {
                    pid: p.pid,
                    used_memory_bytes: Some(p.used_memory.bytes()),
                })
                .collect(),
        ),
        mig_devices,
        minor_number: gpu.minor_number.map(Spanned::into_inner),
        numa_node: gpu.numa_node.map(Spanned::into_inner),
        cpus,
        links: Vec::new(),
        health: sim_health(
            gpu.xid_errors,
            gpu.ecc_uncorrected,
            gpu.row_remap_pending,
            gpu.row_remap_failure,
            gpu.retired_pages_pending,
            gpu.lost,
        ),
        mig_mode,
        mig_slots,
    })
}

/// The health a GPU's keys describe, judged as a reading from NVML is.
fn sim_health(
    xid_errors: Vec<u32>,
    ecc_uncorrected: Option<u64>,
    pending: Option<bool>,
    failure: Option<bool>,
    retired_pages_pending: Option<bool>,
    lost: bool,
) -> crate::Health {
    let row_remap = (pending.is_some() || failure.is_some()).then(|| crate::health::RowRemap {
        pending: pending.unwrap_or(false),
        failure: failure.unwrap_or(false),
    });
    let mut health = crate::Health {
        xid_errors,
        ecc_uncorrected,
        row_remap,
        retired_pages_pending,
        lost,
        ..crate::Health::default()
    };
    health.assess(orch_core::time::now_ms());
    health
}

/// A GPU's MIG mode and compute slices. `[[gpu.mig]]` tables imply `mig_mode = true`;
/// `mig_mode = false` beside them is refused (the slices would be lost), and so is `mig_slots`
/// on a GPU not in MIG mode.
fn read_mig_mode(path: &Path, text: &str, gpu: &SimGpu) -> Result<(bool, Option<u32>), InputError> {
    let mode = match &gpu.mig_mode {
        Some(mode) if !*mode.get_ref() && !gpu.mig.is_empty() => {
            return Err(InputError::at(
                path,
                text,
                mode.span().start,
                format!(
                    "mig_mode = false, but the GPU lists {} MIG slice(s) in [[gpu.mig]]",
                    gpu.mig.len()
                ),
            )
            .with_hint("set mig_mode = true, or remove the [[gpu.mig]] tables"));
        }
        Some(mode) => *mode.get_ref(),
        None => !gpu.mig.is_empty(),
    };
    let slots = match &gpu.mig_slots {
        Some(slots) if !mode => {
            return Err(InputError::at(
                path,
                text,
                slots.span().start,
                "mig_slots is for a GPU in MIG mode",
            )
            .with_hint("add mig_mode = true (and its [[gpu.mig]] slices), or remove mig_slots"));
        }
        Some(slots) if !(1..=MAX_MIG_SLOTS).contains(slots.get_ref()) => {
            return Err(InputError::at(
                path,
                text,
                slots.span().start,
                format!(
                    "mig_slots is the GPU's compute slices in MIG mode, 1 to {MAX_MIG_SLOTS}, found {}",
                    slots.get_ref()
                ),
            ));
        }
        Some(slots) => Some(*slots.get_ref()),
        None => mode.then_some(crate::mig::DEFAULT_SLOTS),
    };
    Ok((mode, slots))
}

/// The links between every pair of the file's GPUs, by position.
struct Topology {
    links: Vec<Vec<crate::PeerLink>>,
}

/// NVLinks from the `[[gpu.nvlink]]` tables (either side may name the pair; both sides must then
/// agree), the PCIe level from `pcie_switch` and `numa_node`: under one switch `PIX`, on one NUMA
/// node `NODE`, across nodes `SYS`; unknown otherwise.
fn read_topology(path: &Path, text: &str, gpus: &[SimGpu]) -> Result<Topology, InputError> {
    let n = gpus.len();
    let described = gpus
        .iter()
        .any(|g| g.numa_node.is_some() || g.pcie_switch.is_some() || !g.nvlink.is_empty());
    if !described {
        return Ok(Topology {
            links: vec![Vec::new(); n],
        });
    }
    if n > MAX_TOPOLOGY_GPUS {
        return Err(InputError::at(
            path,
            text,
            0,
            format!(
                "the file describes {n} GPUs with links between them; topology keys (numa_node, pcie_switch, nvlink) are read for at most {MAX_TOPOLOGY_GPUS} GPUs, one machine's"
            ),
        )
        .with_hint("describe one machine per file, or leave the topology keys out"));
    }
    let mut nvlinks: Vec<Vec<Option<u32>>> = vec![vec![None; n]; n];
    let mut given = std::collections::HashSet::new();
    for (a, gpu) in gpus.iter().enumerate() {
        for link in &gpu.nvlink {
            let b = *link.peer.get_ref() as usize;
            let count = *link.links.get_ref();
            let at = |span: std::ops::Range<usize>, message: String| {
                InputError::at(path, text, span.start, message)
            };
            if b >= n {
                return Err(at(
                    link.peer.span(),
                    format!(
                        "peer is a GPU's position in this file, 0 to {}, found {b}",
                        n - 1
                    ),
                ));
            }
            if b == a {
                return Err(at(
                    link.peer.span(),
                    format!("GPU {a} names itself as its NVLink peer"),
                ));
            }
            if count == 0 || count > MAX_NVLINKS {
                return Err(at(
                    link.links.span(),
                    format!("links is the number of NVLinks, 1 to {MAX_NVLINKS}, found {count}"),
                ));
            }
            if !given.insert((a, b)) {
                return Err(at(
                    link.peer.span(),
                    format!("GPU {a} lists its NVLinks to GPU {b} twice"),
                ));
            }
            if let Some(other) = nvlinks[b][a]
                && other != count
            {
                return Err(at(
                    link.links.span(),
                    format!(
                        "GPU {a} has {count} NVLinks to GPU {b}, but GPU {b} says {other}; give the pair once, or the same count on both sides"
                    ),
                ));
            }
            nvlinks[a][b] = Some(count);
            nvlinks[b][a] = Some(count);
        }
    }
    let numa = |g: &SimGpu| g.numa_node.as_ref().map(|n| *n.get_ref());
    let links = (0..n)
        .map(|a| {
            (0..n)
                .filter(|&b| b != a)
                .filter_map(|b| {
                    let pcie = match (gpus[a].pcie_switch, gpus[b].pcie_switch) {
                        (Some(x), Some(y)) if x == y => Some(crate::PcieLevel::Pix),
                        _ => match (numa(&gpus[a]), numa(&gpus[b])) {
                            (Some(x), Some(y)) if x == y => Some(crate::PcieLevel::Node),
                            (Some(_), Some(_)) => Some(crate::PcieLevel::Sys),
                            _ => None,
                        },
                    };
                    let count = nvlinks[a][b].unwrap_or(0);
                    (count > 0 || pcie.is_some()).then_some(crate::PeerLink {
                        peer: b as u32,
                        nvlinks: count,
                        pcie,
                    })
                })
                .collect()
        })
        .collect();
    Ok(Topology { links })
}

/// A stable uuid from the GPU's position in the file, in NVML's format.
fn derived_uuid(position: usize) -> String {
    format!("GPU-5130{position:04x}-0000-4000-8000-{position:012x}")
}

/// A stable PCI bus id from the GPU's position in the file, in NVML's format (domain `5130`,
/// which a file may not give, so it cannot clash with an id the file gives).
fn derived_pci_bus_id(position: usize) -> String {
    format!(
        "5130{:04X}:{:02X}:00.0",
        (position >> 8) & 0xffff,
        position & 0xff
    )
}

/// Whether a PCI bus id (NVML's spelling, 8-digit domain) is in a domain kept for derived ids:
/// `5130xxxx` for the GPUs a file gives no id, `5131xxxx` for the simulated NVML library's
/// NVSwitches. A file may not give one, so a derived id never clashes with a given one.
fn is_reserved_pci_bus_id(normalized: &str) -> bool {
    normalized.starts_with("5130") || normalized.starts_with("5131")
}

/// A PCI bus id (`DOMAIN:BUS:DEVICE.FUNCTION`, hex, the domain up to 8 digits, NVML's form or
/// lspci's) in one spelling, NVML's: `00000000:18:00.0`. `None` when it is not one.
pub fn normalize_pci_bus_id(id: &str) -> Option<String> {
    let (domain, rest) = id.trim().split_once(':')?;
    let (bus, rest) = rest.split_once(':')?;
    let (device, function) = rest.split_once('.')?;
    let hex = |s: &str, max: usize| {
        (!s.is_empty() && s.len() <= max && s.bytes().all(|c| c.is_ascii_hexdigit()))
            .then(|| u32::from_str_radix(s, 16).ok())
            .flatten()
    };
    let (domain, bus, device, function) = (
        hex(domain, 8)?,
        hex(bus, 2)?,
        hex(device, 2)?,
        hex(function, 1)?,
    );
    (device < 32 && function < 8)
        .then(|| format!("{domain:08X}:{bus:02X}:{device:02X}.{function:X}"))
}

/// Two GPUs cannot share a device node. `spans` holds each GPU's `minor_number` offset, if any.
fn check_unique_minors(
    path: &Path,
    text: &str,
    spans: &[Option<usize>],
    devices: &[Device],
) -> Result<(), InputError> {
    let mut seen = std::collections::HashSet::new();
    for (device, span) in devices.iter().zip(spans) {
        if let (Some(minor), Some(offset)) = (device.minor_number, span)
            && !seen.insert(minor)
        {
            return Err(InputError::at(
                path,
                text,
                *offset,
                format!("minor_number {minor} appears twice"),
            )
            .with_hint(
                "every GPU has a device node of its own: /dev/nvidiaN, N its minor number",
            ));
        }
    }
    Ok(())
}

/// Two GPUs cannot sit in one PCI slot (NVML finds NVLink peers by their bus id). `spans` holds
/// each GPU's `pci_bus_id` offset, if given (derived ids cannot clash).
fn check_unique_bus_ids(
    path: &Path,
    text: &str,
    spans: &[Option<usize>],
    devices: &[Device],
) -> Result<(), InputError> {
    let mut seen = std::collections::HashSet::new();
    for (device, span) in devices.iter().zip(spans) {
        let (Some(id), Some(offset)) = (device.pci_bus_id.as_deref(), span) else {
            continue;
        };
        if !seen.insert(id) {
            return Err(InputError::at(
                path,
                text,
                *offset,
                format!("pci_bus_id {id} appears twice"),
            )
            .with_hint("every GPU sits in a PCI slot of its own"));
        }
    }
    Ok(())
}

/// A GPU's slices fit its compute slots: each GPU instance counted once (the compute instances
/// of one GPU instance share it), by its profile's `Ng`.
fn check_slices_fit(path: &Path, text: &str, gpu: &SimGpu, slots: u32) -> Result<(), InputError> {
    let mut instances: Vec<Option<u32>> = Vec::new();
    let mut used = 0u32;
    for slice in &gpu.mig {
        let instance = slice.gpu_instance_id;
        if instance.is_some() && instances.contains(&instance) {
            continue;
        }
        instances.push(instance);
        let name = slice.name.as_deref().unwrap_or("");
        // A compute instance (`1c.3g.40gb`) takes its GPU instance's slices (`3g`).
        let gi_slices = name
            .rsplit(' ')
            .next()
            .and_then(|word| word.split('.').find(|part| part.ends_with('g')))
            .and_then(|part| part.trim_end_matches('g').parse::<u32>().ok());
        used = used.saturating_add(gi_slices.unwrap_or(1));
        if used > slots {
            return Err(InputError::at(
                path,
                text,
                slice.uuid.span().start,
                format!(
                    "the GPU's slices take at least {used} compute slices, more than its {slots} (mig_slots)"
                ),
            )
            .with_hint("remove slices, or give the GPU more mig_slots (7 on A100, H100, H200; 4 on A30)"));
        }
    }
    Ok(())
}

/// No two slices share a compute instance's capability node, and no GPU instance's node is
/// another's or a compute instance's: a slice granted one would open the other.
fn check_unique_cap_minors(path: &Path, text: &str, devices: &[Device]) -> Result<(), InputError> {
    let mut seen: std::collections::HashMap<u32, (u32, Option<u32>, bool)> =
        std::collections::HashMap::new();
    for d in devices {
        for m in &d.mig_devices {
            let caps = [
                (m.gpu_instance_cap_minor, true),
                (m.compute_instance_cap_minor, false),
            ];
            for (minor, gi) in caps {
                let Some(minor) = minor else { continue };
                let this = (d.index, m.gpu_instance_id, gi);
                match seen.get(&minor) {
                    None => {
                        seen.insert(minor, this);
                    }
                    // The compute instances of one GPU instance share its node.
                    Some(other) if gi && *other == this && m.gpu_instance_id.is_some() => {}
                    Some(_) => {
                        let offset = text.rfind(m.uuid.as_str()).unwrap_or(0);
                        return Err(InputError::at(
                            path,
                            text,
                            offset,
                            format!("capability minor {minor} is named by two instances"),
                        )
                        .with_hint("each GPU and compute instance has its own nvidia-cap node; only the compute instances of one GPU instance share its node"));
                    }
                }
            }
        }
    }
    Ok(())
}

fn check_unique_uuids(path: &Path, text: &str, devices: &[Device]) -> Result<(), InputError> {
    let all = devices.iter().map(|d| d.uuid.as_str()).chain(
        devices
            .iter()
            .flat_map(|d| d.mig_devices.iter().map(|m| m.uuid.as_str())),
    );
    let mut seen = std::collections::HashSet::new();
    for uuid in all {
        if !seen.insert(uuid) {
            let offset = text.rfind(uuid).unwrap_or(0);
            return Err(InputError::at(
                path,
                text,
                offset,
                format!("uuid \"{uuid}\" appears twice"),
            )
            .with_hint("every GPU and MIG instance needs its own uuid"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_str(text: &str) -> Result<Vec<Device>, String> {
        parse(Path::new("lab.toml"), text).map_err(|e| e.to_string())
    }

    #[test]
    fn reads_every_field() {
        let devices = parse_str(
            r#"
[[gpu]]
name = "NVIDIA H100 80GB HBM3"
memory_total = "80GiB"
memory_used = "3GiB"
utilization = 35
uuid = "GPU-8a1b0000-1111-2222-3333-444455556666"
pci_bus_id = "00000000:18:00.0"
compute_capability = "9.0"
temperature = 41
power_draw_w = 210.5
minor_number = 7
[[gpu.process]]
pid = 4242
used_memory = "2GiB"

[[gpu]]
name = "small"
memory_total = 1024
"#,
        )
        .unwrap();
        assert_eq!(devices.len(), 2);
        let d = &devices[0];
        assert_eq!(d.memory_total_bytes, Some(80 << 30));
        assert_eq!(d.memory_free_bytes, Some(77 << 30));
        assert_eq!(d.utilization_gpu_percent, Some(35));
        assert_eq!(
            d.utilization_memory_percent,
            Some(0),
            "NVML reports both or neither"
        );
        assert_eq!(d.pci_bus_id.as_deref(), Some("00000000:18:00.0"));
        assert_eq!(
            devices[1].pci_bus_id.as_deref(),
            Some("51300000:01:00.0"),
            "derived from the position"
        );
        assert_eq!(d.compute_capability.as_deref(), Some("9.0"));
        assert_eq!(
            d.processes.as_ref().unwrap()[0].used_memory_bytes,
            Some(2 << 30)
        );
        assert_eq!(devices[1].index, 1);
        assert!(devices[1].uuid.starts_with("GPU-"));
        assert_eq!(devices[1].temperature_c, None, "absent, not invented");
        assert_eq!(devices[0].minor_number, Some(7));
        assert_eq!(devices[1].minor_number, None, "no node is assumed");
    }

    #[test]
    fn pci_bus_ids_read_in_nvmls_spelling() {
        for (given, nvml) in [
            ("00000000:18:00.0", "00000000:18:00.0"),
            ("0000:3b:00.1", "00000000:3B:00.1"),
            ("1:5:1f.7", "00000001:05:1F.7"),
        ] {
            assert_eq!(
                normalize_pci_bus_id(given).as_deref(),
                Some(nvml),
                "{given}"
            );
        }
        for bad in [
            "18:00.0",
            "0000:18:00",
            "0000:118:00.0",
            "0000:18:20.0",
            "0000:18:00.8",
            "x:18:00.0",
            "",
        ] {
            assert_eq!(normalize_pci_bus_id(bad), None, "{bad}");
        }
    }

    #[test]
    fn pci_bus_ids_in_the_derived_domains_are_refused() {
        for given in ["51300000:01:00.0", "51310000:00:00.0", "5131ABCD:00:00.0"] {
            let text =
                format!("[[gpu]]\nname = \"a\"\nmemory_total = 1\npci_bus_id = \"{given}\"\n");
            let err = parse_str(&text).unwrap_err();
            assert!(err.contains("lab.toml:4:14"), "{err}");
            assert!(err.contains("5130xxxx or 5131xxxx"), "{err}");
        }
        // Domains that only share a prefix with the reserved ones are not refused.
        for given in ["00005130:01:00.0", "5131:01:00.0", "51320000:01:00.0"] {
            let text =
                format!("[[gpu]]\nname = \"a\"\nmemory_total = 1\npci_bus_id = \"{given}\"\n");
            assert!(parse_str(&text).is_ok(), "{given}");
        }
    }

    #[test]
    fn errors_point_at_the_value() {
        let cases = [
            (
                "[[gpu]]\nname = \"a\"\nmemory_total = \"80 gigs\"\n",
                "lab.toml:3:16",
                "expected a size",
            ),
            (
                "[[gpu]]\nname = \"a\"\nmemory_total = \"8GiB\"\nmemory_used = \"9GiB\"\n",
                "lab.toml:4:15",
                "exceeds memory_total",
            ),
            (
                "[[gpu]]\nname = \"a\"\nmemory_total = 1\nutilization = 120\n",
                "lab.toml:4:15",
                "0 to 100",
            ),
            (
                "[[gpu]]\nname = \"a\"\nmemory_total = 1\ncolour = 3\n",
                "lab.toml:4:1",
                "unknown field",
            ),
            ("[[gpu]]\nname = \"a\"\n", "lab.toml:1:1", "memory_total"),
            (
                "[[gpu]]\nname = \"a\"\nmemory_total = 1\nuuid = \"8a1b\"\n",
                "lab.toml:4:8",
                "GPU-",
            ),
            (
                "[[gpu]]\nname = \"a\"\nmemory_total = 1\ncompute_capability = \"nine\"\n",
                "lab.toml:4:22",
                "MAJOR.MINOR",
            ),
            (
                "[[gpu]]\nname = \"a\"\nmemory_total = 1\npci_bus_id = \"18:00.0\"\n",
                "lab.toml:4:14",
                "DOMAIN:BUS:DEVICE.FUNCTION",
            ),
            (
                "[[gpu]]\nname = \"a\"\nmemory_total = 1\npci_bus_id = \"0000:18:00.0\"\n[[gpu]]\nname = \"b\"\nmemory_total = 1\npci_bus_id = \"00000000:18:00.0\"\n",
                "lab.toml:8:14",
                "appears twice",
            ),
            (
                "[[gpu]]\nname = \"a\"\nmemory_total = 1\nminor_number = 254\n",
                "lab.toml:4:16",
                "0 to 253",
            ),
            (
                "[[gpu]]\nname = \"a\"\nmemory_total = 1\nminor_number = 1\n[[gpu]]\nname = \"b\"\nmemory_total = 1\nminor_number = 1\n",
                "lab.toml:8:16",
                "minor_number 1 appears twice",
            ),
            ("[[gpu]\n", "lab.toml:1:", "invalid"),
            ("", "lab.toml:1:1", "no GPU"),
        ];
        for (text, location, words) in cases {
            let err = parse_str(text).unwrap_err();
            assert!(err.contains(location), "{err:?} should point at {location}");
            assert!(
                err.to_lowercase().contains(&words.to_lowercase()),
                "{err:?} should say {words}"
            );
        }
    }

    #[test]
    fn duplicate_uuids_are_rejected() {
        let text = "[[gpu]]\nname = \"a\"\nmemory_total = 1\nuuid = \"GPU-aaaaaaaa\"\n[[gpu]]\nname = \"b\"\nmemory_total = 1\nuuid = \"GPU-aaaaaaaa\"\n";
        let err = parse_str(text).unwrap_err();
        assert!(
            err.contains("lab.toml:8:") && err.contains("twice"),
            "{err}"
        );
    }

    /// Found by the sim fuzz target (crates/orch-fuzz): the processes' sizes were summed
    /// unchecked, and two near 2^64 overflowed (a panic in debug builds, a wrong sum in release).
    #[test]
    fn process_sizes_near_two_to_the_64_do_not_overflow() {
        let processes = "[[gpu.process]]\npid = 1\nused_memory = \"18446744073709551615\"\n[[gpu.process]]\npid = 2\nused_memory = \"1GiB\"\n";
        let err = parse_str(&format!(
            "[[gpu]]\nname = \"a\"\nmemory_total = \"80GiB\"\n{processes}"
        ))
        .unwrap_err();
        assert!(err.contains("lab.toml:3:16: the processes use"), "{err}");
        let devices = parse_str(&format!(
            "[[gpu]]\nname = \"a\"\nmemory_total = \"80GiB\"\nmemory_used = \"1GiB\"\n{processes}"
        ))
        .unwrap();
        assert_eq!(devices[0].memory_used_bytes, Some(1 << 30));
    }

    /// Two NUMA nodes of two GPUs each: 0-1 under one switch and NVLinked, 2-3 NVLinked, and
    /// one NVLink across the sockets between 1 and 2.
    const TOPOLOGY: &str = r#"
[[gpu]]
name = "a"
memory_total = "80GiB"
numa_node = 0
cpus = "0-15,64-79"
pcie_switch = 1
[[gpu.nvlink]]
peer = 1
links = 18
[[gpu]]
name = "b"
memory_total = "80GiB"
numa_node = 0
cpus = "0-15,64-79"
pcie_switch = 1
[[gpu.nvlink]]
peer = 2
links = 1
[[gpu]]
name = "c"
memory_total = "80GiB"
numa_node = 1
cpus = "16-31"
[[gpu.nvlink]]
peer = 3
links = 12
[[gpu]]
name = "d"
memory_total = "80GiB"
numa_node = 1
cpus = "16-31"
[[gpu.nvlink]]
peer = 2
links = 12
"#;

    #[test]
    fn reads_numa_nodes_cpus_and_links() {
        let devices = parse_str(TOPOLOGY).unwrap();
        let label = |a: usize, b: u32| devices[a].link_to(b).map(|l| l.label());
        assert_eq!(devices[0].numa_node, Some(0));
        assert_eq!(
            devices[0].cpus.as_ref().map(ToString::to_string).as_deref(),
            Some("0-15,64-79")
        );
        assert_eq!(label(0, 1).as_deref(), Some("NV18"));
        assert_eq!(label(1, 0).as_deref(), Some("NV18"), "links go both ways");
        assert_eq!(label(1, 2).as_deref(), Some("NV1"));
        assert_eq!(
            label(2, 3).as_deref(),
            Some("NV12"),
            "both sides may name a pair"
        );
        assert_eq!(label(0, 2).as_deref(), Some("SYS"));
        assert_eq!(label(0, 0), None, "no link to itself");
        let plain = parse_str(
            "[[gpu]]\nname = \"a\"\nmemory_total = 1\n[[gpu]]\nname = \"b\"\nmemory_total = 1\n",
        )
        .unwrap();
        assert!(
            plain
                .iter()
                .all(|d| d.links.is_empty() && d.numa_node.is_none())
        );
        let same_node = parse_str("[[gpu]]\nname = \"a\"\nmemory_total = 1\nnuma_node = 3\n[[gpu]]\nname = \"b\"\nmemory_total = 1\nnuma_node = 3\n").unwrap();
        assert_eq!(
            same_node[0].link_to(1).map(|l| l.label()).as_deref(),
            Some("NODE")
        );
    }

    #[test]
    fn topology_errors_point_at_the_value() {
        let gpu = "[[gpu]]\nname = \"a\"\nmemory_total = 1\n";
        let cases = [
            (format!("{gpu}cpus = \"0-x\"\n"), "lab.toml:4:8", "CPU list"),
            (
                format!("{gpu}cpus = \"\"\n"),
                "lab.toml:4:8",
                "names no CPU",
            ),
            (
                format!("{gpu}numa_node = 5000\n"),
                "lab.toml:4:13",
                "0 to 1023",
            ),
            (
                format!("{gpu}[[gpu.nvlink]]\npeer = 1\nlinks = 2\n"),
                "lab.toml:5:8",
                "0 to 0",
            ),
            (
                format!("{gpu}[[gpu.nvlink]]\npeer = 0\nlinks = 2\n"),
                "lab.toml:5:8",
                "itself",
            ),
            (
                format!("{gpu}[[gpu.nvlink]]\npeer = 1\nlinks = 0\n{gpu}"),
                "lab.toml:6:9",
                "1 to 64",
            ),
            (
                format!(
                    "{gpu}[[gpu.nvlink]]\npeer = 1\nlinks = 4\n{gpu}[[gpu.nvlink]]\npeer = 0\nlinks = 2\n"
                ),
                "lab.toml:12:9",
                "says 4",
            ),
            (
                format!(
                    "{gpu}[[gpu.nvlink]]\npeer = 1\nlinks = 4\n[[gpu.nvlink]]\npeer = 1\nlinks = 4\n{gpu}"
                ),
                "lab.toml:8:8",
                "twice",
            ),
        ];
        for (text, location, words) in cases {
            let err = parse_str(&text).unwrap_err();
            assert!(err.contains(location), "{err:?} should point at {location}");
            assert!(err.contains(words), "{err:?} should say {words}");
        }
    }

    #[test]
    fn slices_past_their_gpus_slots_or_sharing_a_node_are_refused_at_their_line() {
        let slice = |n: u32, name: &str, gi: u32, gi_minor: u32, ci_minor: u32| {
            format!(
                "[[gpu.mig]]\nuuid = \"MIG-aaaaaaaa-0000-4000-8000-00000000000{n}\"\nname = \"{name}\"\ngpu_instance_id = {gi}\ncompute_instance_id = 0\ngpu_instance_cap_minor = {gi_minor}\ncompute_instance_cap_minor = {ci_minor}\n"
            )
        };
        let gpu = "[[gpu]]\nname = \"H100\"\nmemory_total = \"80GiB\"\nmig_slots = 2\n";
        let over = format!(
            "{gpu}{}{}{}",
            slice(1, "1g.10gb", 1, 10, 11),
            slice(2, "1g.10gb", 2, 12, 13),
            slice(3, "1g.10gb", 3, 14, 15)
        );
        let err = parse_str(&over).unwrap_err().to_string();
        assert!(err.contains("more than its 2 (mig_slots)"), "{err}");
        assert!(err.contains(":20:"), "points at the third slice: {err}");
        // Two compute instances of one GPU instance share its node and its slices.
        let shared = format!(
            "{gpu}{}{}",
            slice(1, "1c.2g.20gb", 1, 10, 11),
            slice(2, "1c.2g.20gb", 1, 10, 12)
        );
        assert_eq!(parse_str(&shared).unwrap()[0].mig_devices.len(), 2);
        let clash = format!(
            "{gpu}{}{}",
            slice(1, "1g.10gb", 1, 10, 11),
            slice(2, "1g.10gb", 2, 12, 11)
        );
        let err = parse_str(&clash).unwrap_err().to_string();
        assert!(
            err.contains("capability minor 11 is named by two instances"),
            "{err}"
        );
    }

    #[test]
    fn mig_slices_and_their_mode() {
        let devices = parse_str(
            r#"
[[gpu]]
name = "H100"
memory_total = "80GiB"
minor_number = 0
mig_mode = true
[[gpu.mig]]
uuid = "MIG-aaaaaaaa-0000-4000-8000-000000000001"
name = "3g.40gb"
memory_total = "40GiB"
gpu_instance_id = 1
compute_instance_id = 0
gpu_instance_cap_minor = 12
compute_instance_cap_minor = 13
[[gpu]]
name = "implied"
memory_total = "80GiB"
mig_slots = 4
[[gpu.mig]]
uuid = "MIG-aaaaaaaa-0000-4000-8000-000000000002"
name = "2g.12gb"
[[gpu]]
name = "whole"
memory_total = "80GiB"
"#,
        )
        .unwrap();
        assert!(devices[0].mig_mode && devices[1].mig_mode && !devices[2].mig_mode);
        assert_eq!(devices[0].mig_slots, Some(7), "the default");
        assert_eq!(devices[1].mig_slots, Some(4));
        assert_eq!(devices[2].mig_slots, None);
        let slice = &devices[0].mig_devices[0];
        assert_eq!(
            (slice.gpu_instance_id, slice.compute_instance_id),
            (Some(1), Some(0))
        );
        assert_eq!(
            (
                slice.gpu_instance_cap_minor,
                slice.compute_instance_cap_minor
            ),
            (Some(12), Some(13))
        );
        let gpu = "[[gpu]]\nname = \"a\"\nmemory_total = 1\n";
        let mig = "[[gpu.mig]]\nuuid = \"MIG-aaaaaaaa\"\n";
        let cases = [
            (
                format!("{gpu}mig_mode = false\n{mig}"),
                "lab.toml:4:12",
                "mig_mode = false, but the GPU lists 1 MIG slice(s)",
            ),
            (
                format!("{gpu}mig_slots = 7\n"),
                "lab.toml:4:13",
                "mig_slots is for a GPU in MIG mode",
            ),
            (
                format!("{gpu}mig_mode = true\nmig_slots = 9\n"),
                "lab.toml:5:13",
                "1 to 8",
            ),
            (
                format!("{gpu}{mig}compute_instance_cap_minor = 2000000\n"),
                "lab.toml:6:30",
                "nvidia-capN",
            ),
        ];
        for (text, location, words) in cases {
            let err = parse_str(&text).unwrap_err();
            assert!(err.contains(location), "{err:?} should point at {location}");
            assert!(err.contains(words), "{err:?} should say {words}");
        }
        // MIG mode on without slices: a GPU that no job gets whole and that has nothing to lease.
        let empty = parse_str(&format!("{gpu}mig_mode = true\n")).unwrap();
        assert!(empty[0].mig_mode && empty[0].mig_devices.is_empty());
    }
}
