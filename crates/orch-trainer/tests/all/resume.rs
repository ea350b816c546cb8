//! Checkpoints and `--resume`: a run interrupted and resumed ends where an uninterrupted run
//! ends.

use crate::common::*;
use orch_trainer::RunOptions;
use orch_trainer::report::{Record, read_metrics};

fn interrupted_then_resumed_equals_uninterrupted(optimizer: &str, replicas: usize) {
    let train = format!(
        "plugin = \"mlp\"\nepochs = 2\nbatch_size = 100\nseed = 11\ncheckpoint_every = 7\n[train.config]\nhidden = \"24\"\noptimizer = \"{optimizer}\"\nlr = 0.01\nlr_decay = 0.5"
    );
    let (devices, _pools) = sims(replicas, 64 << 20);

    let whole_dir = tempfile::tempdir().unwrap();
    let whole = job(whole_dir.path(), &train);
    let summary = run(&whole, &devices, &options()).unwrap();
    assert_eq!(summary.steps, 36);

    let split_dir = tempfile::tempdir().unwrap();
    let split = job(split_dir.path(), &train);
    // Interrupted mid-epoch, between two periodic checkpoints (7 and 14).
    let first = run(
        &split,
        &devices,
        &RunOptions {
            stop_after: Some(11),
            ..options()
        },
    )
    .unwrap();
    assert!(first.stopped_early);
    let second = run(
        &split,
        &devices,
        &RunOptions {
            resume: true,
            ..options()
        },
    )
    .unwrap();
    assert_eq!((second.steps, second.stopped_early), (36, false));

    let diff = max_relative_difference(&final_params(&whole), &final_params(&split));
    assert!(
        diff <= 1e-6,
        "{optimizer}: resumed run ends {diff} away from the uninterrupted one"
    );
    assert_eq!(second.eval_accuracy, summary.eval_accuracy);
    // The metrics file reads as one run: every step once.
    let steps: Vec<u64> = read_metrics(&spec(&split).out.join("metrics.jsonl"))
        .into_iter()
        .filter_map(|r| match r {
            Record::Step { step, .. } => Some(step),
            Record::Epoch { .. } | Record::Eval { .. } => None,
        })
        .collect();
    assert_eq!(steps, (1..=36).collect::<Vec<u64>>());
}

#[test]
fn resume_with_sgd_momentum() {
    interrupted_then_resumed_equals_uninterrupted("sgd", 1);
}

#[test]
fn resume_with_adam_on_two_replicas() {
    interrupted_then_resumed_equals_uninterrupted("adam", 2);
}

#[test]
fn resume_needs_a_matching_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let train = "plugin = \"mlp\"\nepochs = 1\nbatch_size = 100\n[train.config]\nhidden = \"8\"";
    let job1 = job(dir.path(), train);
    let err = run(
        &job1,
        &cpu(),
        &RunOptions {
            resume: true,
            ..options()
        },
    )
    .unwrap_err();
    assert!(
        err.is_bad_input() && err.to_string().contains("no checkpoint"),
        "{err}"
    );
    run(
        &job1,
        &cpu(),
        &RunOptions {
            stop_after: Some(3),
            ..options()
        },
    )
    .unwrap();
    let job2 = job(
        dir.path(),
        &train.replace("batch_size = 100", "batch_size = 50"),
    );
    let err = run(
        &job2,
        &cpu(),
        &RunOptions {
            resume: true,
            ..options()
        },
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("batch_size 100") && err.contains("50"),
        "{err}"
    );
    let job3 = job(
        dir.path(),
        &train.replace("hidden = \"8\"", "hidden = \"9\""),
    );
    let err = run(
        &job3,
        &cpu(),
        &RunOptions {
            resume: true,
            ..options()
        },
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("does not fit") && err.contains("shape"),
        "{err}"
    );
}

/// A stop request (what `orch run` sets on the job's warning signal or SIGTERM) that lands at any
/// moment stops both replicas at the same step with a checkpoint; resumed, the run ends where
/// an uninterrupted one does.
#[test]
fn a_stop_request_checkpoints_every_replica_at_one_step_and_resumes_to_the_same_parameters() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let train = "plugin = \"mlp\"\nepochs = 2\nbatch_size = 100\nseed = 5\n[train.config]\nhidden = \"24\"\noptimizer = \"adam\"\nlr = 0.01";
    let (devices, _pools) = sims(2, 64 << 20);

    let whole_dir = tempfile::tempdir().unwrap();
    let whole = job(whole_dir.path(), train);
    assert_eq!(run(&whole, &devices, &options()).unwrap().steps, 36);

    let split_dir = tempfile::tempdir().unwrap();
    let split = job(split_dir.path(), train);
    let flag = Arc::new(AtomicBool::new(false));
    let setter = Arc::clone(&flag);
    let first = run(
        &split,
        &devices,
        &RunOptions {
            stop_when: Some(Arc::clone(&flag)),
            // Set from the coordinator's thread as step 5's report arrives: the replicas are
            // somewhere in the steps after it.
            progress: Some(orch_trainer::ProgressSink::new(move |event| {
                if let orch_trainer::ProgressEvent::Step { step: 5, .. } = event {
                    setter.store(true, Ordering::Release);
                }
            })),
            ..options()
        },
    )
    .unwrap();
    assert!(first.stopped_early, "stopped on the request");
    assert!((5..36).contains(&first.steps), "{}", first.steps);
    let saved =
        orch_trainer::checkpoint::Checkpoint::load(&spec(&split).out.join("checkpoint")).unwrap();
    assert_eq!(
        saved.meta.step, first.steps,
        "the checkpoint is of the step it stopped at"
    );
    let second = run(
        &split,
        &devices,
        &RunOptions {
            resume: true,
            ..options()
        },
    )
    .unwrap();
    assert_eq!((second.steps, second.stopped_early), (36, false));
    let diff = max_relative_difference(&final_params(&whole), &final_params(&split));
    assert!(
        diff <= 1e-6,
        "the resumed run ends {diff} away from the uninterrupted one"
    );
}
