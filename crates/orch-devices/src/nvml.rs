//! Real NVIDIA GPUs through NVML (nvml-wrapper, loaded at run time).
//!
//! A missing library or driver is [`DeviceError::NvmlUnavailable`]; a telemetry field the GPU does
//! not support (power on some boards, temperature in some VMs) is `None`, never a made-up value.
//! So is a topology field (NUMA node, CPU affinity, PCIe level, NVLinks): a query NVML does not
//! support leaves it unknown and never fails the device.
//!
//! `ORCH_NVML_LIBRARY=PATH` loads that library instead of the system's `libnvidia-ml.so`: the
//! simulated NVML library (`crates/orch-nvml-sim`) is how this code runs without a GPU.

use crate::{Backend, Device, DeviceError, GpuProcess, MigDevice, PcieLevel, PeerLink};
use nvml_wrapper::Nvml;
use nvml_wrapper::enum_wrappers::device::{TemperatureSensor, TopologyLevel};
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use std::collections::{BTreeMap, HashMap};

/// The environment variable naming the NVML library to load instead of the system's.
pub const LIBRARY_ENV: &str = "ORCH_NVML_LIBRARY";

/// NVLinks a GPU may have (`NVML_NVLINK_MAX_LINKS` of nvml.h: 18 since Hopper).
const MAX_NVLINKS: u32 = 18;
/// CPU affinity is asked for CPUs 0..8192 (Linux's largest `NR_CPUS`), 64 to a word.
const CPU_SET_WORDS: usize = (orch_core::cpulist::MAX_CPU as usize + 1) / 64;
/// Memory affinity is asked for NUMA nodes 0..1024 (Linux's `MAX_NUMNODES`).
const NODE_SET_WORDS: usize = 1024 / 64;
/// `NVML_AFFINITY_SCOPE_NODE`: memory affinity by NUMA node.
const AFFINITY_SCOPE_NODE: u32 = 0;

/// Every GPU NVML reports, in NVML order (PCI bus order), with the links between them.
pub fn read() -> Result<Vec<Device>, DeviceError> {
    let nvml = init().map_err(|e| DeviceError::NvmlUnavailable(describe_init_error(&e)))?;
    let count = nvml
        .device_count()
        .map_err(|e| DeviceError::NvmlUnavailable(e.to_string()))?;
    if count == 0 {
        return Err(DeviceError::NoGpu);
    }
    let mig_minors = std::cell::OnceCell::new();
    let mut devices = (0..count)
        .map(|index| read_device(&nvml, index, &mig_minors))
        .collect::<Result<Vec<_>, _>>()?;
    read_links(&nvml, &mut devices);
    Ok(devices)
}

/// The driver version NVML reports, when NVML loads.
pub fn driver_version() -> Option<String> {
    init().ok()?.sys_driver_version().ok()
}

/// The library `ORCH_NVML_LIBRARY` names, when set and not empty.
fn library_override() -> Option<std::ffi::OsString> {
    std::env::var_os(LIBRARY_ENV).filter(|p| !p.is_empty())
}

/// NVML from the library `ORCH_NVML_LIBRARY` names, else the system's.
pub(crate) fn init() -> Result<Nvml, NvmlError> {
    match library_override() {
        Some(path) => Nvml::builder().lib_path(&path).init(),
        None => Nvml::init(),
    }
}

fn describe_init_error(err: &NvmlError) -> String {
    let path = library_override();
    let path = path.as_deref().map(|p| std::path::Path::new(p).display());
    match (err, path) {
        (NvmlError::LibloadingError(e), Some(path)) => format!(
            "cannot load {path}, the library {LIBRARY_ENV} names ({e}); unset {LIBRARY_ENV} to use the system's"
        ),
        (NvmlError::LibloadingError(e), None) => format!("no NVIDIA driver found ({e})"),
        (other, Some(path)) => format!(
            "{} (in {path}, the library {LIBRARY_ENV} names)",
            describe_driver_error(other)
        ),
        (other, None) => describe_driver_error(other),
    }
}

fn describe_driver_error(err: &NvmlError) -> String {
    match err {
        NvmlError::DriverNotLoaded => "the NVIDIA kernel driver is not loaded".to_string(),
        NvmlError::NoPermission => "no permission to talk to the NVIDIA driver".to_string(),
        other => other.to_string(),
    }
}

