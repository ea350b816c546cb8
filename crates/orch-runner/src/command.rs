//! A `[command]` job's launch: the environment its processes get, the GPU nodes they may open,
//! and the memory watch.

use crate::plan::Plan;
use orch_core::ByteSize;
use orch_core::job::{CommandSpec, DeviceIds, JobSpec, Launch};
use orch_devices::{Backend, Inventory};
use orch_exec::devices::{DeviceConstraint, DeviceRule, Mechanism};
use orch_exec::{
    AssignedDevice, JobCgroup, JobEnv, LaunchSpec, MemoryWatch, Monitor, ProcessMemory, Verdict,
};
use orch_leases::Lease;
use std::time::Duration;

/// Between SIGTERM and SIGKILL when a job's processes are stopped, unless the job sets its own
/// (`[job] grace`).
pub const GRACE: Duration = orch_core::job::DEFAULT_GRACE;

/// How the job's processes run, beyond what the job file says.
#[derive(Debug, Clone)]
pub struct ProcessOptions {
    pub stdio: orch_exec::StdioMode,
    pub credentials: Option<orch_exec::Credentials>,
    /// The environment to start from (the daemon passes its client's); `None`: orch's own.
    pub base_env: Option<Vec<(String, String)>>,
    /// The working folder; `None`: the job file's folder.
    pub cwd: Option<std::path::PathBuf>,
    /// Forward the signals orch receives to the job (`orch run`).
    pub forward_signals: bool,
    pub grace: Duration,
    /// This node's place when the job spans several machines (Slurm).
    pub cluster: Option<orch_exec::Cluster>,
    /// How `CUDA_VISIBLE_DEVICES` names the GPUs when the job does not say (a tenant's
    /// default); `None`: UUIDs.
    pub device_ids: Option<DeviceIds>,
}

impl Default for ProcessOptions {
    fn default() -> Self {
        ProcessOptions {
            stdio: orch_exec::StdioMode::Inherit,
            credentials: None,
            base_env: None,
            cwd: None,
            forward_signals: true,
            grace: GRACE,
            cluster: None,
            device_ids: None,
        }
    }
}

/// Where a job's processes start: its own cgroup, and how they take on its device rule.
#[derive(Debug, Default)]
pub(crate) struct Confinement {
    pub(crate) cgroup: Option<std::path::PathBuf>,
    pub(crate) devices: Option<orch_exec::devices::DeviceJoin>,
    /// The device rule the processes are held to (they see only the GPUs it does not deny).
    pub(crate) rule: Option<DeviceRule>,
    /// The names the daemon that granted the lease gave the devices ([`crate::Placement`]).
    pub(crate) granted_names: Option<Vec<String>>,
}

/// The launch of `command` on `plan`; `Err` (bad input) when its `device_ids` cannot name a
/// granted device.
pub(crate) fn launch_spec(
    job: &JobSpec,
    command: &CommandSpec,
    lease: &Lease,
    plan: &Plan,
    inventory: &Inventory,
    options: &ProcessOptions,
    confinement: Confinement,
) -> Result<LaunchSpec, String> {
    if command.launch == Launch::Single
        && let Some(why) = crate::slices::single_launch_problem(plan)
    {
        return Err(format!("{}: {why}", job.path.display()));
    }
    let mut env = JobEnv {
        cluster: options.cluster.clone(),
        ..job_env(job, &command.env, lease, plan, inventory)
    };
    let ids = command
        .device_ids
        .or(options.device_ids)
        .unwrap_or(DeviceIds::Uuid);
    if inventory.backend != Backend::Cpu {
        let here = match ids {
            DeviceIds::Index => {
                match crate::bind::cuda_ids(ids, plan, inventory, confinement.rule.as_ref()) {
                    Ok(names) => Some(names),
                    // A default (the tenant's) is a preference: where indices cannot name the
                    // devices (MIG instances), the job keeps UUIDs. Only the job's own
                    // `device_ids = "index"` is refused.
                    Err(e) if command.device_ids.is_none() => {
                        tracing::info!(
                            "{}: named by UUID, not by the default's CUDA index: {e}",
                            job.path.display()
                        );
                        None
                    }
                    Err(e) => return Err(format!("{}: {e}", job.path.display())),
                }
            }
            DeviceIds::Uuid => None,
        };
        // The daemon that granted the lease confined this process itself, unseen here, and
        // applied its tenant's default: its names are the ones CUDA will go by.
        let granted = confinement
            .granted_names
            .filter(|names| names.len() == env.devices.len());
        for (device, name) in env
            .devices
            .iter_mut()
            .zip(granted.or(here).unwrap_or_default())
        {
            device.cuda_id = name;
        }
    }
    Ok(LaunchSpec {
        cpu_binding: crate::bind::cpu_bindings(job, command.launch, plan, inventory),
        argv: command.argv.clone(),
        // A job file's command runs in the job's folder, where its relative paths resolve.
        cwd: Some(options.cwd.clone().unwrap_or_else(|| job.dir.clone())),
        job: env,
        per_device: command.launch == Launch::PerDevice,
        grace: options.grace,
        stdio: options.stdio.clone(),
        credentials: options.credentials.clone(),
        base_env: options.base_env.clone(),
        cgroup: confinement.cgroup,
        devices: confinement.devices,
        forward_signals: options.forward_signals,
        warning_signal: job.stopping.signal.map(|s| s.number),
    })
}

