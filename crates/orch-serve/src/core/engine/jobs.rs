//! What the engine holds besides its scheduler ([`Jobs`]), and what it does with it: placing a
//! queued job (claim, the job's folder, the database's record of its start, its supervisor),
//! releasing leases, and the writes that wait while the state folder takes none.

use super::running::{self, Origin, Running, Start};
use super::{Pending, Queued, Release, ms_to_s};
use crate::core::db::{Change, Event, State, Update};
use crate::core::folders::{self, ExitRecord, Fence, SuperviseSpec};
use crate::core::kick::Kick;
use crate::core::policy_worker::{AskLease, Verdict, snapshot_key};
use crate::core::state::{Shared, SupervisorEnd};
use orch_core::sync::lock;
use orch_core::time::now_ms;
use orch_devices::{Inventory, Visibility, VisibilityEnv};
use orch_host::PolicyHost;
use orch_leases::{Holder, LeaseStore};
use orch_runner::{Machine, PlaceError};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What the engine holds besides the scheduler: the jobs it queued and watches run, the lease
/// store and the policy host that place them, and the writes waiting on an unwell state folder.
/// Placing a job needs this alone, so a scheduling pass can place while it walks the queue.
pub(super) struct Jobs {
    pub(super) shared: Arc<Shared>,
    pub(super) store: LeaseStore,
    pub(super) host: PolicyHost,
    /// The latest reading of the devices, refreshed by a thread of its own (an NVML reading takes
    /// milliseconds per GPU: not on the path from a submission to its start).
    pub(super) inventory: Arc<Inventory>,
    pub(super) visibility: Visibility,
    /// The visible devices placement may use: all of them, or without those busy with foreign
    /// processes under `foreign = "avoid"`.
    pub(super) placeable: Visibility,
    pub(super) queue: BTreeMap<i64, Queued>,
    pub(super) running: HashMap<i64, Running>,
    /// Writes and releases that failed on an unwell state folder, made again in order.
    pub(super) backlog: VecDeque<Pending>,
    /// When the state folder was last probed while unwell.
    pub(super) last_probe: Instant,
    /// Jobs whose supervisor's liveness `/proc` could not tell, and when that was last logged.
    pub(super) unknown_logged: HashMap<i64, Instant>,
    /// The device rule on each held lease's process, lifted when the lease ends.
    pub(super) confined: HashMap<i64, orch_exec::devices::DeviceConstraint>,
    /// Jobs whose policy, asked by its tenant's worker, found no fit in this pass.
    pub(super) no_fit: Vec<i64>,
    /// What policies are asked on ([`Jobs::snapshot`]), read once per pass and again after a
    /// lease is taken or given back: a pass that looks at many jobs of sent policies reads the
    /// lease store once.
    pub(super) snapshot: Option<Snapshot>,
}

/// The devices placement may use (physical index, MIG instance), the leases held, their hash.
pub(super) type Snapshot = (Vec<(u32, Option<String>)>, Vec<AskLease>, u64);

/// What placing a queued job did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Placed {
    /// Its supervisor is starting (or its held lease runs).
    Started,
    /// It stays queued, for this reason.
    Waits(String),
    /// It left the queue meanwhile (cancelled): nothing more to do.
    Left,
    /// It cannot start, ever: it ends in this state (failed, cancelled) with this reason.
    Ends(State, String),
}

impl Jobs {
    /// `/proc` or the job's folder could not tell how job `id` stands: it stays as it is, and
    /// the log says so at most once a minute.
    pub(super) fn cannot_tell(&mut self, id: i64, why: String) {
        let now = Instant::now();
        let due = self
            .unknown_logged
            .get(&id)
            .is_none_or(|at| now.duration_since(*at) >= Duration::from_secs(60));
        if due {
            tracing::warn!("job {id}: {why}; it stays as it is until the daemon can tell");
            self.unknown_logged.insert(id, now);
        }
    }

    /// While the state folder is unwell, or writes wait: probes it (at most twice a second) and,
    /// once it takes writes, makes the waiting ones in order. True when something was caught up.
    pub(super) fn catch_up(&mut self) -> bool {
        if self.backlog.is_empty() && self.shared.health.fault().is_none() {
            return false;
        }
        if self.last_probe.elapsed() < Duration::from_millis(500) {
            return false;
        }
        self.last_probe = Instant::now();
        if let Err(e) = self.shared.health.probe() {
            if let Some(fault) = crate::core::health::fault_of_io(&e) {
                self.shared.health.report(fault, e.to_string());
            }
            return false;
        }
        let mut done = 0;
        while let Some(pending) = self.backlog.front() {
            let result = match pending {
                Pending::Write(id, change) => {
                    let (id, change) = (*id, change.as_ref().clone());
                    self.shared
                        .db
                        .write_blocking(move |tx| crate::core::db::apply(tx, id, &change))
                        .map(|_| ())
                        .map_err(|e| (e.fault(), e.to_string()))
                }
                Pending::Release(release) => {
                    let release = release.clone();
                    self.store_release(&release)
                        .map(|_| ())
                        .map_err(|e| (Some(crate::core::health::Fault::Io), e.to_string()))
                }
            };
            match result {
                Ok(()) => {
                    self.backlog.pop_front();
                    done += 1;
                }
                Err((Some(fault), e)) => {
                    self.shared.health.report(fault, e);
                    break;
                }
                Err((None, e)) => {
                    tracing::error!("a delayed write failed and is dropped: {e}");
                    self.backlog.pop_front();
                }
            }
        }
        if done > 0 {
            self.publish_leases();
        }
        if self.backlog.is_empty() {
            self.shared.health.recovered();
        }
        done > 0
    }

