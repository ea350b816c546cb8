//! How a job is stopped: `[job] signal` (a warning signal, that long before its time limit) and
//! `[job] grace` (between the stop signal and SIGKILL). The daemon's supervisor acts on them;
//! docs/SCHEDULING.md has the timeline.

use std::time::Duration;

/// `[job] signal` and `[job] grace`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stopping {
    /// `signal = "USR1@300s"`: the warning signal and how long before the time limit it goes.
    pub signal: Option<WarningSignal>,
    /// `grace = "60s"`: from the stop signal to SIGKILL (the daemon caps it at its `max_grace`;
    /// `None`: the default, [`DEFAULT_GRACE`]).
    pub grace: Option<Duration>,
}

/// The grace period of a job that sets none.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(10);

impl Stopping {
    /// The grace period the job asks for, the default when it sets none.
    pub fn grace_or_default(&self) -> Duration {
        self.grace.unwrap_or(DEFAULT_GRACE)
    }
}

/// A warning signal: which signal, and how long before the job's time limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WarningSignal {
    /// The signal's number (`libc::SIGUSR1`, ...).
    pub number: i32,
    /// How long before the time limit it is sent.
    pub before: Duration,
}

impl WarningSignal {
    /// The signal's name, `SIGUSR1`.
    pub fn name(&self) -> String {
        format!("SIG{}", signal_name(self.number).unwrap_or("?"))
    }

    /// How long after the job starts the warning goes, under `limit`: `limit - before`, or at
    /// once when `before` is the whole limit or more.
    pub fn after_start(&self, limit: Duration) -> Duration {
        limit.saturating_sub(self.before)
    }
}

impl std::fmt::Display for WarningSignal {
    /// As a job file writes it: `USR1@300s`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = signal_name(self.number).unwrap_or("?");
        write!(f, "{name}@{}", humantime::format_duration(self.before))
    }
}

/// The signals a job may be warned with: every signal a process can catch that does not stop
/// it (SIGKILL and SIGSTOP cannot be caught; SIGTSTP, SIGTTIN and SIGTTOU stop a process).
const SIGNALS: &[(&str, i32)] = &[
    ("HUP", libc::SIGHUP),
    ("INT", libc::SIGINT),
    ("QUIT", libc::SIGQUIT),
    ("ABRT", libc::SIGABRT),
    ("USR1", libc::SIGUSR1),
    ("USR2", libc::SIGUSR2),
    ("ALRM", libc::SIGALRM),
    ("TERM", libc::SIGTERM),
    ("CONT", libc::SIGCONT),
    ("URG", libc::SIGURG),
    ("XCPU", libc::SIGXCPU),
    ("VTALRM", libc::SIGVTALRM),
    ("PROF", libc::SIGPROF),
    ("WINCH", libc::SIGWINCH),
    ("PWR", libc::SIGPWR),
];

/// The name of signal `number` without `SIG`, when it is one a job may be warned with.
pub fn signal_name(number: i32) -> Option<&'static str> {
    SIGNALS.iter().find(|(_, n)| *n == number).map(|(s, _)| *s)
}

/// Reads `NAME@DURATION` (`USR1@300s`, `SIGUSR1@5m`); `Err` is the sentence saying what is
/// wrong, for the caller to place (a job file's line, a flag).
pub fn parse_signal(text: &str) -> Result<WarningSignal, String> {
    let Some((name, before)) = text.split_once('@') else {
        return Err(format!(
            "\"{text}\" is not NAME@DURATION: give the signal and how long before the time limit it goes, such as \"USR1@300s\""
        ));
    };
    let bare = name.trim().to_ascii_uppercase();
    let bare = bare.strip_prefix("SIG").unwrap_or(&bare);
    let number = match SIGNALS.iter().find(|(s, _)| *s == bare) {
        Some((_, n)) => *n,
        None if matches!(bare, "KILL" | "STOP") => {
            return Err(format!(
                "SIG{bare} cannot be a warning signal: a process can neither catch nor ignore it; use USR1, USR2 or TERM"
            ));
        }
        None => {
            let names: Vec<&str> = SIGNALS.iter().map(|(s, _)| *s).collect();
            return Err(format!(
                "\"{}\" is not a signal a job can be warned with; use one of {}",
                name.trim(),
                names.join(", ")
            ));
        }
    };
    let before = crate::duration::parse(before).ok_or_else(|| {
        format!(
            "\"{}\" after the @ is not a duration: give how long before the time limit, such as \"300s\" or \"5m\"",
            before.trim()
        )
    })?;
    Ok(WarningSignal { number, before })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_names_with_or_without_sig_and_a_duration() {
        let usr1 = parse_signal("USR1@300s").unwrap();
        assert_eq!(usr1.number, libc::SIGUSR1);
        assert_eq!(usr1.before, Duration::from_secs(300));
        assert_eq!(parse_signal("SIGUSR1@5m").unwrap(), usr1);
        assert_eq!(parse_signal("sigusr1@300").unwrap(), usr1);
        assert_eq!(parse_signal("TERM@1m").unwrap().number, libc::SIGTERM);
        assert_eq!(usr1.to_string(), "USR1@5m");
        assert_eq!(usr1.name(), "SIGUSR1");
        assert_eq!(parse_signal(&usr1.to_string()).unwrap(), usr1);
    }

    #[test]
    fn refuses_what_cannot_warn() {
        let err = |t: &str| parse_signal(t).unwrap_err();
        assert!(err("USR1").contains("NAME@DURATION"), "{}", err("USR1"));
        assert!(err("KILL@5s").starts_with("SIGKILL cannot be a warning signal"));
        assert!(err("SIGSTOP@5s").starts_with("SIGSTOP cannot be a warning signal"));
        assert!(err("USR3@5s").starts_with("\"USR3\" is not a signal"));
        assert!(err("USR1@soon").contains("\"soon\" after the @ is not a duration"));
        assert!(err("USR1@0s").contains("is not a duration"));
    }

    #[test]
    fn the_warning_goes_at_start_when_it_is_longer_than_the_limit() {
        let w = parse_signal("USR1@5s").unwrap();
        assert_eq!(
            w.after_start(Duration::from_secs(8)),
            Duration::from_secs(3)
        );
        assert_eq!(w.after_start(Duration::from_secs(4)), Duration::ZERO);
    }
}
