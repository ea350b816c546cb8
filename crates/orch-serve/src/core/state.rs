//! The daemon's state: what the engine thread, the API and the device watcher share
//! ([`Shared`]).

use crate::core::config::Config;
use crate::core::db::Db;
use crate::core::kick::Kick;
use orch_core::sync::lock;
use orch_devices::Inventory;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, mpsc};

/// What the API and the engine share.
#[derive(Debug)]
pub struct Shared {
    pub db: Db,
    /// Compiles the policy components tenants send, off the engine thread.
    pub compiler: crate::core::compile::Compiler,
    /// Asks the policy components tenants send, away from the pass that places everyone.
    pub policies: crate::core::policy_worker::PolicyWorkers,
    pub config: Config,
    pub state_dir: PathBuf,
    pub devices: String,
    pub kick: Mutex<mpsc::Sender<Kick>>,
    /// Why each queued job waits, from the last scheduling pass.
    pub reasons: Mutex<HashMap<i64, String>>,
    /// Each queued job's place among the waiting ones, in the order the last pass tried them
    /// (1 is next), and how many wait.
    pub places: Mutex<HashMap<i64, (usize, usize)>>,
    /// Devices orch may place on (visible to the daemon).
    pub visible_devices: usize,
    /// Which inventory the daemon reads.
    pub backend: orch_devices::Backend,
    /// The orch binary, started as `orch __supervise DIR` per job.
    pub exe: PathBuf,
    pub root: bool,
    /// Every tenant's fair-share standing, from the latest pass or usage sample.
    pub standing: Mutex<Vec<orch_queue::Tenant>>,
    /// The latest reading of the machine (devices, leases, foreign processes), every second.
    pub machine: Mutex<MachineView>,
    /// What the daemon counts for `/metrics`.
    pub metrics: crate::core::metrics::Counters,
    /// Whether the state folder takes writes (a full or read-only disk refuses submissions).
    pub health: crate::core::health::StateHealth,
    /// How each supervisor this daemon started ended, by (job, attempt): the wait on the child
    /// knows it for certain, with no `/proc` reading that could fail.
    pub supervisor_exits: Mutex<HashMap<(i64, u32), SupervisorEnd>>,
    /// The last hours of device readings and queue length (`GET /v1/timeline`, the page's
    /// charts).
    pub timeline: crate::core::timeline::Timeline,
}

/// How a supervisor process this daemon started ended.
#[derive(Debug, Clone, Copy)]
pub struct SupervisorEnd {
    pub pid: u32,
    pub status: Option<std::process::ExitStatus>,
    /// The kernel's OOM killer killed a process in the job's cgroup (`memory.events`): a
    /// supervisor that ran its own user's trainer is killed with it when the job goes over its
    /// memory limit.
    pub out_of_memory: bool,
}

impl SupervisorEnd {
    /// Why it ended, as a job's reason says: "was killed by signal 9", "exited with status 2".
    pub fn words(&self) -> String {
        use std::os::unix::process::ExitStatusExt;
        match self.status {
            Some(status) => match (status.signal(), status.code()) {
                (Some(libc::SIGKILL), _) if self.out_of_memory => format!(
                    "out of memory: its supervisor (pid {}), which ran the job's trainer, was killed with it by the kernel's OOM killer at the job's memory limit",
                    self.pid
                ),
                (Some(signal), _) => format!(
                    "its supervisor (pid {}) was killed by signal {signal} before it recorded how the job ended",
                    self.pid
                ),
                (None, Some(code)) => format!(
                    "its supervisor (pid {}) exited with status {code} before it recorded how the job ended (see supervisor.log in the job's folder)",
                    self.pid
                ),
                _ => format!(
                    "its supervisor (pid {}) ended before it recorded how the job ended",
                    self.pid
                ),
            },
            None => format!(
                "its supervisor (pid {}) ended before it recorded how the job ended",
                self.pid
            ),
        }
    }
}

/// One reading of the machine: cheap to clone (shared parts).
#[derive(Debug, Clone)]
pub struct MachineView {
    pub inventory: Arc<Inventory>,
    /// The lease store's live leases (the daemon's jobs and `orch run`'s).
    pub leases: Arc<Vec<orch_leases::Lease>>,
    /// Per device uuid, the processes no lease on it covers.
    pub foreign: Arc<std::collections::BTreeMap<String, Vec<orch_devices::GpuProcess>>>,
    /// Per lease id, per device, the memory its holders' processes hold there (the same reading
    /// as `foreign`): a running job's accounting.
    pub lease_memory:
        Arc<std::collections::HashMap<String, std::collections::BTreeMap<String, u64>>>,
    /// Why this reading is not fresh (the devices could not be read again, or the thread that
    /// reads them could not start); `/v1/devices` says so.
    pub stale: Option<String>,
}

impl MachineView {
    pub fn new(inventory: Inventory) -> MachineView {
        MachineView {
            inventory: Arc::new(inventory),
            leases: Arc::default(),
            foreign: Arc::default(),
            lease_memory: Arc::default(),
            stale: None,
        }
    }
}

impl Shared {
    pub fn kick(&self, kick: Kick) {
        let _ = lock(&self.kick).send(kick);
    }

    pub fn job_dir(&self, id: i64, attempt: u32) -> PathBuf {
        self.state_dir.join("jobs").join(format!("{id}-{attempt}"))
    }
}

#[cfg(test)]
mod tests {
    use super::SupervisorEnd;
    use std::os::unix::process::ExitStatusExt;

    #[test]
    fn a_supervisor_killed_by_the_oom_killer_is_out_of_memory_in_words() {
        let end = |out_of_memory| SupervisorEnd {
            pid: 42,
            status: Some(std::process::ExitStatus::from_raw(libc::SIGKILL)),
            out_of_memory,
        };
        assert!(
            end(true)
                .words()
                .starts_with("out of memory: its supervisor (pid 42)"),
            "{}",
            end(true).words()
        );
        assert_eq!(
            end(false).words(),
            "its supervisor (pid 42) was killed by signal 9 before it recorded how the job ended"
        );
    }
}
