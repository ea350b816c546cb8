//! The daemon's engine: one thread that owns the queue, the lease store and the policy host.
//! It recovers after a crash, places queued jobs in the order of the queue policy (with the
//! tenants' limits and backfill: [`crate::core::sched`]), starts a supervisor per job, learns how jobs
//! end, records usage, and carries out cancels and preemptions.

use crate::core::db::{Change, Event, JobRow, JobUse, State, Submission, Update, UsageRow};
use crate::core::folders::{self, ExitRecord, Fence, SuperviseSpec};
use crate::core::kick::Kick;
use crate::core::sched::{Attempt, QueuePolicy, QueuedJob, RunningJob, Scheduler, Usage};
use crate::core::state::{MachineView, Shared, SupervisorEnd};
use orch_core::JobSpec;
use orch_core::sync::lock;
use orch_core::time::now_ms;
use orch_devices::{Inventory, InventorySpec, Visibility, VisibilityEnv};
use orch_host::{Limits, PolicyHost};
use orch_leases::Liveness;
use orch_leases::{Holder, LeaseStore};
use orch_runner::{Machine, PlaceError};
use running::{Death, Origin, Recovery, Running, Start};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::Path;
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

pub mod running;

/// A write the engine could not make (the state folder was full or read-only), kept to be made
/// again, in order, once it can. A lease release waits behind the job's own record: devices are
/// never free while the job still shows as running.
#[derive(Debug)]
enum Pending {
    Write(i64, Box<Change>),
    Release(Release),
}

/// A lease release: `outright` for a lease the daemon alone decides on (its holder gave it back,
/// or the job never started); otherwise a process of the job that still lives keeps it.
#[derive(Debug, Clone)]
struct Release {
    /// The job whose lease it is, for the log.
    job: i64,
    lease: String,
    outright: bool,
}

struct Queued {
    row: JobRow,
    spec: JobSpec,
    submission: Submission,
}

pub struct Engine {
    shared: Arc<Shared>,
    kicks: mpsc::Receiver<Kick>,
    /// The scheduler: the queue's order, the tenants' limits and usage, preemption. A pass lends
    /// [`Jobs`] to its placement callback, a field apart: nothing else is borrowed meanwhile.
    sched: Scheduler,
    jobs: Jobs,
    last_idle_check: Instant,
    last_usage_save: Instant,
    /// The last queue-policy failure logged, and when: logged again only when it changes or a
    /// minute passed.
    policy_failure: Option<(String, Instant)>,
}

/// What the engine holds besides the scheduler: the jobs it queued and watches run, the lease
/// store and the policy host that place them, and the writes waiting on an unwell state folder.
/// Placing a job needs this alone, so a scheduling pass can place while it walks the queue.
struct Jobs {
    shared: Arc<Shared>,
    store: LeaseStore,
    host: PolicyHost,
    /// The latest reading of the devices, refreshed by a thread of its own (an NVML reading takes
    /// milliseconds per GPU: not on the path from a submission to its start).
    inventory: Arc<Inventory>,
    visibility: Visibility,
    /// The visible devices placement may use: all of them, or without those busy with foreign
    /// processes under `foreign = "avoid"`.
    placeable: Visibility,
    queue: BTreeMap<i64, Queued>,
    running: HashMap<i64, Running>,
    /// Writes and releases that failed on an unwell state folder, made again in order.
    backlog: VecDeque<Pending>,
    /// When the state folder was last probed while unwell.
    last_probe: Instant,
    /// Jobs whose supervisor's liveness `/proc` could not tell, and when that was last logged.
    unknown_logged: HashMap<i64, Instant>,
}

/// What placing a queued job did.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Placed {
    /// Its supervisor is starting (or its held lease runs).
    Started,
    /// It stays queued, for this reason.
    Waits(String),
    /// It left the queue meanwhile (cancelled): nothing more to do.
    Left,
    /// It cannot start, ever: it ends in this state (failed, cancelled) with this reason.
    Ends(State, String),
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("queued", &self.jobs.queue.len())
            .field("running", &self.jobs.running.len())
            .finish_non_exhaustive()
    }
}

/// How often the engine looks at running jobs and the queue without being woken.
const TICK: Duration = Duration::from_millis(100);
const INVENTORY_MAX_AGE: Duration = Duration::from_secs(1);
/// How often usage is written to the database: a crash loses at most this much of it.
pub const USAGE_SAMPLE: Duration = Duration::from_secs(10);

/// The wall clock in seconds, the scheduler's time in the daemon.
fn now_s() -> f64 {
    now_ms() as f64 / 1000.0
}

fn ms_to_s(ms: u64) -> f64 {
    ms as f64 / 1000.0
}

