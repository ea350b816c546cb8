//! The layer ops as Tensor ops (conv2d, max/avg pooling, layer norm, batch norm, attention) on
//! every backend: forward against the f64 references of `nn_kernels.rs` and every gradient
//! through `backward()` against finite differences (common/gradcheck.rs), over the arguments
//! that change the maths; batch norm's running statistics; zero-size batches; bad arguments as
//! values; the workspace reserved in the pool before anything is allocated.
//!
//! On a CUDA pool the same tests run the CUDA paths (cuda/layers.rs) against the same
//! references, and `layers_on_cuda_match_cpu` compares every output and gradient with the CPU
//! kernels' on the same inputs.

use crate::common::TestResult;
use crate::common::gradcheck::{Input, check};
use crate::common::reference::R;
use crate::nn_kernels::{
    AttnCase, ConvCase, attention_ref, batch_norm_ref, conv_ref, layer_norm_ref, pool_ref,
};
use crate::test_device;
use orch_tensor::nn_kernels::{AttentionSpec, Conv2dSpec, MaskKind};
use orch_tensor::{Device, MemoryPool, Tensor, TensorError};
use std::sync::Arc;

type Pool = Arc<MemoryPool>;

fn x4(pool: &Pool) -> orch_tensor::Result<Tensor> {
    Tensor::randn(&[2, 2, 5, 5], 1, pool)
}

// ---- conv2d --------------------------------------------------------------------------------

fn conv_cases() -> Vec<ConvCase> {
    let base = ConvCase {
        x: [2, 2, 5, 6],
        o: 3,
        k: [3, 2],
        stride: [1, 1],
        pad: [0, 0],
        dil: [1, 1],
        groups: 1,
        bias: true,
    };
    vec![
        base,
        ConvCase {
            bias: false,
            ..base
        },
        ConvCase {
            stride: [2, 1],
            ..base
        },
        ConvCase {
            pad: [1, 2],
            ..base
        },
        ConvCase {
            dil: [2, 2],
            ..base
        },
        ConvCase {
            x: [1, 4, 4, 4],
            o: 6,
            groups: 2,
            pad: [1, 1],
            ..base
        },
        ConvCase { k: [1, 1], ..base },
    ]
}

fn conv2d_matches_reference_and_gradients(pool: &Pool) -> TestResult {
    for (i, c) in conv_cases().into_iter().enumerate() {
        let w_shape = [c.o, c.x[1] / c.groups, c.k[0], c.k[1]];
        let mut inputs = vec![
            Input::random(&c.x, 10 + i as u64),
            Input::random(&w_shape, 20 + i as u64),
        ];
        if c.bias {
            inputs.push(Input::random(&[c.o], 30 + i as u64));
        }
        check(
            pool,
            &inputs,
            |t| t[0].conv2d(&t[1], t.get(2), c.stride, c.pad, c.dil, c.groups),
            |r| {
                let (out, [oh, ow]) =
                    conv_ref(&c, &r[0].data, &r[1].data, r.get(2).map(|b| &b.data[..]));
                R::new(&[c.x[0], c.o, oh, ow], out)
            },
        )
        .map_err(|e| format!("case {i} {c:?}: {e}"))?;
    }
    Ok(())
}

fn conv2d_takes_non_contiguous_inputs(pool: &Pool) -> TestResult {
    let c = ConvCase {
        x: [2, 3, 4, 5],
        o: 2,
        k: [2, 2],
        stride: [1, 1],
        pad: [1, 0],
        dil: [1, 1],
        groups: 1,
        bias: false,
    };
    // x is given as [N, W, H, C]-ordered data permuted to NCHW: a strided view.
    let inputs = [
        Input::random(&[2, 5, 4, 3], 3),
        Input::random(&[2, 3, 2, 2], 4),
    ];
    check(
        pool,
        &inputs,
        |t| {
            let x = t[0].permute(&[0, 3, 2, 1])?;
            assert!(!x.is_contiguous());
            x.conv2d(&t[1], None, c.stride, c.pad, c.dil, 1)
        },
        |r| {
            let x = r[0].permute(&[0, 3, 2, 1]);
            let (out, [oh, ow]) = conv_ref(&c, &x.data, &r[1].data, None);
            R::new(&[2, 2, oh, ow], out)
        },
    )?;
    Ok(())
}

