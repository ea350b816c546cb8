//! Data sets of any shape (safetensors) and training by steps: what a job file says is what the
//! run does and records.

use crate::common::*;
use orch_core::job;
use orch_trainer::report::{Record, read_metrics};
use safetensors::Dtype;
use safetensors::tensor::TensorView;
use std::path::Path;

/// The bundled digits as a safetensors file, as numpy would save them: pixels `u8` of shape
/// `[N, 1, 8, 8]`, labels `i64`.
fn digits_safetensors(path: &Path) {
    let options = orch_data::CsvOptions {
        label_column: -1,
        header: false,
        scale: 1.0,
    };
    let digits = orch_data::load_csv(&digits(), &options).unwrap();
    let pixels: Vec<u8> = digits.features.iter().map(|&x| x as u8).collect();
    let labels: Vec<u8> = digits
        .labels
        .iter()
        .flat_map(|&l| i64::from(l).to_le_bytes())
        .collect();
    let n = digits.len();
    let views = vec![
        (
            "features",
            TensorView::new(Dtype::U8, vec![n, 1, 8, 8], &pixels).unwrap(),
        ),
        (
            "labels",
            TensorView::new(Dtype::I64, vec![n], &labels).unwrap(),
        ),
    ];
    std::fs::write(path, safetensors::serialize(views, None).unwrap()).unwrap();
}

fn parse(dir: &Path, text: &str) -> orch_core::job::JobSpec {
    let path = dir.join("job.toml");
    std::fs::write(&path, text).unwrap();
    job::parse(&path, text).unwrap_or_else(|e| panic!("{e}\n{text}"))
}

#[test]
fn a_safetensors_data_set_trains_like_its_csv() {
    let dir = tempfile::tempdir().unwrap();
    digits_safetensors(&dir.path().join("digits.safetensors"));
    let job = parse(
        dir.path(),
        "[job]\nname = \"st\"\n[train]\nplugin = \"mlp\"\nepochs = 3\nbatch_size = 32\nseed = 7\n[train.config]\nhidden = \"32\"\nlr = 0.1\n[train.data]\nformat = \"safetensors\"\ntrain = \"digits.safetensors\"\ntest = \"digits.safetensors\"\nscale = 16\n",
    );
    let summary = run(&job, &cpu(), &options()).unwrap();
    let accuracy = summary.eval_accuracy.expect("evaluated");
    assert!(accuracy > 0.95, "accuracy {accuracy}");

    // A file without the tensors the format names is refused, naming what it has.
    std::fs::write(
        dir.path().join("digits.safetensors"),
        safetensors::serialize(
            vec![("x", TensorView::new(Dtype::U8, vec![1], &[0]).unwrap())],
            None,
        )
        .unwrap(),
    )
    .unwrap();
    let err = run(&job, &cpu(), &options()).unwrap_err().to_string();
    assert!(err.contains("no tensor `features` (it has x)"), "{err}");
}

#[test]
fn steps_and_eval_every_make_eval_records_with_training_time() {
    let dir = tempfile::tempdir().unwrap();
    let job = job(
        dir.path(),
        "plugin = \"mlp\"\nsteps = 70\neval_every = 25\neval_batches = 2\nbatch_size = 32\nseed = 7\n[train.config]\nhidden = \"32\"\nlr = 0.1",
    );
    let summary = run(&job, &cpu(), &options()).unwrap();
    assert_eq!(summary.steps, 70, "steps, not epochs");
    let records = read_metrics(&spec(&job).out.join("metrics.jsonl"));
    let evals: Vec<(u64, f64)> = records
        .iter()
        .filter_map(|r| match r {
            Record::Eval {
                step,
                train_seconds,
                eval_accuracy,
                ..
            } => {
                assert!(eval_accuracy.is_some(), "a classification has an accuracy");
                Some((*step, *train_seconds))
            }
            _ => None,
        })
        .collect();
    let steps: Vec<u64> = evals.iter().map(|e| e.0).collect();
    assert_eq!(steps, vec![25, 50, 70], "every 25 steps and at the end");
    assert!(evals.windows(2).all(|w| w[0].1 <= w[1].1), "{evals:?}");
    // 1797 samples in batches of 32 make 57 steps an epoch: one whole epoch, then 13 steps.
    let epochs: Vec<(u64, Option<f64>)> = records
        .iter()
        .filter_map(|r| match r {
            Record::Epoch {
                step,
                train_seconds,
                ..
            } => Some((*step, *train_seconds)),
            _ => None,
        })
        .collect();
    assert_eq!(epochs.iter().map(|e| e.0).collect::<Vec<_>>(), vec![57, 70]);
    assert!(epochs.iter().all(|e| e.1.is_some_and(|s| s >= 0.0)));
    let timed = records
        .iter()
        .filter(|r| matches!(r, Record::Step { step_seconds: Some(s), .. } if *s >= 0.0))
        .count();
    assert_eq!(timed, 70, "every step has its time");
}

#[test]
fn the_cnn_trains_on_images_of_the_shape_the_file_gives() {
    // The digits as [N, 1, 8, 8] images: the cnn reshapes the flat batch by run-info's
    // sample-shape; a CSV of the same pixels gives [64], which a CNN cannot take.
    let dir = tempfile::tempdir().unwrap();
    digits_safetensors(&dir.path().join("digits.safetensors"));
    let job = parse(
        dir.path(),
        "[job]\nname = \"cnn\"\n[train]\nplugin = \"cnn\"\nepochs = 3\nbatch_size = 32\nseed = 1\n[train.config]\nchannels = \"8\"\nkernel = 3\nlr = 0.01\n[train.data]\nformat = \"safetensors\"\ntrain = \"digits.safetensors\"\ntest = \"digits.safetensors\"\nscale = 16\n",
    );
    let summary = run(&job, &cpu(), &options()).unwrap();
    let accuracy = summary.eval_accuracy.expect("evaluated");
    assert!(accuracy > 0.95, "accuracy {accuracy}");
    let names: Vec<String> = final_params(&job).into_iter().map(|p| p.name).collect();
    assert_eq!(
        names,
        ["conv1.bias", "conv1.weight", "fc1.bias", "fc1.weight"]
    );

    let csv = job_with_data(dir.path(), "plugin = \"cnn\"\nepochs = 1\nbatch_size = 32");
    let err = run(&csv, &cpu(), &options()).unwrap_err().to_string();
    assert!(err.contains("[64]"), "the sample shape is named: {err}");
}

/// `train` lines on the digits CSV, whose samples have shape `[64]`.
fn job_with_data(dir: &Path, train: &str) -> orch_core::job::JobSpec {
    let sub = dir.join("csv");
    std::fs::create_dir_all(&sub).unwrap();
    job(&sub, train)
}
