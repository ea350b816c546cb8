//! Running a placed job, command or trainer: the one path `orch run` (on a machine, or as one
//! node's run inside a Slurm allocation) and the daemon's supervisor both take once a job holds
//! its devices.
//!
//! A command job's processes are started with its confinement (cgroup, device rule, CPU binding,
//! user, capped logs: [`crate::start`]). A trainer runs in this process when this process is the
//! job's user's own (`orch run`; a supervisor running its own user's job): in a supervisor
//! ([`Ready::InJob`]) it gets the same confinement a started process would, applied to this
//! process ([`orch_exec::current`]): this process joins the job's cgroup (and its device rule),
//! the calling thread is bound to the job's CPUs, the trainer's progress lines go to the job's
//! capped stdout log and this process's stderr (its warnings) to the job's stderr log. All of it
//! is undone once the trainer ended, before the caller records the end.
//!
//! Another user's trainer never runs in a process with root's ids: it runs in a process of its
//! own ([`Ready::InJob::child`], `orch __train`), started as a command job's process is, with
//! the user's ids in full, so neither a cache of compiled code the user controls nor a memory
//! bug in the trainer's host can act as root.

use crate::command::ProcessOptions;
use crate::error::RunError;
use crate::place::LeaseGuard;
use crate::runner::{Outcome, Placement, Prepared};
use crate::stop::{JobStopper, Overdue, TrainStopper};
use orch_core::job::{CommandSpec, JobSpec, Launch, Work};
use orch_devices::Inventory;
use orch_exec::current::{CgroupStay, LogCopy, LogWriter, StderrTaken};
use orch_exec::devices::{DeviceConstraint, DeviceJoin};
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
    /// data in this process when the job's user is this process's own, else in its `child`,
    /// started as the job's user. The daemon's supervisor.
    InJob {
        /// Go on from the checkpoint in the job's output folder.
        resume: bool,
        /// The trainer's progress, as lines on its stdout.
        progress: ProgressLines,
        /// The command of the process that runs the trainer instead of this one (`orch __train
        /// DIR`), started as a command job's process is (the job's user, cgroup, device rule,
        /// CPUs, environment, logs, stop signals): a job whose user is not this process's.
        child: Option<Vec<String>>,
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
            run_started(job, prepared, placement, inventory, options, watch)
        }
        // Another user's trainer: in a process of its own, started as that user.
        (
            Work::Train(_),
            Ready::InJob {
                child: Some(argv), ..
            },
        ) => {
            let command = CommandSpec {
                argv,
                env: Default::default(),
                launch: Launch::Single,
                device_ids: None,
            };
            run_started(
                job,
                Prepared::Command(command),
                placement,
                inventory,
                options,
                watch,
            )
        }
        (Work::Train(_), ready) => {
            let requested = stop.unwrap_or_default();
            let stopper = TrainStopper::new(Arc::clone(&requested), options.grace, overdue);
            // Before the trainer loads: a stop asked for meanwhile still ends in a checkpoint.
            if let Some(watch) = watch {
                watch(JobStopper::Train(stopper.clone()));
            }
            if let (Ready::InJob { .. }, Some(credentials)) = (&ready, &options.credentials)
                && !is_own_user(credentials.uid)
            {
                return failed(
                    RunError::Device(format!(
                        "job {}: the trainer of user {}'s job runs in a process of its own, started as that user, never in this one",
                        job.name, credentials.uid
                    )),
                    Some(placement.lease),
                );
            }
            let mut home = None;
            // A panic in the trainer (or its host) ends the run as a failure with its sentence:
            // the caller still records the end, and the job's cgroup is left (`Home`'s drop).
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                let prepared = match ready {
                    Ready::Prepared(prepared) => Ok(prepared),
                    Ready::InJob {
                        resume, progress, ..
                    } => match Home::enter(job, &placement, inventory, options) {
                        Ok(entered) => {
                            let sink = progress(entered.stdout());
                            let cache = cache_dir(options.base_env.as_deref());
                            home = Some(entered);
                            crate::train::prepare_in(job, resume, Some(sink), cache)
                        }
                        Err(e) => Err(e),
                    },
                };
                prepared.and_then(|mut prepared| {
                    prepared.stop_when(Arc::clone(&requested));
                    let devices = crate::train::granted(job, &placement.plan, inventory)?;
                    match prepared {
                        Prepared::Train(trainer) => trainer.run(&devices).map_err(RunError::from),
                        Prepared::Command(_) => Err(RunError::BadInput(format!(
                            "{}: a [command] job was prepared for a [train] job",
                            job.path.display()
                        ))),
                    }
                })
            }))
            .unwrap_or_else(|panic| {
                Err(RunError::Device(format!(
                    "job {}: the trainer ended on an internal error ({}); this is a bug in orch, please report it",
                    job.name,
                    panic_text(panic.as_ref())
                )))
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

/// The variables a trainer run in this process reads as a command job's process would get them:
/// the job's device variables (`CUDA_VISIBLE_DEVICES` naming its devices, `CUDA_DEVICE_ORDER`,
/// `ORCH_JOB_ID`, the frameworks' memory variables) and, from its environment
/// (`options.base_env`), the thread count (`RAYON_NUM_THREADS`), CUDA's own variables and the
/// compiled-component cache's size. A caller sets them in its own environment before it starts
/// a thread (a supervisor: at its start); `Err` (bad input) when the job's `device_ids` cannot
/// name a granted device.
pub fn trainer_env(
    job: &JobSpec,
    placement: &Placement,
    inventory: &Inventory,
    options: &ProcessOptions,
) -> Result<Vec<(String, String)>, RunError> {
    let reads = |name: &str| {
        name == "RAYON_NUM_THREADS"
            || name.starts_with("CUDA_")
            || name == orch_host::CACHE_SIZE_ENV
    };
    let mut vars: Vec<(String, String)> = options
        .base_env
        .iter()
        .flatten()
        .filter(|(name, _)| reads(name))
        .cloned()
        .collect();
    let confined = orch_exec::devices::detected().is_ok();
    let spec = crate::command::launch_spec(
        job,
        &CommandSpec {
            argv: Vec::new(),
            env: Default::default(),
            launch: Launch::Single,
            device_ids: None,
        },
        placement.lease.lease(),
        &placement.plan,
        inventory,
        options,
        crate::command::Confinement {
            rule: confined
                .then(|| crate::command::device_rule(&placement.plan, inventory))
                .flatten(),
            granted_names: placement.granted_names.clone(),
            ..Default::default()
        },
    )
    .map_err(RunError::BadInput)?;
    vars.extend(orch_exec::process_env(&spec.job, None, 0));
    Ok(vars)
}

/// Starts a placed job's processes and waits for them.
fn run_started(
    job: &JobSpec,
    prepared: Prepared<'_>,
    placement: Placement,
    inventory: &Inventory,
    options: &ProcessOptions,
    watch: Option<Box<dyn FnOnce(JobStopper) + '_>>,
) -> Ended {
    let running = match crate::start(job, prepared, placement, inventory, options) {
        Ok(running) => running,
        Err(e) => {
            return Ended {
                outcome: Err(e),
                lease: None,
                usage: CgroupUsage::default(),
            };
        }
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

/// Whether `uid` is this process's effective user id.
fn is_own_user(uid: u32) -> bool {
    // SAFETY: geteuid takes nothing and cannot fail.
    unsafe { libc::geteuid() == uid }
}

/// What a panic said, when it said it in words.
fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic".to_string())
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
/// [`Home::leave`] (or its drop, on a panic) in reverse order.
struct Home {
    stdout: Option<(LogWriter, LogCopy)>,
    stderr: Option<(StderrTaken, LogWriter, LogCopy)>,
    cgroup: Option<JobCgroup>,
    devices: Option<DeviceConstraint>,
    stay: Option<CgroupStay>,
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
            stderr: None,
            cgroup: None,
            devices: None,
            stay: None,
        };
        // On an error, the drop undoes what was done.
        home.fill(job, placement, inventory, options)?;
        Ok(home)
    }

    fn fill(
        &mut self,
        job: &JobSpec,
        placement: &Placement,
        inventory: &Inventory,
        options: &ProcessOptions,
    ) -> Result<(), RunError> {
        let home = self;
        if let StdioMode::Files {
            stdout,
            stderr,
            cap,
        } = &options.stdio
        {
            let log = LogWriter::open(stdout, *cap)
                .map_err(|e| RunError::Device(format!("cannot open {}: {e}", stdout.display())))?;
            home.stdout = Some(log);
            let (writer, copy) = LogWriter::open(stderr, *cap)
                .map_err(|e| RunError::Device(format!("cannot open {}: {e}", stderr.display())))?;
            // The trainer's warnings (tracing's lines on stderr) go to the job's stderr log.
            let taken = writer.take_stderr().map_err(|e| {
                RunError::Device(format!(
                    "cannot send the trainer's stderr to {}: {e}",
                    stderr.display()
                ))
            })?;
            home.stderr = Some((taken, writer, copy));
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
        let join = home.devices.as_ref().and_then(DeviceConstraint::join);
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
                // The device rule is on that cgroup: outside it, the trainer would open every GPU.
                Err(e) if matches!(join, Some(DeviceJoin::JobCgroup)) => {
                    return Err(RunError::Device(format!(
                        "job {}: cannot join its cgroup {}, which holds its device rule: {e}; the trainer does not run unconfined (ORCH_DEVICE_CONSTRAINT=off runs jobs unconfined)",
                        job.name,
                        cgroup.path().display()
                    )));
                }
                Err(e) => tracing::warn!(
                    "job {}: the trainer runs outside its cgroup ({}): {e}",
                    job.name,
                    cgroup.path().display()
                ),
            }
        }
        if let Some(DeviceJoin::DevicesCgroup(dir)) = &join {
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
    fn leave(mut self) -> CgroupUsage {
        self.undo()
    }

    fn undo(&mut self) -> CgroupUsage {
        if let Some(stay) = self.stay.take()
            && let Err(e) = stay.leave()
        {
            tracing::warn!("cannot leave the job's cgroup: {e}");
        }
        if let Some(devices) = self.devices.take() {
            devices.lift();
        }
        let cgroup = self.cgroup.take();
        let usage = cgroup.as_ref().map(JobCgroup::usage).unwrap_or_default();
        drop(cgroup);
        if let Some((taken, writer, copy)) = self.stderr.take() {
            drop(taken);
            drop(writer);
            copy.finish(COPY_PATIENCE);
        }
        if let Some((writer, copy)) = self.stdout.take() {
            drop(writer);
            copy.finish(COPY_PATIENCE);
        }
        usage
    }
}

impl Drop for Home {
    fn drop(&mut self) {
        self.undo();
    }
}