// ---- pooling ---------------------------------------------------------------------------------

type PoolCase = ([usize; 4], [usize; 2], [usize; 2], [usize; 2]);
const POOL_CASES: [PoolCase; 4] = [
    ([2, 2, 6, 6], [2, 2], [2, 2], [0, 0]),
    ([1, 3, 5, 7], [3, 3], [2, 2], [1, 1]),
    ([2, 1, 5, 4], [3, 2], [1, 2], [1, 0]),
    ([1, 2, 4, 4], [2, 3], [3, 1], [0, 1]),
];

fn pooling_matches_reference_and_gradients(pool: &Pool) -> TestResult {
    for (i, (shape, k, s, p)) in POOL_CASES.into_iter().enumerate() {
        for max in [true, false] {
            let input = [Input::random(&shape, 40 + i as u64)];
            check(
                pool,
                &input,
                |t| match max {
                    true => t[0].max_pool2d(k, s, p),
                    false => t[0].avg_pool2d(k, s, p),
                },
                |r| {
                    let out = pool_ref(&r[0].data, shape, k, s, p, max);
                    let oh = (shape[2] + 2 * p[0] - k[0]) / s[0] + 1;
                    let ow = (shape[3] + 2 * p[1] - k[1]) / s[1] + 1;
                    R::new(&[shape[0], shape[1], oh, ow], out)
                },
            )
            .map_err(|e| format!("case {i} (max: {max}): {e}"))?;
        }
    }
    Ok(())
}

// ---- layer norm ------------------------------------------------------------------------------

fn layer_norm_matches_reference_and_gradients(pool: &Pool) -> TestResult {
    let cases: [(&[usize], usize); 3] = [(&[4, 6], 1), (&[2, 3, 4], 2), (&[3, 5], 2)];
    for (i, (shape, dims)) in cases.into_iter().enumerate() {
        let norm = &shape[shape.len() - dims..];
        let cols: usize = norm.iter().product();
        for (affine_w, affine_b) in [(false, false), (true, false), (false, true), (true, true)] {
            let mut inputs = vec![Input::random(shape, 50 + i as u64)];
            if affine_w {
                inputs.push(Input::random(norm, 60));
            }
            if affine_b {
                inputs.push(Input::random(norm, 70));
            }
            let eps = 1e-3;
            check(
                pool,
                &inputs,
                |t| {
                    let w = affine_w.then(|| &t[1]);
                    let b = affine_b.then(|| &t[1 + usize::from(affine_w)]);
                    t[0].layer_norm(dims, w, b, eps)
                },
                |r| {
                    let w = affine_w.then(|| &r[1].data[..]);
                    let b = affine_b.then(|| &r[1 + usize::from(affine_w)].data[..]);
                    let (y, _, _) = layer_norm_ref(&r[0].data, cols, w, b, eps as f64);
                    R::new(shape, y)
                },
            )
            .map_err(|e| format!("case {i} w {affine_w} b {affine_b}: {e}"))?;
        }
    }
    Ok(())
}

// ---- batch norm ------------------------------------------------------------------------------

