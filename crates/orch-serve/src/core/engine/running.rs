//! A running job as a state machine. Every decision the engine makes about a job that runs is a
//! transition of [`Running`]: a cancel asked for, a preemption or an idle reclaim decided, the
//! signal due to its supervisor, its supervisor found dead, its exit record reconciled with the
//! stop that caused it, a held lease given back. Each transition only changes the value and says
//! what follows; the engine carries it out (files, the database, the lease store, signals). So
//! every rule here is tested without a socket, a process or a folder.

use crate::core::config::Tenant;
use crate::core::db::State;
use crate::core::folders::{self, ExitRecord};
use orch_core::JobSpec;
use orch_leases::{Holder, Liveness};
use std::time::{Duration, Instant};

/// How long a job whose supervisor is not this daemon's child may show no supervisor (no fence
/// naming one) before it counts as gone.
pub const FENCE_PATIENCE: Duration = Duration::from_secs(30);

/// Where a cancel stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cancel {
    None,
    /// Asked for; sent to the supervisor once it is known and alive.
    Requested,
    Sent,
}

/// A stop the daemon decided on (not a cancel): preemption, idle reclaim, or an allocation's
/// limit.
#[derive(Debug, Clone, PartialEq)]
pub struct Stop {
    pub kind: StopKind,
    /// Why, as the job's reason will say.
    pub reason: String,
    /// The supervisor was told.
    pub sent: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopKind {
    /// Queued again afterwards.
    Preempt,
    /// Ends `failed`.
    Idle,
    /// An allocation's time limit (a supervisor applies its job's own): ends `failed`.
    TimeLimit,
}

/// The limits of an interactive allocation (`orch alloc`), which the engine applies to its
/// held lease: nothing else watches the shell.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AllocLimits {
    /// `--idle`: released once all its GPUs have stayed under the tenant's `idle_utilization`
    /// this long.
    pub idle: Option<Duration>,
    /// Its time limit (`--time`, or its tenant's `max_runtime` when shorter) and when that runs
    /// out, wall clock in ms.
    pub time: Option<(Duration, u64)>,
}

impl AllocLimits {
    /// The limits of an allocation that started at `started_at_ms` with time limit `limit`.
    pub fn new(
        alloc: &crate::core::db::Alloc,
        limit: Option<Duration>,
        started_at_ms: u64,
    ) -> AllocLimits {
        AllocLimits {
            idle: alloc.idle_ms.map(Duration::from_millis),
            time: limit.map(|limit| {
                let ms = u64::try_from(limit.as_millis()).unwrap_or(u64::MAX);
                (limit, started_at_ms.saturating_add(ms))
            }),
        }
    }
}

/// What watches the job, and so how its end is learnt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// Its supervisor is this daemon's child: how it ends comes from the wait on it
    /// ([`crate::core::state::Shared::supervisor_exits`]), not from `/proc`.
    Spawned,
    /// A supervisor found running after a restart, watched through `/proc`.
    Adopted,
    /// A lease held by the client's own process (the `supervisor` is that process): nothing was
    /// started for it, and it ends when the process releases it or ends.
    Held,
}

/// What a run starts from: the job's row and its lease.
#[derive(Debug, Clone)]
pub struct Start {
    pub tenant: String,
    /// Its devices (uuids).
    pub devices: Vec<String>,
    pub attempt: u32,
    pub lease_id: String,
    pub requeue: bool,
    /// Device-seconds of its earlier runs.
    pub prior_gpu_s: f64,
}

/// A job the engine watches run.
#[derive(Debug, Clone)]
pub struct Running {
    pub tenant: String,
    pub devices: Vec<String>,
    pub attempt: u32,
    pub lease_id: String,
    pub requeue: bool,
    pub prior_gpu_s: f64,
    /// Its supervisor (or a held lease's process), once known.
    pub supervisor: Option<Holder>,
    pub origin: Origin,
    cancel: Cancel,
    stop: Option<Stop>,
    /// Since when all its devices stay under the tenant's idle_utilization, and whether it was
    /// warned.
    idle_since: Option<Instant>,
    idle_warned: bool,
    /// Since when the daemon has watched it: a supervisor is given a moment to write its fence.
    watched_since: Instant,
    /// An interactive allocation's limits.
    alloc: Option<AllocLimits>,
    /// Its devices' utilization and its processes' memory on them, looked at while it runs
    /// (since it was watched: a restart starts over), for its accounting.
    pub gpu: crate::core::accounting::GpuWatch,
}

/// Which signal is due, and what it carries out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Signal {
    pub pid: u32,
    pub signal: i32,
    pub purpose: Purpose,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    Cancel,
    Stop,
}

