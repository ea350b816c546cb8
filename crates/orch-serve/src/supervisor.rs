//! The per-job supervisor: a small process the daemon starts for each job (as slurmstepd and
//! containerd's shims are), which starts the job's processes as its user, waits for them and
//! writes their exit status to the job's folder. It does not die with the daemon, so a restarted
//! daemon adopts the job again and still learns how it ended.
//!
//! It runs the job on the daemon's placement as `spec.json` carries it (lease, plan, inventory),
//! through [`orch_runner::run_placed`], so the job is placed once. A `[train]` job's trainer runs
//! in this process when the job's user is this process's own (root's own job; a daemon run by a
//! user for themself): in its cgroup, on its CPUs, with its environment. Another user's trainer
//! runs in `orch __train` ([`child_train`]), started as that user as a command job's process is:
//! a process with root's ids never runs a user's trainer.
//!
//! The job folder and its files (`STATE/jobs/ID-ATTEMPT/`, root's alone when the daemon is
//! root) are [`crate::core::folders`]: this process reads `spec.json`, takes the fence, and writes
//! `exit.json` once every process of the job is gone and its lease released. It uses the daemon's
//! core only (the job's row and state), never its HTTP side.

use crate::core::folders::{
    CANCELLED, ExitRecord, Fence, IDLE, IDLE_SIGNAL, PREEMPT_SIGNAL, PREEMPTED, SuperviseSpec,
    TIME_LIMIT, take_fence, write_exit,
};
use orch_core::job;
use orch_exec::{Credentials, ExitOutcome, StdioMode};
use orch_leases::Holder;
use orch_runner::{
    Control, JobStopper, LeaseGuard, Outcome, Overdue, Placement, ProcessOptions, ProgressLines,
    Ready, StopCause,
};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// A line in the supervisor's log (`supervisor.log`, its stderr as it started: while a trainer
/// runs here, its stderr is the job's log). Never a panic: on a full disk the line is lost, and
/// the supervisor goes on.
macro_rules! note {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        match OWN_LOG.get() {
            Some(mut log) => {
                let _ = writeln!(log, $($arg)*);
            }
            None => {
                let _ = writeln!(std::io::stderr(), $($arg)*);
            }
        }
    }};
}

/// The supervisor's log: its stderr when it started, kept apart from fd 2.
static OWN_LOG: std::sync::OnceLock<std::fs::File> = std::sync::OnceLock::new();

/// Keeps this process's stderr as it is now as the supervisor's log ([`note!`]).
fn keep_own_log() {
    use std::os::fd::AsFd;
    if let Ok(fd) = std::io::stderr().as_fd().try_clone_to_owned() {
        let _ = OWN_LOG.set(std::fs::File::from(fd));
    }
}

/// Writes `exit.json`, trying again every second until it succeeds: a supervisor that gave up
/// would leave a finished job with no record, which the daemon would have to call lost. While it
/// waits it still holds the job's lease, so the devices are not handed to another job.
fn write_exit_until_done(dir: &Path, mut record: ExitRecord) {
    let mut logged = false;
    loop {
        match write_exit(dir, &record) {
            Ok(()) => {
                if logged {
                    note!("orch supervisor: {}/exit.json written", dir.display());
                }
                return;
            }
            Err(e) => {
                if !logged {
                    note!(
                        "orch supervisor: cannot write {}/exit.json ({e}); trying again every second",
                        dir.display()
                    );
                    logged = true;
                }
                let past = crate::core::health::fault_of_io(&e)
                    .map_or("could not be written", |f| f.past());
                record.late = Some(format!("the state folder {past}: exit record written late"));
                std::thread::sleep(Duration::from_secs(1));
            }
        }
    }
}

