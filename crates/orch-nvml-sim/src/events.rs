//! Health as NVML serves it: Xid events through event sets, uncorrected ECC counts, the row
//! remapper, and a lost GPU.
//!
//! A sim file's `xid_errors` lists a GPU's Xids, oldest first. When the file is read again and a
//! GPU's list has grown, each new entry is an event, queued on every event set registered for
//! `nvmlEventTypeXidCriticalError` on that GPU, and handed to the next `nvmlEventSetWait_v2`
//! on the set. A wait looks at the file again every [`RECHECK`], so an entry written while a
//! thread waits wakes it within that time, as a real Xid wakes a waiting NVML client. An entry
//! that was in the file when the set was registered is not an event: NVML delivers only what
//! happens after registration.
//!
//! `ecc_uncorrected` is the volatile uncorrected count (`nvmlDeviceGetTotalEccErrors`),
//! `row_remap_pending` / `row_remap_failure` the remapper (`nvmlDeviceGetRemappedRows`),
//! `retired_pages_pending` the page retirement (`nvmlDeviceGetRetiredPagesPendingStatus`); each
//! left out of the file is `NVML_ERROR_NOT_SUPPORTED`. A GPU with `lost = true` answers
//! `NVML_ERROR_GPU_IS_LOST`, as the driver does for a GPU fallen off the bus, to
//! `nvmlDeviceGetHandleByIndex`, its uuid and name, its telemetry (memory, utilization,
//! temperature, power, processes) and health readings; a handle taken before keeps its PCI
//! identity, and its Xid events are delivered on it.

use super::*;
use std::collections::VecDeque;

const TIMEOUT: Ret = sys::nvmlReturn_enum_NVML_ERROR_TIMEOUT;
/// The one event type this library delivers.
const XID_EVENT: u64 = sys::nvmlEventTypeXidCriticalError as u64;

/// The event sets handed out, by their (opaque) handle.
#[derive(Debug, Default)]
pub(crate) struct Events {
    sets: BTreeMap<usize, EventSet>,
    next: usize,
}

#[derive(Debug, Default)]
struct EventSet {
    /// The GPUs (by position) registered for Xid events.
    gpus: Vec<usize>,
    /// Events not yet waited for: (GPU position, Xid).
    queue: VecDeque<(usize, u32)>,
}

impl Events {
    /// Queues the Xids `new` lists beyond what `old` listed, GPU by GPU, on every set registered
    /// for that GPU.
    pub(crate) fn on_reading(&mut self, old: &Machine, new: &Machine) {
        for (position, gpu) in new.devices.iter().enumerate() {
            let before = old
                .devices
                .get(position)
                .map_or(0, |d| d.health.xid_errors.len());
            for &xid in gpu.health.xid_errors.iter().skip(before) {
                for set in self.sets.values_mut() {
                    if set.gpus.contains(&position) {
                        set.queue.push_back((position, xid));
                    }
                }
            }
        }
    }
}