    /// Claims devices for queued job `id` and starts its supervisor (or runs its held lease);
    /// says what it did. A job that can never start leaves the queue here and is ended by the
    /// caller ([`Placed::Ends`]).
    pub(super) fn place(&mut self, id: i64) -> Placed {
        let (job, lease, plan) = match self.claim(id) {
            Ok(claimed) => claimed,
            Err(placed) => return placed,
        };
        if self.shared.root {
            orch_exec::prime_cgroup_migration();
        }
        let attempt = job.row.attempt + 1;
        let dir = self.shared.job_dir(id, attempt);
        // The job's folder is written before it shows as running: whoever sees a held lease
        // running can read its devices, and a command job never runs with no folder.
        let holder = job.submission.holder.clone();
        if let Some(holder) = &holder
            && let Err(placed) = self.confine_holder(id, holder, &lease, &plan)
        {
            return placed;
        }
        let written = match &holder {
            Some(holder) => self.write_lease_folder(id, &dir, &job, &lease, &plan, holder),
            None => self.write_job_folder(id, &dir, &job, &lease, &plan),
        };
        if let Err(placed) = written {
            // A command job waits in the queue for the state folder to take writes again.
            if holder.is_none() {
                self.queue.insert(id, job);
            }
            return placed;
        }
        if let Err(placed) = self.record_start(id, attempt, &lease) {
            if matches!(placed, Placed::Waits(_)) {
                self.queue.insert(id, job);
            }
            return placed;
        }
        // Decided, and recorded as running: a lease's request that reads it sees it running.
        self.shared.policies.forget(id);
        self.shared.metrics.started(
            &job.row.tenant,
            ms_to_s(now_ms().saturating_sub(job.row.submitted_at_ms)),
        );
        let start = Start {
            tenant: job.row.tenant.clone(),
            devices: lease.devices.clone(),
            attempt,
            lease_id: lease.id.clone(),
            requeue: job.row.requeue,
            prior_gpu_s: job.row.gpu_seconds,
        };
        match holder {
            // A held lease runs: the engine watches its process as it watches a supervisor.
            Some(holder) => {
                let start = Start {
                    requeue: false,
                    ..start
                };
                let mut watched = Running::new(start, Origin::Held, Some(holder), Instant::now());
                if let Some(alloc) = &job.submission.alloc {
                    let tenant = self.shared.config.tenant(&job.row.tenant);
                    let limit = running::time_limit(&job.spec, tenant);
                    watched.set_alloc(running::AllocLimits::new(alloc, limit, now_ms()));
                }
                self.running.insert(id, watched);
            }
            None => {
                let job = Running::new(start, Origin::Spawned, None, Instant::now());
                self.running.insert(id, job);
                if let Err(e) = self.spawn_supervisor(id, attempt, &dir) {
                    self.not_started(id, &dir, &e);
                }
            }
        }
        Placed::Started
    }