fn read_device(
    nvml: &Nvml,
    index: u32,
    mig_minors: &std::cell::OnceCell<HashMap<String, u32>>,
) -> Result<Device, DeviceError> {
    let failed = |what: &'static str| {
        move |e: nvml_wrapper::error::NvmlError| DeviceError::NvmlRead {
            index,
            what,
            reason: e.to_string(),
        }
    };
    // A GPU that has fallen off the bus answers GPU_IS_LOST from its handle, uuid or name: it
    // is a lost device, not a failed reading of the machine.
    let device = match nvml.device_by_index(index) {
        Err(NvmlError::GpuLost) => return Ok(lost::device(index, None)),
        other => other.map_err(failed("the handle"))?,
    };
    let (uuid, name) = match (device.uuid(), device.name()) {
        (Err(NvmlError::GpuLost), _) | (_, Err(NvmlError::GpuLost)) => {
            let pci = device.pci_info().ok().map(|p| p.bus_id);
            return Ok(lost::device(index, pci));
        }
        (uuid, name) => (
            uuid.map_err(failed("the uuid"))?,
            name.map_err(failed("the name"))?,
        ),
    };
    let memory = device.memory_info();
    // A GPU that has fallen off the bus keeps its handle and name; its readings fail so.
    let lost = matches!(memory, Err(NvmlError::GpuLost));
    let memory = memory.ok();
    let utilization = device.utilization_rates().ok();
    let processes = device.running_compute_processes().ok().map(|list| {
        list.into_iter()
            .map(|p| GpuProcess {
                pid: p.pid,
                used_memory_bytes: match p.used_gpu_memory {
                    UsedGpuMemory::Used(bytes) => Some(bytes),
                    UsedGpuMemory::Unavailable => None,
                },
            })
            .collect()
    });
    let pci_bus_id = device.pci_info().ok().map(|p| p.bus_id);
    lost::remember(index, &uuid, &name, pci_bus_id.as_deref());
    let mig_mode = device.mig_mode().is_ok_and(|mode| mode.current == 1);
    let mut read = Device {
        index,
        uuid,
        name,
        backend: Backend::Nvml,
        memory_total_bytes: memory.as_ref().map(|m| m.total),
        memory_used_bytes: memory.as_ref().map(|m| m.used),
        memory_free_bytes: memory.as_ref().map(|m| m.free),
        utilization_gpu_percent: utilization.as_ref().map(|u| u.gpu),
        utilization_memory_percent: utilization.as_ref().map(|u| u.memory),
        temperature_c: device.temperature(TemperatureSensor::Gpu).ok(),
        power_draw_w: device.power_usage().ok().map(|mw| f64::from(mw) / 1000.0),
        compute_capability: device
            .cuda_compute_capability()
            .ok()
            .map(|cc| format!("{}.{}", cc.major, cc.minor)),
        pci_bus_id,
        processes,
        mig_devices: Vec::new(),
        // The N of /dev/nvidiaN (Linux only); unknown when the driver does not say.
        minor_number: device.minor_number().ok(),
        numa_node: read_numa_node(&device),
        cpus: read_cpus(&device),
        links: Vec::new(),
        health: crate::nvml_health::read(nvml, &device, lost),
        mig_mode,
        mig_slots: None,
    };
    if mig_mode {
        read.mig_slots = device.mig_device_count().ok().filter(|n| *n > 0);
        let minors = mig_minors.get_or_init(crate::mig::read_mig_minors);
        read.mig_devices = read_mig_devices(nvml, &device, read.minor_number, minors);
    }
    Ok(read)
}

/// The GPU's NUMA node as `nvidia-smi topo -m` prints it under "NUMA Affinity": the one node of
/// its memory affinity (node scope). Unknown when NVML does not say (or names several nodes).
///
/// Not `nvmlDeviceGetNumaNodeId`: that is the GPU's own memory as a NUMA node where GPUs are
/// nodes (GH200, GB200: an HBM node without CPUs, not the node the GPU hangs off) and is not
/// supported elsewhere (x86 PCIe boxes).
fn read_numa_node(device: &nvml_wrapper::Device<'_>) -> Option<u32> {
    let words = device
        .memory_affinity(NODE_SET_WORDS, AFFINITY_SCOPE_NODE)
        .ok()?;
    let mut nodes = set_bits(&words);
    let node = nodes.next()?;
    nodes.next().is_none().then_some(node)
}

/// The CPUs close to the GPU (NVML's CPU affinity); unknown when NVML does not say or names none.
fn read_cpus(device: &nvml_wrapper::Device<'_>) -> Option<orch_core::CpuList> {
    let words = device.cpu_affinity(CPU_SET_WORDS).ok()?;
    let cpus = orch_core::CpuList::from_cpus(set_bits(&words));
    (!cpus.is_empty()).then_some(cpus)
}

