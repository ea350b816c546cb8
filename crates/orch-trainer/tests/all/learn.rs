//! The built-in `mlp` trainer learns, and a run leaves its metrics, plot and checkpoint.

use crate::common::*;
use orch_trainer::report::{Record, read_metrics};

#[test]
fn mlp_learns_digits_and_records_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let job = job(
        dir.path(),
        "plugin = \"mlp\"\nepochs = 3\nbatch_size = 32\nseed = 7\n[train.config]\nhidden = \"32\"\nlr = 0.1",
    );
    let summary = run(&job, &cpu(), &options()).unwrap();
    let steps_per_epoch = 1797u64.div_ceil(32);
    assert_eq!(summary.steps, 3 * steps_per_epoch);
    let accuracy = summary.eval_accuracy.expect("evaluated");
    assert!(accuracy > 0.95, "accuracy {accuracy}");

    let out = &spec(&job).out;
    let records = read_metrics(&out.join("metrics.jsonl"));
    let steps: Vec<&Record> = records
        .iter()
        .filter(|r| matches!(r, Record::Step { .. }))
        .collect();
    let epochs: Vec<&Record> = records
        .iter()
        .filter(|r| matches!(r, Record::Epoch { .. }))
        .collect();
    assert_eq!((steps.len() as u64, epochs.len()), (summary.steps, 3));
    let (Record::Step { loss: first, .. }, Record::Step { loss: last, .. }) =
        (steps[0], steps[steps.len() - 1])
    else {
        unreachable!()
    };
    assert!(last < first, "loss went from {first} to {last}");
    let Record::Epoch {
        step,
        eval_accuracy,
        ..
    } = epochs[2]
    else {
        unreachable!()
    };
    assert_eq!(*step, summary.steps);
    let recorded = eval_accuracy.expect("an accuracy in the epoch record");
    assert!(
        (recorded - accuracy).abs() < 1e-12,
        "{recorded} vs {accuracy}"
    );
    let svg = std::fs::read_to_string(out.join("plot.svg")).unwrap();
    assert!(svg.contains("<polyline") && svg.contains("accuracy"));
    assert_eq!(
        final_params(&job).len(),
        4,
        "two layers, weight and bias each"
    );
}

#[test]
fn a_component_of_another_world_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let policy = std::path::Path::new(orch_host::PLUGIN_WASM_DIR).join("least_loaded.wasm");
    let job = job(
        dir.path(),
        &format!(
            "plugin = \"{}\"\nepochs = 1\nbatch_size = 32",
            policy.display()
        ),
    );
    let err = run(&job, &cpu(), &options()).unwrap_err();
    assert!(err.is_bad_input());
    let text = err.to_string();
    assert!(
        text.contains("`least_loaded` is not a trainer component: it implements orch:plugin/policy@0.5.0, and orch expected orch:plugin/trainer@0.5.0 (or 0.4.0, 0.3.0, 0.2.0, 0.1.0)"),
        "{text}"
    );
    let unknown = job_named(dir.path(), "nope");
    let err = run(&unknown, &cpu(), &options()).unwrap_err().to_string();
    assert!(
        err.contains("unknown built-in trainer `nope`") && err.contains("mlp"),
        "{err}"
    );
}

fn job_named(dir: &std::path::Path, plugin: &str) -> orch_core::JobSpec {
    job(
        dir,
        &format!("plugin = \"{plugin}\"\nepochs = 1\nbatch_size = 32"),
    )
}

/// The example job as shipped (3 epochs of MNIST), to 97.5% test accuracy: the headline, run
/// by every `cargo test`. The numeric crates are optimised in the dev profile (the root
/// Cargo.toml), so a debug build runs it in about the time a release build does.
#[test]
fn the_mnist_example_reaches_97_5_percent_in_3_epochs() {
    let example =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/mnist/job.toml");
    let mut job = orch_core::job::read(&example).unwrap();
    let out = tempfile::tempdir().unwrap();
    if let orch_core::job::Work::Train(spec) = &mut job.work {
        assert_eq!(spec.epochs, 3);
        spec.out = out.path().to_path_buf();
    }
    let summary = run(&job, &cpu(), &options()).unwrap();
    let accuracy = summary.eval_accuracy.expect("MNIST has a test set");
    assert!(accuracy >= 0.975, "test accuracy {accuracy}");
}

