//! Whether the state folder takes writes. A full disk or a read-only remount is a state the
//! daemon lives through, not a crash: while it lasts, submissions are refused with a sentence
//! (HTTP 503), nothing is declared lost, the writes that failed are kept and made again in order,
//! and devices whose release could not be recorded stay held. The engine probes the folder while
//! it is unwell and catches up as soon as a write succeeds again, with no restart.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Instant;

/// Why writes to the state folder fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// No space left (or over a quota).
    Full,
    /// Mounted read-only, or not writable.
    ReadOnly,
    /// Another I/O failure of the disk.
    Io,
}

impl Fault {
    fn words(self) -> &'static str {
        match self {
            Fault::Full => "full",
            Fault::ReadOnly => "read-only",
            Fault::Io => "failing",
        }
    }

    /// What a late record says about the spell it outlived.
    pub fn past(self) -> &'static str {
        match self {
            Fault::Full => "was full",
            Fault::ReadOnly => "was read-only",
            Fault::Io => "could not be written",
        }
    }
}

/// The fault an I/O error stands for, if it is the state folder's rather than a bug's.
pub fn fault_of_io(e: &std::io::Error) -> Option<Fault> {
    match e.raw_os_error() {
        Some(libc::ENOSPC) | Some(libc::EDQUOT) => Some(Fault::Full),
        Some(libc::EROFS) | Some(libc::EACCES) | Some(libc::EPERM) => Some(Fault::ReadOnly),
        Some(libc::EIO) => Some(Fault::Io),
        _ => None,
    }
}

/// The fault a SQLite error stands for.
pub fn fault_of_sqlite(code: Option<rusqlite::ErrorCode>) -> Option<Fault> {
    use rusqlite::ErrorCode as C;
    match code? {
        C::DiskFull => Some(Fault::Full),
        C::ReadOnly | C::CannotOpen | C::PermissionDenied => Some(Fault::ReadOnly),
        C::SystemIoFailure => Some(Fault::Io),
        _ => None,
    }
}

#[derive(Debug, Clone)]
struct Problem {
    fault: Fault,
    detail: String,
    since: Instant,
}

/// The state folder's health, shared by the API (which refuses submissions while it is unwell)
/// and the engine (which reports faults and probes for recovery).
#[derive(Debug)]
pub struct StateHealth {
    dir: PathBuf,
    problem: Mutex<Option<Problem>>,
}

impl StateHealth {
    pub fn new(dir: &Path) -> StateHealth {
        StateHealth {
            dir: dir.to_path_buf(),
            problem: Mutex::new(None),
        }
    }

    /// A write failed with `fault`. Logged once per spell (and when the fault changes).
    pub fn report(&self, fault: Fault, detail: impl Into<String>) {
        let detail = detail.into();
        let mut problem = orch_core::sync::lock(&self.problem);
        if problem.as_ref().is_some_and(|p| p.fault == fault) {
            return;
        }
        tracing::error!(
            "the state folder {} is {}: {detail}; submissions are refused, finished jobs are recorded and their devices freed once it takes writes again",
            self.dir.display(),
            fault.words()
        );
        *problem = Some(Problem {
            fault,
            detail,
            since: Instant::now(),
        });
    }

    /// Writes succeed again. Logged once, with how long the spell lasted.
    pub fn recovered(&self) {
        let mut problem = orch_core::sync::lock(&self.problem);
        if let Some(p) = problem.take() {
            tracing::info!(
                "the state folder {} takes writes again after {:.1}s; catching up",
                self.dir.display(),
                p.since.elapsed().as_secs_f64()
            );
        }
    }

    /// The current fault, if any.
    pub fn fault(&self) -> Option<Fault> {
        orch_core::sync::lock(&self.problem)
            .as_ref()
            .map(|p| p.fault)
    }

    /// The sentence a refused submission gets while the folder is unwell.
    pub fn refusal(&self) -> Option<String> {
        let problem = orch_core::sync::lock(&self.problem);
        problem.as_ref().map(|p| {
            format!(
                "the state folder {} is {}: {}; the daemon accepts no job until it can record it (free space or make it writable), and jobs already accepted are kept",
                self.dir.display(),
                p.fault.words(),
                p.detail
            )
        })
    }

    /// Whether the folder, and the job folders' folder in it, take a small write now: a file
    /// written, synced and removed in each.
    pub fn probe(&self) -> std::io::Result<()> {
        for dir in [self.dir.clone(), self.dir.join("jobs")] {
            let path = dir.join(".write-probe");
            let result = (|| {
                let mut file = std::fs::File::create(&path)?;
                file.write_all(&[0u8; 4096])?;
                file.sync_all()
            })();
            let _ = std::fs::remove_file(&path);
            result?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_errors_map_to_faults() {
        let e = |code| std::io::Error::from_raw_os_error(code);
        assert_eq!(fault_of_io(&e(libc::ENOSPC)), Some(Fault::Full));
        assert_eq!(fault_of_io(&e(libc::EDQUOT)), Some(Fault::Full));
        assert_eq!(fault_of_io(&e(libc::EROFS)), Some(Fault::ReadOnly));
        assert_eq!(fault_of_io(&e(libc::EIO)), Some(Fault::Io));
        assert_eq!(fault_of_io(&e(libc::ENOENT)), None);
        assert_eq!(
            fault_of_sqlite(Some(rusqlite::ErrorCode::DiskFull)),
            Some(Fault::Full)
        );
        assert_eq!(
            fault_of_sqlite(Some(rusqlite::ErrorCode::ConstraintViolation)),
            None
        );
    }

    #[test]
    fn a_spell_is_reported_until_it_recovers() {
        let dir = std::env::temp_dir().join(format!("orch-health-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::create_dir_all(dir.join("jobs")).unwrap();
        let health = StateHealth::new(&dir);
        assert!(health.refusal().is_none());
        assert!(health.probe().is_ok());
        health.report(Fault::Full, "No space left on device (os error 28)");
        let refusal = health.refusal().unwrap();
        assert!(refusal.contains("is full: No space left"), "{refusal}");
        assert_eq!(health.fault(), Some(Fault::Full));
        health.recovered();
        assert!(health.refusal().is_none());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