/// The numbers of the set bits of an NVML bit mask (bit `i` of word `w` is `64 * w + i`).
fn set_bits(words: &[std::ffi::c_ulong]) -> impl Iterator<Item = u32> + '_ {
    let width = std::ffi::c_ulong::BITS;
    words.iter().enumerate().flat_map(move |(w, &word)| {
        (0..width)
            .filter(move |bit| word & (1 << bit) != 0)
            .map(move |bit| w as u32 * width + bit)
    })
}

/// The PCIe level NVML's common ancestor names, as `nvidia-smi topo -m` prints it.
fn pcie_level(level: TopologyLevel) -> PcieLevel {
    match level {
        TopologyLevel::Internal | TopologyLevel::Single => PcieLevel::Pix,
        TopologyLevel::Multiple => PcieLevel::Pxb,
        TopologyLevel::HostBridge => PcieLevel::Phb,
        TopologyLevel::Node => PcieLevel::Node,
        TopologyLevel::System => PcieLevel::Sys,
    }
}

/// Where one GPU's active NVLinks lead: to other GPUs (by index) or to NVSwitches (by bus id).
#[derive(Debug, Default)]
struct NvlinkEnds {
    gpus: BTreeMap<u32, u32>,
    switches: BTreeMap<String, u32>,
}

/// Whether NVML says the far end of a GPU's link is an NVSwitch
/// (`nvmlDeviceGetNvLinkRemoteDeviceType` is `NVML_NVLINK_DEVICE_TYPE_SWITCH`); `false` for any
/// other type (a GPU, an IBM NPU, unknown) and when NVML cannot say.
///
/// Called through the library nvml-wrapper loaded: nvml-wrapper 0.13's `remote_device_type`
/// passes NVML a copy of its answer and returns `Unknown` whatever NVML writes.
fn remote_is_switch(nvml: &Nvml, device: &nvml_wrapper::Device<'_>, link: u32) -> bool {
    use nvml_wrapper_sys::bindings as sys;
    let Ok(get_type) = nvml.lib().nvmlDeviceGetNvLinkRemoteDeviceType.as_ref() else {
        return false;
    };
    let mut kind = sys::nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_UNKNOWN;
    // SAFETY: the handle comes from this `Nvml`, which is alive for the call; `kind` is a valid
    // place for the one value NVML writes.
    let ret = unsafe { get_type(device.handle(), link, &mut kind) };
    ret == sys::nvmlReturn_enum_NVML_SUCCESS
        && kind == sys::nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_SWITCH
}

/// Each GPU's active NVLinks, by the PCI bus id at their far end: another GPU's, or an NVSwitch's
/// (a link NVML reports as ending at a switch). Links to anything else (an IBM NPU: a POWER9
/// board's CPU) and links whose far end NVML cannot name are left out.
fn read_nvlinks(
    nvml: &Nvml,
    device: &nvml_wrapper::Device<'_>,
    index: u32,
    by_bus_id: &HashMap<String, u32>,
) -> NvlinkEnds {
    let mut ends = NvlinkEnds::default();
    for link in 0..MAX_NVLINKS {
        let wrapper = device.link_wrapper_for(link);
        match wrapper.is_active() {
            Ok(true) => {}
            Ok(false) => continue,
            // No NVLink at all (or no such function in this library): stop asking.
            Err(NvmlError::NotSupported | NvmlError::FailedToLoadSymbol(_)) => break,
            Err(_) => continue,
        }
        let Some(remote) = wrapper
            .remote_pci_info()
            .ok()
            .and_then(|pci| crate::sim::normalize_pci_bus_id(&pci.bus_id))
        else {
            continue;
        };
        ends.count(remote, index, by_bus_id, || {
            remote_is_switch(nvml, device, link)
        });
    }
    ends
}

impl NvlinkEnds {
    /// Counts one active link of GPU `index` whose far end has PCI bus id `remote`: for the GPU
    /// of that id, else for the switch of that id when `is_switch` says the far end is one (asked
    /// only then); a link to anything else counts for nothing.
    fn count(
        &mut self,
        remote: String,
        index: u32,
        by_bus_id: &HashMap<String, u32>,
        is_switch: impl FnOnce() -> bool,
    ) {
        match by_bus_id.get(&remote) {
            Some(&peer) if peer != index => *self.gpus.entry(peer).or_default() += 1,
            Some(_) => {}
            None if is_switch() => *self.switches.entry(remote).or_default() += 1,
            None => {}
        }
    }
}