/// The supervisor's whole life; returns its exit status. `progress` writes a `[train]` job's
/// progress as lines into its stdout log (the CLI's lines).
pub fn supervise(dir: &Path, progress: ProgressLines) -> i32 {
    keep_own_log();
    let spec: SuperviseSpec = match std::fs::read_to_string(dir.join("spec.json"))
        .map_err(|e| e.to_string())
        .and_then(|t| serde_json::from_str(&t).map_err(|e| e.to_string()))
    {
        Ok(spec) => spec,
        Err(e) => {
            note!(
                "orch supervisor: cannot read {}/spec.json: {e}",
                dir.display()
            );
            return 2;
        }
    };
    // A cancel is SIGTERM to the supervisor; the handler is in place before the fence names this
    // process, so a cancel that comes early waits for the job instead of killing the supervisor.
    let signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGINT,
        PREEMPT_SIGNAL,
        IDLE_SIGNAL,
    ]);
    let me = Fence {
        supervisor: Some(Holder::current()),
    };
    match take_fence(dir, &me) {
        Ok(true) => {}
        Ok(false) => {
            note!(
                "orch supervisor: job {} was fenced off before it started",
                spec.job_id
            );
            return 3;
        }
        Err(e) => {
            note!(
                "orch supervisor: cannot write {}/started: {e}",
                dir.display()
            );
            return 2;
        }
    }
    let (record, lease) = run(dir, &spec, signals.ok(), progress);
    // The exit record first, the lease after: a supervisor killed in between leaves a finished
    // job with its record (the daemon then frees the devices), never free devices and no record
    // (which would make a finished job lost, or run it again with `requeue`).
    write_exit_until_done(dir, record);
    if let Some(lease) = lease {
        lease.release();
    }
    0
}

fn run(
    dir: &Path,
    spec: &SuperviseSpec,
    signals: Option<signal_hook::iterator::Signals>,
    progress: ProgressLines,
) -> (ExitRecord, Option<LeaseGuard>) {
    let failed = |reason: String| ExitRecord {
        state: crate::core::db::State::Failed,
        exit_code: None,
        reason: Some(reason),
        ended_at_ms: orch_core::time::now_ms(),
        late: None,
    };
    let lease = LeaseGuard::new(spec.state_dir.clone(), spec.lease.clone());
    // Until this process holds the lease, only the daemon does; if the daemon died meanwhile, the
    // lease may have been reclaimed and its devices handed to another job: then this job must not
    // start on them. It goes back to the queue instead (it never ran).
    if let Err(e) = lease.join(Holder::current()) {
        lease.keep();
        let record = ExitRecord {
            state: crate::core::db::State::Queued,
            exit_code: None,
            reason: Some(format!(
                "queued again: its lease was gone before it started ({e})"
            )),
            ended_at_ms: orch_core::time::now_ms(),
            late: None,
        };
        return (record, None);
    }
    let sub = &spec.submission;
    let job = match job_of(spec) {
        Ok(job) => job,
        Err(e) => return (failed(e), None),
    };
    if let Some(asked) = job.stopping.grace
        && asked.as_secs_f64() > spec.grace_s
    {
        note!(
            "orch supervisor: the job asks for grace = \"{}\", over max_grace: it gets {} s",
            humantime::format_duration(asked),
            spec.grace_s
        );
    }
    let id = &sub.identity;
    let options = ProcessOptions {
        stdio: StdioMode::Files {
            stdout: dir.join("stdout"),
            stderr: dir.join("stderr"),
            cap: log_cap(spec),
        },
        credentials: spec.switch_user.then(|| Credentials {
            uid: id.uid,
            gid: id.gid,
            groups: id.groups.clone(),
        }),
        base_env: Some(sub.env.clone()),
        cwd: Some(PathBuf::from(&sub.cwd)),
        forward_signals: false,
        grace: Duration::from_secs_f64(spec.grace_s),
        cluster: None,
        device_ids: spec.device_ids,
    };
    // The daemon's placement, as it made it: the job is placed once.
    let placement = Placement {
        lease,
        plan: spec.plan.clone(),
        granted_names: None,
    };
    let train = matches!(job.work, job::Work::Train(_));
    // A [train] job's trainer runs in this process when the job's user is this process's own
    // (see orch_runner::run_placed): in its cgroup, on its CPUs, with its environment, its
    // progress lines in its stdout log. Another user's runs in `orch __train`, started as that
    // user as a command job's process is: never with root's ids. A run queued again (preempted,
    // or after a crash) goes on from its checkpoint.
    // SAFETY: geteuid takes nothing and cannot fail.
    let other_user = spec.switch_user && id.uid != unsafe { libc::geteuid() };
    let child = match (train, other_user) {
        (true, true) => match child_command(dir) {
            Ok(argv) => Some(argv),
            Err(e) => return (failed(e), Some(placement.lease)),
        },
        _ => None,
    };
    let in_process = train && child.is_none();
    if in_process {
        match orch_runner::trainer_env(&job, &placement, &spec.inventory, &options) {
            // SAFETY: this process is the job's alone and starts no thread before the trainer
            // (the stop watchers and the log copiers come later): nothing reads the environment
            // while it changes.
            Ok(vars) => {
                for (name, value) in vars {
                    unsafe { std::env::set_var(name, value) };
                }
            }
            Err(e) => return (failed(e.to_string()), Some(placement.lease)),
        }
    }
    let resume = in_process
        && matches!(&job.work, job::Work::Train(t) if orch_core::checkpoint::exists(&t.out));
    let overdue: Overdue = {
        let dir = dir.to_path_buf();
        Arc::new(move |cause: &StopCause| overdue_end(&dir, cause))
    };
    let max_runtime = spec.max_runtime_s.map(Duration::from_secs_f64);
    let warning = job.stopping.signal;
    let ended = orch_runner::run_placed(
        &job,
        Ready::InJob {
            resume,
            progress,
            child,
        },
        placement,
        &spec.inventory,
        &options,
        Control {
            stop: None,
            watch: Some(Box::new(move |stopper| {
                stop_when_due(stopper, signals, warning, max_runtime)
            })),
            overdue: Some(overdue),
        },
    );
    let Some(lease) = ended.lease else {
        let reason = match ended.outcome {
            Err(e) => e.to_string(),
            Ok(_) => "the job could not start".to_string(),
        };
        return (failed(reason), None);
    };
    write_usage(dir, in_process, &ended.outcome, ended.usage);
    let record = match &ended.outcome {
        // `orch __train` said why it failed as its last line on stderr, as `orch run` does.
        Ok(Outcome::Command(ExitOutcome::Exited(code))) if train && *code != 0 => ExitRecord {
            exit_code: Some(*code),
            ..failed(child_reason(dir).unwrap_or_else(|| format!("exit status {code}")))
        },
        Ok(outcome) => record_of(&job, outcome),
        // A trainer's error is the job's reason and its last line of stderr, as `orch run` says
        // it: exit status 2 for bad input, 1 otherwise.
        Err(e) if in_process => {
            let reason = sentence(e);
            append_stderr(dir, spec, &reason);
            ExitRecord {
                exit_code: Some(if e.is_bad_input() { 2 } else { 1 }),
                ..failed(reason)
            }
        }
        Err(e) => failed(e.to_string()),
    };
    if let Ok(Outcome::TrainStopped {
        summary: Some(summary),
        cause,
    }) = &ended.outcome
    {
        append_stderr(
            dir,
            spec,
            &orch_runner::stopped_sentence(&job.name, summary, cause.signal, AGAIN),
        );
    }
    (record, Some(lease))
}

