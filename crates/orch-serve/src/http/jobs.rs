//! Jobs over the API: submit (`POST /v1/jobs`), list, status, cancel, and their logs.

use crate::core::accounting::Measured;
use crate::core::admission::{self, Refusal};
use crate::core::caller::Caller;
use crate::core::db::{JobRow, State, Submission, Update};
use crate::core::kick::Kick;
use crate::core::state::Shared;
use crate::http::access::{admitted, find, names_array, read, tenant_for, visible_to};
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
    let id = accept(&shared, &caller, request, None, None).await?;
    Ok((
        StatusCode::CREATED,
        Json(SubmitResponse { id: id.to_string() }),
    ))
}

/// Checks a submission (the job file, the tenant and its limits), commits it to the queue and
/// wakes the engine; returns the job's id. `holder`: the process that holds the lease itself (a
/// lease taken from a Python program, `POST /v1/leases`): nothing is started for such a job.
/// `alloc`: that lease is an interactive allocation (`orch alloc`).
pub(crate) async fn accept(
    shared: &Arc<Shared>,
    caller: &Caller,
    request: SubmitRequest,
    holder: Option<orch_leases::Holder>,
    alloc: Option<crate::core::db::Alloc>,
) -> ApiResult<i64> {
    // A job the daemon cannot record is not accepted: 503 with the sentence, never a 201 for
    // a job that would then be lost.
    if let Some(refusal) = shared.health.refusal() {
        return Err(Refusal::Unavailable(refusal).into());
    }
    let spec = orch_core::job::parse(std::path::Path::new(&request.job_path), &request.job_text)
        .map_err(|e| err(StatusCode::BAD_REQUEST, e.to_string()))?;
    orch_runner::check_enforcement(&spec, shared.backend)
        .map_err(|e| err(StatusCode::BAD_REQUEST, e))?;
    if !spec.sweep.is_empty() {
        let each = request.job_text.len()
            + request.job_path.len()
            + request.cwd.len()
            + request
                .env
                .iter()
                .map(|(k, v)| k.len() + v.len() + 8)
                .sum::<usize>();
        admission::array_size(&request.job_path, spec.sweep.len() as u64, each as u64)?;
    }
    // A `[sweep]` is a job array: one job per combination, each checked as it will run.
    let tasks: Vec<orch_core::JobSpec> = if spec.sweep.is_empty() {
        vec![spec.clone()]
    } else {
        (0..spec.sweep.len())
            .map_while(|task| spec.sweep_task(task))
            .collect()
    };
    for (task, one) in tasks.iter().enumerate() {
        let sweep_task = (!spec.sweep.is_empty()).then_some(task);
        exec_parts(&request, one, sweep_task)?;
    }
    let gpus_at = spec.resources.gpus_at.to_string();
    let asked = admission::Asked {
        place: &request.job_path,
        gpus_at: &gpus_at,
        gpus: spec.resources.gpus,
        priority: spec.priority,
    };
    match spec.resources.mig.as_deref() {
        Some(profile) => {
            let inventory = orch_core::sync::lock(&shared.machine).inventory.clone();
            admission::slices(&asked, profile, &inventory.devices)?;
        }
        None => admission::devices(&asked, shared.visible_devices)?,
    }
    let tenant = tenant_for(
        shared,
        caller,
        spec.tenant.as_deref(),
        Some(&request.job_path),
    )?;
    if spec.resources.nodes > 1 {
        return Err(err(
            StatusCode::BAD_REQUEST,
            format!(
                "{}: nodes = {} is for Slurm: this daemon serves one machine; submit it with `orch submit --slurm`",
                request.job_path, spec.resources.nodes
            ),
        ));
    }
    if !spec.sweep.is_empty() && holder.is_some() {
        return Err(err(
            StatusCode::BAD_REQUEST,
            format!(
                "{}: a lease is one job, not a [sweep]: leave out [sweep], or submit the sweep with `orch submit`",
                request.job_path
            ),
        ));
    }
    let limits = shared.config.tenant(&tenant).cloned();
    if let Some(limits) = &limits {
        admission::priority(limits, &asked)?;
    }
    let row = JobRow {
        name: spec.name.clone(),
        tenant,
        user: caller.identity.name.clone(),
        uid: caller.identity.uid,
        gpus: spec.resources.gpus,
        priority: spec.priority,
        requeue: spec.requeue,
        ..JobRow::queued(now_ms())
    };
    let key = request.key.filter(|k| !k.is_empty() && k.len() <= 128);
    let policy_file = match &spec.policy.plugin {
        orch_core::PluginRef::Builtin(_) => None,
        orch_core::PluginRef::Path(path) => Some(
            crate::http::plugins::submitted(
                shared,
                &row.tenant,
                &spec.policy.plugin_at.to_string(),
                path,
                request.policy_wasm.as_deref(),
                request.policy_digest.as_deref(),
            )
            .await?,
        ),
    };
    let submission = Submission {
        job_text: request.job_text,
        job_path: request.job_path,
        cwd: request.cwd,
        env: request.env,
        identity: caller.identity.clone(),
        policy_file,
        holder,
        alloc,
        sweep_task: None,
    };
    // An array's tasks: the same submission, each naming its combination of the `[sweep]`.
    let array: Option<Vec<Submission>> = (!spec.sweep.is_empty()).then(|| {
        (0..tasks.len() as u32)
            .map(|task| Submission {
                sweep_task: Some(task),
                ..submission.clone()
            })
            .collect()
    });
    let max_parallel = spec.sweep.max_parallel;
    let tenant = row.tenant.clone();
    let depends = spec.depends.merged(&request.depends);
    let place = submission.job_path.clone();
    let asker = caller.clone();
    // The limit is checked in the same transaction as the insert: concurrent submissions
    // cannot overshoot it.
    let admitted = shared
        .db
        .write_value(move |tx| {
            // A submission sent again (its answer lost in a restart) is the job already taken.
            if let Some(id) = crate::core::db::job_with_key(tx, key.as_deref())? {
                return Ok(Ok(vec![id]));
            }
            if let Some(limits) = &limits {
                let queued = crate::core::db::queued_in(tx, &row.tenant)?;
                let fits = match &array {
                    None => admission::queue(limits, queued),
                    Some(tasks) => admission::array_queue(limits, queued, tasks.len() as u64),
                };
                if let Err(refusal) = fits {
                    return Ok(Err(refusal.into()));
                }
            }
            // Every job waited on exists now (so its id is below this job's) and is the
            // caller's to see; another tenant's is refused as an unknown one is.
            // A job array's id stands for every task of it, as with Slurm's `afterok:ARRAY`.
            let mut waits = orch_core::job::Dependencies {
                singleton: depends.singleton,
                ..Default::default()
            };
            for (kind, on) in depends.pairs() {
                let known = crate::core::db::job_in(tx, on)?;
                let Some(known) = known.filter(|r| visible_to(&asker, r)) else {
                    return Ok(Err(err(
                        StatusCode::NOT_FOUND,
                        format!(
                            "{place}: {kind} names job {on}, and there is no job {on} you may see (orch jobs --all lists yours)"
                        ),
                    )));
                };
                let tasks = match known.array {
                    Some(a) if a.id == on => crate::core::db::array_task_ids(tx, on)?,
                    _ => vec![on],
                };
                if kind == "after_failed" && tasks.len() > 1 {
                    return Ok(Err(err(
                        StatusCode::BAD_REQUEST,
                        format!(
                            "{place}: after_failed names job array {on}, whose tasks may end some one way and some the other; name the task to wait for ({on}[N] is shown with its job id by orch status), or use after_any"
                        ),
                    )));
                }
                let list = match kind {
                    "after_ok" => &mut waits.after_ok,
                    "after_any" => &mut waits.after_any,
                    _ => &mut waits.after_failed,
                };
                for id in tasks {
                    if !list.contains(&id) {
                        list.push(id);
                    }
                }
            }
            // An array's tasks each wait for what the array waits for.
            let ids = match &array {
                None => vec![crate::core::db::insert_job(tx, &row, &submission, key.as_deref())?],
                Some(tasks) => crate::core::db::insert_array(
                    tx,
                    &row,
                    tasks,
                    max_parallel,
                    key.as_deref(),
                )?,
            };
            for &id in &ids {
                crate::core::db::insert_dependencies(tx, id, &waits)?;
            }
            Ok(Ok(ids))
        })
        .await
        .map_err(|e| match e.fault() {
            Some(fault) => {
                shared.health.report(fault, e.to_string());
                let refusal = shared.health.refusal().unwrap_or_else(|| e.to_string());
                err(StatusCode::SERVICE_UNAVAILABLE, refusal)
            }
            None => internal(e),
        })?;
    let ids = admitted?;
    for &id in &ids {
        shared.metrics.submitted(&tenant);
        shared.kick(Kick::Submitted(id));
    }
    Ok(ids[0])
}