/// The link between every pair: NVLinks (direct, or through NVSwitches both GPUs reach: the
/// fewer of the two GPUs' links into each shared switch, summed, as an HGX box's 18) and the
/// PCIe common ancestor. A pair NVML tells nothing about gets no entry.
fn read_links(nvml: &Nvml, devices: &mut [Device]) {
    let by_bus_id: HashMap<String, u32> = devices
        .iter()
        .filter_map(|d| {
            let id = crate::sim::normalize_pci_bus_id(d.pci_bus_id.as_deref()?)?;
            Some((id, d.index))
        })
        .collect();
    let ends: Vec<NvlinkEnds> = devices
        .iter()
        .map(|d| match nvml.device_by_index(d.index) {
            Ok(handle) => read_nvlinks(nvml, &handle, d.index, &by_bus_id),
            Err(_) => NvlinkEnds::default(),
        })
        .collect();
    let indices: Vec<u32> = devices.iter().map(|d| d.index).collect();
    for (a, device) in devices.iter_mut().enumerate() {
        let Ok(handle) = nvml.device_by_index(indices[a]) else {
            continue;
        };
        for (b, &peer) in indices.iter().enumerate() {
            if a == b {
                continue;
            }
            let through_switches: u32 = ends[a]
                .switches
                .iter()
                .filter_map(|(switch, &mine)| Some(mine.min(*ends[b].switches.get(switch)?)))
                .sum();
            let nvlinks = ends[a].gpus.get(&peer).copied().unwrap_or(0) + through_switches;
            let pcie = nvml
                .device_by_index(peer)
                .ok()
                .and_then(|other| handle.topology_common_ancestor(other).ok())
                .map(pcie_level);
            if nvlinks > 0 || pcie.is_some() {
                device.links.push(PeerLink {
                    peer,
                    nvlinks,
                    pcie,
                });
            }
        }
    }
}

/// The MIG slices of a GPU in MIG mode (`nvmlDeviceGetMigDeviceHandleByIndex` over every slot;
/// empty slots are skipped), with their GPU and compute instance ids and, from the driver's
/// `mig-minors` listing, their capability nodes' minors.
fn read_mig_devices(
    nvml: &Nvml,
    device: &nvml_wrapper::Device<'_>,
    gpu_minor: Option<u32>,
    minors: &HashMap<String, u32>,
) -> Vec<MigDevice> {
    let slots = device.mig_device_count().unwrap_or(0);
    (0..slots)
        .filter_map(|slot| device.mig_device_by_index(slot).ok())
        .filter_map(|mig| {
            let gpu_instance_id = instance_id(nvml, &mig, false);
            let compute_instance_id = instance_id(nvml, &mig, true);
            let (gi_cap, ci_cap) = match (gpu_minor, gpu_instance_id, compute_instance_id) {
                (Some(gpu), Some(gi), Some(ci)) => {
                    crate::mig::lookup_cap_minors(minors, gpu, gi, ci)
                }
                _ => (None, None),
            };
            let memory = mig.memory_info().ok();
            Some(MigDevice {
                uuid: mig.uuid().ok()?,
                name: mig.name().ok(),
                memory_total_bytes: memory.as_ref().map(|m| m.total),
                memory_used_bytes: memory.as_ref().map(|m| m.used),
                gpu_instance_id,
                compute_instance_id,
                gpu_instance_cap_minor: gi_cap,
                compute_instance_cap_minor: ci_cap,
            })
        })
        .collect()
}

/// A MIG device's GPU instance id (`nvmlDeviceGetGpuInstanceId`) or, with `compute`, its
/// compute instance id (`nvmlDeviceGetComputeInstanceId`); nvml-wrapper 0.13 wraps neither, so
/// they are called through the library it loaded. `None` when NVML does not say.
fn instance_id(nvml: &Nvml, mig: &nvml_wrapper::Device<'_>, compute: bool) -> Option<u32> {
    use nvml_wrapper_sys::bindings as sys;
    let lib = nvml.lib();
    let get = if compute {
        lib.nvmlDeviceGetComputeInstanceId.as_ref().ok()?
    } else {
        lib.nvmlDeviceGetGpuInstanceId.as_ref().ok()?
    };
    let mut id: std::ffi::c_uint = 0;
    // SAFETY: the handle comes from this `Nvml`, which is alive for the call; `id` is a valid
    // place for the one value NVML writes.
    let ret = unsafe { get(mig.handle(), &mut id) };
    (ret == sys::nvmlReturn_enum_NVML_SUCCESS).then_some(id)
}

