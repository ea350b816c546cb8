//! What a launch is given ([`LaunchSpec`]: the command, its devices' environment, how it reads
//! and writes, whom it runs as) and how starting it can fail ([`ExecError`]). Both the parent's
//! side (launch.rs) and the child's (setup.rs) read them, so they live apart from either.

use crate::env::JobEnv;
use std::path::PathBuf;
use std::time::Duration;

/// What to run and how.
#[derive(Debug, Clone)]
pub struct LaunchSpec {
    pub argv: Vec<String>,
    pub cwd: Option<PathBuf>,
    pub job: JobEnv,
    /// One process per device instead of one for all.
    pub per_device: bool,
    /// Between SIGTERM and SIGKILL when the other processes of a failed per-device job are stopped.
    pub grace: Duration,
    /// Where the processes read and write.
    pub stdio: StdioMode,
    /// Start the processes as this user (the daemon, as root, runs each job as its submitter).
    pub credentials: Option<Credentials>,
    /// The environment to start from instead of this process's own (the daemon passes the
    /// submitting client's, as `sbatch` does); the job's variables are set on top.
    pub base_env: Option<Vec<(String, String)>>,
    /// The job's cgroup ([`crate::JobCgroup`]): every process starts inside it.
    pub cgroup: Option<PathBuf>,
    /// The rule of which GPU nodes the processes may open, as they take it on before exec
    /// ([`crate::devices::DeviceConstraint::join`]); a process that cannot is not started.
    pub devices: Option<crate::devices::DeviceJoin>,
    /// The CPUs and memory nodes of each process, by its slot (the rank of a per-device launch,
    /// 0 for a single one); an empty list or a `None` leaves that process unbound.
    pub cpu_binding: Vec<Option<crate::CpuBinding>>,
    /// Forward SIGINT, SIGTERM and SIGHUP that reach this process to the job (`orch run`).
    pub forward_signals: bool,
    /// With `forward_signals`, this signal too (the job's `[job] signal`): a warning that
    /// reaches `orch run` (from Slurm, from a `kill`) reaches the job instead of ending orch.
    pub warning_signal: Option<i32>,
}

/// Where a job's processes read and write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StdioMode {
    /// Share orch's. In a terminal the job (rank 0 of a per-device launch) becomes the
    /// terminal's foreground process group while it runs, so it can read the keyboard (pdb,
    /// `input()`, a password prompt) and gets Ctrl-C itself; otherwise rank 0 reads orch's stdin.
    /// Other ranks read nothing.
    Inherit,
    /// No input; output through pipes into these files (the daemon's logs), under `cap`
    /// ([`crate::logs`]): the job never writes the files itself.
    Files {
        stdout: PathBuf,
        stderr: PathBuf,
        cap: crate::logs::LogCap,
    },
}

/// A Unix identity to run as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credentials {
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups.
    pub groups: Vec<u32>,
}

#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    #[error("the job's command is empty: give argv = [\"program\", ...]")]
    EmptyCommand,
    #[error("cannot start \"{program}\": {reason}")]
    Spawn { program: String, reason: String },
    /// The job's processes could not enter their working folder (as the job's user).
    #[error(
        "cannot enter the working folder {} as user {user} ({reason}): start the job from a folder {user} may enter",
        folder.display()
    )]
    WorkingFolder {
        folder: PathBuf,
        user: String,
        reason: String,
    },
    /// A process could not take on the rule of which GPUs it may open.
    #[error(
        "cannot confine the job to its GPUs: joining the cgroup {} failed ({reason}); ORCH_DEVICE_CONSTRAINT=off runs jobs unconfined",
        cgroup.display()
    )]
    Confine { cgroup: PathBuf, reason: String },
    /// A process could not bind itself to its CPUs.
    #[error(
        "cannot bind the job to {binding} ({reason}); cpu_bind = \"none\" (--cpu-bind none) runs it unbound"
    )]
    Bind { binding: String, reason: String },
    #[error("cannot find a free port for MASTER_PORT: {0}")]
    NoPort(String),
    #[error("cannot install the signal handlers: {0}")]
    Signals(String),
}
