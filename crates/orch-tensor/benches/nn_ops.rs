//! Forward and forward+backward times of the nn kernels (`orch_tensor::nn_kernels`) at the
//! shapes `scripts/bench_nn_torch.py` times in PyTorch; `scripts/bench-nn.sh` runs both and
//! prints the ratios. Outputs, gradients and workspaces are allocated once and reused (the
//! kernels overwrite them; PyTorch's allocator hands back freed blocks without zeroing them, so
//! zero-filled fresh vectors per call would time a memset PyTorch does not do). `NN_BREAKDOWN=1` also times conv2d's two backward halves alone.
//! The `layer/` keys time the same layer ops through the `Tensor` API, forward and backward as a
//! trainer runs them (workspace and outputs reserved in a pool, the autograd node, the gradients),
//! so the glue around the kernels is timed too; `scripts/bench-nn.sh` leaves them out of its table.
//! Run: `cargo bench -p orch-tensor --bench nn_ops [-- THREADS]`.

#[path = "support/common.rs"]
mod common;

use orch_tensor::nn_kernels::*;
use std::time::Duration;

fn data(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s >> 8) as f32 / (1 << 24) as f32 * 2.0 - 1.0
        })
        .collect()
}

fn zeros(n: usize) -> Vec<f32> {
    vec![0.0; n]
}

/// Median milliseconds of `f`, printed and as a `kv` line.
fn time(key: &str, mut f: impl FnMut()) {
    let secs = common::median_secs(3, 20, Duration::from_millis(1500), &mut f, || {});
    common::kv(key, secs * 1e3);
    println!("{key:<24} {:>10.3} ms", secs * 1e3);
}

/// The two 5x5 convolutions (padding 2) of the reference CNN (`examples/cnn/cnn-small.toml`)
/// at batch 128: `nn/conv2d` is its second layer, 16 -> 32 channels on 14x14, `nn/conv2d_l1`
/// its first, 1 -> 16 on 28x28. `breakdown` also times the second layer's parts (`NN_BREAKDOWN`).
fn conv(name: &str, x_shape: [usize; 4], o: usize, breakdown: bool) -> orch_tensor::Result<()> {
    let w_shape = [o, x_shape[1], 5, 5];
    let spec = Conv2dSpec::new(&x_shape, &w_shape, Some(&[o]), [1, 1], [2, 2], [1, 1], 1)?;
    let numel = |s: &[usize]| s.iter().product::<usize>();
    let (x, w, b) = (
        data(numel(&x_shape), 1),
        data(numel(&w_shape), 2),
        data(o, 3),
    );
    let out_len: usize = spec.out_shape().iter().product();
    let g = data(out_len, 4);
    println!("{name} workspace: {} f32", spec.workspace_elems());
    let (mut out, mut ws) = (zeros(out_len), zeros(spec.workspace_elems()));
    let (mut dx, mut dw, mut db) = (zeros(x.len()), zeros(w.len()), zeros(o));
    let forward = |out: &mut [f32], ws: &mut [f32]| {
        conv2d_forward(&spec, &x, &w, Some(&b), out, ws).expect("conv2d");
    };
    time(&format!("nn/{name}/fwd"), || forward(&mut out, &mut ws));
    time(&format!("nn/{name}/fwdbwd"), || {
        forward(&mut out, &mut ws);
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
        .expect("conv2d backward");
    });
    if breakdown {
        // The same products without im2col: a 1x1 conv over 400 channels.
        let spec1 = Conv2dSpec::new(
            &[128, 400, 14, 14],
            &[32, 400, 1, 1],
            None,
            [1, 1],
            [0, 0],
            [1, 1],
            1,
        )?;
        let x1 = data(128 * 400 * 196, 13);
        let mut ws1 = zeros(spec1.workspace_elems());
        time("nn/conv2d/gemm_only_fwd", || {
            conv2d_forward(&spec1, &x1, &w, None, &mut out, &mut ws1).unwrap()
        });
        time("nn/conv2d/bwd_weight", || {
            conv2d_backward(&spec, &x, &w, &g, None, Some(&mut dw), None, &mut ws).unwrap()
        });
        time("nn/conv2d/bwd_input", || {
            conv2d_backward(&spec, &x, &w, &g, Some(&mut dx), None, None, &mut ws).unwrap()
        });
    }
    Ok(())
}

