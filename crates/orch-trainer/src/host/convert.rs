//! Between orch-tensor's types and the contract's: errors, shapes, axes.

use super::ReplicaState;
use orch_tensor::{MAX_RANK, TensorError};
use orch_wit::trainer::orch::plugin::tensors::{
    OutOfMemory, ShapeMismatch, TensorError as WitError,
};

/// Why a host function failed, before it is turned into a value or a trap.
#[derive(Debug)]
pub(crate) enum Fail {
    /// An op failed: a value for the plugin, once devices are named by logical index.
    Tensor(TensorError),
    /// A value for the plugin as it is.
    Wit(WitError),
    /// The host stops the plugin (a trap): the job is being stopped.
    Abort(String),
    /// The plugin named a handle it does not hold: a plugin bug, so a trap (as the WIT says).
    BadHandle(String),
}

impl From<TensorError> for Fail {
    fn from(e: TensorError) -> Fail {
        Fail::Tensor(e)
    }
}

impl From<WitError> for Fail {
    fn from(e: WitError) -> Fail {
        Fail::Wit(e)
    }
}

/// A bad argument, as a failure.
pub(crate) fn bad(message: impl Into<String>) -> Fail {
    Fail::Wit(WitError::BadArgument(message.into()))
}

impl ReplicaState {
    /// `e` as the plugin sees it: devices by logical index, shapes as `u32`.
    pub(crate) fn convert(&self, e: TensorError) -> WitError {
        match e {
            TensorError::OutOfMemory {
                requested,
                in_use,
                limit,
                device,
            } => WitError::OutOfMemory(OutOfMemory {
                device: self.logical(device),
                requested,
                in_use,
                limit,
            }),
            TensorError::ShapeMismatch { op, lhs, rhs } => WitError::ShapeMismatch(ShapeMismatch {
                op: op.to_string(),
                lhs: to_u32(&lhs),
                rhs: to_u32(&rhs),
            }),
            TensorError::DeviceMismatch { lhs, rhs, .. } => {
                WitError::DeviceMismatch((self.logical(lhs), self.logical(rhs)))
            }
            TensorError::GraphLimit { limit } => {
                WitError::TooManyTensors(u32::try_from(limit).unwrap_or(u32::MAX))
            }
            e @ (TensorError::InvalidShape { .. }
            | TensorError::InvalidAxis { .. }
            | TensorError::RepeatedAxis { .. }
            | TensorError::InvalidLabel { .. }
            | TensorError::InvalidArgument { .. }
            | TensorError::Autograd(_)
            | TensorError::Optimizer { .. }) => WitError::BadArgument(e.to_string()),
            other => WitError::Failed(other.to_string()),
        }
    }
}

/// Dimensions for the plugin (a dimension past `u32::MAX` cannot be made through the contract).
pub(crate) fn to_u32(dims: &[usize]) -> Vec<u32> {
    dims.iter()
        .map(|&d| u32::try_from(d).unwrap_or(u32::MAX))
        .collect()
}

pub(crate) fn to_usize(dims: &[u32]) -> Vec<usize> {
    dims.iter().map(|&d| d as usize).collect()
}

/// A list with one entry per dimension (a shape, a permutation, axes, pad widths) that `call`
/// was given: at most [`MAX_RANK`] entries, checked on the list as it arrived, before anything
/// is widened, copied or quoted (the list is the plugin's, of any length its memory holds).
pub(crate) fn check_rank(call: &str, len: usize) -> Result<(), Fail> {
    if len > MAX_RANK {
        return Err(bad(format!(
            "{call}: a list of {len} dimensions; a tensor has at most {MAX_RANK}"
        )));
    }
    Ok(())
}

/// A shape `call` was given, rank checked, as orch-tensor takes it.
pub(crate) fn shape(call: &str, dims: &[u32]) -> Result<Vec<usize>, Fail> {
    check_rank(call, dims.len())?;
    Ok(to_usize(dims))
}

/// Axes (or an `expand` shape) `call` was given, rank checked, as orch-tensor takes them.
pub(crate) fn axes(call: &str, axes: &[i32]) -> Result<Vec<isize>, Fail> {
    check_rank(call, axes.len())?;
    Ok(axes.iter().map(|&a| a as isize).collect())
}
