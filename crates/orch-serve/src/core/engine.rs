//! The daemon's engine: one thread that owns the queue, the lease store and the policy host.
//! It recovers after a crash, places queued jobs in the order of the queue policy (with the
//! tenants' limits and backfill: [`crate::core::sched`]), starts a supervisor per job, learns how
//! jobs end, records usage, and carries out cancels and preemptions.
//!
//! Its rooms: this file is the loop, the scheduling pass, the look at running jobs and how a run
//! ends; [`recovery`] is what a start after a crash or a restart does; [`watch`] is the device
//! watcher's thread and the idle reclaim that reads it; [`running`] is a running job as a state
//! machine (what to do, decided without touching anything); [`jobs`] holds what placement needs
//! and places, releases and writes.

use crate::core::accounting::{self, Measured, Record};
use crate::core::db::{Change, Event, JobRow, JobUse, State, Submission, Update, UsageRow};
use crate::core::folders::{self, ExitRecord, Fence};
use crate::core::kick::Kick;
use crate::core::sched::deps::{Kind, Standing, Wait};
use crate::core::sched::{Attempt, QueuePolicy, QueuedJob, RunningJob, Scheduler, Usage};
use crate::core::state::{MachineView, Shared, SupervisorEnd};
use orch_core::JobSpec;
use orch_core::sync::lock;
use orch_core::time::now_ms;
use orch_devices::{Inventory, InventorySpec, Visibility, VisibilityEnv};
use orch_host::{Limits, PolicyHost};
use orch_leases::Liveness;
use orch_leases::{Holder, LeaseStore};
use running::{Death, Origin, Recovery, Running, Start};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

pub mod device_health;
mod jobs;
mod recovery;
pub mod running;
mod watch;

