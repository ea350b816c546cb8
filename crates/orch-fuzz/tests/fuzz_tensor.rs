//! Fuzz target: the trainer host's tensor ops (`orch:plugin/tensors`, autograd and
//! `params.register`), called through orch-tensor's public API exactly as
//! crates/orch-trainer/src/host/ calls it: shapes as `u32` lists, axes as `i32`, lists of `f32`,
//! on simulated GPUs with a device cap, a job quota and a graph-node budget. A case is a short
//! program of such calls on a register of live tensors. Shapes hold zeros and huge dimensions,
//! ranks pass the limit, axes are out of range or repeated, values are NaN, infinite or labels
//! out of range.
//!
//! Invariant: each call gives a tensor whose shape is within the limits, or an error value of
//! one sentence; never a panic, a hang or an allocation past the quota (host memory is bounded
//! by the case's allocation bound, device memory by the pools, which must be empty once the
//! program's tensors are dropped).

use orch_fuzz::{Bounds, fuzz, sentence};
use orch_tensor::{
    Device, GraphBudget, MAX_NUMEL, MAX_RANK, MemoryPool, Tensor, TensorError, no_grad,
    with_graph_budget,
};
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::TestCaseError;
use std::sync::Arc;
use std::time::Duration;

/// As in crates/orch-trainer/src/host/tensors.rs: most values one list carries.
const MAX_LIST_VALUES: usize = 1 << 20;
/// Each simulated GPU's memory: the device-wide cap over the job's quota.
const DEVICE_BYTES: u64 = 8 << 20;
/// Graph nodes one replica may keep alive (small, so the limit is reached).
const GRAPH_NODES: usize = 48;
/// Live tensors a program keeps (older ones are dropped, as a plugin drops handles).
const REGISTERS: usize = 8;

#[derive(Debug, Clone, Copy)]
enum Unary {
    Neg,
    Relu,
    Gelu,
    Tanh,
    Sigmoid,
    Exp,
    Log,
    Sqr,
}

#[derive(Debug, Clone, Copy)]
enum Binary {
    Add,
    Sub,
    Mul,
    Div,
}

#[derive(Debug, Clone, Copy)]
enum Reduce {
    Sum,
    Mean,
    Max,
}

/// One host call; `Index` picks a live tensor, `second` picks the second simulated GPU.
#[derive(Debug, Clone)]
enum Call {
    FromList {
        data: Vec<f32>,
        shape: Vec<u32>,
        second: bool,
    },
    Full {
        shape: Vec<u32>,
        value: f32,
        second: bool,
    },
    Randn {
        shape: Vec<u32>,
        std: f32,
        seed: u64,
    },
    Uniform {
        shape: Vec<u32>,
        low: f32,
        high: f32,
        seed: u64,
    },
    Matmul {
        a: Index,
        b: Index,
        transpose_a: bool,
        transpose_b: bool,
    },
    Linear {
        x: Index,
        weight: Index,
        bias: Option<Index>,
    },
    Unary(Unary, Index),
    Binary(Binary, Index, Index),
    Scalar(Binary, Index, f32),
    Affine(Index, f32, f32),
    Softmax {
        x: Index,
        axis: i32,
        log: bool,
    },
    CrossEntropy(Index, Index),
    Mse(Index, Index),
    Reduce {
        op: Reduce,
        x: Index,
        over: Vec<i32>,
        keepdim: bool,
    },
    Argmax(Index, i32),
    Correct(Index, Index),
    Reshape(Index, Vec<u32>),
    Transpose(Index, i32, i32),
    Detach(Index),
    ToDevice(Index, bool),
    Assign(Index, Index),
    ToList(Index),
    Item(Index),
    Backward(Index),
    Grad(Index),
    /// `params.register`: a dense copy that requires grad.
    Register(Index),
    /// A training step as a trainer writes it: `x [rows, inputs]` times a parameter
    /// `[inputs, classes]`, cross-entropy (or mean squared error) against `labels`, backward,
    /// and the count of correct rows. Degenerate sizes and labels reach the loss this way.
    Step {
        rows: u32,
        inputs: u32,
        classes: u32,
        labels: Vec<f32>,
        mse: bool,
    },
}

