//! Zero-size, empty and degenerate shapes, one test per op: each gives a result of the right
//! shape or an error value, never a panic (shapes come from plugins).

use crate::common::TestResult;
use crate::test_device;
use orch_tensor::optim::{Adam, AdamConfig, Optimizer, Sgd, SgdConfig};
use orch_tensor::{Dropout, MemoryPool, Tensor, TensorError};
use std::sync::Arc;

type Pool = Arc<MemoryPool>;

/// Shapes with a zero somewhere, and the scalar.
const EMPTY: &[&[usize]] = &[&[0], &[3, 0], &[0, 3], &[0, 0], &[2, 0, 4], &[1, 0, 1]];

fn zeros(shape: &[usize], pool: &Pool) -> orch_tensor::Result<Tensor> {
    Tensor::zeros(shape, pool)
}

fn creation(pool: &Pool) -> TestResult {
    for &shape in EMPTY {
        assert_eq!(Tensor::full(shape, 1.0, pool)?.to_vec()?, Vec::<f32>::new());
        assert_eq!(Tensor::randn(shape, 1, pool)?.shape(), shape);
        assert_eq!(Tensor::uniform(shape, 0.0, 1.0, 1, pool)?.shape(), shape);
        assert_eq!(Tensor::from_slice(&[], shape, pool)?.shape(), shape);
        assert!(Tensor::from_slice(&[1.0], shape, pool).is_err());
    }
    Ok(())
}

fn unary_and_scalar_ops(pool: &Pool) -> TestResult {
    for &shape in EMPTY {
        let x = zeros(shape, pool)?.with_requires_grad();
        let outs = [
            x.neg()?,
            x.relu()?,
            x.gelu()?,
            x.tanh()?,
            x.sigmoid()?,
            x.exp()?,
            x.log()?,
            x.sqr()?,
            x.affine(2.0, 1.0)?,
            x.add_scalar(1.0)?,
            x.div_scalar(0.0)?,
            x.detach(),
            x.contiguous()?,
        ];
        for out in outs {
            assert_eq!(out.shape(), shape);
            assert_eq!(out.to_vec()?, Vec::<f32>::new());
        }
    }
    Ok(())
}

fn binary_ops(pool: &Pool) -> TestResult {
    for (a, b, out) in [
        (vec![0], vec![0], vec![0]),
        (vec![3, 0], vec![0], vec![3, 0]),
        (vec![3, 0], vec![3, 1], vec![3, 0]),
        (vec![0, 3], vec![3], vec![0, 3]),
        (vec![0], vec![1], vec![0]),
        (vec![2, 0, 4], vec![1, 1, 4], vec![2, 0, 4]),
    ] {
        let (x, y) = (zeros(&a, pool)?.with_requires_grad(), zeros(&b, pool)?);
        for z in [x.add(&y)?, x.sub(&y)?, x.mul(&y)?, x.div(&y)?, x.eq(&y)?] {
            assert_eq!(z.shape(), out.as_slice(), "{a:?} and {b:?}");
        }
        x.mul(&y)?.sum_all()?.backward()?;
        assert_eq!(x.grad().map(|g| g.shape().to_vec()), Some(a.clone()));
    }
    // A zero does not broadcast against another size.
    assert!(matches!(
        zeros(&[0], pool)?.add(&zeros(&[2], pool)?),
        Err(TensorError::ShapeMismatch { .. })
    ));
    Ok(())
}

fn matmul_and_linear(pool: &Pool) -> TestResult {
    for (a, b, out) in [
        (vec![3, 0], vec![0, 4], vec![3, 4]),
        (vec![0, 3], vec![3, 4], vec![0, 4]),
        (vec![3, 4], vec![4, 0], vec![3, 0]),
        (vec![0, 3, 4], vec![4, 2], vec![0, 3, 2]),
        (vec![2, 0, 0], vec![0, 0], vec![2, 0, 0]),
    ] {
        let x = zeros(&a, pool)?.with_requires_grad();
        let w = Tensor::ones(&b, pool)?.with_requires_grad();
        let y = x.matmul(&w)?;
        assert_eq!(y.shape(), out.as_slice());
        // An empty inner dimension sums nothing: zeros.
        assert!(y.to_vec()?.iter().all(|&v| v == 0.0));
        y.sum_all()?.backward()?;
        assert_eq!(w.grad().map(|g| g.shape().to_vec()), Some(b.clone()));
        let t = x.t()?.t()?.matmul(&w.t()?.t()?)?;
        assert_eq!(t.shape(), out.as_slice());
    }
    Ok(())
}

