//! Jobs over the API: submit (`POST /v1/jobs`), list, status, cancel, and their logs.

use crate::core::accounting::Measured;
use crate::core::caller::Caller;
use crate::core::db::{State, Update};
use crate::core::kick::Kick;
use crate::core::state::Shared;
use crate::core::submit;
use crate::http::access::{admitted, find, names_array, read, visible_to};
use crate::http::error::{ApiResult, err, internal};
use crate::http::wire::{Accounting, ArraySummary, Job, SubmitRequest, SubmitResponse};
use axum::Json;
use axum::extract::{Extension, Path, Query, State as AxState};
use axum::http::StatusCode;
use axum::response::Response;
use orch_core::sync::lock;
use orch_core::time::now_ms;
use serde::Deserialize;
use std::sync::Arc;

pub(crate) async fn submit(
    AxState(shared): AxState<Arc<Shared>>,
    Extension(caller): Extension<Caller>,
    body: axum::body::Bytes,
) -> ApiResult<(StatusCode, Json<SubmitResponse>)> {
    admitted(&caller)?;
    if caller.remote {
        return Err(err(
            StatusCode::FORBIDDEN,
            "jobs are submitted over the daemon's Unix socket, where it knows which Unix user to run them as; use `orch submit` on the machine",
        ));
    }
    let request: SubmitRequest =
        crate::http::wire::parse_body(&body, "a job submission", crate::http::wire::SUBMIT_FIELDS)
            .map_err(|why| err(StatusCode::BAD_REQUEST, why))?;
    let accepted = submit::submit(&shared, &caller, submission(request, None, None)).await?;
    Ok((
        StatusCode::CREATED,
        Json(SubmitResponse {
            id: accepted.id.to_string(),
        }),
    ))
}

/// A request's body as [`submit::submit`] takes it. `holder`: the process that holds the lease
/// itself (a lease taken from a Python program, `POST /v1/leases`): nothing is started for such
/// a job. `alloc`: that lease is an interactive allocation (`orch alloc`).
pub(crate) fn submission(
    request: SubmitRequest,
    holder: Option<orch_leases::Holder>,
    alloc: Option<crate::core::db::Alloc>,
) -> submit::Request {
    submit::Request {
        job_text: request.job_text,
        job_path: request.job_path,
        cwd: request.cwd,
        env: request.env,
        key: request.key,
        policy_wasm: request.policy_wasm,
        policy_digest: request.policy_digest,
        depends: request.depends,
        holder,
        alloc,
    }
}

#[derive(Debug, Deserialize)]
pub(crate) struct ListQuery {
    #[serde(default)]
    all: bool,
    /// Each job's events too.
    #[serde(default)]
    events: bool,
    /// At most this many of the newest jobs.
    #[serde(default)]
    limit: Option<u32>,
    /// Every queued and running job, and this many of the newest that ended (the web page).
    #[serde(default)]
    recent: Option<usize>,
}

/// Most jobs one listing returns.
const LIST_LIMIT: u32 = 10_000;
/// Most jobs of one listing whose events come with it.
const EVENTS_LIMIT: usize = 500;

pub(crate) async fn list(
    AxState(shared): AxState<Arc<Shared>>,
    Extension(caller): Extension<Caller>,
    Query(q): Query<ListQuery>,
) -> ApiResult<Json<Vec<Job>>> {
    admitted(&caller)?;
    let states: &'static [State] = if q.all {
        &[]
    } else {
        &[State::Queued, State::Running]
    };
    let limit = q.limit.unwrap_or(LIST_LIMIT).min(LIST_LIMIT);
    let recent = q.recent;
    let rows = read(&shared, move |db| match recent {
        // Every active job, however many newer ones ended, and the newest that ended.
        Some(_) => {
            let mut rows = db.jobs(&[State::Queued, State::Running], u32::MAX)?;
            rows.extend(db.jobs(
                &[
                    State::Succeeded,
                    State::Failed,
                    State::Cancelled,
                    State::Lost,
                ],
                LIST_LIMIT,
            )?);
            rows.sort_by_key(|r| r.id);
            Ok(rows)
        }
        None => db.jobs(states, LIST_LIMIT),
    })
    .await?;
    let reasons = lock(&shared.reasons).clone();
    let mut rows: Vec<Job> = rows
        .into_iter()
        .filter(|r| visible_to(&caller, r))
        .map(|r| with_reason(Job::from(r), &reasons))
        .collect();
    if let Some(recent) = q.recent {
        let ended = rows.iter().filter(|r| r.state.is_final()).count();
        let mut skip = ended.saturating_sub(recent);
        rows.retain(|r| {
            if r.state.is_final() && skip > 0 {
                skip -= 1;
                return false;
            }
            true
        });
    }
    if rows.len() > limit as usize {
        rows.drain(..rows.len() - limit as usize);
    }
    rows = with_accounting(&shared, rows).await?;
    if q.events {
        rows = read(&shared, move |db| {
            // Events for the newest jobs only: one listing must not hold the database for long.
            let skip = rows.len().saturating_sub(EVENTS_LIMIT);
            for row in rows.iter_mut().skip(skip) {
                row.events = db.events(row.id)?;
            }
            Ok(rows)
        })
        .await?;
    }
    Ok(Json(rows))
}

