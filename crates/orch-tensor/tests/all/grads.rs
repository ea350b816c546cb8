//! Every differentiable op's gradient against central finite differences of the f64 reference,
//! on random shapes (broadcasting included), on every backend.

use crate::common::TestResult;
use crate::common::gradcheck::{Input, check, run_cases};
use crate::common::reference::{R, gelu, sigmoid};
use crate::test_device;
use orch_tensor::{MemoryPool, Tensor};
use proptest::collection::vec;
use proptest::prelude::*;
use std::sync::Arc;

const CASES: u32 = 12;

type Pool = Arc<MemoryPool>;

fn shape(max_rank: usize) -> impl Strategy<Value = Vec<usize>> {
    vec(1usize..4, 1..=max_rank)
}

/// Two shapes that broadcast against each other (either side may have 1s or fewer dims).
fn broadcast_pair() -> impl Strategy<Value = (Vec<usize>, Vec<usize>, u64)> {
    (
        shape(3),
        vec(any::<bool>(), 3),
        vec(any::<bool>(), 3),
        0usize..3,
        0usize..3,
        any::<u64>(),
    )
        .prop_map(|(base, ones_a, ones_b, drop_a, drop_b, seed)| {
            let mask = |ones: &[bool], drop: usize| {
                let s: Vec<usize> = base
                    .iter()
                    .zip(ones)
                    .map(|(&d, &one)| if one { 1 } else { d })
                    .collect();
                s[drop.min(s.len() - 1)..].to_vec()
            };
            (mask(&ones_a, drop_a), mask(&ones_b, drop_b), seed)
        })
}

fn grad_binary_ops(pool: &Pool) -> TestResult {
    run_cases(CASES, broadcast_pair(), |(a, b, seed)| {
        let x = Input::random(&a, seed);
        let y = Input::random(&b, seed ^ 1);
        check(
            pool,
            &[x.clone(), y.clone()],
            |t| t[0].add(&t[1]),
            |r| r[0].add(&r[1]),
        )?;
        check(
            pool,
            &[x.clone(), y.clone()],
            |t| t[0].sub(&t[1]),
            |r| r[0].sub(&r[1]),
        )?;
        check(
            pool,
            &[x.clone(), y.clone()],
            |t| t[0].mul(&t[1]),
            |r| r[0].mul(&r[1]),
        )?;
        let d = Input::random(&b, seed ^ 2).away_from_zero(0.5);
        check(pool, &[x, d], |t| t[0].div(&t[1]), |r| r[0].div(&r[1]))
    })
}

fn grad_scalar_ops(pool: &Pool) -> TestResult {
    run_cases(CASES, (shape(3), any::<u64>()), |(s, seed)| {
        let x = Input::random(&s, seed);
        check(
            pool,
            [x.clone()],
            |t| t[0].add_scalar(1.5),
            |r| r[0].map(|v| v + 1.5),
        )?;
        check(
            pool,
            [x.clone()],
            |t| t[0].sub_scalar(0.5),
            |r| r[0].map(|v| v - 0.5),
        )?;
        check(
            pool,
            [x.clone()],
            |t| t[0].mul_scalar(-3.0),
            |r| r[0].map(|v| v * -3.0),
        )?;
        check(
            pool,
            [x.clone()],
            |t| t[0].div_scalar(4.0),
            |r| r[0].map(|v| v / 4.0),
        )?;
        check(
            pool,
            [x.clone()],
            |t| t[0].affine(2.0, -1.0),
            |r| r[0].map(|v| 2.0 * v - 1.0),
        )?;
        check(pool, &[x], |t| t[0].neg(), |r| r[0].map(|v| -v))
    })
}

fn grad_activations(pool: &Pool) -> TestResult {
    run_cases(CASES, (shape(3), any::<u64>()), |(s, seed)| {
        let x = Input::random(&s, seed);
        let kinked = x.clone().away_from_zero(0.01);
        check(
            pool,
            &[kinked],
            |t| t[0].relu(),
            |r| r[0].map(|v| v.max(0.0)),
        )?;
        check(pool, [x.clone()], |t| t[0].gelu(), |r| r[0].map(gelu))?;
        check(pool, [x.clone()], |t| t[0].tanh(), |r| r[0].map(f64::tanh))?;
        check(pool, [x.clone()], |t| t[0].sigmoid(), |r| r[0].map(sigmoid))?;
        check(pool, [x.clone()], |t| t[0].exp(), |r| r[0].map(f64::exp))?;
        check(pool, [x.clone()], |t| t[0].sqr(), |r| r[0].map(|v| v * v))?;
        let positive = Input::range(&s, seed, 0.2, 3.0);
        check(pool, &[positive], |t| t[0].log(), |r| r[0].map(f64::ln))
    })
}