fn batch_norm_matches_reference_and_gradients(pool: &Pool) -> TestResult {
    let stats = |c: usize| -> orch_tensor::Result<(Tensor, Tensor)> {
        Ok((
            Tensor::from_vec((0..c).map(|i| 0.1 * i as f32).collect(), &[c], pool)?,
            Tensor::from_vec((0..c).map(|i| 0.5 + 0.25 * i as f32).collect(), &[c], pool)?,
        ))
    };
    let cases: [&[usize]; 3] = [&[5, 3], &[2, 3, 4], &[3, 2, 2, 3]];
    for (i, shape) in cases.into_iter().enumerate() {
        let c = shape[1];
        let spatial: usize = shape[2..].iter().product();
        for training in [true, false] {
            for affine in [false, true] {
                let mut inputs = vec![Input::random(shape, 80 + i as u64)];
                if affine {
                    inputs.push(Input::random(&[c], 90));
                    inputs.push(Input::random(&[c], 91));
                }
                let eps = 1e-3f32;
                let (m0, v0) = stats(c)?;
                let (m0, v0) = (m0.to_vec()?, v0.to_vec()?);
                let run = (
                    m0.iter().map(|&v| v as f64).collect::<Vec<_>>(),
                    v0.iter().map(|&v| v as f64).collect::<Vec<_>>(),
                );
                check(
                    pool,
                    &inputs,
                    |t| {
                        let (m, v) = stats(c)?;
                        let (w, b) = (t.get(1), t.get(2));
                        t[0].batch_norm(&m, &v, w, b, training, 0.1, eps)
                    },
                    |r| {
                        let given = (!training).then(|| (&run.0[..], &run.1[..]));
                        let w = affine.then(|| &r[1].data[..]);
                        let b = affine.then(|| &r[2].data[..]);
                        let dims = [shape[0], c, spatial];
                        let (y, _, _) = batch_norm_ref(&r[0].data, dims, given, w, b, eps as f64);
                        R::new(shape, y)
                    },
                )
                .map_err(|e| format!("case {i} training {training} affine {affine}: {e}"))?;
            }
        }
    }
    Ok(())
}

fn batch_norm_updates_running_stats_in_training_only(pool: &Pool) -> TestResult {
    let x = Input::random(&[4, 2, 3], 7);
    let xt = x.tensor(pool)?.with_requires_grad();
    let mean = Tensor::from_slice(&[0.5, -1.0], &[2], pool)?;
    let var = Tensor::from_slice(&[2.0, 0.5], &[2], pool)?;
    let momentum = 0.25;
    xt.batch_norm(&mean, &var, None, None, true, momentum, 1e-5)?;
    let (_, bm, bv) = batch_norm_ref(&x.data, [4, 2, 3], None, None, None, 1e-5);
    let unbias = 12.0 / 11.0;
    let want_m: Vec<f64> = [0.5, -1.0]
        .iter()
        .zip(&bm)
        .map(|(r, s)| (1.0 - momentum as f64) * r + momentum as f64 * s)
        .collect();
    let want_v: Vec<f64> = [2.0, 0.5]
        .iter()
        .zip(&bv)
        .map(|(r, s)| (1.0 - momentum as f64) * r + momentum as f64 * s * unbias)
        .collect();
    crate::common::assert_close(&mean.to_vec()?, &want_m, 1e-5, "running mean");
    crate::common::assert_close(&var.to_vec()?, &want_v, 1e-5, "running var");
    // Eval reads them and leaves them as they are; they are buffers, never differentiated.
    let (m1, v1) = (mean.to_vec()?, var.to_vec()?);
    let y = xt.batch_norm(&mean, &var, None, None, false, momentum, 1e-5)?;
    y.sum_all()?.backward()?;
    assert_eq!((mean.to_vec()?, var.to_vec()?), (m1, v1));
    assert!(mean.grad().is_none() && var.grad().is_none());
    // Non-contiguous running stats (a strided view of one buffer) are updated through it.
    let both = Tensor::from_slice(&[0.0, 1.0, 0.0, 1.0], &[4], pool)?;
    let (m, v) = (both.slice(0, 0, 4, 2)?, both.slice(0, 1, 4, 2)?);
    assert!(!m.is_contiguous());
    xt.batch_norm(&m, &v, None, None, true, 1.0, 1e-5)?;
    let after = both.to_vec()?;
    crate::common::assert_close(&[after[0], after[2]], &bm, 1e-5, "strided running mean");
    Ok(())
}

// ---- attention -------------------------------------------------------------------------------

