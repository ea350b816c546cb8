//! The placement policies tenants send, asked away from the pass that places everyone.
//!
//! A job whose `[policy] plugin` is a component its tenant sent (compiled by [`crate::core::compile`])
//! is not placed by asking its policy inside the scheduling pass: one such policy may use its
//! whole deadline (up to a second) and memory cap (up to a GiB), and twenty of them queued by one
//! tenant held every other tenant's placement for their whole time. Instead the pass hands the
//! job's policy a snapshot of the machine (the visible devices with their readings, the leases
//! held) through [`PolicyWorkers::ask`] and goes on; a worker process of the job's tenant
//! (`orch __policy-worker`) asks the policy and hands back the plan it made; a later pass takes it
//! ([`PolicyWorkers::verdict`]) and claims its devices with `orch_runner::claim_proposed`, which
//! checks the plan against the leases held then inside the lease transaction (one device, one
//! job) and, when a device it chose was taken meanwhile, has the policy asked again.
//!
//! Each tenant's policies are its own budget ([`PolicyBudget`]): at most `concurrency` of them
//! asked at once (one worker process each), their memory caps together within `memory` (a call's
//! cap is its job's `[policy] memory`, at most that), and `cpu` of CPU time per `window`. Past
//! it, the tenant's jobs wait, and say why; nobody else's do. An instance lives only while it is
//! asked (none is kept warm between asks), so what a tenant's policies hold is what its running
//! asks hold. A policy that fails (its deadline, its memory cap, a trap, a wrong answer) fails its
//! job with the sentence at once; a worker process that dies while asking is started again, and a
//! job whose policy takes it down [`MAX_TRIES`] times fails, saying so.
//!
//! Design decision: processes, not threads. The memory a policy takes is then never the daemon's
//! (a policy that allocates its 1 GiB cap grew the daemon to 1.17 GB), the kernel holds each
//! worker to an address-space limit of its own, and a worker that misbehaves is killed without
//! touching the daemon.

use crate::core::config::{Config, PolicyBudget};
use crate::core::kick::Kick;
use orch_core::ByteSize;
use orch_core::sync::lock;
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, HashSet, VecDeque};
use std::io::{BufRead as _, Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, mpsc};
use std::time::{Duration, Instant};

/// What a worker is asked: a job's policy on a snapshot of the machine.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Ask {
    pub job_text: String,
    pub job_path: String,
    /// The submitter's environment (the variables `[policy.config] var` names come from here).
    pub env: Vec<(String, String)>,
    /// The kept component (`STATE/plugins/HEX.wasm`: the name messages use) and its compiled
    /// form (`HEX-KEY.cwasm`).
    pub plugin: PathBuf,
    pub artifact: PathBuf,
    /// The call's deadline and memory cap: the job's, the memory within its tenant's budget.
    pub deadline_ms: u64,
    pub memory: u64,
    pub inventory: orch_devices::Inventory,
    /// The devices placement may use, in CUDA order: physical index and MIG instance.
    pub visible: Vec<(u32, Option<String>)>,
    pub leases: Vec<AskLease>,
}

/// A lease as a policy sees it ([`orch_core::DeviceLease`], which does not travel itself).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, Hash)]
pub struct AskLease {
    pub job_id: String,
    pub job_name: String,
    pub device_uuid: String,
    pub exclusive: bool,
    pub memory_reserved_bytes: u64,
}

impl From<&orch_core::DeviceLease> for AskLease {
    fn from(l: &orch_core::DeviceLease) -> AskLease {
        AskLease {
            job_id: l.job_id.clone(),
            job_name: l.job_name.clone(),
            device_uuid: l.device_uuid.clone(),
            exclusive: l.exclusive,
            memory_reserved_bytes: l.memory_reserved_bytes,
        }
    }
}

/// What a worker answers.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Answer {
    pub outcome: Outcome,
    /// CPU time the ask took in the worker.
    pub cpu_ms: u64,
}

/// What the policy came to.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Outcome {
    /// Its choice, on the snapshot.
    Plan(Box<orch_runner::Plan>),
    /// Nothing fits, in its words: the job waits.
    NoFit(String),
    /// It cannot place the job (its deadline, its memory cap, a trap, a wrong answer, a bad
    /// config): the job fails with this sentence. `memory`: its memory cap stopped it.
    Failed { reason: String, memory: bool },
}

/// What the engine learns of a job's policy (see [`PolicyWorkers::verdict`]).
#[derive(Debug, Clone)]
pub enum Verdict {
    /// Nothing asked, or the answer no longer counts: ask it ([`PolicyWorkers::ask`]).
    Ask,
    /// Asked, or waiting its turn: why the job waits.
    Pending(String),
    /// The plan it made on the snapshot, to claim (checked against the leases then).
    Plan(Box<orch_runner::Plan>),
    /// It found nothing that fits on the machine as it is now: the job waits, for this reason.
    NoFit(String),
    /// The job fails with this sentence.
    Failed(String),
}

