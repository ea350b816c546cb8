//! Recovery: after a crash or a restart, the engine finishes what ended meanwhile, adopts what
//! still runs, fences off and queues again what never started, and marks the rest lost (or
//! queues it again with `requeue`); a state folder restored from a backup is told by the jobs
//! that ran since.

use super::*;

impl Engine {
    /// After a crash or a restart: finish what ended meanwhile, adopt what still runs, fence off
    /// and queue again what never started, mark the rest lost (or queue it with `requeue`).
    pub fn recover(&mut self) -> Result<(), String> {
        crate::core::holders::sweep(self.shared.root);
        let running = self
            .shared
            .db
            .jobs(&[State::Running], u32::MAX)
            .map_err(|e| e.to_string())?;
        for row in running {
            self.recover_job(row);
        }
        let queued = self
            .shared
            .db
            .jobs(&[State::Queued], u32::MAX)
            .map_err(|e| e.to_string())?;
        // A database older than its folders (restored from a backup) may hold as queued a job
        // that ran since: its later folders say so.
        let folders = folders::job_folders(&self.shared.state_dir).unwrap_or_default();
        for row in queued {
            let later: Vec<u32> = folders
                .get(&row.id)
                .map(|a| a.iter().copied().filter(|&a| a > row.attempt).collect())
                .unwrap_or_default();
            if later.is_empty() || !self.ran_since_the_backup(&row, &later) {
                self.enqueue(row.id);
            }
        }
        Ok(())
    }

    /// A queued job with folders of later attempts (`later`, ascending) than its database knows:
    /// the database is older than those folders. A job that ran there is never started again:
    /// it ends as its newest exit record says, or `lost` when it ran and no record says how it
    /// ended (true: it is not queued). One fenced off without ever running is queued again,
    /// its next attempt numbered above every folder it has (false).
    fn ran_since_the_backup(&mut self, row: &JobRow, later: &[u32]) -> bool {
        let id = row.id;
        let newest = *later.last().unwrap_or(&row.attempt);
        let note = format!(
            "the job database is older than this job's folders (up to {}): it ran after the database's backup",
            self.shared.job_dir(id, newest).display()
        );
        let ended = later.iter().rev().find_map(|&attempt| {
            folders::read_exit(&self.shared.job_dir(id, attempt))
                .ok()
                .flatten()
                .filter(|exit| exit.state.is_final())
                .map(|exit| (attempt, exit))
        });
        let ran = later.iter().any(|&attempt| {
            folders::read_fence(&self.shared.job_dir(id, attempt))
                .ok()
                .flatten()
                .is_some_and(|fence| fence.supervisor.is_some())
        });
        let (change, measured) = match ended {
            Some((attempt, exit)) => {
                tracing::warn!("job {id}: {note}; recorded as it ended there");
                let reason = match exit.reason.filter(|r| !r.is_empty()) {
                    Some(reason) => format!("{reason}; {note}"),
                    None => note,
                };
                let change = Change {
                    state: Some(exit.state),
                    ended_at_ms: Some(exit.ended_at_ms),
                    exit_code: exit.exit_code,
                    attempt: Some(attempt),
                    reason: Update::Set(reason.clone()),
                    only_if: Some(State::Queued),
                    event: Some(Event {
                        at_ms: exit.ended_at_ms,
                        kind: "finished".into(),
                        message: format!("{}: {reason}", exit.state.as_str()),
                    }),
                    ..Change::default()
                };
                // What its supervisor recorded of that run; no device readings.
                let measured = Measured {
                    process: accounting::read_use(&self.shared.job_dir(id, attempt)),
                    ..Measured::default()
                };
                (change, measured)
            }
            None if ran => {
                let reason = format!("{note}, and how it ended is not recorded; not run again");
                tracing::warn!("job {id}: {reason}");
                let change = Change {
                    state: Some(State::Lost),
                    ended_at_ms: Some(now_ms()),
                    attempt: Some(newest),
                    reason: Update::Set(reason.clone()),
                    only_if: Some(State::Queued),
                    event: Some(Event::now("lost", reason)),
                    ..Change::default()
                };
                (change, Measured::default())
            }
            None => {
                // Never started in those folders: its next attempt gets a folder of its own.
                let change = Change {
                    attempt: Some(newest),
                    only_if: Some(State::Queued),
                    ..Change::default()
                };
                if let Err(e) = self
                    .shared
                    .db
                    .write_blocking(move |tx| crate::core::db::apply(tx, id, &change))
                {
                    tracing::error!("job {id}: {e}");
                    return true;
                }
                return false;
            }
        };
        self.end_restored(row, change, measured);
        true
    }

