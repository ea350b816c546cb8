//! A GPU's health through NVML: the readings taken with the rest of the inventory (volatile
//! uncorrected ECC errors, the row remapper, pages waiting to be retired, a lost GPU) and the Xid events, which NVML only
//! delivers to an event set that waits for them ([`watch_xids`]).
//!
//! Xid events are not a reading: NVML keeps no list of past ones, so whoever wants them must be
//! waiting when they happen. The daemon's device watcher runs [`watch_xids`] in a thread of its
//! own; a GPU with a critical Xid stays unhealthy until an admin clears it (docs/OPERATIONS.md).

use crate::health::{Health, RowRemap};
use nvml_wrapper::Nvml;
use nvml_wrapper::enum_wrappers::device::{EccCounter, MemoryError};
use nvml_wrapper::error::NvmlError;
use std::time::Duration;

/// The health readings of one GPU. A query NVML does not support leaves its reading unknown.
pub(crate) fn read(nvml: &Nvml, device: &nvml_wrapper::Device<'_>, lost: bool) -> Health {
    let ecc_uncorrected = device
        .total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile)
        .ok();
    let mut health = Health {
        ecc_uncorrected,
        row_remap: remapped_rows(nvml, device),
        retired_pages_pending: device.are_pages_pending_retired().ok(),
        lost,
        ..Health::default()
    };
    health.assess(orch_core::time::now_ms());
    health
}

/// `nvmlDeviceGetRemappedRows` (nvml-wrapper 0.13 has no wrapper for it), called through the
/// library nvml-wrapper loaded; `None` when unsupported.
fn remapped_rows(nvml: &Nvml, device: &nvml_wrapper::Device<'_>) -> Option<RowRemap> {
    use nvml_wrapper_sys::bindings as sys;
    let get = nvml.lib().nvmlDeviceGetRemappedRows.as_ref().ok()?;
    let (mut corrected, mut uncorrected, mut pending, mut failure) = (0, 0, 0, 0);
    // SAFETY: the handle comes from this `Nvml`, alive for the call; the four places are valid
    // for the one value NVML writes to each.
    let ret = unsafe {
        get(
            device.handle(),
            &mut corrected,
            &mut uncorrected,
            &mut pending,
            &mut failure,
        )
    };
    (ret == sys::nvmlReturn_enum_NVML_SUCCESS).then_some(RowRemap {
        pending: pending != 0,
        failure: failure != 0,
    })
}

/// One Xid event: the GPU's uuid and the Xid number.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XidEvent {
    pub uuid: String,
    pub xid: u32,
}

/// How long one wait for events lasts before [`watch_xids`] asks `keep_going` again.
const WAIT: Duration = Duration::from_millis(500);
/// How often [`watch_xids`] looks whether the GPUs changed (their count or uuids: a GPU added,
/// replaced or lost), and registers again when they did.
pub const RECHECK: Duration = Duration::from_secs(2);

/// Why [`watch_xids`] stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchError {
    /// Nothing to wait on: NVML cannot be loaded, or no GPU takes the registration. Worth
    /// trying again later.
    Unavailable(String),
    /// The wait failed after events were being waited for: worth registering again at once,
    /// so the other GPUs' events are not missed for long.
    Interrupted(String),
}

impl std::fmt::Display for WatchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WatchError::Unavailable(e) | WatchError::Interrupted(e) => f.write_str(e),
        }
    }
}

/// The GPUs as the registration saw them: their uuids by index (`None`: one that does not
/// answer, a lost GPU).
fn identity(nvml: &Nvml) -> Result<Vec<Option<String>>, NvmlError> {
    let count = nvml.device_count()?;
    Ok((0..count)
        .map(|i| nvml.device_by_index(i).and_then(|d| d.uuid()).ok())
        .collect())
}

/// An event set registered for Xid events on every GPU that takes it, and each registered
/// GPU's uuid by its handle: an event from a GPU that became lost names it by handle only.
struct Registration<'nvml> {
    set: nvml_wrapper::EventSet<'nvml>,
    uuids: std::collections::HashMap<usize, String>,
    seen: Vec<Option<String>>,
}

