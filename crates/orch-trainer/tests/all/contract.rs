//! Contract 0.3.0 through Wasm: the new ops on the CPU and on simulated GPUs, bad arguments as
//! values, dropout masks that do not depend on the replicas or an interruption, buffers in
//! checkpoints, parameter groups, clipping, and `predict`.

use crate::common::*;
use orch_trainer::report::{Record, read_metrics};
use orch_trainer::{Stage, TrainError, TrainJob};

fn fixture_job(dir: &std::path::Path, mode: &str, extra: &str) -> orch_core::JobSpec {
    job(
        dir,
        &format!(
            "plugin = \"{}\"\nepochs = 1\nbatch_size = 64\nseed = 5\nstep_timeout = \"60s\"\n[train.config]\nmode = \"{mode}\"\n{extra}",
            fixture().display()
        ),
    )
}

/// The scalars of every step record of a run.
fn step_scalars(job: &orch_core::JobSpec) -> Vec<std::collections::BTreeMap<String, f64>> {
    read_metrics(&spec(job).out.join("metrics.jsonl"))
        .into_iter()
        .filter_map(|r| match r {
            Record::Step { scalars, .. } => Some(scalars),
            Record::Epoch { .. } | Record::Eval { .. } => None,
        })
        .collect()
}

#[test]
fn the_new_ops_give_the_hand_computed_values_on_cpu_and_sim() {
    let stop = orch_trainer::RunOptions {
        stop_after: Some(1),
        ..options()
    };
    for on_sim in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let job = fixture_job(dir.path(), "new-ops", "");
        let devices = if on_sim { sims(1, 64 << 20).0 } else { cpu() };
        run(&job, &devices, &stop).unwrap_or_else(|e| panic!("sim {on_sim}: {e}"));
        let scalars = &step_scalars(&job)[0];
        assert_eq!(scalars.get("new_ops_checked"), Some(&25.0), "{scalars:?}");
    }
}

#[test]
fn bad_arguments_to_the_new_ops_are_values_and_the_job_ends_with_a_sentence() {
    let dir = tempfile::tempdir().unwrap();
    let job = fixture_job(dir.path(), "bad-args", "");
    let (devices, pools) = sims(2, 64 << 20);
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
        message.starts_with("bad-args refused 17 calls"),
        "{message}"
    );
    assert!(!message.contains("ACCEPTED"), "{message}");
    for expected in [
        "slice step 0: TensorError::BadArgument(",
        "clamp min > max: TensorError::BadArgument(",
        "dropout p = 1.5: TensorError::BadArgument(",
        "embedding index 3 of 3 rows: TensorError::BadArgument(",
        "embedding index -1: TensorError::BadArgument(",
        "gather out of range: TensorError::BadArgument(",
        "index-select out of range: TensorError::BadArgument(",
        "expand to an output past the element cap: TensorError::BadArgument(",
        "pad to an output past the element cap: TensorError::BadArgument(",
        "cross-entropy-with a label outside the classes: TensorError::BadArgument(",
    ] {
        assert!(message.contains(expected), "{expected} in {message}");
    }
    assert!(err.to_string().contains("trainer_fixture"), "{err}");
    for pool in pools {
        assert_eq!(pool.in_use(), 0, "tensors freed");
    }
}

const DROPOUT: &str = "p = \"0.5\"\nlr1 = \"0.1\"\nlr2 = \"0.05\"";

