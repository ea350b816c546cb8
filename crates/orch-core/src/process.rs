//! What `/proc` says of a process: the one reader of `/proc/PID/stat` that orch has, used by the
//! lease holders (is it alive, is its group) and the memory watch (which processes are a job's).

use std::path::Path;

/// The fields of `/proc/PID/stat` orch reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcStat {
    /// `R`, `S`, `D`, `Z` (zombie), `X` (dead), ...
    pub state: char,
    pub ppid: u32,
    /// The process group.
    pub pgrp: u32,
    /// Start time in clock ticks after boot: with the pid, it names one process for good.
    pub start_time: u64,
}

impl ProcStat {
    /// Runs or sleeps (not a zombie waiting to be reaped).
    pub fn is_running(&self) -> bool {
        self.state != 'Z' && self.state != 'X'
    }
}

/// `/proc` could not say whether a process exists: it could not be read for a reason other than
/// "no such process" (no file descriptor left, no memory, ...). A caller must not take such a
/// process for dead: that would end a running job and hand its devices to another.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unknown(pub String);

impl std::fmt::Display for Unknown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Unknown {}

/// Reads `/proc/PID/stat` (through `procfs`, which parses command names holding spaces and
/// parentheses correctly); `None` when no such process exists, or when `/proc` cannot be read
/// (see [`probe`] where the difference matters).
pub fn stat(pid: u32) -> Option<ProcStat> {
    probe(pid).ok().flatten()
}

/// Reads `/proc/PID/stat`: `Ok(None)` when no such process exists, `Err` when `/proc` cannot
/// tell (any failure other than "not found" or "no such process").
pub fn probe(pid: u32) -> Result<Option<ProcStat>, Unknown> {
    let Ok(pid) = i32::try_from(pid) else {
        return Ok(None);
    };
    let known = |result: procfs::ProcResult<procfs::process::Stat>| match result {
        Ok(stat) => Ok(of(&stat)),
        Err(procfs::ProcError::NotFound(_)) => Ok(None),
        Err(e) => Err(Unknown(format!("cannot read /proc/{pid}/stat: {e}"))),
    };
    match procfs::process::Process::new(pid) {
        Ok(process) => known(process.stat()),
        Err(procfs::ProcError::NotFound(_)) => Ok(None),
        Err(e) => Err(Unknown(format!("cannot read /proc/{pid}: {e}"))),
    }
}

fn of(stat: &procfs::process::Stat) -> Option<ProcStat> {
    Some(ProcStat {
        state: stat.state,
        ppid: u32::try_from(stat.ppid).ok()?,
        pgrp: u32::try_from(stat.pgrp).ok()?,
        start_time: stat.starttime,
    })
}

/// Every process in `/proc` with its stat.
pub fn all() -> Vec<(u32, ProcStat)> {
    let Ok(processes) = procfs::process::all_processes() else {
        return Vec::new();
    };
    processes
        .flatten()
        .filter_map(|p| {
            let stat = p.stat().ok()?;
            Some((u32::try_from(stat.pid).ok()?, of(&stat)?))
        })
        .collect()
}

/// Some process of group `pgid` runs (zombies do not count: an orphan that died stays a zombie in
/// its group until whatever adopted it reaps it). False also when `/proc` cannot be read; see
/// [`probe_group`].
pub fn group_running(pgid: u32) -> bool {
    probe_group(pgid).unwrap_or(false)
}

