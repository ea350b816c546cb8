//! Forward values of every op against the f64 reference, on every backend, including sizes
//! large enough to take the parallel CPU paths and the multi-block CUDA paths.

use crate::common::gradcheck::Input;
use crate::common::reference::{R, gelu, sigmoid};
use crate::common::{TestResult, assert_close};
use crate::test_device;
use orch_tensor::{MemoryPool, Tensor};
use std::sync::Arc;

type Pool = Arc<MemoryPool>;

fn pair(pool: &Pool, shape: &[usize], seed: u64) -> orch_tensor::Result<(Tensor, R)> {
    let input = Input::random(shape, seed);
    Ok((input.tensor(pool)?, input.reference()))
}

fn host_round_trip_and_constructors(pool: &Pool) -> TestResult {
    let data: Vec<f32> = (0..12).map(|v| v as f32 * 0.5).collect();
    let t = Tensor::from_slice(&data, &[3, 4], pool)?;
    assert_eq!(t.shape(), &[3, 4]);
    assert_eq!(t.to_vec()?, data);
    assert_eq!(Tensor::zeros(&[2, 2], pool)?.to_vec()?, vec![0.0; 4]);
    assert_eq!(Tensor::ones(&[3], pool)?.to_vec()?, vec![1.0; 3]);
    assert_eq!(Tensor::full(&[2], 7.5, pool)?.to_vec()?, vec![7.5; 2]);
    assert_eq!(Tensor::scalar(3.0, pool)?.to_scalar()?, 3.0);
    assert!(Tensor::from_slice(&data, &[5], pool).is_err());
    // Seeded random values are the same on every device.
    let cpu = MemoryPool::cpu();
    assert_eq!(
        Tensor::randn(&[64], 5, pool)?.to_vec()?,
        Tensor::randn(&[64], 5, &cpu)?.to_vec()?
    );
    assert_ne!(
        Tensor::randn(&[64], 5, pool)?.to_vec()?,
        Tensor::randn(&[64], 6, pool)?.to_vec()?
    );
    let u = Tensor::uniform(&[1000], -0.5, 0.25, 1, pool)?.to_vec()?;
    assert!(u.iter().all(|v| (-0.5..0.25).contains(v)));
    Ok(())
}

fn elementwise_broadcasting(pool: &Pool) -> TestResult {
    for (a, b) in [
        (vec![4, 5], vec![5]),
        (vec![3, 1, 5], vec![4, 1]),
        (vec![1], vec![2, 3]),
        (vec![300, 257], vec![300, 1]),
    ] {
        let (x, rx) = pair(pool, &a, 1)?;
        let (y, ry) = pair(pool, &b, 2)?;
        assert_close(&x.add(&y)?.to_vec()?, &rx.add(&ry).data, 1e-6, "add");
        assert_close(&x.sub(&y)?.to_vec()?, &rx.sub(&ry).data, 1e-6, "sub");
        assert_close(&x.mul(&y)?.to_vec()?, &rx.mul(&ry).data, 1e-6, "mul");
        assert_close(
            &y.mul(&x)?.to_vec()?,
            &ry.mul(&rx).data,
            1e-6,
            "mul swapped",
        );
        assert_close(
            &x.div(&y.add_scalar(5.0)?)?.to_vec()?,
            &rx.div(&ry.map(|v| v + 5.0)).data,
            1e-6,
            "div",
        );
    }
    Ok(())
}

