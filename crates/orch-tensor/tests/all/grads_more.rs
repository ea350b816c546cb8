//! Gradients of the ops added with the op table (contract 0.3.0), against central finite
//! differences of the f64 reference, for every argument that changes their maths (bounds,
//! exponents, widths, steps, ignored labels, dropout probability), on every backend.

use crate::common::TestResult;
use crate::common::gradcheck::{Input, check, run_cases, values};
use crate::common::reference::{R, sigmoid};
use crate::test_device;
use orch_tensor::{Dropout, MemoryPool, Tensor};
use proptest::collection::vec;
use proptest::prelude::*;
use std::sync::Arc;

const CASES: u32 = 8;

type Pool = Arc<MemoryPool>;

fn shape(max_rank: usize) -> impl Strategy<Value = Vec<usize>> {
    vec(1usize..4, 1..=max_rank)
}

fn tensor(data: &[f64], shape: &[usize], pool: &Pool) -> Result<Tensor, String> {
    let data: Vec<f32> = data.iter().map(|&v| v as f32).collect();
    Tensor::from_vec(data, shape, pool).map_err(|e| e.to_string())
}

/// Values kept at least `margin` away from each of `kinks` (so central differences stay on one
/// side of a kink).
fn away_from(mut x: Input, kinks: &[f64], margin: f64) -> Input {
    for v in &mut x.data {
        for &k in kinks {
            if (*v - k).abs() < margin {
                *v = k + if *v < k { -margin } else { margin };
            }
        }
        *v = *v as f32 as f64;
    }
    x
}

fn grad_new_unary_ops(pool: &Pool) -> TestResult {
    run_cases(CASES, (shape(3), any::<u64>()), |(s, seed)| {
        let pos = Input::range(&s, seed, 0.5, 2.0);
        let x = Input::random(&s, seed ^ 1);
        check(
            pool,
            [pos.clone()],
            |t| t[0].sqrt(),
            |r| r[0].map(f64::sqrt),
        )?;
        check(
            pool,
            [pos.clone()],
            |t| t[0].rsqrt(),
            |r| r[0].map(|v| 1.0 / v.sqrt()),
        )?;
        // Exponents that change the maths: integer (any sign of base), fractional, negative, 0.
        for e in [2.0f32, 3.0, 1.0] {
            check(
                pool,
                [x.clone()],
                |t| t[0].pow(e),
                |r| r[0].map(|v| v.powf(e as f64)),
            )?;
        }
        for e in [0.5f32, -1.5, 0.0] {
            check(
                pool,
                [pos.clone()],
                |t| t[0].pow(e),
                |r| r[0].map(|v| v.powf(e as f64)),
            )?;
        }
        let kinked = x.clone().away_from_zero(0.01);
        check(pool, [kinked], |t| t[0].abs(), |r| r[0].map(f64::abs))?;
        // Bounds that clamp on both sides, on one, on none, and a point interval.
        for (lo, hi) in [(-0.5f32, 0.5f32), (0.0, 10.0), (-10.0, 10.0), (0.25, 0.25)] {
            let xc = away_from(x.clone(), &[lo as f64, hi as f64], 0.01);
            check(
                pool,
                [xc],
                |t| t[0].clamp(lo, hi),
                |r| r[0].map(|v| v.max(lo as f64).min(hi as f64)),
            )?;
        }
        check(pool, [x], |t| t[0].silu(), |r| r[0].map(|v| v * sigmoid(v)))
    })
}

fn grad_maximum_minimum(pool: &Pool) -> TestResult {
    run_cases(
        CASES,
        (shape(3), any::<bool>(), any::<u64>()),
        |(s, row, seed)| {
            // The right operand broadcasts: a row (last dim) or a full tensor.
            let b_shape = if row {
                vec![*s.last().unwrap()]
            } else {
                s.clone()
            };
            let inputs = [Input::random(&s, seed), Input::random(&b_shape, seed ^ 7)];
            check(
                pool,
                &inputs,
                |t| t[0].maximum(&t[1]),
                |r| r[0].zip(&r[1], f64::max),
            )?;
            check(
                pool,
                &inputs,
                |t| t[0].minimum(&t[1]),
                |r| r[0].zip(&r[1], f64::min),
            )
        },
    )
}

