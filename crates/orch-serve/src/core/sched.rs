//! The scheduler core, shared by the daemon's engine and `orch simulate`: the queue and the
//! running jobs as scheduling sees them, decayed usage per tenant, one pass (order, limits,
//! backfill, placement through the caller) and preemption. Time is a number of seconds the caller
//! gives (the wall clock in the daemon, virtual time in the simulator), so both run the same code.
//!
//! Design decisions:
//! - The queue order comes from a [`QueuePolicy`] (a Wasm component in the daemon); its answer is
//!   checked here whatever its source, and a policy that fails leaves this pass to `fifo`.
//! - Limits are the host's: a job of a tenant at its `max_gpus` is not started whatever its rank.
//! - Usage is charged continuously (the exact integral of a decaying rate, so a long interval
//!   charges what many short ones would); the daemon persists it every sampling period.
//! - Preemption frees devices for a tenant under its share by stopping preemptible jobs of
//!   tenants over theirs, and holds the devices freed for that job (a reservation) until it starts
//!   or the reservation expires, so that backfill does not take them first.
//! - Backfill has a bound: a job that has waited `starvation_limit` and still does not fit holds
//!   back the devices that are free for it, so smaller jobs behind it stop taking every device
//!   that frees up, and it starts once enough have. A job of MIG slices is held for alike, by
//!   the free slices of its profile (the caller counts them: [`Scheduler::set_free_slices`]).

use orch_queue::{Job, Machine, Ranked, Tenant, TenantInput};
use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

/// A tenant as the scheduler knows it.
#[derive(Debug, Clone, PartialEq)]
pub struct TenantConf {
    pub name: String,
    pub share: f64,
    pub max_gpus: Option<u32>,
}

/// Decayed usage: `gpu_s` GPU-seconds as of `as_of_s`, halving every half-life after.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Usage {
    pub gpu_s: f64,
    pub as_of_s: f64,
}

impl Usage {
    /// The usage at `now_s`.
    pub fn at(&self, now_s: f64, half_life_s: f64) -> f64 {
        let dt = now_s - self.as_of_s;
        if dt <= 0.0 || half_life_s <= 0.0 {
            return self.gpu_s;
        }
        self.gpu_s * (-dt / half_life_s).exp2()
    }

    /// Adds `gpus` devices used from `from_s` to `to_s`: each second's use decays from its own
    /// moment, so the amount is `gpus * h / ln 2 * (1 - 2^(-(to - from) / h))` at `to_s`.
    pub fn charge(&mut self, gpus: f64, from_s: f64, to_s: f64, half_life_s: f64) {
        let base = self.at(to_s.max(self.as_of_s), half_life_s);
        let used = decayed_use(gpus, from_s, to_s, half_life_s);
        // Use before `as_of_s` (a job that ended while no daemon watched) decays to `as_of_s`.
        let late = (self.as_of_s - to_s).max(0.0);
        self.gpu_s = base + used * (-late / half_life_s.max(f64::MIN_POSITIVE)).exp2();
        self.as_of_s = self.as_of_s.max(to_s);
    }

    /// Takes back what [`Usage::charge`] added for `gpus` devices from `from_s` to `to_s`, as
    /// decayed since: a job charged past its end, because its end reached the daemon late (a
    /// stalled or stopped daemon charges running jobs up to the moment it looks).
    pub fn refund(&mut self, gpus: f64, from_s: f64, to_s: f64, half_life_s: f64) {
        let used = decayed_use(gpus, from_s, to_s, half_life_s);
        let since = (self.as_of_s - to_s).max(0.0);
        let decayed = used * (-since / half_life_s.max(f64::MIN_POSITIVE)).exp2();
        self.gpu_s = (self.gpu_s - decayed).max(0.0);
    }
}

/// GPU-seconds of `gpus` devices used from `from_s` to `to_s`, each second decayed (half-life
/// `half_life_s`; no decay when it is not positive) from its own moment to `to_s`.
fn decayed_use(gpus: f64, from_s: f64, to_s: f64, half_life_s: f64) -> f64 {
    let span = (to_s - from_s).max(0.0);
    if half_life_s > 0.0 {
        let h = half_life_s / std::f64::consts::LN_2;
        gpus * h * -(-span / h).exp_m1()
    } else {
        gpus * span
    }
}

/// A queued job, as scheduling sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct QueuedJob {
    pub id: u64,
    /// Index into the tenants.
    pub tenant: usize,
    pub name: String,
    pub tags: Vec<String>,
    pub gpus: u32,
    /// An exclusive job takes its devices from the free count; a shared one does not.
    pub exclusive: bool,
    pub priority: i64,
    pub submitted_s: f64,
    /// When it entered the queue this time (a preempted job's is when it was queued again):
    /// the starvation limit and `preempt_after` count from here.
    pub queued_s: f64,
    pub runtime_s: Option<f64>,
    pub preemptible: bool,
}

/// A running job, as scheduling sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct RunningJob {
    pub id: u64,
    pub tenant: usize,
    pub gpus: u32,
    /// Holds its devices alone (stopping it frees them; a shared job's stop frees none).
    pub exclusive: bool,
    pub preemptible: bool,
    pub started_s: f64,
    /// Usage is charged up to here.
    pub charged_s: f64,
    /// GPU-seconds charged so far (undecayed).
    pub gpu_s: f64,
}

