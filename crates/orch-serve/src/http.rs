//! The API for callers: HTTP + JSON under `/v1`, as docs/SERVE.md describes it. Errors are
//! `{"error": "one sentence"}` with the status that fits (400 bad job file, 403, 404, 409 wrong
//! state, 429 over a queue limit, 503 while the state folder takes no writes).
//!
//! This layer reads and changes the daemon through [`crate::core`] alone; the web page
//! ([`crate::web`]) sits on top of it, and [`crate::server`] composes the two.

pub mod access;
pub mod conns;
pub mod drains;
pub mod error;
pub mod history;
pub mod jobs;
pub mod leases;
pub mod logs;
pub mod machine;
pub mod parse_errors;
pub mod plugins;
pub mod wire;

use crate::core::state::Shared;
use crate::http::error::err;
use crate::http::wire::{BODY_LIMIT, ErrorBody};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use std::sync::Arc;

/// The API's routes, to be [`finish`]ed with the others of the listener.
pub fn routes() -> Router<Arc<Shared>> {
    Router::new()
        .route("/v1/jobs", post(jobs::submit).get(jobs::list))
        .route("/v1/jobs/{id}", get(jobs::status))
        .route("/v1/history", get(history::history))
        .route("/v1/jobs/{id}/cancel", post(jobs::cancel))
        .route("/v1/jobs/{id}/logs", get(jobs::logs))
        .route(
            "/v1/plugins/{digest}",
            get(plugins::show).put(plugins::upload),
        )
        .route("/v1/leases", post(leases::take).get(leases::list))
        .route("/v1/leases/{id}", get(leases::show))
        .route("/v1/leases/{id}/release", post(leases::release))
        .route("/v1/devices", get(machine::devices))
        .route("/v1/devices/{device}/drain", post(drains::drain))
        .route("/v1/devices/{device}/undrain", post(drains::undrain))
        .route("/v1/tenants", get(machine::tenants))
        .route("/v1/whoami", get(machine::whoami))
        .route("/v1/timeline", get(machine::timeline))
        .route("/metrics", get(machine::metrics))
}

/// The listener's whole router: `routes` (the API's and the page's) with the API's answer for an
/// unknown path, its body limit, the same-origin check and JSON errors.
pub fn finish(routes: Router<Arc<Shared>>, shared: Arc<Shared>) -> Router {
    routes
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
    let error = match status {
        _ if !text.is_empty() => text,
        StatusCode::METHOD_NOT_ALLOWED => {
            "this path does not take that method: see docs/SERVE.md for the API".to_string()
        }
        _ => status.canonical_reason().unwrap_or("error").to_string(),
    };
    (status, Json(ErrorBody { error })).into_response()
}