fn ties_split_the_gradient(pool: &Pool) -> TestResult {
    let a = Tensor::from_slice(&[1.0, 2.0, 3.0], &[3], pool)?.with_requires_grad();
    let b = Tensor::from_slice(&[1.0, 5.0, 0.0], &[3], pool)?.with_requires_grad();
    a.maximum(&b)?.sum_all()?.backward()?;
    assert_eq!(a.grad().unwrap().to_vec()?, vec![0.5, 0.0, 1.0]);
    assert_eq!(b.grad().unwrap().to_vec()?, vec![0.5, 1.0, 0.0]);
    let x = Tensor::from_slice(&[-1.0, 0.0, 1.0, 2.0, 3.0], &[5], pool)?.with_requires_grad();
    x.clamp(0.0, 2.0)?.sum_all()?.backward()?;
    assert_eq!(
        x.grad().unwrap().to_vec()?,
        vec![0.0, 0.0, 1.0, 0.0, 0.0],
        "a bound stops the gradient (PyTorch's minimum-norm subgradient)"
    );
    // A point interval: every input is on a bound or outside.
    let p = Tensor::from_slice(&[0.5, 0.25, 0.0], &[3], pool)?.with_requires_grad();
    p.clamp(0.25, 0.25)?.sum_all()?.backward()?;
    assert_eq!(p.grad().unwrap().to_vec()?, vec![0.0; 3], "point interval");
    Ok(())
}

fn grad_where_and_masked_fill(pool: &Pool) -> TestResult {
    run_cases(
        CASES,
        (1usize..4, 1usize..5, any::<u64>()),
        |(m, n, seed)| {
            let cond: Vec<f64> = values(m * n, seed ^ 3, 0.0, 1.0)
                .into_iter()
                .map(|v| if v < 0.5 { 0.0 } else { 1.0 })
                .collect();
            let c = tensor(&cond, &[m, n], pool)?;
            let cr = R::new(&[m, n], cond.clone());
            // a broadcasts along rows, b is full.
            let inputs = [Input::random(&[n], seed), Input::random(&[m, n], seed ^ 1)];
            check(
                pool,
                &inputs,
                |t| Tensor::where_(&c, &t[0], &t[1]),
                |r| {
                    let picked_a = cr.zip(&r[0], |c, a| if c != 0.0 { a } else { 0.0 });
                    let picked_b = cr.zip(&r[1], |c, b| if c != 0.0 { 0.0 } else { b });
                    picked_a.add(&picked_b)
                },
            )?;
            // The mask broadcasts to the tensor (a column).
            let col: Vec<f64> = cond[..m].to_vec();
            let mask = tensor(&col, &[m, 1], pool)?;
            let mr = R::new(&[m, 1], col);
            check(
                pool,
                [inputs[1].clone()],
                |t| t[0].masked_fill(&mask, -2.5),
                |r| mr.zip(&r[0], |c, x| if c != 0.0 { -2.5 } else { x }),
            )
        },
    )
}

fn grad_concat_split_expand_permute(pool: &Pool) -> TestResult {
    run_cases(
        CASES,
        (shape(3), 0usize..3, 1usize..4, any::<u64>()),
        |(s, axis, extra, seed)| {
            let axis = axis % s.len();
            let mut s2 = s.clone();
            s2[axis] = extra;
            let inputs = [
                Input::random(&s, seed),
                Input::random(&s2, seed ^ 1),
                Input::random(&s, seed ^ 2),
            ];
            check(
                pool,
                &inputs,
                |t| Tensor::concat(t, axis as isize),
                |r| R::concat(r, axis),
            )?;
            // Split into two pieces and join them the other way round.
            let n = s[axis] + extra;
            let whole = {
                let mut w = s.clone();
                w[axis] = n;
                Input::random(&w, seed ^ 5)
            };
            let first = s[axis];
            check(
                pool,
                [whole],
                |t| {
                    let parts = t[0].split(&[first, extra], axis as isize)?;
                    Tensor::concat(&[parts[1].clone(), parts[0].clone()], axis as isize)
                },
                |r| {
                    let a = r[0].slice(axis, 0, first, 1);
                    let b = r[0].slice(axis, first, n, 1);
                    R::concat(&[b, a], axis)
                },
            )?;
            // expand with -1 keeping dims, a new leading dim, and a size-1 dim repeated.
            let mut ones = s.clone();
            ones[axis] = 1;
            let target: Vec<isize> = std::iter::once(2)
                .chain(
                    ones.iter()
                        .enumerate()
                        .map(|(i, &d)| if i == axis { 3 } else { -(d as isize).signum() }),
                )
                .collect();
            let mut full: Vec<usize> = vec![2];
            full.extend(
                ones.iter()
                    .enumerate()
                    .map(|(i, &d)| if i == axis { 3 } else { d }),
            );
            check(
                pool,
                [Input::random(&ones, seed ^ 6)],
                |t| t[0].expand(&target),
                |r| r[0].broadcast_to(&full),
            )?;
            let x4 = Input::random(&[2, 3, 1, 2], seed ^ 8);
            check(
                pool,
                [x4],
                |t| t[0].permute(&[3, 0, 2, 1])?.exp(),
                |r| r[0].permute(&[3, 0, 2, 1]).map(f64::exp),
            )
        },
    )
}

