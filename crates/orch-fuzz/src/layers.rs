//! Layer ops over degenerate shapes: what the `fuzz_layers` target and the `layer_shapes`
//! property test share.
//!
//! A case is one layer op (conv2d, max and average pooling, layer and batch norm, attention,
//! embedding) with shapes and arguments drawn near the edges: zero-size dimensions, ones,
//! small sizes, and huge ones (2^31, 2^40, `usize::MAX`), kernels, strides, paddings,
//! dilations and groups of 0 or past the input. [`check`] calls the op's argument check (its
//! spec's `new`, orch-tensor's public `nn_kernels` API) and then the op itself on a simulated
//! GPU of 8 MiB, inputs requiring grad, then backward. Inputs small enough are real tensors;
//! larger ones are expanded views of one element (they cost nothing, so the op itself meets the
//! huge shape and must refuse it before allocating).
//!
//! Invariant: no panic; every refusal one sentence; the op refuses whatever its argument check
//! refuses, and otherwise gives the spec's output shape or an error value (the quota, the
//! deadline); the pool is empty once the case's tensors are dropped. The case's host memory is
//! bounded by the runner (fuzz target) or by [`check`]'s own measure (property test).

use crate::{alloc, sentence};
use orch_tensor::nn_kernels::{
    AttentionMask, AttentionSpec, BatchNormMode, BatchNormSpec, Conv2dSpec, LayerNormSpec,
    MaskKind, Pool2dSpec,
};
use orch_tensor::{Device, MemoryPool, Tensor, TensorError, with_deadline};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The simulated GPU's memory (its tensors' bound).
pub const DEVICE_BYTES: u64 = 8 << 20;

/// Most host bytes one case may hold at once: the device's tensors, the kernels' workspace
/// (reserved on the device too) and what orch keeps beside them.
pub const CASE_BYTES: usize = 64 << 20;

/// Inputs of at most this many elements are real tensors; larger ones are expanded views.
const REAL_ELEMENTS: usize = 4096;

/// One layer op call.
#[derive(Debug, Clone)]
pub enum LayerCall {
    Conv2d {
        input: [usize; 4],
        weight: [usize; 4],
        bias: bool,
        stride: [usize; 2],
        padding: [usize; 2],
        dilation: [usize; 2],
        groups: usize,
    },
    Pool {
        max: bool,
        input: [usize; 4],
        kernel: [usize; 2],
        stride: [usize; 2],
        padding: [usize; 2],
    },
    LayerNorm {
        input: Vec<usize>,
        dims: usize,
        affine: bool,
        eps: f32,
    },
    BatchNorm {
        input: Vec<usize>,
        /// Length of the running statistics (the input's channels, or not).
        stats: usize,
        affine: bool,
        training: bool,
        momentum: f32,
        eps: f32,
    },
    Attention {
        q: [usize; 4],
        k: [usize; 4],
        v: [usize; 4],
        causal: bool,
        mask: Option<Vec<usize>>,
        scale: Option<f32>,
    },
    Embedding {
        table: [usize; 2],
        indices: Vec<usize>,
        index: f32,
    },
}

/// A dimension: mostly small, sometimes zero, sometimes huge.
pub fn dim() -> BoxedStrategy<usize> {
    prop_oneof![
        10 => 0..5usize,
        4 => 5..40usize,
        1 => Just(1usize << 16),
        1 => Just(1usize << 31),
        1 => Just(1usize << 40),
        1 => Just(usize::MAX / 2),
        1 => Just(usize::MAX),
    ]
    .boxed()
}

/// A kernel, stride, padding or dilation: mostly 0 to 3, sometimes huge.
fn arg() -> BoxedStrategy<usize> {
    prop_oneof![
        12 => 0..4usize,
        1 => 4..70usize,
        1 => Just(1usize << 31),
        1 => Just(usize::MAX / 2),
        1 => Just(usize::MAX),
    ]
    .boxed()
}

fn pair() -> BoxedStrategy<[usize; 2]> {
    [arg(), arg()].boxed()
}