fn unary_and_scalar_ops(pool: &Pool) -> TestResult {
    // 70_000 elements: above the CPU's parallel threshold.
    for shape in [vec![7, 3], vec![70_000]] {
        let (x, r) = pair(pool, &shape, 3)?;
        let cases: [(&str, Tensor, R); 9] = [
            ("relu", x.relu()?, r.map(|v| v.max(0.0))),
            ("gelu", x.gelu()?, r.map(gelu)),
            ("tanh", x.tanh()?, r.map(f64::tanh)),
            ("sigmoid", x.sigmoid()?, r.map(sigmoid)),
            ("exp", x.exp()?, r.map(f64::exp)),
            (
                "log",
                x.sqr()?.add_scalar(0.1)?.log()?,
                r.map(|v| (v * v + 0.1).ln()),
            ),
            ("neg", x.neg()?, r.map(|v| -v)),
            (
                "scalars",
                x.mul_scalar(2.0)?.sub_scalar(1.0)?.div_scalar(4.0)?,
                r.map(|v| (2.0 * v - 1.0) / 4.0),
            ),
            ("affine", x.affine(-0.5, 3.0)?, r.map(|v| -0.5 * v + 3.0)),
        ];
        for (name, got, expected) in cases {
            assert_close(&got.to_vec()?, &expected.data, 1e-5, name);
        }
    }
    Ok(())
}

fn matmul_shapes(pool: &Pool) -> TestResult {
    // The last three are large enough for the CPU's column-split threading (n >= 128).
    let cases: [(Vec<usize>, Vec<usize>); 8] = [
        (vec![64, 33], vec![33, 17]),
        (vec![3, 5, 4], vec![3, 4, 6]),
        (vec![2, 5, 4], vec![4, 3]),
        (vec![2, 1, 3, 4], vec![5, 4, 2]),
        (vec![130, 70], vec![70, 90]),
        (vec![70, 50], vec![50, 300]),
        (vec![2, 70, 50], vec![50, 301]),
        (vec![3, 1, 40, 64], vec![2, 64, 130]),
    ];
    for (a, b) in cases {
        let (x, rx) = pair(pool, &a, 4)?;
        let (y, ry) = pair(pool, &b, 5)?;
        let expected = rx.matmul(&ry);
        let got = x.matmul(&y)?;
        assert_eq!(got.shape(), expected.shape.as_slice());
        assert_close(
            &got.to_vec()?,
            &expected.data,
            1e-4,
            &format!("matmul {a:?} @ {b:?}"),
        );
    }
    // Transposed operands as views: x^T y^T for x [6, 4], y [3, 6].
    let (x, rx) = pair(pool, &[6, 4], 6)?;
    let (y, ry) = pair(pool, &[3, 6], 7)?;
    let got = x.t()?.matmul(&y.t()?)?;
    assert_close(
        &got.to_vec()?,
        &rx.transpose_last().matmul(&ry.transpose_last()).data,
        1e-5,
        "matmul of transposes",
    );
    // Large enough to split columns, with a transposed right operand.
    let (p, rp) = pair(pool, &[90, 64], 12)?;
    let (q, rq) = pair(pool, &[200, 64], 13)?;
    let got = p.matmul(&q.t()?)?;
    assert_close(
        &got.to_vec()?,
        &rp.matmul(&rq.transpose_last()).data,
        1e-4,
        "split matmul, transposed rhs",
    );
    // A narrowed (non-unit leading stride) operand.
    let got = x.narrow(1, 1, 2)?.t()?.matmul(&x.narrow(1, 0, 2)?)?;
    let expected = rx
        .narrow(1, 1, 2)
        .transpose_last()
        .matmul(&rx.narrow(1, 0, 2));
    assert_close(
        &got.to_vec()?,
        &expected.data,
        1e-5,
        "matmul of narrowed views",
    );
    Ok(())
}

