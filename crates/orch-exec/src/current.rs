//! The calling process as the home of a job's work, for work that runs inside orch rather than in
//! a program it starts (a `[train]` job's trainer in the daemon's supervisor): the same
//! confinement a started process gets between fork and exec, applied to this process and undone
//! when the work ends.
//!
//! Design decision: the supervisor keeps root only as its real and saved user id while the work
//! runs ([`Impersonation`]): its effective (and file-system) ids are the job's user's, so every
//! file the work reads or writes is checked and owned as that user's, and the job's user can
//! neither signal nor trace it (both look at the real or saved id, which stay root's). The only
//! code that runs meanwhile is orch's own and the sandboxed Wasm, which has no system calls of its
//! own; once the work ended, orch takes root back for its closing writes (the job folder's
//! records, the lease's release). glibc applies each change to every thread of the process.

use crate::bind::{CpuBinding, PreparedBinding};
use crate::logs::{CappedLog, LogCap};
use crate::spec::Credentials;
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

/// The calling thread acting as another user: its effective (and file-system) user and group
/// ids and its supplementary groups are the user's, its real and saved ids stay root's (see the
/// module's decision). Only this thread changes, and the threads it starts afterwards inherit the
/// change (the kernel keeps credentials per thread; the raw system calls are used because glibc's
/// wrappers would change every thread of the process): the supervisor's own threads, started
/// before, stay root's and keep writing the job's records and logs. Dropped (or
/// [`Impersonation::end`]), root's effective ids and groups come back to this thread.
#[derive(Debug)]
pub struct Impersonation {
    groups: Vec<libc::gid_t>,
    gid: libc::gid_t,
    ended: bool,
}

/// The calling thread acts as the user of `credentials` from now on (needs root).
pub fn impersonate_this_thread(credentials: &Credentials) -> std::io::Result<Impersonation> {
    // SAFETY: getegid takes nothing; getgroups writes at most `n` entries into the buffer sized
    // by the first call.
    let (gid, groups) = unsafe {
        let gid = libc::getegid();
        let n = libc::getgroups(0, std::ptr::null_mut());
        let mut groups = vec![0 as libc::gid_t; usize::try_from(n).unwrap_or(0)];
        let got = libc::getgroups(n.max(0), groups.as_mut_ptr());
        groups.truncate(usize::try_from(got).unwrap_or(0));
        (gid, groups)
    };
    let before = Impersonation {
        groups,
        gid,
        ended: false,
    };
    // Each call needs the privilege the next one gives up: groups and group first, the user last.
    let changed = set_groups(&credentials.groups)
        && set_ids(libc::SYS_setresgid, credentials.gid)
        && set_ids(libc::SYS_setresuid, credentials.uid);
    if !changed {
        let error = std::io::Error::last_os_error();
        drop(before);
        return Err(error);
    }
    Ok(before)
}

/// `setgroups(2)` for the calling thread only.
fn set_groups(groups: &[libc::gid_t]) -> bool {
    // SAFETY: the kernel reads `groups.len()` entries of the live slice.
    unsafe { libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()) == 0 }
}

/// `setresuid(2)` / `setresgid(2)` (by `call`) of the effective id alone, for the calling thread
/// only: the real and saved ids are left as they are (-1).
fn set_ids(call: libc::c_long, effective: u32) -> bool {
    let keep = libc::c_long::from(-1i32);
    // SAFETY: the call takes three plain integers.
    unsafe { libc::syscall(call, keep, libc::c_long::from(effective), keep) == 0 }
}

impl Impersonation {
    /// Takes root's effective ids and groups back.
    pub fn end(mut self) -> std::io::Result<()> {
        self.restore()
    }

    fn restore(&mut self) -> std::io::Result<()> {
        if std::mem::replace(&mut self.ended, true) {
            return Ok(());
        }
        // Root is the real and saved user id throughout, so the effective one may go back to it.
        let restored = set_ids(libc::SYS_setresuid, 0)
            && set_ids(libc::SYS_setresgid, self.gid)
            && set_groups(&self.groups);
        if restored {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    }
}

impl Drop for Impersonation {
    fn drop(&mut self) {
        if let Err(e) = self.restore() {
            tracing::warn!("cannot take root's ids back: {e}");
        }
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

/// Where the job's work moved this process, so that a path which cannot wait for the work to
/// end (its grace period over) writes as root: the calling thread takes root's effective ids
/// back (a no-op for a thread that never gave them up).
pub fn root_again_on_this_thread() -> bool {
    set_ids(libc::SYS_setresuid, 0)
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

    #[test]
    fn an_impersonating_thread_acts_as_the_user_and_the_others_stay_root() {
        // SAFETY: geteuid takes nothing.
        if unsafe { libc::geteuid() } != 0 {
            return;
        }
        let dir = std::env::temp_dir().join(format!("orch-impersonated-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        let file = dir.join("made");
        let seen = std::thread::spawn(move || {
            let who = impersonate_this_thread(&Credentials {
                uid: 65534,
                gid: 65534,
                groups: vec![65534],
            })
            .unwrap();
            // A thread started now inherits the user's ids.
            let child = std::thread::spawn(move || {
                std::fs::write(&file, "x").unwrap();
                // SAFETY: the id getters take nothing.
                unsafe { (libc::getuid(), libc::geteuid()) }
            })
            .join()
            .unwrap();
            who.end().unwrap();
            // SAFETY: as above.
            (child, unsafe { libc::geteuid() })
        })
        .join()
        .unwrap();
        assert_eq!(
            seen,
            ((0, 65534), 0),
            "real id root's, effective the user's, then root again"
        );
        // SAFETY: as above.
        assert_eq!(
            unsafe { libc::geteuid() },
            0,
            "the other threads never changed"
        );
        use std::os::unix::fs::MetadataExt;
        assert_eq!(std::fs::metadata(dir.join("made")).unwrap().uid(), 65534);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
