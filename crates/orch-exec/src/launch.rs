//! Spawning, signal forwarding, failure propagation and exit statuses.

use crate::env::process_env;
use crate::spec::{ExecError, LaunchSpec, StdioMode};
use crate::watch::Verdict;
use orch_core::sync::lock;
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use signal_hook::iterator::Signals;
use std::collections::BTreeSet;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How the job ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExitOutcome {
    Exited(i32),
    Signaled(i32),
    /// A [`Monitor`] stopped the job, for this reason.
    Stopped(String),
}

/// A monitor's look at the job: given every process of the job, continue or stop.
pub type Check = Box<dyn FnMut(&BTreeSet<u32>) -> Verdict + Send>;

/// Looks at a running job every `interval`; may stop it.
pub struct Monitor {
    pub interval: Duration,
    pub check: Check,
}

impl std::fmt::Debug for Monitor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Monitor")
            .field("interval", &self.interval)
            .finish_non_exhaustive()
    }
}

impl ExitOutcome {
    /// The status orch exits with: the child's code, or 128+N for signal N (as shells report it).
    pub fn code(&self) -> u8 {
        match self {
            ExitOutcome::Exited(code) => (code & 0xff) as u8,
            ExitOutcome::Signaled(signal) => (128 + signal).clamp(0, 255) as u8,
            ExitOutcome::Stopped(_) => 1,
        }
    }

    pub fn success(&self) -> bool {
        *self == ExitOutcome::Exited(0)
    }

    fn from_status(status: ExitStatus) -> ExitOutcome {
        match (status.code(), status.signal()) {
            (Some(code), _) => ExitOutcome::Exited(code),
            (None, Some(signal)) => ExitOutcome::Signaled(signal),
            (None, None) => ExitOutcome::Exited(1),
        }
    }
}

impl std::fmt::Display for ExitOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ExitOutcome::Exited(code) => write!(f, "exit status {code}"),
            ExitOutcome::Signaled(signal) => write!(f, "signal {signal}"),
            ExitOutcome::Stopped(reason) => write!(f, "a stop by orch: {reason}"),
        }
    }
}

/// Runs the job to the end. `on_spawn` is called with each process's pid as soon as it runs (the
/// runner adds it to the lease's holders); `monitor`, when given, looks at the job periodically.
/// Returns the first failure's outcome, else success.
pub fn launch(
    spec: &LaunchSpec,
    on_spawn: impl FnMut(u32),
    monitor: Option<Monitor>,
) -> Result<ExitOutcome, ExecError> {
    Ok(start(spec, on_spawn)?.wait(monitor))
}

/// A job whose processes run; [`Launched::wait`] supervises them to the end.
#[derive(Debug)]
pub struct Launched {
    groups: Arc<Mutex<BTreeSet<i32>>>,
    events: mpsc::Receiver<Event>,
    sender: mpsc::Sender<Event>,
    count: usize,
    grace: Duration,
    cgroup: Option<PathBuf>,
    forwarder: Option<SignalForwarder>,
    terminal: Option<crate::terminal::Foreground>,
    /// The copiers of the job's output into its logs (`StdioMode::Files`).
    copiers: Option<crate::logs::Copiers>,
}

/// How long the end of a job waits for its output to be copied (its processes have all ended,
/// so the pipes are at their end once the copiers read what is in them).
const COPY_PATIENCE: Duration = Duration::from_secs(5);

/// Stops a launched job from another thread: SIGTERM to every process, SIGKILL after the grace
/// period; the job's outcome becomes [`ExitOutcome::Stopped`] with the reason given.
#[derive(Debug, Clone)]
pub struct Stopper(mpsc::Sender<Event>);

impl Stopper {
    pub fn stop(&self, reason: impl Into<String>) {
        self.stop_with(reason, libc::SIGTERM);
    }

    /// Stops the job with `signal` instead of SIGTERM (a job's warning signal at a cancel),
    /// SIGKILL after the grace period.
    pub fn stop_with(&self, reason: impl Into<String>, signal: i32) {
        let _ = self.0.send(Event::Stop(reason.into(), signal));
    }