/// A worker process that dies while asking a job's policy is started again; a job whose policy
/// took it down this many times fails.
pub const MAX_TRIES: u32 = 3;

/// A no-fit answer stands this long while the leases do not change (the devices' readings,
/// free memory and utilization, drift meanwhile).
const NO_FIT_STANDS: Duration = Duration::from_secs(10);

/// A worker with nothing to ask this long ends.
const IDLE: Duration = Duration::from_secs(60);

/// Beyond a call's wall-clock backstop (`orch_host::wall_backstop`), how long the daemon waits
/// for a worker's answer before it kills the worker.
const ANSWER_SLACK: Duration = Duration::from_secs(10);

/// Address space a worker may add, beyond what its engine reserves and the call's memory cap,
/// for the host's own allocations (the snapshot, the plan, the runtime's bookkeeping).
const HOST_MARGIN: u64 = 256 << 20;

/// The tenants' policy workers: what each tenant's policies are asked, are being asked and
/// answered, and what they spent.
pub struct PolicyWorkers {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for PolicyWorkers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PolicyWorkers").finish_non_exhaustive()
    }
}

struct Inner {
    /// The orch binary (`orch __policy-worker`).
    exe: PathBuf,
    budgets: HashMap<String, PolicyBudget>,
    kick: Mutex<mpsc::Sender<Kick>>,
    state: Mutex<State>,
    work: Condvar,
}

#[derive(Default)]
struct State {
    tenants: HashMap<String, TenantState>,
    /// Each job's ask, by job id.
    jobs: HashMap<i64, JobAsk>,
    /// Queued jobs whose placement has no verdict yet (their policy compiles or is asked):
    /// `POST /v1/leases` without `wait` waits for one rather than answering "no fit".
    undecided: HashSet<i64>,
}

#[derive(Default)]
struct TenantState {
    /// Jobs whose ask waits its turn, oldest first.
    waiting: VecDeque<i64>,
    /// Asks running, and the memory caps they hold together.
    running: u32,
    reserved: u64,
    /// Worker threads (each with its process) alive.
    threads: u32,
    /// When each of its asks ended, and the CPU time it took.
    spent: VecDeque<(Instant, Duration)>,
    /// The CPU time all its asks took (for `/metrics`).
    spent_total: Duration,
}

enum JobAsk {
    Waiting {
        tenant: String,
        ask: Box<Ask>,
        snapshot: u64,
        tries: u32,
    },
    Asking,
    Answered {
        outcome: Outcome,
        snapshot: u64,
        at: Instant,
    },
}

impl PolicyWorkers {
    /// The workers of `config`'s tenants, started as `exe __policy-worker` when first needed;
    /// each answer wakes the engine through `kick`.
    pub fn new(exe: PathBuf, config: &Config, kick: mpsc::Sender<Kick>) -> PolicyWorkers {
        PolicyWorkers {
            inner: Arc::new(Inner {
                exe,
                budgets: config
                    .tenants
                    .iter()
                    .map(|t| (t.name.clone(), t.policy))
                    .collect(),
                kick: Mutex::new(kick),
                state: Mutex::default(),
                work: Condvar::new(),
            }),
        }
    }

    /// The budget of `tenant` (the defaults for one no longer in the config).
    pub fn budget(&self, tenant: &str) -> PolicyBudget {
        self.inner.budgets.get(tenant).copied().unwrap_or_default()
    }

    /// Where job `id`'s policy stands, for the machine whose leases and devices hash to
    /// `snapshot` ([`snapshot_key`]). A plan or a failure is handed over once (the ask is then
    /// forgotten); a no-fit answer stands while the snapshot holds and for [`NO_FIT_STANDS`].
    pub fn verdict(&self, id: i64, snapshot: u64) -> Verdict {
        let mut state = lock(&self.inner.state);
        let Some(entry) = state.jobs.get(&id) else {
            return Verdict::Ask;
        };
        match entry {
            JobAsk::Waiting { tenant, .. } => {
                let tenant = tenant.clone();
                let reason = self.inner.waiting_reason(&state, &tenant, id);
                Verdict::Pending(reason)
            }
            JobAsk::Asking => {
                Verdict::Pending("waiting: its placement policy is being asked".into())
            }
            JobAsk::Answered {
                outcome: Outcome::NoFit(reason),
                snapshot: seen,
                at,
            } => {
                if *seen == snapshot && at.elapsed() < NO_FIT_STANDS {
                    Verdict::NoFit(reason.clone())
                } else {
                    state.jobs.remove(&id);
                    Verdict::Ask
                }
            }
            JobAsk::Answered { .. } => match state.jobs.remove(&id) {
                Some(JobAsk::Answered {
                    outcome: Outcome::Plan(plan),
                    ..
                }) => Verdict::Plan(plan),
                Some(JobAsk::Answered {
                    outcome: Outcome::Failed { reason, .. },
                    ..
                }) => Verdict::Failed(reason),
                _ => Verdict::Ask,
            },
        }
    }

