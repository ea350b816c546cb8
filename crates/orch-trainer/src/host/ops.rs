//! What the 0.3.0 ops need beyond one call into orch-tensor: bounds on lists of handles, pad
//! widths, several results given at once, and the coordinates of a dropout mask.

use super::convert::{Fail, bad};
use super::{Phase, ReplicaState};
use orch_tensor::{Dropout, Tensor};
use orch_wit::trainer::orch::plugin::tensors::{Tensor as WitTensor, TensorError as WitError};
use wasmtime::component::Resource;

/// Most tensors one `concat` joins, and most pieces one `split` makes.
pub(crate) const MAX_PIECES: usize = 1024;

/// A list of `len` tensors or sizes for `op`, within [`MAX_PIECES`].
pub(crate) fn check_list_len(op: &str, len: usize) -> Result<(), Fail> {
    if len == 0 || len > MAX_PIECES {
        return Err(bad(format!("{op}: {len} pieces; give 1 to {MAX_PIECES}")));
    }
    Ok(())
}

/// `pad`'s `(before, after)` pairs (one per dimension, rank checked) as orch-tensor takes them.
pub(crate) fn widths(pairs: &[(u32, u32)]) -> Result<Vec<(usize, usize)>, Fail> {
    super::convert::check_rank("tensors.pad", pairs.len())?;
    Ok(pairs
        .iter()
        .map(|&(before, after)| (before as usize, after as usize))
        .collect())
}

/// A `(rows, columns)` pair of a layer op (stride, padding, kernel, dilation) as orch-tensor
/// takes it; orch-tensor checks the values (a stride of 0 is its `bad-argument`).
pub(crate) fn pair(what: &str, (a, b): (u32, u32)) -> Result<[usize; 2], Fail> {
    let one = |v: u32| usize::try_from(v).map_err(|_| bad(format!("{what}: {v} is past usize")));
    Ok([one(a)?, one(b)?])
}

impl ReplicaState {
    /// The tensor behind an optional handle (a bias, a weight, a mask).
    pub(crate) fn optional(
        &self,
        handle: Option<&Resource<WitTensor>>,
    ) -> Result<Option<Tensor>, Fail> {
        handle.map(|h| self.tensor(h)).transpose()
    }

    /// Handles on every tensor of `tensors`, or none of them (the cap is checked first, so a
    /// refusal leaves no handle behind that the plugin never received).
    pub(crate) fn give_all(
        &mut self,
        tensors: Vec<Tensor>,
    ) -> Result<Vec<Resource<WitTensor>>, Fail> {
        let room = self.shared.max_tensors.saturating_sub(self.live_tensors);
        if tensors.len() > room as usize {
            return Err(Fail::Wit(WitError::TooManyTensors(self.shared.max_tensors)));
        }
        tensors.into_iter().map(|t| self.give(t)).collect()
    }

    /// The mask coordinates of the next `dropout` call: the job's seed, the step, the call's
    /// place among this step's dropouts (its site) and the global index of this replica's
    /// first row in the step's batch. Outside `train-step` dropout is the identity.
    pub(crate) fn dropout_mask(&mut self, p: f32) -> Dropout {
        let seed = self.shared.seed;
        match &mut self.phase {
            Phase::Train(slot) => {
                let site = slot.dropout_sites;
                slot.dropout_sites += 1;
                Dropout {
                    p,
                    seed,
                    step: slot.step,
                    site,
                    sample_offset: slot.offset as u64,
                    training: true,
                }
            }
            _ => Dropout {
                p,
                seed,
                step: 0,
                site: 0,
                sample_offset: 0,
                training: false,
            },
        }
    }
}