/// Matmul shapes: batch of a, batch of b, (m, k, n), (transpose a, transpose b), seed.
type MatmulCase = (
    Vec<usize>,
    Vec<usize>,
    (usize, usize, usize),
    (bool, bool),
    u64,
);

fn matmul_case() -> impl Strategy<Value = MatmulCase> {
    let batches = prop_oneof![
        Just((vec![], vec![])),
        Just((vec![2], vec![2])),
        Just((vec![3], vec![])),
        Just((vec![], vec![2])),
        Just((vec![2, 1], vec![3])),
    ];
    (
        batches,
        (1usize..5, 1usize..5, 1usize..5),
        (any::<bool>(), any::<bool>()),
        any::<u64>(),
    )
        .prop_map(|((ba, bb), mkn, tr, seed)| (ba, bb, mkn, tr, seed))
}

fn grad_matmul(pool: &Pool) -> TestResult {
    run_cases(
        CASES * 2,
        matmul_case(),
        |(ba, bb, (m, k, n), (ta, tb), seed)| {
            // A transposed operand is stored as its transpose and viewed back with t().
            let a_shape = [ba.as_slice(), &if ta { [k, m] } else { [m, k] }].concat();
            let b_shape = [bb.as_slice(), &if tb { [n, k] } else { [k, n] }].concat();
            let inputs = [
                Input::random(&a_shape, seed),
                Input::random(&b_shape, seed ^ 7),
            ];
            check(
                pool,
                &inputs,
                |t| {
                    let a = if ta { t[0].t()? } else { t[0].clone() };
                    let b = if tb { t[1].t()? } else { t[1].clone() };
                    a.matmul(&b)
                },
                |r| {
                    let a = if ta {
                        r[0].transpose_last()
                    } else {
                        r[0].clone()
                    };
                    let b = if tb {
                        r[1].transpose_last()
                    } else {
                        r[1].clone()
                    };
                    a.matmul(&b)
                },
            )
        },
    )
}

fn grad_reductions(pool: &Pool) -> TestResult {
    run_cases(
        CASES * 2,
        (shape(3), vec(any::<bool>(), 3), any::<bool>(), any::<u64>()),
        |(s, pick, keepdim, seed)| {
            let axes: Vec<usize> = (0..s.len()).filter(|&i| pick[i]).collect();
            let signed: Vec<isize> = axes.iter().map(|&a| a as isize).collect();
            let x = Input::random(&s, seed);
            check(
                pool,
                [x.clone()],
                |t| t[0].sum(&signed, keepdim),
                |r| r[0].sum(&axes, keepdim),
            )?;
            check(
                pool,
                [x.clone()],
                |t| t[0].mean(&signed, keepdim),
                |r| r[0].mean(&axes, keepdim),
            )?;
            check(
                pool,
                &[x],
                |t| t[0].max(&signed, keepdim),
                |r| r[0].max(&axes, keepdim),
            )
        },
    )
}

fn grad_softmax(pool: &Pool) -> TestResult {
    run_cases(
        CASES,
        (shape(3), 0usize..3, any::<u64>()),
        |(s, axis, seed)| {
            let axis = axis % s.len();
            let x = Input::random(&s, seed);
            check(
                pool,
                [x.clone()],
                |t| t[0].softmax(axis as isize),
                |r| r[0].softmax(axis),
            )?;
            check(
                pool,
                &[x],
                |t| t[0].log_softmax(axis as isize - s.len() as isize),
                |r| r[0].log_softmax(axis),
            )
        },
    )
}

fn grad_cross_entropy(pool: &Pool) -> TestResult {
    run_cases(
        CASES,
        (1usize..6, 2usize..7, any::<u64>()),
        |(rows, classes, seed)| {
            let labels: Vec<usize> =
                crate::common::gradcheck::values(rows, seed ^ 3, 0.0, classes as f64)
                    .into_iter()
                    .map(|v| (v as usize).min(classes - 1))
                    .collect();
            let label_values: Vec<f32> = labels.iter().map(|&l| l as f32).collect();
            let y = Tensor::from_slice(&label_values, &[rows], pool).map_err(|e| e.to_string())?;
            let x = Input::random(&[rows, classes], seed);
            check(
                pool,
                &[x],
                |t| t[0].cross_entropy(&y),
                |r| r[0].cross_entropy(&labels),
            )
        },
    )
}