fn attn_cases() -> Vec<AttnCase> {
    let base = AttnCase {
        b: 2,
        h: 2,
        t: 4,
        s: 5,
        d: 3,
        dv: 2,
        causal: false,
        mask: None,
        scale: None,
    };
    vec![
        base.clone(),
        AttnCase {
            causal: true,
            ..base.clone()
        },
        AttnCase {
            scale: Some(0.7),
            ..base.clone()
        },
        AttnCase {
            mask: Some((MaskKind::Additive, vec![4, 5])),
            ..base.clone()
        },
        AttnCase {
            mask: Some((MaskKind::Additive, vec![2, 1, 4, 5])),
            causal: true,
            ..base.clone()
        },
        AttnCase {
            t: 6,
            s: 6,
            d: 4,
            dv: 4,
            causal: true,
            ..base
        },
    ]
}

fn attention_matches_reference_and_gradients(pool: &Pool) -> TestResult {
    for (i, c) in attn_cases().into_iter().enumerate() {
        let inputs = [
            Input::random(&[c.b, c.h, c.t, c.d], 100 + i as u64),
            Input::random(&[c.b, c.h, c.s, c.d], 110 + i as u64),
            Input::random(&[c.b, c.h, c.s, c.dv], 120 + i as u64),
        ];
        // An additive mask with some -inf (masked keys) and finite biases.
        let mask = c.mask.as_ref().map(|(_, shape)| {
            let mut m = Input::random(shape, 130);
            for (j, v) in m.data.iter_mut().enumerate() {
                if j % 4 == 1 {
                    *v = f64::NEG_INFINITY;
                }
            }
            m
        });
        check(
            pool,
            &inputs,
            |t| {
                let m = mask.as_ref().map(|m| m.tensor(pool)).transpose()?;
                Tensor::scaled_dot_product_attention(
                    &t[0],
                    &t[1],
                    &t[2],
                    c.causal,
                    m.as_ref(),
                    c.scale,
                )
            },
            |r| {
                let m = mask.as_ref().map(|m| &m.data[..]);
                let out = attention_ref(&c, &r[0].data, &r[1].data, &r[2].data, m);
                R::new(&[c.b, c.h, c.t, c.dv], out)
            },
        )
        .map_err(|e| format!("case {i} {c:?}: {e}"))?;
    }
    Ok(())
}

fn attention_mask_gets_no_gradient(pool: &Pool) -> TestResult {
    let q = Tensor::randn(&[1, 2, 3, 4], 1, pool)?.with_requires_grad();
    let mask = Tensor::zeros(&[3, 3], pool)?.with_requires_grad();
    let run = || Tensor::scaled_dot_product_attention(&q, &q, &q, true, Some(&mask), None);
    run()?.sum_all()?.backward()?;
    assert!(q.grad().is_some());
    assert!(
        mask.grad().is_none(),
        "the additive mask is not differentiated"
    );
    Ok(())
}

// ---- zero-size batches, bad arguments, quotas ------------------------------------------------

fn zero_size_batches(pool: &Pool) -> TestResult {
    let x = Tensor::zeros(&[0, 2, 4, 4], pool)?.with_requires_grad();
    let w = Tensor::ones(&[3, 2, 3, 3], pool)?.with_requires_grad();
    let y = x.conv2d(&w, None, [1, 1], [1, 1], [1, 1], 1)?;
    assert_eq!(y.shape(), [0, 3, 4, 4]);
    y.sum_all()?.backward()?;
    assert_eq!(
        w.grad().map(|g| g.to_vec()).transpose()?,
        Some(vec![0.0; 54])
    );
    for y in [
        x.max_pool2d([2, 2], [2, 2], [0, 0])?,
        x.avg_pool2d([2, 2], [2, 2], [1, 1])?,
    ] {
        assert_eq!(y.numel(), 0);
        y.sum_all()?.backward()?;
    }
    let rows = Tensor::zeros(&[0, 5], pool)?.with_requires_grad();
    let lw = Tensor::ones(&[5], pool)?.with_requires_grad();
    let y = rows.layer_norm(1, Some(&lw), None, 1e-5)?;
    assert_eq!(y.shape(), [0, 5]);
    y.sum_all()?.backward()?;
    assert_eq!(
        lw.grad().map(|g| g.to_vec()).transpose()?,
        Some(vec![0.0; 5])
    );
    let (m, v) = (Tensor::ones(&[2], pool)?, Tensor::ones(&[2], pool)?);
    let y = x.batch_norm(&m, &v, None, None, true, 0.1, 1e-5)?;
    assert_eq!(y.shape(), x.shape());
    assert_eq!(
        (m.to_vec()?, v.to_vec()?),
        (vec![1.0; 2], vec![1.0; 2]),
        "unchanged"
    );
    for (b, t) in [(0, 3), (1, 0)] {
        let q = Tensor::zeros(&[b, 2, t, 4], pool)?.with_requires_grad();
        let k = Tensor::zeros(&[b, 2, 3, 4], pool)?.with_requires_grad();
        let y = Tensor::scaled_dot_product_attention(&q, &k, &k, true, None, None)?;
        assert_eq!(y.shape(), [b, 2, t, 4]);
        y.sum_all()?.backward()?;
    }
    Ok(())
}

