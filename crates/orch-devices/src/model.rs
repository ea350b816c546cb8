//! One model for every inventory. A field a backend cannot read is `None`, never a default.

use orch_core::CpuList;
use serde::{Deserialize, Serialize};

/// Which inventory a device came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Backend {
    Nvml,
    Sim,
    Cpu,
}

impl Backend {
    pub fn as_str(self) -> &'static str {
        match self {
            Backend::Nvml => "nvml",
            Backend::Sim => "sim",
            Backend::Cpu => "cpu",
        }
    }
}

/// A compute process running on a device (NVML's running compute processes).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuProcess {
    pub pid: u32,
    pub used_memory_bytes: Option<u64>,
}

/// A MIG instance of a GPU; `CUDA_VISIBLE_DEVICES` may name it by its `MIG-…` uuid.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigDevice {
    pub uuid: String,
    pub name: Option<String>,
    pub memory_total_bytes: Option<u64>,
    /// Its memory in use (NVML's memory info of the MIG device; the sim file's `memory_used`,
    /// 0 when not given); `None` when unknown.
    #[serde(default)]
    pub memory_used_bytes: Option<u64>,
    /// The GPU instance it belongs to (NVML's `nvmlDeviceGetGpuInstanceId`, or the sim file's
    /// `gpu_instance_id`).
    #[serde(default)]
    pub gpu_instance_id: Option<u32>,
    /// Its compute instance within the GPU instance (`nvmlDeviceGetComputeInstanceId`).
    #[serde(default)]
    pub compute_instance_id: Option<u32>,
    /// The minor number of `/dev/nvidia-caps/nvidia-cap<N>` that grants access to its GPU
    /// instance (`gpu<M>/gi<G>/access` in `/proc/driver/nvidia-caps/mig-minors`).
    #[serde(default)]
    pub gpu_instance_cap_minor: Option<u32>,
    /// The minor number of the capability node of its compute instance
    /// (`gpu<M>/gi<G>/ci<C>/access`).
    #[serde(default)]
    pub compute_instance_cap_minor: Option<u32>,
}

impl MigDevice {
    /// Its free memory: total less used, when both are known.
    pub fn memory_free_bytes(&self) -> Option<u64> {
        self.memory_total_bytes
            .zip(self.memory_used_bytes)
            .map(|(total, used)| total.saturating_sub(used))
    }
}

/// A device as the host sees it. `index` is the physical index: NVML order, which is PCI bus
/// order, the numbering nvidia-smi shows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Device {
    pub index: u32,
    pub uuid: String,
    pub name: String,
    pub backend: Backend,
    pub memory_total_bytes: Option<u64>,
    pub memory_used_bytes: Option<u64>,
    pub memory_free_bytes: Option<u64>,
    pub utilization_gpu_percent: Option<u32>,
    pub utilization_memory_percent: Option<u32>,
    pub temperature_c: Option<u32>,
    pub power_draw_w: Option<f64>,
    /// `"9.0"` style.
    pub compute_capability: Option<String>,
    pub pci_bus_id: Option<String>,
    /// `None` when the backend cannot list processes (the CPU device).
    pub processes: Option<Vec<GpuProcess>>,
    pub mig_devices: Vec<MigDevice>,
    /// The minor number of the GPU's device node (`/dev/nvidiaN`, character major 195): NVML's,
    /// or a sim file's `minor_number`; `None` when unknown (the CPU device has none). Jobs orch
    /// starts as root may open only the nodes of their granted GPUs (docs/DEVICES.md).
    #[serde(default)]
    pub minor_number: Option<u32>,
    /// The NUMA node the GPU is attached to (NVML's, or a sim file's `numa_node`); `None` when
    /// unknown or when the machine has one node and says so.
    #[serde(default)]
    pub numa_node: Option<u32>,
    /// The CPUs close to the GPU (NVML's CPU affinity, or a sim file's `cpus`).
    #[serde(default)]
    pub cpus: Option<CpuList>,
    /// How this GPU reaches each other GPU it knows a path to, by the peer's index: NVLinks and
    /// the PCIe level. Empty when nothing is known.
    #[serde(default)]
    pub links: Vec<PeerLink>,
    /// Its health (Xid errors, ECC, remapped rows, lost) and the drains on it or its slices.
    #[serde(default)]
    pub health: crate::health::Health,
    /// MIG mode is on: the GPU is cut into the slices of [`Device::mig_devices`] and is never
    /// handed out whole (docs/DEVICES.md).
    #[serde(default)]
    pub mig_mode: bool,
    /// How many compute slices the GPU has in MIG mode (NVML's maximum MIG device count: 7 on
    /// A100, H100 and H200, 4 on A30; the sim file's `mig_slots`); a slice's share of the GPU's
    /// compute is its profile's `Ng` over this. `None` when not in MIG mode or unknown.
    #[serde(default)]
    pub mig_slots: Option<u32>,
}

/// The PCIe path between two GPUs, closest first, named as `nvidia-smi topo -m` names it
/// (NVML's `nvmlGpuTopologyLevel_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum PcieLevel {
    /// At most one PCIe bridge (one switch).
    Pix,
    /// Several PCIe bridges, without the host bridge.
    Pxb,
    /// Through a PCIe host bridge (the CPU).
    Phb,
    /// Through the interconnect between host bridges within one NUMA node.
    Node,
    /// Through the interconnect between NUMA nodes (the sockets' link).
    Sys,
}

impl PcieLevel {
    pub fn as_str(self) -> &'static str {
        match self {
            PcieLevel::Pix => "PIX",
            PcieLevel::Pxb => "PXB",
            PcieLevel::Phb => "PHB",
            PcieLevel::Node => "NODE",
            PcieLevel::Sys => "SYS",
        }
    }
}

/// How a GPU reaches one peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PeerLink {
    /// The peer's index ([`Device::index`]).
    pub peer: u32,
    /// Active NVLinks between the two; 0 when none.
    pub nvlinks: u32,
    /// The PCIe path, when known.
    pub pcie: Option<PcieLevel>,
}

impl PeerLink {
    /// What `nvidia-smi topo -m` prints for the pair: `NV18`, `PIX`, …; `?` when nothing is known.
    pub fn label(&self) -> String {
        match (self.nvlinks, self.pcie) {
            (n, _) if n > 0 => format!("NV{n}"),
            (_, Some(level)) => level.as_str().to_string(),
            (_, None) => "?".to_string(),
        }
    }
}

impl Device {
    /// A lease naming `uuid` holds this device or part of it: the GPU itself, or one of its MIG
    /// slices (whose processes NVML lists under the GPU).
    pub fn covers(&self, uuid: &str) -> bool {
        self.uuid == uuid || self.mig_devices.iter().any(|m| m.uuid == uuid)
    }

    /// How this GPU reaches the GPU of index `peer`, when known.
    pub fn link_to(&self, peer: u32) -> Option<&PeerLink> {
        self.links.iter().find(|l| l.peer == peer)
    }

    /// Compute capability as `(major, minor)` for ordering, when known and well formed.
    pub fn compute_capability_pair(&self) -> Option<(u32, u32)> {
        let cc = self.compute_capability.as_deref()?;
        let (major, minor) = cc.split_once('.')?;
        Some((major.parse().ok()?, minor.parse().ok()?))
    }

    /// The first eight hex digits of the uuid, as people quote it (`GPU-8932f937`).
    pub fn short_uuid(&self) -> &str {
        let end = self
            .uuid
            .char_indices()
            .nth(12)
            .map_or(self.uuid.len(), |(i, _)| i);
        &self.uuid[..end]
    }
}