/// Writes what the job's processes used, for its accounting: its cgroup's count where orch made
/// one, else the rusage of what this process waited for (a trainer run here: of this process).
/// Written before exit.json, which the daemon reads it after; a failed write costs the record
/// those figures, nothing else.
fn write_usage(
    dir: &Path,
    in_process: bool,
    outcome: &Result<Outcome, orch_runner::RunError>,
    counted: orch_exec::CgroupUsage,
) {
    let measured = if in_process {
        own_use()
    } else {
        crate::core::accounting::children_use()
    };
    let used = crate::core::accounting::ProcessUse {
        cpu_seconds: counted.cpu_seconds.or(measured.cpu_seconds),
        peak_rss_bytes: counted.peak_memory_bytes.or(measured.peak_rss_bytes),
        signal: match outcome {
            Ok(Outcome::Command(ExitOutcome::Signaled(signal))) => Some(*signal),
            _ => None,
        },
    };
    if let Err(e) = crate::core::accounting::write_use(dir, &used) {
        note!(
            "orch supervisor: cannot write {}/usage.json ({e}); the job's accounting goes without its CPU and memory",
            dir.display()
        );
    }
}

/// The job a supervisor (or its `orch __train` child) runs. An array's task runs its own
/// combination of the `[sweep]` (a `[train]` task's parameters, its folder `OUT/sweep-TASK`).
/// Its relative paths resolve against the job file's folder, and a relative job path against
/// the submitter's working folder: the supervisor works in neither.
fn job_of(spec: &SuperviseSpec) -> Result<job::JobSpec, String> {
    let sub = &spec.submission;
    let mut absolute = sub.clone();
    absolute.job_path = Path::new(&sub.cwd)
        .join(&sub.job_path)
        .to_string_lossy()
        .into_owned();
    absolute.spec()
}