use jobs::{Jobs, Placed};

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
    /// A purge (and the vacuum after it) runs on its thread.
    housekeeping: Arc<std::sync::atomic::AtomicBool>,
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
/// The background vacuum's pause between two steps, in which waiting writes go first.
const VACUUM_PAUSE: Duration = Duration::from_millis(5);
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
        // Devices freed by preemption wait for their job while the victims stop (their stop
        // signal, their grace period, SIGKILL) and a little longer.
        sched.reservation_s = shared.config.longest_grace().as_secs_f64() + 30.0;
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
                confined: HashMap::new(),
                no_fit: Vec::new(),
                snapshot: None,
            },
            shared,
            kicks,
            sched,
            last_idle_check: Instant::now(),
            last_usage_save: Instant::now(),
            policy_failure: None,
            housekeeping: Arc::default(),
        })
    }

    /// Records a running job with the scheduler (started, or adopted after a restart).
    fn track_running(&mut self, id: i64, row: &JobRow, preemptible: bool, exclusive: bool) {
        let Some(tenant) = self.sched.tenant_index(&row.tenant) else {
            return;
        };
        let started_s = row.started_at_ms.map_or_else(now_s, ms_to_s);
        self.set_array(id, row);
        self.sched.note_group(id as u64, group_of(row));
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

    /// Tells the scheduler that job `id` is a task of a job array, when it is one.
    fn set_array(&mut self, id: i64, row: &JobRow) {
        if let Some(array) = row.array {
            self.sched.set_array(
                id as u64,
                crate::core::sched::ArrayMember {
                    array: array.id as u64,
                    max_parallel: array.max_parallel,
                },
            );
        }
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

    /// The engine's loop; returns when every sender is gone.
    pub fn run(mut self) {
        let mut last_pass = Instant::now();
        // Finished jobs and their folders go after `retention`; looked at on start, then every
        // ten minutes, or every tenth of `retention` when that is shorter.
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
                Ok(Kick::Stop) | Err(mpsc::RecvTimeoutError::Disconnected) => return,
                Ok(kick) => changed |= self.handle(kick),
                Err(mpsc::RecvTimeoutError::Timeout) => {}
            }
            while let Ok(kick) = self.kicks.try_recv() {
                if matches!(kick, Kick::Stop) {
                    return;
                }
                changed |= self.handle(kick);
            }
            changed |= self.jobs.catch_up();
            changed |= self.check_running();
            self.shared.timeline.note_jobs(
                now_ms(),
                self.jobs.queue.values().map(|q| q.row.tenant.as_str()),
                self.jobs.running.values().map(|r| r.tenant.as_str()),
            );
            self.check_idle();
            self.check_alloc_time();
            if self.last_usage_save.elapsed() >= USAGE_SAMPLE {
                self.save_usage(Vec::new());
            }
            if changed || last_pass.elapsed() >= Duration::from_secs(1) {
                self.pass();
                last_pass = Instant::now();
            }
        }
    }

    /// Deletes the finished jobs older than `retention`, their logs and folders, and the
    /// accounting records older than `accounting_retention`; then gives the freed pages back.
    /// All of it on a thread of its own (one at a time), in writes of [`PURGE_BATCH`] jobs that
    /// the engine's own writes pass between: a purge of a year's jobs never holds up a pass.
    fn purge(&mut self) {
        use std::sync::atomic::Ordering;
        if self.housekeeping.swap(true, Ordering::AcqRel) {
            return;
        }
        let shared = Arc::clone(&self.shared);
        let busy = Arc::clone(&self.housekeeping);
        let started = std::thread::Builder::new()
            .name("orch-purge".into())
            .spawn(move || {
                // Cleared however the purge ends, a panic included: the next purge runs.
                let _done = Cleared(busy);
                purge_and_vacuum(&shared);
            });
        if let Err(e) = started {
            self.housekeeping.store(false, Ordering::Release);
            tracing::warn!("could not start the purge of old jobs: {e}");
        }
    }

    fn handle(&mut self, kick: Kick) -> bool {
        match kick {
            Kick::Submitted(id) => self.enqueue(id),
            Kick::Dequeued(id) => {
                self.jobs.queue.remove(&id);
                self.shared.policies.forget(id);
                self.sched.dequeue(id as u64);
                lock(&self.shared.reasons).remove(&id);
                lock(&self.shared.places).remove(&id);
                // Its end decides the jobs that wait on it.
                if let Ok(Some(row)) = self.shared.db.job(id)
                    && row.state.is_final()
                {
                    self.settled(id, row.state, row.exit_code);
                }
            }
            Kick::Cancel(id) => {
                if let Some(job) = self.jobs.running.get_mut(&id) {
                    job.cancel();
                }
            }
            // `Stop` ends `run` before it gets here.
            Kick::SupervisorExited | Kick::Stop => {}
            Kick::Release(id) => self.jobs.release_held(id),
            Kick::PolicyCompiled(hash) => self.policy_compiled(&hash),
            Kick::PolicyAnswered => {}
            Kick::DeviceHealth(became) => self.devices_unhealthy(became),
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
        match submission.spec() {
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
                let wait = match self.wait_of(&row) {
                    Ok(wait) => wait,
                    Err(e) => {
                        tracing::error!("job {id}: {e}");
                        return;
                    }
                };
                let db = &self.shared.db;
                let mut standing = |on: u64| standing_of(db, on as i64);
                let queued = QueuedJob {
                    id: id as u64,
                    tenant,
                    name: spec.name.clone(),
                    tags: spec.tags.clone(),
                    gpus: spec.resources.gpus,
                    exclusive: crate::core::slices::takes_whole_gpus(&spec),
                    priority: spec.priority,
                    submitted_s: ms_to_s(row.submitted_at_ms),
                    queued_s: now_s(),
                    runtime_s: runtime.map(|d| d.as_secs_f64()),
                    preemptible: spec.preemptible,
                };
                if let Err(reason) = self.sched.enqueue_after(queued, wait, &mut standing) {
                    self.end_queued(id, State::Cancelled, reason);
                    return;
                }
                if let Some(gpus) =
                    crate::core::slices::gpu_equivalent(&spec, &self.jobs.inventory.devices)
                {
                    self.sched.set_compute(id as u64, gpus);
                }
                if let Some(profile) = crate::core::slices::takes_slices(&spec) {
                    self.sched.set_slices(id as u64, profile);
                }
                self.set_array(id, &row);
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

    /// What queued job `row` waits for, as recorded at its submission.
    fn wait_of(&self, row: &JobRow) -> Result<Wait, crate::core::db::DbError> {
        let depends = self.shared.db.dependencies(row.id)?;
        // A job that started before (preempted, or queued again after its processes vanished)
        // had what it waits for met then: that is not asked again, and the jobs it names may be
        // purged since. `singleton` holds for every run.
        let after = if row.attempt > 0 {
            Vec::new()
        } else {
            depends
                .pairs()
                .filter_map(|(key, on)| Some((Kind::from_key(key)?, u64::try_from(on).ok()?)))
                .collect()
        };
        Ok(Wait {
            after,
            singleton: depends.singleton,
            group: group_of(row),
        })
    }

    /// Job `id` ended for good, in `state`: the jobs that wait on it go into the queue, or end
    /// cancelled when it can no longer be what they wait for (and so on down their chains).
    fn settled(&mut self, id: i64, state: State, exit_code: Option<i32>) {
        let ok = state == State::Succeeded;
        let cancelled = self
            .sched
            .dependency_ended(id as u64, ok, ended_how(state, exit_code));
        for (dependant, reason) in cancelled {
            let dependant = dependant as i64;
            self.jobs.queue.remove(&dependant);
            self.end_queued(dependant, State::Cancelled, reason);
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
            if job.held() {
                self.jobs.unconfine(id);
            }
            job.untrack_holder();
            let (exit, idle_stopped) = job.exited(exit);
            if idle_stopped {
                self.shared.metrics.idle_stopped();
            }
            self.jobs.unknown_logged.remove(&id);
            let measured = Measured {
                process: accounting::read_use(&dir),
                gpu: job.gpu.clone(),
            };
            self.finish_at(id, &Some(job.lease_id), exit, job.prior_gpu_s, measured);
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
        let probe = if job.held() {
            Holder::liveness
        } else {
            Holder::process_liveness
        };
        let liveness = job.liveness(ended.is_some(), Instant::now(), probe);
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
        if job.held() {
            self.jobs.unconfine(id);
        }
        job.untrack_holder();
        let lease = Some(job.lease_id.clone());
        let prior = job.prior_gpu_s;
        let measured = Measured {
            process: accounting::read_use(&dir),
            gpu: job.gpu.clone(),
        };
        match job.died(ended.map(|e| e.words()), now_ms()) {
            Death::Finish(record) => {
                // For a restarted daemon; the database, written next, is what counts.
                if let Err(e) = folders::write_exit(&dir, &record) {
                    tracing::warn!(
                        "job {id}: could not write its exit record ({e}); the job database has it"
                    );
                }
                self.finish_at(id, &lease, record, prior, measured);
            }
            // A supervisor that ended before it took the fence never started the job: fenced
            // now, the job goes back to the queue (it never ran; nothing is charged).
            Death::NeverStarted(reason) => {
                let taken = match folders::take_fence(&dir, &Fence { supervisor: None }) {
                    // A fence without a supervisor is this daemon's own, from an earlier try
                    // whose last step failed (a full disk at the folder's sync): taken.
                    Ok(false) => match folders::read_fence(&dir) {
                        Ok(Some(fence)) if fence.supervisor.is_none() => Ok(true),
                        Ok(_) => Ok(false),
                        Err(e) => Err(e),
                    },
                    other => other,
                };
                match taken {
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
                        self.watch_again(id, job, ended);
                    }
                    Err(e) => {
                        self.watch_again(id, job, ended);
                        self.jobs
                            .cannot_tell(id, format!("cannot fence off its folder: {e}"));
                    }
                }
            }
            Death::Vanished { requeue, reason } => {
                self.untrack_running(id, now_s(), prior);
                self.vanished(id, &lease, requeue, reason, measured);
            }
        }
        true
    }

    /// A job whose end could not be settled yet goes back to the running ones, with its
    /// supervisor's recorded exit: without it, a supervisor this daemon started counts as alive
    /// forever (only its wait says otherwise), and the job would never be looked at again.
    fn watch_again(&mut self, id: i64, job: Running, ended: Option<SupervisorEnd>) {
        if let Some(end) = ended {
            lock(&self.shared.supervisor_exits).insert((id, job.attempt), end);
        }
        self.jobs.running.insert(id, job);
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
            self.wait_for_the_state_folder(fault);
            return;
        }
        let Some((machine, out_of_service)) = self.machine_now() else {
            return;
        };
        let started = Instant::now();
        let now = now_s();
        // Policies asked in this pass see the leases as they are now.
        self.jobs.snapshot = None;
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
            self.policy_failed(failure);
        }
        for p in report.preempt {
            self.preempt(p.victim as i64, p.reason);
        }
        let mut reasons = report.reasons;
        name_out_of_service(&mut reasons, &out_of_service);
        let placed = reasons.len();
        reasons.extend(self.sched.held_reasons());
        self.publish_reasons(reasons, placed);
        for id in std::mem::take(&mut self.jobs.no_fit) {
            self.shared.policies.set_undecided(id, false);
        }
    }

    /// Every queued job waits for the state folder to take writes again, and says so.
    fn wait_for_the_state_folder(&mut self, fault: crate::core::health::Fault) {
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
        // No pass ran: no order to tell.
        lock(&self.shared.places).clear();
    }

    /// The devices a pass may place on, and how many of them are free: in service (not drained,
    /// not unhealthy) and held by no exclusive lease; `None` when the lease store cannot say (the
    /// pass is skipped).
    /// The devices out of service are named, in words, beside the machine; the free MIG slices
    /// by profile go to the scheduler (its starvation bound for jobs of slices).
    fn machine_now(&mut self) -> Option<(orch_queue::Machine, Vec<String>)> {
        self.jobs.refresh_inventory();
        let leases = match self.jobs.store.active() {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!("scheduling pass skipped: {e}");
                return None;
            }
        };
        let held: std::collections::HashSet<&str> = leases
            .iter()
            .filter(|l| l.exclusive)
            .flat_map(|l| l.devices.iter().map(String::as_str))
            .collect();
        let placeable: Vec<(&orch_devices::Device, Option<&str>)> = self
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
                    .map(|d| (d, v.mig_uuid.as_deref()))
            })
            .collect();
        // A slice any lease holds is no room for a job of slices to itself.
        let leased: std::collections::HashSet<&str> = leases
            .iter()
            .flat_map(|l| l.devices.iter().map(String::as_str))
            .collect();
        let free_slices = crate::core::slices::free_by_profile(&placeable, &leased);
        // A GPU in MIG mode is never placed on whole.
        let visible: Vec<&orch_devices::Device> = placeable
            .into_iter()
            .filter(|(d, named)| !d.mig_mode && named.is_none())
            .map(|(d, _)| d)
            .collect();
        // A drained or unhealthy GPU takes no job: preemption, the starvation hold-back and
        // backfill must not count it as room.
        let out: Vec<String> = visible
            .iter()
            .filter_map(|d| d.out_of_service(&d.uuid))
            .collect();
        let free = visible
            .iter()
            .filter(|d| !held.contains(d.uuid.as_str()) && d.out_of_service(&d.uuid).is_none())
            .count();
        let machine = orch_queue::Machine {
            free_gpus: free as u32,
            total_gpus: visible.len() as u32,
        };
        self.sched.set_free_slices(free_slices);
        Some((machine, out))
    }

    /// The queue policy failed this pass: logged when the failure is new, or a minute passed.
    fn policy_failed(&mut self, failure: String) {
        let repeat = self
            .policy_failure
            .as_ref()
            .is_some_and(|(last, at)| *last == failure && at.elapsed() < Duration::from_secs(60));
        if !repeat {
            tracing::warn!("{failure}");
            self.policy_failure = Some((failure, Instant::now()));
        }
    }

    /// The scheduler chose running job `id` to make room: its stop is decided (carried out at the
    /// next look at it) and recorded, unless one was decided already.
    fn preempt(&mut self, id: i64, reason: String) {
        if let Some(job) = self.jobs.running.get_mut(&id)
            && job.preempt(reason.clone())
        {
            tracing::info!("job {id}: {reason}");
            self.shared.metrics.preempted();
            self.jobs.write(
                id,
                Change {
                    event: Some(Event::now("preempted", reason)),
                    ..Change::default()
                },
            );
        }
    }

    /// Why each queued job waits, and its place in the pass's order, for the API. A job queued
    /// again keeps saying why (preempted, its processes vanished) before why it waits now.
    /// Only the first `placed` reasons are of jobs the pass tried: those held back by their
    /// dependencies have no place in its order.
    fn publish_reasons(&mut self, reasons: Vec<(u64, String)>, placed: usize) {
        let waiting = placed;
        let places: HashMap<i64, (usize, usize)> = reasons
            .iter()
            .take(placed)
            .enumerate()
            .map(|(i, (id, _))| (*id as i64, (i + 1, waiting)))
            .collect();
        let reasons: HashMap<i64, String> = reasons
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
        *lock(&self.shared.places) = places;
    }

    /// An interactive allocation past its time limit is stopped: an event says why, and its
    /// process (`orch alloc`) is asked to end its shell at the next look at running jobs.
    fn check_alloc_time(&mut self) {
        let now = now_ms();
        let due: Vec<(i64, String)> = self
            .jobs
            .running
            .iter_mut()
            .filter_map(|(id, job)| job.look_time(now).map(|note| (*id, note.message)))
            .collect();
        for (id, message) in due {
            tracing::info!("job {id}: {message}");
            self.jobs.write(
                id,
                Change {
                    event: Some(Event::now("stopping", message)),
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
        measured: Measured,
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
        let accounting = self.accounting(
            id,
            exit.state,
            exit.ended_at_ms,
            exit.exit_code,
            reason.clone(),
            &measured,
        );
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
                accounting,
                ..Change::default()
            },
        );
        // After the record: the devices are never free while the job still shows as running.
        self.jobs.release(id, lease_id);
        self.settled(id, exit.state, exit.exit_code);
    }

    /// Job `id`'s accounting record as it ends in `state` (its row read now, before the end is
    /// written: its devices, times and GPU-seconds), counted in the metrics; `None` when the row
    /// cannot be read (the end is still written, without a record).
    fn accounting(
        &self,
        id: i64,
        state: State,
        ended_at_ms: u64,
        exit_code: Option<i32>,
        reason: Option<String>,
        measured: &Measured,
    ) -> Option<Box<Record>> {
        let row = match self.shared.db.job(id) {
            Ok(Some(row)) => row,
            Ok(None) => return None,
            Err(e) => {
                tracing::warn!("job {id}: its accounting is not recorded: {e}");
                return None;
            }
        };
        let record = Record::of(&row, state, ended_at_ms, exit_code, reason, measured);
        self.shared.metrics.job_finished(&record);
        Some(Box::new(record))
    }

    /// Nobody can report how job `id` ends any more (`reason` says why): what is left of it is
    /// ended, then it is lost, or queued again with `requeue`.
    fn vanished(
        &mut self,
        id: i64,
        lease_id: &Option<String>,
        requeue: bool,
        reason: String,
        measured: Measured,
    ) {
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
            let at = now_ms();
            let accounting =
                self.accounting(id, State::Lost, at, None, Some(reason.clone()), &measured);
            self.jobs.write(
                id,
                Change {
                    state: Some(State::Lost),
                    ended_at_ms: Some(at),
                    reason: Update::Set(reason.clone()),
                    only_if: Some(State::Running),
                    event: Some(Event::now("lost", reason)),
                    accounting,
                    ..Change::default()
                },
            );
            self.jobs.release(id, lease_id);
            self.settled(id, State::Lost, None);
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
        self.shared.policies.forget(id);
        let word = state.as_str();
        tracing::info!("job {id}: {word}: {reason}");
        let at = now_ms();
        let accounting = self.accounting(
            id,
            state,
            at,
            None,
            Some(reason.clone()),
            &Measured::default(),
        );
        self.jobs.write(
            id,
            Change {
                state: Some(state),
                ended_at_ms: Some(at),
                event: Some(Event::now("finished", format!("{word}: {reason}"))),
                reason: Update::Set(reason),
                only_if: Some(State::Queued),
                accounting,
                ..Change::default()
            },
        );
        self.settled(id, state, None);
    }
}

