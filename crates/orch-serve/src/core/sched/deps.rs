//! Job dependencies (`after_ok`, `after_any`, `after_failed`) and `singleton`, as Slurm's
//! `--dependency`: a job that waits on another is held out of the queue, so a pass never looks
//! at it (it neither slows a pass nor blocks backfill, and its tenant's standing does not count
//! it), and goes into the queue once what it waits for is met. A dependency that can no longer
//! be met ends the job `cancelled`, and that cascades down a chain.
//!
//! Design decision: the index runs from each job waited on to the jobs that wait on it, so a
//! job's end touches only its own dependants: a chain of any length costs a pass nothing, and
//! an end costs what it releases.

use super::QueuedJob;
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// What a dependency asks of the job it names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// It succeeded.
    AfterOk,
    /// It ended, however.
    AfterAny,
    /// It ended without succeeding (failed, cancelled, lost).
    AfterFailed,
}

impl Kind {
    /// The key of `[job]` (and the flag's name with `-`).
    pub fn key(self) -> &'static str {
        match self {
            Kind::AfterOk => "after_ok",
            Kind::AfterAny => "after_any",
            Kind::AfterFailed => "after_failed",
        }
    }

    pub fn from_key(key: &str) -> Option<Kind> {
        Some(match key {
            "after_ok" => Kind::AfterOk,
            "after_any" => Kind::AfterAny,
            "after_failed" => Kind::AfterFailed,
            _ => return None,
        })
    }

    /// Whether an end (`ok`: it succeeded) meets it.
    fn met_by(self, ok: bool) -> bool {
        match self {
            Kind::AfterOk => ok,
            Kind::AfterAny => true,
            Kind::AfterFailed => !ok,
        }
    }
}

/// Where a job a dependency names stands now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Standing {
    /// Queued or running: not ended yet.
    Active,
    /// It ended; `ok` when it succeeded; `how` says how ("failed (exit 1)", "was cancelled").
    Ended { ok: bool, how: String },
}

/// What a queued job waits for before a pass may consider it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Wait {
    pub after: Vec<(Kind, u64)>,
    /// At most one running job of its group at a time.
    pub singleton: bool,
    /// Its user and name: the group `singleton` counts in (every job has one: a singleton waits
    /// for any running job of its group).
    pub group: String,
}

/// A job held out of the queue.
#[derive(Debug, Clone)]
struct Held {
    job: QueuedJob,
    /// The dependencies not met yet.
    pending: Vec<(Kind, u64)>,
    singleton: bool,
    group: String,
}

/// The held jobs and what they wait for.
#[derive(Debug, Default)]
pub(crate) struct Deps {
    held: BTreeMap<u64, Held>,
    /// For each job waited on, the held jobs waiting on it.
    dependants: HashMap<u64, Vec<u64>>,
    /// Each queued or running job's group (user and name).
    group_of: HashMap<u64, String>,
    /// Running jobs per group.
    running_in: HashMap<String, BTreeSet<u64>>,
    /// The singleton let into the queue for a group: it holds the group until it ends.
    claimed: HashMap<String, u64>,
    /// Held singletons whose dependencies are met, per group, waiting for it to be free.
    singles: HashMap<String, BTreeSet<u64>>,
}

/// What taking a job in came to.
pub(crate) enum Taken {
    /// Nothing to wait for: into the queue.
    Ready(QueuedJob),
    /// Held.
    Held,
    /// A dependency can never be met: the job ends cancelled with this reason.
    Never(String),
}

/// The reason of a job cancelled because job `on` ended `how` and `kind` needed otherwise.
fn never(kind: Kind, on: u64, how: &str) -> String {
    let needed = match kind {
        Kind::AfterOk => "",
        Kind::AfterFailed => " (after_failed needs it to end without succeeding)",
        Kind::AfterAny => "",
    };
    format!("dependency never satisfied: job {on} {how}{needed}")
}

impl Deps {
    pub(crate) fn held(&self) -> usize {
        self.held.len()
    }

    pub(crate) fn is_held(&self, id: u64) -> bool {
        self.held.contains_key(&id)
    }

    /// Notes job `id`'s group (a running job adopted after a restart was never taken in).
    pub(crate) fn note_group(&mut self, id: u64, group: String) {
        self.group_of.insert(id, group);
    }

    /// Takes job `job` in with what it waits for; `standing` says where each job named stands.
    pub(crate) fn take(
        &mut self,
        job: QueuedJob,
        wait: Wait,
        standing: &mut dyn FnMut(u64) -> Standing,
    ) -> Taken {
        let id = job.id;
        self.forget_held(id);
        self.group_of.insert(id, wait.group.clone());
        let mut pending = Vec::new();
        for (kind, on) in wait.after {
            if pending.contains(&(kind, on)) {
                continue;
            }
            match standing(on) {
                Standing::Active => pending.push((kind, on)),
                Standing::Ended { ok, how } => {
                    if !kind.met_by(ok) {
                        return Taken::Never(never(kind, on, &how));
                    }
                }
            }
        }
        let held = Held {
            job,
            pending,
            singleton: wait.singleton,
            group: wait.group,
        };
        if held.pending.is_empty() && (!held.singleton || self.group_free(&held.group, id)) {
            if held.singleton {
                self.claimed.insert(held.group.clone(), id);
            }
            return Taken::Ready(held.job);
        }
        for &(_, on) in &held.pending {
            self.dependants.entry(on).or_default().push(id);
        }
        if held.pending.is_empty() {
            self.singles
                .entry(held.group.clone())
                .or_default()
                .insert(id);
        }
        self.held.insert(id, held);
        Taken::Held
    }