fn register(nvml: &Nvml) -> Result<Registration<'_>, WatchError> {
    use nvml_wrapper_sys::bindings as sys;
    let unavailable = |e: NvmlError| WatchError::Unavailable(e.to_string());
    let seen = identity(nvml).map_err(unavailable)?;
    let set = nvml.create_event_set().map_err(unavailable)?;
    let register = nvml
        .lib()
        .nvmlDeviceRegisterEvents
        .as_ref()
        .map_err(|e| WatchError::Unavailable(e.to_string()))?;
    let mut uuids = std::collections::HashMap::new();
    for (index, uuid) in seen.iter().enumerate() {
        let (Some(uuid), Ok(device)) = (uuid, nvml.device_by_index(index as u32)) else {
            continue;
        };
        // Through the library itself: nvml-wrapper's `register_events` frees the whole set when
        // one GPU refuses (a GPU without Xid events, a MIG-mode GPU of old drivers).
        // SAFETY: the handle and the set come from this `Nvml`, alive for the call.
        let ret = unsafe {
            register(
                device.handle(),
                u64::from(sys::nvmlEventTypeXidCriticalError),
                set.handle(),
            )
        };
        if ret == sys::nvmlReturn_enum_NVML_SUCCESS {
            // SAFETY: the handle is only read as a number, the key of the map.
            uuids.insert(unsafe { device.handle() } as usize, uuid.clone());
        } else {
            tracing::warn!("GPU {index} takes no Xid event registration (NVML error {ret})");
        }
    }
    if uuids.is_empty() {
        return Err(WatchError::Unavailable(
            "no GPU takes Xid event registration".to_string(),
        ));
    }
    Ok(Registration { set, uuids, seen })
}

/// Waits for Xid events on every GPU (an NVML event set registered for
/// `nvmlEventTypeXidCriticalError`, which carries every Xid; the caller judges which are
/// critical) and hands each to `on_event`, until `keep_going` says stop. Every [`RECHECK`] it
/// looks whether the GPUs changed, and registers again when they did (the events already
/// queued are taken first). An event from a GPU whose uuid no longer answers (lost) is named by
/// the uuid it had at registration. `Err` says why it stopped ([`WatchError`]).
pub fn watch_xids(
    mut on_event: impl FnMut(XidEvent),
    keep_going: impl Fn() -> bool,
) -> Result<(), WatchError> {
    let nvml = crate::nvml::init().map_err(|e| WatchError::Unavailable(e.to_string()))?;
    loop {
        let registration = register(&nvml)?;
        tracing::info!(
            "waiting for Xid events on {} GPU(s)",
            registration.uuids.len()
        );
        let mut looked = std::time::Instant::now();
        loop {
            if !keep_going() {
                return Ok(());
            }
            match next_event(&registration, WAIT.as_millis() as u32) {
                Ok(Some(event)) => on_event(event),
                Ok(None) => {}
                Err(e) => return Err(WatchError::Interrupted(e)),
            }
            if looked.elapsed() >= RECHECK {
                looked = std::time::Instant::now();
                if identity(&nvml).ok().as_ref() != Some(&registration.seen) {
                    // What is queued on this set is taken before it goes.
                    while let Ok(Some(event)) = next_event(&registration, 0) {
                        on_event(event);
                    }
                    tracing::info!("the GPUs changed: registering for Xid events again");
                    break;
                }
            }
        }
    }
}

/// The next Xid event of `registration`'s set within `timeout_ms`; `None` when none came (or
/// it carried no Xid). `Err` when the wait failed.
fn next_event(
    registration: &Registration<'_>,
    timeout_ms: u32,
) -> Result<Option<XidEvent>, String> {
    match registration.set.wait(timeout_ms) {
        Ok(event) => {
            let xid = match event.event_data {
                Some(nvml_wrapper::enums::event::XidError::Value(xid)) => xid as u32,
                _ => return Ok(None),
            };
            // SAFETY: the handle is only read as a number, the key of the map.
            let handle = unsafe { event.device.handle() } as usize;
            match event
                .device
                .uuid()
                .ok()
                .or_else(|| registration.uuids.get(&handle).cloned())
            {
                Some(uuid) => Ok(Some(XidEvent { uuid, xid })),
                None => {
                    tracing::warn!("an Xid {xid} event from a GPU orch did not register");
                    Ok(None)
                }
            }
        }
        Err(NvmlError::Timeout) => Ok(None),
        Err(e) => Err(format!("waiting for Xid events failed: {e}")),
    }
}