fn dim() -> impl Strategy<Value = u32> {
    prop_oneof![
        12 => 0..5u32,
        2 => prop::sample::select(&[0u32, 1, 7, 16, 64, 1000][..]),
        1 => prop::sample::select(&[46_341u32, 65_536, 1 << 20, 1 << 31, u32::MAX][..]),
    ]
}

fn shape() -> impl Strategy<Value = Vec<u32>> {
    prop_oneof![
        12 => prop::collection::vec(dim(), 0..5),
        1 => prop::collection::vec(0..3u32, MAX_RANK - 1..MAX_RANK + 8),
    ]
}

fn value() -> impl Strategy<Value = f32> {
    prop_oneof![
        6 => -3.0f32..3.0,
        2 => (0..12u32).prop_map(|n| n as f32),
        1 => prop::sample::select(
            &[f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -0.0, f32::MAX, f32::MIN, 1e30, 2.5, -1.0][..]
        ),
    ]
}

fn axis() -> impl Strategy<Value = i32> {
    prop_oneof![
        8 => -4..4i32,
        1 => prop::sample::select(&[i32::MIN, i32::MAX, -33, 32, 33][..]),
    ]
}

/// Elements of a shape, when small enough to write out.
fn small_numel(shape: &[u32]) -> Option<usize> {
    shape
        .iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d as usize))
        .filter(|&n| n <= 4096)
}

/// A list and a shape: mostly of matching length, so the values reach the ops.
fn from_list() -> impl Strategy<Value = Call> {
    (shape(), any::<bool>()).prop_flat_map(|(shape, second)| {
        let len = match small_numel(&shape) {
            Some(n) => prop_oneof![4 => Just(n), 1 => 0..64usize].boxed(),
            None => (0..64usize).boxed(),
        };
        len.prop_flat_map(move |len| {
            let shape = shape.clone();
            prop::collection::vec(value(), len).prop_map(move |data| Call::FromList {
                data,
                shape: shape.clone(),
                second,
            })
        })
    })
}

fn unary() -> impl Strategy<Value = Unary> {
    use Unary::*;
    prop::sample::select(&[Neg, Relu, Gelu, Tanh, Sigmoid, Exp, Log, Sqr][..])
}

fn binary() -> impl Strategy<Value = Binary> {
    use Binary::*;
    prop::sample::select(&[Add, Sub, Mul, Div][..])
}

fn step() -> impl Strategy<Value = Call> {
    (0..5u32, 0..5u32, 0..5u32, any::<bool>(), any::<bool>()).prop_flat_map(
        |(rows, inputs, classes, fit, mse)| {
            let len = if fit {
                rows as usize..rows as usize + 1
            } else {
                0..6
            };
            let label = prop_oneof![
                4 => (0..classes.max(1)).prop_map(|c| c as f32),
                1 => value(),
            ];
            prop::collection::vec(label, len).prop_map(move |labels| Call::Step {
                rows,
                inputs,
                classes,
                labels,
                mse,
            })
        },
    )
}

/// A call that makes tensors from nothing: how a program starts.
fn create() -> impl Strategy<Value = Call> {
    prop_oneof![
        4 => from_list(),
        2 => (shape(), value(), any::<bool>())
            .prop_map(|(shape, value, second)| Call::Full { shape, value, second }),
        2 => step(),
    ]
}