    /// Whether singleton `id` may go into the queue: no other job of its group runs, and no
    /// other singleton of it went in before.
    fn group_free(&self, group: &str, id: u64) -> bool {
        self.running_in
            .get(group)
            .is_none_or(|r| r.iter().all(|&j| j == id))
            && self.claimed.get(group).is_none_or(|&j| j == id)
            && self
                .singles
                .get(group)
                .and_then(|s| s.first())
                .is_none_or(|&first| first >= id)
    }

    /// Takes a held job out (cancelled while held); true when it was held.
    pub(crate) fn forget_held(&mut self, id: u64) -> bool {
        let Some(held) = self.held.remove(&id) else {
            return false;
        };
        if let Some(s) = self.singles.get_mut(&held.group) {
            s.remove(&id);
            if s.is_empty() {
                self.singles.remove(&held.group);
            }
        }
        true
    }

    /// Job `id` started running.
    pub(crate) fn started(&mut self, id: u64) {
        if let Some(group) = self.group_of.get(&id) {
            self.running_in.entry(group.clone()).or_default().insert(id);
        }
    }

    /// Job `id` stopped running (it ended, or goes back to the queue); returns the singletons
    /// its group lets into the queue now.
    pub(crate) fn stopped(&mut self, id: u64) -> Vec<QueuedJob> {
        let Some(group) = self.group_of.get(&id).cloned() else {
            return Vec::new();
        };
        if let Some(r) = self.running_in.get_mut(&group) {
            r.remove(&id);
            if r.is_empty() {
                self.running_in.remove(&group);
            }
        }
        self.release_single(&group).into_iter().collect()
    }

    /// The first singleton waiting for `group`, when the group is free now.
    fn release_single(&mut self, group: &str) -> Option<QueuedJob> {
        let first = *self.singles.get(group)?.first()?;
        if !self.group_free(group, first) {
            return None;
        }
        let s = self.singles.get_mut(group)?;
        s.remove(&first);
        if s.is_empty() {
            self.singles.remove(group);
        }
        let held = self.held.remove(&first)?;
        self.claimed.insert(group.to_string(), first);
        Some(held.job)
    }

    /// Job `id` ended (`ok`: it succeeded; `how` says how). Returns the jobs that go into the
    /// queue now and those that end cancelled (with their reasons), down the chain: a job
    /// cancelled here ends for its own dependants in turn.
    pub(crate) fn ended(
        &mut self,
        id: u64,
        ok: bool,
        how: String,
    ) -> (Vec<QueuedJob>, Vec<(u64, String)>) {
        let mut ready = Vec::new();
        let mut cancelled = Vec::new();
        let mut ends = vec![(id, ok, how)];
        while let Some((id, ok, how)) = ends.pop() {
            self.forget_held(id);
            ready.extend(self.stopped(id));
            if let Some(group) = self.group_of.remove(&id)
                && self.claimed.get(&group) == Some(&id)
            {
                self.claimed.remove(&group);
                ready.extend(self.release_single(&group));
            }
            for dependant in self.dependants.remove(&id).unwrap_or_default() {
                let Some(held) = self.held.get_mut(&dependant) else {
                    continue;
                };
                let mut failed = None;
                held.pending.retain(|&(kind, on)| {
                    if on != id {
                        return true;
                    }
                    if !kind.met_by(ok) && failed.is_none() {
                        failed = Some(never(kind, on, &how));
                    }
                    false
                });
                if let Some(reason) = failed {
                    self.forget_held(dependant);
                    cancelled.push((dependant, reason));
                    ends.push((dependant, false, "was cancelled".into()));
                    continue;
                }
                if !held.pending.is_empty() {
                    continue;
                }
                if held.singleton {
                    let group = held.group.clone();
                    self.singles
                        .entry(group.clone())
                        .or_default()
                        .insert(dependant);
                    ready.extend(self.release_single(&group));
                } else if let Some(held) = self.held.remove(&dependant) {
                    ready.push(held.job);
                }
            }
        }
        // A job cancelled here goes nowhere, even if a group let it in meanwhile.
        ready.retain(|j| !cancelled.iter().any(|(c, _)| *c == j.id));
        (ready, cancelled)
    }

    /// Why each held job waits; `running` tells a running job from a queued one.
    pub(crate) fn reasons(&self, running: &dyn Fn(u64) -> bool) -> Vec<(u64, String)> {
        let word = |id: u64| if running(id) { "running" } else { "queued" };
        self.held
            .iter()
            .map(|(&id, held)| {
                let reason = if held.pending.is_empty() {
                    let by = self
                        .running_in
                        .get(&held.group)
                        .and_then(|r| r.iter().find(|&&j| j != id).copied())
                        .or_else(|| self.claimed.get(&held.group).copied())
                        .or_else(|| {
                            self.singles
                                .get(&held.group)
                                .and_then(|s| s.first().copied())
                                .filter(|&j| j != id)
                        });
                    match by {
                        Some(by) => format!(
                            "waiting for job {by} ({}): singleton, one job of this user and name runs at a time",
                            word(by)
                        ),
                        None => "waiting: singleton, one job of this user and name runs at a time"
                            .to_string(),
                    }
                } else {
                    let on: Vec<String> = held
                        .pending
                        .iter()
                        .map(|&(_, on)| format!("job {on} ({})", word(on)))
                        .collect();
                    format!("waiting for {}", on.join(", "))
                };
                (id, reason)
            })
            .collect()
    }
}