/// What placing a job came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attempt {
    Started,
    /// It stays queued, for this reason.
    Waits(String),
    /// It left the queue (failed or cancelled meanwhile).
    Left,
}

/// A job to stop and queue again.
#[derive(Debug, Clone, PartialEq)]
pub struct Preemption {
    pub victim: u64,
    pub for_job: u64,
    pub reason: String,
}

/// What one pass did.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct PassReport {
    pub started: Vec<u64>,
    /// Why each job still queued waits (with [`Scheduler::keep_reasons`]).
    pub reasons: Vec<(u64, String)>,
    pub preempt: Vec<Preemption>,
    /// The queue policy failed and this pass ran `fifo`: one sentence naming the policy and what
    /// it did.
    pub policy_failure: Option<String>,
    /// How long the queue policy took to answer, when it was asked.
    pub policy_seconds: Option<f64>,
}

/// Where the order of a pass comes from.
pub trait QueuePolicy: Send {
    /// The name messages use.
    fn name(&self) -> &str;
    /// The built-in this policy is, when the scheduler may compute it natively (the simulator);
    /// `None` makes every pass ask [`QueuePolicy::order`].
    fn native(&self) -> Option<&'static str> {
        None
    }
    /// The jobs in the order to try, each with a reason; an error is one sentence that names the
    /// policy.
    fn order(
        &mut self,
        jobs: &[Job],
        tenants: &[Tenant],
        machine: &Machine,
    ) -> Result<Vec<Ranked>, String>;
}

/// A built-in order computed in this process (`orch_queue`).
#[derive(Debug, Clone, Copy)]
pub struct NativePolicy {
    name: &'static str,
    order: fn(&[Job], &[Tenant], &Machine) -> Vec<Ranked>,
}

impl NativePolicy {
    /// `fifo`.
    pub const FIFO: NativePolicy = NativePolicy {
        name: "fifo",
        order: orch_queue::fifo,
    };

    pub fn new(name: &str) -> Option<NativePolicy> {
        let (name, _) = orch_queue::BUILTINS.iter().find(|(n, _)| *n == name)?;
        Some(NativePolicy {
            name,
            order: orch_queue::builtin(name)?,
        })
    }
}

impl QueuePolicy for NativePolicy {
    fn name(&self) -> &str {
        self.name
    }
    fn native(&self) -> Option<&'static str> {
        Some(self.name)
    }
    fn order(
        &mut self,
        jobs: &[Job],
        tenants: &[Tenant],
        machine: &Machine,
    ) -> Result<Vec<Ranked>, String> {
        Ok((self.order)(jobs, tenants, machine))
    }
}

/// A total order on f64 seconds (NaN never occurs: times come from clocks and parsed traces).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Secs(pub(crate) f64);
impl PartialEq for Secs {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other).is_eq()
    }
}
impl Eq for Secs {}
impl PartialOrd for Secs {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Secs {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&other.0)
    }
}

/// Within a tenant (and for `priority`): higher priority first, then older, then lower id.
type Key = (Reverse<i64>, Secs, u64);

fn key(job: &QueuedJob) -> Key {
    (Reverse(job.priority), Secs(job.submitted_s), job.id)
}

#[derive(Debug, Clone, Copy)]
struct Reservation {
    gpus: u32,
    until_s: f64,
}

/// A tenant counts as under (over) its share for preemption only beyond this margin of it, so
/// that two tenants near their shares do not preempt each other back and forth.
const PREEMPT_MARGIN: f64 = 0.05;

/// `starvation_limit` when the config names none: two hours.
pub const DEFAULT_STARVATION_S: f64 = 7200.0;

/// The queue, the running jobs and the usage, and the passes over them.
pub struct Scheduler {
    tenants: Vec<TenantConf>,
    usage: Vec<Usage>,
    half_life_s: f64,
    policy: Box<dyn QueuePolicy>,
    queue: BTreeMap<u64, QueuedJob>,
    by_tenant: Vec<BTreeSet<Key>>,
    by_priority: BTreeSet<Key>,
    shared_queued: usize,
    running: HashMap<u64, RunningJob>,
    held: Vec<u32>,
    reservations: HashMap<u64, Reservation>,
    preempting: HashSet<u64>,
    /// How long devices freed by preemption stay held for the job they were freed for.
    pub reservation_s: f64,
    /// A job that waited this long holds back free devices until it fits (`starvation_limit`).
    pub starvation_s: f64,
    /// A job waits this long before preemption is asked for it (`preempt_after`).
    pub preempt_after_s: f64,
    /// How many queued exclusive jobs ask for each device count.
    sizes: BTreeMap<u32, usize>,
    /// Compute a reason for every queued job (the daemon shows them); without, a pass may stop
    /// once nothing more can start (the simulator).
    pub keep_reasons: bool,
    /// Jobs held out of the queue by their dependencies or `singleton` ([`deps`]).
    deps: deps::Deps,
    /// The latest time a pass or an end was given: a job let out of [`deps`] is queued from here.
    clock_s: f64,
    /// The job arrays' tasks, queued or running, and how many of each array run.
    arrays: Arrays,
    /// What a job of MIG slices counts for in fair share and GPU-seconds, in whole GPUs (its
    /// slices' share of their GPUs' compute), by job; a job not here counts its `gpus`.
    compute: HashMap<u64, f64>,
    /// The profile (`1g.10gb`) of each queued job that asks for MIG slices to itself.
    slice_jobs: HashMap<u64, String>,
    /// Free slices (unleased, in service) by profile, as the caller last counted them.
    free_slices: HashMap<String, u32>,
}