/// The GPU nodes a job on `plan` may not open: those of every GPU it was not granted (by minor
/// number; see [`DeviceRule::for_grant`] for GPUs whose node is unknown). `None` on the CPU
/// inventory, and where no GPU's node is known.
pub fn device_rule(plan: &Plan, inventory: &Inventory) -> Option<DeviceRule> {
    if inventory.backend == Backend::Cpu {
        return None;
    }
    let granted: Vec<Option<u32>> = plan
        .chosen
        .iter()
        .map(|chosen| chosen.in_inventory(inventory).and_then(|d| d.minor_number))
        .collect();
    let known: Vec<u32> = inventory
        .devices
        .iter()
        .filter_map(|d| d.minor_number)
        .collect();
    let rule = DeviceRule::for_grant(&granted, &known);
    match crate::slices::denied_caps(plan, inventory) {
        Some((major, caps)) => Some(
            rule.unwrap_or_else(|| DeviceRule::denying(&[]))
                .with_caps(major, &caps),
        ),
        None => rule,
    }
}

/// Confines the job of lease `lease_id` on `plan` to its GPUs' nodes, where orch runs as root and
/// the machine has a mechanism (said once per process, at debug level); `Ok(None)` when nothing is
/// confined. A mechanism that is there but fails stops the job: it would otherwise run on every
/// GPU. Its v1 devices cgroup is `orch-job-LEASE`, as its v2 cgroup is.
pub(crate) fn confine(
    lease_id: &str,
    plan: &Plan,
    inventory: &Inventory,
    cgroup: Option<&JobCgroup>,
) -> Result<Option<DeviceConstraint>, String> {
    static SAID: std::sync::Once = std::sync::Once::new();
    let detected = orch_exec::devices::detected();
    SAID.call_once(|| match detected {
        Ok(mechanism) => {
            tracing::debug!("jobs may open only their granted GPUs' device nodes ({mechanism})")
        }
        Err(why) => tracing::debug!("jobs are not confined to their GPUs' device nodes: {why}"),
    });
    let Some(rule) = device_rule(plan, inventory) else {
        return Ok(None);
    };
    let Ok(mechanism) = detected else {
        return Ok(None);
    };
    if let Some(problem) = crate::slices::caps_problem(plan, inventory) {
        return Err(format!("lease {lease_id}: {problem}"));
    }
    if *mechanism == Mechanism::Bpf && cgroup.is_none() {
        tracing::warn!(
            "lease {lease_id}: not confined to its GPUs' device nodes: the device program needs the job's own cgroup, and it has none (ORCH_CGROUPS=off?)"
        );
        return Ok(None);
    }
    let name = orch_exec::devices::job_name(lease_id);
    let constraint =
        DeviceConstraint::prepare(mechanism, &name, cgroup.map(JobCgroup::path), &rule)?;
    tracing::debug!("lease {lease_id}: the job may not open the GPU nodes {rule}");
    Ok(Some(constraint))
}

fn job_env(
    job: &JobSpec,
    extra: &std::collections::BTreeMap<String, String>,
    lease: &Lease,
    plan: &Plan,
    inventory: &Inventory,
) -> JobEnv {
    let assigned = plan
        .chosen
        .iter()
        .map(|chosen| {
            let device = chosen.in_inventory(inventory);
            // The kind comes from the inventory: NVML and simulated GPUs are named to CUDA by
            // UUID; the CPU device is no CUDA device at all.
            let is_gpu = inventory.backend != Backend::Cpu;
            AssignedDevice {
                cuda_id: if is_gpu {
                    chosen.uuid.clone()
                } else {
                    String::new()
                },
                memory_total_bytes: device.and_then(|d| d.memory_total_bytes),
            }
        })
        .collect();
    JobEnv {
        job_id: lease.id.clone(),
        devices: assigned,
        memory_limit_bytes: job.resources.memory_limit.map(ByteSize::bytes),
        exclusive: job.resources.exclusive,
        extra: extra.clone(),
        cluster: None,
    }
}

