//! `orch run JOB.toml` and the quick form `orch run --gpus N … -- CMD ARGS…`: plan and claim in
//! one atomic lease transaction, run the command on exactly its devices, release.

use super::{load_inventory, plan::policy_host};
use crate::cli::RunArgs;
use crate::failure::{CmdResult, Failure};
use orch_core::job::{self, JobSpec};
use orch_devices::InventorySpec;
use orch_runner::{
    Control, Outcome, PlaceError, Placement, ProcessOptions, Ready, RunError, placed_line,
};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

pub fn run(spec: &InventorySpec, args: &RunArgs) -> CmdResult {
    let job = match &args.job {
        Some(path) => job::read(path).map_err(Failure::bad_input)?,
        None => super::quick::job("run", &args.quick, &args.command)?,
    };
    // Dependencies are kept by whoever queues the job (the daemon, Slurm): inside their runs
    // they were met already; a run typed at a shell starts now, and says so.
    if !job.depends.is_empty() && std::env::var_os("SLURM_JOB_ID").is_none() {
        eprintln!(
            "orch: note: {}: after_ok, after_any, after_failed and singleton are kept by `orch submit` (the daemon, or Slurm with --slurm); `orch run` starts the job now",
            job.path.display()
        );
    }
    // A job across machines runs as one `orch run` per node inside a Slurm allocation.
    let cluster = if job.resources.nodes > 1 {
        let var = |name: &str| std::env::var(name).ok();
        match orch_slurm::cluster_from_env(&var, &orch_slurm::command::hostnames) {
            Some(Ok(cluster)) => Some(cluster),
            Some(Err(e)) => {
                return Err(Failure::bad_input_msg(format!(
                    "{}: {e}",
                    job.path.display()
                )));
            }
            None => {
                return Err(Failure::bad_input_msg(format!(
                    "{}: nodes = {} needs a Slurm allocation of that many nodes: submit it with `orch submit --slurm`, which runs one `orch run` per node",
                    job.path.display(),
                    job.resources.nodes
                )));
            }
        }
    } else {
        None
    };
    // On a machine with a daemon (the machine's, or one ORCH_SERVER names) the lease is the
    // daemon's to give; the job still runs here. Inside an orch job (ORCH_JOB_ID) the claim is
    // among the job's own devices, as before.
    let nested = std::env::var_os("ORCH_JOB_ID").is_some();
    let authority = (!nested)
        .then(orch_leases::find_daemon)
        .filter(|d| d.found.is_authority());
    if !job.sweep.is_empty() && authority.is_some() {
        return Err(Failure::bad_input_msg(format!(
            "{}: on a machine with an orch daemon a [sweep] runs as jobs of its queue: submit it with `orch submit {}`",
            job.path.display(),
            job.path.display()
        )));
    }
    match (job.sweep.is_empty(), args.sweep_task) {
        (true, None) => run_one(spec, args, job, cluster, authority),
        (true, Some(_)) => Err(Failure::bad_input_msg(format!(
            "--sweep-task: {} has no [sweep]",
            job.path.display()
        ))),
        (false, Some(task)) => {
            let one = job.sweep_task(task).ok_or_else(|| {
                Failure::bad_input_msg(format!(
                    "--sweep-task {task}: the sweep of {} has {} task(s), numbered from 0",
                    job.path.display(),
                    job.sweep.len()
                ))
            })?;
            run_one(spec, args, one, cluster, authority)
        }
        // Locally, the sweep's tasks run one after another; the first failure is the exit status.
        (false, None) => {
            let mut first_failure = None;
            for task in 0..job.sweep.len() {
                let Some(one) = job.sweep_task(task) else {
                    break;
                };
                let params: Vec<String> = job
                    .sweep
                    .task(task)
                    .unwrap_or_default()
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect();
                println!(
                    "sweep task {}/{}: {}",
                    task + 1,
                    job.sweep.len(),
                    params.join(" ")
                );
                if let Err(e) = run_one(spec, args, one, cluster.clone(), None) {
                    eprintln!("orch: sweep task {task}: {}", e.render());
                    first_failure.get_or_insert(e);
                }
                // A stop asked of a `[train]` sweep ends it here: the tasks left do not start.
                if StopSignals::asked() {
                    if task + 1 < job.sweep.len() {
                        eprintln!(
                            "orch: stopped on a signal: sweep tasks {}..{} did not run",
                            task + 1,
                            job.sweep.len() - 1
                        );
                    }
                    break;
                }
            }
            first_failure.map_or(Ok(()), Err)
        }
    }
}