    /// Takes queued job `id` out of the queue with the devices its policy chose; `Err`: what
    /// placing it came to instead (it waits, left, or can never start).
    pub(super) fn claim(
        &mut self,
        id: i64,
    ) -> Result<(Queued, orch_leases::Lease, orch_runner::Plan), Placed> {
        let dead_holder = self
            .queue
            .get(&id)
            .and_then(|j| j.submission.holder.as_ref())
            .filter(|h| h.liveness().is_dead())
            .map(|h| h.pid);
        if let Some(pid) = dead_holder {
            self.queue.remove(&id);
            let reason = format!("its process (pid {pid}) ended while it waited");
            return Err(Placed::Ends(State::Cancelled, reason));
        }
        // A held lease's process is watched with all it starts from its first placement on.
        let root = self.shared.root;
        if let Some(holder) = self
            .queue
            .get_mut(&id)
            .and_then(|j| j.submission.holder.as_mut())
            .filter(|h| h.cgroup.is_none())
        {
            *holder = crate::core::holders::track(root, holder.clone());
        }
        let Some(job) = self.queue.get(&id) else {
            return Err(Placed::Left);
        };
        // A policy the tenant sent: placed once compiled, off this thread.
        let sent = job.submission.policy_file.clone();
        if let Some(hash) = &sent {
            let plugin = &job.spec.policy.plugin;
            match self
                .shared
                .compiler
                .prepare(&mut self.host, hash, &job.row.tenant, plugin)
            {
                crate::core::compile::Prepared::Ready => {}
                crate::core::compile::Prepared::Waits(reason) => {
                    self.shared.policies.set_undecided(id, true);
                    return Err(Placed::Waits(reason));
                }
                crate::core::compile::Prepared::Failed(reason) => {
                    self.queue.remove(&id);
                    return Err(Placed::Ends(State::Failed, reason));
                }
            }
        }
        // ... and asked away from this pass, in its tenant's policy workers: the pass claims the
        // plan it made, checked against the leases held now.
        let proposal = match &sent {
            Some(hash) => match self.asked_plan(id, hash) {
                Ok(plan) => Some(plan),
                Err(placed) => return Err(placed),
            },
            None => None,
        };
        let Some(job) = self.queue.get(&id) else {
            return Err(Placed::Left);
        };
        let env_map: HashMap<&str, &str> = job
            .submission
            .env
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let env = |name: &str| env_map.get(name).map(|v| v.to_string());
        let machine = Machine {
            inventory: &self.inventory,
            visibility: &self.placeable,
            env: &env,
            nested: false,
        };
        // A lease held by the client's process: that process is its holder, so the lease store
        // reclaims it when the process dies, whatever happens to the daemon.
        let holder = job
            .submission
            .holder
            .clone()
            .unwrap_or_else(Holder::current);
        // The lease is named after the job's number, not its name: lease ids, the leases other
        // jobs' policies are shown and the reasons those give reach other tenants, from whom a
        // job's name is hidden.
        let spec = orch_core::job::JobSpec {
            name: lease_name(id),
            ..job.spec.clone()
        };
        let claimed = match &proposal {
            Some(plan) => {
                orch_runner::claim_proposed(&mut self.store, &spec, &machine, holder, plan)
            }
            None => {
                let deciding = Instant::now();
                let claimed =
                    orch_runner::claim(&mut self.store, &mut self.host, &spec, &machine, holder);
                self.shared
                    .metrics
                    .decision("placement", deciding.elapsed().as_secs_f64());
                claimed
            }
        };
        if let (Some(hash), Err(PlaceError::NoFit(stale))) = (&sent, &claimed) {
            // The machine changed under the snapshot: the policy is asked again.
            let stale = stale.clone();
            let why = match self.ask_policy(id, hash) {
                Placed::Waits(why) => why,
                other => return Err(other),
            };
            return Err(Placed::Waits(stale_reason(&stale, &why)));
        }
        let (lease, plan) = match claimed {
            Ok(placed) => {
                self.snapshot = None;
                placed
            }
            Err(PlaceError::NoFit(reason)) => return Err(Placed::Waits(reason)),
            Err(PlaceError::Store(e)) => {
                return Err(Placed::Waits(format!("the lease store failed: {e}")));
            }
            Err(e) => {
                self.queue.remove(&id);
                return Err(Placed::Ends(State::Failed, e.to_string()));
            }
        };
        match self.queue.remove(&id) {
            Some(job) => Ok((job, lease, plan)),
            None => Err(Placed::Left),
        }
    }

    /// The plan queued job `id`'s policy (the component `hash` its tenant sent) made, asked in
    /// the tenant's policy workers on a snapshot of the machine as it is now; `Err`: the job waits
    /// (its policy is being asked, or found nothing that fits) or fails (its policy failed).
    fn asked_plan(&mut self, id: i64, hash: &str) -> Result<orch_runner::Plan, Placed> {
        // Asked, or waiting its turn: nothing to read (a pass may look at many such jobs).
        if let Some(why) = self.shared.policies.pending(id) {
            self.shared.policies.set_undecided(id, true);
            return Err(Placed::Waits(why));
        }
        let snapshot = match self.read_snapshot() {
            Ok((_, _, key)) => *key,
            Err(why) => return Err(Placed::Waits(why)),
        };
        match self.shared.policies.verdict(id, snapshot) {
            // Still undecided until it is claimed (or asked again).
            Verdict::Plan(plan) => Ok(*plan),
            Verdict::Pending(why) => {
                self.shared.policies.set_undecided(id, true);
                Err(Placed::Waits(why))
            }
            Verdict::NoFit(why) => {
                // Decided once this pass's reasons are out (a lease without `wait` reads them).
                self.no_fit.push(id);
                Err(Placed::Waits(why))
            }
            Verdict::Failed(why) => {
                self.shared.policies.forget(id);
                self.queue.remove(&id);
                Err(Placed::Ends(State::Failed, why))
            }
            Verdict::Ask => Err(self.ask_policy(id, hash)),
        }
    }

