//! Which devices are in service: the inventory's health readings with the lease store's marks
//! (drains, the health the daemon recorded) laid over them. Placement, `orch devices` and the
//! daemon's view all read devices through [`with_marks`], so a drain or a recorded Xid means
//! the same to `orch run`, Python and the daemon.

use orch_devices::{Device, Drain, Problem};
use orch_leases::{DeviceMark, MarkKind};
use std::borrow::Cow;

/// `devices` with `marks` applied: a drain goes to the GPU it names (or whose slice it names),
/// an unhealthy mark's problems to its GPU (those the reading does not show already). Borrowed
/// unchanged when there is no mark, as on most machines most of the time.
pub fn with_marks<'a>(devices: &'a [Device], marks: &[DeviceMark]) -> Cow<'a, [Device]> {
    if marks.is_empty() {
        return Cow::Borrowed(devices);
    }
    let mut devices = devices.to_vec();
    for mark in marks {
        let Some(device) = devices
            .iter_mut()
            .find(|d| d.uuid == mark.uuid || d.mig_devices.iter().any(|m| m.uuid == mark.uuid))
        else {
            continue;
        };
        apply(device, mark);
    }
    Cow::Owned(devices)
}

/// The marks a claim made inside an enclosing lease honours: a drain says no *new* job goes
/// there, and the job that holds the lease is no new job, so drains on the lease's own devices
/// (`own`, or their GPU) do not apply; everything else does, unhealthy marks included. Borrowed
/// unchanged outside a lease.
pub fn for_claim_inside<'a>(
    marks: &'a [DeviceMark],
    own: &[String],
    devices: &[Device],
) -> Cow<'a, [DeviceMark]> {
    if own.is_empty() || !marks.iter().any(|m| m.kind == MarkKind::Drain) {
        return Cow::Borrowed(marks);
    }
    let held = |uuid: &str| {
        own.iter().any(|o| o == uuid)
            || devices
                .iter()
                .any(|d| d.uuid == uuid && d.mig_devices.iter().any(|m| own.contains(&m.uuid)))
    };
    Cow::Owned(
        marks
            .iter()
            .filter(|m| m.kind != MarkKind::Drain || !held(&m.uuid))
            .cloned()
            .collect(),
    )
}

/// Lays one mark over its device.
pub fn apply(device: &mut Device, mark: &DeviceMark) {
    match mark.kind {
        MarkKind::Drain => {
            let health = &mut device.health;
            health.drains.retain(|d| d.uuid != mark.uuid);
            health.drains.push(Drain {
                uuid: mark.uuid.clone(),
                reason: mark.detail.clone(),
                by: mark.by.clone(),
                since_ms: mark.since_ms,
            });
        }
        MarkKind::Unhealthy => {
            let recorded: Vec<Problem> = mark
                .detail
                .as_deref()
                .and_then(|text| serde_json::from_str(text).ok())
                .unwrap_or_default();
            for problem in recorded {
                if !device.health.problems.iter().any(|p| p.same(&problem)) {
                    device.health.problems.push(problem);
                }
            }
        }
    }
}

/// The marks of the lease store in `dir`, when it exists and can be read; none otherwise (a
/// reader with no store has no drains, and makes no store by looking).
pub fn read_marks(dir: &std::path::Path) -> Vec<DeviceMark> {
    if !dir.join("leases.sqlite3").is_file() {
        return Vec::new();
    }
    match orch_leases::LeaseStore::open(dir).and_then(|mut s| s.marks()) {
        Ok(marks) => marks,
        Err(e) => {
            tracing::debug!("no device marks read: {e}");
            Vec::new()
        }
    }
}

/// Every visible device (CUDA index, device, slice uuid) that takes no new job, and why.
pub(crate) fn out_of_service(visible: &[(u32, &Device, Option<String>)]) -> Vec<(u32, String)> {
    visible
        .iter()
        .filter_map(|(index, device, mig)| {
            let uuid = mig.as_deref().unwrap_or(&device.uuid);
            device.out_of_service(uuid).map(|why| (*index, why))
        })
        .collect()
}

/// A policy's "no fit" with the devices out of service named: a job that waits, or an
/// `orch run` that fails, says which drained or unhealthy devices it could not have.
pub(crate) fn explain(
    error: orch_host::PluginError,
    out: &[(u32, String)],
) -> orch_host::PluginError {
    match error {
        orch_host::PluginError::NoFit { plugin, message } if !out.is_empty() => {
            let words: Vec<&str> = out.iter().map(|(_, why)| why.as_str()).collect();
            orch_host::PluginError::NoFit {
                plugin,
                message: format!("{message}; out of service: {}", words.join(", ")),
            }
        }
        other => other,
    }
}

/// A device out of service is rejected for that reason, whatever else is true of it.
pub(crate) fn reject(rejected: &mut [crate::plan::Rejection], out: &[(u32, String)]) {
    for rejection in rejected {
        if let Some((_, why)) = out.iter().find(|(i, _)| *i == rejection.index) {
            rejection.why = why.clone();
        }
    }
}