impl Engine {
    pub fn new(
        shared: Arc<Shared>,
        kicks: mpsc::Receiver<Kick>,
        inventory: Inventory,
        policy: Box<dyn QueuePolicy>,
    ) -> Result<Engine, String> {
        let store = LeaseStore::open(&shared.state_dir).map_err(|e| e.to_string())?;
        let mut sched = Scheduler::for_config(&shared.config, policy);
        // Devices freed by preemption wait for their job while the victims stop (SIGTERM, the
        // grace period, SIGKILL) and a little longer.
        sched.reservation_s = orch_runner::GRACE.as_secs_f64() + 30.0;
        for row in shared.db.usage().map_err(|e| e.to_string())? {
            if let Some(i) = sched.tenant_index(&row.tenant) {
                sched.set_usage(
                    i,
                    Usage {
                        gpu_s: row.gpu_seconds,
                        as_of_s: ms_to_s(row.as_of_ms),
                    },
                );
            }
        }
        let mut host = PolicyHost::new(Limits::default()).map_err(|e| e.to_string())?;
        // A tenant's component is compiled elsewhere (crate::core::compile), never on this thread.
        host.files_precompiled_only();
        shared.compiler.start(host.loader());
        let visibility = Visibility::resolve(&inventory.devices, &VisibilityEnv::from_process());
        let inventory = Arc::new(inventory);
        let view = lock(&shared.machine).clone();
        *lock(&shared.machine) = MachineView {
            inventory: Arc::clone(&inventory),
            ..view
        };
        Ok(Engine {
            jobs: Jobs {
                shared: Arc::clone(&shared),
                store,
                host,
                inventory,
                placeable: visibility.clone(),
                visibility,
                queue: BTreeMap::new(),
                running: HashMap::new(),
                backlog: VecDeque::new(),
                last_probe: Instant::now(),
                unknown_logged: HashMap::new(),
            },
            shared,
            kicks,
            sched,
            last_idle_check: Instant::now(),
            last_usage_save: Instant::now(),
            policy_failure: None,
        })
    }

    /// Records a running job with the scheduler (started, or adopted after a restart).
    fn track_running(&mut self, id: i64, row: &JobRow, preemptible: bool, exclusive: bool) {
        let Some(tenant) = self.sched.tenant_index(&row.tenant) else {
            return;
        };
        let started_s = row.started_at_ms.map_or_else(now_s, ms_to_s);
        self.sched.add_running(RunningJob {
            id: id as u64,
            tenant,
            gpus: row.gpus,
            exclusive,
            preemptible,
            started_s,
            charged_s: row.charged_ms.map_or(started_s, ms_to_s),
            gpu_s: 0.0,
        });
    }

    /// Ends a job's run in the scheduler at `at_s` and records its use.
    fn untrack_running(&mut self, id: i64, at_s: f64, prior_gpu_s: f64) {
        let ended = self.sched.end(id as u64, at_s);
        let uses = ended
            .map(|r| JobUse {
                id,
                gpu_seconds: prior_gpu_s + r.gpu_s,
                charged_ms: (r.charged_s * 1000.0) as u64,
            })
            .into_iter()
            .collect();
        self.save_usage(uses);
    }

    /// Charges the running jobs' use up to now and writes it with every tenant's usage.
    fn save_usage(&mut self, mut uses: Vec<JobUse>) {
        let now = now_s();
        self.sched.charge(now);
        let standing = self.sched.standing(now);
        let sched = Some(&self.sched).map(|s| {
            let rows: Vec<UsageRow> = s
                .tenants()
                .iter()
                .enumerate()
                .map(|(i, t)| UsageRow {
                    tenant: t.name.clone(),
                    gpu_seconds: s.usage(i).gpu_s,
                    as_of_ms: (s.usage(i).as_of_s * 1000.0) as u64,
                })
                .collect();
            let running: Vec<(u64, f64, f64)> = s
                .running_jobs()
                .map(|r| (r.id, r.gpu_s, r.charged_s))
                .collect();
            (rows, running)
        });
        let Some((rows, running)) = sched else { return };
        for (id, gpu_s, charged_s) in running {
            let prior = self
                .jobs
                .running
                .get(&(id as i64))
                .map_or(0.0, |r| r.prior_gpu_s);
            uses.push(JobUse {
                id: id as i64,
                gpu_seconds: prior + gpu_s,
                charged_ms: (charged_s * 1000.0) as u64,
            });
        }
        *lock(&self.shared.standing) = standing;
        if let Err(e) = self
            .shared
            .db
            .write_blocking(move |tx| crate::core::db::save_usage(tx, &rows, &uses))
        {
            tracing::warn!("could not record usage: {e}");
        }
        self.last_usage_save = Instant::now();
    }

