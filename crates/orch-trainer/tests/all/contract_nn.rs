//! Contract 0.3.0's layer ops through Wasm (the fixture's `nn-ops`, `nn-bad-args` and
//! `batch-norm` modes): the values orch-tensor computes natively on the same inputs, bad
//! arguments as values, and batch-norm's running statistics changed by `train-step` only.

use crate::common::*;
use orch_tensor::{MemoryPool, Tensor};
use orch_trainer::report::{Record, read_metrics};
use orch_trainer::{Stage, TrainError};
use std::collections::BTreeMap;
use std::sync::Arc;

fn fixture_job(dir: &std::path::Path, mode: &str) -> orch_core::JobSpec {
    job(
        dir,
        &format!(
            "plugin = \"{}\"\nepochs = 1\nbatch_size = 64\nseed = 5\nstep_timeout = \"60s\"\n[train.config]\nmode = \"{mode}\"\n",
            fixture().display()
        ),
    )
}

/// The fixture's `seq`: `((i * 7 + k) % 13) / 4 - 1.5`.
fn seq(n: usize, k: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * 7 + k) % 13) as f32 / 4.0 - 1.5)
        .collect()
}

fn input(pool: &Arc<MemoryPool>, shape: &[usize], k: usize) -> Tensor {
    Tensor::from_vec(seq(shape.iter().product(), k), shape, pool).unwrap()
}

/// The fixture's `digest`: the shape (`sum of d_j * 100^j`), the sum and the sum weighted by
/// `(i * 3) % 7 + 1`.
fn digest(shape: &[usize], values: &[f32]) -> [f64; 3] {
    let shape = shape
        .iter()
        .rev()
        .fold(0.0, |acc, &d| acc * 100.0 + d as f64);
    let sum = values.iter().map(|&v| f64::from(v)).sum();
    let weighted = values
        .iter()
        .enumerate()
        .map(|(i, &v)| f64::from(v) * ((i * 3) % 7 + 1) as f64)
        .sum();
    [shape, sum, weighted]
}

/// `case`'s output as the fixture reported it matches `want`: shape and sums.
fn assert_case(scalars: &BTreeMap<String, f64>, case: &str, want: &Tensor) {
    let values = want.to_vec().unwrap();
    let want = digest(want.shape(), &values);
    for (what, w) in ["shape", "sum", "weighted"].iter().zip(want) {
        let got = scalars
            .get(&format!("nn.{case}.{what}"))
            .unwrap_or_else(|| panic!("{case}: no {what} in {scalars:?}"));
        assert!(
            (got - w).abs() <= 1e-5 * w.abs().max(1.0),
            "{case} {what}: {got} through Wasm, {w} natively"
        );
    }
}

#[test]
fn the_layer_ops_through_wasm_match_orch_tensor_on_cpu_and_sim() {
    let stop = orch_trainer::RunOptions {
        stop_after: Some(1),
        ..options()
    };
    let p = MemoryPool::cpu();
    let x = input(&p, &[1, 2, 4, 4], 0);
    let w = input(&p, &[2, 1, 3, 3], 1);
    let b = input(&p, &[2], 2);
    let w2 = input(&p, &[3, 2, 2, 2], 3);
    let l = input(&p, &[2, 3, 4], 4);
    let (lw, lb) = (input(&p, &[4], 5), input(&p, &[4], 6));
    let bx = input(&p, &[3, 2, 2, 2], 7);
    let mean = Tensor::full(&[2], 0.0, &p).unwrap();
    let var = Tensor::full(&[2], 1.0, &p).unwrap();
    let (bw, bb) = (input(&p, &[2], 8), input(&p, &[2], 9));
    let q = input(&p, &[1, 2, 3, 4], 10);
    let k = input(&p, &[1, 2, 5, 4], 11);
    let v = input(&p, &[1, 2, 5, 3], 12);
    let mask = input(&p, &[3, 5], 0);
    let kc = input(&p, &[1, 2, 3, 4], 1);
    let vc = input(&p, &[1, 2, 3, 2], 2);
    let want = [
        (
            "conv2d",
            x.conv2d(&w, Some(&b), [1, 1], [1, 1], [1, 1], 2).unwrap(),
        ),
        (
            "conv2d_strided",
            x.conv2d(&w2, None, [2, 1], [0, 1], [1, 2], 1).unwrap(),
        ),
        ("max_pool2d", x.max_pool2d([2, 2], [2, 2], [0, 0]).unwrap()),
        ("avg_pool2d", x.avg_pool2d([3, 3], [1, 1], [1, 1]).unwrap()),
        (
            "layer_norm",
            l.layer_norm(1, Some(&lw), Some(&lb), 1e-5).unwrap(),
        ),
        ("layer_norm_2", l.layer_norm(2, None, None, 1e-3).unwrap()),
        (
            "batch_norm",
            bx.batch_norm(&mean, &var, Some(&bw), Some(&bb), true, 0.1, 1e-5)
                .unwrap(),
        ),
        ("batch_norm_mean", mean.clone()),
        ("batch_norm_var", var.clone()),
        (
            "sdpa_mask",
            Tensor::scaled_dot_product_attention(&q, &k, &v, false, Some(&mask), None).unwrap(),
        ),
        (
            "sdpa_causal",
            Tensor::scaled_dot_product_attention(&q, &kc, &vc, true, None, Some(0.7)).unwrap(),
        ),
    ];
    // The running statistics moved (the batch's are not 0 and 1).
    assert!(mean.to_vec().unwrap().iter().all(|m| *m != 0.0));
    for on_sim in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let job = fixture_job(dir.path(), "nn-ops");
        let devices = if on_sim { sims(1, 64 << 20).0 } else { cpu() };
        run(&job, &devices, &stop).unwrap_or_else(|e| panic!("sim {on_sim}: {e}"));
        let scalars = read_metrics(&spec(&job).out.join("metrics.jsonl"))
            .into_iter()
            .find_map(|r| match r {
                Record::Step { scalars, .. } => Some(scalars),
                Record::Epoch { .. } | Record::Eval { .. } => None,
            })
            .unwrap();
        for (case, want) in &want {
            assert_case(&scalars, case, want);
        }
    }
}