/// The ended jobs among `rows` with their accounting records (one read over their ids' range).
async fn with_accounting(shared: &Arc<Shared>, mut rows: Vec<Job>) -> ApiResult<Vec<Job>> {
    let ended: Vec<i64> = rows
        .iter()
        .filter(|r| r.state.is_final())
        .map(|r| r.id)
        .collect();
    if ended.is_empty() {
        return Ok(rows);
    }
    let records = read(shared, move |db| db.accounting_of(&ended)).await?;
    let by_id: std::collections::HashMap<i64, &crate::core::accounting::Record> =
        records.iter().map(|r| (r.job_id, r)).collect();
    for row in &mut rows {
        if row.state.is_final()
            && let Some(record) = by_id.get(&row.id)
        {
            row.accounting = Some(Accounting::from(*record));
            row.signal = record.signal;
        }
    }
    Ok(rows)
}

/// A queued job says why it waits, as the last scheduling pass found.
fn with_reason(mut row: Job, reasons: &std::collections::HashMap<i64, String>) -> Job {
    if row.state == State::Queued
        && let Some(why) = reasons.get(&row.id)
    {
        row.reason = Some(why.clone());
    }
    row
}

pub(crate) async fn status(
    AxState(shared): AxState<Arc<Shared>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> ApiResult<Json<Job>> {
    let (n, row) = find(&shared, &caller, &id).await?;
    let whole = names_array(&id, &row);
    let mut row = Job::from(row);
    row.events = read(&shared, move |db| db.events(n)).await?;
    // An array's id names the whole array: its first task, with every task's state.
    if whole {
        let tasks = read(&shared, move |db| db.array_tasks(n)).await?;
        row.array = Some(ArraySummary::of(&tasks));
    }
    let row = with_accounting(&shared, vec![row])
        .await?
        .pop()
        .ok_or_else(|| internal("a job went missing while its accounting was read"))?;
    let reasons = lock(&shared.reasons).clone();
    Ok(Json(with_reason(row, &reasons)))
}

/// Cancels what is left of job array `array` (`POST /v1/jobs/ARRAY/cancel`): its queued tasks
/// at once, its running ones stopped. Answers the array's first task with the array's summary
/// after the change: 200 when nothing was running, 202 when tasks are being stopped.
async fn cancel_array(
    shared: &Arc<Shared>,
    caller: &Caller,
    array: i64,
) -> ApiResult<(StatusCode, Json<Job>)> {
    let tasks = read(shared, move |db| db.array_tasks(array)).await?;
    let before = ArraySummary::of(&tasks);
    if before.ended() {
        return Err(err(
            StatusCode::CONFLICT,
            format!(
                "job array {array} has already ended ({} of {} task(s) succeeded)",
                before.succeeded, before.tasks
            ),
        ));
    }
    let queued: Vec<i64> = tasks
        .iter()
        .filter(|t| t.state == State::Queued)
        .map(|t| t.id)
        .collect();
    let mut running: Vec<i64> = tasks
        .iter()
        .filter(|t| t.state == State::Running)
        .map(|t| t.id)
        .collect();
    let who = &caller.identity.name;
    // The queued tasks in one transaction: none of them starts after the cancel is answered.
    let cancelled = cancel_queued(shared, queued.clone(), who, array).await?;
    // Those that started meanwhile are stopped with the running ones.
    running.extend(queued.into_iter().filter(|id| !cancelled.contains(id)));
    for &id in &running {
        request_stop(shared, id, caller).await?;
    }
    // A running task preempted back to the queue between the read and its stop request is
    // queued again: it is cancelled as a queued one.
    let stopped = running.clone();
    let requeued: Vec<i64> = read(shared, move |db| db.array_tasks(array))
        .await?
        .into_iter()
        .filter(|t| t.state == State::Queued && stopped.contains(&t.id))
        .map(|t| t.id)
        .collect();
    if !requeued.is_empty() {
        cancel_queued(shared, requeued, who, array).await?;
    }
    let (head, tasks) = read(shared, move |db| {
        Ok((db.job(array)?, db.array_tasks(array)?))
    })
    .await?;
    let mut job = Job::from(head.ok_or_else(|| {
        err(
            StatusCode::NOT_FOUND,
            format!("no job {array} (orch jobs --all lists yours)"),
        )
    })?);
    job.array = Some(ArraySummary::of(&tasks));
    let status = if running.is_empty() {
        StatusCode::OK
    } else {
        StatusCode::ACCEPTED
    };
    Ok((status, Json(job)))
}

pub(crate) async fn cancel(
    AxState(shared): AxState<Arc<Shared>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> ApiResult<(StatusCode, Json<Job>)> {
    let (n, row) = find(&shared, &caller, &id).await?;
    if names_array(&id, &row) {
        return cancel_array(&shared, &caller, n).await;
    }
    match row.state {
        State::Queued => {
            let change = crate::core::db::Change {
                state: Some(State::Cancelled),
                ended_at_ms: Some(now_ms()),
                reason: Update::Set(format!("cancelled by {}", caller.identity.name)),
                only_if: Some(State::Queued),
                event: Some(crate::core::db::Event::now(
                    "finished",
                    format!("cancelled by {} while queued", caller.identity.name),
                )),
                ..Default::default()
            };
            let ended = shared
                .db
                .write_value(move |tx| {
                    crate::core::db::end_queued(tx, n, change, &Measured::default())
                })
                .await
                .map_err(internal)?;
            if let Some(record) = ended {
                shared.metrics.job_finished(&record);
                shared.kick(Kick::Dequeued(n));
                let row = read(&shared, move |db| db.job(n)).await?.unwrap_or(row);
                return Ok((StatusCode::OK, Json(row.into())));
            }
            // It started meanwhile: stop it.
            request_stop(&shared, n, &caller).await?;
            Ok((StatusCode::ACCEPTED, Json(row.into())))
        }
        State::Running => {
            request_stop(&shared, n, &caller).await?;
            Ok((StatusCode::ACCEPTED, Json(row.into())))
        }
        other => Err(err(
            StatusCode::CONFLICT,
            format!("job {id} has already ended ({})", other.as_str()),
        )),
    }
}

/// Cancels those of `ids` (tasks of job array `array`) that are still queued, in one
/// transaction, on `who`'s request; returns them.
async fn cancel_queued(
    shared: &Arc<Shared>,
    ids: Vec<i64>,
    who: &str,
    array: i64,
) -> ApiResult<Vec<i64>> {
    let who = who.to_string();
    let cancelled = shared
        .db
        .write_value(move |tx| {
            let mut cancelled = Vec::new();
            for id in ids {
                let change = crate::core::db::Change {
                    state: Some(State::Cancelled),
                    ended_at_ms: Some(now_ms()),
                    reason: Update::Set(format!("cancelled by {who} (its array {array})")),
                    only_if: Some(State::Queued),
                    event: Some(crate::core::db::Event::now(
                        "finished",
                        format!("cancelled by {who} while queued, with its array {array}"),
                    )),
                    ..Default::default()
                };
                if let Some(record) =
                    crate::core::db::end_queued(tx, id, change, &Measured::default())?
                {
                    cancelled.push(record);
                }
            }
            Ok(cancelled)
        })
        .await
        .map_err(internal)?;
    let mut ids = Vec::with_capacity(cancelled.len());
    for record in &cancelled {
        shared.metrics.job_finished(record);
        shared.kick(Kick::Dequeued(record.job_id));
        ids.push(record.job_id);
    }
    Ok(ids)
}

/// Commits the cancel of a running job before it is carried out, so that a daemon restarted in
/// between still carries it out.
async fn request_stop(shared: &Arc<Shared>, n: i64, caller: &Caller) -> ApiResult<()> {
    let change = crate::core::db::Change {
        cancel_requested: Some(true),
        only_if: Some(State::Running),
        event: Some(crate::core::db::Event::now(
            "stopping",
            format!("cancel asked by {}", caller.identity.name),
        )),
        ..Default::default()
    };
    shared
        .db
        .write(move |tx| crate::core::db::apply(tx, n, &change))
        .await
        .map_err(internal)?;
    shared.kick(Kick::Cancel(n));
    Ok(())
}

#[derive(Debug, Deserialize)]
pub(crate) struct LogsQuery {
    #[serde(default)]
    follow: bool,
    #[serde(default)]
    stream: Option<String>,
}

pub(crate) async fn logs(
    AxState(shared): AxState<Arc<Shared>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    Query(q): Query<LogsQuery>,
) -> ApiResult<Response> {
    let (n, row) = find(&shared, &caller, &id).await?;
    let name = match q.stream.as_deref() {
        None | Some("stdout") => "stdout",
        Some("stderr") => "stderr",
        Some(other) => {
            return Err(err(
                StatusCode::BAD_REQUEST,
                format!("stream={other}: give stdout or stderr"),
            ));
        }
    };
    let file = shared.job_dir(n, row.attempt.max(1)).join(name);
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Vec<u8>, std::io::Error>>(8);
    let follow = q.follow;
    tokio::spawn(crate::http::logs::pump(shared.clone(), n, file, follow, tx));
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    });
    Response::builder()
        .header("content-type", "text/plain; charset=utf-8")
        .body(axum::body::Body::from_stream(stream))
        .map_err(internal)
}
