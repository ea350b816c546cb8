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
/// the CPUs orch may use. Empty when the job is not bound: `cpu_bind = "none"`, the CPU
/// inventory, or a GPU whose place is unknown (said at warning level when the job asked for
/// `numa`, at debug level for the default). Each binding is said at info level (`orch run -v`).
pub fn cpu_bindings(
    job: &JobSpec,
    launch: Launch,
    plan: &Plan,
    inventory: &Inventory,
) -> Vec<Option<CpuBinding>> {
    if inventory.backend == Backend::Cpu || job.resources.cpu_bind == Some(CpuBind::None) {
        return Vec::new();
    }
    let asked = job.resources.cpu_bind == Some(CpuBind::Numa);
    let host = HostCpus::read();
    let devices: Vec<(u32, Option<&Device>)> = plan
        .chosen
        .iter()
        .map(|c| (c.physical_index, c.in_inventory(inventory)))
        .collect();
    let groups: Vec<Vec<(u32, Option<&Device>)>> = match launch {
        Launch::PerDevice => devices.into_iter().map(|d| vec![d]).collect(),
        Launch::Single => vec![devices],
    };
    let per_rank = launch == Launch::PerDevice;
    let mut out = Vec::with_capacity(groups.len());
    for (slot, group) in groups.iter().enumerate() {
        let who = if per_rank {
            format!("job {} rank {slot}", job.name)
        } else {
            format!("job {}", job.name)
        };
        let near = group
            .iter()
            .try_fold(CpuList::default(), |acc, (index, d)| {
                near_cpus(*d, &host)
                    .map(|cpus| acc.union(&cpus))
                    .ok_or(*index)
            });
        let binding = match near {
            Err(index) => {
                let why = format!(
                    "{who}: not bound to CPUs: the NUMA node and CPUs of GPU {index} are not known"
                );
                if asked {
                    tracing::warn!("{why}");
                } else {
                    tracing::debug!("{why}");
                }
                None
            }
            Ok(near) => match host.binding(&near) {
                Ok(binding) => {
                    tracing::info!("{who}: bound to {binding}");
                    Some(binding)
                }
                Err(why) => {
                    tracing::warn!("{who}: not bound to CPUs: {why}");
                    None
                }
            },
        };
        out.push(binding);
    }
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
            visible
                .iter()
                .position(|d| d.uuid == chosen.uuid)
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