/// Trainers built for contracts 0.1.0 (bare `init`, `train-step`, `eval-step`) and 0.2.0 (the
/// `training` export without 0.3.0's imports), whose model is the built-in `mlp`'s, still
/// train, to the very parameters the 0.5.0 built-in reaches.
#[test]
fn a_trainer_built_for_contract_0_1_0_trains_like_its_0_5_0_twin() {
    same_as_the_builtin("compat_trainer_mlp.wasm");
}

#[test]
fn a_trainer_built_for_contract_0_2_0_trains_like_its_0_5_0_twin() {
    same_as_the_builtin("compat_trainer_mlp_0_2.wasm");
}

/// A trainer built for contract 0.3.0 (the trainer world before the policy world learnt of
/// topology) trains like the 0.5.0 built-in.
#[test]
fn a_trainer_built_for_contract_0_3_0_trains_like_its_0_5_0_twin() {
    same_as_the_builtin("compat_trainer_mlp_0_3.wasm");
}

/// A trainer built for contract 0.4.0 (the trainer world before the policy world learnt of MIG
/// slices) trains like the 0.5.0 built-in.
#[test]
fn a_trainer_built_for_contract_0_4_0_trains_like_its_0_5_0_twin() {
    same_as_the_builtin("compat_trainer_mlp_0_4.wasm");
}

fn same_as_the_builtin(file: &str) {
    let old = std::path::Path::new(orch_trainer::TRAINER_WASM_DIR).join(file);
    let train = |plugin: &str| {
        let dir = tempfile::tempdir().unwrap();
        let job = job(
            dir.path(),
            &format!(
                "plugin = \"{plugin}\"\nepochs = 1\nbatch_size = 64\nseed = 3\n[train.config]\nhidden = \"16\"\nlr = 0.1"
            ),
        );
        let summary = run(&job, &cpu(), &options()).unwrap();
        (summary, final_params(&job))
    };
    let (old_run, old_params) = train(&old.display().to_string());
    let (new_run, new_params) = train("mlp");
    assert_eq!(old_run.steps, new_run.steps);
    assert_eq!(old_run.eval_accuracy, new_run.eval_accuracy);
    assert_eq!(max_relative_difference(&old_params, &new_params), 0.0);
}

/// A job's `[train] memory` is the plugin's cap, and an error about it names the setting.
#[test]
fn the_plugin_memory_cap_comes_from_the_job_and_is_named_when_hit() {
    let dir = tempfile::tempdir().unwrap();
    let job = job(
        dir.path(),
        "plugin = \"mlp\"\nepochs = 1\nbatch_size = 64\nmemory = \"64KiB\"\n[train.config]\nhidden = \"16\"",
    );
    let err = run(&job, &cpu(), &options()).unwrap_err().to_string();
    assert!(
        err.contains("went over its linear-memory limit of 64 KiB (all its memories together)"),
        "{err}"
    );
    assert!(
        err.contains("set `memory` in [train] of the job file"),
        "{err}"
    );
}

/// The two reference examples reach what their docs promise: `examples/cnn/job.toml` at least
/// 99.0% MNIST test accuracy, `examples/gpt/job.toml` a validation loss of at most 1.95 after its
/// 2000 steps. Minutes of training each (docs/TRAINERS.md gives the times), so it runs where
/// `ORCH_FULL_EXAMPLES=1` asks for it (`scripts/bench-trainers.sh` measures the same runs).
#[test]
fn the_cnn_and_gpt_examples_reach_their_goals() {
    if std::env::var("ORCH_FULL_EXAMPLES").as_deref() != Ok("1") {
        eprintln!("skipped: set ORCH_FULL_EXAMPLES=1 to train the cnn and gpt examples in full");
        return;
    }
    let examples = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    let train = |file: &str| {
        let mut job = orch_core::job::read(&examples.join(file)).unwrap();
        let out = tempfile::tempdir().unwrap();
        if let orch_core::job::Work::Train(spec) = &mut job.work {
            spec.out = out.path().to_path_buf();
        }
        run(&job, &cpu(), &options()).unwrap()
    };
    let cnn = train("cnn/job.toml");
    let accuracy = cnn.eval_accuracy.expect("MNIST has a test set");
    assert!(accuracy >= 0.990, "cnn test accuracy {accuracy}");
    let gpt = train("gpt/job.toml");
    assert_eq!(gpt.steps, 2000);
    let loss = gpt.eval_loss.expect("Shakespeare has a validation text");
    assert!(loss <= 1.95, "gpt val loss {loss}");
    eprintln!(
        "cnn: {:.2}% in {:.0} s; gpt: val loss {loss:.4} in {:.0} s",
        accuracy * 100.0,
        cnn.seconds,
        gpt.seconds
    );
}
