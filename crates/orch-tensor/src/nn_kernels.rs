//! CPU kernels for the layers CNNs and transformers need: 2-D convolution, max/average pooling,
//! layer and batch normalisation, and fused scaled-dot-product attention, each with its backward.
//!
//! The differentiable [`crate::Tensor`] ops (`conv2d`, `max_pool2d`, `avg_pool2d`, `layer_norm`,
//! `batch_norm`, `scaled_dot_product_attention`, one file each in `layers/`) run these kernels on
//! cpu and sim devices. Here each op is a **spec** validated from the caller's shapes and arguments
//! (bad arguments are [`TensorError`] values, never a panic or an out-of-bounds read) plus `forward` / `backward` functions over dense row-major `f32` slices the
//! caller owns. A spec states the output shape and `workspace_elems()`, the f32 temporaries its
//! kernels need, so a caller reserves output and workspace against the job's
//! [`crate::MemoryPool`] before allocating anything; the kernels themselves allocate nothing of
//! a size that depends on the input (a few words per task at most).
//!
//! Workspaces are made of **slots**, one per parallel task: `workspace_elems()` asks for one slot
//! per thread of the current rayon pool (at most one per unit of work), and a kernel given fewer
//! slots (at least one) runs that many tasks at once. Where partial sums are added across tasks
//! (conv2d's and layer norm's weight and bias gradients), they are kept per fixed group of
//! samples or rows and added in order, so results are the same bits whatever the thread count.
//!
//! | kernel | matches (PyTorch) | module docs |
//! | --- | --- | --- |
//! | [`conv2d_forward`], [`conv2d_backward`] | `torch.nn.functional.conv2d` | `cpu/conv.rs` |
//! | [`max_pool2d_forward`], [`max_pool2d_backward`] | `F.max_pool2d` (indices as `return_indices`) | `cpu/pool.rs` |
//! | [`avg_pool2d_forward`], [`avg_pool2d_backward`] | `F.avg_pool2d` (`count_include_pad=True`) | `cpu/pool.rs` |
//! | [`layer_norm_forward`], [`layer_norm_backward`] | `F.layer_norm` (and `torch.native_layer_norm`'s mean/rstd) | `cpu/norm.rs` |
//! | [`batch_norm_forward`], [`batch_norm_backward`] | `F.batch_norm` (train and eval, momentum 0.1) | `cpu/norm.rs` |
//! | [`attention_forward`], [`attention_backward`] | `F.scaled_dot_product_attention` | `cpu/attention.rs` |

use crate::error::{Result, TensorError};

pub use crate::cpu::attention::{
    AttentionMask, AttentionSpec, BLOCK_K, BLOCK_Q, MaskKind, attention_backward, attention_forward,
};
pub use crate::cpu::conv::{Conv2dSpec, conv2d_backward, conv2d_forward};
pub use crate::cpu::norm::{
    BatchNormMode, BatchNormSpec, LayerNormSpec, RunningStats, batch_norm_backward,
    batch_norm_forward, layer_norm_backward, layer_norm_forward,
};
pub use crate::cpu::pool::{
    Pool2dSpec, avg_pool2d_backward, avg_pool2d_forward, max_pool2d_backward, max_pool2d_forward,
};

/// An error for a buffer whose length is not the one the spec needs.
pub(crate) fn check_len(op: &'static str, what: &str, got: usize, want: usize) -> Result<()> {
    if got == want {
        return Ok(());
    }
    Err(TensorError::InvalidShape {
        op,
        shape: vec![got],
        reason: format!("{what} holds {got} elements; this call needs {want}"),
    })
}

/// An error for a bad scalar argument (stride 0, negative eps...).
pub(crate) fn bad_arg(op: &'static str, shape: &[usize], reason: String) -> TensorError {
    TensorError::InvalidShape {
        op,
        shape: shape.to_vec(),
        reason,
    }
}

/// Product of sizes, or an error past [`crate::MAX_NUMEL`] (workspace and column sizes).
pub(crate) fn checked_product(op: &'static str, what: &str, dims: &[usize]) -> Result<usize> {
    dims.iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .filter(|&n| n <= crate::MAX_NUMEL)
        .ok_or_else(|| {
            bad_arg(
                op,
                dims,
                format!("{what} would exceed {} elements", crate::MAX_NUMEL),
            )
        })
}

/// Slots worth having for `units` independent units of work: one per rayon thread, at most one
/// per unit, at least one.
pub(crate) fn wanted_slots(units: usize) -> usize {
    rayon::current_num_threads().min(units).max(1)
}

/// How many slots of `slot_len` the caller's workspace holds (capped at `units`), or an error
/// when it holds none although work needs one.
pub(crate) fn usable_slots(
    op: &'static str,
    ws_len: usize,
    slot_len: usize,
    units: usize,
) -> Result<usize> {
    if slot_len == 0 {
        return Ok(wanted_slots(units));
    }
    let slots = (ws_len / slot_len).min(units.max(1));
    if slots == 0 && units > 0 {
        return Err(TensorError::InvalidShape {
            op,
            shape: vec![ws_len],
            reason: format!(
                "workspace holds {ws_len} elements; at least {slot_len} are needed (see workspace_elems)"
            ),
        });
    }
    Ok(slots.max(1))
}
