//! The TCP listener's side of identity (bearer tokens, and browser sessions made from them) and
//! the web page: a login form, then one page of GPUs, jobs and tenants that refreshes itself.
//!
//! Design decisions:
//! - A token never travels in a URL (URLs end up in logs and browser history): the login form
//!   posts it, and the answer sets a session cookie (`HttpOnly`, `SameSite=Strict`, and `Secure`
//!   when the listener serves HTTPS itself ([`OverTls`]) or a TLS proxy says
//!   `X-Forwarded-Proto: https`) naming a random session id that the daemon keeps in memory for
//!   12 hours. A metrics token opens no session: it reads `/metrics` and nothing else. A POST from another origin is refused (the API's same-origin check, [`crate::http`]).
//! - The page is static (`web/page.html`, `web/app.js`, a few kB, no framework, nothing from
//!   another host: the machine may have no internet); its script reads the same `/v1` API with
//!   the session's rights, so a tenant's page shows exactly what its API answers would.

use crate::core::caller::Caller;
use crate::core::config::{Config, TokenRights};
use crate::core::state::Shared;
use crate::core::users::Identity;
use axum::Router;
use axum::extract::{Extension, State as AxState};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use orch_core::sync::lock;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a browser session lasts.
const SESSION_LIFE: Duration = Duration::from_secs(12 * 3600);
pub const COOKIE: &str = "orch_session";

/// Marks a request that came over the TCP listener's TLS: the session cookie is then `Secure`.
#[derive(Debug, Clone, Copy)]
pub struct OverTls;

/// Live browser sessions.
#[derive(Debug, Default)]
pub struct Sessions {
    by_id: Mutex<HashMap<String, Session>>,
}

#[derive(Debug, Clone)]
struct Session {
    caller: Caller,
    expires: Instant,
}

impl Sessions {
    /// A new session for `caller`; returns its id.
    pub fn open(&self, caller: Caller) -> std::io::Result<String> {
        let id = orch_core::random::random_hex(32)?;
        let mut map = lock(&self.by_id);
        let now = Instant::now();
        map.retain(|_, s| s.expires > now);
        map.insert(
            id.clone(),
            Session {
                caller,
                expires: now + SESSION_LIFE,
            },
        );
        Ok(id)
    }

    pub fn get(&self, id: &str) -> Option<Caller> {
        let map = lock(&self.by_id);
        map.get(id)
            .filter(|s| s.expires > Instant::now())
            .map(|s| s.caller.clone())
    }

    pub fn close(&self, id: &str) {
        lock(&self.by_id).remove(id);
    }
}

/// Who a bearer token is: the tenants whose `tokens` list it, admin when `admin_tokens` does;
/// a scraper that reads `/metrics` alone when `metrics_tokens` does. `None`: no list knows it.
pub fn caller_of_token(config: &Config, token: &str) -> Option<Caller> {
    let (who, tenants, admin, metrics_only) = match config.rights_of_token(token) {
        TokenRights::Unknown => return None,
        TokenRights::MetricsOnly => ("a metrics token".to_string(), Vec::new(), false, true),
        TokenRights::Tenants { tenants, admin } => {
            let names: Vec<String> = tenants.iter().map(|t| t.name.clone()).collect();
            let who = if admin {
                "an admin token".to_string()
            } else {
                format!("a token of {}", names.join(", "))
            };
            (who, names, admin, false)
        }
    };
    Some(Caller {
        identity: Identity {
            uid: u32::MAX,
            gid: u32::MAX,
            name: who,
            groups: Vec::new(),
        },
        tenants,
        admin,
        // Every handler that admits callers refuses it; `GET /metrics` alone lets it in.
        refused: metrics_only.then(|| crate::http::access::METRICS_ONLY.to_string()),
        remote: true,
        unauthenticated: false,
        metrics_only,
        pid: None,
    })
}

/// A caller over TCP with neither a valid token nor a session.
pub fn anonymous() -> Caller {
    Caller {
        identity: Identity {
            uid: u32::MAX,
            gid: u32::MAX,
            name: "anonymous".into(),
            groups: Vec::new(),
        },
        tenants: Vec::new(),
        admin: false,
        refused: None,
        remote: true,
        unauthenticated: true,
        metrics_only: false,
        pid: None,
    }
}

/// The caller of a request over TCP: `Authorization: Bearer TOKEN`, else the session cookie.
pub fn caller_of_request(
    config: &Config,
    sessions: &Sessions,
    headers: &axum::http::HeaderMap,
) -> Caller {
    if let Some(value) = headers.get(axum::http::header::AUTHORIZATION)
        && let Ok(text) = value.to_str()
        && let Some(token) = text.strip_prefix("Bearer ")
    {
        return caller_of_token(config, token.trim()).unwrap_or_else(anonymous);
    }
    session_id(headers)
        .and_then(|id| sessions.get(&id))
        .unwrap_or_else(anonymous)
}

/// The session id in a request's cookies.
pub fn session_id(headers: &axum::http::HeaderMap) -> Option<String> {
    headers
        .get_all(axum::http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, value)| value.to_string())
}

/// The dashboard (its data comes from the API, read by `app.js`).
pub const PAGE: &str = include_str!("web/page.html");
/// The dashboard's script.
pub const SCRIPT: &str = include_str!("web/app.js");

/// The login form, with `message` above it when a login failed.
pub fn login_page(message: Option<&str>) -> String {
    let note = message.map_or(String::new(), |m| {
        format!("<p class=\"err\" role=\"alert\">{}</p>", html_escape(m))
    });
    LOGIN.replace("{{message}}", &note)
}

const LOGIN: &str = include_str!("web/login.html");