    /// Why job `id` waits when its policy is being asked or waits its turn; `None` otherwise.
    pub fn pending(&self, id: i64) -> Option<String> {
        let state = lock(&self.inner.state);
        match state.jobs.get(&id)? {
            JobAsk::Waiting { tenant, .. } => {
                Some(self.inner.waiting_reason(&state, &tenant.clone(), id))
            }
            JobAsk::Asking => Some("waiting: its placement policy is being asked".into()),
            JobAsk::Answered { .. } => None,
        }
    }

    /// Queues job `id`'s ask for `tenant`'s workers (replacing any it had), made on `snapshot`;
    /// starts a worker when the tenant's budget has room for one more. Returns why the job waits.
    pub fn ask(&self, id: i64, tenant: &str, ask: Ask, snapshot: u64) -> String {
        let mut state = lock(&self.inner.state);
        self.inner.forget_in(&mut state, id);
        state.jobs.insert(
            id,
            JobAsk::Waiting {
                tenant: tenant.to_string(),
                ask: Box::new(ask),
                snapshot,
                tries: 0,
            },
        );
        state
            .tenants
            .entry(tenant.to_string())
            .or_default()
            .waiting
            .push_back(id);
        state.undecided.insert(id);
        self.inner.spawn_if_needed(&mut state, tenant);
        self.inner.work.notify_all();
        self.inner.waiting_reason(&state, tenant, id)
    }

    /// Job `id` left the queue (placed, cancelled, failed): its ask, waiting or answered, goes;
    /// one being asked is answered to nobody.
    pub fn forget(&self, id: i64) {
        let mut state = lock(&self.inner.state);
        self.inner.forget_in(&mut state, id);
        state.undecided.remove(&id);
    }

    /// The CPU time `tenant`'s policy workers took asking its policies since the daemon started.
    pub fn cpu_spent(&self, tenant: &str) -> Duration {
        lock(&self.inner.state)
            .tenants
            .get(tenant)
            .map_or(Duration::ZERO, |t| t.spent_total)
    }

    /// Whether queued job `id` waits for a verdict of its policy (compiling, or being asked).
    pub fn undecided(&self, id: i64) -> bool {
        lock(&self.inner.state).undecided.contains(&id)
    }

    /// Records whether queued job `id` waits for a verdict (the engine, after each look at it).
    pub fn set_undecided(&self, id: i64, undecided: bool) {
        let mut state = lock(&self.inner.state);
        if undecided {
            state.undecided.insert(id);
        } else {
            state.undecided.remove(&id);
        }
    }
}

impl Inner {
    fn forget_in(&self, state: &mut State, id: i64) {
        if let Some(JobAsk::Waiting { tenant, .. }) = state.jobs.remove(&id)
            && let Some(t) = state.tenants.get_mut(&tenant)
        {
            t.waiting.retain(|j| *j != id);
        }
    }

    fn budget(&self, tenant: &str) -> PolicyBudget {
        self.budgets.get(tenant).copied().unwrap_or_default()
    }

    /// CPU time `tenant`'s asks took within its window, dropping older records.
    fn spent(&self, t: &mut TenantState, budget: &PolicyBudget) -> Duration {
        let now = Instant::now();
        while t
            .spent
            .front()
            .is_some_and(|(at, _)| now.duration_since(*at) >= budget.window)
        {
            t.spent.pop_front();
        }
        t.spent.iter().map(|(_, d)| *d).sum()
    }

    /// When `tenant`'s CPU budget has room again (`None`: it has now).
    fn cpu_frees_in(&self, t: &mut TenantState, budget: &PolicyBudget) -> Option<Duration> {
        let mut spent = self.spent(t, budget);
        if spent < budget.cpu {
            return None;
        }
        let now = Instant::now();
        for (at, d) in &t.spent {
            spent = spent.saturating_sub(*d);
            if spent < budget.cpu {
                return Some((*at + budget.window).saturating_duration_since(now));
            }
        }
        Some(Duration::ZERO)
    }

    /// Why job `id` of `tenant` waits for its ask.
    fn waiting_reason(&self, state: &State, tenant: &str, id: i64) -> String {
        let budget = self.budget(tenant);
        let Some(t) = state.tenants.get(tenant) else {
            return "waiting: its placement policy is queued to be asked".into();
        };
        let ahead = t.waiting.iter().take_while(|j| **j != id).count();
        let spent: Duration = {
            let now = Instant::now();
            t.spent
                .iter()
                .filter(|(at, _)| now.duration_since(*at) < budget.window)
                .map(|(_, d)| *d)
                .sum()
        };
        if spent >= budget.cpu {
            return format!(
                "waiting: tenant {tenant}'s placement policies used {:.1} CPU-s in the last {}, its policy_cpu = {} per policy_window = {}: they are asked again once that frees up",
                spent.as_secs_f64(),
                humantime::format_duration(budget.window),
                humantime::format_duration(budget.cpu),
                humantime::format_duration(budget.window),
            );
        }
        match ahead {
            0 => "waiting: its placement policy is queued to be asked".into(),
            n => format!(
                "waiting: its placement policy is queued to be asked, behind {n} other(s) of tenant {tenant} (policy_concurrency = {})",
                budget.concurrency
            ),
        }
    }

