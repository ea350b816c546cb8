//! `POST /v1/devices/{device}/drain` and `/undrain`: an admin takes a device (a GPU by index or
//! uuid, or a MIG slice by uuid) out of service for new jobs, or puts it back. The drain is kept
//! in the lease store, where `orch run` without the daemon finds it too and a restart keeps it;
//! the machine view shows it at once and the engine runs a pass.

use crate::core::caller::Caller;
use crate::core::engine::device_health;
use crate::core::state::Shared;
use crate::http::access::admitted;
use crate::http::error::{ApiResult, err, internal};
use axum::Json;
use axum::body::Bytes;
use axum::extract::{Extension, Path, State as AxState};
use axum::http::StatusCode;
use orch_leases::{LeaseStore, MarkKind};
use std::sync::Arc;

/// What `drain` takes (an empty body is no reason).
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct DrainBody {
    reason: Option<String>,
}

pub(crate) async fn drain(
    AxState(shared): AxState<Arc<Shared>>,
    Extension(caller): Extension<Caller>,
    Path(device): Path<String>,
    body: Bytes,
) -> ApiResult<Json<serde_json::Value>> {
    admin(&caller, "drain")?;
    let body: DrainBody = if body.iter().all(u8::is_ascii_whitespace) {
        DrainBody::default()
    } else {
        serde_json::from_slice(&body).map_err(|e| {
            err(
                StatusCode::BAD_REQUEST,
                format!("the body is {{\"reason\": \"TEXT\"}} or empty: {e}"),
            )
        })?
    };
    let reason = orch_devices::health::drain_reason(body.reason.as_deref())
        .map_err(|e| err(StatusCode::BAD_REQUEST, e))?;
    let (uuid, index) = find(&shared, &device)?;
    let by = caller.identity.name.clone();
    let state_dir = shared.state_dir.clone();
    let (mark_uuid, mark_reason) = (uuid.clone(), reason.clone());
    let mark = tokio::task::spawn_blocking(move || {
        LeaseStore::open(&state_dir)?.set_mark(
            &mark_uuid,
            MarkKind::Drain,
            mark_reason.as_deref(),
            Some(&by),
        )
    })
    .await
    .map_err(internal)?
    .map_err(internal)?;
    device_health::show_mark(&shared, &mark);
    tracing::info!(
        "{} drained device {uuid} (GPU {index}){}",
        caller.identity.name,
        reason.as_ref().map_or(String::new(), |r| format!(": {r}"))
    );
    Ok(Json(serde_json::json!({
        "uuid": uuid, "index": index, "drained": true, "reason": reason,
        "by": caller.identity.name, "since_ms": mark.since_ms,
    })))
}

/// Ends a drain of the device, and forgets the Xid events recorded for it (an admin who puts a
/// GPU back says it was seen to: reset, or replaced). What its readings show stays.
pub(crate) async fn undrain(
    AxState(shared): AxState<Arc<Shared>>,
    Extension(caller): Extension<Caller>,
    Path(device): Path<String>,
) -> ApiResult<Json<serde_json::Value>> {
    admin(&caller, "undrain")?;
    let (uuid, index) = find(&shared, &device)?;
    let state_dir = shared.state_dir.clone();
    let cleared = uuid.clone();
    let (drained, recorded) = tokio::task::spawn_blocking(move || {
        let mut store = LeaseStore::open(&state_dir)?;
        Ok::<_, orch_leases::LeaseError>((
            store.clear_mark(&cleared, MarkKind::Drain)?,
            store.clear_mark(&cleared, MarkKind::Unhealthy)?,
        ))
    })
    .await
    .map_err(internal)?
    .map_err(internal)?;
    device_health::show_cleared(&shared, &uuid);
    tracing::info!(
        "{} undrained device {uuid} (GPU {index})",
        caller.identity.name
    );
    Ok(Json(serde_json::json!({
        "uuid": uuid, "index": index, "drained": false,
        "was_drained": drained, "cleared_xid_events": recorded,
    })))
}

fn admin(caller: &Caller, what: &str) -> ApiResult<()> {
    admitted(caller)?;
    if caller.admin {
        return Ok(());
    }
    Err(err(
        StatusCode::FORBIDDEN,
        format!(
            "only an admin may {what} a device (user {} is not one of the daemon's admins)",
            caller.identity.name
        ),
    ))
}

fn find(shared: &Shared, device: &str) -> ApiResult<(String, u32)> {
    let inventory = Arc::clone(&orch_core::sync::lock(&shared.machine).inventory);
    orch_devices::health::find_device(&inventory.devices, device)
        .map_err(|why| err(StatusCode::NOT_FOUND, why))
}