    /// After a crash or a restart: finish what ended meanwhile, adopt what still runs, fence off
    /// and queue again what never started, mark the rest lost (or queue it with `requeue`).
    pub fn recover(&mut self) -> Result<(), String> {
        let shared = Arc::clone(&self.shared);
        let db = &shared.db;
        for row in db
            .jobs(&[State::Running], u32::MAX)
            .map_err(|e| e.to_string())?
        {
            let id = row.id;
            let dir = self.shared.job_dir(id, row.attempt);
            let spec =
                db.submission(id).ok().flatten().and_then(|(s, _)| {
                    orch_core::job::parse(Path::new(&s.job_path), &s.job_text).ok()
                });
            let (preemptible, exclusive) = spec.map_or((false, true), |spec| {
                (spec.preemptible, spec.resources.exclusive)
            });
            let held = db
                .submission(id)
                .ok()
                .flatten()
                .is_some_and(|(s, _)| s.holder.is_some());
            self.track_running(id, &row, preemptible, exclusive);
            // Counted up to the last record, or from the start when none was made.
            let charged_s = row
                .charged_ms
                .or(row.started_at_ms)
                .map_or_else(now_s, ms_to_s);
            if let Ok(Some(exit)) = folders::read_exit(&dir) {
                let prior = row.gpu_seconds;
                self.finish_at(id, &row.lease_id, exit, prior);
                continue;
            }
            // The daemon may have stopped before it even made the job's folder.
            let never_started = matches!(folders::read_fence(&dir), Ok(None))
                && std::fs::create_dir_all(&dir).is_ok()
                && folders::take_fence(&dir, &Fence { supervisor: None }).unwrap_or(false);
            let fence = folders::read_fence(&dir).ok().flatten();
            let supervisor = fence.and_then(|f| f.supervisor).map(|h| {
                let dead = h.process_liveness().is_dead();
                (h, dead)
            });
            match running::recovery(never_started, supervisor, held) {
                Recovery::Adopt(holder) => {
                    tracing::info!("job {id}: adopted again (supervisor pid {})", holder.pid);
                    self.jobs.write(
                        id,
                        Change {
                            event: Some(Event::now(
                                "adopted",
                                format!(
                                    "still running after the daemon restarted; adopted again (supervisor pid {})",
                                    holder.pid
                                ),
                            )),
                            ..Change::default()
                        },
                    );
                    let start = Start {
                        tenant: row.tenant.clone(),
                        devices: row.devices.clone(),
                        attempt: row.attempt,
                        lease_id: row.lease_id.clone().unwrap_or_default(),
                        requeue: row.requeue,
                        prior_gpu_s: row.gpu_seconds,
                    };
                    let origin = if held { Origin::Held } else { Origin::Adopted };
                    let mut job = Running::new(start, origin, Some(holder), Instant::now());
                    if row.cancel_requested {
                        job.cancel();
                    }
                    self.jobs.running.insert(id, job);
                }
                Recovery::HeldEnded(pid) => {
                    // The process that held the lease ended while no daemon watched.
                    let prior = row.gpu_seconds;
                    self.finish_at(id, &row.lease_id, running::held_ended(pid, now_ms()), prior);
                }
                Recovery::QueueAgain => {
                    // It never ran: nothing to charge.
                    let at = self
                        .sched
                        .running_job(id as u64)
                        .map_or(charged_s, |r| r.charged_s);
                    self.untrack_running(id, at, row.gpu_seconds);
                    tracing::info!(
                        "job {id}: never started before the daemon stopped; queued again"
                    );
                    self.jobs.release(id, &row.lease_id);
                    self.jobs.write(
                        id,
                        Change {
                            state: Some(State::Queued),
                            reason: Update::Set(
                                "queued again: the daemon stopped before the job started".into(),
                            ),
                            only_if: Some(State::Running),
                            event: Some(Event::now(
                                "queued",
                                "queued again: the daemon stopped before the job started",
                            )),
                            ..Change::default()
                        },
                    );
                }
                Recovery::Vanished => {
                    // When it ended is unknown: its use is counted up to the last record.
                    self.untrack_running(id, charged_s, row.gpu_seconds);
                    self.vanished(
                        id,
                        &row.lease_id,
                        row.requeue && !row.cancel_requested,
                        VANISHED_UNWATCHED.into(),
                    );
                }
            }
        }
        for row in db
            .jobs(&[State::Queued], u32::MAX)
            .map_err(|e| e.to_string())?
        {
            self.enqueue(row.id);
        }
        Ok(())
    }

    /// The engine's loop; returns when every sender is gone.
    pub fn run(mut self) {
        let mut last_pass = Instant::now();
        // Finished jobs and their folders go after `retention`; looked at on start and every
        // tenth of it (at most every ten minutes).
        let purge_every = (self.shared.config.retention / 10).min(Duration::from_secs(600));
        self.purge();
        let mut last_purge = Instant::now();
        // The tenants' standing is there for `orch usage` from the start.
        self.save_usage(Vec::new());
        self.pass();
        loop {
            if last_purge.elapsed() >= purge_every {
                self.purge();
                last_purge = Instant::now();
            }
            let mut changed = false;
            match self.kicks.recv_timeout(TICK) {
                Ok(kick) => changed |= self.handle(kick),
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => return,
            }
            while let Ok(kick) = self.kicks.try_recv() {
                changed |= self.handle(kick);
            }
            changed |= self.jobs.catch_up();
            changed |= self.check_running();
            self.check_idle();
            if self.last_usage_save.elapsed() >= USAGE_SAMPLE {
                self.save_usage(Vec::new());
            }
            if changed || last_pass.elapsed() >= Duration::from_secs(1) {
                self.pass();
                last_pass = Instant::now();
            }
        }
    }

    /// Deletes the finished jobs older than `retention`, their logs and folders.
    fn purge(&mut self) {
        let retention_ms =
            u64::try_from(self.shared.config.retention.as_millis()).unwrap_or(u64::MAX);
        let before = now_ms().saturating_sub(retention_ms);
        let old = match self.shared.db.finished_before(before) {
            Ok(old) if !old.is_empty() => old,
            Ok(_) => return,
            Err(e) => {
                tracing::warn!("could not look for old jobs: {e}");
                return;
            }
        };
        if let Err(e) = self
            .shared
            .db
            .write_blocking(move |tx| crate::core::db::purge(tx, before))
        {
            tracing::warn!("could not purge old jobs: {e}");
            return;
        }
        for (id, attempts) in &old {
            for attempt in 0..=*attempts {
                let _ = std::fs::remove_dir_all(self.shared.job_dir(*id, attempt));
            }
        }
        tracing::info!(
            "purged {} job(s) that ended over {:?} ago",
            old.len(),
            self.shared.config.retention
        );
    }

