//! HTTP + JSON under `/v1`, as docs/SERVE.md describes it. Errors are `{"error": "one sentence"}` with
//! the status that fits (400 bad job file, 403, 404, 409 wrong state, 429 over a queue limit).

use crate::admission::{self, Refusal};
use crate::db::{JobRow, State, Submission};
use crate::engine::{Kick, Shared};
use crate::users::Identity;
use axum::extract::{Extension, Path, Query, State as AxState};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use orch_core::sync::lock;
use orch_core::time::now_ms;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// The body of `POST /v1/jobs`: the job file's text and where it was, the client's working
/// folder and environment (as `sbatch` passes them by default).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SubmitRequest {
    pub job_text: String,
    /// The job file's absolute path (relative paths in it resolve against its folder); for a
    /// quick-form job, a file name in the working folder.
    pub job_path: String,
    pub cwd: String,
    #[serde(default)]
    pub env: Vec<(String, String)>,
    /// A key unique to this submission, chosen by the client: sent again (after a daemon
    /// restart lost the answer), it returns the job already accepted instead of a second one.
    #[serde(default)]
    pub key: Option<String>,
    /// When the job's `[policy] plugin` is a file: its bytes (base64), as the submitting user
    /// read them. The daemon never opens a user's path itself: it could name a file only root may
    /// read, or a FIFO that never ends.
    #[serde(default)]
    pub policy_wasm: Option<String>,
    /// When the job's `[policy] plugin` is a file: its digest (`sha256:HEX`), uploaded before
    /// with `PUT /v1/plugins/sha256:HEX`, instead of `policy_wasm`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy_digest: Option<String>,
}

/// Largest policy component a submission may carry.
pub const POLICY_LIMIT: usize = 16 << 20;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SubmitResponse {
    pub id: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: String,
}

/// A tenant as `GET /v1/tenants` (and `orch usage`) shows it: the columns of Slurm's `sshare`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TenantRow {
    pub name: String,
    /// The configured weight.
    pub share: f64,
    /// Its fraction of every tenant's shares: what fair share aims at.
    #[serde(default)]
    pub normalized_share: f64,
    /// Decayed usage, GPU-seconds (half-life `usage_half_life`).
    #[serde(default)]
    pub usage_gpu_seconds: f64,
    /// Its fraction of every tenant's decayed usage.
    #[serde(default)]
    pub normalized_usage: f64,
    /// `2^(-normalized_usage / normalized_share)`: 1 unused, 0.5 at its share, towards 0 beyond.
    #[serde(default)]
    pub fair_share: f64,
    pub max_gpus: Option<u32>,
    pub max_queued: Option<u32>,
    #[serde(default)]
    pub max_priority: Option<i64>,
    #[serde(default)]
    pub max_runtime_s: Option<f64>,
    pub gpus_held: u32,
    pub jobs_queued: u32,
    pub jobs_running: u32,
}

/// Who is asking, from the socket's peer credentials.
#[derive(Debug, Clone)]
pub struct Caller {
    pub identity: Identity,
    pub tenants: Vec<String>,
    pub admin: bool,
    /// Set when this daemon does not serve the caller at all: the sentence to answer with.
    pub refused: Option<String>,
    /// Came over the TCP listener (a token or a browser session), not the Unix socket.
    pub remote: bool,
    /// Over TCP with neither a valid token nor a session: 401.
    pub unauthenticated: bool,
    /// The process on the other end of the Unix socket (its peer credentials), when known.
    pub pid: Option<u32>,
}

#[derive(Debug)]
pub struct ApiError(pub StatusCode, pub String);

/// A refused admission answers with the status that says why.
impl From<Refusal> for ApiError {
    fn from(refusal: Refusal) -> ApiError {
        let status = match &refusal {
            Refusal::Invalid(_) => StatusCode::BAD_REQUEST,
            Refusal::Forbidden(_) => StatusCode::FORBIDDEN,
            Refusal::OverLimit(_) => StatusCode::TOO_MANY_REQUESTS,
            Refusal::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
        };
        ApiError(status, refusal.to_string())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.0, Json(ErrorBody { error: self.1 })).into_response()
    }
}

pub(crate) type ApiResult<T> = Result<T, ApiError>;

