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

/// Reads `/proc/PID/stat` (through `procfs`, which parses command names holding spaces and
/// parentheses correctly); `None` when no such process exists.
pub fn stat(pid: u32) -> Option<ProcStat> {
    let process = procfs::process::Process::new(i32::try_from(pid).ok()?).ok()?;
    of(&process.stat().ok()?)
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
/// its group until whatever adopted it reaps it).
pub fn group_running(pgid: u32) -> bool {
    pgid > 1 && all().iter().any(|(_, s)| s.pgrp == pgid && s.is_running())
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

/// A cgroup v2 folder's `cgroup.events` says `populated 1`.
pub fn cgroup_populated(dir: &Path) -> bool {
    std::fs::read_to_string(dir.join("cgroup.events"))
        .is_ok_and(|text| text.lines().any(|line| line.trim() == "populated 1"))
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
    fn this_process_runs() {
        let me = stat(std::process::id()).unwrap();
        assert!(me.is_running() && me.start_time > 0);
        assert!(stat(u32::MAX - 7).is_none());
    }
}
