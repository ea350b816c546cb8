//! What every handler asks first: whether the caller is served at all, which tenant a request
//! counts against, which jobs the caller may see; and database reads off the runtime's workers.

use crate::core::caller::Caller;
use crate::core::db::JobRow;
use crate::core::state::Shared;
use crate::http::error::{ApiResult, err, internal};
use axum::http::StatusCode;
use std::sync::Arc;

/// The answer to a metrics token (`metrics_tokens`) anywhere but `GET /metrics`.
pub const METRICS_ONLY: &str = "this token only reads /metrics (it is one of metrics_tokens): use a tenant's or an admin token for anything else";

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

/// The tenant a request of `caller` counts against ([`Caller::tenant_for`]); its refusal is a
/// 403.
pub(crate) fn tenant_for(
    shared: &Shared,
    caller: &Caller,
    wanted: Option<&str>,
    place: Option<&str>,
) -> ApiResult<String> {
    Ok(caller.tenant_for(&shared.config, wanted, place)?)
}

/// A database read, on the blocking pool: a slow read never holds up the runtime's workers.
pub(crate) async fn read<T: Send + 'static>(
    shared: &Arc<Shared>,
    f: impl FnOnce(&crate::core::db::Db) -> Result<T, crate::core::db::DbError> + Send + 'static,
) -> ApiResult<T> {
    read_model(shared, move |shared| f(&shared.db)).await
}

/// A read of the daemon's state that touches the database ([`crate::core::view`]), on the
/// blocking pool as [`read`] is.
pub(crate) async fn read_model<T: Send + 'static>(
    shared: &Arc<Shared>,
    f: impl FnOnce(&Shared) -> Result<T, crate::core::db::DbError> + Send + 'static,
) -> ApiResult<T> {
    let shared = Arc::clone(shared);
    tokio::task::spawn_blocking(move || f(&shared))
        .await
        .map_err(internal)?
        .map_err(internal)
}

pub(crate) fn visible_to(caller: &Caller, row: &JobRow) -> bool {
    caller.sees(row)
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
    let row = match array_task_id(id) {
        // `17[3]`: task 3 of job array 17.
        Some((array, task)) => read(shared, move |db| db.array_task(array, task)).await?,
        None => {
            let n: i64 = id.parse().map_err(|_| not_found())?;
            read(shared, move |db| db.job(n)).await?
        }
    };
    match row {
        Some(row) if visible_to(caller, &row) => Ok((row.id, row)),
        _ => Err(not_found()),
    }
}

/// `ARRAY[TASK]` (`17[3]`) as its two numbers; `None` for anything else.
pub(crate) fn array_task_id(id: &str) -> Option<(i64, u32)> {
    let (array, task) = id.strip_suffix(']')?.split_once('[')?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(array) || !digits(task) {
        return None;
    }
    Some((array.parse().ok()?, task.parse().ok()?))
}

/// Whether `id`, as a request names it, names the whole job array `row` is the first task of
/// (`17`, not `17[0]`).
pub(crate) fn names_array(id: &str, row: &JobRow) -> bool {
    row.array.is_some_and(|a| a.id == row.id) && array_task_id(id).is_none()
}

#[cfg(test)]
mod tests {
    use super::array_task_id;

    #[test]
    fn an_array_task_is_named_array_and_index() {
        assert_eq!(array_task_id("17[3]"), Some((17, 3)));
        assert_eq!(array_task_id("17[0]"), Some((17, 0)));
        for bad in [
            "17", "17[]", "[3]", "17[3", "17[-1]", "17[3]x", "1 7[3]", "17[3][4]",
        ] {
            assert_eq!(array_task_id(bad), None, "{bad}");
        }
    }
}