pub(crate) fn err(status: StatusCode, message: impl Into<String>) -> ApiError {
    ApiError(status, message.into())
}

pub(crate) fn internal(e: impl std::fmt::Display) -> ApiError {
    tracing::error!("{e}");
    err(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())
}

/// Largest request body accepted (a job file, an environment and a policy component in base64).
pub const BODY_LIMIT: usize = POLICY_LIMIT / 3 * 4 + (4 << 20);

pub fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/v1/jobs", post(submit).get(list))
        .route("/v1/jobs/{id}", get(status))
        .route("/v1/jobs/{id}/cancel", post(cancel))
        .route("/v1/jobs/{id}/logs", get(logs))
        .route(
            "/v1/plugins/{digest}",
            get(crate::compile::show).put(crate::compile::upload),
        )
        .route("/v1/leases", post(crate::leases::take))
        .route("/v1/leases/{id}", get(crate::leases::show))
        .route("/v1/leases/{id}/release", post(crate::leases::release))
        .route("/v1/devices", get(devices))
        .route("/v1/tenants", get(tenants))
        .route("/v1/whoami", get(whoami))
        .route("/metrics", get(metrics))
        .route("/", get(page))
        .route("/app.js", get(script))
        .route("/favicon.ico", get(|| async { StatusCode::NO_CONTENT }))
        .route("/login", post(login))
        .route("/logout", post(logout))
        .fallback(|| async {
            err(
                StatusCode::NOT_FOUND,
                "no such endpoint: see docs/SERVE.md for the API",
            )
        })
        .layer(axum::extract::DefaultBodyLimit::max(BODY_LIMIT))
        .layer(axum::middleware::from_fn(same_origin))
        .layer(axum::middleware::map_response(json_errors))
        .with_state(shared)
}

/// A browser sends `Origin` with every POST: one from another site (a page trying to log a
/// visitor in with its own token, or to cancel jobs with the visitor's session) is refused. The
/// session cookie is `SameSite=Strict` too; this also covers browsers that ignore it.
async fn same_origin(request: axum::extract::Request, next: axum::middleware::Next) -> Response {
    if request.method() != axum::http::Method::GET
        && let Some(origin) = request.headers().get(axum::http::header::ORIGIN)
    {
        let host = request
            .headers()
            .get(axum::http::header::HOST)
            .and_then(|h| h.to_str().ok())
            .unwrap_or("");
        // Behind a proxy, the host the browser used is in X-Forwarded-Host.
        let forwarded = request
            .headers()
            .get("x-forwarded-host")
            .and_then(|h| h.to_str().ok())
            .unwrap_or("");
        let origin = origin.to_str().unwrap_or("");
        let origin_host = origin
            .strip_prefix("http://")
            .or_else(|| origin.strip_prefix("https://"))
            .unwrap_or("");
        if origin_host.is_empty() || (origin_host != host && origin_host != forwarded) {
            return err(
                StatusCode::FORBIDDEN,
                format!("a request from {origin} to {host} was refused: the daemon answers its own page only"),
            )
            .into_response();
        }
    }
    next.run(request).await
}

/// Every error answer is `{"error": "..."}`, those axum writes itself (a body over the limit, a
/// malformed query) included.
async fn json_errors(response: Response) -> Response {
    let status = response.status();
    // JSON already, or a page for a browser (the login form after a failed login).
    let is_json = response
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .is_some_and(|v| {
            v.as_bytes().starts_with(b"application/json") || v.as_bytes().starts_with(b"text/html")
        });
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return response;
    }
    let body = axum::body::to_bytes(response.into_body(), 64 * 1024)
        .await
        .unwrap_or_default();
    let text = String::from_utf8_lossy(&body).trim().to_string();
    let error = if text.is_empty() {
        status.canonical_reason().unwrap_or("error").to_string()
    } else {
        text
    };
    (status, Json(ErrorBody { error })).into_response()
}

pub(crate) fn admitted(caller: &Caller) -> ApiResult<()> {
    if caller.unauthenticated {
        return Err(err(
            StatusCode::UNAUTHORIZED,
            "this listener needs a token: send `Authorization: Bearer TOKEN`, or log in on the web page",
        ));
    }
    match &caller.refused {
        Some(why) => Err(err(StatusCode::FORBIDDEN, why.clone())),
        None => Ok(()),
    }
}

