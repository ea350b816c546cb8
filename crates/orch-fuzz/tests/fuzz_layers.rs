//! Fuzz target: the layer ops' argument checks (conv2d, pooling, layer and batch norm,
//! attention, embedding) and the ops themselves, over shapes with zero-size and huge
//! dimensions and arguments of 0 or past the input (see `orch_fuzz::layers`).
//!
//! Invariant: no panic, no hang, no allocation past the bound; every refusal one sentence; the
//! op refuses whatever its argument check refuses and otherwise gives the spec's shape.

use orch_fuzz::layers::{CASE_BYTES, CASE_TIME, check, layer_call};
use orch_fuzz::{Bounds, fuzz};
use proptest::prelude::*;

#[test]
fn fuzz_layer_ops() {
    let bounds = Bounds {
        // A case runs one op and its backward on at most 8 MiB of tensors.
        case_time: CASE_TIME,
        case_bytes: CASE_BYTES,
    };
    fuzz("layers", bounds, (layer_call(), any::<bool>()), check);
}