    /// Sends `signal` to every process group of the job and lets it run on (a warning before
    /// its time limit).
    pub fn signal(&self, signal: i32) {
        let _ = self.0.send(Event::Signal(signal));
    }
}

#[derive(Debug)]
enum Event {
    Exited(usize, ExitOutcome),
    /// Stop with this reason, by this signal first.
    Stop(String, i32),
    Signal(i32),
}

/// Starts the job's processes and returns at once.
pub fn start(spec: &LaunchSpec, mut on_spawn: impl FnMut(u32)) -> Result<Launched, ExecError> {
    let (program, args) = spec.argv.split_first().ok_or(ExecError::EmptyCommand)?;
    let ranks: Vec<Option<usize>> = if spec.per_device {
        (0..spec.job.devices.len()).map(Some).collect()
    } else {
        vec![None]
    };
    let master_port = if spec.per_device { free_port()? } else { 0 };
    let groups: Arc<Mutex<BTreeSet<i32>>> = Arc::default();
    let forwarder = if spec.forward_signals {
        Some(SignalForwarder::start(
            Arc::clone(&groups),
            spec.warning_signal,
        )?)
    } else {
        None
    };
    let terminal = match spec.stdio {
        StdioMode::Inherit => crate::terminal::Foreground::available(),
        StdioMode::Files { .. } => None,
    };
    let mut setup = crate::setup::ChildSetup::new(spec, terminal.is_some())?;
    let streams = std::mem::take(&mut setup.streams);
    let copiers = (!streams.is_empty()).then(|| crate::logs::Copiers::start(streams));

    let (sender, events) = mpsc::channel::<Event>();
    for (slot, rank) in ranks.iter().enumerate() {
        let mut command = Command::new(program);
        command.args(args).process_group(0);
        if let Some(base) = &spec.base_env {
            command.env_clear().envs(base.iter().cloned());
        }
        command.envs(process_env(&spec.job, *rank, master_port));
        let reads_input = slot == 0;
        setup.stdio(&mut command, reads_input)?;
        setup.install(&mut command, slot, reads_input);
        let child = match command.spawn() {
            Ok(child) => child,
            Err(e) => {
                stop_all(&groups, libc::SIGKILL);
                return Err(setup.step_failure(spec, slot, &e).unwrap_or_else(|| {
                    ExecError::Spawn {
                        program: program.clone(),
                        reason: spawn_reason(&e),
                    }
                }));
            }
        };
        let pid = child.id();
        join_groups(&groups, forwarder.as_ref(), pid as i32);
        on_spawn(pid);
        tracing::debug!("started {program} as pid {pid} (rank {rank:?})");
        wait_in_thread(slot, child, sender.clone());
    }
    // The pipes' write ends are the children's alone now: a copier reaches the end of its pipe
    // when the job's last process has ended.
    drop(setup);
    Ok(Launched {
        groups,
        events,
        sender,
        count: ranks.len(),
        grace: spec.grace,
        cgroup: spec.cgroup.clone(),
        forwarder,
        terminal,
        copiers,
    })
}

impl Launched {
    /// A handle to stop the job from elsewhere (a cancel, a time limit).
    pub fn stopper(&self) -> Stopper {
        Stopper(self.sender.clone())
    }

    /// The process group ids of the job's processes (one per rank).
    pub fn process_groups(&self) -> Vec<u32> {
        lock(&self.groups).iter().map(|&g| g as u32).collect()
    }

    /// Supervises the job to its end, then ends whatever its processes left behind in their
    /// groups or cgroup (as Slurm ends a step's leftovers), so nothing of the job outlives it.
    pub fn wait(self, monitor: Option<Monitor>) -> ExitOutcome {
        let Launched {
            groups,
            events,
            sender,
            count,
            grace,
            cgroup,
            forwarder,
            terminal,
            copiers,
        } = self;
        drop(sender);
        let outcome = supervise(&groups, events, count, grace, monitor, cgroup.as_deref());
        if let Some(terminal) = terminal {
            terminal.restore();
        }
        end_leftovers(&groups, cgroup.as_deref(), grace);
        if let Some(forwarder) = forwarder {
            forwarder.stop();
        }
        if let Some(copiers) = copiers {
            copiers.finish(COPY_PATIENCE);
        }
        outcome
    }
}