fn reductions(pool: &Pool) -> TestResult {
    let x = zeros(&[3, 0], pool)?.with_requires_grad();
    assert_eq!(x.sum(&[1], false)?.to_vec()?, vec![0.0; 3]);
    assert_eq!(x.sum(&[0], false)?.shape(), &[0]);
    assert_eq!(x.sum_all()?.to_scalar()?, 0.0);
    assert_eq!(x.mean(&[0], true)?.shape(), &[1, 0]);
    assert_eq!(x.mean_all()?.shape(), &[] as &[usize]);
    assert_eq!(x.max(&[0], false)?.shape(), &[0]);
    x.sum_all()?.backward()?;
    assert_eq!(x.grad().map(|g| g.shape().to_vec()), Some(vec![3, 0]));
    // The largest of nothing has no value: an error, not -inf or a panic.
    for result in [x.max(&[1], false), x.max(&[], false), x.argmax(1, false)] {
        assert!(
            matches!(result, Err(TensorError::InvalidShape { .. })),
            "{result:?}"
        );
    }
    assert_eq!(x.argmax(0, false)?.shape(), &[0]);
    assert_eq!(zeros(&[0, 3], pool)?.argmax(1, true)?.shape(), &[0, 1]);
    Ok(())
}

fn softmax_and_losses(pool: &Pool) -> TestResult {
    for &shape in &[&[3, 0][..], &[0, 3], &[0, 0], &[2, 0, 4]] {
        let x = zeros(shape, pool)?.with_requires_grad();
        for axis in [0, -1] {
            assert_eq!(x.softmax(axis)?.shape(), shape);
            assert_eq!(x.log_softmax(axis)?.shape(), shape);
        }
        x.log_softmax(-1)?.sum_all()?.backward()?;
    }
    // Zero classes: no label can be valid; a value, not a panic.
    let logits = zeros(&[3, 0], pool)?;
    let labels = zeros(&[3], pool)?;
    assert!(matches!(
        logits.cross_entropy(&labels),
        Err(TensorError::InvalidShape { .. })
    ));
    assert!(matches!(
        zeros(&[0, 0], pool)?.cross_entropy(&zeros(&[0], pool)?),
        Err(TensorError::InvalidShape { .. })
    ));
    assert!(logits.accuracy(&labels).is_err());
    // Zero rows: the mean of nothing, and a gradient of the logits' shape.
    let logits = zeros(&[0, 4], pool)?.with_requires_grad();
    let loss = logits.cross_entropy(&zeros(&[0], pool)?)?;
    assert_eq!(loss.shape(), &[] as &[usize]);
    loss.backward()?;
    assert_eq!(logits.grad().map(|g| g.shape().to_vec()), Some(vec![0, 4]));
    let p = zeros(&[0, 2], pool)?.with_requires_grad();
    let mse = p.mse(&zeros(&[0, 2], pool)?)?;
    mse.backward()?;
    assert_eq!(p.grad().map(|g| g.shape().to_vec()), Some(vec![0, 2]));
    Ok(())
}

fn views(pool: &Pool) -> TestResult {
    let x = zeros(&[2, 0, 4], pool)?.with_requires_grad();
    assert_eq!(x.reshape(&[0])?.shape(), &[0]);
    assert_eq!(x.reshape(&[0, 5, 7])?.shape(), &[0, 5, 7]);
    assert!(x.reshape(&[1]).is_err());
    assert_eq!(x.transpose(0, 2)?.shape(), &[4, 0, 2]);
    assert_eq!(x.transpose(0, 2)?.contiguous()?.shape(), &[4, 0, 2]);
    assert_eq!(x.permute(&[1, 2, 0])?.shape(), &[0, 4, 2]);
    assert_eq!(x.narrow(2, 1, 0)?.shape(), &[2, 0, 0]);
    assert_eq!(x.narrow(2, 4, 0)?.shape(), &[2, 0, 0]);
    assert_eq!(
        zeros(&[1, 0], pool)?.broadcast_to(&[3, 0])?.shape(),
        &[3, 0]
    );
    let y = x.transpose(1, 2)?.reshape(&[8, 0])?;
    y.sum_all()?.backward()?;
    assert!(x.to_scalar().is_err());
    let other = MemoryPool::cpu();
    assert_eq!(x.to(&other)?.shape(), &[2, 0, 4]);
    x.assign(&zeros(&[2, 0, 4], pool)?)?;
    x.transpose(0, 1)?.assign(&zeros(&[0, 2, 4], &other)?)?;
    Ok(())
}

