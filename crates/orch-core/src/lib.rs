//! Shared vocabulary of orch: byte sizes with units, source locations in user files, and the
//! error every user-file parser returns.
//!
//! Design decision: this crate knows nothing of devices, wasmtime or CUDA, so every other crate
//! can depend on it and it never drags a heavy dependency along.

pub mod lease;
pub mod location;
pub mod size;

pub use lease::DeviceLease;
pub use location::{InputError, Location};
pub use size::{ByteSize, SizeParseError};
