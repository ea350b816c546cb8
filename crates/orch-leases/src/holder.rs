//! What keeps a lease alive: a process, identified by pid and start time so a reused pid is not
//! mistaken for the holder, and optionally the whole job it started (its process group, or its
//! cgroup), so that a grandchild that outlives its parent still holds the devices it uses.

use orch_core::process;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Holder {
    pub pid: u32,
    /// Start time in clock ticks after boot (`/proc/PID/stat`, field 22).
    pub start_time: u64,
    /// The host name of the machine the process runs on, for people (`orch leases`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// The machine (`/etc/machine-id`, stable across renames). A holder on another machine cannot
    /// be checked from this one, so it is never taken for dead (a state folder on a shared home
    /// must not let machine B reclaim machine A's leases). Absent in older leases, which are
    /// judged by `host` instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine: Option<String>,
    /// The boot (`/proc/sys/kernel/random/boot_id`): a holder of an earlier boot of this machine
    /// is dead, whatever now runs under its pid or group id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot: Option<String>,
    /// The job's process group: alive while any process of the group lives, even after `pid`
    /// (its leader) has exited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pgid: Option<u32>,
    /// The job's own cgroup (v2) folder: alive while the cgroup holds any process. A process
    /// cannot leave a cgroup by itself the way it can leave a process group (`setsid`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<PathBuf>,
}

impl Holder {
    /// This process.
    pub fn current() -> Holder {
        let pid = std::process::id();
        Holder {
            pid,
            start_time: start_time(pid).unwrap_or(0),
            host: this_host(),
            machine: this_machine(),
            boot: this_boot(),
            pgid: None,
            cgroup: None,
        }
    }

    /// Process `pid`, if it exists.
    pub fn of_pid(pid: u32) -> Option<Holder> {
        start_time(pid).map(|start_time| Holder {
            pid,
            start_time,
            host: this_host(),
            machine: this_machine(),
            boot: this_boot(),
            pgid: None,
            cgroup: None,
        })
    }

    /// Process `pid` and, with it, the process group it leads: the holder lives while any
    /// process of the group does.
    pub fn of_group_leader(pid: u32) -> Option<Holder> {
        Holder::of_pid(pid).map(|h| Holder {
            pgid: Some(pid),
            ..h
        })
    }

    /// Whether `other` names the same process (pid and start time, on the same machine and
    /// boot), whatever group or cgroup either records with it.
    pub fn same_process(&self, other: &Holder) -> bool {
        self.pid == other.pid
            && self.start_time == other.start_time
            && self.machine == other.machine
            && self.boot == other.boot
    }

    /// The same holder, alive also while `cgroup` holds a process.
    pub fn with_cgroup(self, cgroup: Option<PathBuf>) -> Holder {
        Holder { cgroup, ..self }
    }

    /// True while the holder may still use its devices: the same process (pid and start time)
    /// runs and is not a zombie, or its process group or cgroup still has a member, or it runs on
    /// another machine (which this one cannot check), or `/proc` cannot tell right now (see
    /// [`Holder::liveness`]). A holder of an earlier boot is dead.
    pub fn is_alive(&self) -> bool {
        !self.liveness().is_dead()
    }

    /// Alive, dead, or unknown: [`Holder::is_alive`] with the reason `/proc` could not tell.
    pub fn liveness(&self) -> Liveness {
        if self.elsewhere() {
            return Liveness::Alive;
        }
        if self.boot.is_some() && self.boot != this_boot() {
            return Liveness::Dead;
        }
        let mut unknown = None;
        if let Some(cgroup) = self.cgroup.as_deref() {
            match process::probe_cgroup(cgroup) {
                Ok(true) => return Liveness::Alive,
                Ok(false) => {}
                Err(e) => unknown = Some(e),
            }
        }
        match self.group_liveness() {
            Liveness::Alive => return Liveness::Alive,
            Liveness::Dead => {}
            Liveness::Unknown(e) => unknown = Some(e),
        }
        match self.process_liveness() {
            Liveness::Alive => Liveness::Alive,
            Liveness::Dead => unknown.map_or(Liveness::Dead, Liveness::Unknown),
            other => other,
        }
    }

