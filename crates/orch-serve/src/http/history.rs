//! `GET /v1/history`: finished jobs' accounting (`orch history`), or its sums per tenant or user
//! (`?by=tenant`). A caller sees the jobs of its tenants, as `GET /v1/jobs` shows them; an admin
//! sees every job, of tenants no longer configured too.

use crate::core::accounting::{By, Filter};
use crate::core::caller::Caller;
use crate::core::db::State;
use crate::core::state::Shared;
use crate::http::access::{admitted, read};
use crate::http::error::{ApiResult, err};
use crate::http::wire::HistoryJob;
use axum::Json;
use axum::extract::{Extension, Query, State as AxState};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use std::sync::Arc;

/// Most jobs one answer holds (the newest of those asked for).
pub const HISTORY_LIMIT: u32 = 100_000;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct HistoryQuery {
    /// Jobs that ended at or after this moment (ms since the Unix epoch).
    since_ms: Option<u64>,
    /// Jobs that ended before this moment.
    until_ms: Option<u64>,
    user: Option<String>,
    tenant: Option<String>,
    /// Final states, comma-separated (`failed,lost`).
    state: Option<String>,
    /// `tenant` or `user`: sums instead of jobs.
    by: Option<String>,
    /// At most this many of the newest jobs.
    limit: Option<u32>,
}

pub(crate) async fn history(
    AxState(shared): AxState<Arc<Shared>>,
    Extension(caller): Extension<Caller>,
    Query(q): Query<HistoryQuery>,
) -> ApiResult<Response> {
    admitted(&caller)?;
    let bad = |message: String| err(StatusCode::BAD_REQUEST, message);
    let mut states = Vec::new();
    for word in q.state.iter().flat_map(|s| s.split(',')) {
        match State::parse(word.trim()) {
            Ok(state) if state.is_final() => states.push(state),
            _ => {
                return Err(bad(format!(
                    "state \"{}\" is not a state a finished job has: give succeeded, failed, cancelled or lost",
                    word.escape_debug()
                )));
            }
        }
    }
    let by = match q.by.as_deref() {
        None => None,
        Some("tenant") => Some(By::Tenant),
        Some("user") => Some(By::User),
        Some(other) => {
            return Err(bad(format!(
                "by \"{}\" is not a grouping: give tenant or user",
                other.escape_debug()
            )));
        }
    };
    for (name, ms) in [("since_ms", q.since_ms), ("until_ms", q.until_ms)] {
        if let Some(ms) = ms
            && ms > i64::MAX as u64
        {
            return Err(bad(format!(
                "{name} is {ms}: give a moment in milliseconds since the Unix epoch, at most {}",
                i64::MAX
            )));
        }
    }
    if let (Some(since), Some(until)) = (q.since_ms, q.until_ms)
        && since > until
    {
        return Err(bad(
            "the history's start comes after its end: give a --since before --until".into(),
        ));
    }
    // A caller sees its own tenants' jobs; naming another tenant is refused, not answered empty.
    let tenants = if caller.admin {
        None
    } else {
        if let Some(t) = &q.tenant
            && !caller.tenants.contains(t)
        {
            return Err(err(
                StatusCode::FORBIDDEN,
                format!(
                    "user {} is not in tenant \"{}\": the history shows your tenants' jobs",
                    caller.identity.name,
                    t.escape_debug()
                ),
            ));
        }
        Some(caller.tenants.clone())
    };
    let filter = Filter {
        since_ms: q.since_ms,
        until_ms: q.until_ms,
        user: q.user,
        tenant: q.tenant,
        states,
        tenants,
    };
    let limit = q.limit.unwrap_or(HISTORY_LIMIT).min(HISTORY_LIMIT);
    Ok(match by {
        Some(by) => {
            let groups = read(&shared, move |db| db.history_summary(&filter, by)).await?;
            Json(groups).into_response()
        }
        None => {
            let records = read(&shared, move |db| db.history(&filter, limit)).await?;
            let jobs: Vec<HistoryJob> = records.iter().map(HistoryJob::from).collect();
            Json(jobs).into_response()
        }
    })
}