fn optimizers_on_empty_parameters(pool: &Pool) -> TestResult {
    let p = zeros(&[0, 3], pool)?.with_requires_grad();
    let q = Tensor::ones(&[2], pool)?.with_requires_grad();
    let mut sgd = Sgd::new(
        vec![p.clone(), q.clone()],
        SgdConfig {
            momentum: 0.9,
            ..SgdConfig::new(0.1)
        },
    )?;
    let mut adam = Adam::new(vec![p.clone(), q.clone()], AdamConfig::adam(0.1))?;
    for _ in 0..2 {
        p.sum_all()?.add(&q.sum_all()?)?.backward()?;
        sgd.step()?;
        adam.step()?;
        sgd.zero_grad();
    }
    assert_eq!(p.shape(), &[0, 3]);
    Ok(())
}

/// The ops of contract 0.3.0 on zero-size shapes.
fn new_ops_on_empty_shapes(pool: &Pool) -> TestResult {
    let x = Tensor::zeros(&[3, 0], pool)?.with_requires_grad();
    for y in [
        x.sqrt()?,
        x.rsqrt()?,
        x.pow(2.0)?,
        x.abs()?,
        x.clamp(0.0, 1.0)?,
        x.silu()?,
        x.maximum(&x)?,
        x.minimum(&x)?,
        x.lt(&x)?,
        x.gt(&x)?,
        Tensor::where_(&x, &x, &x)?,
        x.masked_fill(&x, 1.0)?,
        x.dropout(&Dropout::new(0.5, 1, 1))?,
        x.slice(0, 1, 3, 2)?.expand(&[3, -1, 0])?.sum(&[0], false)?,
    ] {
        assert_eq!(y.numel(), 0);
        assert_eq!(y.to_vec()?, Vec::<f32>::new());
    }
    // Empty axes, empty pieces, empty indices.
    assert_eq!(x.slice(0, 2, 1, 1)?.shape(), &[0, 0]);
    assert_eq!(x.slice(0, 5, 9, 1)?.shape(), &[0, 0]);
    let pieces = Tensor::zeros(&[4, 2], pool)?.split(&[0, 4, 0], 0)?;
    assert_eq!(pieces[0].shape(), &[0, 2]);
    let joined = Tensor::concat(&[x.clone(), Tensor::zeros(&[3, 2], pool)?], 1)?;
    assert_eq!(joined.shape(), &[3, 2]);
    assert_eq!(x.pad(&[(0, 0), (1, 1)], 7.0)?.to_vec()?, vec![7.0; 6]);
    let table = Tensor::ones(&[4, 2], pool)?.with_requires_grad();
    let none = Tensor::zeros(&[0], pool)?;
    let rows = table.embedding(&Tensor::zeros(&[2, 0], pool)?)?;
    assert_eq!(rows.shape(), &[2, 0, 2]);
    rows.sum_all()?.backward()?;
    assert_eq!(table.grad().unwrap().to_vec()?, vec![0.0; 8]);
    assert_eq!(table.index_select(1, &none)?.shape(), &[4, 0]);
    assert_eq!(
        table.gather(0, &Tensor::zeros(&[0, 2], pool)?)?.shape(),
        &[0, 2]
    );
    // An empty table has no row to look up.
    let empty = Tensor::zeros(&[0, 2], pool)?;
    assert!(empty.embedding(&Tensor::zeros(&[1], pool)?).is_err());
    assert_eq!(empty.embedding(&none)?.shape(), &[0, 2]);
    // No labels: loss 0.
    let logits = Tensor::zeros(&[0, 5, 3], pool)?.with_requires_grad();
    let loss = logits.cross_entropy_with(&Tensor::zeros(&[0, 5], pool)?, Some(-100))?;
    assert_eq!(loss.to_scalar()?, 0.0);
    loss.backward()?;
    assert_eq!(logits.grad().unwrap().shape(), &[0, 5, 3]);
    Ok(())
}

