//! Shared vocabulary of orch: byte sizes with units, source locations in user files, the
//! error every user-file parser returns, the job spec (`job.toml`), and what counts as printable
//! text.
//!
//! Design decision: this crate knows nothing of devices, wasmtime or CUDA, so every other crate
//! can depend on it and it never drags a heavy dependency along.

pub mod checkpoint;
pub mod cpulist;
pub mod duration;
pub mod fsutil;
pub mod hex;
pub mod job;
pub mod lease;
pub mod limits;
pub mod location;
pub mod process;
pub mod random;
pub mod size;
pub mod sync;
pub mod text;
pub mod time;

pub use cpulist::CpuList;
pub use job::{JobSpec, PluginRef};
pub use lease::DeviceLease;
pub use limits::{Bounds, LimitSettings, MachineLimits};
pub use location::{InputError, Location};
pub use size::{ByteSize, SizeParseError};