/// A task of a job array as scheduling sees it: its array and the array's `max_parallel`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArrayMember {
    pub array: u64,
    pub max_parallel: Option<u32>,
}

/// Which queued and running jobs are tasks of a job array, and how many tasks of each array run:
/// a task whose array runs `max_parallel` of them waits without blocking anything behind it.
#[derive(Debug, Default)]
struct Arrays {
    members: HashMap<u64, ArrayMember>,
    running: HashMap<u64, u32>,
}

impl Arrays {
    /// Why task `id` may not start now, when its array runs its `max_parallel` tasks already.
    fn throttled(&self, id: u64) -> Option<String> {
        let member = self.members.get(&id)?;
        let max = member.max_parallel?;
        let running = self.running.get(&member.array).copied().unwrap_or(0);
        (running >= max).then(|| {
            format!(
                "array {}: {running} of {max} tasks running (max_parallel)",
                member.array
            )
        })
    }

    fn started(&mut self, id: u64) {
        if let Some(member) = self.members.get(&id) {
            *self.running.entry(member.array).or_default() += 1;
        }
    }

    fn stopped(&mut self, id: u64) {
        if let Some(member) = self.members.get(&id)
            && let Some(n) = self.running.get_mut(&member.array)
        {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.running.remove(&member.array);
            }
        }
    }
}

impl std::fmt::Debug for Scheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scheduler")
            .field("policy", &self.policy.name())
            .field("queued", &self.queue.len())
            .field("running", &self.running.len())
            .finish_non_exhaustive()
    }
}

impl Scheduler {
    pub fn new(
        tenants: Vec<TenantConf>,
        half_life_s: f64,
        policy: Box<dyn QueuePolicy>,
    ) -> Scheduler {
        let n = tenants.len();
        Scheduler {
            tenants,
            usage: vec![Usage::default(); n],
            half_life_s,
            policy,
            queue: BTreeMap::new(),
            by_tenant: vec![BTreeSet::new(); n],
            by_priority: BTreeSet::new(),
            shared_queued: 0,
            running: HashMap::new(),
            held: vec![0; n],
            reservations: HashMap::new(),
            preempting: HashSet::new(),
            reservation_s: 60.0,
            starvation_s: DEFAULT_STARVATION_S,
            preempt_after_s: 0.0,
            sizes: BTreeMap::new(),
            keep_reasons: true,
            arrays: Arrays::default(),
            deps: deps::Deps::default(),
            clock_s: f64::MIN,
            compute: HashMap::new(),
            slice_jobs: HashMap::new(),
            free_slices: HashMap::new(),
        }
    }

    /// Job `id` (queued or running) holds MIG slices that together are `gpus` whole GPUs of
    /// compute: its use is charged at that rate, not at its device count.
    pub fn set_compute(&mut self, id: u64, gpus: f64) {
        self.compute.insert(id, gpus);
    }

    /// Queued job `id` asks for MIG slices of `profile` (`1g.10gb`) to itself: the starvation
    /// bound holds free slices of that profile for it as it does free GPUs for a job of GPUs.
    pub fn set_slices(&mut self, id: u64, profile: &str) {
        self.slice_jobs
            .insert(id, orch_devices::mig::short_profile(profile).to_string());
    }

    /// The free MIG slices (unleased, in service) by profile, for the next passes.
    pub fn set_free_slices(&mut self, free: HashMap<String, u32>) {
        self.free_slices = free;
    }

    /// The whole GPUs job `id` of `devices` devices is charged for.
    fn compute_of(&self, id: u64, devices: u32) -> f64 {
        self.compute
            .get(&id)
            .copied()
            .unwrap_or_else(|| f64::from(devices))
    }

    /// A scheduler for `config`'s tenants, half-life, starvation limit and `preempt_after`.
    pub fn for_config(
        config: &crate::core::config::Config,
        policy: Box<dyn QueuePolicy>,
    ) -> Scheduler {
        let tenants = config
            .tenants
            .iter()
            .map(|t| TenantConf {
                name: t.name.clone(),
                share: t.share,
                max_gpus: t.max_gpus,
            })
            .collect();
        let mut sched = Scheduler::new(tenants, config.usage_half_life.as_secs_f64(), policy);
        sched.starvation_s = config.starvation_limit.as_secs_f64();
        sched.preempt_after_s = config.preempt_after.as_secs_f64();
        sched
    }

    pub fn tenants(&self) -> &[TenantConf] {
        &self.tenants
    }

    pub fn tenant_index(&self, name: &str) -> Option<usize> {
        self.tenants.iter().position(|t| t.name == name)
    }