/// Checks the program, arguments and environment one job (or one task of an array,
/// `sweep_task`) will be started with against what `execve` takes.
fn exec_parts(
    request: &SubmitRequest,
    spec: &orch_core::JobSpec,
    sweep_task: Option<usize>,
) -> Result<(), Refusal> {
    let no_env = std::collections::BTreeMap::new();
    // A [train] job's trainer runs as `orch run --supervised [--sweep-task N] --resume JOB_PATH`,
    // the job's text in ORCH_JOB_TEXT (see supervisor.rs).
    let mut train_argv: Vec<String> = ["orch", "run", "--supervised"].map(String::from).into();
    if let Some(task) = sweep_task {
        train_argv.extend(["--sweep-task".to_string(), task.to_string()]);
    }
    train_argv.extend(["--resume".to_string(), request.job_path.clone()]);
    let (argv, job_env, extra): (&[String], _, Vec<(&str, &str)>) = match &spec.work {
        orch_core::job::Work::Command(c) => (&c.argv, &c.env, Vec::new()),
        orch_core::job::Work::Train(_) => (
            &train_argv,
            &no_env,
            vec![("ORCH_JOB_TEXT", request.job_text.as_str())],
        ),
    };
    admission::exec_parts(&admission::ExecParts {
        place: &request.job_path,
        argv,
        job_env,
        client_env: &request.env,
        cwd: &request.cwd,
        extra: &extra,
    })
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