#[test]
fn bad_arguments_to_the_layer_ops_are_values() {
    let dir = tempfile::tempdir().unwrap();
    let job = fixture_job(dir.path(), "nn-bad-args");
    let (devices, pools) = sims(1, 64 << 20);
    let err = run(&job, &devices, &options()).unwrap_err();
    let TrainError::Failed {
        stage: Stage::Step { step: 0, .. },
        message,
        ..
    } = &err
    else {
        panic!("a failed step, got {err}");
    };
    assert!(
        message.starts_with("nn-bad-args refused 7 calls"),
        "{message}"
    );
    assert!(!message.contains("ACCEPTED"), "{message}");
    for case in [
        "conv2d stride 0",
        "conv2d groups not dividing the channels",
        "max-pool2d kernel larger than the padded input",
        "avg-pool2d stride 0",
        "layer-norm over more dimensions than x has",
        "batch-norm running stats of 3 for 2 channels",
        "attention of q, k, v shapes that disagree",
    ] {
        let bad = format!("{case}: TensorError::BadArgument(");
        let shape = format!("{case}: TensorError::ShapeMismatch(");
        assert!(
            message.contains(&bad) || message.contains(&shape),
            "{case} in {message}"
        );
    }
    for pool in pools {
        assert_eq!(pool.in_use(), 0, "tensors freed");
    }
}

#[test]
fn batch_norm_updates_its_buffers_in_train_step_and_not_in_eval_step() {
    let dir = tempfile::tempdir().unwrap();
    let job = fixture_job(dir.path(), "batch-norm");
    run(&job, &cpu(), &options()).unwrap();
    let records = read_metrics(&spec(&job).out.join("metrics.jsonl"));
    let steps = records
        .iter()
        .filter(|r| matches!(r, Record::Step { .. }))
        .count();
    let eval_loss = records
        .iter()
        .find_map(|r| match r {
            Record::Epoch { eval_loss, .. } => *eval_loss,
            Record::Step { .. } | Record::Eval { .. } => None,
        })
        .expect("an eval loss");
    assert!(steps > 1, "{steps} steps");
    // Natively: `steps` training calls on the same input, then one in eval.
    let p = MemoryPool::cpu();
    let x = input(&p, &[4, 2, 1, 1], 3);
    let mean = Tensor::full(&[2], 0.0, &p).unwrap();
    let var = Tensor::full(&[2], 1.0, &p).unwrap();
    for _ in 0..steps {
        x.batch_norm(&mean, &var, None, None, true, 0.1, 1e-5)
            .unwrap();
    }
    let eval = x
        .batch_norm(&mean, &var, None, None, false, 0.1, 1e-5)
        .unwrap();
    let eval_sum = f64::from(eval.sum(&[], false).unwrap().to_scalar().unwrap());
    assert!(
        (eval_loss - eval_sum).abs() < 1e-4,
        "eval loss {eval_loss}, natively {eval_sum}"
    );
    let checkpoint =
        orch_trainer::checkpoint::Checkpoint::load(&spec(&job).out.join("checkpoint")).unwrap();
    let buffer = |name: &str| {
        checkpoint
            .buffers
            .iter()
            .find(|b| b.name == name)
            .unwrap_or_else(|| panic!("buffer {name}"))
            .data
            .clone()
    };
    for (name, want) in [("bn.mean", &mean), ("bn.var", &var)] {
        let (got, want) = (buffer(name), want.to_vec().unwrap());
        assert!(
            got.iter().zip(&want).all(|(g, w)| (g - w).abs() < 1e-5),
            "{name}: {got:?}, natively {want:?}"
        );
    }
    assert!(
        buffer("bn.mean").iter().all(|m| *m != 0.0),
        "moved in train-step"
    );
}