    /// Starts a worker thread for `tenant` when asks wait and it has fewer than its
    /// `policy_concurrency`.
    fn spawn_if_needed(self: &Arc<Self>, state: &mut State, tenant: &str) {
        let budget = self.budget(tenant);
        let t = state.tenants.entry(tenant.to_string()).or_default();
        let idle = t.threads.saturating_sub(t.running);
        if t.threads >= budget.concurrency || t.waiting.len() as u32 <= idle {
            return;
        }
        t.threads += 1;
        let inner = Arc::clone(self);
        let name = tenant.to_string();
        let started = std::thread::Builder::new()
            .name(format!("orch-policy-{tenant}"))
            .spawn(move || inner.serve(&name));
        if let Err(e) = started {
            tracing::error!("cannot start a policy worker for tenant {tenant}: {e}");
            if let Some(t) = state.tenants.get_mut(tenant) {
                t.threads -= 1;
            }
        }
    }

    /// One worker of `tenant`: takes its asks in turn, within the budget, and asks them in a
    /// process of its own; ends after [`IDLE`] with nothing to ask.
    fn serve(self: Arc<Self>, tenant: &str) {
        let budget = self.budget(tenant);
        let mut worker: Option<Worker> = None;
        loop {
            let taken = {
                let mut state = lock(&self.state);
                let idle_since = Instant::now();
                loop {
                    let mut wait = IDLE
                        .saturating_sub(idle_since.elapsed())
                        .max(Duration::from_secs(1));
                    if let Some(taken) = self.take(&mut state, tenant, &budget, &mut wait) {
                        break Some(taken);
                    }
                    // Asks held back by the budget keep their worker.
                    let none_waiting = state
                        .tenants
                        .get(tenant)
                        .is_none_or(|t| t.waiting.is_empty());
                    if idle_since.elapsed() >= IDLE && none_waiting {
                        if let Some(t) = state.tenants.get_mut(tenant) {
                            t.threads -= 1;
                        }
                        break None;
                    }
                    state = self
                        .work
                        .wait_timeout(state, wait.max(Duration::from_millis(10)))
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .0;
                }
            };
            let Some((id, ask, snapshot, tries)) = taken else {
                return;
            };
            let started = Instant::now();
            let result = ask_worker(&mut worker, &self.exe, &ask);
            let mut state = lock(&self.state);
            if let Some(t) = state.tenants.get_mut(tenant) {
                t.running -= 1;
                t.reserved = t.reserved.saturating_sub(ask.memory);
                let cpu = match &result {
                    Ok(answer) => Duration::from_millis(answer.cpu_ms),
                    Err(_) => started.elapsed(),
                };
                t.spent.push_back((Instant::now(), cpu));
                t.spent_total += cpu;
            }
            let still_wanted = matches!(state.jobs.get(&id), Some(JobAsk::Asking));
            if still_wanted {
                match result {
                    Ok(answer) => {
                        let outcome = match answer.outcome {
                            Outcome::Failed {
                                reason,
                                memory: true,
                            } if ask.memory < job_memory(&ask) => Outcome::Failed {
                                reason: format!(
                                    "{reason} (tenant {tenant}'s policies have policy_memory = {} in all, in the daemon's serve.toml)",
                                    ByteSize(budget.memory)
                                ),
                                memory: true,
                            },
                            other => other,
                        };
                        state.jobs.insert(
                            id,
                            JobAsk::Answered {
                                outcome,
                                snapshot,
                                at: Instant::now(),
                            },
                        );
                    }
                    Err(lost) if tries + 1 < MAX_TRIES => {
                        tracing::warn!(
                            "job {id}: tenant {tenant}'s policy worker {lost}; asking again"
                        );
                        state.jobs.insert(
                            id,
                            JobAsk::Waiting {
                                tenant: tenant.to_string(),
                                ask,
                                snapshot,
                                tries: tries + 1,
                            },
                        );
                        if let Some(t) = state.tenants.get_mut(tenant) {
                            t.waiting.push_front(id);
                        }
                    }
                    Err(lost) => {
                        state.jobs.insert(
                            id,
                            JobAsk::Answered {
                                outcome: Outcome::Failed {
                                    reason: format!(
                                        "its placement policy could not be asked: the worker process asking it {lost}, {MAX_TRIES} times"
                                    ),
                                    memory: false,
                                },
                                snapshot,
                                at: Instant::now(),
                            },
                        );
                    }
                }
            }
            self.work.notify_all();
            drop(state);
            let _ = lock(&self.kick).send(Kick::PolicyAnswered);
        }
    }