/// Finding to guard: with the mask drawn from each replica's local row index, 2 replicas would
/// draw other masks than 1 and the runs would part.
#[test]
fn dropout_on_two_replicas_matches_one_replica() {
    let stop = orch_trainer::RunOptions {
        stop_after: Some(6),
        ..options()
    };
    let one_dir = tempfile::tempdir().unwrap();
    let one = fixture_job(one_dir.path(), "dropout", DROPOUT);
    run(&one, &cpu(), &stop).unwrap();
    let two_dir = tempfile::tempdir().unwrap();
    let two = fixture_job(two_dir.path(), "dropout", DROPOUT);
    run(&two, &sims(2, 64 << 20).0, &stop).unwrap();
    let (a, b) = (final_params(&one), final_params(&two));
    let diff = max_relative_difference(&a, &b);
    assert!(diff < 1e-4, "parameters differ by {diff} (relative)");
    // And the masks matter: without dropout the parameters are others.
    let none_dir = tempfile::tempdir().unwrap();
    let none = fixture_job(none_dir.path(), "dropout", "p = \"0\"");
    run(&none, &cpu(), &stop).unwrap();
    assert!(max_relative_difference(&a, &final_params(&none)) > 1e-3);
    // The buffer counted the steps, and replica 0's count is the checkpoint's.
    let checkpoint =
        orch_trainer::checkpoint::Checkpoint::load(&spec(&two).out.join("checkpoint")).unwrap();
    assert_eq!(checkpoint.buffers.len(), 1);
    assert_eq!(
        (
            checkpoint.buffers[0].name.as_str(),
            checkpoint.buffers[0].data.as_slice()
        ),
        ("steps", [6.0].as_slice())
    );
    // Clipping at 100 reported the norm of every step.
    let norms = step_scalars(&one);
    assert!(
        norms
            .iter()
            .all(|s| s.get("grad_norm").is_some_and(|n| *n > 0.0))
    );
}

#[test]
fn an_interrupted_run_with_dropout_and_a_buffer_resumes_to_the_same_parameters() {
    let whole_dir = tempfile::tempdir().unwrap();
    let whole = fixture_job(whole_dir.path(), "dropout", DROPOUT);
    let stop = |n| orch_trainer::RunOptions {
        stop_after: Some(n),
        ..options()
    };
    run(&whole, &cpu(), &stop(8)).unwrap();
    let parts_dir = tempfile::tempdir().unwrap();
    let parts = fixture_job(parts_dir.path(), "dropout", DROPOUT);
    run(&parts, &cpu(), &stop(3)).unwrap();
    let resume = orch_trainer::RunOptions {
        resume: true,
        ..stop(8)
    };
    run(&parts, &sims(2, 64 << 20).0, &resume).unwrap();
    let diff = max_relative_difference(&final_params(&whole), &final_params(&parts));
    assert!(diff < 1e-4, "parameters differ by {diff} (relative)");
    let checkpoint =
        orch_trainer::checkpoint::Checkpoint::load(&spec(&parts).out.join("checkpoint")).unwrap();
    assert_eq!(checkpoint.buffers[0].data, vec![8.0]);
}

#[test]
fn a_parameter_group_with_lr_0_is_left_as_initialised() {
    let stop = orch_trainer::RunOptions {
        stop_after: Some(3),
        ..options()
    };
    let dir = tempfile::tempdir().unwrap();
    let job = fixture_job(
        dir.path(),
        "dropout",
        "p = \"0\"\nlr1 = \"0.1\"\nlr2 = \"0\"",
    );
    run(&job, &cpu(), &stop).unwrap();
    let moved_dir = tempfile::tempdir().unwrap();
    let moved = fixture_job(
        moved_dir.path(),
        "dropout",
        "p = \"0\"\nlr1 = \"0.1\"\nlr2 = \"0.1\"",
    );
    run(&moved, &cpu(), &stop).unwrap();
    let (frozen, trained) = (final_params(&job), final_params(&moved));
    let by_name = |list: &[orch_trainer::safetensors::NamedTensor], name: &str| {
        list.iter().find(|t| t.name == name).unwrap().data.clone()
    };
    // Layer 2's bias starts at 0: with lr 0 it stays there, with lr 0.1 it moves.
    assert!(by_name(&frozen, "l2.bias").iter().all(|v| *v == 0.0));
    assert!(by_name(&trained, "l2.bias").iter().any(|v| *v != 0.0));
    assert!(by_name(&frozen, "l1.bias").iter().any(|v| *v != 0.0));
}

#[test]
fn clip_grad_norm_through_wasm_matches_the_hand_computation() {
    let stop = orch_trainer::RunOptions {
        stop_after: Some(1),
        ..options()
    };
    let dir = tempfile::tempdir().unwrap();
    let job = fixture_job(dir.path(), "clip", "");
    run(&job, &cpu(), &stop).unwrap();
    // p = [1, 2, 2], gradient p, norm 3; clipped to 1.5 and lr 1: p - p * 1.5 / (3 + 1e-6).
    assert_eq!(step_scalars(&job)[0].get("clip_norm"), Some(&3.0));
    let p = &final_params(&job)[0];
    let coef = 1.5 / (3.0 + 1e-6);
    for (got, init) in p.data.iter().zip([1.0f64, 2.0, 2.0]) {
        assert!(
            (f64::from(*got) - (init - init * coef)).abs() < 1e-6,
            "{:?}",
            p.data
        );
    }
}