fn bad_arguments_are_errors(pool: &Pool) -> TestResult {
    let x = x4(pool)?;
    let w = Tensor::ones(&[3, 2, 3, 3], pool)?;
    let conv = |s, p, d, g, w: &Tensor, b: Option<&Tensor>| x.conv2d(w, b, s, p, d, g);
    assert!(
        conv([0, 1], [0, 0], [1, 1], 1, &w, None).is_err(),
        "stride 0"
    );
    assert!(
        conv([1, 1], [0, 0], [0, 1], 1, &w, None).is_err(),
        "dilation 0"
    );
    assert!(conv([1, 1], [0, 0], [1, 1], 2, &w, None).is_err(), "groups");
    assert!(
        conv([1, 1], [0, 0], [3, 3], 1, &w, None).is_err(),
        "kernel too large"
    );
    let b = Tensor::ones(&[2], pool)?;
    assert!(
        conv([1, 1], [0, 0], [1, 1], 1, &w, Some(&b)).is_err(),
        "bias shape"
    );
    assert!(
        x.reshape(&[2, 50])?
            .conv2d(&w, None, [1, 1], [0, 0], [1, 1], 1)
            .is_err()
    );
    assert!(
        x.max_pool2d([2, 2], [1, 1], [2, 0]).is_err(),
        "padding over half the kernel"
    );
    assert!(
        x.avg_pool2d([0, 2], [1, 1], [0, 0]).is_err(),
        "empty kernel"
    );
    assert!(x.max_pool2d([2, 2], [0, 1], [0, 0]).is_err(), "stride 0");
    assert!(matches!(
        x.layer_norm(0, None, None, 1e-5),
        Err(TensorError::InvalidArgument { .. })
    ));
    assert!(x.layer_norm(5, None, None, 1e-5).is_err());
    assert!(x.layer_norm(1, None, None, -1.0).is_err(), "negative eps");
    assert!(x.layer_norm(1, None, None, f32::NAN).is_err(), "NaN eps");
    let w5 = Tensor::ones(&[5], pool)?;
    assert!(
        x.layer_norm(2, Some(&w5), None, 1e-5).is_err(),
        "weight shape"
    );
    let (m2, m3) = (Tensor::zeros(&[2], pool)?, Tensor::zeros(&[3], pool)?);
    assert!(x.batch_norm(&m3, &m2, None, None, true, 0.1, 1e-5).is_err());
    assert!(
        x.batch_norm(&m2, &m2, Some(&m3), None, true, 0.1, 1e-5)
            .is_err()
    );
    assert!(
        x.batch_norm(&m2, &m2, None, None, true, f32::NAN, 1e-5)
            .is_err()
    );
    let one = Tensor::zeros(&[1, 2], pool)?;
    assert!(
        one.batch_norm(&m2, &m2, None, None, true, 0.1, 1e-5)
            .is_err(),
        "one value"
    );
    let q = Tensor::zeros(&[1, 2, 3, 4], pool)?;
    let k = Tensor::zeros(&[1, 2, 5, 3], pool)?;
    let sdpa = Tensor::scaled_dot_product_attention;
    assert!(matches!(
        sdpa(&q, &k, &k, false, None, None),
        Err(TensorError::ShapeMismatch { .. })
    ));
    let bad_mask = Tensor::zeros(&[2, 3], pool)?;
    assert!(
        sdpa(&q, &q, &q, false, Some(&bad_mask), None).is_err(),
        "mask shape"
    );
    assert!(
        sdpa(&q, &q, &q, false, None, Some(f32::INFINITY)).is_err(),
        "scale"
    );
    // Another device is a DeviceMismatch value.
    let other = match pool.device() {
        Device::Cpu => MemoryPool::new(Device::Sim(3), None)?,
        _ => MemoryPool::cpu(),
    };
    let w_other = w.to(&other)?;
    assert!(matches!(
        x.conv2d(&w_other, None, [1, 1], [0, 0], [1, 1], 1),
        Err(TensorError::DeviceMismatch { .. })
    ));
    let q_other = q.to(&other)?;
    assert!(matches!(
        sdpa(&q, &q_other, &q, false, None, None),
        Err(TensorError::DeviceMismatch { .. })
    ));
    Ok(())
}