    /// The next ask of `tenant` its budget lets run now, marked running; else `None`, with
    /// `wait` shortened to when the CPU budget frees up.
    #[allow(clippy::type_complexity)]
    fn take(
        &self,
        state: &mut State,
        tenant: &str,
        budget: &PolicyBudget,
        wait: &mut Duration,
    ) -> Option<(i64, Box<Ask>, u64, u32)> {
        let State { tenants, jobs, .. } = state;
        let t = tenants.get_mut(tenant)?;
        // Ids whose ask went meanwhile are dropped from the front.
        let (id, memory) = loop {
            let &id = t.waiting.front()?;
            match jobs.get(&id) {
                Some(JobAsk::Waiting { ask, .. }) => break (id, ask.memory),
                _ => {
                    t.waiting.pop_front();
                }
            }
        };
        if let Some(frees) = self.cpu_frees_in(t, budget) {
            *wait = (*wait).min(frees.max(Duration::from_millis(10)));
            return None;
        }
        if t.running > 0 && t.reserved.saturating_add(memory) > budget.memory {
            return None;
        }
        t.waiting.pop_front();
        let Some(JobAsk::Waiting {
            ask,
            snapshot,
            tries,
            ..
        }) = jobs.remove(&id)
        else {
            return None;
        };
        t.running += 1;
        t.reserved = t.reserved.saturating_add(memory);
        jobs.insert(id, JobAsk::Asking);
        Some((id, ask, snapshot, tries))
    }
}

/// The memory cap the job itself gives its policy (within the machine's maximum), before its
/// tenant's `policy_memory`.
fn job_memory(ask: &Ask) -> u64 {
    orch_core::job::parse(Path::new(&ask.job_path), &ask.job_text)
        .ok()
        .and_then(|spec| {
            orch_core::MachineLimits::current()
                .and_then(|m| m.resolve(orch_core::limits::PluginKind::Policy, &spec.policy.limits))
                .ok()
        })
        .map_or(ask.memory, |b| b.memory)
}

/// A hash of what a policy's answer depends on besides the readings: the devices placement may
/// use, whether each is in service (`service`, its state beside `visible`: a drain, an undrain
/// or a GPU that became unhealthy changes it) and the leases on them. A no-fit answer stands
/// while it does not change.
pub fn snapshot_key(
    visible: &[(u32, Option<String>)],
    service: &[&str],
    leases: &[AskLease],
) -> u64 {
    use std::hash::{Hash as _, Hasher as _};
    let mut sorted: Vec<&AskLease> = leases.iter().collect();
    sorted.sort_by(|a, b| {
        (&a.device_uuid, &a.job_id)
            .cmp(&(&b.device_uuid, &b.job_id))
            .then(a.exclusive.cmp(&b.exclusive))
    });
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    visible.hash(&mut hasher);
    service.hash(&mut hasher);
    sorted.hash(&mut hasher);
    hasher.finish()
}

/// A worker process: `orch __policy-worker`, one JSON line in and one out per ask.
struct Worker {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    stdout: std::process::ChildStdout,
    buffer: Vec<u8>,
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Asks `ask` of the worker (started first when there is none); `Err`: what happened to the
/// worker (it is gone then).
fn ask_worker(worker: &mut Option<Worker>, exe: &Path, ask: &Ask) -> Result<Answer, String> {
    if worker.is_none() {
        *worker = Some(start_worker(exe).map_err(|e| format!("could not start ({e})"))?);
    }
    let Some(w) = worker.as_mut() else {
        return Err("could not start".into());
    };
    let backstop = orch_host::wall_backstop(Duration::from_millis(ask.deadline_ms)) + ANSWER_SLACK;
    let result = exchange(w, ask, backstop);
    if result.is_err() {
        // Whatever it was doing, it is not trusted again.
        let ended = worker.take().map(|mut w| {
            let _ = w.child.kill();
            w.child.wait().ok()
        });
        if let Some(Some(status)) = ended {
            return result.map_err(|e| format!("{e} ({})", words(status)));
        }
    }
    result
}

fn words(status: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.signal(), status.code()) {
        (Some(signal), _) => format!("killed by signal {signal}"),
        (None, Some(code)) => format!("exit status {code}"),
        _ => "ended".into(),
    }
}

fn start_worker(exe: &Path) -> std::io::Result<Worker> {
    use std::os::unix::process::CommandExt;
    let mut child = std::process::Command::new(exe)
        .arg("__policy-worker")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        // Its own group: a Ctrl-C meant for the daemon does not reach it.
        .process_group(0)
        .spawn()?;
    let stdin = child
        .stdin
        .take()
        .ok_or_else(|| std::io::Error::other("no stdin"))?;
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| std::io::Error::other("no stdout"))?;
    Ok(Worker {
        child,
        stdin,
        stdout,
        buffer: Vec::new(),
    })
}