/// What one look at a job's idle devices came to: an event for the job (and a line in its stderr
/// log).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Note {
    /// The event's kind: `idle` or `stopping`.
    pub kind: &'static str,
    pub message: String,
}

/// A job whose supervisor (or held process) is gone and left no exit record.
#[derive(Debug, Clone, PartialEq)]
pub enum Death {
    /// A held lease's process ended: the job ends with this record.
    Finish(ExitRecord),
    /// Its supervisor ended before it took the fence: once the engine takes the fence, the job
    /// never started and goes back to the queue with this reason.
    NeverStarted(String),
    /// Nobody can tell how it ended: what is left of it is ended, then it is lost, or queued
    /// again with `requeue`.
    Vanished { requeue: bool, reason: String },
}

/// What a restarted daemon does with a job its database shows running and that left no exit
/// record.
#[derive(Debug, Clone, PartialEq)]
pub enum Recovery {
    /// Its supervisor (or held process) lives, or `/proc` cannot tell: it is watched again.
    Adopt(Holder),
    /// A held lease's process ended while no daemon watched.
    HeldEnded(u32),
    /// The daemon stopped before it started: queued again, nothing charged.
    QueueAgain,
    /// Its processes vanished while no daemon watched them.
    Vanished,
}

/// The recovery rule: `never_started` when the restarted daemon took the fence itself;
/// `supervisor` what the fence names, with whether `/proc` says it is dead.
pub fn recovery(never_started: bool, supervisor: Option<(Holder, bool)>, held: bool) -> Recovery {
    match supervisor {
        // A supervisor `/proc` cannot tell about is adopted: it is watched, never lost.
        Some((holder, false)) => Recovery::Adopt(holder),
        Some((holder, true)) if held => Recovery::HeldEnded(holder.pid),
        _ if never_started => Recovery::QueueAgain,
        _ => Recovery::Vanished,
    }
}

/// A job's time limit: its own `max_runtime` or its tenant's, whichever is shorter.
pub fn time_limit(spec: &JobSpec, tenant: Option<&Tenant>) -> Option<Duration> {
    spec.max_runtime
        .into_iter()
        .chain(tenant.and_then(|t| t.max_runtime))
        .min()
}

/// How a held lease ends when its process does: nothing can tell its exit status (the process
/// is not the daemon's child), so it ends `succeeded` with the reason.
pub fn held_ended(pid: u32, at_ms: u64) -> ExitRecord {
    ended(
        State::Succeeded,
        format!("its process (pid {pid}) ended"),
        at_ms,
    )
}

fn ended(state: State, reason: String, at_ms: u64) -> ExitRecord {
    ExitRecord {
        state,
        exit_code: None,
        reason: Some(reason),
        ended_at_ms: at_ms,
        late: None,
    }
}

impl Running {
    /// A run watched from `now`: just started (`Spawned`, `Held`) or adopted after a restart.
    pub fn new(start: Start, origin: Origin, supervisor: Option<Holder>, now: Instant) -> Running {
        Running {
            tenant: start.tenant,
            devices: start.devices,
            attempt: start.attempt,
            lease_id: start.lease_id,
            requeue: start.requeue,
            prior_gpu_s: start.prior_gpu_s,
            supervisor,
            origin,
            cancel: Cancel::None,
            stop: None,
            idle_since: None,
            idle_warned: false,
            watched_since: now,
            alloc: None,
            gpu: Default::default(),
        }
    }

    /// It is an interactive allocation with these limits.
    pub fn set_alloc(&mut self, limits: AllocLimits) {
        self.alloc = Some(limits);
    }

    pub fn alloc(&self) -> Option<&AllocLimits> {
        self.alloc.as_ref()
    }

    pub fn held(&self) -> bool {
        self.origin == Origin::Held
    }

    pub fn cancel_state(&self) -> Cancel {
        self.cancel
    }

    pub fn stop(&self) -> Option<&Stop> {
        self.stop.as_ref()
    }

    /// A cancel was asked for (the API committed it): carried out once the supervisor is known.
    /// False when one was asked for already.
    pub fn cancel(&mut self) -> bool {
        if self.cancel != Cancel::None {
            return false;
        }
        self.cancel = Cancel::Requested;
        true
    }

    /// The scheduler chose it to make room: false when a stop was decided already.
    pub fn preempt(&mut self, reason: String) -> bool {
        self.decide_stop(StopKind::Preempt, reason)
    }

    fn decide_stop(&mut self, kind: StopKind, reason: String) -> bool {
        if self.stop.is_some() {
            return false;
        }
        self.stop = Some(Stop {
            kind,
            reason,
            sent: false,
        });
        true
    }

