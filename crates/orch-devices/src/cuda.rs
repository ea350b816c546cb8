//! Is the CUDA driver usable here? Checked before any call into cudarc.
//!
//! cudarc loads `libcuda` lazily and panics when a call finds it missing (and keeps panicking), so
//! every entry point here first asks whether the library loads at all. `catch_unwind` is not a
//! guard: it does nothing under `panic = "abort"`.

use cudarc::driver::{CudaContext, result, sys};
use std::sync::OnceLock;

/// What the CUDA driver reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CudaInfo {
    /// `major * 1000 + minor * 10`, as `cuDriverGetVersion` returns it (13000 is 13.0).
    pub driver_version: i32,
    pub device_count: usize,
    /// Whether NVRTC (kernel compilation) and cuBLAS load: they come with the toolkit, not the driver.
    pub nvrtc_present: bool,
    pub cublas_present: bool,
}

impl CudaInfo {
    pub fn driver_version_string(&self) -> String {
        format!(
            "{}.{}",
            self.driver_version / 1000,
            (self.driver_version % 1000) / 10
        )
    }
}

/// Why CUDA cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CudaUnavailable {
    #[error("the CUDA driver library (libcuda.so) does not load")]
    NoDriverLibrary,
    #[error("the CUDA driver failed to initialise: {0}")]
    InitFailed(String),
    #[error("CUDA reports {count} device(s); there is no device {ordinal}")]
    NoSuchDevice { ordinal: usize, count: usize },
    #[error("creating a CUDA context on device {ordinal} failed: {reason}")]
    ContextFailed { ordinal: usize, reason: String },
    #[error(
        "no CUDA device in this process has id {uuid} (CUDA sees {seen}): check CUDA_VISIBLE_DEVICES, and on a GPU in MIG mode name the MIG instance there"
    )]
    NoSuchUuid { uuid: String, seen: String },
}

/// True when `libcuda` loads. Cached: the answer does not change within a process.
pub fn driver_library_present() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: only tries to dlopen the library and drops it; no symbol is called.
    *PRESENT.get_or_init(|| unsafe { sys::is_culib_present() })
}

/// True when NVRTC loads (needed to compile kernels).
pub fn nvrtc_present() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: as above.
    *PRESENT.get_or_init(|| unsafe { cudarc::nvrtc::sys::is_culib_present() })
}

/// True when cuBLAS loads (needed for matrix products).
pub fn cublas_present() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: as above.
    *PRESENT.get_or_init(|| unsafe { cudarc::cublas::sys::is_culib_present() })
}

/// Initialises the driver and reads its version and device count.
pub fn probe() -> Result<CudaInfo, CudaUnavailable> {
    if !driver_library_present() {
        return Err(CudaUnavailable::NoDriverLibrary);
    }
    result::init().map_err(|e| CudaUnavailable::InitFailed(e.to_string()))?;
    let mut version = 0;
    // SAFETY: the library is present and initialised; `version` is a valid out-pointer.
    unsafe { sys::cuDriverGetVersion(&mut version) }
        .result()
        .map_err(|e| CudaUnavailable::InitFailed(e.to_string()))?;
    let count =
        result::device::get_count().map_err(|e| CudaUnavailable::InitFailed(e.to_string()))?;
    Ok(CudaInfo {
        driver_version: version,
        device_count: usize::try_from(count).unwrap_or(0),
        nvrtc_present: nvrtc_present(),
        cublas_present: cublas_present(),
    })
}

/// Creates (and drops) a context on CUDA device `ordinal`; returns the device's name.
pub fn check_context(ordinal: usize) -> Result<String, CudaUnavailable> {
    let info = probe()?;
    if ordinal >= info.device_count {
        return Err(CudaUnavailable::NoSuchDevice {
            ordinal,
            count: info.device_count,
        });
    }
    let failed = |e: result::DriverError| CudaUnavailable::ContextFailed {
        ordinal,
        reason: e.to_string(),
    };
    let context = CudaContext::new(ordinal).map_err(failed)?;
    let name = context.name().map_err(failed)?;
    context.synchronize().map_err(failed)?;
    Ok(name)
}