    /// Hands queued job `id`'s policy (component `hash`) and a snapshot of the machine to its
    /// tenant's policy workers: it waits now (and why), or it can never be placed.
    fn ask_policy(&mut self, id: i64, hash: &str) -> Placed {
        let (visible, leases, snapshot) = match self.snapshot() {
            Ok(snapshot) => snapshot,
            Err(why) => return Placed::Waits(why),
        };
        let Some(job) = self.queue.get(&id) else {
            return Placed::Left;
        };
        let tenant = job.row.tenant.clone();
        // The job's deadline and memory cap, within the machine's maxima; the memory also
        // within what its tenant's policies may hold together.
        let bounds = match orch_core::MachineLimits::current().and_then(|machine| {
            machine.resolve(
                orch_core::limits::PluginKind::Policy,
                &job.spec.policy.limits,
            )
        }) {
            Ok(bounds) => bounds,
            Err(e) => {
                self.queue.remove(&id);
                return Placed::Ends(State::Failed, e.to_string());
            }
        };
        let budget = self.shared.policies.budget(&tenant);
        let orch_core::PluginRef::Path(plugin) = &job.spec.policy.plugin else {
            return Placed::Waits("waiting: its policy is not a file".into());
        };
        let ask = crate::core::policy_worker::Ask {
            job_text: job.submission.job_text.clone(),
            job_path: job.submission.job_path.clone(),
            env: job.submission.env.clone(),
            plugin: plugin.clone(),
            artifact: match self.shared.compiler.artifact(hash) {
                Some(artifact) => artifact,
                None => return Placed::Waits("waiting: compiling its policy".into()),
            },
            deadline_ms: bounds.deadline.as_millis() as u64,
            memory: bounds.memory.min(budget.memory),
            inventory: self.inventory.as_ref().clone(),
            visible,
            leases,
        };
        Placed::Waits(self.shared.policies.ask(id, &tenant, ask, snapshot))
    }

    /// What a policy is asked on: the devices placement may use (physical index, MIG instance),
    /// the leases held now, and their hash; `Err`: the lease store cannot say (the job waits).
    fn snapshot(&mut self) -> Result<Snapshot, String> {
        self.read_snapshot().cloned()
    }

    /// [`Jobs::snapshot`], read from the lease store only when this pass has not read it yet.
    fn read_snapshot(&mut self) -> Result<&Snapshot, String> {
        if let Some(snapshot) = self.snapshot.take() {
            return Ok(self.snapshot.insert(snapshot));
        }
        let leases: Vec<AskLease> = self
            .store
            .active()
            .map_err(|e| format!("the lease store failed: {e}"))?
            .iter()
            .flat_map(orch_leases::Lease::device_leases)
            .map(|l| AskLease::from(&l))
            .collect();
        let visible: Vec<(u32, Option<String>)> = self
            .placeable
            .devices
            .iter()
            .map(|v| (v.physical, v.mig_uuid.clone()))
            .collect();
        // Whether each is in service: the drains and health the view lays over the reading.
        let service: Vec<&str> = visible
            .iter()
            .map(|(physical, mig)| {
                self.inventory
                    .devices
                    .iter()
                    .find(|d| d.index == *physical)
                    .map_or("", |d| {
                        d.service_state(mig.as_deref().unwrap_or(&d.uuid)).as_str()
                    })
            })
            .collect();
        let key = snapshot_key(&visible, &service, &leases);
        Ok(self.snapshot.insert((visible, leases, key)))
    }

    /// Confines the process holding lease job `id` to its GPUs' device nodes, as the daemon's
    /// own jobs are, before the lease shows as running (so before the process hears of it): what
    /// it starts from then on inherits the rule. Where the machine has a mechanism and it fails,
    /// the lease ends instead of running on every GPU.
    fn confine_holder(
        &mut self,
        id: i64,
        holder: &Holder,
        lease: &orch_leases::Lease,
        plan: &orch_runner::Plan,
    ) -> Result<(), Placed> {
        let Some(rule) = orch_runner::device_rule(plan, &self.inventory) else {
            return Ok(());
        };
        // As for the daemon's own jobs (and said at start-up): with cgroups turned off, the
        // device program has no cgroup to sit on. Any other holder without one is refused below.
        if holder.cgroup.is_none()
            && orch_exec::cgroups_disabled()
            && matches!(
                orch_exec::devices::detected(),
                Ok(orch_exec::devices::Mechanism::Bpf)
            )
        {
            tracing::warn!(
                "job {id}: its process (pid {}) is not confined to its GPUs' device nodes: the device program needs a cgroup, and ORCH_CGROUPS=off turns those off",
                holder.pid
            );
            return Ok(());
        }
        let name = holder_constraint_name(id);
        match orch_exec::devices::constrain_process(
            &name,
            holder.pid,
            holder.cgroup.as_deref(),
            &rule,
        ) {
            Ok(Some(constraint)) => {
                tracing::debug!(
                    "job {id}: its process (pid {}) may not open {rule}",
                    holder.pid
                );
                self.confined.insert(id, constraint);
                Ok(())
            }
            Ok(None) => Ok(()),
            Err(e) => {
                self.release_now(id, &lease.id);
                Err(Placed::Ends(
                    State::Failed,
                    format!(
                        "cannot confine its process (pid {}) to its GPUs' device nodes: {e} (ORCH_DEVICE_CONSTRAINT=off on the daemon turns the rule off)",
                        holder.pid
                    ),
                ))
            }
        }
    }

