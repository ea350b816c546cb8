//! The job lifecycle as a library: prepare → place (lease) → start → wait or stop → release.
//! `orch run` drives it in one process; the daemon places jobs itself and hands each to a
//! supervisor process that runs it ([`crate::run_placed`]).

use crate::command::{Confinement, ProcessOptions, launch_spec, memory_monitor};
use crate::error::RunError;
use crate::place::LeaseGuard;
use crate::plan::Plan;
use orch_core::job::{CommandSpec, JobSpec, Work};
use orch_devices::Inventory;
use orch_exec::devices::DeviceConstraint;
use orch_exec::{CgroupUsage, ExitOutcome, JobCgroup, Launched, Monitor, Stopper};
use orch_leases::Holder;
use orch_trainer::{GrantedDevice, Summary};

/// What a job runs once it holds its lease, made ready before the lease is taken.
#[derive(Debug)]
pub enum Prepared<'a> {
    Command(CommandSpec),
    Train(Box<orch_trainer::Prepared<'a>>),
}

impl Prepared<'_> {
    /// A `[train]` job stops at the end of the step in which `flag` is set, with a checkpoint
    /// (`orch run` sets it on SIGTERM and the job's warning signal); a command job has its
    /// signals itself.
    pub fn stop_when(&mut self, flag: std::sync::Arc<std::sync::atomic::AtomicBool>) {
        if let Prepared::Train(prepared) = self {
            prepared.stop_when(flag);
        }
    }
}

/// Reads what the job needs before any device is leased: a trainer is read, compiled and
/// checked and its data loaded, so bad input fails at once and leased devices never wait. A
/// trainer's progress events go to `progress`.
pub fn prepare(
    job: &JobSpec,
    resume: bool,
    progress: Option<orch_trainer::ProgressSink>,
) -> Result<Prepared<'_>, RunError> {
    match &job.work {
        Work::Command(_) if resume => Err(RunError::BadInput(format!(
            "{}: --resume is for [train] jobs",
            job.path.display()
        ))),
        Work::Command(command) => Ok(Prepared::Command(command.clone())),
        Work::Train(_) => crate::train::prepare(job, resume, progress),
    }
}

/// A placed job: its lease (released when this is dropped) and the plan that chose it.
#[derive(Debug)]
pub struct Placement {
    pub lease: LeaseGuard,
    pub plan: Plan,
    /// What `CUDA_VISIBLE_DEVICES` names the devices by, as the daemon that granted the lease
    /// says (it confined this process to them, so its CUDA indices are the ones that hold);
    /// `None`: decided here.
    pub granted_names: Option<Vec<String>>,
}

/// How a job ended.
#[derive(Debug)]
pub enum Outcome {
    Command(ExitOutcome),
    Train(Summary),
    /// A trainer this process ran, stopped from outside ([`crate::JobStopper`]) at the end of a
    /// step with its checkpoint (`summary`; `None` when it failed on the way).
    TrainStopped {
        summary: Option<Summary>,
        cause: crate::stop::StopCause,
    },
}

impl Outcome {
    pub fn success(&self) -> bool {
        match self {
            Outcome::Command(exit) => exit.success(),
            Outcome::Train(_) => true,
            Outcome::TrainStopped { .. } => false,
        }
    }

    /// The exit status a process reporting this job should end with.
    pub fn code(&self) -> u8 {
        match self {
            Outcome::Command(exit) => exit.code(),
            Outcome::Train(_) => 0,
            Outcome::TrainStopped { cause, .. } => u8::try_from(128 + cause.signal).unwrap_or(1),
        }
    }
}

/// A started job. Dropping it without [`RunningJob::wait`] still releases the lease.
#[derive(Debug)]
pub struct RunningJob<'a> {
    placement: Placement,
    work: Running<'a>,
}

// One value per running job, never moved in a hot path: boxing the command's half buys nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
enum Running<'a> {
    Command {
        launched: Launched,
        monitor: Option<Monitor>,
        // Kept until the job's processes are gone; removed on drop, the device rule first.
        devices: Option<DeviceConstraint>,
        cgroup: Option<JobCgroup>,
    },
    Train {
        prepared: Box<orch_trainer::Prepared<'a>>,
        devices: Vec<GrantedDevice>,
    },
}