    fn handle(&mut self, kick: Kick) -> bool {
        match kick {
            Kick::Submitted(id) => self.enqueue(id),
            Kick::Dequeued(id) => {
                self.jobs.queue.remove(&id);
                self.sched.dequeue(id as u64);
                lock(&self.shared.reasons).remove(&id);
            }
            Kick::Cancel(id) => {
                if let Some(job) = self.jobs.running.get_mut(&id) {
                    job.cancel();
                }
            }
            Kick::SupervisorExited => {}
            Kick::Release(id) => self.jobs.release_held(id),
            Kick::PolicyCompiled(hash) => self.policy_compiled(&hash),
        }
        true
    }

    fn enqueue(&mut self, id: i64) {
        let loaded = self
            .shared
            .db
            .job(id)
            .ok()
            .flatten()
            .zip(self.shared.db.submission(id).ok().flatten().map(|(s, _)| s));
        let Some((row, submission)) = loaded else {
            return;
        };
        if row.state != State::Queued {
            return;
        }
        match orch_core::job::parse(Path::new(&submission.job_path), &submission.job_text) {
            Ok(mut spec) => {
                // A file policy runs from the copy the user submitted, never from their path.
                if let Some(hash) = &submission.policy_file {
                    let path = self.shared.compiler.source(hash);
                    let bytes = std::fs::metadata(&path).map_or(0, |m| m.len());
                    let _ = self.shared.compiler.request(hash, &row.tenant, None, bytes);
                    spec.policy.plugin = orch_core::PluginRef::Path(
                        self.shared
                            .state_dir
                            .join("plugins")
                            .join(format!("{hash}.wasm")),
                    );
                }
                let Some(tenant) = self.sched.tenant_index(&row.tenant) else {
                    self.fail(
                        id,
                        format!("tenant {} is no longer in the daemon's config", row.tenant),
                    );
                    return;
                };
                let runtime = running::time_limit(&spec, self.shared.config.tenant(&row.tenant));
                self.sched.enqueue(QueuedJob {
                    id: id as u64,
                    tenant,
                    name: spec.name.clone(),
                    tags: spec.tags.clone(),
                    gpus: spec.resources.gpus,
                    exclusive: spec.resources.exclusive,
                    priority: spec.priority,
                    submitted_s: ms_to_s(row.submitted_at_ms),
                    queued_s: now_s(),
                    runtime_s: runtime.map(|d| d.as_secs_f64()),
                    preemptible: spec.preemptible,
                });
                self.jobs.queue.insert(
                    id,
                    Queued {
                        row,
                        spec,
                        submission,
                    },
                );
            }
            Err(e) => self.fail(id, e.to_string()),
        }
    }

    /// A policy component compiled, or failed to: the queued jobs naming one that failed fail
    /// with its sentence now, not when devices free up for them.
    fn policy_compiled(&mut self, hash: &str) {
        let Some(reason) = self.shared.compiler.failure(hash) else {
            return;
        };
        let failed: Vec<i64> = self
            .jobs
            .queue
            .iter()
            .filter(|(_, q)| q.submission.policy_file.as_deref() == Some(hash))
            .map(|(id, _)| *id)
            .collect();
        for id in failed {
            self.jobs.queue.remove(&id);
            self.fail(id, reason.clone());
        }
    }

    /// Looks at every running job: an exit record finishes it; a supervisor gone without one
    /// makes it lost (or queued again). A job whose record, fence or supervisor `/proc` cannot
    /// read right now (no file descriptor left, say) stays as it is until it can: unknown never
    /// ends a job and never frees its devices.
    fn check_running(&mut self) -> bool {
        let mut changed = false;
        let ids: Vec<i64> = self.jobs.running.keys().copied().collect();
        for id in ids {
            changed |= self.check_job(id);
        }
        changed
    }