    /// Lifts the device rule of held lease job `id`, which ended: a process that gave its lease
    /// back and goes on is no longer held to it. After a restart the daemon has no handle on it:
    /// its empty cgroup is removed (a process still inside keeps the rule until it ends).
    pub(super) fn unconfine(&mut self, id: i64) {
        match self.confined.remove(&id) {
            Some(constraint) => constraint.lift(),
            None => {
                let _ = orch_exec::devices::remove_leftover(&holder_constraint_name(id));
            }
        }
    }

    /// The device variables of held lease job `id`'s process: its GPUs named as the job (or
    /// its tenant's `device_ids`) asks, by the numbers CUDA gives them under the device rule
    /// the daemon put on that process. Indices that cannot name a device (a MIG slice) leave
    /// UUIDs here; the job's own `orch run` refuses it with the reason.
    fn held_env(
        &self,
        id: i64,
        job: &Queued,
        lease: &orch_leases::Lease,
        plan: &orch_runner::Plan,
    ) -> std::collections::BTreeMap<String, String> {
        let asked = match &job.spec.work {
            orch_core::job::Work::Command(command) => command.device_ids,
            orch_core::job::Work::Train(_) => None,
        };
        let ids = asked
            .or_else(|| {
                self.shared
                    .config
                    .tenant(&job.row.tenant)
                    .and_then(|t| t.device_ids)
            })
            .unwrap_or(orch_core::job::DeviceIds::Uuid);
        let rule = self
            .confined
            .contains_key(&id)
            .then(|| orch_runner::device_rule(plan, &self.inventory))
            .flatten();
        orch_runner::lease_env_named(&job.spec, lease, plan, &self.inventory, ids, rule.as_ref())
            .unwrap_or_else(|e| {
                tracing::debug!("job {id}: {e}");
                orch_runner::lease_env(&job.spec, lease, plan, &self.inventory)
            })
    }

    /// A held lease's placement and fence in its folder; on failure its devices go back.
    pub(super) fn write_lease_folder(
        &mut self,
        id: i64,
        dir: &Path,
        job: &Queued,
        lease: &orch_leases::Lease,
        plan: &orch_runner::Plan,
        holder: &Holder,
    ) -> Result<(), Placed> {
        let Err(e) = folders::write_placed(dir, &self.placed(id, job, lease, plan), holder) else {
            return Ok(());
        };
        self.release_now(id, &lease.id);
        if let Some(fault) = crate::core::health::fault_of_io(&e) {
            self.shared.health.report(fault, e.to_string());
            return Err(Placed::Waits(format!(
                "waiting: the daemon could not record the lease: {e}"
            )));
        }
        Err(Placed::Ends(
            State::Failed,
            format!("the daemon could not record the lease: {e}"),
        ))
    }

    /// A command job's folder with the spec its supervisor runs; on failure its devices go back
    /// and it waits.
    pub(super) fn write_job_folder(
        &mut self,
        id: i64,
        dir: &Path,
        job: &Queued,
        lease: &orch_leases::Lease,
        plan: &orch_runner::Plan,
    ) -> Result<(), Placed> {
        let spec = SuperviseSpec {
            job_id: id.to_string(),
            submission: job.submission.clone(),
            lease: lease.clone(),
            plan: plan.clone(),
            inventory: self.inventory.as_ref().clone(),
            state_dir: self.shared.state_dir.clone(),
            switch_user: self.shared.root,
            max_runtime_s: running::time_limit(
                &job.spec,
                self.shared.config.tenant(&job.row.tenant),
            )
            .map(|d| d.as_secs_f64()),
            grace_s: self
                .shared
                .config
                .grace_of(
                    &job.spec.stopping,
                    self.shared.config.tenant(&job.row.tenant),
                )
                .as_secs_f64(),
            max_log_bytes: self.shared.config.max_log_size,
            log_reserve_bytes: folders::log_reserve(&self.shared.state_dir),
            device_ids: self
                .shared
                .config
                .tenant(&job.row.tenant)
                .and_then(|t| t.device_ids),
        };
        let Err(e) = folders::prepare(dir, &spec) else {
            return Ok(());
        };
        self.release_now(id, &lease.id);
        let reason = format!("waiting: the daemon could not write the job's folder: {e}");
        match crate::core::health::fault_of_io(&e) {
            Some(fault) => self.shared.health.report(fault, e.to_string()),
            None => tracing::warn!("job {id}: {reason}"),
        }
        Err(Placed::Waits(reason))
    }

