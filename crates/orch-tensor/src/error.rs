//! The one error type of the crate: every failure a caller can cause is a value, never a panic.

use crate::Device;

/// Why a tensor operation failed. Fields name the op and the device so a message needs no context.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum TensorError {
    #[error("{op}: shapes {lhs:?} and {rhs:?} do not fit together")]
    ShapeMismatch {
        op: &'static str,
        lhs: Vec<usize>,
        rhs: Vec<usize>,
    },

    #[error("{op}: shape {shape:?} is not valid here: {reason}")]
    InvalidShape {
        op: &'static str,
        shape: Vec<usize>,
        reason: String,
    },

    #[error("{op}: axis {axis} is out of range for a tensor of rank {rank}")]
    InvalidAxis {
        op: &'static str,
        axis: isize,
        rank: usize,
    },

    #[error("{op}: axis list {axes:?} names an axis twice (a tensor of rank {rank})")]
    RepeatedAxis {
        op: &'static str,
        axes: Vec<isize>,
        rank: usize,
    },

    #[error("{op}: tensors live on different devices ({lhs} and {rhs}); move one with `to`")]
    DeviceMismatch {
        op: &'static str,
        lhs: Device,
        rhs: Device,
    },

    #[error(
        "out of memory on {device}: {requested} bytes requested, {in_use} in use, limit {limit}"
    )]
    OutOfMemory {
        requested: u64,
        in_use: u64,
        limit: u64,
        device: Device,
    },

    /// An argument other than a shape or axis is out of its domain (a bound, a probability, an
    /// index value).
    #[error("{op}: {reason}")]
    InvalidArgument { op: &'static str, reason: String },

    #[error("{op}: label {label} is not a class index in 0..{classes}")]
    InvalidLabel {
        op: &'static str,
        label: f32,
        classes: usize,
    },

    #[error("CUDA error in {op} on {device}: {reason}")]
    Cuda {
        op: &'static str,
        device: Device,
        reason: String,
    },

    #[error("CUDA is not usable: {0}")]
    CudaUnavailable(String),

    #[error(
        "autograd: {limit} graph nodes are alive, the most allowed; drop tensors computed from parameters, or compute under no-grad"
    )]
    GraphLimit { limit: usize },

    #[error("backward: {0}")]
    Autograd(String),

    #[error("{op}: {reason}")]
    Optimizer { op: &'static str, reason: String },

    /// An op too large for the time left before the caller's deadline (refused before it ran),
    /// or stopped part-way at it (see `work.rs`).
    #[error("{op}: {reason}")]
    Deadline { op: &'static str, reason: String },

    /// A broken invariant of this crate (a bug): reported, never a panic.
    #[error("internal error in {op}: {reason}")]
    Internal { op: &'static str, reason: String },
}

/// Shorthand used across the crate.
pub type Result<T> = std::result::Result<T, TensorError>;