fn quad() -> BoxedStrategy<[usize; 4]> {
    [dim(), dim(), dim(), dim()].boxed()
}

fn float() -> BoxedStrategy<f32> {
    prop_oneof![
        4 => Just(1e-5f32),
        1 => Just(0.0f32),
        1 => Just(-1.0f32),
        1 => Just(0.1f32),
        1 => Just(f32::NAN),
        1 => Just(f32::INFINITY),
        1 => Just(f32::MAX),
    ]
    .boxed()
}

/// Layer op calls near the edges.
pub fn layer_call() -> BoxedStrategy<LayerCall> {
    let conv = (
        quad(),
        quad(),
        any::<bool>(),
        (pair(), pair(), pair()),
        prop_oneof![4 => 1..3usize, 1 => Just(0usize), 1 => 3..9usize],
    )
        .prop_map(
            |(input, weight, bias, (stride, padding, dilation), groups)| LayerCall::Conv2d {
                input,
                weight,
                bias,
                stride,
                padding,
                dilation,
                groups,
            },
        );
    let pool = (any::<bool>(), quad(), pair(), pair(), pair()).prop_map(
        |(max, input, kernel, stride, padding)| LayerCall::Pool {
            max,
            input,
            kernel,
            stride,
            padding,
        },
    );
    let layer_norm = (
        prop::collection::vec(dim(), 0..5),
        0..6usize,
        any::<bool>(),
        float(),
    )
        .prop_map(|(input, dims, affine, eps)| LayerCall::LayerNorm {
            input,
            dims,
            affine,
            eps,
        });
    let batch_norm = (
        prop::collection::vec(dim(), 0..5),
        dim(),
        any::<bool>(),
        any::<bool>(),
        float(),
        float(),
    )
        .prop_map(
            |(input, stats, affine, training, momentum, eps)| LayerCall::BatchNorm {
                stats: input
                    .get(1)
                    .copied()
                    .filter(|_| stats % 4 != 0)
                    .unwrap_or(stats),
                input,
                affine,
                training,
                momentum,
                eps,
            },
        );
    let attention = (
        quad(),
        quad(),
        quad(),
        any::<bool>(),
        prop::option::of(prop::collection::vec(dim(), 0..5)),
        prop::option::of(float()),
    )
        .prop_map(|(q, k, v, causal, mask, scale)| {
            // Mostly shapes that fit together, so the kernels run.
            let k = if k[0] % 3 == 0 {
                k
            } else {
                [q[0], q[1], k[2], q[3]]
            };
            let v = if v[0] % 3 == 0 {
                v
            } else {
                [k[0], k[1], k[2], v[3]]
            };
            LayerCall::Attention {
                q,
                k,
                v,
                causal,
                mask,
                scale,
            }
        });
    let embedding = (
        [dim(), dim()],
        prop::collection::vec(dim(), 0..3),
        prop_oneof![
            Just(0.0f32),
            Just(1.0),
            Just(-1.0),
            Just(0.5),
            Just(f32::NAN),
            Just(1e9)
        ],
    )
        .prop_map(|(table, indices, index)| LayerCall::Embedding {
            table,
            indices,
            index,
        });
    prop_oneof![
        conv.boxed(),
        pool.boxed(),
        layer_norm.boxed(),
        batch_norm.boxed(),
        attention.boxed(),
        embedding.boxed(),
    ]
    .boxed()
}

/// A tensor of `shape` requiring grad: real values when small, else an expanded view of one
/// element (which may itself be refused, as a value).
fn input(shape: &[usize], pool: &Arc<MemoryPool>, seed: u64) -> orch_tensor::Result<Tensor> {
    let small = shape
        .iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .is_some_and(|n| n <= REAL_ELEMENTS);
    let t = match small {
        true => Tensor::randn(shape, seed, pool)?,
        false => Tensor::ones(&[1], pool)?.broadcast_to(shape)?,
    };
    Ok(t.with_requires_grad())
}

/// The spec's verdict: its output shape, or its refusal.
type Verdict = Result<Vec<usize>, TensorError>;

