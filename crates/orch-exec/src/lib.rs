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
//! using devices whose lease is gone.

mod env;
mod launch;
mod watch;

pub use env::{AssignedDevice, JobEnv, process_env};
pub use launch::{ExecError, ExitOutcome, LaunchSpec, Monitor, launch};
pub use watch::{MemoryWatch, ProcessMemory, Verdict, descendants};