/// One ask and its answer, within `within`.
fn exchange(w: &mut Worker, ask: &Ask, within: Duration) -> Result<Answer, String> {
    let mut line =
        serde_json::to_vec(ask).map_err(|e| format!("could not be sent the ask: {e}"))?;
    line.push(b'\n');
    w.stdin
        .write_all(&line)
        .and_then(|()| w.stdin.flush())
        .map_err(|e| format!("could not be sent the ask ({e})"))?;
    let deadline = Instant::now() + within;
    loop {
        if let Some(end) = w.buffer.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = w.buffer.drain(..=end).collect();
            return serde_json::from_slice(&line)
                .map_err(|e| format!("answered what is not an answer ({e})"));
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(format!(
                "did not answer within {}",
                humantime::format_duration(Duration::from_secs(within.as_secs()))
            ));
        }
        if !readable(&w.stdout, left) {
            continue;
        }
        let mut chunk = [0u8; 64 << 10];
        match w.stdout.read(&mut chunk) {
            Ok(0) => return Err("ended".into()),
            Ok(n) => w.buffer.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(format!("could not be read ({e})")),
        }
    }
}

/// Whether `stdout` has something to read (or its end) within `within`.
fn readable(stdout: &std::process::ChildStdout, within: Duration) -> bool {
    use std::os::fd::AsRawFd as _;
    let mut fd = libc::pollfd {
        fd: stdout.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = within.as_millis().clamp(1, i32::MAX as u128) as i32;
    // SAFETY: one valid pollfd for the duration of the call.
    let n = unsafe { libc::poll(&mut fd, 1, ms) };
    n > 0
}

/// `orch __policy-worker`: reads asks, one JSON line each, from stdin and writes each answer as
/// one JSON line to stdout, until stdin ends. Started by the daemon, one process per tenant's
/// worker; every call under the limits the ask gives, and the process under an address-space
/// limit of the call's memory cap and a margin beyond what its engine reserves.
pub fn worker_main() -> i32 {
    // The daemon and the jobs come first; a policy's deadline counts its own CPU time, not its
    // waits for a core, so a lower priority costs it no failures.
    // SAFETY: sched_setscheduler and setpriority on this process, with a valid parameter.
    unsafe {
        let param = libc::sched_param { sched_priority: 0 };
        libc::sched_setscheduler(0, libc::SCHED_BATCH, &param);
        libc::setpriority(libc::PRIO_PROCESS, 0, 5);
    }
    let mut host = match orch_host::PolicyHost::new(orch_host::Limits::default()) {
        Ok(host) => host,
        Err(e) => {
            eprintln!("orch __policy-worker: {e}");
            return 1;
        }
    };
    host.files_precompiled_only();
    let loader = host.loader();
    let stdin = std::io::stdin();
    let mut stdout = std::io::stdout().lock();
    for line in stdin.lock().lines() {
        let Ok(line) = line else { return 1 };
        let ask: Ask = match serde_json::from_str(&line) {
            Ok(ask) => ask,
            Err(e) => {
                eprintln!("orch __policy-worker: not an ask: {e}");
                return 1;
            }
        };
        cap_address_space(&ask);
        let started = process_cpu();
        let outcome = evaluate(&mut host, &loader, &ask);
        let answer = Answer {
            outcome,
            cpu_ms: process_cpu().saturating_sub(started).as_millis() as u64,
        };
        let Ok(mut text) = serde_json::to_vec(&answer) else {
            return 1;
        };
        text.push(b'\n');
        if stdout
            .write_all(&text)
            .and_then(|()| stdout.flush())
            .is_err()
        {
            return 1;
        }
    }
    0
}

/// The policy of `ask` asked on its snapshot.
fn evaluate(
    host: &mut orch_host::PolicyHost,
    loader: &orch_host::ComponentLoader,
    ask: &Ask,
) -> Outcome {
    let failed = |reason: String| Outcome::Failed {
        reason,
        memory: false,
    };
    let mut spec = match orch_core::job::parse(Path::new(&ask.job_path), &ask.job_text) {
        Ok(spec) => spec,
        Err(e) => return failed(e.to_string()),
    };
    if !host.is_provided(&ask.plugin) {
        match loader.load(&ask.artifact) {
            Ok(component) => host.provide(&ask.plugin, &component),
            Err(e) => return failed(format!("its placement policy could not be loaded: {e}")),
        }
    }
    spec.policy.plugin = orch_core::PluginRef::Path(ask.plugin.clone());
    // The call's limits: the job's deadline, and its memory cap within its tenant's budget.
    let at = |setting: Option<orch_core::Location>| {
        setting.unwrap_or_else(|| orch_core::Location {
            file: PathBuf::from(&ask.job_path),
            line: 0,
            column: 0,
        })
    };
    let deadline_at = spec.policy.limits.deadline.take().map(|(_, l)| l);
    let memory_at = spec.policy.limits.memory.take().map(|(_, l)| l);
    spec.policy.limits.deadline = Some((Duration::from_millis(ask.deadline_ms), at(deadline_at)));
    spec.policy.limits.memory = Some((ask.memory, at(memory_at)));
    let visibility = orch_devices::Visibility {
        devices: ask
            .visible
            .iter()
            .map(|(physical, mig)| orch_devices::VisibleDevice {
                physical: *physical,
                mig_uuid: mig.clone(),
            })
            .collect(),
        notes: Vec::new(),
    };
    let leases: Vec<orch_core::DeviceLease> = ask
        .leases
        .iter()
        .map(|l| orch_core::DeviceLease {
            job_id: l.job_id.clone(),
            job_name: l.job_name.clone(),
            device_uuid: l.device_uuid.clone(),
            exclusive: l.exclusive,
            memory_reserved_bytes: l.memory_reserved_bytes,
        })
        .collect();
    let env_map: HashMap<&str, &str> = ask
        .env
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let env = |name: &str| env_map.get(name).map(|v| v.to_string());
    let input = orch_runner::PlanInput {
        job: &spec,
        devices: &ask.inventory.devices,
        visibility: &visibility,
        leases: &leases,
    };
    let result = orch_runner::plan(input, host, &env);
    // Nothing is kept between asks: the instance goes, and with it what it holds.
    let limits = host.limits().with_bounds(orch_core::Bounds {
        deadline: Duration::from_millis(ask.deadline_ms),
        memory: ask.memory,
    });
    if let Ok(id) = host.load_with_limits(&spec.policy.plugin, &limits) {
        host.discard_instance(id);
    }
    match result {
        Ok(plan) => Outcome::Plan(Box::new(plan)),
        Err(orch_runner::PlanError::Policy(e))
            if e.refusal()
                .is_some_and(|(kind, _)| kind == orch_host::RefusalKind::NoFit) =>
        {
            Outcome::NoFit(e.to_string())
        }
        Err(orch_runner::PlanError::Policy(e @ orch_host::PluginError::MemoryLimit { .. })) => {
            Outcome::Failed {
                reason: e.to_string(),
                memory: true,
            }
        }
        Err(e) => failed(e.to_string()),
    }
}

/// Sets this process's soft address-space limit to what it has now, the call's memory cap and
/// [`HOST_MARGIN`]: a policy's memory is capped by the engine's limiter; this caps what the host
/// could be made to allocate around it.
fn cap_address_space(ask: &Ask) {
    let Some(now) = crate::core::compile::vm_size() else {
        return;
    };
    let soft = now.saturating_add(ask.memory).saturating_add(HOST_MARGIN);
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit on this process with a valid struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_AS, &mut limit) != 0 {
            return;
        }
        limit.rlim_cur = (soft as libc::rlim_t).min(limit.rlim_max);
        libc::setrlimit(libc::RLIMIT_AS, &limit);
    }
}

