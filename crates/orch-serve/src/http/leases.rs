//! Leases held by the client's own process (`POST /v1/leases`): a Python program or notebook
//! that calls `orch.lease()` while a daemon runs. Such a lease is a job like any other in the
//! queue (the tenant's limits, fair share and backfill apply; `orch jobs` shows it), except that
//! nothing is started for it: its holder is the calling process, known from the socket's peer
//! credentials, and it ends when that process releases it or dies.

use crate::core::caller::Caller;
use crate::core::db::{Change, Event, JobRow, State, Update};
use crate::core::folders;
use crate::core::kick::Kick;
use crate::core::state::Shared;
use crate::core::submit;
use crate::http::access::{admitted, find, read};
use crate::http::error::{ApiError, ApiResult, err};
use crate::http::jobs::submission;
use crate::http::wire::{LeaseRequest, LeaseView};
use axum::Json;
use axum::extract::{Extension, Path, State as AxState};
use axum::http::StatusCode;
use orch_core::sync::lock;
use orch_core::time::now_ms;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a request waits for the engine's first verdict on a new lease.
const VERDICT_PATIENCE: Duration = Duration::from_secs(20);

/// `POST /v1/leases`: queue the lease, wait for the first pass that looks at it; placed: 201
/// with the lease; no fit: 409 with the reason (it leaves the queue), or with `wait`, 202 and
/// its place in the queue.
pub async fn take(
    AxState(shared): AxState<Arc<Shared>>,
    Extension(caller): Extension<Caller>,
    body: axum::body::Bytes,
) -> ApiResult<(StatusCode, Json<LeaseView>)> {
    admitted(&caller)?;
    if caller.remote {
        return Err(err(
            StatusCode::FORBIDDEN,
            "leases are taken over the daemon's Unix socket, where it knows the process that holds them",
        ));
    }
    let request: LeaseRequest =
        crate::http::wire::parse_body(&body, "a lease request", crate::http::wire::LEASE_FIELDS)
            .map_err(|why| err(StatusCode::BAD_REQUEST, why))?;
    let holder = caller
        .pid
        .and_then(orch_leases::Holder::of_pid)
        .ok_or_else(|| {
            err(
                StatusCode::BAD_REQUEST,
                "the daemon cannot tell which process asks (no peer credentials with a live pid)",
            )
        })?;
    // The daemon moves the holder into a cgroup when it places the lease: the kernel's first
    // cgroup move after a quiet spell waits for an RCU grace period, which starts now, while
    // the lease is committed and placed.
    if shared.root {
        orch_exec::prime_cgroup_migration();
    }
    let alloc = request.alloc.as_ref().map(alloc_of).transpose()?;
    let submission = submission(request.submission, Some(holder), alloc);
    let id = submit::submit(&shared, &caller, submission).await?.id;
    let deadline = Instant::now() + VERDICT_PATIENCE;
    let mut delay = Duration::from_millis(2);
    loop {
        let row = read(&shared, move |db| db.job(id)).await?;
        let Some(row) = row else {
            return Err(err(
                StatusCode::NOT_FOUND,
                format!("lease job {id} vanished"),
            ));
        };
        match row.state {
            State::Running => return Ok((StatusCode::CREATED, Json(view(&shared, row)))),
            State::Queued => {}
            State::Failed => {
                return Err(err(
                    StatusCode::BAD_REQUEST,
                    row.reason.unwrap_or_else(|| "the lease failed".into()),
                ));
            }
            _ => {
                return Err(err(
                    StatusCode::CONFLICT,
                    row.reason.unwrap_or_else(|| "the lease ended".into()),
                ));
            }
        }
        // A job whose policy compiles or is being asked has no verdict yet: without `wait`, it is
        // waited for.
        let why = lock(&shared.reasons)
            .get(&id)
            .cloned()
            .filter(|_| request.wait || !shared.policies.undecided(id));
        if let Some(why) = why {
            if request.wait {
                let mut row = row;
                row.reason = Some(why);
                return Ok((StatusCode::ACCEPTED, Json(view(&shared, row))));
            }
            if leave_queue(&shared, id, format!("no fit: {why}")).await? {
                return Err(err(
                    StatusCode::CONFLICT,
                    format!("{why} (pass wait=True to wait for a fit)"),
                ));
            }
            continue; // it started meanwhile
        }
        if Instant::now() > deadline {
            // Its policy is still held back (its tenant's policy_cpu, a long policy_concurrency
            // queue, a compile): the caller hears that, not a vague timeout.
            let pending = shared
                .policies
                .pending(id)
                .or_else(|| lock(&shared.reasons).get(&id).cloned());
            if let Some(why) = pending {
                let took = VERDICT_PATIENCE.as_secs();
                let why = why.strip_prefix("waiting: ").unwrap_or(&why);
                let why = format!("lease job {id} is still waiting after {took}s: {why}");
                if leave_queue(&shared, id, why.clone()).await? {
                    return Err(err(
                        StatusCode::SERVICE_UNAVAILABLE,
                        format!("{why} (pass wait=True to wait for a fit)"),
                    ));
                }
                continue; // it started meanwhile
            }
            if !leave_queue(&shared, id, "the daemon gave no verdict in time".into()).await? {
                continue;
            }
            return Err(err(
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "the daemon did not place lease job {id} within {}s; try again",
                    VERDICT_PATIENCE.as_secs()
                ),
            ));
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_millis(50));
    }
}