    /// The holder runs on another machine.
    fn elsewhere(&self) -> bool {
        match (&self.machine, this_machine()) {
            (Some(theirs), Some(ours)) => *theirs != ours,
            _ => self
                .host
                .as_ref()
                .is_some_and(|theirs| this_host().is_some_and(|ours| ours != *theirs)),
        }
    }

    /// The holder's process group still has a running member, and is the same group: a group id
    /// is a pid, and the kernel does not hand out a pid while a group of that id exists, so when
    /// its leader (`pid`) now names a process with another start time, the group is a new one.
    /// Only then may the group be signalled in the job's name. False when `/proc` cannot tell.
    pub fn group_alive(&self) -> bool {
        self.group_liveness() == Liveness::Alive
    }

    /// [`Holder::group_alive`], three-valued.
    pub fn group_liveness(&self) -> Liveness {
        let Some(pgid) = self.pgid else {
            return Liveness::Dead;
        };
        if self.boot.is_some() && self.boot != this_boot() {
            return Liveness::Dead;
        }
        if pgid == self.pid {
            match process::probe(pgid) {
                Ok(Some(s)) if s.start_time != self.start_time => return Liveness::Dead,
                Ok(_) => {}
                Err(e) => return Liveness::Unknown(e),
            }
        }
        group_has_members(pgid)
    }

    /// The process itself (not its group) runs. False when `/proc` cannot tell.
    pub fn process_alive(&self) -> bool {
        self.process_liveness() == Liveness::Alive
    }

    /// [`Holder::process_alive`], three-valued: unknown when `/proc` cannot be read for a reason
    /// other than "no such process" (no file descriptor left, say).
    pub fn process_liveness(&self) -> Liveness {
        match process::probe(self.pid) {
            Ok(Some(s)) if s.start_time == self.start_time && s.is_running() => Liveness::Alive,
            Ok(_) => Liveness::Dead,
            Err(e) => Liveness::Unknown(e),
        }
    }
}

/// Whether a holder still lives. `Unknown` never ends a job or frees a lease: the caller keeps
/// things as they are and asks again later.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Liveness {
    Alive,
    Dead,
    /// `/proc` could not tell, and why.
    Unknown(process::Unknown),
}

impl Liveness {
    /// Known to be dead (not merely unknown).
    pub fn is_dead(&self) -> bool {
        *self == Liveness::Dead
    }
}

/// `/etc/machine-id`, read once.
pub fn this_machine() -> Option<String> {
    static ID: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    ID.get_or_init(|| read_id("/etc/machine-id")).clone()
}

/// This boot's id, read once.
pub fn this_boot() -> Option<String> {
    static ID: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    ID.get_or_init(|| read_id("/proc/sys/kernel/random/boot_id"))
        .clone()
}

fn read_id(path: &str) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    let id = text.trim();
    (!id.is_empty()).then(|| id.to_string())
}