async fn submit(
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
    let request: SubmitRequest = serde_json::from_slice(&body).map_err(|e| {
        err(
            StatusCode::BAD_REQUEST,
            format!("the request body is not a job submission: {e}"),
        )
    })?;
    let id = accept(&shared, &caller, request, None).await?;
    Ok((
        StatusCode::CREATED,
        Json(SubmitResponse { id: id.to_string() }),
    ))
}

/// Checks a submission (the job file, the tenant and its limits), commits it to the queue and
/// wakes the engine; returns the job's id. `holder`: the process that holds the lease itself (a
/// lease taken from a Python program, `POST /v1/leases`): nothing is started for such a job.
pub(crate) async fn accept(
    shared: &Arc<Shared>,
    caller: &Caller,
    request: SubmitRequest,
    holder: Option<orch_leases::Holder>,
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
    let gpus_at = spec.resources.gpus_at.to_string();
    let asked = admission::Asked {
        place: &request.job_path,
        gpus_at: &gpus_at,
        gpus: spec.resources.gpus,
        priority: spec.priority,
    };
    admission::devices(&asked, shared.visible_devices)?;
    let tenant = tenant_for(
        shared,
        caller,
        spec.tenant.as_deref(),
        Some(&request.job_path),
    )?;
    if spec.resources.nodes > 1 || !spec.sweep.is_empty() {
        let what = if spec.resources.nodes > 1 {
            format!("nodes = {}", spec.resources.nodes)
        } else {
            "[sweep]".to_string()
        };
        return Err(err(
            StatusCode::BAD_REQUEST,
            format!(
                "{}: {what} is for Slurm: this daemon serves one machine, one job per submission; submit it with `orch submit --slurm`",
                request.job_path
            ),
        ));
    }
    let limits = shared.config.tenant(&tenant).cloned();
    if let Some(limits) = &limits {
        admission::priority(limits, &asked)?;
    }
    let row = JobRow {
        id: String::new(),
        name: spec.name.clone(),
        tenant,
        user: caller.identity.name.clone(),
        uid: caller.identity.uid,
        state: State::Queued,
        gpus: spec.resources.gpus,
        priority: spec.priority,
        requeue: spec.requeue,
        submitted_at_ms: now_ms(),
        started_at_ms: None,
        ended_at_ms: None,
        exit_code: None,
        reason: None,
        lease_id: None,
        devices: Vec::new(),
        attempt: 0,
        cancel_requested: false,
        gpu_seconds: 0.0,
        charged_ms: None,
        events: Vec::new(),
    };
    let key = request.key.filter(|k| !k.is_empty() && k.len() <= 128);
    let policy_file = match &spec.policy.plugin {
        orch_core::PluginRef::Builtin(_) => None,
        orch_core::PluginRef::Path(path) => Some(
            crate::compile::submitted(
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
    };
    let tenant = row.tenant.clone();
    // The limit is checked in the same transaction as the insert: concurrent submissions
    // cannot overshoot it.
    let admitted = shared
        .db
        .write_value(move |tx| {
            // A submission sent again (its answer lost in a restart) is the job already taken.
            if let Some(id) = crate::db::job_with_key(tx, key.as_deref())? {
                return Ok(Ok(id));
            }
            if let Some(limits) = &limits
                && let Err(refusal) =
                    admission::queue(limits, crate::db::queued_in(tx, &row.tenant)?)
            {
                return Ok(Err(refusal));
            }
            crate::db::insert_job(tx, &row, &submission, key.as_deref()).map(Ok)
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
    let id = admitted?;
    shared.metrics.submitted(&tenant);
    shared.kick(Kick::Submitted(id));
    Ok(id)
}

/// The tenant a request of `caller` counts against: the one it names (which the caller must be
/// in, or an admin may name), else the caller's first. `place` (the job file) leads the refusal.
pub(crate) fn tenant_for(
    shared: &Shared,
    caller: &Caller,
    wanted: Option<&str>,
    place: Option<&str>,
) -> ApiResult<String> {
    match wanted {
        Some(t)
            if caller.tenants.iter().any(|c| c == t)
                || (caller.admin && shared.config.tenant(t).is_some()) =>
        {
            Ok(t.to_string())
        }
        Some(t) => {
            let place = place.map_or(String::new(), |p| format!("{p}: "));
            Err(err(
                StatusCode::FORBIDDEN,
                format!(
                    "{place}user {} is not in tenant \"{t}\"",
                    caller.identity.name
                ),
            ))
        }
        None => caller.tenants.first().cloned().ok_or_else(|| {
            err(
                StatusCode::FORBIDDEN,
                format!(
                    "user {} is in no tenant of this daemon; ask its admin to add them",
                    caller.identity.name
                ),
            )
        }),
    }
}

#[derive(Debug, Deserialize)]
struct ListQuery {
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

async fn list(
    AxState(shared): AxState<Arc<Shared>>,
    Extension(caller): Extension<Caller>,
    Query(q): Query<ListQuery>,
) -> ApiResult<Json<Vec<JobRow>>> {
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
            rows.sort_by_key(|r| r.id.parse::<i64>().unwrap_or(0));
            Ok(rows)
        }
        None => db.jobs(states, LIST_LIMIT),
    })
    .await?;
    let reasons = lock(&shared.reasons).clone();
    let mut rows: Vec<JobRow> = rows
        .into_iter()
        .filter(|r| visible_to(&caller, r))
        .map(|r| with_reason(r, &reasons))
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
    if q.events {
        rows = read(&shared, move |db| {
            // Events for the newest jobs only: one listing must not hold the database for long.
            let skip = rows.len().saturating_sub(EVENTS_LIMIT);
            for row in rows.iter_mut().skip(skip) {
                row.events = db.events(row.id.parse().unwrap_or(0))?;
            }
            Ok(rows)
        })
        .await?;
    }
    Ok(Json(rows))
}

/// A database read, on the blocking pool: a slow read never holds up the runtime's workers.
pub(crate) async fn read<T: Send + 'static>(
    shared: &Arc<Shared>,
    f: impl FnOnce(&crate::db::Db) -> Result<T, crate::db::DbError> + Send + 'static,
) -> ApiResult<T> {
    let shared = Arc::clone(shared);
    tokio::task::spawn_blocking(move || f(&shared.db))
        .await
        .map_err(internal)?
        .map_err(internal)
}

pub(crate) fn visible_to(caller: &Caller, row: &JobRow) -> bool {
    caller.admin || caller.tenants.contains(&row.tenant)
}

fn with_reason(mut row: JobRow, reasons: &std::collections::HashMap<i64, String>) -> JobRow {
    if row.state == State::Queued
        && let Some(why) = row.id.parse().ok().and_then(|id: i64| reasons.get(&id))
    {
        row.reason = Some(why.clone());
    }
    row
}

/// The job, if it exists and the caller may see it; 404 alike otherwise, so that another
/// tenant's jobs are not revealed.
pub(crate) async fn find(
    shared: &Arc<Shared>,
    caller: &Caller,
    id: &str,
) -> ApiResult<(i64, JobRow)> {
    admitted(caller)?;
    let not_found = || {
        err(
            StatusCode::NOT_FOUND,
            format!("no job {id} (orch jobs --all lists yours)"),
        )
    };
    let n: i64 = id.parse().map_err(|_| not_found())?;
    match read(shared, move |db| db.job(n)).await? {
        Some(row) if visible_to(caller, &row) => Ok((n, row)),
        _ => Err(not_found()),
    }
}

async fn status(
    AxState(shared): AxState<Arc<Shared>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> ApiResult<Json<JobRow>> {
    let (n, mut row) = find(&shared, &caller, &id).await?;
    row.events = read(&shared, move |db| db.events(n)).await?;
    let reasons = lock(&shared.reasons).clone();
    Ok(Json(with_reason(row, &reasons)))
}

async fn cancel(
    AxState(shared): AxState<Arc<Shared>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> ApiResult<(StatusCode, Json<JobRow>)> {
    let (n, row) = find(&shared, &caller, &id).await?;
    match row.state {
        State::Queued => {
            let change = crate::db::Change {
                state: Some(State::Cancelled),
                ended_at_ms: Some(now_ms()),
                reason: Some(format!("cancelled by {}", caller.identity.name)),
                only_if: Some(State::Queued),
                event: Some(crate::db::Event::now(
                    "finished",
                    format!("cancelled by {} while queued", caller.identity.name),
                )),
                ..Default::default()
            };
            let changed = shared
                .db
                .write(move |tx| crate::db::apply(tx, n, &change))
                .await
                .map_err(internal)?;
            if changed == 1 {
                shared.kick(Kick::Dequeued(n));
                let row = read(&shared, move |db| db.job(n)).await?.unwrap_or(row);
                return Ok((StatusCode::OK, Json(row)));
            }
            // It started meanwhile: stop it.
            request_stop(&shared, n, &caller).await?;
            Ok((StatusCode::ACCEPTED, Json(row)))
        }
        State::Running => {
            request_stop(&shared, n, &caller).await?;
            Ok((StatusCode::ACCEPTED, Json(row)))
        }
        other => Err(err(
            StatusCode::CONFLICT,
            format!("job {id} has already ended ({})", other.as_str()),
        )),
    }
}

/// Commits the cancel of a running job before it is carried out, so that a daemon restarted in
/// between still carries it out.
async fn request_stop(shared: &Arc<Shared>, n: i64, caller: &Caller) -> ApiResult<()> {
    let change = crate::db::Change {
        cancel_requested: Some(true),
        only_if: Some(State::Running),
        event: Some(crate::db::Event::now(
            "stopping",
            format!("cancel asked by {}", caller.identity.name),
        )),
        ..Default::default()
    };
    shared
        .db
        .write(move |tx| crate::db::apply(tx, n, &change))
        .await
        .map_err(internal)?;
    shared.kick(Kick::Cancel(n));
    Ok(())
}

#[derive(Debug, Deserialize)]
struct LogsQuery {
    #[serde(default)]
    follow: bool,
    #[serde(default)]
    stream: Option<String>,
}

async fn logs(
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
    tokio::spawn(crate::logs::pump(shared.clone(), n, file, follow, tx));
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    });
    Response::builder()
        .header("content-type", "text/plain; charset=utf-8")
        .body(axum::body::Body::from_stream(stream))
        .map_err(internal)
}

async fn devices(
    AxState(shared): AxState<Arc<Shared>>,
    Extension(caller): Extension<Caller>,
) -> ApiResult<Json<Vec<serde_json::Value>>> {
    admitted(&caller)?;
    let view = crate::view::devices(&shared, &caller).await?;
    Ok(Json(view))
}

/// Who the daemon takes the caller for.
async fn whoami(Extension(caller): Extension<Caller>) -> ApiResult<Json<serde_json::Value>> {
    admitted(&caller)?;
    Ok(Json(serde_json::json!({
        "name": caller.identity.name,
        "tenants": caller.tenants,
        "admin": caller.admin,
    })))
}

/// Prometheus' text format; admins only (job and tenant names of everyone are in it).
async fn metrics(
    AxState(shared): AxState<Arc<Shared>>,
    Extension(caller): Extension<Caller>,
) -> Result<Response, ApiError> {
    admitted(&caller)?;
    if !caller.admin {
        return Err(err(
            StatusCode::FORBIDDEN,
            "/metrics is for admins: scrape it with an admin token (admin_tokens) or as an admin user",
        ));
    }
    let snapshot = crate::view::metrics_snapshot(&shared).await?;
    let text = crate::metrics::render(&snapshot, &shared.metrics);
    Ok((
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response())
}

const HTML: &str = "text/html; charset=utf-8";
/// No framework, no other host: the page's script is its own, and nothing else may run.
const PAGE_CSP: &str = "default-src 'none'; script-src 'self'; connect-src 'self'; style-src 'unsafe-inline'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

fn html(status: StatusCode, body: String) -> Response {
    (
        status,
        [
            (axum::http::header::CONTENT_TYPE, HTML),
            (axum::http::header::CONTENT_SECURITY_POLICY, PAGE_CSP),
            (axum::http::header::CACHE_CONTROL, "no-store"),
            (axum::http::header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        body,
    )
        .into_response()
}

/// The dashboard for a logged-in caller; the login form (never data) for anyone else.
async fn page(Extension(caller): Extension<Caller>) -> Response {
    if caller.unauthenticated || caller.refused.is_some() {
        return html(StatusCode::OK, crate::web::login_page(None));
    }
    html(StatusCode::OK, crate::web::PAGE.to_string())
}

async fn script() -> Response {
    (
        [
            (
                axum::http::header::CONTENT_TYPE,
                "text/javascript; charset=utf-8",
            ),
            (axum::http::header::CACHE_CONTROL, "no-cache"),
            (axum::http::header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        crate::web::SCRIPT,
    )
        .into_response()
}

/// The login form's post: a valid token opens a session (a cookie); anything else gets the form
/// again with one sentence.
async fn login(
    AxState(shared): AxState<Arc<Shared>>,
    Extension(caller): Extension<Caller>,
    headers: axum::http::HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    if !caller.remote {
        return html(
            StatusCode::BAD_REQUEST,
            crate::web::login_page(Some(
                "Over the Unix socket the daemon knows you already; the login is for its TCP listener.",
            )),
        );
    }
    let Some(token) = crate::web::form_token(&body).filter(|t| !t.is_empty()) else {
        return html(
            StatusCode::BAD_REQUEST,
            crate::web::login_page(Some("Give a token.")),
        );
    };
    let Some(who) = crate::web::caller_of_token(&shared.config, &token) else {
        tracing::warn!("a login with an unknown token was refused");
        return html(
            StatusCode::UNAUTHORIZED,
            crate::web::login_page(Some(
                "That token is not valid here; ask the daemon's admin for yours.",
            )),
        );
    };
    let id = match shared.sessions.open(who) {
        Ok(id) => id,
        Err(e) => {
            return html(
                StatusCode::INTERNAL_SERVER_ERROR,
                crate::web::login_page(Some(&format!("The daemon could not open a session: {e}"))),
            );
        }
    };
    // Served through a TLS proxy: the cookie never travels in the clear.
    let secure = headers
        .get("x-forwarded-proto")
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"https"));
    home_with_session(&id, 43200, secure)
}

async fn logout(AxState(shared): AxState<Arc<Shared>>, headers: axum::http::HeaderMap) -> Response {
    if let Some(id) = crate::web::session_id(&headers) {
        shared.sessions.close(&id);
    }
    home_with_session("", 0, false)
}

/// A redirect to the page that sets (or, with an empty id and no age, clears) the session cookie.
fn home_with_session(id: &str, max_age_s: u32, secure: bool) -> Response {
    (
        StatusCode::SEE_OTHER,
        [
            (axum::http::header::LOCATION, "/".to_string()),
            (
                axum::http::header::SET_COOKIE,
                format!(
                    "{}={id}; Path=/; HttpOnly; SameSite=Strict; Max-Age={max_age_s}{}",
                    crate::web::COOKIE,
                    if secure { "; Secure" } else { "" }
                ),
            ),
        ],
    )
        .into_response()
}

async fn tenants(
    AxState(shared): AxState<Arc<Shared>>,
    Extension(caller): Extension<Caller>,
) -> ApiResult<Json<Vec<TenantRow>>> {
    admitted(&caller)?;
    let active = read(&shared, |db| {
        db.jobs(&[State::Queued, State::Running], u32::MAX)
    })
    .await?;
    let standing = orch_core::sync::lock(&shared.standing).clone();
    Ok(Json(
        shared
            .config
            .tenants
            .iter()
            .filter(|t| caller.admin || caller.tenants.contains(&t.name))
            .map(|t| {
                let mine = active.iter().filter(|j| j.tenant == t.name);
                let running: Vec<&JobRow> =
                    mine.clone().filter(|j| j.state == State::Running).collect();
                let fair = standing.iter().find(|s| s.name == t.name);
                TenantRow {
                    name: t.name.clone(),
                    share: t.share,
                    normalized_share: fair.map_or(0.0, |f| f.normalized_share),
                    usage_gpu_seconds: fair.map_or(0.0, |f| f.usage_gpu_s),
                    normalized_usage: fair.map_or(0.0, |f| f.normalized_usage),
                    fair_share: fair.map_or(1.0, |f| f.fair_share),
                    max_gpus: t.max_gpus,
                    max_queued: t.max_queued,
                    max_priority: t.max_priority,
                    max_runtime_s: t.max_runtime.map(|d| d.as_secs_f64()),
                    gpus_held: running.iter().map(|j| j.gpus).sum(),
                    jobs_queued: mine.filter(|j| j.state == State::Queued).count() as u32,
                    jobs_running: running.len() as u32,
                }
            })
            .collect(),
    ))
}