    /// Commits that job `id` runs on `lease`; `Err`: it was cancelled meanwhile (it left), or the
    /// database failed (it waits). Either way its devices go back.
    pub(super) fn record_start(
        &mut self,
        id: i64,
        attempt: u32,
        lease: &orch_leases::Lease,
    ) -> Result<(), Placed> {
        let started = self.shared.db.write_blocking({
            let change = Change {
                state: Some(State::Running),
                started_at_ms: Some(now_ms()),
                reason: Update::Clear,
                lease_id: Some(lease.id.clone()),
                devices: Some(lease.devices.clone()),
                attempt: Some(attempt),
                only_if: Some(State::Queued),
                charged_ms: Some(now_ms()),
                event: Some(Event::now(
                    "started",
                    format!(
                        "started on {} (attempt {attempt})",
                        if lease.devices.is_empty() {
                            "no device".to_string()
                        } else {
                            lease.devices.join(", ")
                        }
                    ),
                )),
                ..Change::default()
            };
            move |tx| crate::core::db::apply(tx, id, &change)
        });
        match started {
            Ok(1) => Ok(()),
            Ok(_) => {
                // Cancelled meanwhile: the devices go back.
                self.release_now(id, &lease.id);
                Err(Placed::Left)
            }
            Err(e) => {
                // The database failed: the job stays queued (its row says so) and is tried again.
                self.release_now(id, &lease.id);
                let reason = format!("waiting: the job database failed while starting it: {e}");
                match e.fault() {
                    Some(fault) => self.shared.health.report(fault, e.to_string()),
                    None => tracing::warn!("job {id}: {reason}"),
                }
                Err(Placed::Waits(reason))
            }
        }
    }

    /// The supervisor of job `id` could not be started: its folder is fenced so nothing ever
    /// starts it, and its exit record fails it.
    pub(super) fn not_started(&mut self, id: i64, dir: &Path, e: &std::io::Error) {
        let reason = format!("the daemon could not start the job's supervisor: {e}");
        tracing::warn!("job {id}: {reason}");
        let record = ExitRecord {
            state: State::Failed,
            exit_code: None,
            reason: Some(reason),
            ended_at_ms: now_ms(),
            late: None,
        };
        if let Err(e) = folders::take_fence(dir, &Fence { supervisor: None })
            .and_then(|_| folders::write_exit(dir, &record))
        {
            tracing::warn!("job {id}: could not record that it failed to start: {e}");
        }
    }

    /// What a held lease's `lease.json` says of its placement: the devices with both numberings,
    /// the policy's reason, and the variables its process sets for itself.
    pub(super) fn placed(
        &self,
        id: i64,
        job: &Queued,
        lease: &orch_leases::Lease,
        plan: &orch_runner::Plan,
    ) -> folders::Placed {
        let env = self.held_env(id, job, lease, plan);
        let devices = plan
            .chosen
            .iter()
            .map(|d| {
                serde_json::json!({
                    "index": d.index,
                    "physical_index": d.physical_index,
                    "uuid": d.uuid,
                    "name": d.name,
                    "memory_total_bytes": d.in_inventory(&self.inventory).and_then(|x| x.memory_total_bytes),
                    "memory_free_bytes": d.memory_free,
                    "utilization_gpu_percent": d.utilization_gpu,
                })
            })
            .collect();
        folders::Placed {
            policy: plan.policy.clone(),
            reason: plan.reason.clone(),
            devices,
            rejected: plan
                .rejected
                .iter()
                .map(|r| serde_json::to_value(r).unwrap_or_default())
                .collect(),
            env,
            exclusive: lease.exclusive,
        }
    }

    /// The process holding lease job `id` gave it back: the devices are free at once, and the
    /// job ends `succeeded` at the next look at running jobs.
    pub(super) fn release_held(&mut self, id: i64) {
        let Some(job) = self.running.get(&id) else {
            return;
        };
        let Some(record) = job.released(now_ms()) else {
            return;
        };
        let dir = self.shared.job_dir(id, job.attempt);
        if matches!(folders::read_exit(&dir), Ok(Some(_))) {
            return;
        }
        let lease = job.lease_id.clone();
        if let Err(e) = folders::write_exit(&dir, &record) {
            // The next look at it then finds no record and its process alive: it stays running
            // until that process ends.
            tracing::warn!("job {id}: could not record that its process released it: {e}");
        }
        // Its holder still lives: the daemon's usual release would leave the lease held.
        self.release_now(id, &lease);
        self.publish_leases();
    }

