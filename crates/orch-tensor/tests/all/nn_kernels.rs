//! The nn kernels (`orch_tensor::nn_kernels`) against naive f64 references written as direct
//! loops: forward values, and every gradient against central finite differences of the
//! reference (a loss `sum(out * g)` with random `g`), over tables of cases covering each
//! argument that changes the maths; zero-size inputs; every bad argument an error value.
//! CPU only, on slices; the Tensor ops over them are tested in layers.rs (which reuses the
//! references here).

use crate::common::gradcheck::values;
use orch_tensor::nn_kernels::*;

fn f32s(v: &[f64]) -> Vec<f32> {
    v.iter().map(|&x| x as f32).collect()
}

#[track_caller]
fn assert_close(what: &str, got: &[f32], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let err = (g as f64 - w).abs();
        assert!(
            err <= tol * (1.0 + w.abs()),
            "{what}[{i}]: got {g}, want {w} (error {err})"
        );
    }
}

/// Gradients of `sum(f(inputs) * g)` with respect to each input, by central differences.
fn fd_grads(f: &dyn Fn(&[Vec<f64>]) -> Vec<f64>, inputs: &[Vec<f64>], g: &[f64]) -> Vec<Vec<f64>> {
    const H: f64 = 1e-6;
    let loss = |xs: &[Vec<f64>]| f(xs).iter().zip(g).map(|(a, b)| a * b).sum::<f64>();
    let mut xs = inputs.to_vec();
    (0..inputs.len())
        .map(|k| {
            (0..inputs[k].len())
                .map(|i| {
                    let x0 = xs[k][i];
                    xs[k][i] = x0 + H;
                    let up = loss(&xs);
                    xs[k][i] = x0 - H;
                    let down = loss(&xs);
                    xs[k][i] = x0;
                    (up - down) / (2.0 * H)
                })
                .collect()
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// conv2d

#[derive(Debug, Clone, Copy)]
pub(crate) struct ConvCase {
    pub(crate) x: [usize; 4],
    pub(crate) o: usize,
    pub(crate) k: [usize; 2],
    pub(crate) stride: [usize; 2],
    pub(crate) pad: [usize; 2],
    pub(crate) dil: [usize; 2],
    pub(crate) groups: usize,
    pub(crate) bias: bool,
}

pub(crate) fn conv_ref(
    c: &ConvCase,
    x: &[f64],
    w: &[f64],
    b: Option<&[f64]>,
) -> (Vec<f64>, [usize; 2]) {
    let [n, ch, h, wd] = c.x;
    let cg = ch / c.groups;
    let og = c.o / c.groups;
    let oh = (h + 2 * c.pad[0] - c.dil[0] * (c.k[0] - 1) - 1) / c.stride[0] + 1;
    let ow = (wd + 2 * c.pad[1] - c.dil[1] * (c.k[1] - 1) - 1) / c.stride[1] + 1;
    let mut out = vec![0.0; n * c.o * oh * ow];
    for ni in 0..n {
        for o in 0..c.o {
            let g = o / og;
            for y in 0..oh {
                for xo in 0..ow {
                    let mut acc = b.map_or(0.0, |b| b[o]);
                    for ci in 0..cg {
                        let cin = g * cg + ci;
                        for i in 0..c.k[0] {
                            for j in 0..c.k[1] {
                                let ih =
                                    (y * c.stride[0] + i * c.dil[0]) as isize - c.pad[0] as isize;
                                let iw =
                                    (xo * c.stride[1] + j * c.dil[1]) as isize - c.pad[1] as isize;
                                if ih < 0 || iw < 0 || ih >= h as isize || iw >= wd as isize {
                                    continue;
                                }
                                let xv = x[((ni * ch + cin) * h + ih as usize) * wd + iw as usize];
                                let wv = w[((o * cg + ci) * c.k[0] + i) * c.k[1] + j];
                                acc += xv * wv;
                            }
                        }
                    }
                    out[((ni * c.o + o) * oh + y) * ow + xo] = acc;
                }
            }
        }
    }
    (out, [oh, ow])
}

fn conv_cases() -> Vec<ConvCase> {
    let base = ConvCase {
        x: [2, 3, 7, 6],
        o: 4,
        k: [3, 3],
        stride: [1, 1],
        pad: [0, 0],
        dil: [1, 1],
        groups: 1,
        bias: true,
    };
    vec![
        base,
        ConvCase {
            stride: [2, 2],
            pad: [1, 1],
            ..base
        },
        ConvCase {
            dil: [2, 2],
            pad: [2, 2],
            bias: false,
            ..base
        },
        ConvCase {
            x: [2, 4, 6, 5],
            o: 6,
            groups: 2,
            bias: false,
            ..base
        },
        ConvCase {
            x: [3, 3, 5, 5],
            o: 3,
            groups: 3,
            pad: [1, 1],
            ..base
        },
        ConvCase { k: [1, 1], ..base },
        ConvCase {
            k: [1, 1],
            bias: false,
            x: [3, 4, 3, 5],
            o: 2,
            groups: 2,
            ..base
        },
        ConvCase {
            k: [1, 1],
            stride: [2, 2],
            ..base
        },
        ConvCase {
            k: [2, 3],
            stride: [2, 1],
            pad: [1, 0],
            dil: [1, 2],
            ..base
        },
        ConvCase {
            k: [5, 4],
            pad: [1, 0],
            ..base
        }, // the kernel fills the padded height
        // Batches of 4 samples in one gemm, and a remainder of 2.
        ConvCase {
            x: [6, 2, 5, 5],
            o: 3,
            pad: [1, 1],
            ..base
        },
        ConvCase {
            x: [1, 2, 9, 9],
            k: [3, 3],
            stride: [3, 2],
            pad: [1, 1],
            ..base
        },
        // Unit stride, rows wider than one 16-lane vector (runs of 16 and a remainder).
        ConvCase {
            x: [2, 2, 5, 37],
            k: [3, 5],
            pad: [1, 2],
            ..base
        },
        ConvCase {
            x: [2, 1, 28, 28],
            o: 3,
            k: [5, 5],
            pad: [2, 2],
            ..base
        },
        // Padding wider than the kernel: whole output rows and columns see only padding.
        ConvCase {
            x: [1, 2, 4, 18],
            o: 2,
            k: [2, 2],
            pad: [3, 3],
            ..base
        },
    ]
}

fn run_conv(c: &ConvCase, x: &[f64], w: &[f64], b: &[f64], g: &[f64], ws_slots: Option<usize>) {
    let wshape = [c.o, c.x[1] / c.groups, c.k[0], c.k[1]];
    let spec = Conv2dSpec::new(
        &c.x,
        &wshape,
        c.bias.then_some(&[c.o][..]),
        c.stride,
        c.pad,
        c.dil,
        c.groups,
    )
    .unwrap();
    let bias = c.bias.then_some(b);
    let (want, [oh, ow]) = conv_ref(c, x, w, bias);
    assert_eq!(spec.out_shape(), [c.x[0], c.o, oh, ow], "{c:?}");
    // Neither the workspace's nor the outputs' contents matter (the host reuses workspace
    // between ops and does not zero fresh outputs): both start as NaN.
    let mut ws = vec![f32::NAN; spec.workspace_elems()];
    if let Some(slots) = ws_slots {
        ws.truncate(slots_len(&spec, slots));
    }
    let (xf, wf, bf) = (f32s(x), f32s(w), f32s(b));
    let mut out = vec![f32::NAN; want.len()];
    conv2d_forward(
        &spec,
        &xf,
        &wf,
        c.bias.then_some(&bf[..]),
        &mut out,
        &mut ws,
    )
    .unwrap();
    assert_close(&format!("{c:?} out"), &out, &want, 1e-4);

    let mut dx = vec![f32::NAN; x.len()];
    let mut dw = vec![f32::NAN; w.len()];
    let mut db = vec![f32::NAN; c.o];
    conv2d_backward(
        &spec,
        &xf,
        &wf,
        &f32s(g),
        Some(&mut dx),
        Some(&mut dw),
        c.bias.then_some(&mut db[..]),
        &mut ws,
    )
    .unwrap();
    let f = |xs: &[Vec<f64>]| conv_ref(c, &xs[0], &xs[1], c.bias.then_some(&xs[2][..])).0;
    let grads = fd_grads(&f, &[x.to_vec(), w.to_vec(), b.to_vec()], g);
    assert_close(&format!("{c:?} d_input"), &dx, &grads[0], 1e-3);
    assert_close(&format!("{c:?} d_weight"), &dw, &grads[1], 1e-3);
    if c.bias {
        assert_close(&format!("{c:?} d_bias"), &db, &grads[2], 1e-3);
    }
}

/// Length of a workspace of `slots` slots: the spec's request inside a pool of that many
/// threads.
fn slots_len(spec: &Conv2dSpec, slots: usize) -> usize {
    in_pool(slots, || spec.workspace_elems())
}

fn in_pool<R: Send>(threads: usize, f: impl FnOnce() -> R + Send) -> R {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("a rayon pool")
        .install(f)
}

#[test]
fn conv2d_matches_the_reference_and_finite_differences() {
    for (i, c) in conv_cases().iter().enumerate() {
        let [n, ch, h, w] = c.x;
        let x = values(n * ch * h * w, 10 + i as u64, -1.0, 1.0);
        let wt = values(
            c.o * ch / c.groups * c.k[0] * c.k[1],
            20 + i as u64,
            -1.0,
            1.0,
        );
        let b = values(c.o, 30 + i as u64, -1.0, 1.0);
        let (out, _) = conv_ref(c, &x, &wt, None);
        let g = values(out.len(), 40 + i as u64, -1.0, 1.0);
        run_conv(c, &x, &wt, &b, &g, None);
        // One slot: every sample in one task, the same results.
        run_conv(c, &x, &wt, &b, &g, Some(1));
    }
}

#[test]
fn conv2d_only_some_gradients_and_empty_batches() {
    let c = conv_cases()[1];
    let spec = Conv2dSpec::new(&c.x, &[4, 3, 3, 3], Some(&[4]), c.stride, c.pad, c.dil, 1).unwrap();
    let x = f32s(&values(2 * 3 * 7 * 6, 1, -1.0, 1.0));
    let w = f32s(&values(4 * 27, 2, -1.0, 1.0));
    let g = f32s(&values(spec.out_shape().iter().product(), 3, -1.0, 1.0));
    let mut ws = vec![0.0; spec.workspace_elems()];
    let (mut dw_all, mut dw_only) = (vec![0.0; w.len()], vec![0.0; w.len()]);
    let mut dx = vec![0.0; x.len()];
    conv2d_backward(
        &spec,
        &x,
        &w,
        &g,
        Some(&mut dx),
        Some(&mut dw_all),
        None,
        &mut ws,
    )
    .unwrap();
    conv2d_backward(&spec, &x, &w, &g, None, Some(&mut dw_only), None, &mut ws).unwrap();
    assert_eq!(dw_all, dw_only);

    let spec = Conv2dSpec::new(
        &[0, 3, 7, 6],
        &[4, 3, 3, 3],
        Some(&[4]),
        [1, 1],
        [0, 0],
        [1, 1],
        1,
    )
    .unwrap();
    assert_eq!(spec.out_shape(), [0, 4, 5, 4]);
    let mut ws = vec![0.0; spec.workspace_elems()];
    conv2d_forward(&spec, &[], &w, Some(&[0.0; 4]), &mut [], &mut ws).unwrap();
    let mut dw = vec![f32::NAN; w.len()];
    let mut db = vec![f32::NAN; 4];
    conv2d_backward(
        &spec,
        &[],
        &w,
        &[],
        Some(&mut []),
        Some(&mut dw),
        Some(&mut db),
        &mut ws,
    )
    .unwrap();
    assert!(
        dw.iter().chain(&db).all(|&v| v == 0.0),
        "no samples, zero gradients"
    );
}

#[test]
fn conv2d_gradients_are_the_same_bits_for_any_thread_count() {
    let c = ConvCase {
        x: [37, 3, 6, 6],
        o: 4,
        k: [3, 3],
        stride: [1, 1],
        pad: [1, 1],
        dil: [1, 1],
        groups: 1,
        bias: true,
    };
    let spec = Conv2dSpec::new(&c.x, &[4, 3, 3, 3], Some(&[4]), c.stride, c.pad, c.dil, 1).unwrap();
    let x = f32s(&values(37 * 3 * 36, 5, -1.0, 1.0));
    let w = f32s(&values(4 * 27, 6, -1.0, 1.0));
    let g = f32s(&values(37 * 4 * 36, 7, -1.0, 1.0));
    let grads = |threads: usize| {
        in_pool(threads, || {
            let mut ws = vec![0.0; spec.workspace_elems()];
            let (mut dx, mut dw, mut db) = (vec![0.0; x.len()], vec![0.0; w.len()], vec![0.0; 4]);
            conv2d_backward(
                &spec,
                &x,
                &w,
                &g,
                Some(&mut dx),
                Some(&mut dw),
                Some(&mut db),
                &mut ws,
            )
            .unwrap();
            (dx, dw, db)
        })
    };
    let one = grads(1);
    for threads in [2, 3, 5] {
        assert_eq!(grads(threads), one, "{threads} threads");
    }
}

#[test]
fn conv2d_bad_arguments_are_errors() {
    let ok = |x: &[usize], w: &[usize], b: Option<&[usize]>, s, p, d, g| {
        Conv2dSpec::new(x, w, b, s, p, d, g)
    };
    let x = [2, 4, 5, 5];
    assert!(ok(&x, &[3, 4, 3, 3], None, [1, 1], [0, 0], [1, 1], 1).is_ok());
    for (why, r) in [
        (
            "stride 0",
            ok(&x, &[3, 4, 3, 3], None, [0, 1], [0, 0], [1, 1], 1),
        ),
        (
            "dilation 0",
            ok(&x, &[3, 4, 3, 3], None, [1, 1], [0, 0], [1, 0], 1),
        ),
        (
            "kernel too big",
            ok(&x, &[3, 4, 6, 3], None, [1, 1], [0, 0], [1, 1], 1),
        ),
        (
            "dilated kernel too big",
            ok(&x, &[3, 4, 3, 3], None, [1, 1], [0, 0], [3, 1], 1),
        ),
        (
            "groups 0",
            ok(&x, &[3, 4, 3, 3], None, [1, 1], [0, 0], [1, 1], 0),
        ),
        (
            "groups vs C",
            ok(&x, &[3, 4, 3, 3], None, [1, 1], [0, 0], [1, 1], 3),
        ),
        (
            "groups vs O",
            ok(&x, &[3, 2, 3, 3], None, [1, 1], [0, 0], [1, 1], 2),
        ),
        (
            "weight channels",
            ok(&x, &[3, 3, 3, 3], None, [1, 1], [0, 0], [1, 1], 1),
        ),
        (
            "weight rank",
            ok(&x, &[3, 4, 3], None, [1, 1], [0, 0], [1, 1], 1),
        ),
        (
            "input rank",
            ok(&[4, 5, 5], &[3, 4, 3, 3], None, [1, 1], [0, 0], [1, 1], 1),
        ),
        (
            "no input channels",
            ok(
                &[2, 0, 5, 5],
                &[3, 0, 3, 3],
                None,
                [1, 1],
                [0, 0],
                [1, 1],
                1,
            ),
        ),
        (
            "no output channels",
            ok(&x, &[0, 4, 3, 3], None, [1, 1], [0, 0], [1, 1], 1),
        ),
        (
            "empty kernel",
            ok(&x, &[3, 4, 0, 3], None, [1, 1], [0, 0], [1, 1], 1),
        ),
        (
            "bias shape",
            ok(&x, &[3, 4, 3, 3], Some(&[4]), [1, 1], [0, 0], [1, 1], 1),
        ),
        (
            "padding overflow",
            ok(&x, &[3, 4, 3, 3], None, [1, 1], [usize::MAX, 0], [1, 1], 1),
        ),
        (
            "huge output",
            ok(
                &x,
                &[3, 4, 3, 3],
                None,
                [1, 1],
                [1 << 40, 1 << 40],
                [1, 1],
                1,
            ),
        ),
    ] {
        assert!(r.is_err(), "{why}: {r:?}");
    }
    let spec = ok(&x, &[3, 4, 3, 3], Some(&[3]), [1, 1], [0, 0], [1, 1], 1).unwrap();
    let (xs, w) = (vec![0.0; 200], vec![0.0; 108]);
    let mut out = vec![0.0; 2 * 3 * 9];
    let mut ws = vec![0.0; spec.workspace_elems()];
    let b = [0.0; 3];
    assert!(conv2d_forward(&spec, &xs[..199], &w, Some(&b), &mut out, &mut ws).is_err());
    assert!(conv2d_forward(&spec, &xs, &w[..107], Some(&b), &mut out, &mut ws).is_err());
    assert!(
        conv2d_forward(&spec, &xs, &w, None, &mut out, &mut ws).is_err(),
        "bias missing"
    );
    assert!(conv2d_forward(&spec, &xs, &w, Some(&b), &mut out[1..], &mut ws).is_err());
    assert!(
        conv2d_forward(&spec, &xs, &w, Some(&b), &mut out, &mut []).is_err(),
        "no workspace"
    );
    let mut dw = vec![0.0; 107];
    assert!(conv2d_backward(&spec, &xs, &w, &out, None, Some(&mut dw), None, &mut ws).is_err());
}

// ---------------------------------------------------------------------------------------------
// pooling

pub(crate) fn pool_ref(
    x: &[f64],
    shape: [usize; 4],
    k: [usize; 2],
    s: [usize; 2],
    p: [usize; 2],
    max: bool,
) -> Vec<f64> {
    let [n, c, h, w] = shape;
    let oh = (h + 2 * p[0] - k[0]) / s[0] + 1;
    let ow = (w + 2 * p[1] - k[1]) / s[1] + 1;
    let mut out = Vec::new();
    for plane in 0..n * c {
        for y in 0..oh {
            for xo in 0..ow {
                let mut best = f64::NEG_INFINITY;
                let mut sum = 0.0;
                for i in 0..k[0] {
                    for j in 0..k[1] {
                        let ih = (y * s[0] + i) as isize - p[0] as isize;
                        let iw = (xo * s[1] + j) as isize - p[1] as isize;
                        if ih < 0 || iw < 0 || ih >= h as isize || iw >= w as isize {
                            continue;
                        }
                        let v = x[plane * h * w + ih as usize * w + iw as usize];
                        best = best.max(v);
                        sum += v;
                    }
                }
                out.push(if max {
                    best
                } else {
                    sum / (k[0] * k[1]) as f64
                });
            }
        }
    }
    out
}

#[test]
fn pooling_matches_the_reference_and_finite_differences() {
    type PoolCase = ([usize; 4], [usize; 2], [usize; 2], [usize; 2]);
    let cases: [PoolCase; 9] = [
        ([2, 3, 6, 6], [2, 2], [2, 2], [0, 0]),
        ([1, 2, 7, 5], [2, 2], [2, 2], [0, 0]), // the last row and column fall outside
        ([2, 1, 4, 23], [2, 2], [2, 2], [0, 0]), // runs of 8 outputs, the last overlapping
        ([1, 2, 6, 8], [2, 3], [2, 3], [0, 0]),
        ([2, 2, 7, 5], [3, 3], [2, 2], [1, 1]),
        ([1, 3, 6, 7], [3, 2], [1, 2], [1, 1]),
        ([2, 1, 5, 5], [3, 3], [1, 1], [0, 0]),
        ([1, 2, 4, 9], [1, 4], [1, 3], [0, 2]),
        ([1, 1, 3, 3], [3, 3], [1, 1], [1, 1]),
    ];
    for (i, &(shape, k, s, p)) in cases.iter().enumerate() {
        let spec = Pool2dSpec::new(&shape, k, s, p).unwrap();
        let x = values(shape.iter().product(), 50 + i as u64, -1.0, 1.0);
        let xf = f32s(&x);
        for max in [true, false] {
            let want = pool_ref(&x, shape, k, s, p, max);
            assert_eq!(spec.out_numel(), want.len());
            let g = values(want.len(), 60 + i as u64, -1.0, 1.0);
            let mut out = vec![f32::NAN; want.len()];
            let mut dx = vec![f32::NAN; x.len()];
            if max {
                let mut idx = vec![0; want.len()];
                max_pool2d_forward(&spec, &xf, &mut out, &mut idx).unwrap();
                max_pool2d_backward(&spec, &f32s(&g), &idx, &mut dx).unwrap();
            } else {
                avg_pool2d_forward(&spec, &xf, &mut out).unwrap();
                avg_pool2d_backward(&spec, &f32s(&g), &mut dx).unwrap();
            }
            let what = format!("{shape:?} k{k:?} s{s:?} p{p:?} max={max}");
            assert_close(&format!("{what} out"), &out, &want, 1e-6);
            let f = |xs: &[Vec<f64>]| pool_ref(&xs[0], shape, k, s, p, max);
            let grads = fd_grads(&f, std::slice::from_ref(&x), &g);
            assert_close(&format!("{what} d_input"), &dx, &grads[0], 1e-4);
        }
    }
}

#[test]
fn max_pooling_takes_the_first_maximum_and_propagates_nan() {
    let spec = Pool2dSpec::new(&[1, 1, 2, 4], [2, 2], [2, 2], [0, 0]).unwrap();
    let x = [1.0, 3.0, 0.0, f32::NAN, 3.0, 3.0, 5.0, 1.0];
    let (mut out, mut idx) = ([0.0; 2], [0u32; 2]);
    max_pool2d_forward(&spec, &x, &mut out, &mut idx).unwrap();
    assert_eq!(out[0], 3.0);
    assert_eq!(idx[0], 1, "first of the tied maxima");
    assert!(out[1].is_nan());
    assert_eq!(idx[1], 3);
    let mut dx = [9.0; 8];
    max_pool2d_backward(&spec, &[1.0, 2.0], &idx, &mut dx).unwrap();
    assert_eq!(dx, [0.0, 1.0, 0.0, 2.0, 0.0, 0.0, 0.0, 0.0]);
    assert!(
        max_pool2d_backward(&spec, &[1.0, 2.0], &[0, 8], &mut dx).is_err(),
        "bad index"
    );
    // 2x2 windows of stride 2 and other unpadded windows keep the same rules: a NaN first in
    // its window stays, the last of two NaNs wins, a window of -inf points at its first element.
    let (inf, nan) = (f32::NEG_INFINITY, f32::NAN);
    let x = [nan, 7.0, nan, 4.0, inf, inf, 2.0, 5.0, nan, 8.0, inf, inf];
    let cases: [([usize; 2], &[u32], &[f32]); 2] = [
        ([2, 2], &[0, 8, 4], &[nan, nan, inf]),
        ([2, 3], &[8, 9], &[nan, 8.0]),
    ];
    for (k, want_idx, want) in cases {
        let spec = Pool2dSpec::new(&[1, 1, 2, 6], k, k, [0, 0]).unwrap();
        let mut out = vec![0.0; spec.out_numel()];
        let mut idx = vec![0u32; spec.out_numel()];
        max_pool2d_forward(&spec, &x, &mut out, &mut idx).unwrap();
        assert_eq!(idx, want_idx, "kernel {k:?}");
        let same = out
            .iter()
            .zip(want)
            .all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same, "kernel {k:?}: {out:?}, want {want:?}");
    }
}

/// Max pooling's rule, written out: the first maximum of each window in row-major order, a
/// NaN winning (the last one, if several); the index within the plane.
fn max_pool_rule(x: &[f32], shape: [usize; 4], k: [usize; 2], s: [usize; 2]) -> Vec<(u32, u32)> {
    let [n, c, h, w] = shape;
    let (oh, ow) = ((h - k[0]) / s[0] + 1, (w - k[1]) / s[1] + 1);
    let mut out = Vec::new();
    for p in 0..n * c {
        for y in 0..oh {
            for z in 0..ow {
                let first = y * s[0] * w + z * s[1];
                let (mut best, mut at) = (f32::NEG_INFINITY, first);
                for i in 0..k[0] {
                    for j in 0..k[1] {
                        let v = x[p * h * w + first + i * w + j];
                        if v > best || v.is_nan() {
                            (best, at) = (v, first + i * w + j);
                        }
                    }
                }
                out.push((best.to_bits(), at as u32));
            }
        }
    }
    out
}

#[test]
fn max_pooling_keeps_its_rule_on_ties_nans_and_signed_zeros() {
    // Few distinct values, so ties are common, with NaNs, -inf and both zeros among them; wide
    // rows, so whole runs of outputs and their overlapping last run are compared too.
    let levels = [-1.0, -0.0, 0.0, 0.5, 2.0, f32::NEG_INFINITY, f32::NAN];
    // [2, 2, 14, 15] pools to rows of 7, fewer than one run of 8 (the reference CNN's second
    // pooling).
    let shapes = [
        [2, 3, 6, 20],
        [1, 2, 5, 33],
        [1, 1, 4, 9],
        [3, 1, 2, 17],
        [2, 2, 14, 15],
    ];
    for (si, &shape) in shapes.iter().enumerate() {
        let pick = values(shape.iter().product(), 90 + si as u64, 0.0, 7.0);
        let x: Vec<f32> = pick.iter().map(|&v| levels[(v as usize).min(6)]).collect();
        for (k, s) in [([2, 2], [2, 2]), ([2, 3], [1, 2]), ([3, 3], [3, 3])] {
            if shape[2] < k[0] || shape[3] < k[1] {
                continue;
            }
            let spec = Pool2dSpec::new(&shape, k, s, [0, 0]).unwrap();
            let mut out = vec![0.0; spec.out_numel()];
            let mut idx = vec![0u32; spec.out_numel()];
            max_pool2d_forward(&spec, &x, &mut out, &mut idx).unwrap();
            let got: Vec<(u32, u32)> = out.iter().map(|v| v.to_bits()).zip(idx).collect();
            assert_eq!(
                got,
                max_pool_rule(&x, shape, k, s),
                "{shape:?} k{k:?} s{s:?}"
            );
        }
    }
}

#[test]
fn pooling_bad_arguments_and_empty_batches() {
    let x = [2, 3, 5, 5];
    for (why, r) in [
        ("kernel 0", Pool2dSpec::new(&x, [0, 2], [1, 1], [0, 0])),
        ("stride 0", Pool2dSpec::new(&x, [2, 2], [1, 0], [0, 0])),
        (
            "padding > kernel/2",
            Pool2dSpec::new(&x, [3, 3], [1, 1], [2, 0]),
        ),
        (
            "kernel > input",
            Pool2dSpec::new(&x, [6, 2], [1, 1], [0, 0]),
        ),
        ("rank", Pool2dSpec::new(&[3, 5, 5], [2, 2], [1, 1], [0, 0])),
        (
            "empty plane",
            Pool2dSpec::new(&[2, 3, 0, 5], [2, 2], [1, 1], [1, 1]),
        ),
        (
            "padding overflow",
            Pool2dSpec::new(&x, [usize::MAX, 2], [1, 1], [usize::MAX / 2, 0]),
        ),
    ] {
        assert!(r.is_err(), "{why}: {r:?}");
    }
    let spec = Pool2dSpec::new(&x, [2, 2], [2, 2], [0, 0]).unwrap();
    let mut out = vec![0.0; spec.out_numel()];
    assert!(avg_pool2d_forward(&spec, &[0.0; 149], &mut out).is_err());
    let mut idx = vec![0; spec.out_numel() - 1];
    assert!(max_pool2d_forward(&spec, &[0.0; 150], &mut out, &mut idx).is_err());

    let spec = Pool2dSpec::new(&[0, 3, 5, 5], [2, 2], [2, 2], [0, 0]).unwrap();
    assert_eq!(spec.out_shape(), [0, 3, 2, 2]);
    max_pool2d_forward(&spec, &[], &mut [], &mut []).unwrap();
    max_pool2d_backward(&spec, &[], &[], &mut []).unwrap();
    avg_pool2d_forward(&spec, &[], &mut []).unwrap();
    avg_pool2d_backward(&spec, &[], &mut []).unwrap();
}

// ---------------------------------------------------------------------------------------------
// layer norm

pub(crate) fn layer_norm_ref(
    x: &[f64],
    cols: usize,
    w: Option<&[f64]>,
    b: Option<&[f64]>,
    eps: f64,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let (mut y, mut means, mut rstds) = (Vec::new(), Vec::new(), Vec::new());
    for row in x.chunks(cols) {
        let mean = row.iter().sum::<f64>() / cols as f64;
        let var = row.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / cols as f64;
        let rstd = 1.0 / (var + eps).sqrt();
        for (j, v) in row.iter().enumerate() {
            y.push((v - mean) * rstd * w.map_or(1.0, |w| w[j]) + b.map_or(0.0, |b| b[j]));
        }
        means.push(mean);
        rstds.push(rstd);
    }
    (y, means, rstds)
}

#[test]
fn layer_norm_matches_the_reference_and_finite_differences() {
    type LnCase<'a> = (&'a [usize], &'a [usize], bool, bool, f32);
    let cases: [LnCase<'_>; 7] = [
        (&[3, 4, 5], &[5], true, true, 1e-5),
        (&[3, 4, 5], &[4, 5], true, true, 1e-5),
        (&[6, 5], &[5], true, false, 1e-5),
        (&[6, 5], &[5], false, true, 0.1),
        (&[2, 37], &[37], false, false, 1e-5),
        (&[70, 40], &[40], true, true, 1e-3),
        (&[9], &[9], true, true, 0.0),
    ];
    for (i, &(shape, norm, has_w, has_b, eps)) in cases.iter().enumerate() {
        let spec = LayerNormSpec::new(shape, norm, eps).unwrap();
        assert_eq!(spec.out_shape(), shape);
        let cols = spec.cols();
        let x = values(shape.iter().product(), 70 + i as u64, -2.0, 2.0);
        let w = values(cols, 71 + i as u64, 0.5, 1.5);
        let b = values(cols, 72 + i as u64, -1.0, 1.0);
        let (wo, bo) = (has_w.then_some(&w[..]), has_b.then_some(&b[..]));
        let (want, wmean, wrstd) = layer_norm_ref(&x, cols, wo, bo, eps as f64);
        let (xf, wf, bf) = (f32s(&x), f32s(&w), f32s(&b));
        let (wf, bf) = (has_w.then_some(&wf[..]), has_b.then_some(&bf[..]));
        let mut y = vec![0.0; x.len()];
        let (mut mean, mut rstd) = (vec![0.0; spec.rows()], vec![0.0; spec.rows()]);
        layer_norm_forward(&spec, &xf, wf, bf, &mut y, &mut mean, &mut rstd).unwrap();
        let what = format!("{shape:?} over {norm:?} w={has_w} b={has_b}");
        assert_close(&format!("{what} y"), &y, &want, 1e-5);
        assert_close(&format!("{what} mean"), &mean, &wmean, 1e-6);
        assert_close(&format!("{what} rstd"), &rstd, &wrstd, 1e-5);

        let g = values(x.len(), 73 + i as u64, -1.0, 1.0);
        let mut ws = vec![0.0; spec.workspace_elems()];
        let (mut dx, mut dw, mut db) = (vec![0.0; x.len()], vec![0.0; cols], vec![0.0; cols]);
        layer_norm_backward(
            &spec,
            &xf,
            wf,
            &mean,
            &rstd,
            &f32s(&g),
            Some(&mut dx),
            Some(&mut dw),
            Some(&mut db),
            &mut ws,
        )
        .unwrap();
        let f = |xs: &[Vec<f64>]| {
            layer_norm_ref(
                &xs[0],
                cols,
                has_w.then_some(&xs[1][..]),
                has_b.then_some(&xs[2][..]),
                eps as f64,
            )
            .0
        };
        let grads = fd_grads(&f, &[x.clone(), w.clone(), b.clone()], &g);
        assert_close(&format!("{what} dx"), &dx, &grads[0], 2e-3);
        // d_weight and d_bias are the gradients the affine parameters would have.
        let f_affine =
            |xs: &[Vec<f64>]| layer_norm_ref(&x, cols, Some(&xs[0]), Some(&xs[1]), eps as f64).0;
        let affine = fd_grads(&f_affine, &[w.clone(), b.clone()], &g);
        assert_close(&format!("{what} dw"), &dw, &affine[0], 2e-3);
        assert_close(&format!("{what} db"), &db, &affine[1], 2e-3);
    }
}

#[test]
fn layer_norm_gradients_are_the_same_bits_for_any_thread_count() {
    let (rows, cols) = (1000, 40); // big enough for the parallel path
    let spec = LayerNormSpec::new(&[rows, cols], &[cols], 1e-5).unwrap();
    let x = f32s(&values(rows * cols, 90, -2.0, 2.0));
    let w = f32s(&values(cols, 91, 0.5, 1.5));
    let dy = f32s(&values(rows * cols, 92, -1.0, 1.0));
    let grads = |threads: usize| {
        in_pool(threads, || {
            let (mut y, mut mean, mut rstd) =
                (vec![0.0; x.len()], vec![0.0; rows], vec![0.0; rows]);
            layer_norm_forward(&spec, &x, Some(&w), None, &mut y, &mut mean, &mut rstd).unwrap();
            let mut ws = vec![0.0; spec.workspace_elems()];
            let (mut dx, mut dw, mut db) = (vec![0.0; x.len()], vec![0.0; cols], vec![0.0; cols]);
            layer_norm_backward(
                &spec,
                &x,
                Some(&w),
                &mean,
                &rstd,
                &dy,
                Some(&mut dx),
                Some(&mut dw),
                Some(&mut db),
                &mut ws,
            )
            .unwrap();
            (y, dx, dw, db)
        })
    };
    let one = grads(1);
    for threads in [2, 3] {
        assert_eq!(grads(threads), one, "{threads} threads");
    }
}

#[test]
fn layer_norm_bad_arguments_and_empty_batches() {
    for (why, r) in [
        ("not the last dims", LayerNormSpec::new(&[3, 4], &[3], 1e-5)),
        (
            "empty normalized shape",
            LayerNormSpec::new(&[3, 4], &[], 1e-5),
        ),
        (
            "longer than the input",
            LayerNormSpec::new(&[4], &[1, 4], 1e-5),
        ),
        ("negative eps", LayerNormSpec::new(&[3, 4], &[4], -1.0)),
        ("NaN eps", LayerNormSpec::new(&[3, 4], &[4], f32::NAN)),
    ] {
        assert!(r.is_err(), "{why}: {r:?}");
    }
    let spec = LayerNormSpec::new(&[3, 4], &[4], 1e-5).unwrap();
    let (mut y, mut m, mut r) = (vec![0.0; 12], vec![0.0; 3], vec![0.0; 3]);
    assert!(
        layer_norm_forward(
            &spec,
            &[0.0; 12],
            Some(&[1.0; 3]),
            None,
            &mut y,
            &mut m,
            &mut r
        )
        .is_err()
    );
    assert!(layer_norm_forward(&spec, &[0.0; 11], None, None, &mut y, &mut m, &mut r).is_err());
    assert!(
        layer_norm_forward(&spec, &[0.0; 12], None, None, &mut y, &mut m[..2], &mut r).is_err()
    );
    let mut dx = vec![0.0; 12];
    assert!(
        layer_norm_backward(
            &spec,
            &[0.0; 12],
            None,
            &m,
            &r,
            &y,
            Some(&mut dx),
            None,
            None,
            &mut []
        )
        .is_err(),
        "no workspace"
    );

    let spec = LayerNormSpec::new(&[0, 4], &[4], 1e-5).unwrap();
    layer_norm_forward(&spec, &[], None, None, &mut [], &mut [], &mut []).unwrap();
    let mut ws = vec![0.0; spec.workspace_elems()];
    let (mut dw, mut db) = ([f32::NAN; 4], [f32::NAN; 4]);
    layer_norm_backward(
        &spec,
        &[],
        None,
        &[],
        &[],
        &[],
        Some(&mut []),
        Some(&mut dw),
        Some(&mut db),
        &mut ws,
    )
    .unwrap();
    assert!(dw.iter().chain(&db).all(|&v| v == 0.0));
}

// ---------------------------------------------------------------------------------------------
// batch norm

/// Batch norm of `[N, C, S]` with the given (or the batch's) statistics: (y, mean, biased var).
pub(crate) fn batch_norm_ref(
    x: &[f64],
    [n, c, s]: [usize; 3],
    stats: Option<(&[f64], &[f64])>,
    w: Option<&[f64]>,
    b: Option<&[f64]>,
    eps: f64,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let at = |ni: usize, ch: usize, i: usize| x[(ni * c + ch) * s + i];
    let count = (n * s) as f64;
    let mut means = Vec::new();
    let mut vars = Vec::new();
    for ch in 0..c {
        let (mean, var) = match stats {
            Some((m, v)) => (m[ch], v[ch]),
            None => {
                let vals: Vec<f64> = (0..n)
                    .flat_map(|ni| (0..s).map(move |i| (ni, i)))
                    .map(|(ni, i)| at(ni, ch, i))
                    .collect();
                let mean = vals.iter().sum::<f64>() / count;
                (
                    mean,
                    vals.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / count,
                )
            }
        };
        means.push(mean);
        vars.push(var);
    }
    let mut y = vec![0.0; x.len()];
    for ni in 0..n {
        for ch in 0..c {
            for i in 0..s {
                let xhat = (at(ni, ch, i) - means[ch]) / (vars[ch] + eps).sqrt();
                y[(ni * c + ch) * s + i] =
                    xhat * w.map_or(1.0, |w| w[ch]) + b.map_or(0.0, |b| b[ch]);
            }
        }
    }
    (y, means, vars)
}

#[test]
fn batch_norm_matches_the_reference_and_finite_differences() {
    let cases: [(&[usize], BatchNormMode, bool); 6] = [
        (&[4, 3], BatchNormMode::Train, true),
        (&[4, 3], BatchNormMode::Eval, true),
        (&[2, 3, 4, 5], BatchNormMode::Train, true),
        (&[2, 3, 4, 5], BatchNormMode::Train, false),
        (&[2, 3, 4, 5], BatchNormMode::Eval, false),
        (&[3, 2, 7], BatchNormMode::Eval, true),
    ];
    let eps = 1e-5;
    for (i, &(shape, mode, affine)) in cases.iter().enumerate() {
        let spec = BatchNormSpec::new(shape, mode, 0.1, eps as f32).unwrap();
        assert_eq!(spec.out_shape(), shape);
        let (n, c) = (shape[0], shape[1]);
        let s = shape[2..].iter().product::<usize>();
        let x = values(n * c * s, 80 + i as u64, -2.0, 2.0);
        let w = values(c, 81 + i as u64, 0.5, 1.5);
        let b = values(c, 82 + i as u64, -1.0, 1.0);
        let rm = values(c, 83 + i as u64, -0.5, 0.5);
        let rv = values(c, 84 + i as u64, 0.5, 2.0);
        let train = mode == BatchNormMode::Train;
        let stats = (!train).then_some((&rm[..], &rv[..]));
        let (wo, bo) = (affine.then_some(&w[..]), affine.then_some(&b[..]));
        let (want, mean, var) = batch_norm_ref(&x, [n, c, s], stats, wo, bo, eps);
        let (xf, wf, bf) = (f32s(&x), f32s(&w), f32s(&b));
        let (wf, bf) = (affine.then_some(&wf[..]), affine.then_some(&bf[..]));
        let (mut rmf, mut rvf) = (f32s(&rm), f32s(&rv));
        let mut y = vec![0.0; x.len()];
        let (mut sm, mut sr) = (vec![0.0; c], vec![0.0; c]);
        let running = RunningStats {
            mean: &mut rmf,
            var: &mut rvf,
        };
        batch_norm_forward(&spec, &xf, wf, bf, Some(running), &mut y, &mut sm, &mut sr).unwrap();
        let what = format!("{shape:?} {mode:?} affine={affine}");
        assert_close(&format!("{what} y"), &y, &want, 1e-5);
        assert_close(&format!("{what} mean"), &sm, &mean, 1e-6);
        let rstd: Vec<f64> = var.iter().map(|v| 1.0 / (v + eps).sqrt()).collect();
        assert_close(&format!("{what} rstd"), &sr, &rstd, 1e-5);
        if train {
            let unbias = (n * s) as f64 / (n * s - 1) as f64;
            let want_rm: Vec<f64> = rm
                .iter()
                .zip(&mean)
                .map(|(r, m)| 0.9 * r + 0.1 * m)
                .collect();
            let want_rv: Vec<f64> = rv
                .iter()
                .zip(&var)
                .map(|(r, v)| 0.9 * r + 0.1 * v * unbias)
                .collect();
            assert_close(&format!("{what} running mean"), &rmf, &want_rm, 1e-6);
            assert_close(&format!("{what} running var"), &rvf, &want_rv, 1e-6);
        } else {
            assert_eq!(
                (rmf, rvf),
                (f32s(&rm), f32s(&rv)),
                "eval leaves the running stats"
            );
        }

        let g = values(x.len(), 85 + i as u64, -1.0, 1.0);
        let mut ws = vec![0.0; spec.workspace_elems()];
        let (mut dx, mut dw, mut db) = (vec![0.0; x.len()], vec![0.0; c], vec![0.0; c]);
        batch_norm_backward(
            &spec,
            &xf,
            wf,
            &sm,
            &sr,
            &f32s(&g),
            Some(&mut dx),
            Some(&mut dw),
            Some(&mut db),
            &mut ws,
        )
        .unwrap();
        let f = |xs: &[Vec<f64>]| {
            batch_norm_ref(
                &xs[0],
                [n, c, s],
                stats,
                affine.then_some(&xs[1][..]),
                affine.then_some(&xs[2][..]),
                eps,
            )
            .0
        };
        let grads = fd_grads(&f, &[x.clone(), w.clone(), b.clone()], &g);
        assert_close(&format!("{what} dx"), &dx, &grads[0], 2e-3);
        let f_affine = |xs: &[Vec<f64>]| {
            batch_norm_ref(&x, [n, c, s], stats, Some(&xs[0]), Some(&xs[1]), eps).0
        };
        let affine_grads = fd_grads(&f_affine, &[w.clone(), b.clone()], &g);
        assert_close(&format!("{what} dw"), &dw, &affine_grads[0], 2e-3);
        assert_close(&format!("{what} db"), &db, &affine_grads[1], 2e-3);
    }
}

#[test]
fn batch_norm_bad_arguments_and_empty_batches() {
    let train = BatchNormMode::Train;
    for (why, r) in [
        ("rank 1", BatchNormSpec::new(&[4], train, 0.1, 1e-5)),
        (
            "one value per channel",
            BatchNormSpec::new(&[1, 3], train, 0.1, 1e-5),
        ),
        (
            "one value per channel, spatial",
            BatchNormSpec::new(&[1, 3, 1, 1], train, 0.1, 1e-5),
        ),
        (
            "NaN momentum",
            BatchNormSpec::new(&[4, 3], train, f32::NAN, 1e-5),
        ),
        (
            "negative eps",
            BatchNormSpec::new(&[4, 3], train, 0.1, -1e-5),
        ),
    ] {
        assert!(r.is_err(), "{why}: {r:?}");
    }
    assert!(BatchNormSpec::new(&[1, 3], BatchNormMode::Eval, 0.1, 1e-5).is_ok());
    let spec = BatchNormSpec::new(&[2, 3], BatchNormMode::Eval, 0.1, 1e-5).unwrap();
    let (mut y, mut m, mut r) = (vec![0.0; 6], vec![0.0; 3], vec![0.0; 3]);
    assert!(
        batch_norm_forward(&spec, &[0.0; 6], None, None, None, &mut y, &mut m, &mut r).is_err(),
        "eval needs running stats"
    );
    let spec = BatchNormSpec::new(&[2, 3], train, 0.1, 1e-5).unwrap();
    assert!(
        batch_norm_forward(&spec, &[0.0; 5], None, None, None, &mut y, &mut m, &mut r).is_err()
    );
    assert!(
        batch_norm_forward(
            &spec,
            &[0.0; 6],
            Some(&[1.0; 2]),
            None,
            None,
            &mut y,
            &mut m,
            &mut r
        )
        .is_err()
    );

    let spec = BatchNormSpec::new(&[0, 3, 4], train, 0.1, 1e-5).unwrap();
    let (mut rm, mut rv) = ([0.5; 3], [2.0; 3]);
    let running = RunningStats {
        mean: &mut rm,
        var: &mut rv,
    };
    batch_norm_forward(
        &spec,
        &[],
        None,
        None,
        Some(running),
        &mut [],
        &mut m,
        &mut r,
    )
    .unwrap();
    assert_eq!(
        (rm, rv),
        ([0.5; 3], [2.0; 3]),
        "an empty batch leaves the running stats"
    );
    let mut ws = vec![0.0; spec.workspace_elems()];
    let (mut dw, mut db) = ([f32::NAN; 3], [f32::NAN; 3]);
    batch_norm_backward(
        &spec,
        &[],
        None,
        &m,
        &r,
        &[],
        Some(&mut []),
        Some(&mut dw),
        Some(&mut db),
        &mut ws,
    )
    .unwrap();
    assert!(dw.iter().chain(&db).all(|&v| v == 0.0));
}

// ---------------------------------------------------------------------------------------------
// attention

#[derive(Debug, Clone)]
pub(crate) struct AttnCase {
    pub(crate) b: usize,
    pub(crate) h: usize,
    pub(crate) t: usize,
    pub(crate) s: usize,
    pub(crate) d: usize,
    pub(crate) dv: usize,
    pub(crate) causal: bool,
    pub(crate) mask: Option<(MaskKind, Vec<usize>)>,
    pub(crate) scale: Option<f32>,
}

/// Softmax attention in f64; a row that sees no key outputs zeros.
pub(crate) fn attention_ref(
    c: &AttnCase,
    q: &[f64],
    k: &[f64],
    v: &[f64],
    mask: Option<&[f64]>,
) -> Vec<f64> {
    let scale = c.scale.map_or(1.0 / (c.d as f64).sqrt(), |s| s as f64);
    let mshape = c.mask.as_ref().map(|m| m.1.clone()).unwrap_or_default();
    let mask_at = |b: usize, h: usize, i: usize, j: usize| {
        let full = [b, h, i, j];
        let lead = 4 - mshape.len();
        let mut idx = 0;
        for (d, &dim) in mshape.iter().enumerate() {
            idx = idx * dim + if dim == 1 { 0 } else { full[lead + d] };
        }
        mask.map(|m| m[idx])
    };
    let mut out = vec![0.0; c.b * c.h * c.t * c.dv];
    for b in 0..c.b {
        for h in 0..c.h {
            let head = b * c.h + h;
            for i in 0..c.t {
                let mut scores = vec![f64::NEG_INFINITY; c.s];
                for (j, sc) in scores.iter_mut().enumerate() {
                    if c.causal && j > i {
                        continue;
                    }
                    let dot: f64 = (0..c.d)
                        .map(|e| q[(head * c.t + i) * c.d + e] * k[(head * c.s + j) * c.d + e])
                        .sum();
                    let mut val = dot * scale;
                    match (c.mask.as_ref().map(|m| m.0), mask_at(b, h, i, j)) {
                        (Some(MaskKind::Additive), Some(m)) => val += m,
                        (Some(MaskKind::Boolean), Some(0.0)) => val = f64::NEG_INFINITY,
                        _ => {}
                    }
                    *sc = val;
                }
                let top = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                if top == f64::NEG_INFINITY {
                    continue;
                }
                let e: Vec<f64> = scores.iter().map(|s| (s - top).exp()).collect();
                let total: f64 = e.iter().sum();
                for o in 0..c.dv {
                    let val: f64 = (0..c.s)
                        .map(|j| e[j] / total * v[(head * c.s + j) * c.dv + o])
                        .sum();
                    out[(head * c.t + i) * c.dv + o] = val;
                }
            }
        }
    }
    out
}

fn attn_cases() -> Vec<AttnCase> {
    let base = AttnCase {
        b: 2,
        h: 2,
        t: 5,
        s: 7,
        d: 3,
        dv: 4,
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
            t: 7,
            s: 5,
            causal: true,
            ..base.clone()
        },
        AttnCase {
            scale: Some(0.7),
            dv: 3,
            ..base.clone()
        },
        AttnCase {
            mask: Some((MaskKind::Additive, vec![5, 7])),
            ..base.clone()
        },
        AttnCase {
            mask: Some((MaskKind::Boolean, vec![5, 7])),
            causal: true,
            ..base.clone()
        },
        AttnCase {
            mask: Some((MaskKind::Additive, vec![2, 1, 5, 7])),
            ..base.clone()
        },
        AttnCase {
            mask: Some((MaskKind::Boolean, vec![1, 7])),
            ..base.clone()
        },
        AttnCase {
            b: 1,
            h: 1,
            t: 70,
            s: 67,
            d: 3,
            dv: 2,
            causal: true,
            mask: None,
            scale: None,
        },
        AttnCase {
            b: 1,
            h: 2,
            t: 66,
            s: 130,
            d: 2,
            dv: 3,
            causal: false,
            mask: Some((MaskKind::Additive, vec![66, 130])),
            scale: Some(0.5),
        },
    ]
}

fn mask_values(kind: MaskKind, len: usize, seed: u64) -> Vec<f64> {
    let raw = values(len, seed, 0.0, 1.0);
    match kind {
        MaskKind::Additive => raw
            .iter()
            .map(|&r| {
                if r < 0.2 {
                    f64::NEG_INFINITY
                } else {
                    r * 2.0 - 1.0
                }
            })
            .collect(),
        // Element 0 attends, so no row of a [1, S] mask is empty; others 70%.
        MaskKind::Boolean => raw
            .iter()
            .enumerate()
            .map(|(i, &r)| f64::from(i == 0 || r < 0.7))
            .collect(),
    }
}

#[test]
fn attention_matches_the_reference_and_finite_differences() {
    for (i, c) in attn_cases().iter().enumerate() {
        let seed = 100 + 10 * i as u64;
        let q = values(c.b * c.h * c.t * c.d, seed, -1.0, 1.0);
        let k = values(c.b * c.h * c.s * c.d, seed + 1, -1.0, 1.0);
        let v = values(c.b * c.h * c.s * c.dv, seed + 2, -1.0, 1.0);
        let mask = c
            .mask
            .as_ref()
            .map(|(kind, shape)| mask_values(*kind, shape.iter().product(), seed + 3));
        let spec = AttentionSpec::new(
            &[c.b, c.h, c.t, c.d],
            &[c.b, c.h, c.s, c.d],
            &[c.b, c.h, c.s, c.dv],
            c.causal,
            c.mask
                .as_ref()
                .map(|(kind, shape)| AttentionMask { kind: *kind, shape }),
            c.scale,
        )
        .unwrap();
        let want = attention_ref(c, &q, &k, &v, mask.as_deref());
        let (qf, kf, vf) = (f32s(&q), f32s(&k), f32s(&v));
        let maskf = mask.as_ref().map(|m| f32s(m));
        let mut ws = vec![0.0; spec.workspace_elems()];
        let mut out = vec![f32::NAN; want.len()];
        let mut lse = vec![f32::NAN; spec.lse_len()];
        attention_forward(
            &spec,
            &qf,
            &kf,
            &vf,
            maskf.as_deref(),
            &mut out,
            &mut lse,
            &mut ws,
        )
        .unwrap();
        assert_close(&format!("{c:?} out"), &out, &want, 1e-5);

        let g = values(want.len(), seed + 4, -1.0, 1.0);
        let (mut dq, mut dk, mut dv) = (
            vec![f32::NAN; q.len()],
            vec![f32::NAN; k.len()],
            vec![f32::NAN; v.len()],
        );
        attention_backward(
            &spec,
            &qf,
            &kf,
            &vf,
            maskf.as_deref(),
            &out,
            &lse,
            &f32s(&g),
            &mut dq,
            &mut dk,
            &mut dv,
            &mut ws,
        )
        .unwrap();
        let f = |xs: &[Vec<f64>]| attention_ref(c, &xs[0], &xs[1], &xs[2], mask.as_deref());
        let grads = fd_grads(&f, &[q.clone(), k.clone(), v.clone()], &g);
        assert_close(&format!("{c:?} dq"), &dq, &grads[0], 1e-3);
        assert_close(&format!("{c:?} dk"), &dk, &grads[1], 1e-3);
        assert_close(&format!("{c:?} dv"), &dv, &grads[2], 1e-3);
    }
}

#[test]
fn attention_rows_that_see_nothing_give_zeros() {
    // Row 1 of the boolean mask attends nowhere.
    let mask = [1.0, 0.0, 0.0, 0.0];
    let shape = [2, 2];
    let spec = AttentionSpec::new(
        &[1, 1, 2, 2],
        &[1, 1, 2, 2],
        &[1, 1, 2, 2],
        false,
        Some(AttentionMask {
            kind: MaskKind::Boolean,
            shape: &shape,
        }),
        None,
    )
    .unwrap();
    let x = [0.5, -1.0, 2.0, 0.25];
    let mut ws = vec![0.0; spec.workspace_elems()];
    let (mut out, mut lse) = ([f32::NAN; 4], [f32::NAN; 2]);
    attention_forward(&spec, &x, &x, &x, Some(&mask), &mut out, &mut lse, &mut ws).unwrap();
    assert_eq!(out, [0.5, -1.0, 0.0, 0.0]);
    assert_eq!(lse[1], f32::NEG_INFINITY);
    let (mut dq, mut dk, mut dv) = ([f32::NAN; 4], [f32::NAN; 4], [f32::NAN; 4]);
    attention_backward(
        &spec,
        &x,
        &x,
        &x,
        Some(&mask),
        &out,
        &lse,
        &[1.0; 4],
        &mut dq,
        &mut dk,
        &mut dv,
        &mut ws,
    )
    .unwrap();
    assert!(dq.iter().chain(&dk).chain(&dv).all(|v| v.is_finite()));
    assert_eq!(&dq[2..], &[0.0, 0.0]);
}

#[test]
fn attention_bad_arguments_and_empty_inputs() {
    let q = [2, 3, 5, 4];
    let new = |q: &[usize], k: &[usize], v: &[usize], mask: Option<AttentionMask<'_>>, scale| {
        AttentionSpec::new(q, k, v, false, mask, scale)
    };
    assert!(new(&q, &[2, 3, 6, 4], &[2, 3, 6, 7], None, None).is_ok());
    let bad_mask = [5, 5];
    let rank5 = [1, 1, 1, 5, 6];
    for (why, r) in [
        (
            "D differs",
            new(&q, &[2, 3, 6, 3], &[2, 3, 6, 4], None, None),
        ),
        (
            "S differs",
            new(&q, &[2, 3, 6, 4], &[2, 3, 5, 4], None, None),
        ),
        (
            "B differs",
            new(&q, &[1, 3, 6, 4], &[1, 3, 6, 4], None, None),
        ),
        (
            "H differs",
            new(&q, &[2, 3, 6, 4], &[2, 2, 6, 4], None, None),
        ),
        ("rank", new(&[3, 5, 4], &[3, 6, 4], &[3, 6, 4], None, None)),
        (
            "mask shape",
            new(
                &q,
                &[2, 3, 6, 4],
                &[2, 3, 6, 4],
                Some(AttentionMask {
                    kind: MaskKind::Additive,
                    shape: &bad_mask,
                }),
                None,
            ),
        ),
        (
            "mask rank",
            new(
                &q,
                &[2, 3, 6, 4],
                &[2, 3, 6, 4],
                Some(AttentionMask {
                    kind: MaskKind::Boolean,
                    shape: &rank5,
                }),
                None,
            ),
        ),
        (
            "NaN scale",
            new(&q, &[2, 3, 6, 4], &[2, 3, 6, 4], None, Some(f32::NAN)),
        ),
    ] {
        assert!(r.is_err(), "{why}: {r:?}");
    }
    let shape = [5, 6];
    let spec = new(
        &[1, 1, 5, 4],
        &[1, 1, 6, 4],
        &[1, 1, 6, 4],
        Some(AttentionMask {
            kind: MaskKind::Additive,
            shape: &shape,
        }),
        None,
    )
    .unwrap();
    let (q, k) = ([0.0; 20], [0.0; 24]);
    let mut ws = vec![0.0; spec.workspace_elems()];
    let (mut out, mut lse) = ([0.0; 20], [0.0; 5]);
    assert!(
        attention_forward(&spec, &q, &k, &k, None, &mut out, &mut lse, &mut ws).is_err(),
        "mask missing"
    );
    assert!(
        attention_forward(
            &spec,
            &q,
            &k,
            &k,
            Some(&[0.0; 29]),
            &mut out,
            &mut lse,
            &mut ws
        )
        .is_err()
    );
    assert!(
        attention_forward(
            &spec,
            &q,
            &k[..23],
            &k,
            Some(&[0.0; 30]),
            &mut out,
            &mut lse,
            &mut ws
        )
        .is_err()
    );
    assert!(
        attention_forward(
            &spec,
            &q,
            &k,
            &k,
            Some(&[0.0; 30]),
            &mut out,
            &mut lse,
            &mut []
        )
        .is_err(),
        "no workspace"
    );

    for (t, s) in [(0, 4), (4, 0)] {
        let spec = new(&[2, 1, t, 3], &[2, 1, s, 3], &[2, 1, s, 2], None, None).unwrap();
        let mut ws = vec![0.0; spec.workspace_elems()];
        let (q, k, v) = (vec![1.0; 6 * t], vec![1.0; 6 * s], vec![1.0; 4 * s]);
        let (mut out, mut lse) = (vec![f32::NAN; 4 * t], vec![f32::NAN; 2 * t]);
        attention_forward(&spec, &q, &k, &v, None, &mut out, &mut lse, &mut ws).unwrap();
        assert!(out.iter().all(|&o| o == 0.0), "no keys: zeros");
        let (mut dq, mut dk, mut dv) = (
            vec![f32::NAN; q.len()],
            vec![f32::NAN; k.len()],
            vec![f32::NAN; v.len()],
        );
        attention_backward(
            &spec, &q, &k, &v, None, &out, &lse, &out, &mut dq, &mut dk, &mut dv, &mut ws,
        )
        .unwrap();
        assert!(dq.iter().chain(&dk).chain(&dv).all(|&g| g == 0.0));
    }
    let spec = new(&[0, 2, 3, 3], &[0, 2, 3, 3], &[0, 2, 3, 3], None, None).unwrap();
    attention_forward(&spec, &[], &[], &[], None, &mut [], &mut [], &mut []).unwrap();
}