/// The device variables of a process that holds `lease` itself (a Python program that leased
/// its own devices): exactly those `orch run` gives a single-process job on the same lease
/// (`CUDA_VISIBLE_DEVICES` with UUIDs, `CUDA_DEVICE_ORDER`, `ORCH_JOB_ID`, the frameworks'
/// memory variables).
pub fn lease_env(
    job: &JobSpec,
    lease: &Lease,
    plan: &Plan,
    inventory: &Inventory,
) -> std::collections::BTreeMap<String, String> {
    let env = job_env(job, &Default::default(), lease, plan, inventory);
    orch_exec::process_env(&env, None, 0)
}

/// [`lease_env`] with the GPUs named as `ids` says, for a holder held to `rule` (the device
/// rule the daemon put on it, if any): `Err` when `ids` cannot name a granted device (a MIG
/// slice by index).
pub fn lease_env_named(
    job: &JobSpec,
    lease: &Lease,
    plan: &Plan,
    inventory: &Inventory,
    ids: DeviceIds,
    rule: Option<&DeviceRule>,
) -> Result<std::collections::BTreeMap<String, String>, String> {
    let mut env = job_env(job, &Default::default(), lease, plan, inventory);
    if inventory.backend != Backend::Cpu {
        let names = crate::bind::cuda_ids(ids, plan, inventory, rule)?;
        for (device, name) in env.devices.iter_mut().zip(names) {
            device.cuda_id = name;
        }
    }
    Ok(orch_exec::process_env(&env, None, 0))
}

/// On real GPUs with a `memory_limit`, watches the job's processes' memory (NVML's per-process
/// readings) every two seconds: an excess is reported, and with `enforce_memory_limit` the job is
/// stopped. Simulated and CPU devices have no per-process readings to watch.
pub(crate) fn memory_monitor(job: &JobSpec, plan: &Plan, backend: Backend) -> Option<Monitor> {
    let limit = job.resources.memory_limit?.bytes();
    if backend != Backend::Nvml {
        return None;
    }
    let devices = plan.chosen.iter().map(|d| d.uuid.clone()).collect();
    let mut watch = MemoryWatch::new(devices, limit, job.resources.enforce_memory_limit);
    let mut told = false;
    Some(Monitor {
        interval: Duration::from_secs(2),
        check: Box::new(move |pids| {
            let devices = match orch_devices::nvml::read() {
                Ok(devices) => devices,
                Err(e) => {
                    if !std::mem::replace(&mut told, true) {
                        tracing::warn!(
                            "the memory watch cannot read NVML ({e}): the job's GPU memory is not watched until it can"
                        );
                    }
                    return Verdict::Continue;
                }
            };
            let readings: Vec<ProcessMemory> = devices
                .iter()
                .flat_map(|d| {
                    d.processes.iter().flatten().filter_map(|p| {
                        Some(ProcessMemory {
                            device_uuid: d.uuid.clone(),
                            pid: p.pid,
                            used_bytes: p.used_memory_bytes?,
                        })
                    })
                })
                .collect();
            watch.check(pids, &readings)
        }),
    })
}

/// The line `orch run` prints once the job holds its devices.
pub fn placed_line(job: &JobSpec, lease: &Lease, plan: &Plan, inventory: &Inventory) -> String {
    let kind = if inventory.backend == Backend::Cpu {
        "device"
    } else {
        "GPU"
    };
    let devices: Vec<String> = plan
        .chosen
        .iter()
        .map(|d| {
            if d.uuid.starts_with("MIG-") {
                // Slices of one GPU may share their uuids' first digits: the whole uuid.
                return format!("a MIG slice of GPU {} ({})", d.physical_index, d.uuid);
            }
            format!(
                "{kind} {} ({})",
                d.physical_index,
                d.uuid.chars().take(12).collect::<String>()
            )
        })
        .collect();
    format!(
        "job {}: lease {} on {} by {}: {}",
        job.name,
        lease.id,
        devices.join(", "),
        plan.policy,
        plan.reason
    )
}

/// A job that asks for `enforce_memory_limit` where it cannot be enforced is refused: only NVML
/// reports what each process uses on a GPU.
pub fn check_enforcement(job: &JobSpec, backend: Backend) -> Result<(), String> {
    if job.resources.enforce_memory_limit
        && matches!(job.work, orch_core::job::Work::Command(_))
        && backend != Backend::Nvml
    {
        return Err(format!(
            "{}: enforce_memory_limit = true needs NVML's per-process GPU memory, which the {} inventory does not have; remove it (memory_limit is still reserved and passed on), or run on a GPU machine",
            job.path.display(),
            backend.as_str()
        ));
    }
    Ok(())
}
