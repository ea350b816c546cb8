//! The per-job supervisor: a small process the daemon starts for each job (as slurmstepd and
//! containerd's shims are), which starts the job's processes as its user, waits for them and
//! writes their exit status to the job's folder. It does not die with the daemon, so a restarted
//! daemon adopts the job again and still learns how it ended.
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
use orch_runner::{LeaseGuard, Outcome, Placement, ProcessOptions};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// A line in the supervisor's log (its stderr, `supervisor.log`). Never a panic: on a full disk
/// the line is lost, and the supervisor goes on.
macro_rules! note {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
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

/// The supervisor's whole life; returns its exit status.
pub fn supervise(dir: &Path) -> i32 {
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
    let (record, lease) = run(dir, &spec, signals.ok());
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
    // An array's task runs its own combination of the `[sweep]`.
    let job = match sub.spec() {
        Ok(job) => job,
        Err(e) => return (failed(e), None),
    };
    let inventory = &spec.inventory;
    let train = matches!(job.work, orch_core::job::Work::Train(_));
    // A [train] job's trainer runs in a process of its own, as the job's user (it reads the
    // user's data and writes the user's checkpoints): `orch run --supervised` on this lease's
    // devices, with the submitted text of the job file; this supervisor holds the lease.
    let (job, extra_env) = match &job.work {
        orch_core::job::Work::Train(_) => {
            let mut command_job = job.clone();
            let mut argv = vec![
                spec.exe.display().to_string(),
                "run".into(),
                "--supervised".into(),
            ];
            // A run queued again (preempted, or after a crash) goes on from its checkpoint.
            if let orch_core::job::Work::Train(train) = &job.work
                && orch_core::checkpoint::exists(&train.out)
            {
                argv.push("--resume".into());
            }
            // An array's task: the trainer's run applies its combination of the `[sweep]` (its
            // parameters, its folder `OUT/sweep-TASK`), as a Slurm array's task does.
            if let Some(task) = sub.sweep_task {
                argv.push("--sweep-task".into());
                argv.push(task.to_string());
            }
            argv.push(sub.job_path.clone());
            command_job.work = orch_core::job::Work::Command(orch_core::job::CommandSpec {
                argv,
                env: Default::default(),
                launch: orch_core::job::Launch::Single,
                device_ids: None,
            });
            let extra = vec![
                ("ORCH_JOB_TEXT".to_string(), sub.job_text.clone()),
                ("ORCH_DEVICES".to_string(), spec.devices.clone()),
            ];
            (command_job, extra)
        }
        orch_core::job::Work::Command(_) => (job, Vec::new()),
    };
    let prepared = match orch_runner::prepare(&job, false, None) {
        Ok(p) => p,
        Err(e) => return (failed(e.to_string()), None),
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
            cap: orch_exec::LogCap {
                max_bytes: spec.max_log_bytes,
                reserve_bytes: spec.log_reserve_bytes,
            },
        },
        credentials: spec.switch_user.then(|| Credentials {
            uid: id.uid,
            gid: id.gid,
            groups: id.groups.clone(),
        }),
        base_env: Some(sub.env.iter().cloned().chain(extra_env).collect()),
        cwd: Some(PathBuf::from(&sub.cwd)),
        forward_signals: false,
        grace: Duration::from_secs_f64(spec.grace_s),
        cluster: None,
        // A `[train]` job's process is orch itself, which reads its devices from
        // CUDA_VISIBLE_DEVICES as UUIDs: the tenant's default is for the programs of command jobs.
        device_ids: if train { None } else { spec.device_ids },
    };
    let placement = Placement {
        lease,
        plan: spec.plan.clone(),
        granted_names: None,
    };
    let running = match orch_runner::start(&job, prepared, placement, inventory, &options) {
        Ok(r) => r,
        Err(e) => return (failed(e.to_string()), None),
    };
    if let Some(stopper) = running.stopper() {
        stop_when_due(
            stopper,
            signals,
            job.stopping.signal,
            spec.max_runtime_s.map(Duration::from_secs_f64),
        );
    }
    let (outcome, lease, counted) = running.wait_measured();
    // What the job's processes used, for its accounting: its cgroup's count where orch made one,
    // else the rusage of what this process waited for. Written before exit.json, which the
    // daemon reads it after; a failed write costs the record those figures, nothing else.
    let children = crate::core::accounting::children_use();
    let used = crate::core::accounting::ProcessUse {
        cpu_seconds: counted.cpu_seconds.or(children.cpu_seconds),
        peak_rss_bytes: counted.peak_memory_bytes.or(children.peak_rss_bytes),
        signal: match &outcome {
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
    let mut record = match outcome {
        Ok(outcome) => record_of(&outcome),
        Err(e) => failed(e.to_string()),
    };
    if train && record.exit_code.is_some_and(|code| code != 0) {
        // The trainer's process said why it failed (a checkpoint it could not write, a
        // trainer's error): that sentence is the job's reason, not "exit status 1".
        if let Some(sentence) = train_failure(&dir.join("stderr")) {
            record.reason = Some(sentence);
        }
    }
    (record, Some(lease))
}

/// Stops the job when it is due: at a cancel, a preemption or an idle reclaim (the daemon's
/// signal to this process), and at its time limit; sends its warning signal before that limit.
///
/// The warning signal (`[job] signal`) goes once: `before` its time limit, or, when a cancel or
/// a preemption comes first, as the stop signal then, so a job that saves on it saves before it
/// is stopped. Every other stop signal is SIGTERM; SIGKILL follows after the grace period.
fn stop_when_due(
    stopper: orch_exec::Stopper,
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

/// Most bytes of a trainer's error sentence taken as a job's reason.
const MAX_TRAIN_REASON: usize = 2000;

/// The sentence `orch run --supervised` ended a failed `[train]` job with: its last line of
/// stderr, `orch: SENTENCE` (the CLI's error line). `None` when the last line is not one (the
/// process was killed, say); only the file's end is read.
fn train_failure(stderr: &Path) -> Option<String> {
    use std::io::{Read, Seek, SeekFrom};
    const TAIL: u64 = 16 * 1024;
    let mut file = std::fs::File::open(stderr).ok()?;
    let len = file.metadata().ok()?.len();
    file.seek(SeekFrom::Start(len.saturating_sub(TAIL))).ok()?;
    let mut tail = Vec::new();
    file.take(TAIL).read_to_end(&mut tail).ok()?;
    let text = String::from_utf8_lossy(&tail);
    let last = text.lines().rev().find(|line| !line.trim().is_empty())?;
    let sentence = last.strip_prefix("orch: ")?.trim();
    if sentence.is_empty() {
        return None;
    }
    let mut end = sentence.len().min(MAX_TRAIN_REASON);
    while !sentence.is_char_boundary(end) {
        end -= 1;
    }
    Some(sentence[..end].to_string())
}

fn record_of(outcome: &Outcome) -> ExitRecord {
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
        Outcome::Command(ExitOutcome::Stopped(reason)) if reason == CANCELLED => {
            (State::Cancelled, None, Some("cancelled".into()))
        }
        // The daemon gives the reason (who it was preempted for) when it queues the job again.
        Outcome::Command(ExitOutcome::Stopped(reason)) if reason == PREEMPTED => {
            (State::Queued, None, Some("preempted; queued again".into()))
        }
        Outcome::Command(ExitOutcome::Stopped(reason)) => {
            (State::Failed, None, Some(reason.clone()))
        }
    };
    ExitRecord {
        state,
        exit_code,
        reason,
        ended_at_ms: orch_core::time::now_ms(),
        late: None,
    }
}