    /// A held lease's process, watched with its tree, is no longer: its cgroup goes.
    pub fn untrack_holder(&self) {
        if self.held()
            && let Some(holder) = &self.supervisor
        {
            crate::core::holders::untrack(holder);
        }
    }

    /// The fence named its supervisor (or still names none).
    pub fn learn_supervisor(&mut self, supervisor: Option<Holder>) {
        if self.supervisor.is_none() {
            self.supervisor = supervisor;
        }
    }

    /// Whether its supervisor runs: `ended` is what the wait on this daemon's child said;
    /// `probe` asks `/proc` about a supervisor the daemon did not start.
    pub fn liveness(
        &self,
        ended: bool,
        now: Instant,
        probe: impl FnOnce(&Holder) -> Liveness,
    ) -> Liveness {
        match &self.supervisor {
            _ if ended => Liveness::Dead,
            // This daemon's child: alive until the wait on it says otherwise.
            None if self.origin == Origin::Spawned => Liveness::Alive,
            None if now.duration_since(self.watched_since) > FENCE_PATIENCE => Liveness::Dead,
            None => Liveness::Alive,
            Some(holder) => probe(holder),
        }
    }

    /// The signal due to its live supervisor now, if any: a cancel first (SIGTERM); else a
    /// decided stop not yet sent. A held lease's process is the program itself: it is asked to
    /// end (SIGTERM) whatever the stop.
    pub fn signal_due(&self) -> Option<Signal> {
        let pid = self.supervisor.as_ref()?.pid;
        match (self.cancel, &self.stop) {
            (Cancel::Requested, _) => Some(Signal {
                pid,
                signal: libc::SIGTERM,
                purpose: Purpose::Cancel,
            }),
            (Cancel::None, Some(stop)) if !stop.sent => Some(Signal {
                pid,
                signal: match stop.kind {
                    _ if self.held() => libc::SIGTERM,
                    StopKind::Preempt => folders::PREEMPT_SIGNAL,
                    StopKind::Idle => folders::IDLE_SIGNAL,
                    StopKind::TimeLimit => libc::SIGTERM,
                },
                purpose: Purpose::Stop,
            }),
            _ => None,
        }
    }

    /// The signal [`Running::signal_due`] named was delivered.
    pub fn signalled(&mut self, purpose: Purpose) {
        match purpose {
            Purpose::Cancel => self.cancel = Cancel::Sent,
            Purpose::Stop => {
                if let Some(stop) = &mut self.stop {
                    stop.sent = true;
                }
            }
        }
    }

    /// Idle reclaim, one look: `utilization` per device (`None` where it cannot be read, which is
    /// never idle). Under the tenant's `idle_utilization` for `idle_timeout` it is warned; after
    /// `idle_grace` more, stopped (`failed`, "idle for 2h; GPUs reclaimed"); busy again after a
    /// warning, it is told so. An allocation under its own idle limit (`--idle`) is stopped at
    /// that limit, unwarned (its user chose it): `failed`, "released after 30m idle on its GPUs".
    pub fn look_idle(
        &mut self,
        tenant: &Tenant,
        utilization: &[Option<u32>],
        now: Instant,
    ) -> Vec<Note> {
        let mut notes = Vec::new();
        let own = self.alloc.and_then(|a| a.idle);
        if tenant.idle_timeout.is_none() && own.is_none() {
            return notes;
        }
        if self.stop.is_some() || self.cancel != Cancel::None || self.devices.is_empty() {
            return notes;
        }
        let idle = utilization
            .iter()
            .all(|u| u.is_some_and(|u| u < tenant.idle_utilization));
        if !idle {
            if self.idle_warned {
                notes.push(Note {
                    kind: "idle",
                    message: "its GPUs are busy again; it will not be stopped".into(),
                });
            }
            self.idle_since = None;
            self.idle_warned = false;
            return notes;
        }
        let since = *self.idle_since.get_or_insert(now);
        let idle_for = now.duration_since(since);
        if let Some(own) = own
            && idle_for >= own
        {
            let reason = format!(
                "released after {} idle on its GPUs",
                humantime::format_duration(own)
            );
            self.decide_stop(StopKind::Idle, reason.clone());
            notes.push(Note {
                kind: "stopping",
                message: reason,
            });
            return notes;
        }
        let Some(timeout) = tenant.idle_timeout else {
            return notes;
        };
        let limit = humantime::format_duration(timeout).to_string();
        if idle_for >= timeout && !self.idle_warned {
            self.idle_warned = true;
            let grace = humantime::format_duration(tenant.idle_grace).to_string();
            notes.push(Note {
                kind: "idle",
                message: format!(
                    "its GPUs have stayed under {}% utilization for {limit}; it will be stopped in {grace} unless they get busy",
                    tenant.idle_utilization
                ),
            });
        }
        if idle_for >= timeout + tenant.idle_grace {
            let reason = format!("idle for {limit}; GPUs reclaimed");
            self.decide_stop(StopKind::Idle, reason.clone());
            notes.push(Note {
                kind: "stopping",
                message: reason,
            });
        }
        notes
    }