/// What the argument check says of `call` (no tensor is made).
fn argument_check(call: &LayerCall) -> Verdict {
    match call {
        LayerCall::Conv2d {
            input,
            weight,
            bias,
            stride,
            padding,
            dilation,
            groups,
        } => {
            let b = [weight[0]];
            let spec = Conv2dSpec::new(
                input,
                weight,
                bias.then_some(&b[..]),
                *stride,
                *padding,
                *dilation,
                *groups,
            )?;
            let _ = spec.workspace_elems();
            Ok(spec.out_shape().to_vec())
        }
        LayerCall::Pool {
            input,
            kernel,
            stride,
            padding,
            ..
        } => {
            let spec = Pool2dSpec::new(input, *kernel, *stride, *padding)?;
            let _ = (spec.workspace_elems(), spec.out_numel());
            Ok(spec.out_shape().to_vec())
        }
        LayerCall::LayerNorm {
            input, dims, eps, ..
        } => {
            let normalized = &input[input.len().saturating_sub(*dims)..];
            let spec = LayerNormSpec::new(input, normalized, *eps)?;
            let _ = (spec.workspace_elems(), spec.rows(), spec.cols());
            Ok(spec.out_shape().to_vec())
        }
        LayerCall::BatchNorm {
            input,
            training,
            momentum,
            eps,
            ..
        } => {
            let mode = match training {
                true => BatchNormMode::Train,
                false => BatchNormMode::Eval,
            };
            let spec = BatchNormSpec::new(input, mode, *momentum, *eps)?;
            let _ = (spec.workspace_elems(), spec.channels());
            Ok(spec.out_shape().to_vec())
        }
        LayerCall::Attention {
            q,
            k,
            v,
            causal,
            mask,
            scale,
        } => {
            let mask = mask.as_deref().map(|shape| AttentionMask {
                kind: MaskKind::Additive,
                shape,
            });
            let spec = AttentionSpec::new(q, k, v, *causal, mask, *scale)?;
            let _ = (spec.workspace_elems(), spec.lse_len(), spec.mask_len());
            Ok(spec.out_shape().to_vec())
        }
        // Embedding has no spec: the op's own checks are the argument check.
        LayerCall::Embedding { table, indices, .. } => Ok([&indices[..], &table[1..]].concat()),
    }
}

/// Runs the op on `pool`, then backward when it gave a tensor.
fn run_op(call: &LayerCall, pool: &Arc<MemoryPool>) -> orch_tensor::Result<Vec<usize>> {
    let y = match call {
        LayerCall::Conv2d {
            input: shape,
            weight,
            bias,
            stride,
            padding,
            dilation,
            groups,
        } => {
            let x = input(shape, pool, 1)?;
            let w = input(weight, pool, 2)?;
            let b = match bias {
                true => Some(input(&[weight[0]], pool, 3)?),
                false => None,
            };
            x.conv2d(&w, b.as_ref(), *stride, *padding, *dilation, *groups)?
        }
        LayerCall::Pool {
            max,
            input: shape,
            kernel,
            stride,
            padding,
        } => {
            let x = input(shape, pool, 1)?;
            match max {
                true => x.max_pool2d(*kernel, *stride, *padding)?,
                false => x.avg_pool2d(*kernel, *stride, *padding)?,
            }
        }
        LayerCall::LayerNorm {
            input: shape,
            dims,
            affine,
            eps,
        } => {
            let x = input(shape, pool, 1)?;
            let normalized = &shape[shape.len().saturating_sub(*dims)..];
            let (w, b) = match affine {
                true => (
                    Some(input(normalized, pool, 2)?),
                    Some(input(normalized, pool, 3)?),
                ),
                false => (None, None),
            };
            x.layer_norm(*dims, w.as_ref(), b.as_ref(), *eps)?
        }
        LayerCall::BatchNorm {
            input: shape,
            stats,
            affine,
            training,
            momentum,
            eps,
        } => {
            let x = input(shape, pool, 1)?;
            let mean = Tensor::zeros(&[*stats], pool)?;
            let var = Tensor::ones(&[*stats], pool)?;
            let (w, b) = match affine {
                true => (
                    Some(input(&[*stats], pool, 2)?),
                    Some(input(&[*stats], pool, 3)?),
                ),
                false => (None, None),
            };
            x.batch_norm(
                &mean,
                &var,
                w.as_ref(),
                b.as_ref(),
                *training,
                *momentum,
                *eps,
            )?
        }
        LayerCall::Attention {
            q,
            k,
            v,
            causal,
            mask,
            scale,
        } => {
            let (q, k, v) = (input(q, pool, 1)?, input(k, pool, 2)?, input(v, pool, 3)?);
            let mask = mask.as_deref().map(|m| input(m, pool, 4)).transpose()?;
            Tensor::scaled_dot_product_attention(&q, &k, &v, *causal, mask.as_ref(), *scale)?
        }
        LayerCall::Embedding {
            table,
            indices,
            index,
        } => {
            let table = input(table, pool, 1)?;
            let idx = Tensor::full(indices, *index, pool)?;
            table.embedding(&idx)?
        }
    };
    let shape = y.shape().to_vec();
    y.sum_all()?.backward()?;
    Ok(shape)
}

