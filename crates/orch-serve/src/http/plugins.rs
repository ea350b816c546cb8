//! Policy components over the API: `GET` and `PUT /v1/plugins/sha256:HEX`. Kept in the state
//! folder and compiled by [`crate::core::compile`]; the file policy a submission names or
//! carries is kept by [`crate::core::submit`].

use crate::core::caller::Caller;
use crate::core::compile::{UPLOAD_LIMIT, no_such, parse_digest, unique};
use crate::core::state::Shared;
use crate::http::access::{admitted, tenant_for};
use crate::http::error::{ApiError, ApiResult, err};
use crate::http::wire::PluginAnswer;
use axum::Json;
use axum::extract::{Extension, Path as UrlPath, Query, State as AxState};
use axum::http::StatusCode;
use serde::Deserialize;
use std::path::Path;
use std::sync::Arc;

/// Policy components travel over the Unix socket only, like the jobs that name them.
fn local(caller: &Caller) -> ApiResult<()> {
    admitted(caller)?;
    if caller.remote {
        return Err(err(
            StatusCode::FORBIDDEN,
            "policy components are sent over the daemon's Unix socket, like the jobs that name them; use `orch submit` on the machine",
        ));
    }
    Ok(())
}

/// `GET` (and `HEAD`) `/v1/plugins/sha256:HEX`: whether the daemon has the component, and
/// where its compile stands.
pub(crate) async fn show(
    AxState(shared): AxState<Arc<Shared>>,
    Extension(caller): Extension<Caller>,
    UrlPath(address): UrlPath<String>,
) -> ApiResult<Json<PluginAnswer>> {
    local(&caller)?;
    let hex = parse_digest(&address).map_err(|e| err(StatusCode::BAD_REQUEST, e))?;
    let bytes = tokio::fs::metadata(shared.compiler.source(&hex))
        .await
        .map(|m| m.len())
        .map_err(|_| err(StatusCode::NOT_FOUND, no_such(&hex)))?;
    Ok(Json(PluginAnswer {
        digest: format!("sha256:{hex}"),
        bytes,
        state: shared.compiler.describe(&hex).into(),
        note: None,
    }))
}

#[derive(Debug, Deserialize)]
pub(crate) struct UploadQuery {
    /// The tenant whose compile budget pays (default: the caller's first).
    #[serde(default)]
    tenant: Option<String>,
}

/// `PUT /v1/plugins/sha256:HEX`: keeps the component (the bytes must have that digest; at most
/// [`UPLOAD_LIMIT`]) and starts compiling it for the tenant, within its budget. 201 when it is
/// new, 200 when the daemon had it.
pub(crate) async fn upload(
    AxState(shared): AxState<Arc<Shared>>,
    Extension(caller): Extension<Caller>,
    UrlPath(address): UrlPath<String>,
    Query(query): Query<UploadQuery>,
    request: axum::extract::Request,
) -> ApiResult<(StatusCode, Json<PluginAnswer>)> {
    local(&caller)?;
    let hex = parse_digest(&address).map_err(|e| err(StatusCode::BAD_REQUEST, e))?;
    let tenant = tenant_for(&shared, &caller, query.tenant.as_deref(), None)?;
    let too_big = |bytes: u64| {
        err(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "the component is {bytes} bytes, over the {} MiB a policy component may be",
                UPLOAD_LIMIT >> 20
            ),
        )
    };
    let declared = request
        .headers()
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if let Some(bytes) = declared.filter(|&b| b > UPLOAD_LIMIT) {
        return Err(too_big(bytes));
    }
    let path = shared.compiler.source(&hex);
    let created = if tokio::fs::metadata(&path).await.is_ok() {
        // Had it: the body is read and dropped (within the limit), so the client reads the
        // answer rather than a reset connection.
        use http_body_util::BodyExt as _;
        let mut body = request.into_body();
        let mut total = 0u64;
        while let Some(Ok(frame)) = body.frame().await {
            total += frame.data_ref().map_or(0, |d| d.len() as u64);
            if total > UPLOAD_LIMIT {
                return Err(too_big(total));
            }
        }
        false
    } else {
        receive(request.into_body(), &path, &hex, too_big).await?;
        true
    };
    let bytes = tokio::fs::metadata(&path).await.map_or(0, |m| m.len());
    let budget = shared
        .config
        .tenant(&tenant)
        .map(|t| t.compile)
        .unwrap_or_default();
    let note = shared
        .compiler
        .request(&hex, &tenant, Some(&budget), bytes)
        .err();
    Ok((
        if created {
            StatusCode::CREATED
        } else {
            StatusCode::OK
        },
        Json(PluginAnswer {
            digest: format!("sha256:{hex}"),
            bytes,
            state: shared.compiler.describe(&hex).into(),
            note,
        }),
    ))
}

/// Writes the body to `path` (aside first, renamed into place) if its SHA-256 is `hex`.
async fn receive(
    mut body: axum::body::Body,
    path: &Path,
    hex: &str,
    too_big: impl Fn(u64) -> ApiError,
) -> ApiResult<()> {
    use http_body_util::BodyExt as _;
    use sha2::Digest as _;
    use tokio::io::AsyncWriteExt as _;
    let keep = |e: std::io::Error| {
        err(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the daemon could not keep the component: {e}"),
        )
    };
    let dir = path.parent().unwrap_or(Path::new("."));
    tokio::fs::create_dir_all(dir).await.map_err(keep)?;
    let tmp = dir.join(format!(
        ".upload-{hex}-{}-{}.tmp",
        std::process::id(),
        unique()
    ));
    let mut file = tokio::fs::File::create(&tmp).await.map_err(keep)?;
    let mut hasher = sha2::Sha256::new();
    let mut total = 0u64;
    let received: ApiResult<()> = async {
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| {
                err(
                    StatusCode::BAD_REQUEST,
                    format!("the upload broke off: {e}"),
                )
            })?;
            let Ok(data) = frame.into_data() else {
                continue;
            };
            total += data.len() as u64;
            if total > UPLOAD_LIMIT {
                return Err(too_big(total));
            }
            // Tens of MB take a while to hash: the runtime moves its other work off this thread.
            tokio::task::block_in_place(|| hasher.update(&data));
            file.write_all(&data).await.map_err(keep)?;
        }
        // No fsync: it would hold up every commit of the job database behind tens of MB. A copy
        // a crash damaged is found by the compile, which checks the digest, and removed.
        file.flush().await.map_err(keep)?;
        Ok(())
    }
    .await;
    let got = orch_core::hex::encode(&hasher.finalize());
    let outcome = received.and_then(|()| {
        if got == hex {
            Ok(())
        } else {
            Err(err(
                StatusCode::BAD_REQUEST,
                format!(
                    "the bytes sent have SHA-256 {got}, not the {hex} their address names: send a file to PUT /v1/plugins/sha256: and its own digest"
                ),
            ))
        }
    });
    match outcome {
        Ok(()) => tokio::fs::rename(&tmp, path).await.map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            keep(e)
        }),
        Err(e) => {
            let _ = tokio::fs::remove_file(&tmp).await;
            Err(e)
        }
    }
}