/// A pool that holds the inputs and the output but not the workspace refuses the op with
/// `OutOfMemory` for the workspace itself, before allocating anything; with room, it runs.
fn workspace_is_reserved_before_anything(pool: &Pool) -> TestResult {
    if matches!(pool.device(), Device::Cuda(_)) {
        return Ok(()); // the limit is a property of the pool, tested on host devices
    }
    let device = pool.device();
    // Attention: workspace_elems is a few 64x64 score blocks per thread, far above q, k, v.
    let shape = [1, 2, 8, 4];
    let spec = AttentionSpec::new(&shape, &shape, &shape, false, None, None)?;
    let io_bytes = 4 * 4 * 64; // q, k, v and the output
    let lse_bytes = 4 * 16;
    let ws_bytes = 4 * spec.workspace_elems() as u64;
    for (slack, ok) in [(0, false), (ws_bytes, true)] {
        let small = MemoryPool::new(device, Some(io_bytes + lse_bytes + slack))?;
        let q = Tensor::randn(&shape, 1, &small)?;
        let (k, v) = (
            Tensor::randn(&shape, 2, &small)?,
            Tensor::randn(&shape, 3, &small)?,
        );
        let before = small.in_use();
        let out = Tensor::scaled_dot_product_attention(&q, &k, &v, false, None, None);
        match (ok, out) {
            (true, Ok(_)) => {}
            (
                false,
                Err(TensorError::OutOfMemory {
                    requested, in_use, ..
                }),
            ) => {
                assert_eq!(
                    (requested, in_use),
                    (ws_bytes, before),
                    "the workspace first"
                );
                assert_eq!(small.in_use(), before, "nothing kept");
                assert_eq!(small.peak(), before, "nothing reserved past it");
            }
            (ok, other) => panic!("attention with room {ok}: {other:?}"),
        }
    }
    // Convolution: the im2col workspace.
    let (xs, ws) = ([2, 3, 8, 8], [4, 3, 3, 3]);
    let spec = Conv2dSpec::new(&xs, &ws, None, [1, 1], [1, 1], [1, 1], 1)?;
    let ws_bytes = 4 * spec.workspace_elems() as u64;
    let io_bytes = 4 * (2 * 3 * 64 + 4 * 27 + 2 * 4 * 64);
    for (slack, ok) in [(ws_bytes - 4, false), (ws_bytes, true)] {
        let small = MemoryPool::new(device, Some(io_bytes + slack))?;
        let x = Tensor::randn(&xs, 1, &small)?;
        let w = Tensor::randn(&ws, 2, &small)?;
        let before = small.in_use();
        match (ok, x.conv2d(&w, None, [1, 1], [1, 1], [1, 1], 1)) {
            (true, Ok(y)) => assert_eq!(y.shape(), [2, 4, 8, 8]),
            (false, Err(TensorError::OutOfMemory { requested, .. })) => {
                // The workspace fits the limit but not with the output: refused at the output,
                // after the workspace was reserved and before it was allocated.
                assert!(
                    requested == 4 * 2 * 4 * 64 || requested == ws_bytes,
                    "{requested}"
                );
                assert_eq!(small.in_use(), before);
            }
            (ok, other) => panic!("conv2d with room {ok}: {other:?}"),
        }
    }
    Ok(())
}

