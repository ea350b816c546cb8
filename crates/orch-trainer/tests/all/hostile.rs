//! Hostile trainers: a loop, a panic, a forged handle, a dropped handle, a stack overflow. Each
//! ends the job with an error naming the plugin and the step, every tensor freed. What a
//! hostile trainer asks the host to keep or copy (graph nodes, a huge list) is refused as a
//! value.

use crate::common::*;
use orch_trainer::{Stage, TrainError};

/// Runs the fixture in `mode` on two sim GPUs (two replicas), returning the error.
fn hostile(mode: &str) -> TrainError {
    let dir = tempfile::tempdir().unwrap();
    let job = job(
        dir.path(),
        &format!(
            "plugin = \"{}\"\nepochs = 1\nbatch_size = 64\nstep_timeout = \"1s\"\n[train.config]\nmode = \"{mode}\"\nat = 3",
            fixture().display()
        ),
    );
    let (devices, pools) = sims(2, 64 << 20);
    let err = run(&job, &devices, &options()).unwrap_err();
    assert!(!err.is_bad_input(), "{err}");
    for pool in pools {
        assert_eq!(pool.in_use(), 0, "{mode}: tensors freed");
    }
    err
}

#[test]
fn an_endless_step_is_stopped_at_its_deadline() {
    let started = std::time::Instant::now();
    let err = hostile("spin");
    let text = err.to_string();
    assert!(
        matches!(
            err,
            TrainError::Timeout {
                stage: Stage::Step { step: 0, .. },
                ..
            }
        ),
        "{err:?}"
    );
    assert!(
        text.contains("trainer_fixture") && text.contains("step 1") && text.contains("1 s"),
        "{text}"
    );
    assert!(started.elapsed().as_secs() < 30, "stopped promptly");
}

#[test]
fn a_panic_names_the_step_and_keeps_the_message() {
    let err = hostile("trap");
    let text = err.to_string();
    assert!(
        matches!(
            err,
            TrainError::Crashed {
                stage: Stage::Step { step: 2, .. },
                ..
            }
        ),
        "{err:?}"
    );
    assert!(
        text.contains("deliberate panic at step 2") && text.contains("at step 3"),
        "{text}"
    );
}

#[test]
fn forged_and_dropped_handles_stop_the_plugin() {
    for mode in ["forge", "stale"] {
        let err = hostile(mode);
        assert!(
            matches!(
                err,
                TrainError::Crashed {
                    stage: Stage::Step { step: 0, .. },
                    ..
                }
            ),
            "{mode}: {err:?}"
        );
        assert!(err.to_string().contains("trainer_fixture"), "{err}");
    }
}

/// Runs the fixture in `mode` on the CPU, one step per epoch, returning the first step's
/// scalars.
fn probe(
    mode: &str,
    options: &orch_trainer::RunOptions,
) -> std::collections::BTreeMap<String, f64> {
    let dir = tempfile::tempdir().unwrap();
    let job = job(
        dir.path(),
        &format!(
            "plugin = \"{}\"\nepochs = 1\nbatch_size = 1797\nstep_timeout = \"60s\"\n[train.config]\nmode = \"{mode}\"\niters = \"5000\"",
            fixture().display()
        ),
    );
    run(&job, &cpu(), options).unwrap_or_else(|e| panic!("{mode}: {e}"));
    let records = orch_trainer::report::read_metrics(&spec(&job).out.join("metrics.jsonl"));
    match records.first() {
        Some(orch_trainer::report::Record::Step { scalars, .. }) => scalars.clone(),
        other => panic!("{mode}: a step record, got {other:?}"),
    }
}

#[test]
fn a_graph_past_the_node_bound_is_a_value_the_trainer_recovers_from() {
    let options = orch_trainer::RunOptions {
        max_graph_nodes: 1000,
        ..options()
    };
    let scalars = probe("graph", &options);
    assert_eq!(scalars.get("graph_cap"), Some(&1000.0), "{scalars:?}");
}

#[test]
fn a_list_larger_than_the_copy_limit_is_a_bad_argument() {
    let scalars = probe("big-list", &options());
    assert_eq!(scalars.get("big_list_refused"), Some(&1.0), "{scalars:?}");
}

#[test]
fn an_overflowed_shadow_stack_is_named() {
    let err = hostile("recurse");
    assert!(
        matches!(err, TrainError::Crashed { .. })
            && err.to_string().contains("overflows its own stack"),
        "{err}"
    );
}
