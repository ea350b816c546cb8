//! A GPU's health through NVML: the readings taken with the rest of the inventory (volatile
//! uncorrected ECC errors, the row remapper, a lost GPU) and the Xid events, which NVML only
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

/// Waits for Xid events on every GPU (an NVML event set registered for
/// `nvmlEventTypeXidCriticalError`, which carries every Xid; the caller judges which are
/// critical) and hands each to `on_event`, until `keep_going` says stop. `Err` when NVML cannot
/// be loaded or no GPU takes the registration: there is nothing to wait for.
pub fn watch_xids(
    mut on_event: impl FnMut(XidEvent),
    keep_going: impl Fn() -> bool,
) -> Result<(), String> {
    use nvml_wrapper_sys::bindings as sys;
    let nvml = crate::nvml::init().map_err(|e| e.to_string())?;
    let count = nvml.device_count().map_err(|e| e.to_string())?;
    let set = nvml.create_event_set().map_err(|e| e.to_string())?;
    let register = nvml
        .lib()
        .nvmlDeviceRegisterEvents
        .as_ref()
        .map_err(|e| e.to_string())?;
    let mut registered = 0;
    for index in 0..count {
        let Ok(device) = nvml.device_by_index(index) else {
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
            registered += 1;
        } else {
            tracing::warn!("GPU {index} takes no Xid event registration (NVML error {ret})");
        }
    }
    if registered == 0 {
        return Err("no GPU takes Xid event registration".to_string());
    }
    tracing::info!("waiting for Xid events on {registered} GPU(s)");
    while keep_going() {
        match set.wait(WAIT.as_millis() as u32) {
            Ok(event) => {
                let xid = match event.event_data {
                    Some(nvml_wrapper::enums::event::XidError::Value(xid)) => xid as u32,
                    _ => continue,
                };
                match event.device.uuid() {
                    Ok(uuid) => on_event(XidEvent { uuid, xid }),
                    Err(e) => tracing::warn!("an Xid {xid} event from a GPU without a uuid: {e}"),
                }
            }
            Err(NvmlError::Timeout) => {}
            Err(e) => return Err(format!("waiting for Xid events failed: {e}")),
        }
    }
    Ok(())
}