    pub fn policy_name(&self) -> &str {
        self.policy.name()
    }

    pub fn half_life_s(&self) -> f64 {
        self.half_life_s
    }

    /// Sets a tenant's recorded usage (the daemon, from its database).
    pub fn set_usage(&mut self, tenant: usize, usage: Usage) {
        if let Some(u) = self.usage.get_mut(tenant) {
            *u = usage;
        }
    }

    pub fn usage(&self, tenant: usize) -> Usage {
        self.usage.get(tenant).copied().unwrap_or_default()
    }

    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    pub fn queued_job(&self, id: u64) -> Option<&QueuedJob> {
        self.queue.get(&id)
    }

    pub fn running_job(&self, id: u64) -> Option<&RunningJob> {
        self.running.get(&id)
    }

    pub fn running_jobs(&self) -> impl Iterator<Item = &RunningJob> {
        self.running.values()
    }

    /// GPUs a tenant's running jobs hold.
    pub fn held(&self, tenant: usize) -> u32 {
        self.held.get(tenant).copied().unwrap_or(0)
    }

    /// Jobs of a tenant in the queue.
    pub fn queued_of(&self, tenant: usize) -> usize {
        self.by_tenant.get(tenant).map_or(0, BTreeSet::len)
    }

    /// Queued and running jobs of a tenant.
    pub fn counts(&self, tenant: usize) -> (u32, u32) {
        let queued = self.queued_of(tenant) as u32;
        let running = self.running.values().filter(|r| r.tenant == tenant).count() as u32;
        (queued, running)
    }

    /// Makes job `id` a task of a job array, before it is queued or added as running: at most
    /// the array's `max_parallel` of its tasks run at once. Forgotten once the job leaves the
    /// scheduler (a requeued task is made one again).
    pub fn set_array(&mut self, id: u64, member: ArrayMember) {
        let running = self.running.contains_key(&id);
        if running {
            self.arrays.stopped(id);
        }
        self.arrays.members.insert(id, member);
        if running {
            self.arrays.started(id);
        }
    }

    /// How many tasks of job array `array` run.
    pub fn array_running(&self, array: u64) -> u32 {
        self.arrays.running.get(&array).copied().unwrap_or(0)
    }

    pub fn enqueue(&mut self, job: QueuedJob) {
        self.unqueue(job.id);
        if job.tenant >= self.tenants.len() {
            return;
        }
        self.by_tenant[job.tenant].insert(key(&job));
        self.by_priority.insert(key(&job));
        if job.exclusive {
            *self.sizes.entry(job.gpus).or_default() += 1;
        } else {
            self.shared_queued += 1;
        }
        self.queue.insert(job.id, job);
    }

    /// Queues `job`, or holds it out of the queue while what `wait` names is not met (see
    /// [`deps`]); `standing` says where each job it names stands now. `Err`: a dependency can
    /// never be met, and the job is to end cancelled with this reason.
    pub fn enqueue_after(
        &mut self,
        job: QueuedJob,
        wait: deps::Wait,
        standing: &mut dyn FnMut(u64) -> deps::Standing,
    ) -> Result<(), String> {
        self.dequeue(job.id);
        match self.deps.take(job, wait, standing) {
            deps::Taken::Ready(job) => {
                self.enqueue(job);
                Ok(())
            }
            deps::Taken::Held => Ok(()),
            deps::Taken::Never(reason) => Err(reason),
        }
    }

    /// Job `id` ended for good (`ok`: it succeeded; `how`: "failed (exit 1)", "was
    /// cancelled"): the jobs waiting on it go into the queue, or end. Returns those that end
    /// cancelled, down the chain, each with its reason.
    pub fn dependency_ended(&mut self, id: u64, ok: bool, how: String) -> Vec<(u64, String)> {
        let (ready, cancelled) = self.deps.ended(id, ok, how);
        self.let_in(ready);
        cancelled
    }

    /// Notes the group (user and name) of a job that runs without having been queued here (a
    /// running job adopted after a restart), for `singleton`.
    pub fn note_group(&mut self, id: u64, group: String) {
        self.deps.note_group(id, group);
    }

    /// Jobs held out of the queue by their dependencies or `singleton`.
    pub fn held_back(&self) -> usize {
        self.deps.held()
    }

    /// Whether job `id` is held out of the queue by its dependencies or `singleton`.
    pub fn is_held_back(&self, id: u64) -> bool {
        self.deps.is_held(id)
    }

    /// Why each job held out of the queue waits: "waiting for job 12 (running)".
    pub fn held_reasons(&self) -> Vec<(u64, String)> {
        self.deps.reasons(&|id| self.running.contains_key(&id))
    }

    /// Jobs let out of [`deps`]: queued from the latest time this scheduler was given.
    fn let_in(&mut self, ready: Vec<QueuedJob>) {
        for mut job in ready {
            job.queued_s = job.queued_s.max(self.clock_s);
            self.enqueue(job);
        }
    }

    /// Takes a job out of the queue (cancelled, failed, started elsewhere).
    pub fn dequeue(&mut self, id: u64) -> Option<QueuedJob> {
        self.deps.forget_held(id);
        self.slice_jobs.remove(&id);
        let job = self.unqueue(id);
        if !self.running.contains_key(&id) {
            self.arrays.members.remove(&id);
            self.compute.remove(&id);
        }
        job
    }

