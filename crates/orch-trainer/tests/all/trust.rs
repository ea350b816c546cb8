//! A checkpoint that cannot be written stops the run at its step, whatever the number of
//! replicas, and leaves nothing half-written; `predict`'s non-finite logits are an error value
//! naming where, and its errors are shortened as a step's are.

use crate::common::*;
use orch_core::job::{self, JobSpec};
use orch_trainer::checkpoint::Checkpoint;
use orch_trainer::report::{Record, read_metrics};
use orch_trainer::{Model, SampleOptions, TrainError, TrainJob};
use std::path::{Path, PathBuf};
use std::process::Command;

/// An MLP job on the digits writing to `dir/out`, a checkpoint every 3 steps (of 17).
fn checkpointing_job(dir: &Path) -> JobSpec {
    job(
        dir,
        &format!(
            "plugin = \"mlp\"\nepochs = 1\nbatch_size = 100\nseed = 3\ncheckpoint_every = 3\nout = \"{}\"\n[train.config]\nhidden = \"256\"\noptimizer = \"sgd\"\nlr = 0.05",
            dir.join("out").display()
        ),
    )
}

/// The steps the run recorded in its metrics.
fn steps_recorded(out: &Path) -> Vec<u64> {
    read_metrics(&out.join("metrics.jsonl"))
        .into_iter()
        .filter_map(|r| match r {
            Record::Step { step, .. } => Some(step),
            _ => None,
        })
        .collect()
}

/// Entries of the checkpoint history folder, sorted.
fn history(out: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(out.join("checkpoints"))
        .map(|entries| {
            entries
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// A tmpfs of `bytes` on `dir`, unmounted on drop.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(dir: &Path, bytes: u64) -> Tmpfs {
        std::fs::create_dir_all(dir).unwrap();
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes}"), "tmpfs"])
            .arg(dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "mount: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Tmpfs(dir.to_path_buf())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).output();
    }
}

fn is_root() -> bool {
    std::fs::metadata("/proc/self")
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0)
        .unwrap_or(false)
}

/// Finding: with one replica, training went on after a checkpoint failed (no space left at step
/// 150: all 1,710 steps ran, 33 `.tmp-step-*` folders were left); two replicas stopped.
#[test]
fn a_checkpoint_that_cannot_be_written_stops_training_at_its_step() {
    // The size of one checkpoint, from a run that can write them.
    let sizing = tempfile::tempdir().unwrap();
    let sized = checkpointing_job(sizing.path());
    run(&sized, &cpu(), &options()).unwrap();
    let folder = sizing.path().join("out/checkpoint");
    let one: u64 = std::fs::read_dir(&folder)
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum();

    for replicas in [1, 2] {
        let (devices, _pools) = sims(replicas, 256 << 20);

        // A file where the checkpoint folder should be: the first checkpoint (step 3) fails.
        let dir = tempfile::tempdir().unwrap();
        let job = checkpointing_job(dir.path());
        let out = dir.path().join("out");
        std::fs::create_dir_all(&out).unwrap();
        std::fs::write(out.join("checkpoints"), b"not a folder").unwrap();
        let err = run(&job, &devices, &options()).unwrap_err();
        assert!(
            matches!(err, TrainError::CheckpointWrite { step: 3, .. }),
            "{replicas} replicas: {err:?}"
        );
        let text = err.to_string();
        assert!(
            text.starts_with(&format!(
                "could not write the checkpoint at {}: file exists",
                out.join("checkpoints").display()
            )),
            "{text}"
        );
        assert!(!text.contains("os error"), "{text}");
        assert_eq!(steps_recorded(&out), [1, 2, 3], "{replicas} replicas");

        // No space left: room for one checkpoint, not two. The second (step 6) fails while
        // being written; its temporary folder goes, the first stays whole and current.
        if !is_root() {
            assert!(
                std::env::var_os("ORCH_REQUIRE_ROOT").is_none(),
                "the no-space checkpoint case needs root (a tmpfs) and ORCH_REQUIRE_ROOT is set"
            );
            eprintln!("not root: the no-space case needs a tmpfs, skipped");
            continue;
        }
        let dir = tempfile::tempdir().unwrap();
        let job = checkpointing_job(dir.path());
        let out = dir.path().join("out");
        let _tmpfs = Tmpfs::mount(&out.join("checkpoints"), one * 3 / 2);
        let err = run(&job, &devices, &options()).unwrap_err();
        assert!(
            matches!(err, TrainError::CheckpointWrite { step: 6, .. }),
            "{replicas} replicas: {err:?}"
        );
        let text = err.to_string();
        assert!(
            text.starts_with("could not write the checkpoint at ")
                && text.contains(": no space left on device; training stopped after step 6"),
            "{text}"
        );
        assert_eq!(
            steps_recorded(&out),
            [1, 2, 3, 4, 5, 6],
            "{replicas} replicas"
        );
        assert_eq!(history(&out), ["step-000000000003"], "{replicas} replicas");
        let kept = Checkpoint::load(&out.join("checkpoint")).unwrap();
        assert_eq!(kept.meta.step, 3);
    }
}