/// The reference CNN's first max pooling (2x2, stride 2) at batch 128: `[128, 16, 28, 28]`.
fn max_pool() -> orch_tensor::Result<()> {
    let spec = Pool2dSpec::new(&[128, 16, 28, 28], [2, 2], [2, 2], [0, 0])?;
    let x = data(128 * 16 * 28 * 28, 15);
    let g = data(spec.out_numel(), 16);
    let (mut out, mut idx, mut dx) = (zeros(spec.out_numel()), vec![0u32; g.len()], zeros(x.len()));
    time("nn/max_pool2d/fwd", || {
        max_pool2d_forward(&spec, &x, &mut out, &mut idx).expect("max_pool2d")
    });
    time("nn/max_pool2d/fwdbwd", || {
        max_pool2d_forward(&spec, &x, &mut out, &mut idx).expect("max_pool2d");
        max_pool2d_backward(&spec, &g, &idx, &mut dx).expect("max_pool2d backward");
    });
    Ok(())
}

fn attention() -> orch_tensor::Result<()> {
    let shape = [12, 4, 64, 32];
    let n: usize = shape.iter().product();
    let spec = AttentionSpec::new(&shape, &shape, &shape, true, None, None)?;
    let (q, k, v, g) = (data(n, 5), data(n, 6), data(n, 7), data(n, 8));
    println!("sdpa workspace: {} f32", spec.workspace_elems());
    let (mut out, mut lse) = (zeros(n), zeros(spec.lse_len()));
    let mut ws = zeros(spec.workspace_elems());
    let (mut dq, mut dk, mut dv) = (zeros(n), zeros(n), zeros(n));
    let forward = |out: &mut [f32], lse: &mut [f32], ws: &mut [f32]| {
        attention_forward(&spec, &q, &k, &v, None, out, lse, ws).expect("sdpa");
    };
    time("nn/sdpa_causal/fwd", || {
        forward(&mut out, &mut lse, &mut ws)
    });
    time("nn/sdpa_causal/fwdbwd", || {
        forward(&mut out, &mut lse, &mut ws);
        attention_backward(
            &spec, &q, &k, &v, None, &out, &lse, &g, &mut dq, &mut dk, &mut dv, &mut ws,
        )
        .expect("sdpa backward");
    });
    Ok(())
}

fn layer_norm() -> orch_tensor::Result<()> {
    let shape = [12, 64, 128];
    let n: usize = shape.iter().product();
    let spec = LayerNormSpec::new(&shape, &[128], 1e-5)?;
    let (x, w, b, g) = (data(n, 9), data(128, 10), data(128, 11), data(n, 12));
    let (mut y, mut mean, mut rstd) = (zeros(n), zeros(spec.rows()), zeros(spec.rows()));
    let (mut dx, mut dw, mut db) = (zeros(n), zeros(128), zeros(128));
    println!("layer_norm workspace: {} f32", spec.workspace_elems());
    let mut ws = zeros(spec.workspace_elems());
    let forward = |y: &mut [f32], mean: &mut [f32], rstd: &mut [f32]| {
        layer_norm_forward(&spec, &x, Some(&w), Some(&b), y, mean, rstd).expect("layer_norm");
    };
    time("nn/layer_norm/fwd", || {
        forward(&mut y, &mut mean, &mut rstd)
    });
    time("nn/layer_norm/fwdbwd", || {
        forward(&mut y, &mut mean, &mut rstd);
        layer_norm_backward(
            &spec,
            &x,
            Some(&w),
            &mean,
            &rstd,
            &g,
            Some(&mut dx),
            Some(&mut dw),
            Some(&mut db),
            &mut ws,
        )
        .expect("layer_norm backward");
    });
    Ok(())
}