#[test]
fn predict_gives_the_mlp_logits_from_its_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let job = job(
        dir.path(),
        "plugin = \"mlp\"\nepochs = 1\nbatch_size = 64\nseed = 3\n[train.config]\nhidden = \"16\"\nlr = 0.1",
    );
    run(&job, &cpu(), &options()).unwrap();
    let train_job = TrainJob {
        name: &job.name,
        spec: spec(&job),
        memory_limit: None,
    };
    // Two rows of 64 features: the logits are [2, 10], and the checkpoint's weights are used
    // (the same rows twice give the same logits; zero features give the last bias).
    let mut features = vec![0.0f32; 64];
    features.extend(std::iter::repeat_n(0.5, 64));
    let out = orch_trainer::predict(&train_job, &cpu(), &options(), features, &[2, 64]).unwrap();
    assert_eq!(out.shape, vec![2, 10]);
    let params = final_params(&job);
    let last_bias = params.iter().find(|t| t.name == "layers.1.bias").unwrap();
    let w0 = params.iter().find(|t| t.name == "layers.0.bias").unwrap();
    // Row 0: relu(b0) @ w1 + b1.
    let w1 = params.iter().find(|t| t.name == "layers.1.weight").unwrap();
    for c in 0..10 {
        let mut want = f64::from(last_bias.data[c]);
        for (h, b) in w0.data.iter().enumerate() {
            want += f64::from(b.max(0.0)) * f64::from(w1.data[h * 10 + c]);
        }
        assert!((f64::from(out.values[c]) - want).abs() < 1e-4, "class {c}");
    }
    // A trainer without `predict` is refused with a sentence.
    let old =
        std::path::Path::new(orch_trainer::TRAINER_WASM_DIR).join("compat_trainer_mlp_0_2.wasm");
    let old_dir = tempfile::tempdir().unwrap();
    let old_job = super::common::job(
        old_dir.path(),
        &format!(
            "plugin = \"{}\"\nepochs = 1\nbatch_size = 64\n[train.config]\nhidden = \"16\"",
            old.display()
        ),
    );
    let old_train = TrainJob {
        name: &old_job.name,
        spec: spec(&old_job),
        memory_limit: None,
    };
    let err =
        orch_trainer::predict(&old_train, &cpu(), &options(), vec![0.0; 64], &[1, 64]).unwrap_err();
    assert!(
        err.to_string()
            .contains("predict is an export of contract 0.3.0"),
        "{err}"
    );
}

/// Trainers built for contracts 0.3.0 and 0.4.0 that export `predict` are asked through their
/// versions' bindings, and give the very logits of the 0.5.0 built-in trained alike.
#[test]
fn predict_asks_trainers_built_for_0_3_0_and_0_4_0() {
    let logits = |plugin: &str| {
        let dir = tempfile::tempdir().unwrap();
        let job = super::common::job(
            dir.path(),
            &format!(
                "plugin = \"{plugin}\"\nepochs = 1\nbatch_size = 64\nseed = 3\n[train.config]\nhidden = \"16\"\nlr = 0.1"
            ),
        );
        run(&job, &cpu(), &options()).unwrap();
        let train_job = TrainJob {
            name: &job.name,
            spec: spec(&job),
            memory_limit: None,
        };
        orch_trainer::predict(&train_job, &cpu(), &options(), vec![0.5; 64], &[1, 64])
            .unwrap()
            .values
    };
    let builtin = logits("mlp");
    for file in ["compat_trainer_mlp_0_3.wasm", "compat_trainer_mlp_0_4.wasm"] {
        let old = std::path::Path::new(orch_trainer::TRAINER_WASM_DIR).join(file);
        assert_eq!(logits(&old.display().to_string()), builtin, "{file}");
    }
}