/// Starts the prepared job on its placement. Every process of a command job is recorded as a
/// holder of the lease, with its process group and, where orch may create one, the job's own
/// cgroup: the lease lives as long as any process of the job, whatever happens to orch.
pub fn start<'a>(
    job: &JobSpec,
    prepared: Prepared<'a>,
    placement: Placement,
    inventory: &Inventory,
    options: &ProcessOptions,
) -> Result<RunningJob<'a>, RunError> {
    crate::command::check_enforcement(job, inventory.backend).map_err(RunError::BadInput)?;
    let work = match prepared {
        Prepared::Command(command) => {
            let lease = placement.lease.lease();
            let cgroup = JobCgroup::create(&lease.id);
            let cgroup_path = cgroup.as_ref().map(|c| c.path().to_path_buf());
            // As root, the job's processes may open only its GPUs' device nodes.
            let devices = crate::command::confine(
                &lease.id,
                &placement.plan,
                inventory,
                cgroup.as_ref(),
            )
            .map_err(|e| {
                RunError::Device(format!(
                    "cannot confine the job to its GPUs: {e}; ORCH_DEVICE_CONSTRAINT=off runs jobs unconfined"
                ))
            })?;
            // The cgroup holds the lease from the moment the first process joins it, even if
            // this process dies before it records that process.
            if cgroup_path.is_some() {
                placement
                    .lease
                    .add_holder(Holder::current().with_cgroup(cgroup_path.clone()));
            }
            let join = devices.as_ref().and_then(DeviceConstraint::join);
            let spec = launch_spec(
                job,
                &command,
                lease,
                &placement.plan,
                inventory,
                options,
                Confinement {
                    cgroup: cgroup_path.clone(),
                    rule: join
                        .is_some()
                        .then(|| crate::command::device_rule(&placement.plan, inventory))
                        .flatten(),
                    devices: join,
                    granted_names: placement.granted_names.clone(),
                },
            )
            .map_err(RunError::BadInput)?;
            // Where the job's cgroup has the cpuset controller, it fences the bound CPUs too
            // (all ranks' together; each rank's affinity is its own within them). A rank left
            // unbound runs unbound: then nothing is fenced.
            if let Some(dir) = &cgroup_path
                && !spec.cpu_binding.is_empty()
                && spec.cpu_binding.iter().all(Option::is_some)
            {
                let bound = spec
                    .cpu_binding
                    .iter()
                    .flatten()
                    .fold(orch_core::CpuList::default(), |all, b| all.union(&b.cpus));
                orch_exec::cpuset::fence(dir, &bound);
            }
            let launched = orch_exec::start(&spec, |pid| {
                if let Some(holder) = Holder::of_group_leader(pid) {
                    placement
                        .lease
                        .add_holder(holder.with_cgroup(cgroup_path.clone()));
                }
            })?;
            Running::Command {
                launched,
                monitor: memory_monitor(job, &placement.plan, inventory.backend),
                devices,
                cgroup,
            }
        }
        Prepared::Train(prepared) => Running::Train {
            devices: crate::train::granted(job, &placement.plan, inventory)?,
            prepared,
        },
    };
    Ok(RunningJob { placement, work })
}

impl RunningJob<'_> {
    /// Stops a command job from another thread (a cancel, a time limit). Trainers run in this
    /// process and stop with it.
    pub fn stopper(&self) -> Option<Stopper> {
        match &self.work {
            Running::Command { launched, .. } => Some(launched.stopper()),
            Running::Train { .. } => None,
        }
    }

    /// The process groups of a command job's processes.
    pub fn process_groups(&self) -> Vec<u32> {
        match &self.work {
            Running::Command { launched, .. } => launched.process_groups(),
            Running::Train { .. } => Vec::new(),
        }
    }

    pub fn plan(&self) -> &Plan {
        &self.placement.plan
    }

    /// Runs the job to its end and releases the lease once nothing of it is left.
    pub fn wait(self) -> Result<Outcome, RunError> {
        let (outcome, lease) = self.wait_holding_lease();
        lease.release();
        outcome
    }

    /// Runs the job to its end and hands back its lease, still held: a caller that must record
    /// the outcome durably first (the daemon's supervisor) releases it afterwards, so that no
    /// moment exists in which the devices are free and the outcome unknown.
    pub fn wait_holding_lease(self) -> (Result<Outcome, RunError>, LeaseGuard) {
        let (outcome, lease, _) = self.wait_measured();
        (outcome, lease)
    }

    /// [`RunningJob::wait_holding_lease`], with what the job's cgroup counted of its processes
    /// (read once they are gone, before the cgroup is removed; empty without a cgroup).
    pub fn wait_measured(self) -> (Result<Outcome, RunError>, LeaseGuard, CgroupUsage) {
        let RunningJob { placement, work } = self;
        let mut usage = CgroupUsage::default();
        let outcome = match work {
            Running::Command {
                launched,
                monitor,
                devices,
                cgroup,
            } => {
                let exit = launched.wait(monitor);
                if let Some(cgroup) = &cgroup {
                    usage = cgroup.usage();
                }
                drop(devices);
                drop(cgroup);
                Ok(Outcome::Command(exit))
            }
            Running::Train { prepared, devices } => prepared
                .run(&devices)
                .map(Outcome::Train)
                .map_err(RunError::from),
        };
        (outcome, placement.lease, usage)
    }
}