/// The layer ops (tests/all/layers.rs has their zero-size batches): empty channels, planes,
/// rows and key sequences give empty results or, where nothing has a value, errors, on every
/// device (CUDA included).
fn layer_ops_on_empty_shapes(pool: &Pool) -> TestResult {
    let x = Tensor::zeros(&[2, 0, 4, 4], pool)?;
    let w = Tensor::zeros(&[3, 0, 3, 3], pool)?;
    assert!(
        x.conv2d(&w, None, [1, 1], [0, 0], [1, 1], 1).is_err(),
        "no input channels"
    );
    assert_eq!(x.max_pool2d([2, 2], [2, 2], [0, 0])?.shape(), &[2, 0, 2, 2]);
    let flat = Tensor::zeros(&[2, 3, 0, 4], pool)?;
    assert!(
        flat.avg_pool2d([1, 1], [1, 1], [0, 0]).is_err(),
        "empty planes"
    );
    let cols = Tensor::zeros(&[3, 0], pool)?.with_requires_grad();
    let y = cols.layer_norm(1, None, None, 1e-5)?;
    assert_eq!(y.shape(), &[3, 0]);
    y.sum_all()?.backward()?;
    let none = Tensor::zeros(&[0], pool)?;
    let y = x.batch_norm(&none, &none, None, None, true, 0.1, 1e-5)?;
    assert_eq!(y.shape(), x.shape());
    // No keys: every row sees nothing and is zero; no head dim: the scores are all 0.
    let q = Tensor::ones(&[1, 1, 2, 3], pool)?.with_requires_grad();
    let k = Tensor::zeros(&[1, 1, 0, 3], pool)?;
    let y = Tensor::scaled_dot_product_attention(&q, &k, &k, false, None, None)?;
    assert_eq!(y.to_vec()?, vec![0.0; 6]);
    let kv = Tensor::zeros(&[1, 1, 0, 2], pool)?;
    let y = Tensor::scaled_dot_product_attention(&q, &k, &kv, false, None, None)?;
    assert_eq!(y.shape(), &[1, 1, 2, 2]);
    assert_eq!(y.to_vec()?, vec![0.0; 4]);
    y.sum_all()?.backward()?;
    assert_eq!(q.grad().unwrap().to_vec()?, vec![0.0; 6]);
    let q0 = Tensor::zeros(&[1, 1, 2, 0], pool)?;
    let v = Tensor::ones(&[1, 1, 3, 2], pool)?;
    let k0 = Tensor::zeros(&[1, 1, 3, 0], pool)?;
    let y = Tensor::scaled_dot_product_attention(&q0, &k0, &v, false, None, None)?;
    assert_eq!(y.to_vec()?, vec![1.0; 4]);
    Ok(())
}

/// An empty input plane (H or W is 0) that padding alone would give an output panicked in
/// conv2d's kernel; it is refused with a sentence, forward and through the spec, as pooling
/// refuses empty planes.
fn conv2d_refuses_empty_planes_whatever_the_padding(pool: &Pool) -> TestResult {
    for (input, padding) in [
        ([1, 1, 0, 0], [1, 1]),
        ([1, 1, 0, 3], [1, 0]),
        ([2, 3, 4, 0], [0, 2]),
        ([1, 2, 0, 0], [3, 3]),
    ] {
        let x = Tensor::zeros(&input, pool)?.with_requires_grad();
        let w = Tensor::ones(&[2, input[1], 1, 1], pool)?.with_requires_grad();
        for stride in [[1, 1], [2, 1]] {
            let e = x
                .conv2d(&w, None, stride, padding, [1, 1], 1)
                .expect_err("an empty plane is refused");
            let text = e.to_string();
            assert!(text.contains("empty"), "{text}");
            assert!(!text.contains('\n'), "{text}");
        }
    }
    Ok(())
}

/// Found by fuzz_layers: a kernel of 2 dilated by `usize::MAX` spans `usize::MAX + 1`, and the
/// sum overflowed in conv2d's argument check (a panic in debug builds).
fn conv2d_refuses_a_dilated_kernel_past_usize(pool: &Pool) -> TestResult {
    let x = Tensor::zeros(&[1, 1, 4, 4], pool)?;
    let w = Tensor::zeros(&[1, 1, 2, 2], pool)?;
    for dilation in [[usize::MAX, 1], [1, usize::MAX], [usize::MAX / 2 + 1, 1]] {
        let e = x
            .conv2d(&w, None, [1, 1], [0, 0], dilation, 1)
            .expect_err("a kernel past usize is refused");
        let text = e.to_string();
        assert!(text.contains("kernel") && !text.contains('\n'), "{text}");
    }
    Ok(())
}

test_device!(
    conv2d_refuses_a_dilated_kernel_past_usize,
    conv2d_refuses_empty_planes_whatever_the_padding,
    layer_ops_on_empty_shapes,
    new_ops_on_empty_shapes,
    creation,
    unary_and_scalar_ops,
    binary_ops,
    matmul_and_linear,
    reductions,
    softmax_and_losses,
    views,
    optimizers_on_empty_parameters,
);
