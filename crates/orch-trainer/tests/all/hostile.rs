//! Hostile trainers: a loop, a panic, a forged handle, a dropped handle. Each ends the job
//! with an error naming the plugin and the step, every tensor freed.

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