/// Whether some process of group `pgid` runs, or `Err` when `/proc` cannot be listed or one of
/// its entries cannot be read for a reason other than the process having gone meanwhile.
pub fn probe_group(pgid: u32) -> Result<bool, Unknown> {
    let Ok(group) = i32::try_from(pgid) else {
        return Ok(false);
    };
    if group <= 1 {
        return Ok(false);
    }
    // No process at all in the group, zombies included: nothing to look through. (EPERM means
    // members this process may not signal, which still count.)
    // SAFETY: signal 0 checks for existence and permission; it delivers nothing.
    if unsafe { libc::kill(-group, 0) } != 0
        && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
    {
        return Ok(false);
    }
    // Most often the group's leader itself still runs: one read instead of a walk of /proc.
    if let Ok(Some(leader)) = probe(pgid)
        && leader.pgrp == pgid
        && leader.is_running()
    {
        return Ok(true);
    }
    let processes =
        procfs::process::all_processes().map_err(|e| Unknown(format!("cannot list /proc: {e}")))?;
    for process in processes {
        let stat = match process.and_then(|p| p.stat()) {
            Ok(stat) => stat,
            Err(procfs::ProcError::NotFound(_)) => continue,
            Err(e) => return Err(Unknown(format!("cannot read /proc: {e}"))),
        };
        if let Some(s) = of(&stat)
            && s.pgrp == pgid
            && s.is_running()
        {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Process `pid`'s cgroup on the v2 hierarchy (the `0::PATH` line of `/proc/PID/cgroup`).
pub fn cgroup_v2_of(pid: u32) -> Option<String> {
    let process = procfs::process::Process::new(i32::try_from(pid).ok()?).ok()?;
    process
        .cgroups()
        .ok()?
        .into_iter()
        .find(|c| c.hierarchy == 0)
        .map(|c| c.pathname)
}

/// The folder of process `pid`'s cgroup on the v2 hierarchy: the mount joined with its
/// `/proc/PID/cgroup` path.
pub fn cgroup_v2_dir(pid: u32) -> Option<std::path::PathBuf> {
    let own = cgroup_v2_of(pid)?;
    Some(cgroup_v2_mount()?.join(own.trim_start_matches('/')))
}

/// Where the cgroup v2 hierarchy is mounted (`/sys/fs/cgroup`, or `/sys/fs/cgroup/unified` on
/// hybrid systems), from this process's mount table.
pub fn cgroup_v2_mount() -> Option<std::path::PathBuf> {
    let process = procfs::process::Process::myself().ok()?;
    process
        .mountinfo()
        .ok()?
        .into_iter()
        .find(|m| m.fs_type == "cgroup2")
        .map(|m| m.mount_point)
}

/// The character major of NVIDIA's device nodes: `/dev/nvidiaN` is `195:N` for the GPU whose
/// minor number is N (0..=253), `nvidia-modeset` is `195:254`, `nvidiactl` is `195:255`.
pub const NVIDIA_MAJOR: u32 = 195;

/// The highest minor number a GPU's node has; 254 and 255 are the control nodes every job shares.
pub const MAX_GPU_MINOR: u32 = 253;

/// Where the cgroup v1 hierarchy that carries `controller` (`devices`, ...) is mounted, when one is
/// (`/sys/fs/cgroup/devices` on v1 and hybrid systems; none on a v2-only system).
pub fn cgroup_v1_mount(controller: &str) -> Option<std::path::PathBuf> {
    v1_mount(controller).map(|(mount_point, _)| mount_point)
}

/// The folder of process `pid`'s cgroup in the v1 hierarchy that carries `controller`: the mount
/// point joined with the `/proc/PID/cgroup` path (less the mount's own root, inside a container
/// whose mount shows only its part of the hierarchy).
pub fn cgroup_v1_dir(pid: u32, controller: &str) -> Option<std::path::PathBuf> {
    let (mount_point, root) = v1_mount(controller)?;
    let process = procfs::process::Process::new(i32::try_from(pid).ok()?).ok()?;
    let path = process
        .cgroups()
        .ok()?
        .into_iter()
        .find(|c| c.hierarchy != 0 && c.controllers.iter().any(|n| n == controller))?
        .pathname;
    let inside = Path::new(&path).strip_prefix(&root).ok()?;
    Some(mount_point.join(inside))
}

/// The v1 mount of `controller`: (mount point, root of the hierarchy it shows).
fn v1_mount(controller: &str) -> Option<(std::path::PathBuf, String)> {
    let process = procfs::process::Process::myself().ok()?;
    process
        .mountinfo()
        .ok()?
        .into_iter()
        .find(|m| m.fs_type == "cgroup" && m.super_options.contains_key(controller))
        .map(|m| (m.mount_point, m.root))
}

/// The pids a cgroup's `cgroup.procs` lists (v1 or v2); none when it cannot be read.
pub fn cgroup_procs(dir: &Path) -> Vec<u32> {
    std::fs::read_to_string(dir.join("cgroup.procs"))
        .map(|text| text.lines().filter_map(|l| l.trim().parse().ok()).collect())
        .unwrap_or_default()
}

/// A cgroup v2 folder's `cgroup.events` says `populated 1`. False also when it cannot be read;
/// see [`probe_cgroup`].
pub fn cgroup_populated(dir: &Path) -> bool {
    probe_cgroup(dir).unwrap_or(false)
}

/// Whether a cgroup v2 folder holds a process: `Ok(false)` when the folder is gone, `Err` when
/// its `cgroup.events` cannot be read for another reason.
pub fn probe_cgroup(dir: &Path) -> Result<bool, Unknown> {
    let path = dir.join("cgroup.events");
    match std::fs::read_to_string(&path) {
        Ok(text) => Ok(text.lines().any(|line| line.trim() == "populated 1")),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(Unknown(format!("cannot read {}: {e}", path.display()))),
    }
}

/// Sends `signal` to process `pid`; true when it was delivered. The caller has verified that
/// `pid` is the process it means (by its start time): a pid alone may have been handed out again.
pub fn signal(pid: u32, signal: i32) -> bool {
    let Ok(pid) = i32::try_from(pid) else {
        return false;
    };
    if pid <= 1 {
        return false;
    }
    // SAFETY: kill(2) has no memory-safety preconditions; the pid is positive and not init.
    unsafe { libc::kill(pid, signal) == 0 }
}

/// Sends `signal` to every process of group `pgid`; true when it was delivered.
pub fn signal_group(pgid: u32, signal: i32) -> bool {
    let Ok(pgid) = i32::try_from(pgid) else {
        return false;
    };
    if pgid <= 1 {
        return false;
    }
    // SAFETY: kill(2) with a negative pid signals a group; no memory-safety preconditions.
    unsafe { libc::kill(-pgid, signal) == 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_with_spaces_and_parentheses() {
        let dir = std::env::temp_dir().join(format!("orch-proc-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let odd = dir.join("my (odd) name");
        let _ = std::fs::remove_file(&odd);
        std::os::unix::fs::symlink("/bin/sleep", &odd).unwrap();
        let mut child = std::process::Command::new(&odd).arg("5").spawn().unwrap();
        let s = stat(child.id()).unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(s.ppid, std::process::id());
        assert!(s.is_running() && s.start_time > 0);
        assert!(all().iter().any(|(pid, _)| *pid == std::process::id()));
    }

    #[test]
    fn a_v1_cgroup_folder_lists_this_process() {
        // On a v2-only system there is no v1 devices hierarchy: nothing to find.
        let Some(dir) = cgroup_v1_dir(std::process::id(), "devices") else {
            assert!(
                cgroup_v1_mount("devices").is_none(),
                "a devices hierarchy is mounted but this process's folder in it was not found"
            );
            return;
        };
        assert!(dir.starts_with(cgroup_v1_mount("devices").unwrap()));
        assert!(
            cgroup_procs(&dir).contains(&std::process::id()),
            "{}",
            dir.display()
        );
    }

    #[test]
    fn this_process_runs() {
        let me = stat(std::process::id()).unwrap();
        assert!(me.is_running() && me.start_time > 0);
        assert!(stat(u32::MAX - 7).is_none());
    }
}