test_device!(
    conv2d_matches_reference_and_gradients,
    conv2d_takes_non_contiguous_inputs,
    pooling_matches_reference_and_gradients,
    layer_norm_matches_reference_and_gradients,
    batch_norm_matches_reference_and_gradients,
    batch_norm_updates_running_stats_in_training_only,
    attention_matches_reference_and_gradients,
    attention_mask_gets_no_gradient,
    zero_size_batches,
    bad_arguments_are_errors,
    workspace_is_reserved_before_anything,
);

// ---- CUDA against the CPU kernels ------------------------------------------------------------

/// Outputs and gradients of `op` on the same inputs: the op's output values, every input's
/// gradient of `sum(op(inputs) * w)` (random `w`), and the `extra` tensors' values after it.
type Run = (Vec<f32>, Vec<Vec<f32>>, Vec<Vec<f32>>);

/// A layer op under test: its output and the extra tensors to compare after backward.
type LayerOp<'a> = dyn Fn(&[Tensor], &Pool) -> orch_tensor::Result<(Tensor, Vec<Tensor>)> + 'a;

fn run_layer(
    pool: &Pool,
    inputs: &[Input],
    op: &LayerOp<'_>,
) -> Result<Run, Box<dyn std::error::Error>> {
    let ts = inputs
        .iter()
        .map(|i| Ok(i.tensor(pool)?.with_requires_grad()))
        .collect::<orch_tensor::Result<Vec<_>>>()?;
    let (y, extra) = op(&ts, pool)?;
    let w = Input::random(y.shape(), 999).tensor(pool)?;
    y.mul(&w)?.sum_all()?.backward()?;
    let grads = ts
        .iter()
        .map(|t| {
            Ok(t.grad()
                .map(|g| g.to_vec())
                .transpose()?
                .unwrap_or_default())
        })
        .collect::<orch_tensor::Result<Vec<_>>>()?;
    let extra = extra
        .iter()
        .map(Tensor::to_vec)
        .collect::<orch_tensor::Result<Vec<_>>>()?;
    Ok((y.to_vec()?, grads, extra))
}

/// Runs `op` on the CPU and on `cuda` and asserts every output, gradient and extra agree.
fn same_on_cuda(cuda: &Pool, what: &str, inputs: &[Input], op: &LayerOp<'_>) -> TestResult {
    let want = run_layer(&MemoryPool::cpu(), inputs, op)?;
    let got = run_layer(cuda, inputs, op)?;
    let close = |a: &[f32], e: &[f32], part: &str| {
        assert_eq!(a.len(), e.len(), "{what}: {part}: lengths differ");
        for (i, (&a, &e)) in a.iter().zip(e).enumerate() {
            let ok = a == e || (a - e).abs() <= 1e-4 * (1.0 + e.abs());
            assert!(ok, "{what}: {part}[{i}]: CUDA {a}, CPU {e}");
        }
    };
    close(&got.0, &want.0, "output");
    for (i, (g, w)) in got.1.iter().zip(&want.1).enumerate() {
        close(g, w, &format!("gradient of input {i}"));
    }
    for (i, (g, w)) in got.2.iter().zip(&want.2).enumerate() {
        close(g, w, &format!("extra {i}"));
    }
    Ok(())
}