/// The pieces of one tensor used in several ways: the three parts of a split (as attention's
/// q, k and v), taken in an order other than their own, a range taken twice, two ranges that
/// overlap, narrows along two dimensions, and the whole tensor used directly as well. Each
/// gradient must be the sum of every use's.
fn grad_narrow_pieces_add_up(pool: &Pool) -> TestResult {
    run_cases(
        CASES,
        (vec(1usize..4, 2..=3), 1usize..4, any::<u64>()),
        |(mut s, k, seed)| {
            s[0] = 3 * k;
            let x = Input::random(&s, seed);
            let n = s[0];
            let last = s.len() - 1;
            let w = s[last];
            // q * k + v, the pieces used from last to first.
            check(
                pool,
                [x.clone()],
                |t| {
                    let p = t[0].split(&[k, k, k], 0)?;
                    p[2].add(&p[0].mul(&p[1])?)
                },
                |r| {
                    let (q, kk, v) = (
                        r[0].narrow(0, 0, k),
                        r[0].narrow(0, k, k),
                        r[0].narrow(0, 2 * k, k),
                    );
                    v.add(&q.mul(&kk))
                },
            )?;
            // The first piece twice, then the whole tensor, then two overlapping ranges.
            check(
                pool,
                [x.clone()],
                |t| {
                    let a = t[0].narrow(0, 0, k)?;
                    let b = t[0].narrow(0, 0, k)?;
                    let whole = t[0].mul(&t[0])?.narrow(0, k, k)?;
                    let c = t[0].narrow(0, 1, n - 1)?.narrow(0, 0, k)?;
                    let d = t[0].narrow(0, 0, 2 * k)?.narrow(0, k - 1, k)?;
                    a.mul(&b)?.add(&whole)?.add(&c.mul(&d)?)
                },
                |r| {
                    let a = r[0].narrow(0, 0, k);
                    let whole = r[0].mul(&r[0]).narrow(0, k, k);
                    let c = r[0].narrow(0, 1, k);
                    let d = r[0].narrow(0, k - 1, k);
                    a.mul(&a).add(&whole).add(&c.mul(&d))
                },
            )?;
            // Disjoint ranges of dimension 0 and a range of the last dimension.
            check(
                pool,
                [x],
                |t| {
                    let top = t[0].narrow(0, 0, k)?;
                    let rest = t[0].narrow(0, k, 2 * k)?.narrow(0, 0, k)?;
                    let side = t[0].narrow(last as isize, w - 1, 1)?.narrow(0, 0, k)?;
                    top.mul(&rest)?.add(&side)
                },
                |r| {
                    let top = r[0].narrow(0, 0, k);
                    let rest = r[0].narrow(0, k, k);
                    let side = r[0].narrow(last, w - 1, 1).narrow(0, 0, k);
                    let mut full = s.clone();
                    full[0] = k;
                    top.mul(&rest).add(&side.broadcast_to(&full))
                },
            )
        },
    )
}

fn grad_slice_and_pad(pool: &Pool) -> TestResult {
    run_cases(
        CASES,
        (2usize..7, 1usize..4, 0usize..3, 1usize..4, any::<u64>()),
        |(n, m, start, step, seed)| {
            let x = Input::random(&[m, n], seed);
            // Steps 1..3, ends inside and past the axis, on both axes.
            for end in [n, n + 5, n.saturating_sub(1)] {
                check(
                    pool,
                    [x.clone()],
                    |t| t[0].slice(-1, start, end, step)?.sqr(),
                    |r| r[0].slice(1, start, end, step).map(|v| v * v),
                )?;
            }
            check(
                pool,
                [x.clone()],
                |t| t[0].slice(0, 0, m, step),
                |r| r[0].slice(0, 0, m, step),
            )?;
            // Widths on one side, both, none; a non-zero fill value.
            for (widths, value) in [
                ([(0, 0), (0, 0)], 0.0f32),
                ([(1, 0), (0, 2)], 0.0),
                ([(start, step), (step, start)], 1.5),
            ] {
                check(
                    pool,
                    [x.clone()],
                    |t| t[0].pad(&widths, value),
                    |r| r[0].pad(&widths, value as f64),
                )?;
            }
            Ok(())
        },
    )
}