fn call() -> impl Strategy<Value = Call> {
    let i = any::<Index>;
    prop_oneof![
        3 => step(),
        4 => from_list(),
        2 => (shape(), value(), any::<bool>())
            .prop_map(|(shape, value, second)| Call::Full { shape, value, second }),
        1 => (shape(), value(), any::<u64>())
            .prop_map(|(shape, std, seed)| Call::Randn { shape, std, seed }),
        1 => (shape(), value(), value(), any::<u64>())
            .prop_map(|(shape, low, high, seed)| Call::Uniform { shape, low, high, seed }),
        2 => (i(), i(), any::<bool>(), any::<bool>()).prop_map(|(a, b, transpose_a, transpose_b)| {
            Call::Matmul { a, b, transpose_a, transpose_b }
        }),
        1 => (i(), i(), prop::option::of(i()))
            .prop_map(|(x, weight, bias)| Call::Linear { x, weight, bias }),
        2 => (unary(), i()).prop_map(|(op, x)| Call::Unary(op, x)),
        2 => (binary(), i(), i()).prop_map(|(op, a, b)| Call::Binary(op, a, b)),
        1 => (binary(), i(), value()).prop_map(|(op, x, v)| Call::Scalar(op, x, v)),
        1 => (i(), value(), value()).prop_map(|(x, m, a)| Call::Affine(x, m, a)),
        2 => (i(), axis(), any::<bool>()).prop_map(|(x, axis, log)| Call::Softmax { x, axis, log }),
        2 => (i(), i()).prop_map(|(x, y)| Call::CrossEntropy(x, y)),
        1 => (i(), i()).prop_map(|(x, y)| Call::Mse(x, y)),
        2 => (
            prop::sample::select(&[Reduce::Sum, Reduce::Mean, Reduce::Max][..]),
            i(),
            prop::collection::vec(axis(), 0..5),
            any::<bool>(),
        )
            .prop_map(|(op, x, over, keepdim)| Call::Reduce { op, x, over, keepdim }),
        1 => (i(), axis()).prop_map(|(x, a)| Call::Argmax(x, a)),
        1 => (i(), i()).prop_map(|(x, y)| Call::Correct(x, y)),
        2 => (i(), shape()).prop_map(|(x, s)| Call::Reshape(x, s)),
        1 => (i(), axis(), axis()).prop_map(|(x, a, b)| Call::Transpose(x, a, b)),
        1 => i().prop_map(Call::Detach),
        1 => (i(), any::<bool>()).prop_map(|(x, second)| Call::ToDevice(x, second)),
        1 => (i(), i()).prop_map(|(d, s)| Call::Assign(d, s)),
        1 => i().prop_map(Call::ToList),
        1 => i().prop_map(Call::Item),
        2 => i().prop_map(Call::Backward),
        1 => i().prop_map(Call::Grad),
        1 => i().prop_map(Call::Register),
    ]
}

/// A program and the job's quota on each device.
fn program() -> impl Strategy<Value = (u64, Vec<Call>)> {
    let quota = prop_oneof![
        1 => prop::sample::select(&[0u64, 64, 4096][..]),
        4 => prop::sample::select(&[1u64 << 20, 4 << 20, DEVICE_BYTES][..]),
    ];
    (
        quota,
        prop::collection::vec(create(), 1..4),
        prop::collection::vec(call(), 1..12),
    )
        .prop_map(|(quota, mut calls, more)| {
            calls.extend(more);
            (quota, calls)
        })
}

fn dims(shape: &[u32]) -> Vec<usize> {
    shape.iter().map(|&d| d as usize).collect()
}

/// The live tensors, and the job's two devices.
struct Machine {
    pools: [Arc<MemoryPool>; 2],
    live: Vec<Tensor>,
}

/// What a call gave: tensors to keep, or a refusal.
type Outcome = Result<Vec<Tensor>, TensorError>;

impl Machine {
    fn pick(&self, i: &Index) -> Option<Tensor> {
        (!self.live.is_empty()).then(|| self.live[i.index(self.live.len())].clone())
    }

    fn pool(&self, second: bool) -> &Arc<MemoryPool> {
        &self.pools[usize::from(second)]
    }

