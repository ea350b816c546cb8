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

impl Caller {
    /// The tenant a request of this caller counts against: the one it names (which the caller
    /// must be in, or an admin may name), else the caller's first. `place` (the job file) leads
    /// the refusal.
    pub fn tenant_for(
        &self,
        config: &crate::core::config::Config,
        wanted: Option<&str>,
        place: Option<&str>,
    ) -> Result<String, crate::core::admission::Refusal> {
        use crate::core::admission::Refusal;
        match wanted {
            Some(t)
                if self.tenants.iter().any(|c| c == t)
                    || (self.admin && config.tenant(t).is_some()) =>
            {
                Ok(t.to_string())
            }
            Some(t) => {
                let place = place.map_or(String::new(), |p| format!("{p}: "));
                Err(Refusal::Forbidden(format!(
                    "{place}user {} is not in tenant \"{t}\"",
                    self.identity.name
                )))
            }
            None => self.tenants.first().cloned().ok_or_else(|| {
                Refusal::Forbidden(format!(
                    "user {} is in no tenant of this daemon; ask its admin to add them",
                    self.identity.name
                ))
            }),
        }
    }

    /// Whether this caller may see job `row`: an admin, or one of the job's tenant.
    pub fn sees(&self, row: &crate::core::db::JobRow) -> bool {
        self.admin || self.tenants.contains(&row.tenant)
    }
}
