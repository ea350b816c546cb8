//! Running a placed job, command or trainer: the one path `orch run` (on a machine, or as one
//! node's run inside a Slurm allocation) and the daemon's supervisor both take once a job holds
//! its devices.
//!
//! A command job's processes are started with its confinement (cgroup, device rule, CPU binding,
//! user, capped logs: [`crate::start`]). A trainer runs in this process. In a supervisor
//! ([`Ready::InJob`]) it gets the same confinement a started process would, applied to this
//! process ([`orch_exec::current`]): this process joins the job's cgroup (and its device rule),
//! the calling thread is bound to the job's CPUs and acts as the job's user before the trainer
//! reads anything or starts a thread, and the trainer's progress lines go to the job's capped
//! log. All of it is undone once the trainer ended, before the caller records the end.

use crate::command::ProcessOptions;
use crate::error::RunError;
use crate::place::LeaseGuard;
use crate::runner::{Outcome, Placement, Prepared};
use crate::stop::{JobStopper, Overdue, TrainStopper};
use orch_core::job::{JobSpec, Launch, Work};
use orch_devices::Inventory;
use orch_exec::current::{CgroupStay, Impersonation, LogCopy, LogWriter};
use orch_exec::devices::DeviceConstraint;
use orch_exec::{CgroupUsage, JobCgroup, StdioMode};
use orch_trainer::ProgressSink;
use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

/// Turns a trainer's stdout into the sink of its progress events (the CLI's lines).
pub type ProgressLines = fn(Box<dyn Write + Send>) -> ProgressSink;

/// What a placed job runs.
#[derive(Debug)]
pub enum Ready<'a> {
    /// Made ready before the lease was taken ([`crate::prepare`]): `orch run`.
    Prepared(Prepared<'a>),
    /// Made ready here, after the placement, inside the job's confinement: a trainer reads its
    /// data as the job's user. The daemon's supervisor.
    InJob {
        /// Go on from the checkpoint in the job's output folder.
        resume: bool,
        /// The trainer's progress, as lines on its stdout.
        progress: ProgressLines,
    },
}

/// How the caller watches a running job.
#[derive(Default)]
pub struct Control<'c> {
    /// A trainer's stop request, when the caller has one already (`orch run`'s signal handlers).
    pub stop: Option<Arc<AtomicBool>>,
    /// Handed the job's stopper once the job started (a trainer: before it loads).
    pub watch: Option<Box<dyn FnOnce(JobStopper) + 'c>>,
    /// A trainer asked to stop that outlives its grace period (see [`Overdue`]).
    pub overdue: Option<Overdue>,
}

impl std::fmt::Debug for Control<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Control")
            .field("stop", &self.stop)
            .field("watch", &self.watch.is_some())
            .field("overdue", &self.overdue.is_some())
            .finish()
    }
}

/// How a placed job ended, and its lease, still held: a caller that records the end durably
/// releases it afterwards ([`Ended::release`] otherwise).
#[derive(Debug)]
pub struct Ended {
    pub outcome: Result<Outcome, RunError>,
    /// `None` when the job could not start (its lease then went with it).
    pub lease: Option<LeaseGuard>,
    /// What the job's cgroup counted of its work (empty without one).
    pub usage: CgroupUsage,
}

impl Ended {
    /// Releases the lease and returns how the job ended.
    pub fn release(self) -> Result<Outcome, RunError> {
        if let Some(lease) = self.lease {
            lease.release();
        }
        self.outcome
    }
}