/// Clears its flag when dropped (the purge's "running" flag, whichever way its thread ends).
struct Cleared(Arc<std::sync::atomic::AtomicBool>);

impl Drop for Cleared {
    fn drop(&mut self) {
        self.0.store(false, std::sync::atomic::Ordering::Release);
    }
}

/// How many jobs (or accounting records) one write of a purge deletes.
const PURGE_BATCH: usize = 100;

/// The purge (see [`Engine::purge`]), on the thread it runs on.
fn purge_and_vacuum(shared: &Shared) {
    let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    let mut freed = false;
    let accounting_before = now_ms().saturating_sub(ms(shared.config.accounting_retention));
    let mut records = 0;
    // Bounded: each round deletes a batch or ends it.
    for _ in 0..1_000_000 {
        match shared
            .db
            .write_blocking(move |tx| accounting::purge(tx, accounting_before, PURGE_BATCH as u32))
        {
            Ok(0) => break,
            Ok(n) => records += n,
            Err(e) => {
                tracing::warn!("could not purge old accounting records: {e}");
                break;
            }
        }
    }
    if records > 0 {
        tracing::info!("purged {records} accounting record(s) older than accounting_retention");
        freed = true;
    }
    let before = now_ms().saturating_sub(ms(shared.config.retention));
    let old = match shared.db.finished_before(before) {
        Ok(old) => old,
        Err(e) => {
            tracing::warn!("could not look for old jobs: {e}");
            Vec::new()
        }
    };
    let mut purged = 0;
    for batch in old.chunks(PURGE_BATCH) {
        let ids: Vec<i64> = batch.iter().map(|(id, _)| *id).collect();
        if let Err(e) = shared
            .db
            .write_blocking(move |tx| crate::core::db::purge_jobs(tx, &ids))
        {
            tracing::warn!("could not purge old jobs: {e}");
            break;
        }
        for (id, attempts) in batch {
            for attempt in 0..=*attempts {
                let _ = std::fs::remove_dir_all(shared.job_dir(*id, attempt));
            }
        }
        purged += batch.len();
    }
    if purged > 0 {
        tracing::info!(
            "purged {purged} job(s) that ended over {:?} ago",
            shared.config.retention
        );
        freed = true;
    }
    if !freed {
        return;
    }
    let began = Instant::now();
    match accounting::vacuum_in_steps(&shared.db, VACUUM_PAUSE) {
        Ok(0) => {}
        Ok(pages) => tracing::info!(
            "gave {pages} free page(s) of the job database back in {:.1?}",
            began.elapsed()
        ),
        Err(e) => tracing::warn!("could not vacuum the job database: {e}"),
    }
}