    /// One look at running job `id` (see [`Engine::check_running`]); true when it left the
    /// running jobs, or may have.
    fn check_job(&mut self, id: i64) -> bool {
        let Some(job) = self.jobs.running.get(&id) else {
            return false;
        };
        let dir = self.shared.job_dir(id, job.attempt);
        let exit = match folders::read_exit(&dir) {
            Ok(exit) => exit,
            Err(e) => {
                self.jobs
                    .cannot_tell(id, format!("cannot read its exit record: {e}"));
                return false;
            }
        };
        if let Some(exit) = exit {
            let Some(job) = self.jobs.running.remove(&id) else {
                return false;
            };
            lock(&self.shared.supervisor_exits).remove(&(id, job.attempt));
            let (exit, idle_stopped) = job.exited(exit);
            if idle_stopped {
                self.shared.metrics.idle_stopped();
            }
            self.jobs.unknown_logged.remove(&id);
            self.finish_at(id, &Some(job.lease_id), exit, job.prior_gpu_s);
            return true;
        }
        if job.supervisor.is_none() {
            match folders::read_fence(&dir) {
                Ok(fence) => {
                    if let Some(job) = self.jobs.running.get_mut(&id) {
                        job.learn_supervisor(fence.and_then(|f| f.supervisor));
                    }
                }
                Err(e) => {
                    self.jobs
                        .cannot_tell(id, format!("cannot read its fence: {e}"));
                    return false;
                }
            }
        }
        let Some(job) = self.jobs.running.get(&id) else {
            return false;
        };
        let ended = (job.origin == Origin::Spawned)
            .then(|| {
                lock(&self.shared.supervisor_exits)
                    .get(&(id, job.attempt))
                    .copied()
            })
            .flatten();
        let liveness = job.liveness(ended.is_some(), Instant::now(), Holder::process_liveness);
        if let Liveness::Unknown(e) = &liveness {
            let pid = job.supervisor.as_ref().map_or(0, |h| h.pid);
            self.jobs.cannot_tell(
                id,
                format!("cannot tell whether its supervisor (pid {pid}) runs: {e}"),
            );
            return false;
        }
        if self.jobs.unknown_logged.remove(&id).is_some() {
            tracing::info!("job {id}: its supervisor can be watched again");
        }
        if liveness == Liveness::Alive {
            if let Some(job) = self.jobs.running.get_mut(&id)
                && let Some(due) = job.signal_due()
                && signal(due.pid, due.signal)
            {
                job.signalled(due.purpose);
            }
            return false;
        }
        // Dead: an exit record written in the meantime still counts.
        match folders::read_exit(&dir) {
            Ok(None) => {}
            Ok(Some(_)) => return false,
            Err(e) => {
                self.jobs
                    .cannot_tell(id, format!("cannot read its exit record: {e}"));
                return false;
            }
        }
        let Some(job) = self.jobs.running.remove(&id) else {
            return false;
        };
        lock(&self.shared.supervisor_exits).remove(&(id, job.attempt));
        let lease = Some(job.lease_id.clone());
        let prior = job.prior_gpu_s;
        match job.died(ended.map(|e| e.words()), now_ms()) {
            Death::Finish(record) => {
                // For a restarted daemon; the database, written next, is what counts.
                if let Err(e) = folders::write_exit(&dir, &record) {
                    tracing::warn!(
                        "job {id}: could not write its exit record ({e}); the job database has it"
                    );
                }
                self.finish_at(id, &lease, record, prior);
            }
            // A supervisor that ended before it took the fence never started the job: fenced
            // now, the job goes back to the queue (it never ran; nothing is charged).
            Death::NeverStarted(reason) => {
                match folders::take_fence(&dir, &Fence { supervisor: None }) {
                    Ok(true) => {
                        let at = self
                            .sched
                            .running_job(id as u64)
                            .map_or_else(now_s, |r| r.charged_s);
                        self.untrack_running(id, at, prior);
                        self.queue_again(id, &lease, reason);
                    }
                    // Its supervisor took the fence after all: looked at again next time.
                    Ok(false) => {
                        self.jobs.running.insert(id, job);
                    }
                    Err(e) => {
                        self.jobs.running.insert(id, job);
                        self.jobs
                            .cannot_tell(id, format!("cannot fence off its folder: {e}"));
                    }
                }
            }
            Death::Vanished { requeue, reason } => {
                self.untrack_running(id, now_s(), prior);
                self.vanished(id, &lease, requeue, reason);
            }
        }
        true
    }

