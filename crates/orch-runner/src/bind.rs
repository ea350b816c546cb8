//! Two things a job's processes are told about their GPUs beyond which ones they are: the CPUs
//! and memory near them (`[resources] cpu_bind`), and the names CUDA will know them by
//! (`[command] device_ids`).

use crate::plan::Plan;
use orch_core::CpuList;
use orch_core::job::{CpuBind, DeviceIds, JobSpec, Launch};
use orch_devices::{Backend, Device, Inventory};
use orch_exec::devices::DeviceRule;
use orch_exec::{CpuBinding, HostCpus};

/// Each process's binding, by slot (rank of a per-device launch, else the one process): the
/// union of its GPUs' CPUs (a GPU's `cpus`, else its NUMA node's CPUs on this machine), within
/// the CPUs orch may use, or why that process is not bound (a GPU whose place is unknown, no CPU
/// left). Empty when the job is not to be bound at all: `cpu_bind = "none"`, the CPU inventory.
pub fn bindings(
    job: &JobSpec,
    launch: Launch,
    plan: &Plan,
    inventory: &Inventory,
    host: &HostCpus,
) -> Vec<Result<CpuBinding, Unbound>> {
    if inventory.backend == Backend::Cpu || job.resources.cpu_bind == Some(CpuBind::None) {
        return Vec::new();
    }
    let devices: Vec<(u32, Option<&Device>)> = plan
        .chosen
        .iter()
        .map(|c| (c.physical_index, c.in_inventory(inventory)))
        .collect();
    let groups: Vec<Vec<(u32, Option<&Device>)>> = match launch {
        Launch::PerDevice => devices.into_iter().map(|d| vec![d]).collect(),
        Launch::Single => vec![devices],
    };
    groups
        .iter()
        .map(|group| {
            let near = group
                .iter()
                .try_fold(CpuList::default(), |acc, (index, d)| {
                    near_cpus(*d, host)
                        .map(|cpus| acc.union(&cpus))
                        .ok_or(*index)
                })
                .map_err(Unbound::Unknown)?;
            host.binding(&near).map_err(Unbound::NoCpu)
        })
        .collect()
}

/// Why a process is not bound.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unbound {
    /// Neither the CPUs nor the NUMA node of the GPU of this index is known.
    Unknown(u32),
    /// None of the GPUs' CPUs is one orch may use ([`HostCpus::binding`]'s sentence).
    NoCpu(String),
}

impl std::fmt::Display for Unbound {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unbound::Unknown(index) => {
                write!(f, "the NUMA node and CPUs of GPU {index} are not known")
            }
            Unbound::NoCpu(why) => f.write_str(why),
        }
    }
}

/// [`bindings`] on this machine, as the launch takes them (`None`: that process unbound; an
/// empty list: none bound), each said: a binding at info level (`orch run` shows it), why a
/// process is not bound at warning level when the job asked for `numa` or no CPU is left, at
/// debug level when the GPUs' places are simply unknown.
pub fn cpu_bindings(
    job: &JobSpec,
    launch: Launch,
    plan: &Plan,
    inventory: &Inventory,
) -> Vec<Option<CpuBinding>> {
    let planned = bindings(job, launch, plan, inventory, &HostCpus::read());
    let asked = job.resources.cpu_bind == Some(CpuBind::Numa);
    let per_rank = launch == Launch::PerDevice;
    let out: Vec<Option<CpuBinding>> = planned
        .into_iter()
        .enumerate()
        .map(|(slot, planned)| {
            let who = if per_rank {
                format!("job {} rank {slot}", job.name)
            } else {
                format!("job {}", job.name)
            };
            match planned {
                Ok(binding) => {
                    tracing::info!("{who}: bound to {binding}");
                    Some(binding)
                }
                Err(why) if asked || matches!(why, Unbound::NoCpu(_)) => {
                    tracing::warn!("{who}: not bound to CPUs: {why}");
                    None
                }
                Err(why) => {
                    tracing::debug!("{who}: not bound to CPUs: {why}");
                    None
                }
            }
        })
        .collect();
    if out.iter().all(Option::is_none) {
        return Vec::new();
    }
    out
}

/// The CPUs near `device`: its own list, else its NUMA node's CPUs on this machine.
fn near_cpus(device: Option<&Device>, host: &HostCpus) -> Option<CpuList> {
    let device = device?;
    device
        .cpus
        .clone()
        .or_else(|| host.node_cpus(device.numa_node?).cloned())
        .filter(|c| !c.is_empty())
}