/// The command of the process that runs another user's trainer: `orch __train --spec-fd N DIR`,
/// `N` this process's open `spec.json`, inherited by the child (the job folder is root's alone:
/// the user could not open it by its path).
fn child_command(dir: &Path) -> Result<Vec<String>, String> {
    use std::os::fd::IntoRawFd;
    let exe = std::env::current_exe()
        .map_err(|e| format!("cannot find the orch program to run the trainer: {e}"))?;
    let path = dir.join("spec.json");
    let file = std::fs::File::open(&path)
        .map_err(|e| format!("cannot open {} for the trainer: {e}", path.display()))?;
    // Open for this process's life: the child is started once.
    let fd = file.into_raw_fd();
    // SAFETY: `fd` is the open descriptor just taken from `file`; F_SETFD changes its flags only.
    if unsafe { libc::fcntl(fd, libc::F_SETFD, 0) } != 0 {
        return Err(format!(
            "cannot hand {} to the trainer: {}",
            path.display(),
            std::io::Error::last_os_error()
        ));
    }
    Ok(vec![
        exe.to_string_lossy().into_owned(),
        "__train".to_string(),
        "--spec-fd".to_string(),
        fd.to_string(),
        dir.to_string_lossy().into_owned(),
    ])
}

/// The sentence `orch __train` ended with: its last `orch: ` line in the job's stderr log.
fn child_reason(dir: &Path) -> Option<String> {
    use std::io::{Read as _, Seek as _};
    let mut file = std::fs::File::open(dir.join("stderr")).ok()?;
    let len = file.metadata().ok()?.len();
    file.seek(std::io::SeekFrom::Start(len.saturating_sub(8192)))
        .ok()?;
    let mut tail = Vec::new();
    file.read_to_end(&mut tail).ok()?;
    String::from_utf8_lossy(&tail)
        .lines()
        .rev()
        .find_map(|line| line.strip_prefix("orch: "))
        .map(str::to_string)
}

/// What `orch __train --spec-fd N DIR` runs: the job of the supervisor's `spec.json` (read from
/// the inherited descriptor `spec_fd`) on the daemon's placement, the typed placement and
/// inventory as the daemon made them. It runs in a process already confined as a command job's
/// (the job's user, cgroup, device rule, CPUs, environment and logs): it places nothing, reads
/// no device and holds the lease only as the supervisor's (it never releases it).
#[derive(Debug)]
pub struct ChildTrain {
    pub job: job::JobSpec,
    pub placement: Placement,
    pub inventory: orch_devices::Inventory,
    /// The job's grace period, as the supervisor has it.
    pub grace: Duration,
}

/// Reads [`ChildTrain`] from the inherited descriptor `spec_fd`.
pub fn child_train(spec_fd: i32, dir: &Path) -> Result<ChildTrain, String> {
    use std::io::Read as _;
    use std::os::fd::FromRawFd;
    if spec_fd < 3 {
        return Err(format!(
            "--spec-fd {spec_fd}: not a descriptor the supervisor hands over (3 or more)"
        ));
    }
    // SAFETY: the supervisor started this process with `spec_fd` open on its spec.json, and
    // nothing else in this process uses that number; fstat checks it is open.
    let mut stat: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(spec_fd, &mut stat) } != 0 {
        return Err(format!(
            "--spec-fd {spec_fd}: not open ({}): `orch __train` is started by a job's supervisor, not by hand",
            std::io::Error::last_os_error()
        ));
    }
    // SAFETY: as above; the file takes the descriptor over and closes it.
    let mut file = unsafe { std::fs::File::from_raw_fd(spec_fd) };
    let mut text = String::new();
    file.read_to_string(&mut text)
        .map_err(|e| format!("cannot read {}/spec.json: {e}", dir.display()))?;
    let spec: SuperviseSpec = serde_json::from_str(&text)
        .map_err(|e| format!("cannot read {}/spec.json: {e}", dir.display()))?;
    let job = job_of(&spec)?;
    let placement = Placement {
        // The supervisor holds the lease and gives it back: this process never does.
        lease: LeaseGuard::granted(spec.lease.clone(), orch_runner::GiveBack(Box::new(|_| {}))),
        plan: spec.plan.clone(),
        granted_names: None,
    };
    Ok(ChildTrain {
        job,
        placement,
        inventory: spec.inventory,
        grace: Duration::from_secs_f64(spec.grace_s),
    })
}