/// One job (one task of a sweep): placed, run, released; its lease from `authority`, the
/// daemon that hands out this machine's devices, when there is one.
fn run_one(
    spec: &InventorySpec,
    args: &RunArgs,
    job: JobSpec,
    cluster: Option<orch_exec::Cluster>,
    authority: Option<orch_leases::DaemonSocket>,
) -> CmdResult {
    let timeout = args.timeout.as_deref().map(parse_duration).transpose()?;
    let deadline = args
        .wait
        .then(|| Instant::now() + timeout.unwrap_or(Duration::MAX / 4));
    if let Some(daemon) = authority {
        let text = lease_text(args, &job)?;
        let prepared = orch_runner::prepare(&job, args.resume, Some(crate::progress::sink()))
            .map_err(run_failure)?;
        let client = crate::client::Client::at(daemon.path)?;
        let granted =
            super::granted::lease(client, &job, text, &job.path, args.wait, deadline, None)?;
        orch_runner::check_enforcement(&job, granted.inventory.backend)
            .map_err(Failure::bad_input_msg)?;
        tracing::info!(
            "{}",
            placed_line(
                &job,
                granted.placement.lease.lease(),
                &granted.placement.plan,
                &granted.inventory
            )
        );
        return finish(
            &job,
            prepared,
            granted.placement,
            &granted.inventory,
            cluster,
        );
    }
    // Before the inventory is read: the refusal names the daemon, whatever NVML says here.
    orch_runner::may_claim_here(spec).map_err(Failure::failed_msg)?;
    let inventory = load_inventory(spec)?;
    orch_runner::check_enforcement(&job, inventory.backend).map_err(Failure::bad_input_msg)?;
    // A [train] job's plugin and data are read before the lease: bad input fails at once.
    let prepared = orch_runner::prepare(&job, args.resume, Some(crate::progress::sink()))
        .map_err(run_failure)?;
    let placement = place_here(&job, &inventory, deadline)?;
    finish(&job, prepared, placement, &inventory, cluster)
}

/// Places `job` on this machine's devices from the lease store, waiting for a fit until
/// `deadline` when there is one.
pub(super) fn place_here(
    job: &JobSpec,
    inventory: &orch_devices::Inventory,
    deadline: Option<Instant>,
) -> Result<Placement, Failure> {
    let mut host = policy_host()?;
    let claimed =
        orch_runner::claim_here(&mut host, job, inventory, deadline).map_err(|e| match e {
            PlaceError::NoFit(reason) => {
                Failure::failed_msg(format!("{reason} (add --wait to wait for a fit)"))
            }
            other => run_failure(RunError::Place(other)),
        })?;
    let placement = claimed.placement;
    tracing::info!(
        "{}",
        placed_line(job, placement.lease.lease(), &placement.plan, inventory)
    );
    Ok(placement)
}

/// Runs the placed job to its end; the lease goes back as it ends. A `[train]` job stops with a
/// checkpoint on SIGTERM and its warning signal.
fn finish(
    job: &JobSpec,
    prepared: orch_runner::Prepared<'_>,
    placement: Placement,
    inventory: &orch_devices::Inventory,
    cluster: Option<orch_exec::Cluster>,
) -> CmdResult {
    let stop = match &prepared {
        orch_runner::Prepared::Train(_) => Some(StopSignals::register(job)?),
        orch_runner::Prepared::Command(_) => None,
    };
    let ended = orch_runner::run_placed(
        job,
        Ready::Prepared(prepared),
        placement,
        inventory,
        &run_options(job, cluster),
        Control {
            stop: stop.as_ref().map(|s| Arc::clone(&s.requested)),
            ..Control::default()
        },
    )
    .release();
    if let Ok(Outcome::Train(summary)) = &ended
        && summary.stopped_early
        && let Some(signal) = stop.and_then(|s| s.received())
    {
        return Err(stopped_on(job, summary, signal));
    }
    conclude(job, ended)
}