/// Runs `job` on its `placement` to its end.
pub fn run_placed<'a>(
    job: &'a JobSpec,
    ready: Ready<'a>,
    placement: Placement,
    inventory: &Inventory,
    options: &ProcessOptions,
    control: Control<'_>,
) -> Ended {
    let failed = |outcome: RunError, lease: Option<LeaseGuard>| Ended {
        outcome: Err(outcome),
        lease,
        usage: CgroupUsage::default(),
    };
    if let Err(e) = crate::command::check_enforcement(job, inventory.backend) {
        return failed(RunError::BadInput(e), Some(placement.lease));
    }
    let Control {
        stop,
        watch,
        overdue,
    } = control;
    match (&job.work, ready) {
        (Work::Command(_), ready) => {
            let prepared = match ready {
                Ready::Prepared(prepared) => prepared,
                Ready::InJob { .. } => match crate::prepare(job, false, None) {
                    Ok(prepared) => prepared,
                    Err(e) => return failed(e, Some(placement.lease)),
                },
            };
            let running = match crate::start(job, prepared, placement, inventory, options) {
                Ok(running) => running,
                Err(e) => return failed(e, None),
            };
            if let (Some(watch), Some(stopper)) = (watch, running.stopper()) {
                watch(JobStopper::Command(stopper));
            }
            let (outcome, lease, usage) = running.wait_measured();
            Ended {
                outcome,
                lease: Some(lease),
                usage,
            }
        }
        (Work::Train(_), ready) => {
            let requested = stop.unwrap_or_default();
            let stopper = TrainStopper::new(Arc::clone(&requested), options.grace, overdue);
            // Before the trainer loads: a stop asked for meanwhile still ends in a checkpoint.
            if let Some(watch) = watch {
                watch(JobStopper::Train(stopper.clone()));
            }
            let mut home = None;
            let prepared = match ready {
                Ready::Prepared(prepared) => Ok(prepared),
                Ready::InJob { resume, progress } => {
                    match Home::enter(job, &placement, inventory, options) {
                        Ok(entered) => {
                            let sink = progress(entered.stdout());
                            let cache = cache_dir(options.base_env.as_deref());
                            home = Some(entered);
                            crate::train::prepare_in(job, resume, Some(sink), cache)
                        }
                        Err(e) => Err(e),
                    }
                }
            };
            let result = prepared.and_then(|mut prepared| {
                prepared.stop_when(Arc::clone(&requested));
                let devices = crate::train::granted(job, &placement.plan, inventory)?;
                match prepared {
                    Prepared::Train(trainer) => trainer.run(&devices).map_err(RunError::from),
                    Prepared::Command(_) => Err(RunError::BadInput(format!(
                        "{}: a [command] job was prepared for a [train] job",
                        job.path.display()
                    ))),
                }
            });
            let usage = home.map(Home::leave).unwrap_or_default();
            let outcome = match (result, stopper.finished()) {
                (Ok(summary), Some(cause)) if summary.stopped_early || cause.reason.is_some() => {
                    Ok(Outcome::TrainStopped {
                        summary: Some(summary),
                        cause,
                    })
                }
                (Ok(summary), _) => Ok(Outcome::Train(summary)),
                // Stopped from outside and failed on the way (say, by the deadline of the step it
                // was stopped in): stopped, as a command job's processes killed at a cancel are.
                (Err(_), Some(cause)) if cause.reason.is_some() => Ok(Outcome::TrainStopped {
                    summary: None,
                    cause,
                }),
                (Err(e), _) => Err(e),
            };
            Ended {
                outcome,
                lease: Some(placement.lease),
                usage,
            }
        }
    }
}

/// The compiled-component cache of the job's user: the one `orch run` would use in the job's
/// environment (`ORCH_CACHE_DIR`, `XDG_CACHE_HOME`, `HOME`); `None`: this process's own.
fn cache_dir(env: Option<&[(String, String)]>) -> Option<std::path::PathBuf> {
    let env = env?;
    let get = |name: &str| {
        env.iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    };
    if let Some(dir) = get(orch_host::CACHE_DIR_ENV) {
        return Some(std::path::PathBuf::from(dir));
    }
    if let Some(xdg) = get("XDG_CACHE_HOME").filter(|v| !v.is_empty()) {
        return Some(std::path::Path::new(xdg).join("orch"));
    }
    get("HOME")
        .filter(|v| !v.is_empty())
        .map(|home| std::path::Path::new(home).join(".cache").join("orch"))
}

/// This process made the home of a trainer's run: what [`Home::enter`] did, undone by
/// [`Home::leave`] in reverse order.
struct Home {
    stdout: Option<(LogWriter, LogCopy)>,
    cgroup: Option<JobCgroup>,
    devices: Option<DeviceConstraint>,
    stay: Option<CgroupStay>,
    user: Option<Impersonation>,
}

/// How long the end of a trainer's run waits for its output to reach its log.
const COPY_PATIENCE: Duration = Duration::from_secs(5);