/// What `CUDA_VISIBLE_DEVICES` holds for each granted device, in the plan's order: UUIDs, or with
/// `DeviceIds::Index` the number CUDA gives each inside the job.
///
/// CUDA numbers (under `CUDA_DEVICE_ORDER=PCI_BUS_ID`) the GPUs it can open, in PCI bus order,
/// which is the inventory's order. Where the job may open only some GPU nodes (`rule`: the
/// device constraint on the job), the others do not exist for CUDA, and a granted GPU's number
/// is its place among the GPUs not denied (the job's own: 0..n-1); unconfined, it is its place
/// among all the machine's GPUs. A MIG slice has no such number: `Err` says so.
pub fn cuda_ids(
    ids: DeviceIds,
    plan: &Plan,
    inventory: &Inventory,
    rule: Option<&DeviceRule>,
) -> Result<Vec<String>, String> {
    if ids == DeviceIds::Uuid {
        return Ok(plan.chosen.iter().map(|c| c.uuid.clone()).collect());
    }
    let denied =
        |d: &Device| rule.is_some_and(|r| d.minor_number.is_some_and(|m| r.denied().contains(&m)));
    let mut visible: Vec<&Device> = inventory.devices.iter().filter(|d| !denied(d)).collect();
    visible.sort_by_key(|d| d.index);
    plan.chosen
        .iter()
        .map(|chosen| {
            if chosen.uuid.starts_with("MIG-") {
                return Err(format!(
                    "device_ids = \"index\" cannot name the MIG slice {}: CUDA numbers MIG slices by UUID only; use device_ids = \"uuid\" for this job",
                    chosen.uuid
                ));
            }
            let place = visible.iter().position(|d| d.uuid == chosen.uuid);
            // A GPU in MIG mode is not one CUDA device but its slices, so the numbers of the
            // GPUs after it are not known here: UUIDs are.
            if let Some(mig) = place.and_then(|i| visible[..i].iter().find(|d| !d.mig_devices.is_empty())) {
                return Err(format!(
                    "device_ids = \"index\": GPU {} is in MIG mode and comes before GPU {} ({}), so CUDA's number for it is not known; use device_ids = \"uuid\"",
                    mig.index, chosen.physical_index, chosen.uuid
                ));
            }
            place
                .map(|i| i.to_string())
                .ok_or_else(|| {
                    format!(
                        "device_ids = \"index\": GPU {} ({}) is not among the GPUs the job can open; use device_ids = \"uuid\"",
                        chosen.physical_index, chosen.uuid
                    )
                })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::PlannedDevice;
    use orch_exec::devices::DeviceRule;

    fn uuid(i: u32) -> String {
        format!("GPU-0000000{i}-0000-4000-8000-000000000000")
    }

    /// Four sim GPUs; GPU 2 has no known device node.
    fn box4() -> Inventory {
        let mut text = String::new();
        for i in 0..4 {
            text.push_str(&format!(
                "[[gpu]]\nname = \"sim\"\nmemory_total = \"16GiB\"\nuuid = \"{}\"\n",
                uuid(i)
            ));
            if i != 2 {
                text.push_str(&format!("minor_number = {i}\n"));
            }
        }
        Inventory {
            backend: Backend::Sim,
            devices: orch_devices::sim::parse(std::path::Path::new("box.toml"), &text).unwrap(),
            fallback_reason: None,
        }
    }

    fn plan(physical: &[u32]) -> Plan {
        Plan {
            job: "j".into(),
            policy: "p".into(),
            chosen: physical
                .iter()
                .map(|&i| PlannedDevice {
                    index: i,
                    physical_index: i,
                    uuid: uuid(i),
                    name: "sim".into(),
                    memory_free: None,
                    utilization_gpu: None,
                })
                .collect(),
            reason: String::new(),
            rejected: Vec::new(),
            hidden: 0,
        }
    }

    #[test]
    fn indices_count_the_gpus_the_job_can_open_in_pci_order() {
        let inventory = box4();
        let ids = |chosen: &[u32], rule: Option<&DeviceRule>| {
            cuda_ids(DeviceIds::Index, &plan(chosen), &inventory, rule).unwrap()
        };
        // Unconfined: the machine's numbering, in the plan's order.
        assert_eq!(ids(&[3, 1], None), ["3", "1"]);
        // Confined to GPUs 1 and 3: CUDA sees those two, and GPU 2, whose node is not known
        // and so cannot be denied; GPU 0 is gone.
        let rule = DeviceRule::granting(&[1, 3]);
        assert_eq!(ids(&[3, 1], Some(&rule)), ["2", "0"]);
        // GPU 2's node is unknown, so only the other GPUs' known nodes are denied: CUDA sees
        // GPUs 1 and 2 (2 could not be shut out), and numbers them 0 and 1.
        let rule = DeviceRule::for_grant(&[Some(1), None], &[0, 1, 3]).unwrap();
        assert_eq!(ids(&[1, 2], Some(&rule)), ["0", "1"]);
        // UUIDs stay UUIDs.
        let uuids = cuda_ids(DeviceIds::Uuid, &plan(&[2]), &inventory, None).unwrap();
        assert_eq!(uuids, [uuid(2)]);
    }

    #[test]
    fn a_gpu_in_mig_mode_before_the_granted_one_leaves_its_number_unknown() {
        let mut inventory = box4();
        inventory.devices[1]
            .mig_devices
            .push(orch_devices::MigDevice {
                uuid: "MIG-00000001-0000-4000-8000-000000000000".into(),
                name: Some("1g.10gb".into()),
                memory_total_bytes: None,
                ..Default::default()
            });
        let err = cuda_ids(DeviceIds::Index, &plan(&[3]), &inventory, None).unwrap_err();
        assert!(err.contains("GPU 1 is in MIG mode"), "{err}");
        // Before it, the numbers stand; confined away from it, too.
        assert_eq!(
            cuda_ids(DeviceIds::Index, &plan(&[0]), &inventory, None).unwrap(),
            ["0"]
        );
        let rule = DeviceRule::granting(&[3]);
        assert_eq!(
            cuda_ids(DeviceIds::Index, &plan(&[3]), &inventory, Some(&rule)).unwrap(),
            ["1"]
        );
    }
}
