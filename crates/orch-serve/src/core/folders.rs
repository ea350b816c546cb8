//! A job's folder and its files (`STATE/jobs/ID-ATTEMPT/`), the formats the daemon and a job's
//! supervisor share:
//! - `spec.json`: what to run ([`SuperviseSpec`]), written by the daemon ([`prepare`]);
//! - `started`: the fence ([`Fence`]), created exclusively by whoever comes first: the
//!   supervisor (with its pid and start time) or a restarted daemon that found no supervisor (so
//!   the job was never started, and can never be started twice);
//! - `stdout`, `stderr`: the job's output, copied there by its supervisor under `max_log_size`
//!   (`stdout.1`, `stderr.1`: the older rotated piece; `stdout.dropped`, `stderr.dropped`: how
//!   many bytes went, see [`orch_exec::logs`]); `supervisor.log`: its supervisor's;
//! - `usage.json`: what the job's processes used (CPU, peak memory, the signal that ended it),
//!   written by its supervisor just before `exit.json` ([`crate::core::accounting::ProcessUse`]);
//! - `exit.json`: how it ended ([`ExitRecord`]), written atomically once every process of the job
//!   is gone and its lease released;
//! - `lease.json`: a held lease's placement ([`Placed`]), read by `GET /v1/leases/ID`.

use crate::core::db::{State, Submission};
use orch_devices::Inventory;
use orch_leases::{Holder, Lease};
use orch_runner::Plan;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// What the daemon hands a supervisor: the job and its placement as the daemon made it (the
/// lease, the policy's plan, the inventory it saw), typed, so the supervisor runs the job on
/// exactly that placement (a `[train]` job's trainer in the supervisor itself) and neither
/// places it again nor reads the devices again.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SuperviseSpec {
    pub job_id: String,
    pub submission: Submission,
    pub lease: Lease,
    pub plan: Plan,
    /// The inventory the placement saw (the supervisor does not read the devices again: on NVML
    /// that would cost every job start an NVML initialisation).
    pub inventory: Inventory,
    /// The lease store's folder.
    pub state_dir: PathBuf,
    /// Start the job as the submitting user (the daemon runs as root).
    pub switch_user: bool,
    /// The job's time limit, in seconds.
    pub max_runtime_s: Option<f64>,
    pub grace_s: f64,
    /// `max_log_size`: most bytes kept of each of the job's streams.
    #[serde(default = "default_max_log")]
    pub max_log_bytes: u64,
    /// The free space the job's output leaves on the state folder's file system ([`log_reserve`]).
    #[serde(default = "default_log_reserve")]
    pub log_reserve_bytes: u64,
    /// The tenant's `device_ids`, for a job that does not say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_ids: Option<orch_core::job::DeviceIds>,
}

fn default_max_log() -> u64 {
    crate::core::config::DEFAULT_MAX_LOG_SIZE
}

fn default_log_reserve() -> u64 {
    LOG_RESERVE_MAX
}

/// The most free space jobs' output leaves on the state folder's file system.
pub const LOG_RESERVE_MAX: u64 = 64 << 20;

/// The free space the jobs' output leaves for the daemon's database, job folders and exit
/// records on the file system of `state_dir`: a quarter of its size, at most
/// [`LOG_RESERVE_MAX`]. Output that would eat into it is dropped (and counted), so a chatty job
/// never stops the daemon from recording submissions and ends.
pub fn log_reserve(state_dir: &Path) -> u64 {
    use std::os::unix::ffi::OsStrExt;
    let Ok(path) = std::ffi::CString::new(state_dir.as_os_str().as_bytes()) else {
        return LOG_RESERVE_MAX;
    };
    // SAFETY: statvfs writes into the zeroed struct we own; the path is a valid C string.
    let total = unsafe {
        let mut stat: libc::statvfs = std::mem::zeroed();
        if libc::statvfs(path.as_ptr(), &mut stat) != 0 {
            return LOG_RESERVE_MAX;
        }
        (stat.f_blocks as u64).saturating_mul(stat.f_frsize as u64)
    };
    (total / 4).min(LOG_RESERVE_MAX)
}

/// How a job ended, as the supervisor records it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ExitRecord {
    /// `succeeded`, `failed` or `cancelled`; `queued` when it never started and goes back to the
    /// queue.
    pub state: State,
    pub exit_code: Option<i32>,
    pub reason: Option<String>,
    pub ended_at_ms: u64,
    /// Set when the record could not be written at once (the state folder was full or
    /// read-only): what the supervisor waited through, for the job's reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub late: Option<String>,
}

pub const CANCELLED: &str = "cancelled";
pub const TIME_LIMIT: &str = "time limit";
pub const PREEMPTED: &str = "preempted";

/// What the daemon sends a supervisor to preempt its job: stopped like a cancel (SIGTERM, the
/// grace period, SIGKILL), then queued again. A cancel is SIGTERM.
pub const PREEMPT_SIGNAL: i32 = libc::SIGUSR1;
/// What the daemon sends a supervisor to stop a job whose devices stayed idle (`idle_timeout`).
pub const IDLE_SIGNAL: i32 = libc::SIGUSR2;
/// The reason a job stopped for idling ends with (the daemon says how long it idled).
pub const IDLE: &str = "idle";