    /// Runs `call`; `None` when it names a tensor and none is live.
    fn run(&self, call: &Call) -> Option<Outcome> {
        let kept = |r: Result<Tensor, TensorError>| r.map(|t| vec![t]);
        Some(match call {
            Call::FromList {
                data,
                shape,
                second,
            } => {
                if data.len() > MAX_LIST_VALUES {
                    return None;
                }
                kept(Tensor::from_vec(
                    data.clone(),
                    &dims(shape),
                    self.pool(*second),
                ))
            }
            Call::Full {
                shape,
                value,
                second,
            } => kept(Tensor::full(&dims(shape), *value, self.pool(*second))),
            Call::Randn { shape, std, seed } => kept(
                Tensor::randn(&dims(shape), *seed, self.pool(false)).and_then(|t| {
                    if *std == 1.0 {
                        Ok(t)
                    } else {
                        t.mul_scalar(*std)
                    }
                }),
            ),
            Call::Uniform {
                shape,
                low,
                high,
                seed,
            } => kept(Tensor::uniform(
                &dims(shape),
                *low,
                *high,
                *seed,
                self.pool(false),
            )),
            Call::Matmul {
                a,
                b,
                transpose_a,
                transpose_b,
            } => {
                let (a, b) = (self.pick(a)?, self.pick(b)?);
                kept((|| {
                    let a = if *transpose_a { a.t()? } else { a };
                    let b = if *transpose_b { b.t()? } else { b };
                    a.matmul(&b)
                })())
            }
            Call::Linear { x, weight, bias } => {
                let (x, w) = (self.pick(x)?, self.pick(weight)?);
                // The host refuses other ranks before calling orch-tensor.
                if x.rank() != 2 || w.rank() != 2 {
                    return None;
                }
                let bias = match bias {
                    Some(b) => Some(self.pick(b)?),
                    None => None,
                };
                kept(x.matmul(&w).and_then(|y| match &bias {
                    Some(b) => y.add(b),
                    None => Ok(y),
                }))
            }
            Call::Unary(op, x) => {
                let x = self.pick(x)?;
                kept(match op {
                    Unary::Neg => x.neg(),
                    Unary::Relu => x.relu(),
                    Unary::Gelu => x.gelu(),
                    Unary::Tanh => x.tanh(),
                    Unary::Sigmoid => x.sigmoid(),
                    Unary::Exp => x.exp(),
                    Unary::Log => x.log(),
                    Unary::Sqr => x.sqr(),
                })
            }
            Call::Binary(op, a, b) => {
                let (a, b) = (self.pick(a)?, self.pick(b)?);
                kept(match op {
                    Binary::Add => a.add(&b),
                    Binary::Sub => a.sub(&b),
                    Binary::Mul => a.mul(&b),
                    Binary::Div => a.div(&b),
                })
            }
            Call::Scalar(op, x, v) => {
                let x = self.pick(x)?;
                kept(match op {
                    Binary::Add => x.add_scalar(*v),
                    Binary::Sub => x.sub_scalar(*v),
                    Binary::Mul => x.mul_scalar(*v),
                    Binary::Div => x.div_scalar(*v),
                })
            }
            Call::Affine(x, mul, add) => kept(self.pick(x)?.affine(*mul, *add)),
            Call::Softmax { x, axis, log } => {
                let x = self.pick(x)?;
                kept(if *log {
                    x.log_softmax(*axis as isize)
                } else {
                    x.softmax(*axis as isize)
                })
            }
            Call::CrossEntropy(x, y) => kept(self.pick(x)?.cross_entropy(&self.pick(y)?)),
            Call::Mse(x, y) => kept(self.pick(x)?.mse(&self.pick(y)?)),
            Call::Reduce {
                op,
                x,
                over,
                keepdim,
            } => {
                let x = self.pick(x)?;
                let over: Vec<isize> = over.iter().map(|&a| a as isize).collect();
                kept(match op {
                    Reduce::Sum => x.sum(&over, *keepdim),
                    Reduce::Mean => x.mean(&over, *keepdim),
                    Reduce::Max => x.max(&over, *keepdim),
                })
            }
            Call::Argmax(x, axis) => kept(self.pick(x)?.argmax(*axis as isize, false)),
            Call::Correct(x, y) => self.pick(x)?.correct(&self.pick(y)?).map(|_| vec![]),
            Call::Reshape(x, shape) => kept(self.pick(x)?.reshape(&dims(shape))),
            Call::Transpose(x, a, b) => kept(self.pick(x)?.transpose(*a as isize, *b as isize)),
            Call::Detach(x) => Ok(vec![self.pick(x)?.detach()]),
            Call::ToDevice(x, second) => kept(self.pick(x)?.to(self.pool(*second))),
            Call::Assign(dst, src) => self.pick(dst)?.assign(&self.pick(src)?).map(|()| vec![]),
            Call::ToList(x) => {
                let x = self.pick(x)?;
                // The host refuses longer lists before copying.
                if x.numel() > MAX_LIST_VALUES {
                    return None;
                }
                x.to_vec().map(|_| vec![])
            }
            Call::Item(x) => self.pick(x)?.to_scalar().map(|_| vec![]),
            Call::Backward(x) => self.pick(x)?.backward().map(|()| vec![]),
            Call::Grad(x) => Ok(self.pick(x)?.grad().into_iter().collect()),
            Call::Register(x) => {
                let x = self.pick(x)?;
                no_grad(|| x.detach().affine(1.0, 0.0)).map(|p| vec![p.with_requires_grad()])
            }
            Call::Step {
                rows,
                inputs,
                classes,
                labels,
                mse,
            } => self.step([*rows, *inputs, *classes], labels, *mse),
        })
    }