impl Home {
    fn enter(
        job: &JobSpec,
        placement: &Placement,
        inventory: &Inventory,
        options: &ProcessOptions,
    ) -> Result<Home, RunError> {
        let mut home = Home {
            stdout: None,
            cgroup: None,
            devices: None,
            stay: None,
            user: None,
        };
        match home.fill(job, placement, inventory, options) {
            Ok(()) => Ok(home),
            Err(e) => {
                home.leave();
                Err(e)
            }
        }
    }

    fn fill(
        &mut self,
        job: &JobSpec,
        placement: &Placement,
        inventory: &Inventory,
        options: &ProcessOptions,
    ) -> Result<(), RunError> {
        let home = self;
        if let StdioMode::Files { stdout, cap, .. } = &options.stdio {
            let log = LogWriter::open(stdout, *cap)
                .map_err(|e| RunError::Device(format!("cannot open {}: {e}", stdout.display())))?;
            home.stdout = Some(log);
        }
        let lease = placement.lease.lease();
        home.cgroup = JobCgroup::create(&lease.id);
        home.devices = crate::command::confine(
            &lease.id,
            &placement.plan,
            inventory,
            home.cgroup.as_ref(),
        )
        .map_err(|e| {
            RunError::Device(format!(
                "cannot confine the job to its GPUs: {e}; ORCH_DEVICE_CONSTRAINT=off runs jobs unconfined"
            ))
        })?;
        let binding = crate::bind::cpu_bindings(job, Launch::Single, &placement.plan, inventory)
            .into_iter()
            .next()
            .flatten();
        if let Some(cgroup) = &home.cgroup {
            if let Some(binding) = &binding {
                orch_exec::cpuset::fence(cgroup.path(), &binding.cpus);
            }
            match orch_exec::current::join_cgroup(cgroup.path()) {
                Ok(stay) => home.stay = Some(stay),
                Err(e) => tracing::warn!(
                    "job {}: the trainer runs outside its cgroup ({}): {e}",
                    job.name,
                    cgroup.path().display()
                ),
            }
        }
        if let Some(orch_exec::devices::DeviceJoin::DevicesCgroup(dir)) =
            home.devices.as_ref().and_then(DeviceConstraint::join)
        {
            std::fs::write(dir.join("cgroup.procs"), std::process::id().to_string()).map_err(
                |e| {
                    RunError::Device(format!(
                        "cannot join the devices cgroup {}: {e}",
                        dir.display()
                    ))
                },
            )?;
        }
        if let Some(binding) = &binding
            && let Err(e) = orch_exec::current::bind_this_thread(binding)
        {
            return Err(RunError::Device(format!(
                "job {}: cannot bind the trainer to {binding}: {e}",
                job.name
            )));
        }
        if let Some(credentials) = &options.credentials {
            home.user = Some(
                orch_exec::current::impersonate_this_thread(credentials).map_err(|e| {
                    RunError::Device(format!(
                        "cannot act as user {} for the trainer: {e}",
                        credentials.uid
                    ))
                })?,
            );
        }
        Ok(())
    }

    /// Where the trainer's progress lines go: the job's stdout log, else this process's stdout.
    fn stdout(&self) -> Box<dyn Write + Send> {
        match &self.stdout {
            Some((writer, _)) => Box::new(writer.clone()),
            None => Box::new(std::io::stdout()),
        }
    }

    /// Undoes [`Home::enter`] and returns what the job's cgroup counted.
    fn leave(self) -> CgroupUsage {
        let Home {
            stdout,
            cgroup,
            devices,
            stay,
            user,
        } = self;
        if let Some(user) = user
            && let Err(e) = user.end()
        {
            tracing::warn!("cannot take root's ids back after the trainer: {e}");
        }
        if let Some(stay) = stay
            && let Err(e) = stay.leave()
        {
            tracing::warn!("cannot leave the job's cgroup: {e}");
        }
        if let Some(devices) = devices {
            devices.lift();
        }
        let usage = cgroup.as_ref().map(JobCgroup::usage).unwrap_or_default();
        drop(cgroup);
        if let Some((writer, copy)) = stdout {
            drop(writer);
            copy.finish(COPY_PATIENCE);
        }
        usage
    }
}