/// How a daemon's `[train]` job goes on after it stopped with its checkpoint.
pub const AGAIN: &str = "submitted again, the job goes on from it";

fn log_cap(spec: &SuperviseSpec) -> orch_exec::LogCap {
    orch_exec::LogCap {
        max_bytes: spec.max_log_bytes,
        reserve_bytes: spec.log_reserve_bytes,
    }
}

/// An error and its causes as one sentence, as `orch` prints an error.
fn sentence(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// Adds `orch: SENTENCE` to the job's stderr log (under its cap): the line a user reading
/// `orch logs` finds at the end of a `[train]` job that failed or stopped.
fn append_stderr(dir: &Path, spec: &SuperviseSpec, sentence: &str) {
    use std::io::Write as _;
    match orch_exec::current::LogWriter::open(&dir.join("stderr"), log_cap(spec)) {
        Ok((mut log, copy)) => {
            let _ = writeln!(log, "orch: {sentence}");
            drop(log);
            copy.finish(Duration::from_secs(5));
        }
        Err(e) => note!(
            "orch supervisor: cannot write {}/stderr: {e}",
            dir.display()
        ),
    }
}

/// A trainer asked to stop that outlived its grace period: this process cannot end the trainer
/// and go on, so it records the stop and ends, the trainer with it. Its lease
/// is left to the daemon, which frees the devices once it has read the record and no process of
/// the job is left.
fn overdue_end(dir: &Path, cause: &StopCause) {
    note!(
        "orch supervisor: the trainer did not stop within its grace period: ending it with this process"
    );
    let reason = cause.reason.clone();
    let record = match reason {
        Some(reason) => stopped_record(&reason),
        None => ExitRecord {
            state: crate::core::db::State::Failed,
            exit_code: Some(128 + libc::SIGKILL),
            reason: Some(format!("killed by signal {}", libc::SIGKILL)),
            ended_at_ms: orch_core::time::now_ms(),
            late: None,
        },
    };
    write_exit_until_done(dir, record);
    leave_job_cgroup();
    std::process::exit(0);
}

/// Moves this process out of the job's cgroup it joined for the trainer (back into the cgroup
/// it was made under) and removes that cgroup, best effort: the way out of a run that cannot end
/// in order.
fn leave_job_cgroup() {
    let pid = std::process::id();
    let leave = |own: Option<PathBuf>, prefix: &str| {
        let Some(own) = own else {
            return;
        };
        let is_job = own
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with(prefix));
        if let (true, Some(parent)) = (is_job, own.parent())
            && std::fs::write(parent.join("cgroup.procs"), pid.to_string()).is_ok()
        {
            let _ = std::fs::remove_dir(&own);
        }
    };
    leave(orch_core::process::cgroup_v2_dir(pid), "orch-job-");
    // The v1 devices cgroup of the job's device rule (`orch-job-LEASE`), where there is one.
    leave(
        orch_core::process::cgroup_v1_dir(pid, "devices"),
        "orch-job-",
    );
}

/// CPU seconds and peak resident set of this process (`getrusage(RUSAGE_SELF)`): a trainer's,
/// which ran here, where the job has no cgroup to count it.
fn own_use() -> crate::core::accounting::ProcessUse {
    // SAFETY: getrusage writes into the struct it is given, zeroed here, and reads nothing else.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return crate::core::accounting::ProcessUse::default();
    }
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    crate::core::accounting::ProcessUse {
        cpu_seconds: Some(seconds(usage.ru_utime) + seconds(usage.ru_stime)),
        // Linux counts ru_maxrss in KiB.
        peak_rss_bytes: u64::try_from(usage.ru_maxrss).ok().map(|kib| kib * 1024),
        signal: None,
    }
}