/// Checks one call (see the module's invariant), run under a deadline as the trainer host runs
/// ops: two seconds, or (`tight`) one millisecond, which refuses or stops most ops part-way.
pub fn check((call, tight): (LayerCall, bool)) -> Result<(), TestCaseError> {
    let caught = |what: &str, panic: Box<dyn std::any::Any + Send>| {
        let message = panic
            .downcast_ref::<&str>()
            .map(|s| (*s).to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        TestCaseError::fail(format!("{what} panicked: {message}"))
    };
    let spec = std::panic::catch_unwind(|| argument_check(&call))
        .map_err(|p| caught("the argument check", p))?;
    if let Err(e) = &spec {
        sentence::check(&e.to_string())?;
    }
    let device = MemoryPool::new(Device::Sim(0), Some(DEVICE_BYTES)).map_err(|e| {
        TestCaseError::fail(format!("the sim device's pool could not be made: {e}"))
    })?;
    let pool = MemoryPool::with_parent(&device, None);
    let bound = match tight {
        true => Duration::from_millis(1),
        false => Duration::from_secs(2),
    };
    let bound = Instant::now().checked_add(bound);
    let outcome = std::panic::catch_unwind(|| with_deadline(bound, || run_op(&call, &pool)))
        .map_err(|p| caught("the op", p))?;
    match (&spec, outcome) {
        (Ok(want), Ok(got)) => prop_assert_eq!(want, &got, "the op's shape is not the spec's"),
        (Err(refused), Ok(got)) => {
            return Err(TestCaseError::fail(format!(
                "the op gave {got:?} where its argument check refused: {refused}"
            )));
        }
        (_, Err(e)) => sentence::check(&e.to_string())?,
    }
    prop_assert_eq!(pool.in_use(), 0, "memory outlives the case's tensors");
    Ok(())
}

/// Longest one case may run (a hang shows as a case past this).
pub const CASE_TIME: Duration = Duration::from_secs(5);

/// [`check`] with the case's host memory and time measured: a case holding more than
/// [`CASE_BYTES`] at once (an allocation past four times that aborts, naming `seed`) or
/// running past [`CASE_TIME`] fails.
pub fn check_bounded(case: (LayerCall, bool), seed: u64) -> Result<(), TestCaseError> {
    let base = alloc::start_case(seed, CASE_BYTES.saturating_mul(4));
    let started = Instant::now();
    let outcome = check(case);
    let took = started.elapsed();
    let held = alloc::end_case(base);
    outcome?;
    prop_assert!(
        took <= CASE_TIME,
        "one case took {took:?}, past {CASE_TIME:?}"
    );
    prop_assert!(
        held <= CASE_BYTES,
        "one case held {held} bytes at once, past {CASE_BYTES}"
    );
    Ok(())
}