#[cfg(test)]
mod tests {
    use super::NvlinkEnds;
    use std::collections::HashMap;

    #[test]
    fn only_ends_nvml_calls_switches_count_as_switches() {
        // A POWER9-style board: GPU 0 has 2 links to GPU 1, 3 to an NVSwitch and 3 to the CPU's
        // NPU (neither a GPU nor a switch).
        let by_bus_id: HashMap<String, u32> = [
            ("00000000:04:00.0".to_string(), 0),
            ("00000000:05:00.0".to_string(), 1),
        ]
        .into();
        let mut ends = NvlinkEnds::default();
        let links = [("00000000:05:00.0", false); 2]
            .into_iter()
            .chain([("00000000:C0:00.0", true); 3])
            .chain([("00000000:D0:00.0", false); 3]);
        for (remote, is_switch) in links {
            ends.count(remote.to_string(), 0, &by_bus_id, || is_switch);
        }
        assert_eq!(ends.gpus, [(1, 2)].into());
        assert_eq!(ends.switches, [("00000000:C0:00.0".to_string(), 3)].into());
        // A link to itself counts for nothing.
        ends.count("00000000:04:00.0".to_string(), 0, &by_bus_id, || true);
        assert_eq!(ends.gpus, [(1, 2)].into());
    }

    #[test]
    fn absence_is_an_error_value_not_a_panic() {
        // On a machine without the NVIDIA driver this is the reason users read; with one it lists GPUs.
        match super::read() {
            Ok(devices) => assert!(!devices.is_empty()),
            Err(err) => assert!(!err.to_string().is_empty()),
        }
    }
}

/// GPUs that answer `GPU_IS_LOST` to what names them (handle, uuid, name).
mod lost {
    use crate::{Backend, Device};
    use std::collections::HashMap;
    use std::sync::Mutex;

    /// What this process last read of each GPU that answered: by NVML index and by PCI bus id.
    #[derive(Default)]
    struct Known {
        by_index: HashMap<u32, (String, String)>,
        by_bus_id: HashMap<String, (String, String)>,
    }

    static KNOWN: Mutex<Option<Known>> = Mutex::new(None);

    /// Keeps a GPU's names from a reading that answered, for the day it is lost.
    pub(super) fn remember(index: u32, uuid: &str, name: &str, bus_id: Option<&str>) {
        let mut known = KNOWN.lock().unwrap_or_else(|e| e.into_inner());
        let known = known.get_or_insert_with(Known::default);
        let names = (uuid.to_string(), name.to_string());
        if let Some(id) = bus_id.and_then(crate::sim::normalize_pci_bus_id) {
            known.by_bus_id.insert(id, names.clone());
        }
        known.by_index.insert(index, names);
    }

    /// The lost GPU at NVML index `index` (at PCI bus id `bus_id`, when NVML still says): its uuid
    /// and name from this process's last reading of it (the daemon's watcher has one), else a
    /// uuid made of its index (`GPU-lost-1`), which names it for `orch drain 1` and no lease.
    /// Nothing else is read; it is unhealthy (lost).
    pub(super) fn device(index: u32, bus_id: Option<String>) -> Device {
        let known = KNOWN.lock().unwrap_or_else(|e| e.into_inner());
        let names = known.as_ref().and_then(|k| {
            bus_id
                .as_deref()
                .and_then(crate::sim::normalize_pci_bus_id)
                .and_then(|id| k.by_bus_id.get(&id))
                .or_else(|| k.by_index.get(&index))
                .cloned()
        });
        let (uuid, name) = names.unwrap_or_else(|| (format!("GPU-lost-{index}"), "(lost)".into()));
        let mut health = crate::health::Health {
            lost: true,
            ..crate::health::Health::default()
        };
        health.assess(orch_core::time::now_ms());
        Device {
            index,
            uuid,
            name,
            backend: Backend::Nvml,
            memory_total_bytes: None,
            memory_used_bytes: None,
            memory_free_bytes: None,
            utilization_gpu_percent: None,
            utilization_memory_percent: None,
            temperature_c: None,
            power_draw_w: None,
            compute_capability: None,
            pci_bus_id: bus_id,
            processes: None,
            mig_devices: Vec::new(),
            minor_number: None,
            numa_node: None,
            cpus: None,
            links: Vec::new(),
            health,
            // Its slices cannot be read: it is leased neither whole nor by slice while lost.
            mig_mode: false,
            mig_slots: None,
        }
    }
}
