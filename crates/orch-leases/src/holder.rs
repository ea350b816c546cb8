//! A process that holds a lease, identified by pid and start time so a reused pid is not mistaken
//! for the holder.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Holder {
    pub pid: u32,
    /// Start time in clock ticks after boot (`/proc/PID/stat`, field 22).
    pub start_time: u64,
}

impl Holder {
    /// This process.
    pub fn current() -> Holder {
        let pid = std::process::id();
        Holder {
            pid,
            start_time: start_time(pid).unwrap_or(0),
        }
    }

    /// Process `pid`, if it exists.
    pub fn of_pid(pid: u32) -> Option<Holder> {
        start_time(pid).map(|start_time| Holder { pid, start_time })
    }

    /// True while the same process (same pid, same start time) runs and is not a zombie.
    pub fn is_alive(&self) -> bool {
        match read_stat(self.pid) {
            Some((state, start)) => start == self.start_time && state != 'Z' && state != 'X',
            None => false,
        }
    }
}

fn start_time(pid: u32) -> Option<u64> {
    read_stat(pid).map(|(_, start)| start)
}

/// `(state, starttime)` from `/proc/PID/stat`. The command name may contain spaces and
/// parentheses, so fields are counted after the last `)`.
fn read_stat(pid: u32) -> Option<(char, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &text[text.rfind(')')? + 1..];
    let mut fields = after.split_whitespace();
    let state = fields.next()?.chars().next()?;
    // After the state come fields 4..; starttime is field 22, so 19 further fields on.
    let start = fields.nth(18)?.parse().ok()?;
    Some((state, start))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_alive_and_a_reused_pid_is_not() {
        let me = Holder::current();
        assert!(me.start_time > 0);
        assert!(me.is_alive());
        let impostor = Holder {
            start_time: me.start_time + 1,
            ..me
        };
        assert!(!impostor.is_alive(), "same pid, other start time");
    }

    #[test]
    fn a_finished_process_is_dead() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let holder = Holder::of_pid(child.id()).unwrap_or(Holder {
            pid: child.id(),
            start_time: 0,
        });
        child.wait().unwrap();
        assert!(!holder.is_alive());
    }
}