/// A text job on a few lines of text with the `trainer-fixture-predict` component in `mode`.
fn predicting_job(dir: &Path, mode: &str) -> JobSpec {
    let text = dir.join("text.txt");
    std::fs::write(&text, "to be or not to be\n".repeat(40)).unwrap();
    let plugin = Path::new(orch_trainer::TRAINER_WASM_DIR).join("trainer_fixture_predict.wasm");
    let job_text = format!(
        "[job]\nname = \"p\"\n[train]\nplugin = \"{}\"\nsteps = 1\nbatch_size = 2\nout = \"{}\"\n[train.data]\nformat = \"text\"\ntrain = \"{}\"\nval = \"{}\"\nblock_size = 8\n[train.config]\nmode = \"{mode}\"\n",
        plugin.display(),
        dir.join("out").display(),
        text.display(),
        text.display(),
    );
    let path = dir.join("job.toml");
    std::fs::write(&path, &job_text).unwrap();
    job::parse(&path, &job_text).unwrap_or_else(|e| panic!("{e}\n{job_text}"))
}

fn model(job: &JobSpec) -> Model {
    let train_job = TrainJob {
        name: &job.name,
        spec: spec(job),
        memory_limit: None,
    };
    Model::load(&train_job, &cpu()[0], &options()).unwrap()
}

fn sample(model: &mut Model, prompt: &str) -> Result<orch_trainer::Sample, TrainError> {
    let prompt = model
        .vocab()
        .unwrap()
        .encode(prompt, orch_data::Unknown::Error, "prompt")
        .unwrap();
    model.sample(
        &prompt,
        &SampleOptions {
            tokens: 5,
            temperature: 0.8,
            top_k: None,
            seed: 1,
        },
    )
}

/// Finding: NaN logits from `predict` were sampled silently (token 0, exit 0).
#[test]
fn non_finite_logits_are_an_error_naming_where() {
    let dir = tempfile::tempdir().unwrap();
    // The vocabulary of "to be or not to be\n": newline, space, b, e, n, o, r, t.
    let classes = 8;
    let mut nan = model(&predicting_job(dir.path(), "nan"));
    let err = sample(&mut nan, "to be").unwrap_err();
    assert!(
        matches!(&err, TrainError::Failed { message, .. }
            if message.contains(&format!("non-finite logit (NaN) at [0, 4, 0] of its [1, 5, {classes}] logits, after 0 generated tokens"))),
        "{err}"
    );

    let dir = tempfile::tempdir().unwrap();
    let mut inf = model(&predicting_job(dir.path(), "inf-last"));
    let err = sample(&mut inf, "not").unwrap_err();
    assert!(
        err.to_string().contains(&format!(
            "non-finite logit (inf) at [0, 2, {}] of its [1, 3, {classes}] logits",
            classes - 1
        )),
        "{err}"
    );

    // Finite logits sample as before.
    let dir = tempfile::tempdir().unwrap();
    let mut fine = model(&predicting_job(dir.path(), "zeros"));
    assert_eq!(sample(&mut fine, "to").unwrap().tokens.len(), 5);
}

/// Finding: `predict`'s output was copied out whatever its shape claimed: an expanded view of
/// `[1, 2^20, 2^20]` made the host allocate 4 TiB.
#[test]
fn an_expanded_predict_output_is_an_error_not_a_copy() {
    let dir = tempfile::tempdir().unwrap();
    let mut huge = model(&predicting_job(dir.path(), "expanded"));
    let err = sample(&mut huge, "to be").unwrap_err();
    assert!(
        err.to_string().contains(
            "predict returned a tensor of shape [1, 1048576, 1048576] for features [1, 5], more values than the host copies (a tensor of shape [1, 5, 8] was expected)"
        ),
        "{err}"
    );
    let err = huge.predict(vec![1.0, 2.0], &[1, 2]).unwrap_err();
    assert!(
        err.to_string()
            .contains("(at most 268435456 values are read back)"),
        "{err}"
    );
}

/// Finding: `predict`'s error text was not shortened as a step's is (one 100 MB line).
#[test]
fn a_predict_error_is_shortened_as_a_steps_is() {
    let dir = tempfile::tempdir().unwrap();
    let mut long = model(&predicting_job(dir.path(), "long-error"));
    let err = long.predict(vec![1.0, 2.0], &[1, 2]).unwrap_err();
    let text = err.to_string();
    assert!(text.len() < 2200, "{} bytes", text.len());
    assert!(
        text.starts_with("trainer `")
            && text.contains("failed in predict: eeee")
            && text.ends_with(&format!("... ({} bytes)", 32 << 20)),
        "{}",
        &text[..text.len().min(300)]
    );
}