    /// Takes a job out of the queue's indexes, keeping what else is known of it (its array).
    fn unqueue(&mut self, id: u64) -> Option<QueuedJob> {
        let job = self.queue.remove(&id)?;
        self.by_tenant[job.tenant].remove(&key(&job));
        self.by_priority.remove(&key(&job));
        if job.exclusive {
            if let Some(n) = self.sizes.get_mut(&job.gpus) {
                *n -= 1;
                if *n == 0 {
                    self.sizes.remove(&job.gpus);
                }
            }
        } else {
            self.shared_queued -= 1;
        }
        self.reservations.remove(&id);
        Some(job)
    }

    /// Records a running job (started by a pass, or adopted after a restart).
    pub fn add_running(&mut self, job: RunningJob) {
        self.remove_running(job.id);
        if job.tenant >= self.tenants.len() {
            return;
        }
        self.held[job.tenant] += job.gpus;
        self.arrays.started(job.id);
        self.deps.started(job.id);
        self.running.insert(job.id, job);
    }

    /// Ends a running job at `at_s`: its use is charged up to then, and never beyond: what was
    /// charged past `at_s` (the end reached the daemon late) is taken back. Returns it.
    pub fn end(&mut self, id: u64, at_s: f64) -> Option<RunningJob> {
        self.clock_s = self.clock_s.max(at_s);
        self.charge_job(id, at_s);
        self.refund_job(id, at_s);
        self.remove_running(id)
    }

    /// Takes back job `id`'s charge past `to_s` (never before its start). Its `gpu_s` may go
    /// below zero: part of what is taken back may have been charged before a restart, into the
    /// job's earlier total.
    fn refund_job(&mut self, id: u64, to_s: f64) {
        let half_life = self.half_life_s;
        let rate = self
            .running
            .get(&id)
            .map_or(0.0, |job| self.compute_of(id, job.gpus));
        if let Some(job) = self.running.get_mut(&id) {
            let from = to_s.max(job.started_s);
            if from < job.charged_s {
                self.usage[job.tenant].refund(rate, from, job.charged_s, half_life);
                job.gpu_s -= rate * (job.charged_s - from);
                job.charged_s = from;
            }
        }
    }

    fn remove_running(&mut self, id: u64) -> Option<RunningJob> {
        let job = self.running.remove(&id)?;
        if !self.queue.contains_key(&id) {
            self.compute.remove(&id);
        }
        self.arrays.stopped(id);
        if !self.queue.contains_key(&id) {
            self.arrays.members.remove(&id);
        }
        self.held[job.tenant] = self.held[job.tenant].saturating_sub(job.gpus);
        self.preempting.remove(&id);
        let ready = self.deps.stopped(id);
        self.let_in(ready);
        Some(job)
    }

    fn charge_job(&mut self, id: u64, to_s: f64) {
        let half_life = self.half_life_s;
        let rate = self
            .running
            .get(&id)
            .map_or(0.0, |job| self.compute_of(id, job.gpus));
        if let Some(job) = self.running.get_mut(&id)
            && to_s > job.charged_s
        {
            self.usage[job.tenant].charge(rate, job.charged_s, to_s, half_life);
            job.gpu_s += rate * (to_s - job.charged_s);
            job.charged_s = to_s;
        }
    }

    /// Charges every running job's use up to `now_s`.
    pub fn charge(&mut self, now_s: f64) {
        let ids: Vec<u64> = self.running.keys().copied().collect();
        for id in ids {
            self.charge_job(id, now_s);
        }
    }