/// Products big enough for the CPU's column-split threading (work per block >= 2^24) give the
/// same result in a 2-thread pool as in a 1-thread pool (itself checked against the f64 oracle).
fn matmul_threaded_split(pool: &Pool) -> TestResult {
    let run = |threads: usize,
               f: &(dyn Fn() -> orch_tensor::Result<Tensor> + Sync)|
     -> orch_tensor::Result<Vec<f32>> {
        let rayon_pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .expect("a thread pool");
        rayon_pool.install(f)?.to_vec()
    };
    let a = Tensor::randn(&[256, 256], 21, pool)?;
    let b = Tensor::randn(&[600, 256], 22, pool)?; // used transposed: [256, 600]
    let batched = Tensor::randn(&[2, 128, 512], 23, pool)?;
    let w = Tensor::randn(&[512, 520], 24, pool)?;
    let cases: [&(dyn Fn() -> orch_tensor::Result<Tensor> + Sync); 2] =
        [&|| a.matmul(&b.t()?), &|| batched.matmul(&w)];
    for (i, case) in cases.iter().enumerate() {
        let (one, two) = (run(1, case)?, run(2, case)?);
        let expected: Vec<f64> = one.iter().map(|&v| v as f64).collect();
        assert_close(&two, &expected, 1e-5, &format!("threaded matmul case {i}"));
    }
    Ok(())
}

fn reductions(pool: &Pool) -> TestResult {
    for shape in [vec![4, 3, 5], vec![300, 400]] {
        let (x, r) = pair(pool, &shape, 8)?;
        let rank = shape.len();
        for axes in [vec![0], vec![rank - 1], vec![0, rank - 1], vec![]] {
            let signed: Vec<isize> = axes.iter().map(|&a| a as isize).collect();
            for keepdim in [false, true] {
                let s = x.sum(&signed, keepdim)?;
                assert_eq!(s.shape(), r.sum(&axes, keepdim).shape.as_slice());
                assert_close(&s.to_vec()?, &r.sum(&axes, keepdim).data, 1e-4, "sum");
                assert_close(
                    &x.mean(&signed, keepdim)?.to_vec()?,
                    &r.mean(&axes, keepdim).data,
                    1e-5,
                    "mean",
                );
                assert_close(
                    &x.max(&signed, keepdim)?.to_vec()?,
                    &r.max(&axes, keepdim).data,
                    0.0,
                    "max",
                );
            }
        }
    }
    let t = Tensor::from_slice(&[1.0, 9.0, 3.0, 9.0, 2.0, 0.0], &[2, 3], pool)?;
    assert_eq!(t.argmax(-1, false)?.to_vec()?, vec![1.0, 0.0]);
    assert_eq!(t.argmax(0, true)?.to_vec()?, vec![1.0, 0.0, 0.0]);
    assert_eq!(t.argmax(0, true)?.shape(), &[1, 3]);
    assert_eq!(t.sum_all()?.to_scalar()?, 24.0);
    assert_eq!(t.mean_all()?.shape(), &[] as &[usize]);
    Ok(())
}

fn softmax_cross_entropy_accuracy(pool: &Pool) -> TestResult {
    for shape in [vec![5, 7], vec![3, 4, 2], vec![64, 1000]] {
        let (x, r) = pair(pool, &shape, 9)?;
        for axis in 0..shape.len() {
            assert_close(
                &x.softmax(axis as isize)?.to_vec()?,
                &r.softmax(axis).data,
                1e-5,
                "softmax",
            );
            assert_close(
                &x.log_softmax(axis as isize)?.to_vec()?,
                &r.log_softmax(axis).data,
                1e-5,
                "log_softmax",
            );
        }
    }
    let (logits, r) = pair(pool, &[6, 4], 10)?;
    let labels = [0usize, 3, 1, 1, 2, 0];
    let y = Tensor::from_vec(labels.iter().map(|&l| l as f32).collect(), &[6], pool)?;
    assert_close(
        &[logits.cross_entropy(&y)?.to_scalar()?],
        &r.cross_entropy(&labels).data,
        1e-5,
        "cross_entropy",
    );
    let (target, rt) = pair(pool, &[6, 4], 11)?;
    let mse: f64 = r.sub(&rt).map(|v| v * v).data.iter().sum::<f64>() / 24.0;
    assert_close(&[logits.mse(&target)?.to_scalar()?], &[mse], 1e-5, "mse");
    let hits = (0..6)
        .filter(|&row| {
            let v = &r.data[row * 4..row * 4 + 4];
            let best = (0..4).fold(0, |b, k| if v[k] > v[b] { k } else { b });
            best == labels[row]
        })
        .count();
    assert_close(
        &[logits.accuracy(&y)?.to_scalar()?],
        &[hits as f64 / 6.0],
        1e-6,
        "accuracy",
    );
    Ok(())
}

