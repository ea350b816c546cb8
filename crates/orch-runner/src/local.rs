//! A job that holds devices on this machine by itself, with no daemon: the quick job that the
//! command line's flags (`orch run --gpus N … -- CMD`) and the Python package's keywords
//! (`orch.lease(gpus=N, …)`) describe, and the claim both make in this machine's lease store.
//! Each caller checks its own input and names its own flags or keywords in its sentences; what
//! the checked values become, and how the claim is made, is decided here once.

use crate::place::{LeaseGuard, Machine, PlaceError};
use crate::runner::Placement;
use orch_core::job::{CommandSpec, CpuBind, JobSpec, PluginRef, PolicySpec, Resources, Stopping};
use orch_core::{ByteSize, Location};
use orch_devices::{Inventory, InventorySpec, Visibility, VisibilityEnv};
use orch_host::PolicyHost;
use orch_leases::LeaseStore;
use std::path::PathBuf;
use std::time::Instant;

/// A quick job's checked values.
#[derive(Debug, Clone)]
pub struct QuickJob {
    /// What the job's errors name as its file: `command line`, `orch.lease()`.
    pub origin: String,
    /// The working folder: relative paths resolve there.
    pub dir: PathBuf,
    pub name: String,
    pub tenant: Option<String>,
    pub priority: i64,
    pub gpus: u32,
    pub min_free_memory: Option<ByteSize>,
    pub max_utilization: Option<u32>,
    pub memory_limit: Option<ByteSize>,
    pub exclusive: bool,
    pub cpu_bind: Option<CpuBind>,
    /// The MIG profile asked for (`--mig`, `mig=`): `gpus` slices of it.
    pub mig: Option<String>,
    pub policy: PluginRef,
    pub config: Vec<(String, String)>,
    pub stopping: Stopping,
    pub command: CommandSpec,
}

impl QuickJob {
    /// The job these values describe, as a job file with the same keys would.
    pub fn job(self) -> JobSpec {
        let at = Location {
            file: PathBuf::from(&self.origin),
            line: 0,
            column: 0,
        };
        JobSpec {
            path: PathBuf::from(&self.origin),
            dir: self.dir,
            name: self.name,
            tenant: self.tenant,
            priority: self.priority,
            max_runtime: None,
            requeue: false,
            preemptible: false,
            tags: Vec::new(),
            stopping: self.stopping,
            slurm: Default::default(),
            sweep: Default::default(),
            depends: Default::default(),
            resources: Resources {
                gpus: self.gpus,
                nodes: 1,
                gpus_at: at.clone(),
                min_free_memory: self.min_free_memory,
                max_utilization: self.max_utilization,
                memory_limit: self.memory_limit,
                exclusive: self.exclusive,
                enforce_memory_limit: false,
                cpu_bind: self.cpu_bind,
                mig: self.mig,
            },
            policy: PolicySpec {
                plugin: self.policy,
                plugin_at: at,
                config: self.config,
                limits: Default::default(),
            },
            work: orch_core::job::Work::Command(self.command),
        }
    }
}

/// Whether this process may claim devices of the inventory `spec` by itself: inside an orch job
/// (`ORCH_JOB_ID`) among the job's own devices; elsewhere, real GPUs that the machine's daemon
/// owns are its to lease (`Err`: the sentence that says so). Asked before the inventory is read,
/// so the refusal names the daemon whatever NVML says.
pub fn may_claim_here(spec: &InventorySpec) -> Result<(), String> {
    if std::env::var_os("ORCH_JOB_ID").is_some() {
        return Ok(());
    }
    orch_leases::refuse_local_claim(spec.may_be_real())
}

/// A claim made by this process in this machine's lease store.
#[derive(Debug)]
pub struct Claimed {
    pub placement: Placement,
    /// What the visibility rules noted (a `CUDA_VISIBLE_DEVICES` entry that names no device).
    pub notes: Vec<String>,
}

/// Claims `job`'s devices for this process in the lease store of its state folder: the devices
/// it may see (`CUDA_VISIBLE_DEVICES`, Slurm's grant), the policy inside the lease transaction,
/// this process the holder; inside an orch job, among that job's devices. With a `deadline`, a
/// claim that does not fit is tried again until it does or the deadline passes.
pub fn claim_here(
    host: &mut PolicyHost,
    job: &JobSpec,
    inventory: &Inventory,
    deadline: Option<Instant>,
) -> Result<Claimed, PlaceError> {
    let visibility = Visibility::resolve(&inventory.devices, &VisibilityEnv::from_process());
    // Compile (or load from the disk cache) the policy before the lease transaction, so the
    // store's write lock is held for the decision only. An error here resurfaces, with its
    // location in the job file, from the plan inside the claim.
    let _ = host.load(&job.policy.plugin);
    let env = |name: &str| std::env::var(name).ok();
    let machine = Machine {
        inventory,
        visibility: &visibility,
        env: &env,
        nested: true,
    };
    let state_dir = orch_leases::default_state_dir();
    let mut store = LeaseStore::open(&state_dir)?;
    let (lease, plan) = crate::place::claim_until(&mut store, host, job, &machine, deadline)?;
    Ok(Claimed {
        placement: Placement {
            lease: LeaseGuard::new(state_dir, lease),
            plan,
            granted_names: None,
        },
        notes: visibility.notes,
    })
}
