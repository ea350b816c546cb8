use orch_core::InputError;
use std::path::PathBuf;

/// Everything that can go wrong finding devices. Each variant says what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    #[error(
        "unknown device inventory \"{0}\": use auto, nvml, cpu or sim:PATH (for example sim:examples/sim/lab-8gpu.toml)"
    )]
    BadSpec(String),
    #[error("cannot read the simulated inventory {path}: {source}")]
    SimRead {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("invalid simulated inventory: {0}")]
    SimInvalid(#[from] InputError),
    #[error("NVML is not available: {0}")]
    NvmlUnavailable(String),
    #[error("NVML found no GPU on this machine")]
    NoGpu,
    #[error("NVML failed reading {what} of GPU {index}: {reason}")]
    NvmlRead {
        index: u32,
        what: &'static str,
        reason: String,
    },
    #[error("cannot read host information from {what}: {reason}")]
    Host { what: &'static str, reason: String },
}

impl DeviceError {
    /// True when the error is the user's input (a bad spec or file), false when the machine lacks
    /// something. Both are reported in one sentence; the CLI maps them to exit status 2.
    pub fn is_bad_input(&self) -> bool {
        matches!(
            self,
            DeviceError::BadSpec(_) | DeviceError::SimRead { .. } | DeviceError::SimInvalid(_)
        )
    }
}