/// Every layer op, forward and backward, on CUDA against the CPU kernels on the same inputs:
/// the argument cases of the tests above plus a fully masked attention row and batch norm's
/// running statistics. Skips without a GPU (fails instead under `ORCH_REQUIRE_GPU=1`).
#[test]
fn layers_on_cuda_match_cpu() -> TestResult {
    let Some(cuda) = crate::common::cuda_pool() else {
        return Ok(());
    };
    let plain = |y: orch_tensor::Result<Tensor>| y.map(|y| (y, Vec::new()));
    for (i, c) in conv_cases().into_iter().enumerate() {
        let mut inputs = vec![
            Input::random(&c.x, 10 + i as u64),
            Input::random(&[c.o, c.x[1] / c.groups, c.k[0], c.k[1]], 20 + i as u64),
        ];
        if c.bias {
            inputs.push(Input::random(&[c.o], 30 + i as u64));
        }
        same_on_cuda(&cuda, &format!("conv2d {c:?}"), &inputs, &|t, _| {
            plain(t[0].conv2d(&t[1], t.get(2), c.stride, c.pad, c.dil, c.groups))
        })?;
    }
    for (i, (shape, k, s, p)) in POOL_CASES.into_iter().enumerate() {
        let inputs = [Input::random(&shape, 40 + i as u64)];
        same_on_cuda(&cuda, &format!("max_pool2d case {i}"), &inputs, &|t, _| {
            plain(t[0].max_pool2d(k, s, p))
        })?;
        same_on_cuda(&cuda, &format!("avg_pool2d case {i}"), &inputs, &|t, _| {
            plain(t[0].avg_pool2d(k, s, p))
        })?;
    }
    for (dims, affine) in [(1, false), (1, true), (2, true)] {
        let shape = [3, 4, 5];
        let normalized = &shape[3 - dims..];
        let mut inputs = vec![Input::random(&shape, 50)];
        if affine {
            inputs.push(Input::random(normalized, 51));
            inputs.push(Input::random(normalized, 52));
        }
        same_on_cuda(
            &cuda,
            &format!("layer_norm {dims} {affine}"),
            &inputs,
            &|t, _| plain(t[0].layer_norm(dims, t.get(1), t.get(2), 1e-5)),
        )?;
    }
    for (shape, training, affine) in [
        (&[5, 3][..], true, true),
        (&[2, 3, 4][..], true, false),
        (&[3, 2, 2, 3][..], false, true),
    ] {
        let c = shape[1];
        let mut inputs = vec![Input::random(shape, 60)];
        if affine {
            inputs.push(Input::random(&[c], 61));
            inputs.push(Input::random(&[c], 62));
        }
        let what = format!("batch_norm {shape:?} training {training}");
        same_on_cuda(&cuda, &what, &inputs, &|t, pool| {
            let m = Tensor::from_vec((0..c).map(|i| 0.1 * i as f32).collect(), &[c], pool)?;
            let v = Tensor::from_vec((0..c).map(|i| 0.5 + 0.25 * i as f32).collect(), &[c], pool)?;
            let y = t[0].batch_norm(&m, &v, t.get(1), t.get(2), training, 0.1, 1e-5)?;
            Ok((y, vec![m, v]))
        })?;
    }
    let mut cases = attn_cases();
    cases.push(AttnCase {
        mask: Some((MaskKind::Additive, vec![4, 5])),
        ..cases[0].clone()
    });
    for (i, c) in cases.into_iter().enumerate() {
        let inputs = [
            Input::random(&[c.b, c.h, c.t, c.d], 100 + i as u64),
            Input::random(&[c.b, c.h, c.s, c.d], 110 + i as u64),
            Input::random(&[c.b, c.h, c.s, c.dv], 120 + i as u64),
        ];
        // Some -inf (masked keys); in the last case all of query row 0 is masked.
        let last = i == attn_cases().len();
        let mask = c.mask.as_ref().map(|(_, shape)| {
            let mut m = Input::random(shape, 130);
            let s = shape[shape.len() - 1];
            for (j, v) in m.data.iter_mut().enumerate() {
                if j % 4 == 1 || (last && j < s) {
                    *v = f64::NEG_INFINITY;
                }
            }
            m
        });
        same_on_cuda(&cuda, &format!("attention {c:?}"), &inputs, &|t, pool| {
            let m = mask.as_ref().map(|m| m.tensor(pool)).transpose()?;
            let y = Tensor::scaled_dot_product_attention(
                &t[0],
                &t[1],
                &t[2],
                c.causal,
                m.as_ref(),
                c.scale,
            )?;
            Ok((y, Vec::new()))
        })?;
    }
    Ok(())
}
