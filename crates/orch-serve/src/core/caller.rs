//! Who asks: a user known from the Unix socket's peer credentials, or a token's (or browser
//! session's) tenants over the TCP listener.

use crate::core::users::Identity;

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
    /// Over TCP with one of `metrics_tokens`: it reads `GET /metrics` and nothing else (403).
    pub metrics_only: bool,
    /// The process on the other end of the Unix socket (its peer credentials), when known.
    pub pid: Option<u32>,
}