/// CPU time this process has used (user and system).
fn process_cpu() -> Duration {
    // SAFETY: getrusage fills the struct it is given.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage
    };
    let tv = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec.max(0) as u64) + Duration::from_micros(t.tv_usec.max(0) as u64)
    };
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(uuid: &str, job: &str) -> AskLease {
        AskLease {
            job_id: job.into(),
            job_name: job.into(),
            device_uuid: uuid.into(),
            exclusive: true,
            memory_reserved_bytes: 0,
        }
    }

    fn inner(budget: PolicyBudget) -> Arc<Inner> {
        let (kick, _) = mpsc::channel();
        Arc::new(Inner {
            exe: PathBuf::from("/nonexistent"),
            budgets: HashMap::from([("a".to_string(), budget)]),
            kick: Mutex::new(kick),
            state: Mutex::default(),
            work: Condvar::new(),
        })
    }

    fn ask(memory: u64) -> Ask {
        Ask {
            job_text: String::new(),
            job_path: "job.toml".into(),
            env: Vec::new(),
            plugin: "p.wasm".into(),
            artifact: "p.cwasm".into(),
            deadline_ms: 1000,
            memory,
            inventory: orch_devices::Inventory {
                backend: orch_devices::Backend::Cpu,
                devices: Vec::new(),
                fallback_reason: None,
            },
            visible: Vec::new(),
            leases: Vec::new(),
        }
    }

    /// Queues asks of `memory` bytes for jobs `ids` of tenant `a`, without starting a worker.
    fn queue(inner: &Inner, ids: &[(i64, u64)]) {
        let mut state = lock(&inner.state);
        for &(id, memory) in ids {
            state.jobs.insert(
                id,
                JobAsk::Waiting {
                    tenant: "a".into(),
                    ask: Box::new(ask(memory)),
                    snapshot: 0,
                    tries: 0,
                },
            );
            state
                .tenants
                .entry("a".into())
                .or_default()
                .waiting
                .push_back(id);
        }
    }

    fn take(inner: &Inner) -> Option<i64> {
        let budget = inner.budget("a");
        let mut wait = IDLE;
        let mut state = lock(&inner.state);
        inner
            .take(&mut state, "a", &budget, &mut wait)
            .map(|(id, ..)| id)
    }

    #[test]
    fn a_tenants_asks_together_stay_within_its_policy_memory() {
        let inner = inner(PolicyBudget {
            concurrency: 3,
            memory: 1 << 30,
            ..PolicyBudget::default()
        });
        queue(&inner, &[(1, 600 << 20), (2, 600 << 20), (3, 300 << 20)]);
        assert_eq!(take(&inner), Some(1));
        // 600 MiB more would pass 1 GiB while job 1's ask runs: it waits, and so does the one
        // behind it (asks go in turn).
        assert_eq!(take(&inner), None);
        {
            let mut state = lock(&inner.state);
            let t = state.tenants.get_mut("a").unwrap();
            assert_eq!((t.running, t.reserved), (1, 600 << 20));
            t.running -= 1;
            t.reserved -= 600 << 20;
        }
        assert_eq!(take(&inner), Some(2));
        assert_eq!(take(&inner), Some(3));
        let state = lock(&inner.state);
        assert_eq!(state.tenants["a"].reserved, 900 << 20);
    }

    #[test]
    fn a_tenant_past_its_policy_cpu_waits_until_the_window_frees_it() {
        let inner = inner(PolicyBudget {
            cpu: Duration::from_secs(2),
            window: Duration::from_secs(60),
            ..PolicyBudget::default()
        });
        queue(&inner, &[(1, 1 << 20)]);
        lock(&inner.state)
            .tenants
            .get_mut("a")
            .unwrap()
            .spent
            .push_back((Instant::now(), Duration::from_millis(2500)));
        let budget = inner.budget("a");
        let mut wait = IDLE;
        {
            let mut state = lock(&inner.state);
            assert!(inner.take(&mut state, "a", &budget, &mut wait).is_none());
            let reason = inner.waiting_reason(&state, "a", 1);
            assert!(
                reason.contains("used 2.5 CPU-s in the last 1m")
                    && reason.contains("policy_cpu = 2s per policy_window = 1m"),
                "{reason}"
            );
        }
        assert!(
            wait > Duration::from_secs(55) && wait <= Duration::from_secs(60),
            "{wait:?}"
        );
        // Once that use is older than the window, the ask goes.
        lock(&inner.state).tenants.get_mut("a").unwrap().spent[0].0 =
            Instant::now() - Duration::from_secs(61);
        assert_eq!(take(&inner), Some(1));
    }

    #[test]
    fn a_plan_or_a_failure_is_handed_over_once_and_a_no_fit_stands_while_the_snapshot_does() {
        let workers = PolicyWorkers {
            inner: inner(PolicyBudget::default()),
        };
        assert!(matches!(workers.verdict(7, 1), Verdict::Ask));
        let answered = |outcome: Outcome, snapshot: u64| {
            lock(&workers.inner.state).jobs.insert(
                7,
                JobAsk::Answered {
                    outcome,
                    snapshot,
                    at: Instant::now(),
                },
            );
        };
        answered(Outcome::NoFit("nothing is cool enough".into()), 1);
        assert!(
            matches!(workers.verdict(7, 1), Verdict::NoFit(r) if r == "nothing is cool enough")
        );
        assert!(matches!(workers.verdict(7, 1), Verdict::NoFit(_)));
        // The leases changed: it is asked again.
        assert!(matches!(workers.verdict(7, 2), Verdict::Ask));
        answered(
            Outcome::Failed {
                reason: "it was stopped".into(),
                memory: false,
            },
            2,
        );
        assert!(matches!(workers.verdict(7, 2), Verdict::Failed(r) if r == "it was stopped"));
        assert!(matches!(workers.verdict(7, 2), Verdict::Ask));
        // A job that left the queue takes its ask with it.
        queue(&workers.inner, &[(8, 1 << 20)]);
        assert!(matches!(workers.verdict(8, 0), Verdict::Pending(_)));
        workers.forget(8);
        assert!(matches!(workers.verdict(8, 0), Verdict::Ask));
        assert!(lock(&workers.inner.state).tenants["a"].waiting.is_empty());
    }

    #[test]
    fn a_snapshot_changes_with_the_leases_not_with_their_order() {
        let visible = vec![(0, None), (1, None)];
        let ok = ["ok", "ok"];
        let a = snapshot_key(&visible, &ok, &[lease("GPU-0", "1"), lease("GPU-1", "2")]);
        let b = snapshot_key(&visible, &ok, &[lease("GPU-1", "2"), lease("GPU-0", "1")]);
        assert_eq!(a, b);
        assert_ne!(a, snapshot_key(&visible, &ok, &[lease("GPU-0", "1")]));
        assert_ne!(
            a,
            snapshot_key(
                &visible[..1],
                &ok[..1],
                &[lease("GPU-0", "1"), lease("GPU-1", "2")]
            )
        );
        // A drain, an undrain or a GPU that became unhealthy asks the policy again.
        let leases = [lease("GPU-0", "1"), lease("GPU-1", "2")];
        let drained = snapshot_key(&visible, &["ok", "drained"], &leases);
        assert_ne!(a, drained);
        assert_ne!(
            drained,
            snapshot_key(&visible, &["ok", "unhealthy"], &leases)
        );
        assert_eq!(a, snapshot_key(&visible, &ok, &leases));
    }
}