/// The library's state, or `NVML_ERROR_UNINITIALIZED`.
fn with_library<T>(f: impl FnOnce(&mut Library) -> Result<T, Ret>) -> Result<T, Ret> {
    let mut library = library();
    f(library.as_mut().ok_or(UNINITIALIZED)?)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetCreate(set: *mut sys::nvmlEventSet_t) -> Ret {
    guard(|| unsafe {
        non_null(set)?;
        let handle = with_library(|library| {
            let events = &mut library.events;
            events.next += 1;
            // An opaque, never dereferenced, non-null value: 16 apart, as a pointer would be.
            let handle = events.next * 16;
            events.sets.insert(handle, EventSet::default());
            Ok(handle)
        })?;
        put(set, handle as sys::nvmlEventSet_t)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetFree(set: sys::nvmlEventSet_t) -> Ret {
    guard(|| {
        with_library(|library| {
            library
                .events
                .sets
                .remove(&(set as usize))
                .map(|_| ())
                .ok_or(INVALID_ARGUMENT)
        })
    })
}

/// Every GPU supports Xid events (`nvmlEventTypeXidCriticalError`) and nothing else here.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetSupportedEventTypes(
    device: sys::nvmlDevice_t,
    event_types: *mut std::ffi::c_ulonglong,
) -> Ret {
    guard(|| unsafe {
        non_null(event_types)?;
        parent_gpu(device)?;
        put(event_types, XID_EVENT)
    })
}

/// Registers a GPU for Xid events; any other type is `NVML_ERROR_NOT_SUPPORTED`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceRegisterEvents(
    device: sys::nvmlDevice_t,
    event_types: std::ffi::c_ulonglong,
    set: sys::nvmlEventSet_t,
) -> Ret {
    guard(|| {
        if event_types & !XID_EVENT != 0 {
            return Err(NOT_SUPPORTED);
        }
        let (_, gpu) = parent_gpu(device)?;
        with_library(|library| {
            let set = library
                .events
                .sets
                .get_mut(&(set as usize))
                .ok_or(INVALID_ARGUMENT)?;
            if event_types & XID_EVENT != 0 && !set.gpus.contains(&gpu) {
                set.gpus.push(gpu);
            }
            Ok(())
        })
    })
}

/// The next event of `set`, waiting up to `timeout_ms` for one; `NVML_ERROR_TIMEOUT` when none
/// came.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetWait_v2(
    set: sys::nvmlEventSet_t,
    data: *mut sys::nvmlEventData_t,
    timeout_ms: c_uint,
) -> Ret {
    guard(|| unsafe {
        non_null(data)?;
        let deadline = Instant::now() + Duration::from_millis(u64::from(timeout_ms));
        loop {
            let next = with_library(|library| {
                library.refresh();
                let queued = library
                    .events
                    .sets
                    .get_mut(&(set as usize))
                    .ok_or(INVALID_ARGUMENT)?
                    .queue
                    .pop_front();
                Ok(queued.map(|(gpu, xid)| {
                    let handle = library.handle(Target { gpu, mig: None });
                    (handle, xid)
                }))
            })?;
            if let Some((device, xid)) = next {
                return put(
                    data,
                    sys::nvmlEventData_t {
                        device,
                        eventType: XID_EVENT,
                        eventData: u64::from(xid),
                        gpuInstanceId: NO_INSTANCE,
                        computeInstanceId: NO_INSTANCE,
                    },
                );
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(TIMEOUT);
            }
            std::thread::sleep(RECHECK.min(deadline - now));
        }
    })
}

/// A GPU's health readings, or `NVML_ERROR_GPU_IS_LOST` for a lost one.
fn health(device: sys::nvmlDevice_t) -> Result<orch_devices::Health, Ret> {
    let (machine, gpu) = gpu(device)?;
    let health = &machine.devices[gpu].health;
    if health.lost {
        return Err(GPU_IS_LOST);
    }
    Ok(health.clone())
}

/// Only the volatile uncorrected count is in the file; the corrected and aggregate counts are
/// `NVML_ERROR_NOT_SUPPORTED`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTotalEccErrors(
    device: sys::nvmlDevice_t,
    error_type: sys::nvmlMemoryErrorType_t,
    counter_type: sys::nvmlEccCounterType_t,
    ecc_counts: *mut std::ffi::c_ulonglong,
) -> Ret {
    guard(|| unsafe {
        non_null(ecc_counts)?;
        let health = health(device)?;
        if error_type != sys::nvmlMemoryErrorType_enum_NVML_MEMORY_ERROR_TYPE_UNCORRECTED
            || counter_type != sys::nvmlEccCounterType_enum_NVML_VOLATILE_ECC
        {
            return Err(NOT_SUPPORTED);
        }
        put(ecc_counts, health.ecc_uncorrected.ok_or(NOT_SUPPORTED)?)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetRemappedRows(
    device: sys::nvmlDevice_t,
    corr_rows: *mut c_uint,
    unc_rows: *mut c_uint,
    is_pending: *mut c_uint,
    failure_occurred: *mut c_uint,
) -> Ret {
    guard(|| unsafe {
        for out in [corr_rows, unc_rows, is_pending, failure_occurred] {
            non_null(out)?;
        }
        let remap = health(device)?.row_remap.ok_or(NOT_SUPPORTED)?;
        put(corr_rows, 0)?;
        put(unc_rows, c_uint::from(remap.pending || remap.failure))?;
        put(is_pending, c_uint::from(remap.pending))?;
        put(failure_occurred, c_uint::from(remap.failure))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetRetiredPagesPendingStatus(
    device: sys::nvmlDevice_t,
    is_pending: *mut sys::nvmlEnableState_t,
) -> Ret {
    guard(|| unsafe {
        non_null(is_pending)?;
        let pending = health(device)?.retired_pages_pending.ok_or(NOT_SUPPORTED)?;
        put(
            is_pending,
            if pending {
                sys::nvmlEnableState_enum_NVML_FEATURE_ENABLED
            } else {
                sys::nvmlEnableState_enum_NVML_FEATURE_DISABLED
            },
        )
    })
}

/// A GPU handle's device for a telemetry reading: `NVML_ERROR_GPU_IS_LOST` for a lost GPU.
pub(crate) fn live_gpu(device: sys::nvmlDevice_t) -> Result<(Arc<Machine>, usize), Ret> {
    let (machine, gpu) = gpu(device)?;
    if machine.devices[gpu].health.lost {
        return Err(GPU_IS_LOST);
    }
    Ok((machine, gpu))
}