fn grad_mse(pool: &Pool) -> TestResult {
    run_cases(CASES, (shape(3), any::<u64>()), |(s, seed)| {
        let inputs = [Input::random(&s, seed), Input::random(&s, seed ^ 5)];
        check(
            pool,
            &inputs,
            |t| t[0].mse(&t[1]),
            |r| {
                R::scalar(
                    r[0].sub(&r[1]).map(|v| v * v).data.iter().sum::<f64>()
                        / r[0].data.len() as f64,
                )
            },
        )
    })
}

fn grad_views(pool: &Pool) -> TestResult {
    run_cases(
        CASES,
        (1usize..4, 1usize..4, 2usize..5, any::<u64>()),
        |(a, b, c, seed)| {
            let x = Input::random(&[a, b, c], seed);
            let w = Input::random(&[c, a * b], seed ^ 9);
            // reshape of a transposed (strided) view, then a product that mixes everything.
            check(
                pool,
                &[x.clone(), w],
                |t| t[0].transpose(0, 2)?.reshape(&[c, a * b])?.mul(&t[1]),
                |r| r[0].permute(&[2, 1, 0]).reshape(&[c, a * b]).mul(&r[1]),
            )?;
            check(
                pool,
                [x.clone()],
                |t| t[0].permute(&[1, 2, 0])?.sqr(),
                |r| r[0].permute(&[1, 2, 0]).map(|v| v * v),
            )?;
            check(
                pool,
                [x.clone()],
                |t| t[0].narrow(2, 1, c - 1)?.tanh(),
                |r| r[0].narrow(2, 1, c - 1).map(f64::tanh),
            )?;
            check(
                pool,
                [x.clone()],
                |t| t[0].narrow(-1, 0, 1)?.broadcast_to(&[2, a, b, c]),
                |r| r[0].narrow(2, 0, 1).broadcast_to(&[2, a, b, c]),
            )?;
            check(
                pool,
                &[x],
                |t| t[0].t()?.contiguous()?.exp(),
                |r| r[0].transpose_last().map(f64::exp),
            )
        },
    )
}

fn grad_shared_and_moved(pool: &Pool) -> TestResult {
    run_cases(CASES, (shape(2), any::<u64>()), |(s, seed)| {
        let x = Input::random(&s, seed);
        // One input used three times: gradients accumulate.
        check(
            pool,
            [x.clone()],
            |t| t[0].mul(&t[0])?.add(&t[0]),
            |r| r[0].mul(&r[0]).add(&r[0]),
        )?;
        // Through a move to another pool and back.
        let cpu = MemoryPool::cpu();
        check(
            pool,
            &[x],
            |t| t[0].to(&cpu)?.sigmoid()?.to(pool)?.mul_scalar(2.0),
            |r| r[0].map(|v| 2.0 * sigmoid(v)),
        )
    })
}

fn grad_mlp(pool: &Pool) -> TestResult {
    run_cases(
        CASES / 2,
        (1usize..5, 1usize..6, 1usize..6, 2usize..5, any::<u64>()),
        |(batch, d_in, hidden, classes, seed)| {
            let labels: Vec<usize> = (0..batch)
                .map(|i| (i * 7 + seed as usize) % classes)
                .collect();
            let y = Tensor::from_vec(labels.iter().map(|&l| l as f32).collect(), &[batch], pool)
                .map_err(|e| e.to_string())?;
            let inputs = [
                Input::random(&[batch, d_in], seed),
                Input::random(&[d_in, hidden], seed ^ 1),
                Input::random(&[hidden], seed ^ 2).away_from_zero(0.05),
                Input::random(&[hidden, classes], seed ^ 3),
                Input::random(&[classes], seed ^ 4),
            ];
            check(
                pool,
                &inputs,
                |t| {
                    t[0].matmul(&t[1])?
                        .add(&t[2])?
                        .gelu()?
                        .matmul(&t[3])?
                        .add(&t[4])?
                        .cross_entropy(&y)
                },
                |r| {
                    r[0].matmul(&r[1])
                        .add(&r[2])
                        .map(gelu)
                        .matmul(&r[3])
                        .add(&r[4])
                        .cross_entropy(&labels)
                },
            )
        },
    )
}

test_device!(
    grad_binary_ops,
    grad_scalar_ops,
    grad_activations,
    grad_matmul,
    grad_reductions,
    grad_softmax,
    grad_cross_entropy,
    grad_mse,
    grad_views,
    grad_shared_and_moved,
    grad_mlp,
);