    /// One scheduling pass: the queue in the queue policy's order, each job placed if it fits
    /// within its tenant's limits; a job that does not fit does not block smaller ones behind it;
    /// preemptible jobs of tenants over their share are stopped for a tenant under its share.
    pub fn pass(&mut self) {
        if self.jobs.queue.is_empty() {
            return;
        }
        // Nothing starts while the state folder cannot record it: the queue waits, and says why.
        if let Some(fault) = self.shared.health.fault() {
            let reason = format!(
                "waiting: the state folder {} is {}; jobs start once it takes writes again",
                self.shared.state_dir.display(),
                match fault {
                    crate::core::health::Fault::Full => "full",
                    crate::core::health::Fault::ReadOnly => "read-only",
                    crate::core::health::Fault::Io => "failing",
                }
            );
            let reasons = self
                .jobs
                .queue
                .keys()
                .map(|id| (*id, reason.clone()))
                .collect();
            *lock(&self.shared.reasons) = reasons;
            return;
        }
        self.jobs.refresh_inventory();
        let leases = match self.jobs.store.active() {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!("scheduling pass skipped: {e}");
                return;
            }
        };
        let held: std::collections::HashSet<&str> = leases
            .iter()
            .filter(|l| l.exclusive)
            .flat_map(|l| l.devices.iter().map(String::as_str))
            .collect();
        let started = Instant::now();
        let visible: Vec<&str> = self
            .jobs
            .placeable
            .devices
            .iter()
            .filter_map(|v| {
                self.jobs
                    .inventory
                    .devices
                    .iter()
                    .find(|d| d.index == v.physical)
            })
            .map(|d| d.uuid.as_str())
            .collect();
        let machine = orch_queue::Machine {
            free_gpus: visible.iter().filter(|u| !held.contains(*u)).count() as u32,
            total_gpus: visible.len() as u32,
        };
        let now = now_s();
        let jobs = &mut self.jobs;
        let mut ends = Vec::new();
        let report = self
            .sched
            .pass(now, machine, &mut |job| match jobs.place(job.id as i64) {
                Placed::Started => Attempt::Started,
                Placed::Waits(reason) => Attempt::Waits(reason),
                Placed::Left => Attempt::Left,
                Placed::Ends(state, reason) => {
                    ends.push((job.id as i64, state, reason));
                    Attempt::Left
                }
            });
        *lock(&self.shared.standing) = self.sched.standing(now);
        for (id, state, reason) in ends {
            self.end_queued(id, state, reason);
        }
        if !report.started.is_empty() {
            self.jobs.publish_leases();
        }
        self.shared.metrics.pass(started.elapsed().as_secs_f64());
        if let Some(seconds) = report.policy_seconds {
            self.shared.metrics.decision("queue", seconds);
        }
        if let Some(failure) = report.policy_failure {
            let repeat = self.policy_failure.as_ref().is_some_and(|(last, at)| {
                *last == failure && at.elapsed() < Duration::from_secs(60)
            });
            if !repeat {
                tracing::warn!("{failure}");
                self.policy_failure = Some((failure, Instant::now()));
            }
        }
        for p in report.preempt {
            let id = p.victim as i64;
            if let Some(job) = self.jobs.running.get_mut(&id)
                && job.preempt(p.reason.clone())
            {
                tracing::info!("job {id}: {}", p.reason);
                self.shared.metrics.preempted();
                self.jobs.write(
                    id,
                    Change {
                        event: Some(Event::now("preempted", p.reason)),
                        ..Change::default()
                    },
                );
            }
        }
        // A job queued again keeps saying why (preempted, its processes vanished) before why it
        // waits now.
        let reasons: HashMap<i64, String> = report
            .reasons
            .into_iter()
            .map(|(id, reason)| {
                let id = id as i64;
                match self
                    .jobs
                    .queue
                    .get(&id)
                    .and_then(|q| q.row.reason.as_deref())
                {
                    Some(before) if !before.is_empty() => (id, format!("{before}; {reason}")),
                    _ => (id, reason),
                }
            })
            .collect();
        *lock(&self.shared.reasons) = reasons;
    }

    /// Starts the thread that reads the machine again every [`INVENTORY_MAX_AGE`]: the devices,
    /// the live leases, and the processes no lease covers.
    pub fn watch_devices(&self) {
        let shared = Arc::clone(&self.shared);
        let started = std::thread::Builder::new()
            .name("orch-devices".into())
            .spawn(move || {
                let mut store = LeaseStore::open(&shared.state_dir);
                let mut first = true;
                loop {
                    if !std::mem::take(&mut first) {
                        std::thread::sleep(INVENTORY_MAX_AGE);
                    }
                    let (inventory, stale) = match shared
                        .devices
                        .parse::<InventorySpec>()
                        .and_then(|s| Inventory::load(&s))
                    {
                        Ok(inventory) => (Arc::new(inventory), None),
                        Err(e) => {
                            tracing::warn!(
                                "could not read the devices again, using the last reading: {e}"
                            );
                            let last = Arc::clone(&lock(&shared.machine).inventory);
                            (last, Some(format!("the daemon could not read the devices again ({e}): this is its last reading")))
                        }
                    };
                    let leases = match store.as_mut().map(LeaseStore::active) {
                        Ok(Ok(leases)) => Arc::new(leases),
                        _ => {
                            store = LeaseStore::open(&shared.state_dir);
                            Arc::clone(&lock(&shared.machine).leases)
                        }
                    };
                    let foreign = Arc::new(orch_runner::foreign_processes(&inventory, &leases));
                    *lock(&shared.machine) = MachineView {
                        inventory,
                        leases,
                        foreign,
                        stale,
                    };
                }
            });
        if let Err(e) = started {
            let why = format!(
                "the daemon could not start its device watcher ({e}): this is the reading from its start, and foreign processes are not looked for"
            );
            tracing::error!("{why}");
            lock(&self.shared.machine).stale = Some(why);
        }
    }

    /// Idle reclaim: a running job of a tenant with `idle_timeout` whose devices all stay under
    /// `idle_utilization` that long gets an event and a line in its stderr log; after
    /// `idle_grace` more, it is stopped (failed, "idle for 2h; GPUs reclaimed").
    fn check_idle(&mut self) {
        if self.last_idle_check.elapsed() < INVENTORY_MAX_AGE {
            return;
        }
        self.last_idle_check = Instant::now();
        self.jobs.refresh_inventory();
        let now = Instant::now();
        let mut notes: Vec<(i64, &'static str, String)> = Vec::new();
        let inventory = &self.jobs.inventory;
        for (id, job) in &mut self.jobs.running {
            let Some(tenant) = self.shared.config.tenant(&job.tenant) else {
                continue;
            };
            let utilization: Vec<Option<u32>> = job
                .devices
                .iter()
                .map(|u| {
                    inventory
                        .devices
                        .iter()
                        .find(|d| &d.uuid == u)
                        .and_then(|d| d.utilization_gpu_percent)
                })
                .collect();
            for note in job.look_idle(tenant, &utilization, now) {
                notes.push((*id, note.kind, note.message));
            }
        }
        for (id, kind, message) in notes {
            tracing::info!("job {id}: {message}");
            // The warning goes where the job's owner looks: its stderr log.
            let attempt = self.jobs.running.get(&id).map_or(0, |r| r.attempt);
            let log = self.shared.job_dir(id, attempt).join("stderr");
            if let Ok(mut file) = std::fs::OpenOptions::new().append(true).open(&log) {
                use std::io::Write as _;
                let _ = writeln!(file, "orch: {message}");
            }
            self.jobs.write(
                id,
                Change {
                    event: Some(Event::now(kind, message)),
                    ..Change::default()
                },
            );
        }
    }

    /// A job's run ended as its exit record says: its use is counted up to its end.
    fn finish_at(
        &mut self,
        id: i64,
        lease_id: &Option<String>,
        exit: ExitRecord,
        prior_gpu_s: f64,
    ) {
        self.untrack_running(id, ms_to_s(exit.ended_at_ms), prior_gpu_s);
        if exit.state == State::Queued {
            tracing::warn!(
                "job {id}: {}",
                exit.reason.as_deref().unwrap_or("queued again")
            );
            let message = exit.reason.clone().unwrap_or_else(|| "queued again".into());
            self.jobs.write(
                id,
                Change {
                    state: Some(State::Queued),
                    reason: Update::set_if(exit.reason),
                    only_if: Some(State::Running),
                    event: Some(Event::now("queued", message)),
                    ..Change::default()
                },
            );
            self.jobs.release(id, lease_id);
            self.enqueue(id);
            return;
        }
        tracing::info!("job {id}: {}", exit.state.as_str());
        // A record written late (the state folder was full) says so in the reason.
        let reason = match (exit.reason.filter(|r| !r.is_empty()), exit.late) {
            (Some(reason), Some(late)) => Some(format!("{reason}; {late}")),
            (reason, late) => reason.or(late),
        };
        let message = match &reason {
            Some(reason) => format!("{}: {reason}", exit.state.as_str()),
            _ => exit.state.as_str().to_string(),
        };
        self.jobs.write(
            id,
            Change {
                state: Some(exit.state),
                ended_at_ms: Some(exit.ended_at_ms),
                exit_code: exit.exit_code,
                reason: Update::set_or_clear(reason),
                only_if: Some(State::Running),
                event: Some(Event {
                    at_ms: exit.ended_at_ms,
                    kind: "finished".into(),
                    message,
                }),
                ..Change::default()
            },
        );
        // After the record: the devices are never free while the job still shows as running.
        self.jobs.release(id, lease_id);
    }

    /// Nobody can report how job `id` ends any more (`reason` says why): what is left of it is
    /// ended, then it is lost, or queued again with `requeue`.
    fn vanished(&mut self, id: i64, lease_id: &Option<String>, requeue: bool, reason: String) {
        // End what is left of it, so that a job queued again never runs beside its own remains,
        // and its devices come back.
        self.jobs.end_remains(lease_id);
        if requeue {
            self.queue_again(
                id,
                lease_id,
                format!("queued again: {reason} (requeue = true)"),
            );
        } else {
            tracing::warn!("job {id}: lost: {reason}");
            self.jobs.write(
                id,
                Change {
                    state: Some(State::Lost),
                    ended_at_ms: Some(now_ms()),
                    reason: Update::Set(reason.clone()),
                    only_if: Some(State::Running),
                    event: Some(Event::now("lost", reason)),
                    ..Change::default()
                },
            );
            self.jobs.release(id, lease_id);
        }
    }

    /// Running job `id` goes back to the queue with `reason`: recorded first, its lease released
    /// after.
    fn queue_again(&mut self, id: i64, lease_id: &Option<String>, reason: String) {
        tracing::warn!("job {id}: {reason}");
        self.jobs.write(
            id,
            Change {
                state: Some(State::Queued),
                reason: Update::Set(reason.clone()),
                only_if: Some(State::Running),
                event: Some(Event::now("queued", reason)),
                ..Change::default()
            },
        );
        self.jobs.release(id, lease_id);
        self.enqueue(id);
    }

    fn fail(&mut self, id: i64, reason: String) {
        self.end_queued(id, State::Failed, reason);
    }

    /// Ends queued job `id` in `state` (failed, cancelled) with `reason`, unless it left the
    /// queue meanwhile.
    fn end_queued(&mut self, id: i64, state: State, reason: String) {
        self.sched.dequeue(id as u64);
        let word = state.as_str();
        tracing::info!("job {id}: {word}: {reason}");
        self.jobs.write(
            id,
            Change {
                state: Some(state),
                ended_at_ms: Some(now_ms()),
                event: Some(Event::now("finished", format!("{word}: {reason}"))),
                reason: Update::Set(reason),
                only_if: Some(State::Queued),
                ..Change::default()
            },
        );
    }
}

