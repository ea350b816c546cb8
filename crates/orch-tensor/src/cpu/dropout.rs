//! Dropout: which elements are kept is a pure function of the job's seed, the step, the dropout
//! site, the sample's global index in the batch and the element's position within the sample
//! (`ops::DropoutMask`), computed by a counter-based hash on the fly. So no mask is stored (the
//! backward recomputes it), and a resumed run or a batch split over replicas draws exactly the
//! masks of one uninterrupted replica. The CUDA kernel (`dropout` in kernels.cu) computes the
//! same hash.

use super::{CpuStorage, PAR_MIN, build, each_chunk};
use crate::ops::DropoutMask;
use std::mem::MaybeUninit;

/// `x * scale` where the mask keeps an element, else 0, for dense `x` of `rows` samples.
pub(crate) fn dropout(x: &[f32], rows: usize, mask: &DropoutMask) -> CpuStorage {
    if x.is_empty() || rows == 0 {
        return Vec::new();
    }
    let per = x.len() / rows;
    let scale = mask.scale();
    let row = |r: usize, o: &mut [MaybeUninit<f32>]| {
        let key = mask.row_key(r as u64);
        for (e, (o, v)) in o.iter_mut().zip(&x[r * per..(r + 1) * per]).enumerate() {
            o.write(if mask.keeps(key, e as u64) {
                v * scale
            } else {
                0.0
            });
        }
    };
    build(x.len(), |out| {
        each_chunk(out, per, x.len() >= PAR_MIN && rows > 1, row)
    })
}
