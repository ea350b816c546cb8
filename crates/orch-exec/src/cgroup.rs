//! A job's own cgroup (v2): every process the job starts stays in it, whatever it does with
//! process groups and sessions, so orch can tell when the last one ended and end them all at once.
//!
//! Where: a child of the cgroup orch itself runs in, on the cgroup2 mount (`/sys/fs/cgroup`, or
//! `/sys/fs/cgroup/unified` on hybrid systems). Creating one needs write access there: root, or a
//! delegated subtree (systemd's `Delegate=yes`). Where orch may not create one, the job is tracked
//! by its process groups instead (see `orch-leases`' holders); nothing fails.

use std::path::{Path, PathBuf};

/// Whether `ORCH_CGROUPS=off` turned job cgroups off for this process.
pub fn disabled() -> bool {
    std::env::var("ORCH_CGROUPS").is_ok_and(|v| v == "off")
}

/// The cgroup of one job; removed (after its processes are gone) when dropped.
#[derive(Debug)]
pub struct JobCgroup {
    path: PathBuf,
}

impl JobCgroup {
    /// Creates `orch-job-NAME` under this process's own cgroup, if this machine and these
    /// permissions allow it and `ORCH_CGROUPS` is not `off`.
    pub fn create(name: &str) -> Option<JobCgroup> {
        if disabled() {
            return None;
        }
        let path = orch_core::process::cgroup_v2_dir(std::process::id())?
            .join(format!("orch-job-{}", safe_name(name)));
        match std::fs::create_dir(&path) {
            Ok(()) => Some(JobCgroup { path }),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Some(JobCgroup { path }),
            Err(e) => {
                tracing::debug!("no cgroup for job {name} ({}): {e}", path.display());
                None
            }
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// What the job's processes used, as the cgroup counted it (read before it is removed).
    pub fn usage(&self) -> CgroupUsage {
        usage_of(&self.path)
    }
}

/// What the processes of a cgroup used: CPU time (`cpu.stat`'s `usage_usec`, always there on
/// v2) and the peak of their memory (`memory.peak`, where the memory controller runs there;
/// Linux 5.19 and later). `None` for what the cgroup does not tell.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CgroupUsage {
    pub cpu_seconds: Option<f64>,
    pub peak_memory_bytes: Option<u64>,
}

/// [`CgroupUsage`] of the cgroup at `dir`.
pub fn usage_of(dir: &Path) -> CgroupUsage {
    let cpu_seconds = std::fs::read_to_string(dir.join("cpu.stat"))
        .ok()
        .and_then(|text| {
            text.lines().find_map(|line| {
                let micros = line.strip_prefix("usage_usec ")?;
                micros.trim().parse::<u64>().ok()
            })
        })
        .map(|micros| micros as f64 / 1e6);
    let peak_memory_bytes = std::fs::read_to_string(dir.join("memory.peak"))
        .ok()
        .and_then(|text| text.trim().parse::<u64>().ok());
    CgroupUsage {
        cpu_seconds,
        peak_memory_bytes,
    }
}

impl Drop for JobCgroup {
    fn drop(&mut self) {
        // Fails while a process is left, which the launcher has already ended; harmless then.
        let _ = std::fs::remove_dir(&self.path);
    }
}

/// `name` as a cgroup folder's name: letters, digits, `-` and `_`; anything else becomes `-`.
pub(crate) fn safe_name(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '-'
            }
        })
        .collect()
}

/// Makes the next move of a process into a cgroup cheap, from a thread of its own.
///
/// Why: moving a process into a cgroup takes the kernel's cgroup write lock, whose first taker
/// after a quiet spell waits for an RCU grace period: 6-15 ms measured here, on the path from a
/// job's placement to its first instruction. A move made within about a grace period after
/// another one is fast (0.3 ms measured). So the daemon, when it places a job, moves itself into
/// the cgroup it is already in (which changes nothing) on a background thread, while it commits
/// the job and starts its supervisor; the job's own move then takes the fast path.
pub fn prime_migration() {
    if disabled() {
        return;
    }
    let _ = std::thread::Builder::new()
        .name("orch-cgroup-prime".into())
        .spawn(|| {
            let pid = std::process::id();
            let Some(own) = orch_core::process::cgroup_v2_dir(pid) else {
                return;
            };
            let _ = std::fs::write(own.join("cgroup.procs"), pid.to_string());
        });
}

/// Kills every process in the cgroup (`cgroup.kill`, Linux 5.14+; else SIGKILL one by one).
pub fn kill(dir: &Path) {
    if std::fs::write(dir.join("cgroup.kill"), "1").is_err() {
        signal_all(dir, libc::SIGKILL);
    }
}

/// Sends `signal` to every process in the cgroup.
pub fn signal_all(dir: &Path, signal: i32) {
    let Ok(text) = std::fs::read_to_string(dir.join("cgroup.procs")) else {
        return;
    };
    for pid in text.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
        // SAFETY: kill(2) on a process of the job's own cgroup.
        unsafe {
            libc::kill(pid, signal);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cgroups_usage_is_its_cpu_time_and_memory_peak_where_it_tells_them() {
        let dir = std::env::temp_dir().join(format!("orch-cgroup-usage-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        assert_eq!(usage_of(&dir), CgroupUsage::default());
        std::fs::write(
            dir.join("cpu.stat"),
            "usage_usec 2500000\nuser_usec 2000000\nsystem_usec 500000\n",
        )
        .unwrap();
        assert_eq!(
            usage_of(&dir),
            CgroupUsage {
                cpu_seconds: Some(2.5),
                peak_memory_bytes: None
            }
        );
        std::fs::write(dir.join("memory.peak"), "1048576\n").unwrap();
        assert_eq!(usage_of(&dir).peak_memory_bytes, Some(1 << 20));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_job_cgroup_holds_its_processes_until_they_end() {
        let Some(cgroup) = JobCgroup::create(&format!("test-{}", std::process::id())) else {
            // Not root, or no cgroup2 mount: the process-group fallback is tested elsewhere.
            assert!(
                std::env::var_os("ORCH_REQUIRE_CGROUP").is_none(),
                "ORCH_REQUIRE_CGROUP is set but no cgroup could be created"
            );
            return;
        };
        let procs = cgroup.path().join("cgroup.procs");
        let mut child = std::process::Command::new("sh")
            .args([
                "-c",
                &format!("echo 0 > {} && exec sleep 30", procs.display()),
            ])
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while !orch_core::process::cgroup_populated(cgroup.path()) {
            assert!(
                std::time::Instant::now() < deadline,
                "the child never joined"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        kill(cgroup.path());
        child.wait().unwrap();
        assert!(!orch_core::process::cgroup_populated(cgroup.path()));
    }
}