/// Stops the job when it is due: at a cancel, a preemption or an idle reclaim (the daemon's
/// signal to this process), and at its time limit; sends its warning signal before that limit.
///
/// The warning signal (`[job] signal`) goes once: `before` its time limit, or, when a cancel or
/// a preemption comes first, as the stop signal then, so a job that saves on it saves before it
/// is stopped. Every other stop signal is SIGTERM; SIGKILL follows after the grace period.
fn stop_when_due(
    stopper: JobStopper,
    signals: Option<signal_hook::iterator::Signals>,
    warning: Option<job::WarningSignal>,
    limit: Option<Duration>,
) {
    let warned = Arc::new(AtomicBool::new(false));
    // The signal that stops the job now: its warning signal when it has not had it yet.
    let stop_signal = {
        let warned = Arc::clone(&warned);
        move || match warning {
            Some(w) if !warned.swap(true, Ordering::SeqCst) => w.number,
            _ => libc::SIGTERM,
        }
    };
    if let Some(mut signals) = signals {
        let stopper = stopper.clone();
        let stop_signal = stop_signal.clone();
        std::thread::spawn(move || {
            let reason = match signals.forever().next() {
                Some(PREEMPT_SIGNAL) => PREEMPTED,
                Some(IDLE_SIGNAL) => IDLE,
                Some(_) => CANCELLED,
                None => return,
            };
            let signal = stop_signal();
            note!("orch supervisor: stopping the job ({reason}) with signal {signal}");
            stopper.stop_with(reason, signal);
        });
    }
    let Some(limit) = limit else {
        return;
    };
    if let Some(w) = warning {
        let stopper = stopper.clone();
        let warned = Arc::clone(&warned);
        std::thread::spawn(move || {
            std::thread::sleep(w.after_start(limit));
            if !warned.swap(true, Ordering::SeqCst) {
                let before = humantime::format_duration(w.before);
                if w.before >= limit {
                    note!(
                        "orch supervisor: the time limit is no longer than {before}: sending the job {} at its start",
                        w.name()
                    );
                } else {
                    note!(
                        "orch supervisor: {before} before the time limit: sending the job {}",
                        w.name()
                    );
                }
                stopper.signal(w.number);
            }
        });
    }
    std::thread::spawn(move || {
        std::thread::sleep(limit);
        stopper.stop(TIME_LIMIT);
    });
}

/// The record of a job stopped for `reason` (a cancel, a preemption, a time limit, an idle
/// reclaim).
fn stopped_record(reason: &str) -> ExitRecord {
    use crate::core::db::State;
    let (state, reason) = match reason {
        CANCELLED => (State::Cancelled, "cancelled".to_string()),
        // The daemon gives the reason (who it was preempted for) when it queues the job again.
        PREEMPTED => (State::Queued, "preempted; queued again".to_string()),
        other => (State::Failed, other.to_string()),
    };
    ExitRecord {
        state,
        exit_code: None,
        reason: Some(reason),
        ended_at_ms: orch_core::time::now_ms(),
        late: None,
    }
}

fn record_of(job: &job::JobSpec, outcome: &Outcome) -> ExitRecord {
    use crate::core::db::State;
    let (state, exit_code, reason) = match outcome {
        Outcome::Command(ExitOutcome::Exited(0)) | Outcome::Train(_) => {
            (State::Succeeded, Some(0), None)
        }
        Outcome::Command(ExitOutcome::Exited(code)) => (
            State::Failed,
            Some(*code),
            Some(format!("exit status {code}")),
        ),
        Outcome::Command(ExitOutcome::Signaled(signal)) => (
            State::Failed,
            Some(128 + signal),
            Some(format!("killed by signal {signal}")),
        ),
        Outcome::Command(ExitOutcome::Stopped(reason)) => return stopped_record(reason),
        Outcome::TrainStopped {
            cause:
                StopCause {
                    reason: Some(reason),
                    ..
                },
            ..
        } => return stopped_record(reason),
        // Its warning signal stopped the trainer before anything else did: the job ended as
        // that signal ends `orch run`, with the sentence of how it goes on.
        Outcome::TrainStopped {
            summary,
            cause: StopCause { signal, .. },
        } => (
            State::Failed,
            Some(128 + signal),
            Some(summary.as_ref().map_or_else(
                || format!("stopped on signal {signal}"),
                |summary| orch_runner::stopped_sentence(&job.name, summary, *signal, AGAIN),
            )),
        ),
    };
    ExitRecord {
        state,
        exit_code,
        reason,
        ended_at_ms: orch_core::time::now_ms(),
        late: None,
    }
}