/// The group `singleton` counts a job in: its user and name.
fn group_of(row: &JobRow) -> String {
    format!("{}/{}", row.uid, row.name)
}

/// How a job that ended in `state` ended, as a dependant's reason says it: "failed (exit 1)".
fn ended_how(state: State, exit_code: Option<i32>) -> String {
    match (state, exit_code) {
        (State::Failed, Some(code)) => format!("failed (exit {code})"),
        (State::Cancelled, _) => "was cancelled".into(),
        (State::Lost, _) => "was lost".into(),
        (state, _) => state.as_str().into(),
    }
}

/// Where job `on`, named by a dependency, stands in the database now. A job no longer there
/// (purged after `retention`) is taken as ended without success: nothing says it succeeded.
fn standing_of(db: &crate::core::db::Db, on: i64) -> Standing {
    match db.job(on) {
        Ok(Some(row)) if row.state.is_final() => Standing::Ended {
            ok: row.state == State::Succeeded,
            how: ended_how(row.state, row.exit_code),
        },
        Ok(Some(_)) => Standing::Active,
        Ok(None) => Standing::Ended {
            ok: false,
            how: "is no longer in the job database".into(),
        },
        // Unknown is not ended: it waits, and is looked at again when the job ends.
        Err(_) => Standing::Active,
    }
}