/// `embedding` of `[12, 64]` indices into a 65x128 table through the `Tensor` API, as a trainer
/// calls it: the lookup, and the lookup with the table's gradient (scatter-add) by `backward`.
fn embedding() -> orch_tensor::Result<()> {
    use orch_tensor::{MemoryPool, Tensor};
    let pool = MemoryPool::cpu();
    let table = Tensor::from_vec(data(65 * 128, 13), &[65, 128], &pool)?.with_requires_grad();
    let ids: Vec<f32> = (0..12 * 64).map(|i| ((i * 7 + 3) % 65) as f32).collect();
    let indices = Tensor::from_vec(ids, &[12, 64], &pool)?;
    let g = Tensor::from_vec(data(12 * 64 * 128, 14), &[12, 64, 128], &pool)?;
    time("nn/embedding/fwd", || {
        orch_tensor::no_grad(|| table.embedding(&indices)).expect("embedding");
    });
    time("nn/embedding/fwdbwd", || {
        table.zero_grad();
        let out = table.embedding(&indices).expect("embedding");
        out.mul(&g)
            .and_then(|o| o.sum_all())
            .and_then(|l| l.backward())
            .expect("embedding backward");
    });
    Ok(())
}

/// `loss = sum(op(inputs) * g)` and its backward through the `Tensor` API, the inputs' gradients
/// cleared before each call.
fn tensor_fwdbwd(
    key: &str,
    inputs: &[&orch_tensor::Tensor],
    op: impl Fn() -> orch_tensor::Result<orch_tensor::Tensor>,
) -> orch_tensor::Result<()> {
    let out = op()?;
    let g = orch_tensor::Tensor::from_vec(data(out.numel(), 17), out.shape(), out.pool())?;
    time(key, || {
        inputs.iter().for_each(|t| t.zero_grad());
        op().and_then(|o| o.mul(&g))
            .and_then(|o| o.sum_all())
            .and_then(|l| l.backward())
            .expect("layer op forward and backward");
    });
    Ok(())
}

/// The layer ops above through the `Tensor` API (`layer/<op>/fwdbwd`), at the same shapes.
fn tensor_layers() -> orch_tensor::Result<()> {
    use orch_tensor::{MemoryPool, Tensor};
    let pool = MemoryPool::cpu();
    let param = |shape: &[usize], seed: u32| -> orch_tensor::Result<Tensor> {
        let n = shape.iter().product();
        Ok(Tensor::from_vec(data(n, seed), shape, &pool)?.with_requires_grad())
    };
    let x = param(&[128, 16, 14, 14], 1)?;
    let (w, b) = (param(&[32, 16, 5, 5], 2)?, param(&[32], 3)?);
    tensor_fwdbwd("layer/conv2d/fwdbwd", &[&x, &w, &b], || {
        x.conv2d(&w, Some(&b), [1, 1], [2, 2], [1, 1], 1)
    })?;
    let p = param(&[128, 16, 28, 28], 15)?;
    tensor_fwdbwd("layer/max_pool2d/fwdbwd", &[&p], || {
        p.max_pool2d([2, 2], [2, 2], [0, 0])
    })?;
    let (q, k, v) = (
        param(&[12, 4, 64, 32], 5)?,
        param(&[12, 4, 64, 32], 6)?,
        param(&[12, 4, 64, 32], 7)?,
    );
    tensor_fwdbwd("layer/sdpa_causal/fwdbwd", &[&q, &k, &v], || {
        Tensor::scaled_dot_product_attention(&q, &k, &v, true, None, None)
    })?;
    let h = param(&[12, 64, 128], 9)?;
    let (lw, lb) = (param(&[128], 10)?, param(&[128], 11)?);
    tensor_fwdbwd("layer/layer_norm/fwdbwd", &[&h, &lw, &lb], || {
        h.layer_norm(1, Some(&lw), Some(&lb), 1e-5)
    })?;
    let (bw, bb) = (param(&[16], 12)?, param(&[16], 13)?);
    let (rm, rv) = (Tensor::zeros(&[16], &pool)?, Tensor::ones(&[16], &pool)?);
    tensor_fwdbwd("layer/batch_norm/fwdbwd", &[&x, &bw, &bb], || {
        x.batch_norm(&rm, &rv, Some(&bw), Some(&bb), true, 0.1, 1e-5)
    })
}

fn main() -> orch_tensor::Result<()> {
    let threads = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    println!("nn kernels, {threads} threads: median ms per call");
    common::threads(threads).install(|| -> orch_tensor::Result<()> {
        let breakdown = std::env::var_os("NN_BREAKDOWN").is_some();
        conv("conv2d", [128, 16, 14, 14], 32, breakdown)?;
        conv("conv2d_l1", [128, 1, 28, 28], 16, false)?;
        max_pool()?;
        attention()?;
        layer_norm()?;
        embedding()?;
        tensor_layers()
    })
}