    fn step(&self, [rows, inputs, classes]: [u32; 3], labels: &[f32], mse: bool) -> Outcome {
        let pool = self.pool(false);
        let (rows, inputs, classes) = (rows as usize, inputs as usize, classes as usize);
        let x = Tensor::randn(&[rows, inputs], 1, pool)?;
        let w = Tensor::randn(&[inputs, classes], 2, pool)?.with_requires_grad();
        let logits = x.matmul(&w)?;
        let y = Tensor::from_slice(labels, &[labels.len()], pool)?;
        let loss = if mse {
            logits.mse(&y)?
        } else {
            logits.cross_entropy(&y)?
        };
        loss.backward()?;
        logits.correct(&y)?;
        let mut out = vec![x, logits, y, loss];
        out.extend(w.grad());
        out.push(w);
        Ok(out)
    }
}

fn check_tensor(t: &Tensor) -> Result<(), TestCaseError> {
    prop_assert!(t.rank() <= MAX_RANK, "rank {} past the limit", t.rank());
    let numel = t
        .shape()
        .iter()
        .filter(|&&d| d != 0)
        .try_fold(1usize, |n, &d| n.checked_mul(d));
    prop_assert!(
        numel.is_some_and(|n| n <= MAX_NUMEL),
        "shape {:?} holds more than {MAX_NUMEL} elements",
        t.shape()
    );
    Ok(())
}

fn check((quota, calls): (u64, Vec<Call>)) -> Result<(), TestCaseError> {
    let device = |n| MemoryPool::new(Device::Sim(n), Some(DEVICE_BYTES)).expect("a sim pool");
    let devices = [device(0), device(1)];
    let pools = [
        MemoryPool::with_parent(&devices[0], Some(quota)),
        MemoryPool::with_parent(&devices[1], Some(quota)),
    ];
    let budget = GraphBudget::new(GRAPH_NODES);
    let mut machine = Machine {
        pools,
        live: Vec::new(),
    };
    with_graph_budget(&budget, || -> Result<(), TestCaseError> {
        for call in &calls {
            match machine.run(call) {
                None => {}
                Some(Ok(tensors)) => {
                    for t in tensors {
                        check_tensor(&t)?;
                        machine.live.push(t);
                    }
                    let extra = machine.live.len().saturating_sub(REGISTERS);
                    machine.live.drain(..extra);
                }
                Some(Err(e)) => sentence::check(&e.to_string())?,
            }
            for pool in &machine.pools {
                prop_assert!(pool.in_use() <= quota, "{pool:?} past its quota");
            }
        }
        Ok(())
    })?;
    machine.live.clear();
    for pool in &machine.pools {
        prop_assert_eq!(pool.in_use(), 0, "{:?} holds memory no tensor holds", pool);
    }
    prop_assert_eq!(budget.live(), 0, "graph nodes outlive their tensors");
    Ok(())
}

#[test]
fn fuzz_tensor_ops() {
    let bounds = Bounds {
        case_time: Duration::from_secs(5),
        // The quotas (two devices of 8 MiB) and what ops allocate beside them.
        case_bytes: 64 << 20,
    };
    fuzz("tensor", bounds, program(), check);
}