    /// Ends queued job `row` as `change` says, with its accounting record (built from its row
    /// in the same write, so that it is recorded only when the change applies), counted in the
    /// metrics once written. A write that fails is kept and made again (see `Jobs::write`),
    /// with the record built from `row`.
    fn end_restored(&mut self, row: &JobRow, change: Change, measured: Measured) {
        let id = row.id;
        let attempt = change.clone();
        let (send, answer) = mpsc::channel();
        let written = self.shared.db.write_blocking(move |tx| {
            let record = crate::core::db::end_queued(tx, id, attempt, &measured)?;
            let applied = i64::from(record.is_some());
            let _ = send.send(record);
            Ok(applied)
        });
        match written {
            Ok(_) => {
                if let Ok(Some(record)) = answer.try_recv() {
                    self.shared.metrics.job_finished(&record);
                }
            }
            Err(e) => {
                tracing::warn!("job {id}: {e}; its end is written again");
                let reason = match &change.reason {
                    Update::Set(reason) => Some(reason.clone()),
                    Update::Keep | Update::Clear => None,
                };
                let record = Record::of(
                    row,
                    change.state.unwrap_or(State::Lost),
                    change.ended_at_ms.unwrap_or_else(now_ms),
                    change.exit_code,
                    reason,
                    &Measured::default(),
                );
                let change = Change {
                    accounting: Some(Box::new(record)),
                    ..change
                };
                self.jobs.write(id, change);
            }
        }
    }

    /// Recovery of one job its database shows running (see [`Engine::recover`]).
    fn recover_job(&mut self, row: JobRow) {
        let id = row.id;
        let dir = self.shared.job_dir(id, row.attempt);
        let submission = self.shared.db.submission(id).ok().flatten().map(|(s, _)| s);
        let spec = submission.as_ref().and_then(|s| s.spec().ok());
        let (preemptible, exclusive) = spec.as_ref().map_or((false, true), |spec| {
            (
                spec.preemptible,
                crate::core::slices::takes_whole_gpus(spec),
            )
        });
        if let Some(gpus) = spec.as_ref().and_then(|spec| {
            crate::core::slices::gpu_equivalent(spec, &self.jobs.inventory.devices)
        }) {
            self.sched.set_compute(id as u64, gpus);
        }
        // An interactive allocation's limits run from its start, whatever restarts came between.
        let alloc = submission
            .as_ref()
            .and_then(|s| s.alloc.as_ref())
            .map(|alloc| {
                let tenant = self.shared.config.tenant(&row.tenant);
                let limit = spec
                    .as_ref()
                    .and_then(|spec| running::time_limit(spec, tenant));
                running::AllocLimits::new(alloc, limit, row.started_at_ms.unwrap_or_else(now_ms))
            });
        let held = submission.is_some_and(|s| s.holder.is_some());
        self.track_running(id, &row, preemptible, exclusive);
        // Counted up to the last record, or from the start when none was made.
        let charged_s = row
            .charged_ms
            .or(row.started_at_ms)
            .map_or_else(now_s, ms_to_s);
        if let Ok(Some(exit)) = folders::read_exit(&dir) {
            let prior = row.gpu_seconds;
            // It ended while no daemon watched: its accounting has what its supervisor recorded.
            let measured = Measured {
                process: accounting::read_use(&dir),
                ..Measured::default()
            };
            self.finish_at(id, &row.lease_id, exit, prior, measured);
            return;
        }
        // The daemon may have stopped before it even made the job's folder.
        let never_started = matches!(folders::read_fence(&dir), Ok(None))
            && std::fs::create_dir_all(&dir).is_ok()
            && folders::take_fence(&dir, &Fence { supervisor: None }).unwrap_or(false);
        let fence = folders::read_fence(&dir).ok().flatten();
        // A held lease lives while its process tree does; a supervisor is the process alone.
        let supervisor = fence.and_then(|f| f.supervisor).map(|h| {
            let dead = if held {
                h.liveness().is_dead()
            } else {
                h.process_liveness().is_dead()
            };
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
                if let Some(limits) = alloc.filter(|_| held) {
                    job.set_alloc(limits);
                }
                if row.cancel_requested {
                    job.cancel();
                }
                self.jobs.running.insert(id, job);
            }
            Recovery::HeldEnded(pid) => {
                // The process that held the lease ended while no daemon watched.
                let prior = row.gpu_seconds;
                self.finish_at(
                    id,
                    &row.lease_id,
                    running::held_ended(pid, now_ms()),
                    prior,
                    Measured::default(),
                );
            }
            Recovery::QueueAgain => {
                // It never ran: nothing to charge.
                let at = self
                    .sched
                    .running_job(id as u64)
                    .map_or(charged_s, |r| r.charged_s);
                self.untrack_running(id, at, row.gpu_seconds);
                tracing::info!("job {id}: never started before the daemon stopped; queued again");
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
                    Measured::default(),
                );
            }
        }
    }
}