/// Collects exits; on the first failure (or a stop) ends the others (SIGTERM, then SIGKILL after
/// `grace`).
fn supervise(
    groups: &Mutex<BTreeSet<i32>>,
    events: mpsc::Receiver<Event>,
    count: usize,
    grace: Duration,
    mut monitor: Option<Monitor>,
    cgroup: Option<&std::path::Path>,
) -> ExitOutcome {
    let mut first_failure: Option<ExitOutcome> = None;
    let mut kill_at: Option<Instant> = None;
    let mut remaining = count;
    let mut next_check = monitor.as_ref().map(|m| Instant::now() + m.interval);
    let stop = |failure: &mut Option<ExitOutcome>, outcome: ExitOutcome, signal: i32| {
        failure.get_or_insert(outcome);
        stop_all(groups, signal);
    };
    while remaining > 0 {
        let wake = [kill_at, next_check].into_iter().flatten().min();
        let received = match wake {
            Some(at) => events.recv_timeout(at.saturating_duration_since(Instant::now())),
            None => events
                .recv()
                .map_err(|_| mpsc::RecvTimeoutError::Disconnected),
        };
        if let (Some(m), Some(at)) = (monitor.as_mut(), next_check)
            && Instant::now() >= at
        {
            next_check = Some(Instant::now() + m.interval);
            let roots: Vec<u32> = lock(groups).iter().map(|&g| g as u32).collect();
            if let Verdict::Stop(reason) = (m.check)(&crate::watch::descendants(&roots)) {
                tracing::warn!("stopping the job: {reason}");
                stop(
                    &mut first_failure,
                    ExitOutcome::Stopped(reason),
                    libc::SIGTERM,
                );
                kill_at = kill_at.or(Some(Instant::now() + grace));
                next_check = None;
            }
        }
        match received {
            Ok(Event::Exited(slot, outcome)) => {
                remaining -= 1;
                tracing::debug!("process {slot} ended: {outcome}");
                if !outcome.success() && first_failure.is_none() {
                    if remaining > 0 {
                        tracing::warn!(
                            "process {slot} failed ({outcome}): stopping the other {remaining}"
                        );
                        kill_at = Some(Instant::now() + grace);
                    }
                    stop(&mut first_failure, outcome, libc::SIGTERM);
                }
            }
            Ok(Event::Stop(reason, signal)) => {
                tracing::info!("stopping the job: {reason}");
                stop(&mut first_failure, ExitOutcome::Stopped(reason), signal);
                kill_at = kill_at.or(Some(Instant::now() + grace));
            }
            Ok(Event::Signal(signal)) => {
                tracing::info!("sending the job signal {signal}");
                stop_all(groups, signal);
            }
            Err(mpsc::RecvTimeoutError::Timeout)
                if kill_at.is_some_and(|at| Instant::now() >= at) =>
            {
                tracing::warn!(
                    "{remaining} process(es) still running after {grace:?}: killing them"
                );
                stop_all(groups, libc::SIGKILL);
                if let Some(cgroup) = cgroup {
                    crate::cgroup::kill(cgroup);
                }
                kill_at = None;
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    first_failure.unwrap_or(ExitOutcome::Exited(0))
}

/// After the main processes ended: SIGTERM to what is left in their process groups or cgroup,
/// SIGKILL after `grace`, and wait (bounded) until nothing is left.
fn end_leftovers(groups: &Mutex<BTreeSet<i32>>, cgroup: Option<&std::path::Path>, grace: Duration) {
    let left = || {
        cgroup.is_some_and(orch_core::process::cgroup_populated)
            || lock(groups)
                .iter()
                .any(|&g| orch_core::process::group_running(g as u32))
    };
    if !left() {
        return;
    }
    tracing::info!("the job's main process ended: stopping what it left running");
    stop_all(groups, libc::SIGTERM);
    if let Some(cgroup) = cgroup {
        crate::cgroup::signal_all(cgroup, libc::SIGTERM);
    }
    let kill_at = Instant::now() + grace;
    let give_up = kill_at + Duration::from_secs(5);
    let mut killed = false;
    while left() && Instant::now() < give_up {
        if !killed && Instant::now() >= kill_at {
            stop_all(groups, libc::SIGKILL);
            if let Some(cgroup) = cgroup {
                crate::cgroup::kill(cgroup);
            }
            killed = true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn wait_in_thread(slot: usize, mut child: Child, done: mpsc::Sender<Event>) {
    std::thread::spawn(move || {
        let outcome = match child.wait() {
            Ok(status) => ExitOutcome::from_status(status),
            Err(_) => ExitOutcome::Exited(1),
        };
        let _ = done.send(Event::Exited(slot, outcome));
    });
}

fn stop_all(groups: &Mutex<BTreeSet<i32>>, signal: i32) {
    signal_groups(&lock(groups), signal);
}

fn signal_groups(groups: &BTreeSet<i32>, signal: i32) {
    for &pgid in groups {
        // SAFETY: kill(2) on a process group we created; a group that already exited is ESRCH.
        unsafe {
            libc::kill(-pgid, signal);
        }
    }
}

/// Adds a new process's group to the job's. A signal the forwarder passed on before the group
/// was in the set (one that came while the process was being spawned) is sent to it now, so a
/// job cancelled during its start cannot leave a process running outside every signal. The
/// forwarder records the signal and signals the set under the same lock, so each group gets
/// the signal once from one side or the other.
fn join_groups(groups: &Mutex<BTreeSet<i32>>, forwarder: Option<&SignalForwarder>, pgid: i32) {
    let late = {
        let mut set = lock(groups);
        set.insert(pgid);
        forwarder.map_or(0, SignalForwarder::last_signal)
    };
    if late != 0 {
        tracing::info!("forwarding signal {late}, received during the start, to the job");
        signal_groups(&BTreeSet::from([pgid]), late);
    }
}

fn spawn_reason(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::NotFound => {
            "no such program (check the path, or that it is on PATH)".into()
        }
        std::io::ErrorKind::PermissionDenied => "permission denied (is it executable?)".into(),
        _ => e.to_string(),
    }
}

fn free_port() -> Result<u16, ExecError> {
    let listener =
        std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| ExecError::NoPort(e.to_string()))?;
    listener
        .local_addr()
        .map(|a| a.port())
        .map_err(|e| ExecError::NoPort(e.to_string()))
}

/// Forwards SIGINT, SIGTERM and SIGHUP to every process group of the job while it runs, and
/// remembers the last one for groups that join later (see [`join_groups`]).
#[derive(Debug)]
struct SignalForwarder {
    handle: signal_hook::iterator::Handle,
    thread: std::thread::JoinHandle<()>,
    last: Arc<AtomicI32>,
}

impl SignalForwarder {
    fn start(
        groups: Arc<Mutex<BTreeSet<i32>>>,
        warning: Option<i32>,
    ) -> Result<SignalForwarder, ExecError> {
        let mut forwarded = vec![SIGINT, SIGTERM, SIGHUP];
        forwarded.extend(warning.filter(|w| !forwarded.contains(w)));
        let mut signals = Signals::new(forwarded).map_err(|e| ExecError::Signals(e.to_string()))?;
        let handle = signals.handle();
        let last = Arc::new(AtomicI32::new(0));
        let seen = Arc::clone(&last);
        let thread = std::thread::spawn(move || {
            for signal in signals.forever() {
                tracing::info!("forwarding signal {signal} to the job");
                let set = lock(&groups);
                seen.store(signal, Ordering::SeqCst);
                signal_groups(&set, signal);
            }
        });
        Ok(SignalForwarder {
            handle,
            thread,
            last,
        })
    }

    /// The last signal forwarded, 0 before any.
    fn last_signal(&self) -> i32 {
        self.last.load(Ordering::SeqCst)
    }

    fn stop(self) {
        self.handle.close();
        let _ = self.thread.join();
    }
}

#[cfg(test)]
mod tests;
