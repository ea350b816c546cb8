//! The machine and its tenants over the API: `/v1/devices`, `/v1/tenants`, `/v1/whoami`,
//! `/v1/timeline` and `/metrics`.

use crate::core::caller::Caller;
use crate::core::db::{JobRow, State};
use crate::core::state::Shared;
use crate::http::access::{admitted, read, read_model};
use crate::http::error::{ApiError, ApiResult, err};
use crate::http::wire::TenantRow;
use axum::Json;
use axum::extract::{Extension, State as AxState};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use std::sync::Arc;

pub(crate) async fn devices(
    AxState(shared): AxState<Arc<Shared>>,
    Extension(caller): Extension<Caller>,
) -> ApiResult<Json<Vec<serde_json::Value>>> {
    admitted(&caller)?;
    let view = read_model(&shared, move |shared| {
        crate::core::view::devices(shared, &caller)
    })
    .await?;
    Ok(Json(view))
}

/// Who the daemon takes the caller for.
pub(crate) async fn whoami(
    Extension(caller): Extension<Caller>,
) -> ApiResult<Json<serde_json::Value>> {
    admitted(&caller)?;
    Ok(Json(serde_json::json!({
        "name": caller.identity.name,
        "tenants": caller.tenants,
        "admin": caller.admin,
    })))
}

/// Prometheus' text format; for admins and metrics tokens only (job and tenant names of
/// everyone are in it).
pub(crate) async fn metrics(
    AxState(shared): AxState<Arc<Shared>>,
    Extension(caller): Extension<Caller>,
) -> Result<Response, ApiError> {
    // A metrics token is refused everywhere else (its `refused`); here it is what it is for.
    if !caller.metrics_only {
        admitted(&caller)?;
        if !caller.admin {
            return Err(err(
                StatusCode::FORBIDDEN,
                "/metrics is for admins: scrape it with a metrics token (metrics_tokens), an admin token (admin_tokens) or as an admin user",
            ));
        }
    }
    let snapshot = read_model(&shared, crate::core::view::metrics_snapshot).await?;
    let text = crate::core::metrics::render(&snapshot, &shared.metrics);
    Ok((
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response())
}

pub(crate) async fn tenants(
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

#[derive(Debug, serde::Deserialize)]
pub(crate) struct TimelineQuery {
    /// Only the samples after this time (ms since the epoch).
    #[serde(default)]
    since: u64,
    /// At most this many samples, neighbours merged (1,000 when left out, 2,000 at most).
    points: Option<usize>,
}

/// The last hours of the devices and the queue (`crate::core::timeline`). Every caller sees the
/// devices' series, as `/v1/devices` shows every device's reading; the queue's counts are those
/// of the caller's tenants, everyone's for an admin, as `/v1/tenants` shows them.
pub(crate) async fn timeline(
    AxState(shared): AxState<Arc<Shared>>,
    Extension(caller): Extension<Caller>,
    axum::extract::Query(q): axum::extract::Query<TimelineQuery>,
) -> ApiResult<Json<crate::core::timeline::View>> {
    admitted(&caller)?;
    if q.points == Some(0) {
        return Err(err(
            StatusCode::BAD_REQUEST,
            "points=0 asks for no samples: give a positive number of points (at most 2000), or leave it out for 1000",
        ));
    }
    // Off the async workers: a long span of many GPUs is a few MB to copy and merge.
    let view = tokio::task::spawn_blocking(move || {
        shared.timeline.view(q.since, q.points, |tenant| {
            caller.admin || caller.tenants.iter().any(|t| t == tenant)
        })
    })
    .await
    .map_err(crate::http::error::internal)?;
    Ok(Json(view))
}