    /// Releases lease `id` outright (its holder is the daemon, or gave it back); when the store
    /// cannot record that now, it is done later, in order, and the devices stay held meanwhile.
    pub(super) fn release_now(&mut self, job: i64, id: &str) {
        self.release_lease(Release {
            job,
            lease: id.to_string(),
            outright: true,
        });
    }

    /// Makes `release` now, or queues it behind the writes waiting before it, or after a failure.
    pub(super) fn release_lease(&mut self, release: Release) {
        self.snapshot = None;
        if !self.backlog.is_empty() {
            self.backlog.push_back(Pending::Release(release));
            return;
        }
        match self.store_release(&release) {
            Ok(true) => self.publish_leases(),
            Ok(false) => tracing::warn!(
                "job {}: lease {} stays: a process of the job still runs; the devices are free once it ends",
                release.job,
                release.lease
            ),
            Err(e) => {
                tracing::warn!(
                    "job {}: could not release lease {} ({e}); trying again until it can",
                    release.job,
                    release.lease
                );
                self.backlog.push_back(Pending::Release(release));
            }
        }
    }

    /// The lease store's side of `release`: true when the lease is gone.
    pub(super) fn store_release(
        &mut self,
        release: &Release,
    ) -> Result<bool, orch_leases::LeaseError> {
        if release.outright {
            self.store.release(&release.lease).map(|_| true)
        } else {
            self.store
                .release_unless_held(&release.lease, &[Holder::current()])
        }
    }

    /// Starts `orch __supervise DIR` for the folder [`folders::prepare`] wrote; the wait on it
    /// records how it ended in [`Shared::supervisor_exits`].
    pub(super) fn spawn_supervisor(
        &self,
        id: i64,
        attempt: u32,
        dir: &Path,
    ) -> std::io::Result<()> {
        use std::os::unix::process::CommandExt;
        let log = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(dir.join("supervisor.log"))?;
        let mut child = std::process::Command::new(&self.shared.exe)
            .arg("__supervise")
            .arg(dir)
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            // Its own group: a Ctrl-C meant for the daemon does not reach the jobs.
            .process_group(0)
            .spawn()?;
        let shared = Arc::clone(&self.shared);
        let pid = child.id();
        let folder = dir.to_path_buf();
        std::thread::spawn(move || {
            let status = child.wait().ok();
            let out_of_memory = {
                use std::os::unix::process::ExitStatusExt;
                status.and_then(|s| s.signal()) == Some(libc::SIGKILL) && oom_killed(&folder)
            };
            lock(&shared.supervisor_exits).insert(
                (id, attempt),
                SupervisorEnd {
                    pid,
                    status,
                    out_of_memory,
                },
            );
            shared.kick(Kick::SupervisorExited);
        });
        Ok(())
    }

    /// Publishes the leases as they are now: after a job started or ended, the API shows it at
    /// once rather than at the next reading. The foreign processes are left to the device
    /// watcher's next reading (within a second), which sets fresh process lists against the
    /// leases: against the old lists, a job that just ended would show as foreign, and the walk
    /// of `/proc` it takes was most of the engine's time per placed job.
    pub(super) fn publish_leases(&mut self) {
        let Ok(leases) = self.store.active() else {
            return;
        };
        lock(&self.shared.machine).leases = Arc::new(leases);
    }

    pub(super) fn refresh_inventory(&mut self) {
        let view = lock(&self.shared.machine).clone();
        if !Arc::ptr_eq(&view.inventory, &self.inventory) {
            self.visibility =
                Visibility::resolve(&view.inventory.devices, &VisibilityEnv::from_process());
            self.inventory = Arc::clone(&view.inventory);
        }
        self.placeable = self.visibility.clone();
        if self.shared.config.avoid_foreign && !view.foreign.is_empty() {
            let busy: Vec<u32> = self
                .inventory
                .devices
                .iter()
                .filter(|d| view.foreign.contains_key(&d.uuid))
                .map(|d| d.index)
                .collect();
            self.placeable
                .devices
                .retain(|v| !busy.contains(&v.physical));
        }
    }