/// This machine's host name, as `hostname` prints it.
pub fn this_host() -> Option<String> {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname NUL-terminates on success (and we
    // stop at the buffer's end if it did not).
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return None;
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    let name = String::from_utf8_lossy(&buf[..end]).into_owned();
    (!name.is_empty()).then_some(name)
}

/// [`process::probe_group`] as a [`Liveness`].
fn group_has_members(pgid: u32) -> Liveness {
    match process::probe_group(pgid) {
        Ok(true) => Liveness::Alive,
        Ok(false) => Liveness::Dead,
        Err(e) => Liveness::Unknown(e),
    }
}

fn start_time(pid: u32) -> Option<u64> {
    process::stat(pid).map(|s| s.start_time)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::CommandExt;

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
            start_time: 0,
            ..Holder::current()
        });
        child.wait().unwrap();
        assert!(!holder.is_alive());
    }

    #[test]
    fn a_group_lives_while_a_grandchild_does() {
        // The leader exits at once; the background sleep keeps the group.
        let mut leader = std::process::Command::new("sh")
            .args(["-c", "sleep 30 & exit 0"])
            .process_group(0)
            .spawn()
            .unwrap();
        let holder = Holder::of_group_leader(leader.id()).unwrap();
        leader.wait().unwrap();
        assert!(!holder.process_alive(), "the leader has exited");
        assert!(holder.is_alive(), "its grandchild still runs in the group");
        // SAFETY: our own test's process group.
        unsafe { libc::kill(-(holder.pgid.unwrap() as i32), libc::SIGKILL) };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while holder.is_alive() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(!holder.is_alive(), "the group is empty");
    }

    #[test]
    fn a_holder_on_another_machine_is_never_taken_for_dead() {
        let gone = Holder {
            pid: u32::MAX - 1,
            start_time: 1,
            ..Holder::current()
        };
        assert!(!gone.is_alive());
        let elsewhere = Holder {
            machine: Some("another-machine-id".into()),
            host: Some("some-other-machine.invalid".into()),
            ..gone.clone()
        };
        assert!(elsewhere.is_alive());
        // Older leases carry a host name only.
        let old_elsewhere = Holder {
            machine: None,
            boot: None,
            host: Some("some-other-machine.invalid".into()),
            ..gone
        };
        assert!(old_elsewhere.is_alive());
    }

    #[test]
    fn a_holder_of_an_earlier_boot_is_dead_whatever_runs_under_its_ids() {
        let me = Holder::current();
        let rebooted = Holder {
            boot: Some("an-earlier-boot".into()),
            pgid: Some(std::process::id()),
            ..me
        };
        assert!(
            !rebooted.is_alive(),
            "this very pid runs, but in another boot"
        );
        assert!(!rebooted.group_alive());
    }

    #[test]
    fn a_reused_group_id_is_not_the_jobs_group() {
        let mut leader = std::process::Command::new("sleep")
            .arg("30")
            .process_group(0)
            .spawn()
            .unwrap();
        let real = Holder::of_group_leader(leader.id()).unwrap();
        let recorded_earlier = Holder {
            start_time: real.start_time - 1,
            ..real.clone()
        };
        let (real_alive, reused_alive) = (real.group_alive(), recorded_earlier.group_alive());
        leader.kill().unwrap();
        leader.wait().unwrap();
        assert!(real_alive, "the group of the recorded leader");
        assert!(
            !reused_alive,
            "the same id now leads a group the holder never had"
        );
    }

    /// With no file descriptor left, `/proc` cannot be read: a live holder is then unknown, never
    /// dead, and still counts as alive for reclaim. Runs in a child process of this test binary,
    /// so that exhausting its descriptors touches no other test.
    #[test]
    fn a_holder_that_proc_cannot_read_is_unknown_not_dead() {
        const CHILD: &str = "ORCH_TEST_EMFILE_CHILD";
        if std::env::var_os(CHILD).is_some() {
            let me = Holder::of_group_leader(std::process::id()).unwrap();
            let mut keep = Vec::new();
            // Every descriptor this process may have, taken.
            while let Ok(file) = std::fs::File::open("/dev/null") {
                keep.push(file);
            }
            let (liveness, alive, process) = (me.liveness(), me.is_alive(), me.process_liveness());
            drop(keep);
            assert!(matches!(liveness, Liveness::Unknown(_)), "{liveness:?}");
            assert!(alive, "unknown counts as alive");
            assert!(matches!(process, Liveness::Unknown(_)), "{process:?}");
            return;
        }
        let status = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "holder::tests::a_holder_that_proc_cannot_read_is_unknown_not_dead",
                "--test-threads=1",
            ])
            .env(CHILD, "1")
            .status()
            .unwrap();
        assert!(status.success(), "the child's checks failed");
        // With descriptors to spare, the same holder is alive and a gone one dead.
        let me = Holder::current();
        assert_eq!(me.liveness(), Liveness::Alive);
        let gone = Holder {
            pid: u32::MAX - 1,
            start_time: 1,
            ..me
        };
        assert_eq!(gone.liveness(), Liveness::Dead);
    }

    #[test]
    fn holders_written_before_hosts_were_recorded_still_read() {
        let old: Holder = serde_json::from_str(r#"{"pid": 1, "start_time": 2}"#).unwrap();
        assert_eq!(old.host, None);
        assert_eq!(old.pgid, None);
    }
}