    /// An allocation's time limit, one look at the wall clock (`now_ms`): once it has run out,
    /// it is stopped (`failed`, "released at its time limit (4h)").
    pub fn look_time(&mut self, now_ms: u64) -> Option<Note> {
        let (limit, at) = self.alloc?.time?;
        if now_ms < at || self.cancel != Cancel::None {
            return None;
        }
        let reason = format!(
            "released at its time limit ({})",
            humantime::format_duration(limit)
        );
        self.decide_stop(StopKind::TimeLimit, reason.clone())
            .then_some(Note {
                kind: "stopping",
                message: reason,
            })
    }

    /// Its exit record, reconciled with what the daemon decided: a cancel that came during a
    /// preemption ends it cancelled; a preemption says why it is queued again; an idle stop
    /// ends it failed with its reason (the `bool`: it was an idle stop).
    pub fn exited(&self, exit: ExitRecord) -> (ExitRecord, bool) {
        match &self.stop {
            Some(_) if exit.state == State::Queued && self.cancel != Cancel::None => (
                ExitRecord {
                    state: State::Cancelled,
                    reason: Some(folders::CANCELLED.into()),
                    ..exit
                },
                false,
            ),
            Some(Stop {
                kind: StopKind::Preempt,
                reason,
                ..
            }) if exit.state == State::Queued => (
                ExitRecord {
                    reason: Some(reason.clone()),
                    ..exit
                },
                false,
            ),
            Some(Stop {
                kind: StopKind::Idle,
                reason,
                ..
            }) if exit.reason.as_deref() == Some(folders::IDLE) => (
                ExitRecord {
                    state: State::Failed,
                    reason: Some(reason.clone()),
                    ..exit
                },
                true,
            ),
            // An allocation released at its idle limit: its record says so already.
            Some(Stop {
                kind: StopKind::Idle,
                ..
            }) if self.held() && exit.state == State::Failed => (exit, true),
            _ => (exit, false),
        }
    }

    /// Its supervisor (or held process) is dead and wrote no exit record. `ended`: how this
    /// daemon's child ended, in words, when the wait on it said so.
    pub fn died(&self, ended: Option<String>, now_ms: u64) -> Death {
        if self.held() {
            let pid = self.supervisor.as_ref().map_or(0, |h| h.pid);
            return Death::Finish(match (self.cancel, &self.stop) {
                (Cancel::None, None) => held_ended(pid, now_ms),
                (Cancel::None, Some(stop)) => ended_record(State::Failed, &stop.reason, now_ms),
                _ => ended_record(State::Cancelled, folders::CANCELLED, now_ms),
            });
        }
        if self.supervisor.is_none()
            && let Some(words) = &ended
        {
            return Death::NeverStarted(format!("queued again: {words}; the job never started"));
        }
        let reason = match (ended, &self.supervisor) {
            (Some(words), _) => words,
            (None, Some(holder)) => format!(
                "its supervisor (pid {}) ended before it recorded how the job ended",
                holder.pid
            ),
            (None, None) => "its supervisor never started".to_string(),
        };
        Death::Vanished {
            // A job whose cancel was asked for is not queued again.
            requeue: self.requeue && self.cancel == Cancel::None,
            reason,
        }
    }

    /// A held lease's process gave it back: the record it ends with (None for a job that is not
    /// a held lease). Given back after a cancel or a stop the daemon decided (an allocation's
    /// idle or time limit, a preemption), it ends as when its process ends then.
    pub fn released(&self, now_ms: u64) -> Option<ExitRecord> {
        if !self.held() {
            return None;
        }
        Some(match (self.cancel, &self.stop) {
            (Cancel::None, None) => {
                ended(State::Succeeded, "released by its process".into(), now_ms)
            }
            (Cancel::None, Some(stop)) => ended_record(State::Failed, &stop.reason, now_ms),
            _ => ended_record(State::Cancelled, folders::CANCELLED, now_ms),
        })
    }
}

fn ended_record(state: State, reason: &str, at_ms: u64) -> ExitRecord {
    ended(state, reason.to_string(), at_ms)
}

#[cfg(test)]
mod tests;
