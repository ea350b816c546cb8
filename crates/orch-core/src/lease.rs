//! What placement needs to know about an existing lease on a device. The lease store
//! (`orch-leases`) produces these; policies and `orch plan` read them.

use serde::Serialize;

/// One device held by one job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeviceLease {
    pub job_id: String,
    pub job_name: String,
    /// The device's stable id (NVML uuid, or the sim file's).
    pub device_uuid: String,
    /// No other lease may share the device.
    pub exclusive: bool,
    /// Bytes reserved on the device (the job's `memory_limit`, or 0 when none was given).
    pub memory_reserved_bytes: u64,
}