/// Who holds the fence: the supervisor that started the job, or the daemon's recovery.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Fence {
    /// `None`: fenced by a recovering daemon; the job never started.
    pub supervisor: Option<Holder>,
}

/// Creates the fence; false when someone else already did. Atomic: a full disk leaves no fence
/// rather than an empty one, which would say "taken" without saying by whom, so a recovering
/// daemon could neither adopt the job nor fence it off as never started.
pub fn take_fence(dir: &Path, fence: &Fence) -> std::io::Result<bool> {
    let text = serde_json::to_string(fence).map_err(std::io::Error::other)?;
    orch_core::fsutil::create_atomic(&dir.join("started"), text.as_bytes())
}

/// The fence: `Ok(None)` when nobody took it yet; `Err` when the folder cannot be read (no file
/// descriptor left, say), which tells nothing about the job.
pub fn read_fence(dir: &Path) -> std::io::Result<Option<Fence>> {
    Ok(read_json(&dir.join("started"))?.and_then(|t| serde_json::from_str(&t).ok()))
}

/// The exit record: `Ok(None)` when there is none yet; `Err` when it cannot be read.
pub fn read_exit(dir: &Path) -> std::io::Result<Option<ExitRecord>> {
    Ok(read_json(&dir.join("exit.json"))?.and_then(|t| serde_json::from_str(&t).ok()))
}

fn read_json(path: &Path) -> std::io::Result<Option<String>> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        // No folder yet, or no file in it: nothing recorded.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Writes `exit.json` atomically (temporary file, fsync, rename, fsync of the folder).
pub fn write_exit(dir: &Path, record: &ExitRecord) -> std::io::Result<()> {
    let text = serde_json::to_string(record).map_err(std::io::Error::other)?;
    orch_core::fsutil::write_atomic(&dir.join("exit.json"), text.as_bytes())
}

/// Writes a command job's folder: `spec.json` and an empty `supervisor.log`, before the job shows
/// as running. `spec.json` is replaced atomically but not synced: only the supervisor started
/// next reads it, and a folder whose supervisor a power loss kept from starting has no fence,
/// so the recovering daemon takes the fence itself and never runs it (a new attempt writes a
/// folder of its own).
pub fn prepare(dir: &Path, spec: &SuperviseSpec) -> std::io::Result<()> {
    make_dir(dir)?;
    let text = serde_json::to_string(spec).map_err(std::io::Error::other)?;
    orch_core::fsutil::replace(&dir.join("spec.json"), text.as_bytes())?;
    std::fs::File::create(dir.join("supervisor.log"))?;
    Ok(())
}

/// The job folders of `STATE/jobs` (`ID-ATTEMPT`): each job id with its attempts' numbers,
/// ascending. Names of another form are not job folders and count for nothing.
pub fn job_folders(state_dir: &Path) -> std::io::Result<std::collections::BTreeMap<i64, Vec<u32>>> {
    let mut folders = std::collections::BTreeMap::<i64, Vec<u32>>::new();
    let entries = match std::fs::read_dir(state_dir.join("jobs")) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(folders),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let name = entry?.file_name();
        let parsed = name
            .to_str()
            .and_then(|n| n.split_once('-'))
            .and_then(|(id, attempt)| {
                Some((id.parse::<i64>().ok()?, attempt.parse::<u32>().ok()?))
            });
        if let Some((id, attempt)) = parsed {
            folders.entry(id).or_default().push(attempt);
        }
    }
    for attempts in folders.values_mut() {
        attempts.sort_unstable();
    }
    Ok(folders)
}

/// The job's folder, the daemon's alone (root's when the daemon is root).
fn make_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

/// What the engine writes beside a held lease when it places it (`STATE/jobs/ID-1/lease.json`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Placed {
    pub policy: String,
    pub reason: String,
    pub devices: Vec<serde_json::Value>,
    pub rejected: Vec<serde_json::Value>,
    pub env: std::collections::BTreeMap<String, String>,
    pub exclusive: bool,
}

pub const PLACED_FILE: &str = "lease.json";

/// A held lease's placement in its folder, and the fence naming its process, so that a
/// restarted daemon adopts it while that process lives.
pub fn write_placed(dir: &Path, placed: &Placed, holder: &Holder) -> std::io::Result<()> {
    make_dir(dir)?;
    let text = serde_json::to_vec(placed).map_err(std::io::Error::other)?;
    orch_core::fsutil::write_atomic(&dir.join(PLACED_FILE), &text)?;
    take_fence(
        dir,
        &Fence {
            supervisor: Some(holder.clone()),
        },
    )?;
    Ok(())
}

/// A held lease's placement, as [`write_placed`] left it; the default before it is placed.
pub fn read_placed(dir: &Path) -> Placed {
    std::fs::read(dir.join(PLACED_FILE))
        .ok()
        .and_then(|bytes| serde_json::from_slice(&bytes).ok())
        .unwrap_or_default()
}