fn views_share_storage(pool: &Pool) -> TestResult {
    let data: Vec<f32> = (0..24).map(|v| v as f32).collect();
    let x = Tensor::from_slice(&data, &[2, 3, 4], pool)?;
    let r = R::new(&[2, 3, 4], data.iter().map(|&v| v as f64).collect());
    let t = x.transpose(0, 2)?;
    assert!(t.shares_storage(&x) && !t.is_contiguous());
    assert_eq!(t.shape(), &[4, 3, 2]);
    assert_close(&t.to_vec()?, &r.permute(&[2, 1, 0]).data, 0.0, "transpose");
    let c = t.contiguous()?;
    assert!(c.is_contiguous() && !c.shares_storage(&x));
    let n = x.narrow(1, 1, 2)?;
    assert!(n.shares_storage(&x));
    assert_close(&n.to_vec()?, &r.narrow(1, 1, 2).data, 0.0, "narrow");
    let v = x.reshape(&[6, 4])?;
    assert!(v.shares_storage(&x), "reshape of dense data is a view");
    assert_close(
        &t.reshape(&[24])?.to_vec()?,
        &r.permute(&[2, 1, 0]).data,
        0.0,
        "reshape of a strided view copies",
    );
    let p = x.permute(&[1, 2, 0])?;
    assert_close(&p.to_vec()?, &r.permute(&[1, 2, 0]).data, 0.0, "permute");
    let b = Tensor::from_slice(&[1.0, 2.0], &[2, 1], pool)?.broadcast_to(&[3, 2, 4])?;
    assert_eq!(b.strides(), &[0, 1, 0]);
    assert_eq!(b.sum_all()?.to_scalar()?, 36.0);
    Ok(())
}

fn moves_between_pools(pool: &Pool) -> TestResult {
    let cpu = MemoryPool::cpu();
    let x = Tensor::randn(&[5, 3], 1, pool)?;
    let on_cpu = x.t()?.to(&cpu)?;
    assert_eq!(on_cpu.device(), orch_tensor::Device::Cpu);
    assert_eq!(on_cpu.to_vec()?, x.t()?.to_vec()?);
    let back = on_cpu.to(pool)?;
    assert_eq!(back.device(), pool.device());
    assert_eq!(back.to_vec()?, x.t()?.to_vec()?);
    assert!(
        x.to(pool)?.shares_storage(&x),
        "moving to its own pool is free"
    );
    Ok(())
}

fn assign_in_place(pool: &Pool) -> TestResult {
    let p = Tensor::zeros(&[2, 3], pool)?.with_requires_grad();
    let view = p.t()?;
    let cpu = MemoryPool::cpu();
    let src = Tensor::from_slice(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[3, 2], &cpu)?;
    view.assign(&src)?; // another device, through a transposed view
    assert_eq!(p.to_vec()?, vec![1.0, 3.0, 5.0, 2.0, 4.0, 6.0]);
    p.assign(&p.t()?.contiguous()?.reshape(&[2, 3])?)?; // from its own storage
    assert_eq!(p.to_vec()?, vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    assert!(p.assign(&src).is_err(), "shape mismatch");
    assert!(p.requires_grad() && p.grad().is_none());
    Ok(())
}

test_device!(
    assign_in_place,
    host_round_trip_and_constructors,
    elementwise_broadcasting,
    unary_and_scalar_ops,
    matmul_shapes,
    matmul_threaded_split,
    reductions,
    softmax_cross_entropy_accuracy,
    views_share_storage,
    moves_between_pools,
);