    /// SIGKILL to every process group and cgroup the lease's holders name; the job's devices
    /// cgroup, if its supervisor left one, goes too.
    pub(super) fn end_remains(&mut self, lease_id: &Option<String>) {
        let Some(id) = lease_id else { return };
        let Ok(Some(lease)) = self.store.get(id) else {
            return;
        };
        for holder in &lease.holders {
            if holder.boot.is_some() && holder.boot != orch_leases::this_boot() {
                continue; // recorded before this machine rebooted: nothing of it is left
            }
            // Only a group that is still the job's (its leader's id not handed out again).
            if let Some(pgid) = holder.pgid.filter(|&g| g > 1 && holder.group_alive()) {
                orch_core::process::signal_group(pgid, libc::SIGKILL);
            }
            if let Some(cgroup) = &holder.cgroup {
                orch_exec::kill_cgroup(cgroup);
            }
        }
        let deadline = Instant::now() + Duration::from_secs(2);
        while lease.holders.iter().any(|h| {
            h.group_alive()
                || h.cgroup
                    .as_deref()
                    .is_some_and(orch_core::process::cgroup_populated)
        }) && Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(10));
        }
        if let Err(e) = orch_exec::devices::remove_leftover(&orch_exec::devices::job_name(id)) {
            tracing::warn!("lease {id}: {e}");
        }
    }

    /// Gives up the daemon's hold on a lease. A process of the job that is still alive (one that
    /// ignored its supervisor's end) keeps it, and with it the devices, until it ends. A release
    /// the store cannot record now is made later, in order.
    pub(super) fn release(&mut self, job: i64, lease_id: &Option<String>) {
        if let Some(lease) = lease_id {
            self.release_lease(Release {
                job,
                lease: lease.clone(),
                outright: false,
            });
        }
    }

    /// Records `change` of job `id`. On a full or read-only state folder it is kept and made
    /// again, in order with everything after it, once the folder takes writes.
    pub(super) fn write(&mut self, id: i64, change: Change) {
        if !self.backlog.is_empty() {
            self.backlog.push_back(Pending::Write(id, Box::new(change)));
            return;
        }
        let attempt = change.clone();
        if let Err(e) = self
            .shared
            .db
            .write_blocking(move |tx| crate::core::db::apply(tx, id, &attempt))
        {
            match e.fault() {
                Some(fault) => {
                    self.shared.health.report(fault, e.to_string());
                    self.backlog.push_back(Pending::Write(id, Box::new(change)));
                }
                None => tracing::error!("job {id}: {e}"),
            }
        }
    }
}

/// The name of the device rule on held lease job `id`'s process (`orch-lease-ID` as a v1
/// devices cgroup).
/// Why a job waits whose policy's plan went `stale` and is asked again, and why it waits now.
fn stale_reason(stale: &str, now: &str) -> String {
    let now = now.strip_prefix("waiting: ").unwrap_or(now);
    format!(
        "waiting: the plan its placement policy made no longer holds ({stale}), so it is asked again; {now}"
    )
}

fn holder_constraint_name(id: i64) -> String {
    format!("lease-{id}")
}

/// The name a daemon job's lease carries (in its id, and in what other jobs' policies see of
/// it): its number, which other tenants may see, never its name, which they may not.
pub fn lease_name(id: i64) -> String {
    format!("job-{id}")
}

/// Whether the kernel's OOM killer killed a process in the cgroup of the job whose folder is
/// `dir` (`orch-job-LEASE` under this process's cgroup, where its supervisor made it; its
/// `memory.events` counts `oom_kill`). False when any of it cannot be read.
fn oom_killed(dir: &Path) -> bool {
    let Some(spec) = std::fs::read_to_string(dir.join("spec.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<SuperviseSpec>(&t).ok())
    else {
        return false;
    };
    let Some(own) = orch_core::process::cgroup_v2_dir(std::process::id()) else {
        return false;
    };
    let name: String = spec
        .lease
        .id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '-'
            }
        })
        .collect();
    std::fs::read_to_string(own.join(format!("orch-job-{name}")).join("memory.events"))
        .ok()
        .and_then(|events| {
            events.lines().find_map(|l| {
                l.strip_prefix("oom_kill ")
                    .and_then(|n| n.trim().parse::<u64>().ok())
            })
        })
        .is_some_and(|kills| kills > 0)
}

#[cfg(test)]
mod tests {
    use super::stale_reason;

    #[test]
    fn a_stale_plans_reason_reads_right_whatever_the_job_waits_for_now() {
        let stale = "device 2 is now held exclusively by job train-7";
        for (now, tail) in [
            (
                "waiting: its placement policy is queued to be asked",
                "its placement policy is queued to be asked",
            ),
            (
                "waiting: its placement policy is queued to be asked, behind 3 other(s) of tenant v (policy_concurrency = 1)",
                "behind 3 other(s) of tenant v (policy_concurrency = 1)",
            ),
            (
                "waiting: tenant v's placement policies used 30.4 CPU-s in the last 1m, its policy_cpu = 30s per policy_window = 1m: they are asked again once that frees up",
                "once that frees up",
            ),
            ("the lease store failed: disk I/O error", "disk I/O error"),
        ] {
            let reason = stale_reason(stale, now);
            assert!(
                reason.starts_with(
                    "waiting: the plan its placement policy made no longer holds (device 2 is now held exclusively by job train-7), so it is asked again; "
                ),
                "{reason}"
            );
            assert!(reason.ends_with(tail), "{reason}");
            assert_eq!(reason.matches("waiting:").count(), 1, "{reason}");
            assert!(!reason.contains(") again:"), "{reason}");
        }
    }
}
