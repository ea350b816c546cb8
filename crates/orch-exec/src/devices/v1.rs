//! The cgroup v1 `devices` controller: a child cgroup of this process's own devices cgroup whose
//! `devices.deny` holds one `c 195:M rwm` line per denied minor.
//!
//! Why one line per minor: a child cgroup starts in the parent's default-allow mode, and there an
//! allow only removes an exact deny exception, so denying `c 195:*` and then allowing the granted
//! minors leaves every GPU denied (measured). Denying each other minor works: the granted node
//! opens, the others fail with EPERM, and every process started inside inherits the cgroup.

use super::DeviceRule;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A devices cgroup orch made; see [`super::DeviceConstraint`] for when it goes.
#[derive(Debug)]
pub(crate) struct DevicesCgroup {
    /// `orch-NAME`, a child of the devices cgroup it was made in.
    dir: PathBuf,
}

/// The folder of `orch-NAME` under this process's own devices cgroup, and that parent.
pub(crate) fn place(name: &str) -> Result<(PathBuf, PathBuf), String> {
    let parent = orch_core::process::cgroup_v1_dir(std::process::id(), "devices")
        .ok_or("cannot find this process's cgroup in the v1 devices hierarchy")?;
    let dir = parent.join(format!("orch-{}", crate::cgroup::safe_name(name)));
    Ok((dir, parent))
}

impl DevicesCgroup {
    /// Creates `orch-NAME` with `rule`. A folder of that name left by an earlier process is
    /// removed first; one that still holds a process is refused (its rule is someone else's).
    pub(crate) fn create(name: &str, rule: &DeviceRule) -> Result<DevicesCgroup, String> {
        let (dir, _) = place(name)?;
        if let Err(e) = std::fs::create_dir(&dir) {
            if e.kind() != std::io::ErrorKind::AlreadyExists {
                return Err(format!(
                    "cannot create the devices cgroup {}: {e}",
                    dir.display()
                ));
            }
            std::fs::remove_dir(&dir)
                .and_then(|()| std::fs::create_dir(&dir))
                .map_err(|e| {
                    format!(
                        "the devices cgroup {} exists and cannot be made again: {e}",
                        dir.display()
                    )
                })?;
        }
        let cgroup = DevicesCgroup { dir };
        let deny = cgroup.dir.join("devices.deny");
        // One open for every line: the kernel takes each write as one rule, and some 250
        // opens of the file were most of the cost of confining a job.
        let mut file = match std::fs::OpenOptions::new().write(true).open(&deny) {
            Ok(f) => f,
            Err(e) => {
                cgroup.remove();
                return Err(format!("cannot open {}: {e}", deny.display()));
            }
        };
        for (major, minor) in rule.denied_nodes() {
            let line = format!("c {major}:{minor} rwm");
            if let Err(e) = std::io::Write::write_all(&mut file, line.as_bytes()) {
                let reason = format!("cannot write \"{line}\" to {}: {e}", deny.display());
                drop(file);
                cgroup.remove();
                return Err(reason);
            }
        }
        Ok(cgroup)
    }

    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// Moves process `pid`, all its threads, into the cgroup; what it starts afterwards starts
    /// inside.
    pub(crate) fn add(&self, pid: u32) -> Result<(), String> {
        let procs = self.dir.join("cgroup.procs");
        std::fs::write(&procs, pid.to_string())
            .map_err(|e| format!("cannot move process {pid} into {}: {e}", procs.display()))
    }

    /// Removes the folder once no process is left in it; true when it is gone. A process still
    /// inside keeps it (and its rule) until [`remove_leftover`] or [`DevicesCgroup::lift`].
    pub(crate) fn remove(&self) -> bool {
        remove_dir(&self.dir)
    }

    /// Moves whatever is left back to the parent (the rule no longer applies to it), then
    /// removes the folder.
    pub(crate) fn lift(&self) -> bool {
        match self.dir.parent() {
            Some(parent) => lift(&self.dir, parent),
            None => self.remove(),
        }
    }
}

fn lift(dir: &Path, parent: &Path) -> bool {
    let procs = parent.join("cgroup.procs");
    for pid in orch_core::process::cgroup_procs(dir) {
        if let Err(e) = std::fs::write(&procs, pid.to_string()) {
            tracing::debug!("moving process {pid} back to {}: {e}", procs.display());
        }
    }
    remove_dir(dir)
}

/// `rmdir`, a few times over 100 ms: the last process of a job may still be leaving.
fn remove_dir(dir: &Path) -> bool {
    let until = Instant::now() + Duration::from_millis(100);
    loop {
        match std::fs::remove_dir(dir) {
            Ok(()) => return true,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return true,
            Err(e) if Instant::now() >= until => {
                tracing::debug!("the devices cgroup {} stays: {e}", dir.display());
                return false;
            }
            Err(_) => std::thread::sleep(Duration::from_millis(5)),
        }
    }
}

/// Removes `orch-NAME` if it is there and empty. A process still inside keeps it: the rule stays
/// on it until it ends.
pub(crate) fn remove_leftover(name: &str) -> Result<(), String> {
    let (dir, _) = place(name)?;
    if !dir.exists() || remove_dir(&dir) {
        return Ok(());
    }
    let pids = orch_core::process::cgroup_procs(&dir);
    Err(format!(
        "the devices cgroup {} stays while process(es) {pids:?} run in it (confined to their GPUs until they end)",
        dir.display()
    ))
}