/// Text safe inside HTML.
pub fn html_escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&#39;")
}

/// The form's `token` field from an `application/x-www-form-urlencoded` body.
pub fn form_token(body: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(body).ok()?;
    text.split('&')
        .filter_map(|pair| pair.split_once('='))
        .find(|(k, _)| *k == "token")
        .map(|(_, v)| percent_decode(v))
}

fn percent_decode(text: &str) -> String {
    let hex = |b: u8| (b as char).to_digit(16);
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' => {
                match (
                    bytes.get(i + 1).and_then(|&b| hex(b)),
                    bytes.get(i + 2).and_then(|&b| hex(b)),
                ) {
                    (Some(hi), Some(lo)) => {
                        out.push((hi * 16 + lo) as u8);
                        i += 2;
                    }
                    _ => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The page's routes: the dashboard, its script, the login form's post and the logout, with the
/// listener's `sessions`.
pub fn routes(sessions: Arc<Sessions>) -> Router<Arc<Shared>> {
    Router::new()
        .route("/", get(page))
        .route("/app.js", get(script))
        .route("/favicon.ico", get(|| async { StatusCode::NO_CONTENT }))
        .route("/login", post(login))
        .route("/logout", post(logout))
        .layer(Extension(sessions))
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
        return html(StatusCode::OK, login_page(None));
    }
    html(StatusCode::OK, PAGE.to_string())
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
        SCRIPT,
    )
        .into_response()
}

/// The login form's post: a valid token opens a session (a cookie); anything else gets the form
/// again with one sentence.
async fn login(
    AxState(shared): AxState<Arc<Shared>>,
    Extension(sessions): Extension<Arc<Sessions>>,
    Extension(caller): Extension<Caller>,
    tls: Option<Extension<OverTls>>,
    headers: axum::http::HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    if !caller.remote {
        return html(
            StatusCode::BAD_REQUEST,
            login_page(Some(
                "Over the Unix socket the daemon knows you already; the login is for its TCP listener.",
            )),
        );
    }
    let Some(token) = form_token(&body).filter(|t| !t.is_empty()) else {
        return html(StatusCode::BAD_REQUEST, login_page(Some("Give a token.")));
    };
    let Some(who) = caller_of_token(&shared.config, &token) else {
        tracing::warn!("a login with an unknown token was refused");
        return html(
            StatusCode::UNAUTHORIZED,
            login_page(Some(
                "That token is not valid here; ask the daemon's admin for yours.",
            )),
        );
    };
    if who.metrics_only {
        return html(
            StatusCode::FORBIDDEN,
            login_page(Some(
                "That token only reads /metrics (a scraper's); log in with your tenant's token.",
            )),
        );
    }
    let id = match sessions.open(who) {
        Ok(id) => id,
        Err(e) => {
            return html(
                StatusCode::INTERNAL_SERVER_ERROR,
                login_page(Some(&format!("The daemon could not open a session: {e}"))),
            );
        }
    };
    home_with_session(&id, 43200, secure(tls.is_some(), &headers))
}

/// Whether the session cookie is `Secure`: over the listener's own TLS, or through a TLS proxy
/// (`X-Forwarded-Proto: https`). Such a cookie never travels in the clear.
fn secure(over_tls: bool, headers: &axum::http::HeaderMap) -> bool {
    over_tls
        || headers
            .get("x-forwarded-proto")
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"https"))
}

async fn logout(
    Extension(sessions): Extension<Arc<Sessions>>,
    tls: Option<Extension<OverTls>>,
    headers: axum::http::HeaderMap,
) -> Response {
    if let Some(id) = session_id(&headers) {
        sessions.close(&id);
    }
    home_with_session("", 0, secure(tls.is_some(), &headers))
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
                    COOKIE,
                    if secure { "; Secure" } else { "" }
                ),
            ),
        ],
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forms_and_cookies() {
        assert_eq!(form_token(b"token=a%2Bb+c&x=1").as_deref(), Some("a+b c"));
        assert_eq!(form_token(b"token=%zz").as_deref(), Some("%zz"));
        assert_eq!(form_token(b"nothing=1"), None);
        let mut headers = axum::http::HeaderMap::new();
        headers.insert(
            axum::http::header::COOKIE,
            "a=1; orch_session=abc; b=2".parse().unwrap(),
        );
        assert_eq!(session_id(&headers).as_deref(), Some("abc"));
        assert_eq!(
            html_escape("<a href=\"x\">"),
            "&lt;a href=&quot;x&quot;&gt;"
        );
        assert!(login_page(Some("<b>")).contains("&lt;b&gt;"));
    }

    /// What the API says (a job's name, a reason) reaches the page as text, never as HTML; a
    /// long name is cut with an ellipsis and whole in its tooltip, so the columns stay in view.
    #[test]
    fn the_page_inserts_text_only_and_cuts_long_names() {
        for sink in [
            "innerHTML",
            "outerHTML",
            "insertAdjacentHTML",
            "document.write",
            "DOMParser",
            "eval(",
            "new Function",
        ] {
            assert!(!SCRIPT.contains(sink), "app.js uses {sink}");
        }
        assert!(SCRIPT.contains(
            "cell(tr, \"Name\", clip(j.name + (j.alloc ? \" (interactive alloc)\" : j.interactive"
        ));
        // A task of a job array is named as the CLI names it: ARRAY[TASK].
        assert!(SCRIPT.contains("j.array_id + \"[\" + j.array_task + \"]\""));
        assert!(SCRIPT.contains("s.title = "));
        assert!(PAGE.contains(".clip{display:inline-block;max-width:16rem"));
        assert!(PAGE.contains("text-overflow:ellipsis"));
    }
}
