//! Data parallel: N replicas at global batch B reproduce one replica at B; model parallel: one
//! replica places layers on two devices.

use crate::common::*;
use orch_trainer::report::{Record, read_metrics};

#[test]
fn four_replicas_on_sim_gpus_match_one_replica_after_20_steps() {
    let train = "plugin = \"mlp\"\nepochs = 1\nbatch_size = 64\nseed = 3\n[train.config]\nhidden = \"48,24\"\nlr = 0.05\nmomentum = 0.9\nweight_decay = 0.0001";
    let stop = orch_trainer::RunOptions {
        stop_after: Some(20),
        ..options()
    };

    let one_dir = tempfile::tempdir().unwrap();
    let one = job(one_dir.path(), train);
    let summary = run(&one, &cpu(), &stop).unwrap();
    assert_eq!(
        (summary.steps, summary.stopped_early, summary.replicas),
        (20, true, 1)
    );

    let four_dir = tempfile::tempdir().unwrap();
    let four = job(four_dir.path(), train);
    let (devices, pools) = sims(4, 64 << 20);
    let summary = run(&four, &devices, &stop).unwrap();
    assert_eq!((summary.steps, summary.replicas), (20, 4));

    let diff = max_relative_difference(&final_params(&one), &final_params(&four));
    assert!(diff < 1e-4, "parameters differ by {diff} (relative)");
    // Losses are the same too (the replicas' shards weighted by size).
    let losses = |dir: &std::path::Path| -> Vec<f32> {
        read_metrics(&dir.join("runs/t/metrics.jsonl"))
            .into_iter()
            .filter_map(|r| match r {
                Record::Step { loss, .. } => Some(loss),
                Record::Epoch { .. } | Record::Eval { .. } => None,
            })
            .collect()
    };
    let (a, b) = (losses(one_dir.path()), losses(four_dir.path()));
    assert_eq!(a.len(), 20);
    for (x, y) in a.iter().zip(&b) {
        assert!(
            (x - y).abs() <= 1e-4 * x.abs().max(1.0),
            "losses {x} and {y}"
        );
    }
    for pool in pools {
        assert_eq!(pool.in_use(), 0, "every tensor of the run is freed");
        assert!(pool.peak() > 0, "every device was used");
    }
}

#[test]
fn one_replica_trains_a_model_split_over_two_sim_gpus() {
    let dir = tempfile::tempdir().unwrap();
    let job = job(
        dir.path(),
        &format!(
            "plugin = \"{}\"\nepochs = 2\nbatch_size = 64\nreplicas = 1\n[train.config]\nmode = \"model-parallel\"",
            fixture().display()
        ),
    );
    let (devices, pools) = sims(2, 64 << 20);
    let summary = run(&job, &devices, &options()).unwrap();
    assert_eq!(summary.replicas, 1);
    let records = read_metrics(&spec(&job).out.join("metrics.jsonl"));
    let scalar = |r: &Record, name: &str| match r {
        Record::Step { scalars, .. } => scalars.get(name).copied(),
        Record::Epoch { .. } | Record::Eval { .. } => None,
    };
    let first = records.first().expect("records");
    for name in ["in_use_0", "in_use_1"] {
        assert!(
            scalar(first, name).is_some_and(|b| b > 0.0),
            "{name}: {first:?}"
        );
    }
    assert_eq!(scalar(first, "logits_device"), Some(1.0));
    let epoch_losses: Vec<f64> = records
        .iter()
        .filter_map(|r| match r {
            Record::Epoch { train_loss, .. } => Some(*train_loss),
            Record::Step { .. } | Record::Eval { .. } => None,
        })
        .collect();
    assert_eq!(epoch_losses.len(), 2);
    assert!(
        epoch_losses[1] < epoch_losses[0],
        "it learns: {epoch_losses:?}"
    );
    assert!(pools.iter().all(|p| p.in_use() == 0 && p.peak() > 0));
}