/// An allocation's request as the daemon keeps it; an idle limit that is no positive number of
/// seconds is refused.
fn alloc_of(request: &crate::http::wire::AllocRequest) -> ApiResult<crate::core::db::Alloc> {
    let idle_ms = match request.idle_s {
        None => None,
        Some(s) if s.is_finite() && s > 0.0 && s < 1e12 => Some((s * 1000.0).ceil() as u64),
        Some(s) => {
            return Err(err(
                StatusCode::BAD_REQUEST,
                format!("alloc.idle_s is {s}: give a positive number of seconds, such as 1800"),
            ));
        }
    };
    Ok(crate::core::db::Alloc { idle_ms })
}

/// Cancels a queued lease job; false when it is no longer queued.
async fn leave_queue(shared: &Arc<Shared>, id: i64, reason: String) -> ApiResult<bool> {
    let change = Change {
        state: Some(State::Cancelled),
        ended_at_ms: Some(now_ms()),
        event: Some(Event::now("finished", reason.clone())),
        reason: Update::Set(reason),
        only_if: Some(State::Queued),
        ..Default::default()
    };
    let ended = shared
        .db
        .write_value(move |tx| {
            crate::core::db::end_queued(
                tx,
                id,
                change,
                &crate::core::accounting::Measured::default(),
            )
        })
        .await
        .map_err(|e| err(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    let Some(record) = ended else {
        return Ok(false);
    };
    shared.metrics.job_finished(&record);
    shared.kick(Kick::Dequeued(id));
    Ok(true)
}

/// `GET /v1/leases`: every lease on the machine's devices now (what `orch leases` lists):
/// another tenant's shows its devices and age, not its job's name or its processes, unless the
/// caller is an admin.
pub async fn list(
    AxState(shared): AxState<Arc<Shared>>,
    Extension(caller): Extension<Caller>,
) -> ApiResult<Json<Vec<orch_leases::Lease>>> {
    admitted(&caller)?;
    let running = read(&shared, |db| db.jobs(&[State::Running], u32::MAX)).await?;
    let leases = lock(&shared.machine).leases.clone();
    let job_of = |lease: &orch_leases::Lease| {
        running
            .iter()
            .find(|j| j.lease_id.as_deref() == Some(lease.id.as_str()))
    };
    Ok(Json(
        leases
            .iter()
            .map(|lease| match job_of(lease) {
                // A daemon job's lease is named after its number: its own tenant reads its name.
                Some(job) if caller.admin || caller.tenants.contains(&job.tenant) => {
                    orch_leases::Lease {
                        job_name: job.name.clone(),
                        ..lease.clone()
                    }
                }
                None if caller.admin => lease.clone(),
                _ => hidden(lease),
            })
            .collect(),
    ))
}

/// Another tenant's lease as a caller who may not see its job reads it: its devices and age;
/// not its job's name, its processes, nor its id (which may hold the name: a lease made before
/// leases were named after job numbers, or by `orch run`), shown as an opaque `lease-XXXXXXXX`
/// made of the id's unique suffix alone.
fn hidden(lease: &orch_leases::Lease) -> orch_leases::Lease {
    orch_leases::Lease {
        id: opaque_id(&lease.id),
        job_name: crate::core::view::HIDDEN.into(),
        holders: Vec::new(),
        ..lease.clone()
    }
}

/// `NAME-XXXXXXXX` as `lease-XXXXXXXX`: the same lease reads the same each time, and nothing of
/// the name is left.
pub fn opaque_id(id: &str) -> String {
    let suffix = id
        .rsplit_once('-')
        .map_or("", |(_, s)| s)
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .take(16)
        .collect::<String>();
    if suffix.is_empty() {
        "lease-hidden".to_string()
    } else {
        format!("lease-{suffix}")
    }
}

/// `GET /v1/leases/ID`: the lease job's state, and its devices once placed.
pub async fn show(
    AxState(shared): AxState<Arc<Shared>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> ApiResult<Json<LeaseView>> {
    let (n, mut row) = find(&shared, &caller, &id).await?;
    if row.state == State::Queued
        && let Some(why) = lock(&shared.reasons).get(&n)
    {
        row.reason = Some(why.clone());
    }
    Ok(Json(view(&shared, row)))
}

/// `POST /v1/leases/ID/release`: a queued lease leaves the queue; a running one ends
/// (`succeeded`, "released") and its devices are free when the answer comes. Releasing twice is
/// harmless. Only leases held by a process (not submitted jobs) are released this way.
pub async fn release(
    AxState(shared): AxState<Arc<Shared>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> ApiResult<Json<LeaseView>> {
    let (n, row) = find(&shared, &caller, &id).await?;
    let held = read(&shared, move |db| db.submission(n))
        .await?
        .is_some_and(|(s, _)| s.holder.is_some());
    if !held {
        return Err(err(
            StatusCode::CONFLICT,
            format!(
                "job {id} is a submitted job, not a held lease: stop it with `orch cancel {id}`"
            ),
        ));
    }
    if row.state == State::Queued
        && leave_queue(
            &shared,
            n,
            format!("released by {} while queued", caller.identity.name),
        )
        .await?
    {
        let row = read(&shared, move |db| db.job(n)).await?.unwrap_or(row);
        return Ok(Json(view(&shared, row)));
    }
    shared.kick(Kick::Release(n));
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let row = read(&shared, move |db| db.job(n)).await?;
        match row {
            Some(row) if row.state.is_final() => return Ok(Json(view(&shared, row))),
            Some(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            _ => {
                return Err(ApiError(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("lease job {id} was not released within 10s; try again"),
                ));
            }
        }
    }
}

fn view(shared: &Shared, row: JobRow) -> LeaseView {
    let placed = folders::read_placed(&shared.job_dir(row.id, row.attempt.max(1)));
    let running = row.state == State::Running;
    let place = (row.state == State::Queued)
        .then(|| lock(&shared.places).get(&row.id).copied())
        .flatten();
    LeaseView {
        job_id: row.id.to_string(),
        state: row.state,
        lease_id: row.lease_id,
        devices: if running { placed.devices } else { Vec::new() },
        policy: (!placed.policy.is_empty()).then_some(placed.policy),
        reason: if running {
            Some(placed.reason)
        } else {
            row.reason
        },
        rejected: placed.rejected,
        env: if running {
            placed.env
        } else {
            Default::default()
        },
        exclusive: placed.exclusive,
        inventory: shared.devices.clone(),
        place: place.map(|p| p.0),
        waiting: place.map(|p| p.1),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_opaque_id_keeps_nothing_of_the_name() {
        assert_eq!(
            super::opaque_id("acquisition-of-initech-model-c1af7569"),
            "lease-c1af7569"
        );
        assert_eq!(super::opaque_id("job-12-0a1b2c3d"), "lease-0a1b2c3d");
        assert_eq!(super::opaque_id("secret"), "lease-hidden");
    }
}