/// What a job lost while no daemon watched says.
const VANISHED_UNWATCHED: &str = "its processes vanished while no daemon watched them";

/// Sends `signal` to the supervisor (or held process) `pid` that was verified just now, by pid and
/// start time: never a reused pid. True when it was delivered.
fn signal(pid: u32, signal: i32) -> bool {
    orch_core::process::signal(pid, signal)
}

/// A job that waits for free devices while some are out of service says which, as a placement
/// that finds no fit does (`waiting for 2 free device(s); 1 free; out of service: GPU 2 is
/// drained (maintenance)`).
fn name_out_of_service(reasons: &mut [(u64, String)], out: &[String]) {
    if out.is_empty() {
        return;
    }
    let words = format!("; out of service: {}", out.join(", "));
    const WAITING: &str = "free device(s); ";
    for (_, reason) in reasons {
        if !reason.starts_with("waiting for ") || reason.contains("out of service") {
            continue;
        }
        // After the scheduler's own words (`N free`, or what it holds back), before a policy's.
        let Some(start) = reason.find(WAITING).map(|i| i + WAITING.len()) else {
            continue;
        };
        let end = reason[start..]
            .find("; ")
            .map_or(reason.len(), |i| start + i);
        reason.insert_str(end, &words);
    }
}

#[cfg(test)]
mod purge_flag_tests {
    use super::Cleared;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    #[test]
    fn a_purge_that_panics_still_clears_its_running_flag() {
        let busy = Arc::new(AtomicBool::new(true));
        let flag = Arc::clone(&busy);
        let ended = std::thread::spawn(move || {
            let _done = Cleared(flag);
            panic!("a purge that fails");
        })
        .join();
        assert!(ended.is_err());
        assert!(!busy.load(Ordering::Acquire));
    }
}

#[cfg(test)]
mod out_of_service_tests {
    use super::name_out_of_service;

    #[test]
    fn a_job_waiting_for_free_devices_names_those_out_of_service() {
        let mut reasons = vec![
            (1, "waiting for 2 free device(s); 1 free; tenant a is over its share".to_string()),
            (2, "waiting for 2 free device(s); holding the 1 free ones for it (it waited over the starvation limit)".to_string()),
            (3, "tenant a holds 2 device(s) of its max_gpus = 2".to_string()),
        ];
        name_out_of_service(&mut reasons, &["GPU 2 is drained (fan)".to_string()]);
        assert_eq!(
            reasons[0].1,
            "waiting for 2 free device(s); 1 free; out of service: GPU 2 is drained (fan); tenant a is over its share"
        );
        assert!(
            reasons[1]
                .1
                .ends_with("limit); out of service: GPU 2 is drained (fan)")
        );
        assert_eq!(
            reasons[2].1,
            "tenant a holds 2 device(s) of its max_gpus = 2"
        );
    }
}
