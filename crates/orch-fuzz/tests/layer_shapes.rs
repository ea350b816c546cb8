//! Property test: every layer op's argument check and the op itself, over random shapes with
//! zero-size and huge dimensions, never panic and never hold more than a bounded amount of host
//! memory (see `orch_fuzz::layers`). Fixed edge cases, then a fixed number of random cases, in
//! the binary's one test, so it runs in a few seconds in `cargo test`; the `fuzz_layers` target
//! searches the same space for longer.

use orch_fuzz::layers::{LayerCall, check_bounded, layer_call};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

/// The binary's one test (the counting allocator's peak and limit are process-wide, so no
/// other test may allocate beside a case): the edge cases, then the random search.
#[test]
fn layer_ops_never_panic_over_degenerate_shapes() {
    edge_cases_of_each_layer_op();
    let mut runner = TestRunner::new(Config {
        cases: 300,
        failure_persistence: None,
        ..Config::default()
    });
    if let Err(e) = runner.run(&(layer_call(), any::<bool>()), |case| {
        check_bounded(case, 0)
    }) {
        panic!("{e}");
    }
}

/// Cases the random search may miss, checked every run: an empty plane that padding alone
/// would give an output (conv2d's kernel panicked on it), windows far past the input, a batch
/// norm of no values over 2^31 samples, and dimensions at the edge of `usize`.
fn edge_cases_of_each_layer_op() {
    let huge = usize::MAX;
    let cases = [
        LayerCall::Conv2d {
            input: [1, 1, 0, 0],
            weight: [1, 1, 1, 1],
            bias: true,
            stride: [1, 1],
            padding: [1, 1],
            dilation: [1, 1],
            groups: 1,
        },
        LayerCall::Conv2d {
            input: [2, 2, 0, 5],
            weight: [2, 1, 3, 3],
            bias: false,
            stride: [2, 1],
            padding: [2, 2],
            dilation: [2, 1],
            groups: 2,
        },
        LayerCall::Conv2d {
            input: [1, 1, 4, 4],
            weight: [1, 1, huge, 1],
            bias: false,
            stride: [1, 1],
            padding: [huge, 0],
            dilation: [huge, 1],
            groups: 1,
        },
        LayerCall::Pool {
            max: true,
            input: [1, 1, 4, 4],
            kernel: [huge, huge],
            stride: [huge, 1],
            padding: [huge / 2, 0],
        },
        LayerCall::Pool {
            max: false,
            input: [0, 3, 4, 4],
            kernel: [2, 2],
            stride: [2, 2],
            padding: [1, 1],
        },
        LayerCall::LayerNorm {
            input: vec![0, huge],
            dims: 1,
            affine: true,
            eps: 1e-5,
        },
        // No values in 2^31 samples: backward looped over every sample's empty block per
        // channel (found by fuzz_layers).
        LayerCall::BatchNorm {
            input: vec![1 << 31, 3, 1 << 16, 0],
            stats: 3,
            affine: true,
            training: false,
            momentum: 0.1,
            eps: 0.0,
        },
        LayerCall::BatchNorm {
            input: vec![0, 3, 0],
            stats: 3,
            affine: true,
            training: true,
            momentum: 0.1,
            eps: 1e-5,
        },
        LayerCall::Attention {
            q: [1, 1, 1 << 40, 1],
            k: [1, 1, 1 << 40, 1],
            v: [1, 1, 1 << 40, 1],
            causal: true,
            mask: None,
            scale: None,
        },
        LayerCall::Attention {
            q: [1, 0, 3, 2],
            k: [1, 0, 3, 2],
            v: [1, 0, 3, 2],
            causal: false,
            mask: Some(vec![3, 3]),
            scale: Some(f32::NAN),
        },
        LayerCall::Embedding {
            table: [0, 4],
            indices: vec![2],
            index: 0.0,
        },
    ];
    for call in cases {
        for tight in [false, true] {
            check_bounded((call.clone(), tight), 0).unwrap_or_else(|e| panic!("{call:?}: {e}"));
        }
    }
}
