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

/// Reads `/proc/PID/stat`; `None` when no such process exists.
pub fn stat(pid: u32) -> Option<ProcStat> {
    parse_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// Parses a `stat` line. The command name may hold spaces and parentheses, so fields are counted
/// after the last `)`.
pub fn parse_stat(text: &str) -> Option<ProcStat> {
    let mut fields = text[text.rfind(')')? + 1..].split_whitespace();
    let state = fields.next()?.chars().next()?;
    let ppid = fields.next()?.parse().ok()?;
    let pgrp = fields.next()?.parse().ok()?;
    // Fields 6.. follow; starttime is field 22, 16 further fields on.
    let start_time = fields.nth(16)?.parse().ok()?;
    Some(ProcStat {
        state,
        ppid,
        pgrp,
        start_time,
    })
}

/// Every pid in `/proc` with its stat.
pub fn all() -> Vec<(u32, ProcStat)> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| Some((pid, stat(pid)?)))
        .collect()
}

/// Some process of group `pgid` runs (zombies do not count: an orphan that died stays a zombie in
/// its group until whatever adopted it reaps it).
pub fn group_running(pgid: u32) -> bool {
    pgid > 1 && all().iter().any(|(_, s)| s.pgrp == pgid && s.is_running())
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
        let line = "42 (my (odd) name) S 7 42 42 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 123456 0 0";
        let s = parse_stat(line).unwrap();
        assert_eq!(
            (s.state, s.ppid, s.pgrp, s.start_time),
            ('S', 7, 42, 123456)
        );
    }

    #[test]
    fn this_process_runs() {
        let me = stat(std::process::id()).unwrap();
        assert!(me.is_running() && me.start_time > 0);
        assert!(stat(u32::MAX - 7).is_none());
    }
}