impl Jobs {
    /// `/proc` or the job's folder could not tell how job `id` stands: it stays as it is, and
    /// the log says so at most once a minute.
    fn cannot_tell(&mut self, id: i64, why: String) {
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
    fn catch_up(&mut self) -> bool {
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
    fn place(&mut self, id: i64) -> Placed {
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
                let job = Running::new(start, Origin::Held, Some(holder), Instant::now());
                self.running.insert(id, job);
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
    fn claim(
        &mut self,
        id: i64,
    ) -> Result<(Queued, orch_leases::Lease, orch_runner::Plan), Placed> {
        let dead_holder = self
            .queue
            .get(&id)
            .and_then(|j| j.submission.holder.as_ref())
            .filter(|h| h.process_liveness().is_dead())
            .map(|h| h.pid);
        if let Some(pid) = dead_holder {
            self.queue.remove(&id);
            let reason = format!("its process (pid {pid}) ended while it waited");
            return Err(Placed::Ends(State::Cancelled, reason));
        }
        let Some(job) = self.queue.get(&id) else {
            return Err(Placed::Left);
        };
        // A policy the tenant sent: placed once compiled, off this thread.
        if let Some(hash) = &job.submission.policy_file {
            let plugin = &job.spec.policy.plugin;
            match self
                .shared
                .compiler
                .prepare(&mut self.host, hash, &job.row.tenant, plugin)
            {
                crate::core::compile::Prepared::Ready => {}
                crate::core::compile::Prepared::Waits(reason) => return Err(Placed::Waits(reason)),
                crate::core::compile::Prepared::Failed(reason) => {
                    self.queue.remove(&id);
                    return Err(Placed::Ends(State::Failed, reason));
                }
            }
        }
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
        let deciding = Instant::now();
        let claimed =
            orch_runner::claim(&mut self.store, &mut self.host, &job.spec, &machine, holder);
        self.shared
            .metrics
            .decision("placement", deciding.elapsed().as_secs_f64());
        let (lease, plan) = match claimed {
            Ok(placed) => placed,
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

    /// A held lease's placement and fence in its folder; on failure its devices go back.
    fn write_lease_folder(
        &mut self,
        id: i64,
        dir: &Path,
        job: &Queued,
        lease: &orch_leases::Lease,
        plan: &orch_runner::Plan,
        holder: &Holder,
    ) -> Result<(), Placed> {
        let Err(e) = folders::write_placed(dir, &self.placed(job, lease, plan), holder) else {
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
    fn write_job_folder(
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
            devices: self.shared.devices.clone(),
            exe: self.shared.exe.clone(),
            state_dir: self.shared.state_dir.clone(),
            switch_user: self.shared.root,
            max_runtime_s: running::time_limit(
                &job.spec,
                self.shared.config.tenant(&job.row.tenant),
            )
            .map(|d| d.as_secs_f64()),
            grace_s: orch_runner::GRACE.as_secs_f64(),
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
    fn record_start(
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
    fn not_started(&mut self, id: i64, dir: &Path, e: &std::io::Error) {
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
    fn placed(
        &self,
        job: &Queued,
        lease: &orch_leases::Lease,
        plan: &orch_runner::Plan,
    ) -> folders::Placed {
        let env = orch_runner::lease_env(&job.spec, lease, plan, &self.inventory);
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
    fn release_held(&mut self, id: i64) {
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
    fn release_now(&mut self, job: i64, id: &str) {
        self.release_lease(Release {
            job,
            lease: id.to_string(),
            outright: true,
        });
    }

    /// Makes `release` now, or queues it behind the writes waiting before it, or after a failure.
    fn release_lease(&mut self, release: Release) {
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
    fn store_release(&mut self, release: &Release) -> Result<bool, orch_leases::LeaseError> {
        if release.outright {
            self.store.release(&release.lease).map(|_| true)
        } else {
            self.store
                .release_unless_held(&release.lease, &[Holder::current()])
        }
    }

    /// Starts `orch __supervise DIR` for the folder [`folders::prepare`] wrote; the wait on it
    /// records how it ended in [`Shared::supervisor_exits`].
    fn spawn_supervisor(&self, id: i64, attempt: u32, dir: &Path) -> std::io::Result<()> {
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
        std::thread::spawn(move || {
            let status = child.wait().ok();
            lock(&shared.supervisor_exits).insert((id, attempt), SupervisorEnd { pid, status });
            shared.kick(Kick::SupervisorExited);
        });
        Ok(())
    }

    /// Publishes the leases as they are now (and the foreign processes against them): after a
    /// job started or ended, the API shows it at once rather than at the next reading.
    fn publish_leases(&mut self) {
        let Ok(leases) = self.store.active() else {
            return;
        };
        let inventory = Arc::clone(&lock(&self.shared.machine).inventory);
        let foreign = Arc::new(orch_runner::foreign_processes(&inventory, &leases));
        let mut view = lock(&self.shared.machine);
        view.leases = Arc::new(leases);
        view.foreign = foreign;
    }

    fn refresh_inventory(&mut self) {
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

    /// SIGKILL to every process group and cgroup the lease's holders name.
    fn end_remains(&mut self, lease_id: &Option<String>) {
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
    }

    /// Gives up the daemon's hold on a lease. A process of the job that is still alive (one that
    /// ignored its supervisor's end) keeps it, and with it the devices, until it ends. A release
    /// the store cannot record now is made later, in order.
    fn release(&mut self, job: i64, lease_id: &Option<String>) {
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
    fn write(&mut self, id: i64, change: Change) {
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

/// What a job lost while no daemon watched says.
const VANISHED_UNWATCHED: &str = "its processes vanished while no daemon watched them";

/// Sends `signal` to the supervisor (or held process) `pid` that was verified just now, by pid and
/// start time: never a reused pid. True when it was delivered.
fn signal(pid: u32, signal: i32) -> bool {
    orch_core::process::signal(pid, signal)
}