/// `orch __train`: another user's daemon `[train]` job, run as that user in the process its
/// supervisor started as a command job's (the user's ids, the job's cgroup, device rule, CPUs,
/// environment and logs), on the daemon's placement from the supervisor's spec.json. Nothing is
/// placed or read again; the lease is the supervisor's. SIGTERM and the job's warning signal
/// stop the trainer at the end of its step with a checkpoint, as they stop `orch run`.
pub fn train_child(spec_fd: i32, dir: &std::path::Path) -> CmdResult {
    let orch_serve::supervisor::ChildTrain {
        job,
        placement,
        inventory,
        grace,
    } = orch_serve::supervisor::child_train(spec_fd, dir).map_err(Failure::failed_msg)?;
    let stop = StopSignals::register(&job)?;
    // A run queued again (preempted, or after a crash) goes on from its checkpoint.
    let resume = matches!(&job.work, job::Work::Train(t) if orch_core::checkpoint::exists(&t.out));
    let progress = crate::progress::lines(Box::new(std::io::stdout()));
    let prepared = orch_runner::prepare(&job, resume, Some(progress)).map_err(run_failure)?;
    let ended = orch_runner::run_placed(
        &job,
        Ready::Prepared(prepared),
        placement,
        &inventory,
        &ProcessOptions {
            grace,
            ..ProcessOptions::default()
        },
        Control {
            stop: Some(Arc::clone(&stop.requested)),
            ..Control::default()
        },
    );
    // The supervisor gives the lease back once it recorded the end.
    let outcome = match ended.lease {
        Some(lease) => {
            lease.keep();
            ended.outcome
        }
        None => ended.outcome,
    };
    if let Ok(Outcome::Train(summary)) = &outcome
        && summary.stopped_early
        && let Some(signal) = stop.received()
    {
        return Err(Failure {
            code: u8::try_from(128 + signal).unwrap_or(1),
            error: anyhow::anyhow!(
                "{}",
                orch_runner::stopped_sentence(
                    &job.name,
                    summary,
                    signal,
                    orch_serve::supervisor::AGAIN
                )
            ),
        });
    }
    conclude(&job, outcome)
}

/// How `orch run` starts a job's processes: in this terminal, signals forwarded.
fn run_options(job: &JobSpec, cluster: Option<orch_exec::Cluster>) -> ProcessOptions {
    ProcessOptions {
        cluster,
        grace: job.stopping.grace_or_default(),
        ..ProcessOptions::default()
    }
}

/// Starts the placed job in this terminal, with its devices' environment.
pub(super) fn start_job<'a>(
    job: &JobSpec,
    prepared: orch_runner::Prepared<'a>,
    placement: Placement,
    inventory: &orch_devices::Inventory,
    cluster: Option<orch_exec::Cluster>,
) -> Result<orch_runner::RunningJob<'a>, Failure> {
    orch_runner::start(
        job,
        prepared,
        placement,
        inventory,
        &run_options(job, cluster),
    )
    .map_err(run_failure)
}

/// What orch says and exits with once the job ended (its lease given back).
pub(super) fn conclude(job: &JobSpec, ended: Result<Outcome, RunError>) -> CmdResult {
    match ended.map_err(run_failure)? {
        Outcome::Command(outcome) if !outcome.success() => Err(Failure {
            code: outcome.code(),
            error: anyhow::anyhow!("job {} ended with {outcome}", job.name),
        }),
        _ => Ok(()),
    }
}

/// A `[train]` job's stop request: SIGTERM or the job's warning signal (`[job] signal`) makes
/// the trainer stop at the end of its current step with a checkpoint; the same signal a second
/// time ends the process at once (another one does not: a warning and then SIGTERM at the time
/// limit leave the trainer its grace period). One request for the whole process: the handlers
/// are registered once, and a local sweep stops at the task it was in.
struct StopSignals {
    requested: Arc<AtomicBool>,
    /// The signal that came last (0: none yet).
    which: Arc<AtomicUsize>,
}