/// The CUDA ordinal, in this process, of the device NVML calls `uuid` (`GPU-…` or `MIG-…`).
///
/// A device's CUDA index depends on `CUDA_VISIBLE_DEVICES` and `CUDA_DEVICE_ORDER` (by default
/// CUDA orders by its own idea of speed, not by PCI bus as NVML does), so a job's devices are
/// found by their id, never by assuming the two numberings agree.
pub fn ordinal_of_uuid(uuid: &str) -> Result<usize, CudaUnavailable> {
    let info = probe()?;
    // The older `MIG-GPU-<uuid>/<gi>/<ci>` form names an instance by its parent and ids, which
    // CUDA does not report. A process sees one MIG instance at most: then it is the only device.
    if uuid.starts_with("MIG-GPU-") && info.device_count == 1 {
        return Ok(0);
    }
    let mut seen = Vec::with_capacity(info.device_count);
    for ordinal in 0..info.device_count {
        let id = i32::try_from(ordinal)
            .ok()
            .and_then(|o| result::device::get(o).ok())
            .and_then(|dev| result::device::get_uuid(dev).ok());
        let Some(id) = id else { continue };
        let bytes = id.bytes.map(|b| b as u8);
        if same_uuid(uuid, &bytes) {
            return Ok(ordinal);
        }
        seen.push(format!("cuda:{ordinal} = {}", format_uuid(&bytes)));
    }
    Err(CudaUnavailable::NoSuchUuid {
        uuid: uuid.to_string(),
        seen: if seen.is_empty() {
            "no device".to_string()
        } else {
            seen.join(", ")
        },
    })
}

/// `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, the way NVML prints a UUID after its `GPU-`/`MIG-`.
pub fn format_uuid(bytes: &[u8; 16]) -> String {
    use orch_core::hex::encode;
    let b = bytes;
    format!(
        "{}-{}-{}-{}-{}",
        encode(&b[..4]),
        encode(&b[4..6]),
        encode(&b[6..8]),
        encode(&b[8..10]),
        encode(&b[10..])
    )
}

/// Whether NVML's `GPU-…`/`MIG-…` id names the device whose CUDA UUID is `bytes` (CUDA reports
/// a MIG instance's own UUID when the instance is what the process sees).
pub fn same_uuid(nvml_id: &str, bytes: &[u8; 16]) -> bool {
    let hex = nvml_id
        .strip_prefix("GPU-")
        .or_else(|| nvml_id.strip_prefix("MIG-"))
        .unwrap_or(nvml_id);
    hex.eq_ignore_ascii_case(&format_uuid(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids_compare_as_nvml_prints_them() {
        let bytes = [
            0x5c, 0x6e, 0x2a, 0x11, 0x8f, 0x0b, 0x4d, 0x2e, 0x9a, 0x41, 0x00, 0x3b, 0xc1, 0xd2,
            0xe3, 0xf4,
        ];
        assert_eq!(format_uuid(&bytes), "5c6e2a11-8f0b-4d2e-9a41-003bc1d2e3f4");
        assert!(same_uuid(
            "GPU-5c6e2a11-8f0b-4d2e-9a41-003bc1d2e3f4",
            &bytes
        ));
        assert!(same_uuid(
            "MIG-5C6E2A11-8F0B-4D2E-9A41-003BC1D2E3F4",
            &bytes
        ));
        assert!(!same_uuid(
            "GPU-5c6e2a11-8f0b-4d2e-9a41-003bc1d2e3f5",
            &bytes
        ));
        assert!(!same_uuid("GPU-5c6e2a11", &bytes), "a prefix is not the id");
    }

    #[test]
    fn absence_is_a_value_and_presence_gives_devices() {
        match probe() {
            Ok(info) => {
                assert!(info.driver_version > 0);
                if info.device_count > 0 {
                    check_context(0).expect("a context on device 0");
                }
            }
            Err(err) => {
                assert!(
                    std::env::var("ORCH_REQUIRE_GPU").as_deref() != Ok("1"),
                    "CUDA required: {err}"
                );
                assert!(matches!(
                    err,
                    CudaUnavailable::NoDriverLibrary | CudaUnavailable::InitFailed(_)
                ));
                // A second call must not panic either (cudarc would, were it called).
                assert_eq!(probe().unwrap_err(), err);
                assert!(check_context(0).is_err());
            }
        }
    }
}