    /// Every tenant's standing at `now_s` (usage charged up to then).
    pub fn standing(&mut self, now_s: f64) -> Vec<Tenant> {
        self.charge(now_s);
        let inputs: Vec<TenantInput> = self
            .tenants
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let (queued, running) = self.counts(i);
                TenantInput {
                    name: t.name.clone(),
                    share: t.share,
                    usage_gpu_s: self.usage[i].at(now_s, self.half_life_s),
                    gpus_held: self.held[i],
                    max_gpus: t.max_gpus,
                    queued,
                    running,
                }
            })
            .collect();
        Tenant::all(&inputs)
    }

    /// One pass at `now_s` on a machine with `machine.free_gpus` free devices: orders the queue,
    /// tries each job through `place` within the limits, and picks jobs to preempt.
    pub fn pass(
        &mut self,
        now_s: f64,
        machine: Machine,
        place: &mut dyn FnMut(&QueuedJob) -> Attempt,
    ) -> PassReport {
        let mut report = PassReport::default();
        self.clock_s = self.clock_s.max(now_s);
        self.reservations
            .retain(|_, r| r.until_s >= now_s && r.gpus > 0);
        if self.queue.is_empty() {
            return report;
        }
        let tenants = self.standing(now_s);
        let lazy = !self.keep_reasons && self.policy.native().is_some();
        let order: Option<Vec<Ranked>> = if lazy {
            None
        } else {
            let jobs = self.offered(now_s);
            let name = self.policy.name().to_string();
            let asked = std::time::Instant::now();
            let answer = self.policy.order(&jobs, &tenants, &machine);
            report.policy_seconds = Some(asked.elapsed().as_secs_f64());
            match answer.and_then(|order| {
                orch_queue::check_order(&jobs, &order)
                    .map(|()| order)
                    .map_err(|e| format!("queue policy `{name}` gave a wrong answer: {e}"))
            }) {
                Ok(order) => Some(order),
                Err(e) => {
                    report.policy_failure = Some(format!("{e}; this pass used fifo"));
                    Some(orch_queue::fifo(&jobs, &tenants, &machine))
                }
            }
        };
        let mut walk = Walk {
            free: machine.free_gpus,
            blocked: Vec::new(),
            visited: HashSet::new(),
            held_for: HashMap::new(),
            free_slices: self.free_slices.clone(),
            slices_held_for: HashMap::new(),
        };
        match order {
            Some(order) => {
                for ranked in order {
                    walk.visited.insert(ranked.job);
                    self.consider(
                        ranked.job,
                        &ranked.reason,
                        now_s,
                        &mut walk,
                        &mut report,
                        place,
                    );
                }
                if self.keep_reasons {
                    let name = self.policy.name().to_string();
                    for &id in self.queue.keys() {
                        if !walk.visited.contains(&id) {
                            report.reasons.push((
                                id,
                                format!("the queue policy {name} left it out of this pass"),
                            ));
                        }
                    }
                }
            }
            None => self.lazy_walk(&tenants, now_s, &mut walk, &mut report, place),
        }
        self.preempt(&tenants, now_s, &walk, &mut report);
        report
    }

    /// The queue as the policy sees it.
    fn offered(&self, now_s: f64) -> Vec<Job> {
        self.queue
            .values()
            .map(|j| Job {
                id: j.id,
                tenant: j.tenant as u32,
                name: j.name.clone(),
                tags: j.tags.clone(),
                gpus: j.gpus,
                priority: j.priority,
                age_s: (now_s - j.submitted_s).max(0.0),
                runtime_s: j.runtime_s,
                preemptible: j.preemptible,
            })
            .collect()
    }

    fn reserved_for_others(&self, id: u64) -> u32 {
        self.reservations
            .iter()
            .filter(|(j, _)| **j != id)
            .map(|(_, r)| r.gpus)
            .sum()
    }

    /// Tries one job.
    fn consider(
        &mut self,
        id: u64,
        policy_reason: &str,
        now_s: f64,
        walk: &mut Walk,
        report: &mut PassReport,
        place: &mut dyn FnMut(&QueuedJob) -> Attempt,
    ) {
        let Some(job) = self.queue.get(&id) else {
            return;
        };
        let keep = self.keep_reasons;
        let with = |reason: String| {
            if policy_reason.is_empty() {
                reason
            } else {
                format!("{reason}; {policy_reason}")
            }
        };
        // A task of an array at its `max_parallel` waits, and blocks nothing: it neither asks for
        // preemption nor holds back devices, so the jobs behind it start (backfill).
        if let Some(why) = self.arrays.throttled(id) {
            if keep {
                report.reasons.push((id, with(why)));
            }
            return;
        }
        // A job of slices past the starvation limit, within its tenant's max_gpus: while fewer
        // than it asks for are free, the free slices of its profile are held for it. (When
        // enough are free it is placed; should placement still refuse, as it would for slices
        // that never suit the job, they are not held: such a job must not block the profile.)
        if let Some(profile) = self.slice_jobs.get(&id) {
            let starving = now_s - job.queued_s >= self.starvation_s
                && self.tenants[job.tenant]
                    .max_gpus
                    .is_none_or(|max| self.held[job.tenant] + job.gpus <= max);
            let free = walk.free_slices.get(profile).copied().unwrap_or(0);
            if job.gpus > free {
                if let Some(&first) = walk.slices_held_for.get(profile) {
                    if keep {
                        report.reasons.push((
                            id,
                            with(format!(
                                "waiting for {} free {profile} slice(s); the free ones are held for job {first} (it waited over the starvation limit)",
                                job.gpus
                            )),
                        ));
                    }
                    return;
                }
                if starving && free > 0 {
                    // Hold back its profile's free slices: one-slice jobs behind it no longer
                    // take every slice that frees up.
                    walk.slices_held_for.insert(profile.clone(), id);
                    walk.free_slices.insert(profile.clone(), 0);
                    if keep {
                        report.reasons.push((
                            id,
                            with(format!(
                                "waiting for {} free {profile} slice(s); holding the {free} free ones for it (it waited over the starvation limit)",
                                job.gpus
                            )),
                        ));
                    }
                    return;
                }
            }
        }
        let reserved = self.reserved_for_others(id);
        let available = walk.free.saturating_sub(reserved);
        if job.exclusive && job.gpus > available {
            walk.blocked.push(id);
            let starving = now_s - job.queued_s >= self.starvation_s
                && self.tenants[job.tenant]
                    .max_gpus
                    .is_none_or(|max| self.held[job.tenant] + job.gpus <= max);
            if starving && available > 0 {
                // Hold back what is free for it: smaller jobs behind it no longer take it.
                walk.free -= available;
                walk.held_for.insert(id, available);
                if keep {
                    report.reasons.push((
                        id,
                        with(format!(
                            "waiting for {} free device(s); holding the {available} free ones for it (it waited over the starvation limit)",
                            job.gpus
                        )),
                    ));
                }
                return;
            }
            if keep {
                let held_back = if reserved > 0 && walk.free > available {
                    format!(
                        " ({} more held for a job that preemption freed them for)",
                        walk.free - available
                    )
                } else {
                    String::new()
                };
                report.reasons.push((
                    id,
                    with(format!(
                        "waiting for {} free device(s); {available} free{held_back}",
                        job.gpus
                    )),
                ));
            }
            return;
        }
        let tenant = &self.tenants[job.tenant];
        if let Some(max) = tenant.max_gpus {
            let holds = self.held[job.tenant];
            if holds + job.gpus > max {
                if keep {
                    report.reasons.push((
                        id,
                        with(format!(
                            "tenant {} holds {holds} device(s) of its max_gpus = {max}",
                            tenant.name
                        )),
                    ));
                }
                return;
            }
        }
        let slices = self.slice_jobs.get(&id).cloned();
        match place(job) {
            Attempt::Started => {
                let Some(job) = self.unqueue(id) else {
                    return;
                };
                if job.exclusive {
                    walk.free = walk.free.saturating_sub(job.gpus);
                }
                if let Some(profile) = slices {
                    self.slice_jobs.remove(&id);
                    if let Some(free) = walk.free_slices.get_mut(&profile) {
                        *free = free.saturating_sub(job.gpus);
                    }
                }
                self.add_running(RunningJob {
                    id,
                    tenant: job.tenant,
                    gpus: job.gpus,
                    exclusive: job.exclusive,
                    preemptible: job.preemptible,
                    started_s: now_s,
                    charged_s: now_s,
                    gpu_s: 0.0,
                });
                report.started.push(id);
            }
            Attempt::Waits(reason) => {
                if job.exclusive {
                    walk.blocked.push(id);
                }
                if keep {
                    report.reasons.push((id, with(reason)));
                }
            }
            Attempt::Left => {
                self.dequeue(id);
            }
        }
    }

    /// A built-in order without asking for all of it: tenants' queues merged in the built-in's
    /// order, stopping once nothing more can start. Chunks of the order are drawn from the
    /// queue's indexes between placements (which change them).
    fn lazy_walk(
        &mut self,
        tenants: &[Tenant],
        now_s: f64,
        walk: &mut Walk,
        report: &mut PassReport,
        place: &mut dyn FnMut(&QueuedJob) -> Attempt,
    ) {
        let name = self.policy.native().unwrap_or("fifo");
        let mut cursor = Cursor::default();
        loop {
            let total_reserved: u32 = self.reservations.values().map(|r| r.gpus).sum();
            let smallest = self.sizes.keys().next().copied().unwrap_or(u32::MAX);
            if walk.free.saturating_sub(total_reserved) < smallest && self.shared_queued == 0 {
                break;
            }
            let chunk = self.next_chunk(name, tenants, &mut cursor, 64);
            if chunk.is_empty() {
                break;
            }
            for id in chunk {
                walk.visited.insert(id);
                self.consider(id, "", now_s, walk, report, place);
            }
        }
        // Jobs holding a reservation get their devices even when the walk stopped before them.
        let reserved: Vec<u64> = self
            .reservations
            .keys()
            .copied()
            .filter(|id| !walk.visited.contains(id))
            .collect();
        for id in reserved {
            walk.visited.insert(id);
            self.consider(id, "", now_s, walk, report, place);
        }
        // The first waiting job of each tenant may still ask for preemption.
        for set in &self.by_tenant {
            if let Some(&(_, _, id)) = set.first()
                && !walk.visited.contains(&id)
            {
                walk.blocked.push(id);
            }
        }
    }

    /// The next `n` job ids of built-in order `name` after the cursor.
    fn next_chunk(
        &self,
        name: &str,
        tenants: &[Tenant],
        cursor: &mut Cursor,
        n: usize,
    ) -> Vec<u64> {
        use std::ops::Bound::{Excluded, Unbounded};
        let mut out = Vec::with_capacity(n);
        match name {
            "fifo" => {
                let from = cursor.last_id.map_or(Unbounded, Excluded);
                out.extend(
                    self.queue
                        .range((from, Unbounded))
                        .take(n)
                        .map(|(id, _)| *id),
                );
                cursor.last_id = out.last().copied().or(cursor.last_id);
            }
            "priority" => {
                let from = cursor.last_key.map_or(Unbounded, Excluded);
                out.extend(
                    self.by_priority
                        .range((from, Unbounded))
                        .take(n)
                        .map(|k| k.2),
                );
                if let Some(&id) = out.last() {
                    cursor.last_key = self.queue.get(&id).map(key);
                }
            }
            _ => {
                // fair-share: the merge of every tenant's queue by (factor desc, key).
                if cursor.per_tenant.is_empty() {
                    cursor.per_tenant = vec![None; self.by_tenant.len()];
                }
                let factor = |t: usize| tenants.get(t).map_or(0.0, |t| t.fair_share);
                let mut heads: Vec<(usize, Key)> = Vec::new();
                let next_of = |t: usize, after: Option<Key>| -> Option<Key> {
                    let from = after.map_or(Unbounded, Excluded);
                    self.by_tenant[t].range((from, Unbounded)).next().copied()
                };
                for t in 0..self.by_tenant.len() {
                    if let Some(k) = next_of(t, cursor.per_tenant[t]) {
                        heads.push((t, k));
                    }
                }
                while out.len() < n {
                    let best = heads.iter().enumerate().min_by(|(_, a), (_, b)| {
                        factor(b.0)
                            .total_cmp(&factor(a.0))
                            .then(a.1.0.cmp(&b.1.0))
                            .then(a.1.1.cmp(&b.1.1))
                            .then(a.1.2.cmp(&b.1.2))
                    });
                    let Some((slot, &(t, k))) = best else { break };
                    out.push(k.2);
                    cursor.per_tenant[t] = Some(k);
                    match next_of(t, Some(k)) {
                        Some(next) => heads[slot] = (t, next),
                        None => {
                            heads.swap_remove(slot);
                        }
                    }
                }
            }
        }
        out
    }

    /// Picks preemptible jobs of tenants over their share to stop for the first waiting job of
    /// each tenant under its share.
    fn preempt(&mut self, tenants: &[Tenant], now_s: f64, walk: &Walk, report: &mut PassReport) {
        let any_preemptible = self
            .running
            .values()
            .any(|r| r.preemptible && !self.preempting.contains(&r.id));
        if !any_preemptible {
            return;
        }
        let under = |t: usize| {
            tenants
                .get(t)
                .is_some_and(|t| t.normalized_usage < t.normalized_share * (1.0 - PREEMPT_MARGIN))
        };
        let over = |t: usize| {
            tenants
                .get(t)
                .is_some_and(|t| t.normalized_usage > t.normalized_share * (1.0 + PREEMPT_MARGIN))
        };
        let mut asked: HashSet<usize> = HashSet::new();
        for &id in &walk.blocked {
            let Some(job) = self.queue.get(&id) else {
                continue;
            };
            if !job.exclusive
                || now_s - job.queued_s < self.preempt_after_s
                || !under(job.tenant)
                || !asked.insert(job.tenant)
                || self.reservations.contains_key(&id)
            {
                continue;
            }
            if let Some(max) = self.tenants[job.tenant].max_gpus
                && self.held[job.tenant] + job.gpus > max
            {
                continue;
            }
            let reserved = self.reserved_for_others(id);
            // What the walk held back for this job is its own to count.
            let held = walk.held_for.get(&id).copied().unwrap_or(0);
            let need = job
                .gpus
                .saturating_sub(walk.free.saturating_sub(reserved) + held);
            if need == 0 {
                continue;
            }
            let mut pool: Vec<&RunningJob> = self
                .running
                .values()
                .filter(|r| {
                    r.preemptible
                        && r.exclusive
                        && !self.preempting.contains(&r.id)
                        && r.tenant != job.tenant
                        && over(r.tenant)
                })
                .collect();
            // The most over-served tenant first, and its most recent job (the least work lost).
            pool.sort_by(|a, b| {
                let fa = tenants.get(a.tenant).map_or(0.0, |t| t.fair_share);
                let fb = tenants.get(b.tenant).map_or(0.0, |t| t.fair_share);
                fa.total_cmp(&fb)
                    .then(b.started_s.total_cmp(&a.started_s))
                    .then(b.id.cmp(&a.id))
            });
            let mut chosen = Vec::new();
            let mut freed = 0;
            for r in pool {
                if freed >= need {
                    break;
                }
                freed += r.gpus;
                chosen.push(r.id);
            }
            if freed < need {
                continue;
            }
            let standing = tenants[job.tenant].standing();
            for victim in chosen {
                self.preempting.insert(victim);
                report.preempt.push(Preemption {
                    victim,
                    for_job: id,
                    reason: format!("preempted for job {id}: {standing}"),
                });
            }
            self.reservations.insert(
                id,
                Reservation {
                    gpus: job.gpus,
                    until_s: now_s + self.reservation_s,
                },
            );
        }
    }

    /// Whether a stop was asked for this running job by preemption.
    pub fn is_preempting(&self, id: u64) -> bool {
        self.preempting.contains(&id)
    }
}

struct Walk {
    free: u32,
    /// Jobs that wait for devices, in order: candidates for preemption.
    blocked: Vec<u64>,
    /// Queued jobs the walk has reached.
    visited: HashSet<u64>,
    /// Devices held back for a starving job, by job.
    held_for: HashMap<u64, u32>,
    /// Free MIG slices by profile, less those taken or held back in this pass.
    free_slices: HashMap<String, u32>,
    /// The starving job each profile's free slices are held for in this pass.
    slices_held_for: HashMap<String, u64>,
}

#[derive(Default)]
struct Cursor {
    last_id: Option<u64>,
    last_key: Option<Key>,
    per_tenant: Vec<Option<Key>>,
}

pub mod deps;

#[cfg(test)]
mod tests;
