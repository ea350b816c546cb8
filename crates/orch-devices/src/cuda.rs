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

#[cfg(test)]
mod tests {
    use super::*;

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