/// The process's stop request, the signal that came last, and the signals whose handlers set
/// them.
type StopState = (
    Arc<AtomicBool>,
    Arc<AtomicUsize>,
    std::sync::Mutex<Vec<i32>>,
);
static STOP: std::sync::LazyLock<StopState> = std::sync::LazyLock::new(Default::default);

impl StopSignals {
    fn register(job: &JobSpec) -> Result<StopSignals, Failure> {
        let (requested, which, registered) = &*STOP;
        let mut registered = orch_core::sync::lock(registered);
        let mut signals = vec![libc::SIGTERM];
        signals.extend(job.stopping.signal.map(|s| s.number));
        for signal in signals {
            if registered.contains(&signal) {
                continue;
            }
            // Set by this signal alone: it ends the process the second time it comes.
            let again = Arc::new(AtomicBool::new(false));
            let done = signal_hook::flag::register_conditional_default(signal, Arc::clone(&again))
                .and_then(|_| signal_hook::flag::register(signal, again))
                .and_then(|_| {
                    signal_hook::flag::register_usize(signal, Arc::clone(which), signal as usize)
                })
                .and_then(|_| signal_hook::flag::register(signal, Arc::clone(requested)));
            done.map_err(|e| Failure::failed_msg(format!("cannot handle signal {signal}: {e}")))?;
            registered.push(signal);
        }
        Ok(StopSignals {
            requested: Arc::clone(requested),
            which: Arc::clone(which),
        })
    }

    /// Whether this process was asked to stop (by a signal whose handler is registered).
    fn asked() -> bool {
        STOP.0.load(Ordering::Acquire)
    }

    fn received(&self) -> Option<i32> {
        if !self.requested.load(Ordering::Acquire) {
            return None;
        }
        i32::try_from(self.which.load(Ordering::Acquire))
            .ok()
            .filter(|&s| s > 0)
    }
}

/// A `[train]` run stopped on `signal` with its checkpoint: exit status 128 + N, as a process
/// that signal ended, and the sentence of how to go on.
fn stopped_on(job: &JobSpec, summary: &orch_trainer::Summary, signal: i32) -> Failure {
    let again = format!("`orch run --resume {}` goes on from it", job.path.display());
    Failure {
        code: u8::try_from(128 + signal).unwrap_or(1),
        error: anyhow::anyhow!(
            "{}",
            orch_runner::stopped_sentence(&job.name, summary, signal, &again)
        ),
    }
}

pub(super) fn run_failure(e: RunError) -> Failure {
    if e.is_bad_input() {
        Failure::bad_input(e)
    } else {
        Failure::failed(e)
    }
}

/// The job text the daemon is sent for the lease: the job file as written, or the quick form's
/// flags as the job file they stand for. The daemon starts nothing for a lease: it places the
/// job's resources under its policy, and this process runs the work.
fn lease_text(args: &RunArgs, job: &JobSpec) -> Result<String, Failure> {
    let Some(path) = &args.job else {
        return Ok(super::quick::job_text(job));
    };
    std::fs::read_to_string(path)
        .map_err(|e| Failure::bad_input_msg(format!("cannot read {}: {e}", path.display())))
}

/// `--timeout`: a positive duration (`90s`, `15m`, `2h`).
fn parse_duration(text: &str) -> Result<Duration, Failure> {
    flag_duration("--timeout", text)
}

/// A flag's positive duration (`90s`, `15m`, `2h`).
pub(super) fn flag_duration(flag: &str, text: &str) -> Result<Duration, Failure> {
    orch_core::duration::parse(text).ok_or_else(|| {
        Failure::bad_input_msg(format!(
            "{flag}: expected a positive duration such as 90s, 15m or 2h, found \"{text}\""
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("90s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("15m").unwrap(), Duration::from_secs(900));
        assert_eq!(parse_duration("1h 30m").unwrap(), Duration::from_secs(5400));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("3").unwrap(), Duration::from_secs(3));
        for bad in ["", "s", "10 parsecs", "-1s", "0", "0s"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }
}