fn grad_embedding_index_select_gather(pool: &Pool) -> TestResult {
    run_cases(
        CASES,
        (2usize..6, 1usize..4, 1usize..5, any::<u64>()),
        |(v, d, k, seed)| {
            // Indices with repeats (their gradients add up).
            let idx: Vec<usize> = values(2 * k, seed ^ 1, 0.0, v as f64)
                .into_iter()
                .map(|x| (x as usize).min(v - 1))
                .collect();
            let idx_f: Vec<f64> = idx.iter().map(|&i| i as f64).collect();
            let ids = tensor(&idx_f, &[2, k], pool)?;
            let table = Input::random(&[v, d], seed);
            check(
                pool,
                [table.clone()],
                |t| t[0].embedding(&ids),
                |r| r[0].select(0, &idx).reshape(&[2, k, d]),
            )?;
            // index_select along the middle axis of a 3-D tensor.
            let x = Input::random(&[2, v, d], seed ^ 2);
            let flat = tensor(&idx_f, &[2 * k], pool)?;
            check(
                pool,
                [x.clone()],
                |t| t[0].index_select(1, &flat),
                |r| r[0].select(1, &idx),
            )?;
            // gather along axis 1 with an index shorter than the tensor on axis 2.
            let gshape = [2, k, d.max(2) - 1];
            let gidx: Vec<usize> = values(2 * k * gshape[2], seed ^ 3, 0.0, v as f64)
                .into_iter()
                .map(|x| (x as usize).min(v - 1))
                .collect();
            let gidx_f: Vec<f64> = gidx.iter().map(|&i| i as f64).collect();
            let gi = tensor(&gidx_f, &gshape, pool)?;
            let xg = Input::random(&[2, v, d.max(2)], seed ^ 4);
            check(
                pool,
                [xg],
                |t| t[0].gather(1, &gi),
                |r| r[0].gather(1, &gidx, &gshape),
            )
        },
    )
}

fn grad_cross_entropy_general(pool: &Pool) -> TestResult {
    run_cases(
        CASES,
        (1usize..4, 1usize..4, 2usize..6, any::<u64>()),
        |(b, t, c, seed)| {
            let labels: Vec<i64> = values(b * t, seed ^ 3, 0.0, c as f64)
                .into_iter()
                .map(|v| (v as i64).min(c as i64 - 1))
                .collect();
            // Some labels replaced by -100 (ignored).
            let with_ignored: Vec<i64> = labels
                .iter()
                .enumerate()
                .map(|(i, &l)| if i % 3 == 1 { -100 } else { l })
                .collect();
            let x = Input::random(&[b, t, c], seed);
            for (labels, ignore) in [
                (labels.clone(), None),
                (with_ignored.clone(), Some(-100)),
                // A valid class as the ignored one.
                (labels.clone(), Some(0)),
                // Everything ignored: loss 0, gradient 0.
                (vec![-100; b * t], Some(-100)),
            ] {
                let lf: Vec<f64> = labels.iter().map(|&l| l as f64).collect();
                let y = tensor(&lf, &[b, t], pool)?;
                check(
                    pool,
                    [x.clone()],
                    |tt| tt[0].cross_entropy_with(&y, ignore),
                    |r| r[0].cross_entropy_ignoring(&labels, ignore),
                )?;
            }
            Ok(())
        },
    )
}

fn grad_dropout(pool: &Pool) -> TestResult {
    run_cases(CASES, (shape(3), any::<u64>()), |(s, seed)| {
        let x = Input::random(&s, seed);
        // p = 0 is the identity.
        let identity = Dropout::new(0.0, seed, 3);
        check(
            pool,
            [x.clone()],
            |t| t[0].dropout(&identity),
            |r| r[0].clone(),
        )?;
        for p in [0.3f32, 0.75] {
            let d = Dropout {
                sample_offset: 5,
                ..Dropout::new(p, seed, 7)
            };
            // The mask itself, read off a tensor of ones (kept: 1/(1-p), dropped: 0).
            let ones = Tensor::ones(&s, pool).map_err(|e| e.to_string())?;
            let m = ones
                .dropout(&d)
                .and_then(|m| m.to_vec())
                .map_err(|e| e.to_string())?;
            let mr = R::new(&s, m.iter().map(|&v| v as f64).collect());
            check(pool, [x.clone()], |t| t[0].dropout(&d), |r| r[0].mul(&mr))?;
        }
        Ok(())
    })
}

test_device!(
    grad_new_unary_ops,
    grad_maximum_minimum,
    ties_split_the_gradient,
    grad_where_and_masked_fill,
    grad_concat_split_expand_permute,
    grad_narrow_pieces_add_up,
    grad_slice_and_pad,
    grad_embedding_index_select_gather,
    grad_cross_entropy_general,
    grad_dropout,
);
