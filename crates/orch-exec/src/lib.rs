//! Starts a job's processes with exactly their devices.
//!
//! A job's command gets `CUDA_VISIBLE_DEVICES` set to the full UUIDs of its devices (never
//! indices: an index means something else under another `CUDA_DEVICE_ORDER`, inside a container or
//! under MPS), `CUDA_DEVICE_ORDER=PCI_BUS_ID`, `ORCH_JOB_ID`, the variables TensorFlow and JAX read
//! for memory limits, and the job's own environment. With `per-device` launch, one process per
//! device sees only its device and gets the torchrun variables.
//!
//! Design decision: each process runs in its own process group, so a terminal's Ctrl-C reaches
//! orch alone, and orch forwards SIGINT/SIGTERM to every group it started; the children also get
//! `PR_SET_PDEATHSIG`, so a job cannot outlive an `orch` that was killed with SIGKILL and keep
//! using devices whose lease is gone. In a terminal, the job's group becomes the foreground group
//! while it runs (it reads the keyboard and gets Ctrl-C itself). Where orch may, each job also
//! gets a cgroup of its own, which no process of the job can leave; when the main process ends,
//! whatever it left in its groups or cgroup is ended too. Started as root, a job may open only its
//! granted GPUs' device nodes ([`devices`]). Where asked, each process runs on its GPUs' NUMA
//! nodes' CPUs and takes its memory there ([`CpuBinding`]).

mod bind;
mod cgroup;
pub mod cpuset;
pub mod current;
pub mod devices;
mod env;
mod launch;
pub mod logs;
mod setup;
mod spec;
mod terminal;
mod watch;

pub use bind::{CpuBinding, HostCpus};
pub use cgroup::{
    CgroupUsage, JobCgroup, disabled as cgroups_disabled, kill as kill_cgroup,
    prime_migration as prime_cgroup_migration, usage_of as cgroup_usage,
};
pub use env::{AssignedDevice, Cluster, JobEnv, process_env};
pub use launch::{ExitOutcome, Launched, Monitor, Stopper, launch, start};
pub use logs::LogCap;
pub use setup::passwd_entry;
pub use spec::{Credentials, ExecError, LaunchSpec, StdioMode};
pub use watch::{MemoryWatch, ProcessMemory, Verdict, descendants};
