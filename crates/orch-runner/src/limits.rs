//! The limits every front end (`orch`, the Python package) gives policy plugins.

use orch_host::Limits;
use std::time::Duration;

/// Overrides the per-decision deadline of policy plugins, in milliseconds.
pub const DEADLINE_ENV: &str = "ORCH_POLICY_DEADLINE_MS";

/// The default limits, with the deadline from `ORCH_POLICY_DEADLINE_MS` when set; a value that
/// is not a positive number of milliseconds is bad input (the sentence says so).
pub fn policy_limits_from_env() -> Result<Limits, String> {
    let mut limits = Limits::default();
    if let Ok(text) = std::env::var(DEADLINE_ENV) {
        let ms: u64 = text
            .trim()
            .parse()
            .ok()
            .filter(|ms| *ms > 0)
            .ok_or_else(|| {
                format!("{DEADLINE_ENV}=\"{text}\" is not a number of milliseconds above 0")
            })?;
        limits.deadline = Duration::from_millis(ms);
    }
    Ok(limits)
}
