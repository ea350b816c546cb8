//! The calling process as the home of a job's work, for work that runs inside orch rather than in
//! a program it starts (a `[train]` job's trainer in the daemon's supervisor, when the job's user
//! is the supervisor's own): the same confinement a started process gets between fork and exec
//! (its cgroup, its CPU binding, its output in its capped logs), applied to this process and
//! undone when the work ends. Another user's work never runs here: it runs in a process started
//! as that user, with that user's ids in full.

use crate::bind::{CpuBinding, PreparedBinding};
use crate::logs::{CappedLog, LogCap};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// Binds the calling thread, and every thread it starts afterwards, to `binding`'s CPUs, its
/// memory preferred from their nodes: what a started process gets before exec. Affinity and
/// memory policy are per thread, so this comes before the work starts its threads.
pub fn bind_this_thread(binding: &CpuBinding) -> std::io::Result<()> {
    PreparedBinding::new(binding).apply()
}

/// This process moved into a cgroup (a job's own): [`CgroupStay::leave`] moves it back to where
/// it was, so the job's cgroup can be read and removed.
#[derive(Debug)]
pub struct CgroupStay {
    home: PathBuf,
}

/// Moves this process (all its threads) into the cgroup at `dir`.
pub fn join_cgroup(dir: &Path) -> std::io::Result<CgroupStay> {
    let pid = std::process::id();
    let home = orch_core::process::cgroup_v2_dir(pid).ok_or_else(|| {
        std::io::Error::other("this process's own cgroup (v2) cannot be read from /proc")
    })?;
    std::fs::write(dir.join("cgroup.procs"), pid.to_string())?;
    Ok(CgroupStay { home })
}

impl CgroupStay {
    /// Moves this process back into the cgroup it came from.
    pub fn leave(self) -> std::io::Result<()> {
        std::fs::write(
            self.home.join("cgroup.procs"),
            std::process::id().to_string(),
        )
    }
}

/// One of a job's log files, written from this process under the same cap and free-space
/// reserve as a started job's output ([`crate::logs`]): what is written goes through a pipe to a
/// copier thread started here, so the file is handled with this thread's credentials (root's in
/// a supervisor) whoever writes. Clones write to the same pipe; [`LogCopy::finish`] waits for
/// the copy once every clone is dropped.
#[derive(Debug, Clone)]
pub struct LogWriter(Arc<Mutex<std::io::PipeWriter>>);

/// The copier of a [`LogWriter`].
#[derive(Debug)]
pub struct LogCopy(crate::logs::Copiers);

impl LogWriter {
    /// Opens (creates) `path`, output going on after what it holds, and starts its copier.
    pub fn open(path: &Path, cap: LogCap) -> std::io::Result<(LogWriter, LogCopy)> {
        let log = CappedLog::open(path, cap)?;
        let (reader, writer) = std::io::pipe()?;
        let copy = crate::logs::Copiers::start(vec![(reader, log)]);
        Ok((LogWriter(Arc::new(Mutex::new(writer))), LogCopy(copy)))
    }
}

impl LogCopy {
    /// Waits, at most `patience`, for what was written to reach the file (every writer dropped).
    pub fn finish(self, patience: std::time::Duration) {
        self.0.finish(patience);
    }
}

impl Write for LogWriter {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        orch_core::sync::lock(&self.0).write(data)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        orch_core::sync::lock(&self.0).flush()
    }
}

impl LogWriter {
    /// Sends what this process writes to its stderr (fd 2: tracing's lines, a panic's message)
    /// into this log until the returned value is dropped, which puts the earlier stderr back.
    pub fn take_stderr(&self) -> std::io::Result<StderrTaken> {
        use std::os::fd::AsRawFd;
        // SAFETY: dup of fd 2, which this process holds open; the result is checked.
        let saved = unsafe { libc::dup(libc::STDERR_FILENO) };
        if saved < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let writer = orch_core::sync::lock(&self.0);
        // SAFETY: both descriptors are open: the pipe's (held by `writer`) and fd 2.
        if unsafe { libc::dup2(writer.as_raw_fd(), libc::STDERR_FILENO) } < 0 {
            let e = std::io::Error::last_os_error();
            // SAFETY: `saved` is ours, from the dup above.
            unsafe { libc::close(saved) };
            return Err(e);
        }
        Ok(StderrTaken { saved })
    }
}

/// This process's stderr taken into a job's log ([`LogWriter::take_stderr`]); dropped, the
/// earlier stderr comes back (and the pipe's copy on fd 2 is closed with it, so the log's copier
/// can finish).
#[derive(Debug)]
pub struct StderrTaken {
    saved: libc::c_int,
}

impl Drop for StderrTaken {
    fn drop(&mut self) {
        // SAFETY: `saved` is the duplicate of the earlier stderr this value owns.
        unsafe {
            libc::dup2(self.saved, libc::STDERR_FILENO);
            libc::close(self.saved);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_log_writer_keeps_its_cap() {
        let dir = std::env::temp_dir().join(format!("orch-current-log-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("stdout");
        let cap = LogCap {
            max_bytes: 100,
            reserve_bytes: 0,
        };
        let (mut a, copy) = LogWriter::open(&path, cap).unwrap();
        let mut b = a.clone();
        for i in 0..100 {
            writeln!(a, "line {i}").unwrap();
            writeln!(b, "again {i}").unwrap();
        }
        drop((a, b));
        copy.finish(std::time::Duration::from_secs(5));
        let kept = std::fs::metadata(&path).unwrap().len();
        assert!(kept <= 50, "half the cap in the current file, found {kept}");
        assert!(
            std::fs::read_to_string(&path)
                .unwrap()
                .ends_with("again 99\n")
        );
        assert!(crate::logs::dropped(&path) > 0);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
