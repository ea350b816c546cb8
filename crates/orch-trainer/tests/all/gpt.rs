//! Text and the built-in `gpt`: a small character GPT on the bundled Shakespeare learns, its
//! checkpoint evaluates and samples outside the run, N replicas reproduce one even with dropout,
//! and a quota too small for its activations is an out-of-memory value at the step.

use crate::common::*;
use orch_core::job::{self, JobSpec};
use orch_data::Vocab;
use orch_trainer::checkpoint::Checkpoint;
use orch_trainer::report::{Record, read_metrics};
use orch_trainer::{Model, SampleOptions, TrainJob};
use std::path::{Path, PathBuf};

fn shakespeare(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples/gpt/data")
        .join(file)
}

/// A small GPT job in `dir`: `train` lines go into `[train]`, `config` into `[train.config]`.
fn gpt_job(dir: &Path, train: &str, config: &str, resources: &str) -> JobSpec {
    let text = format!(
        "[job]\nname = \"g\"\n[resources]\n{resources}\n[train]\nplugin = \"gpt\"\nseed = 5\n{train}\n[train.data]\nformat = \"text\"\ntrain = \"{}\"\nval = \"{}\"\nblock_size = 16\n[train.config]\nlayers = 1\nheads = 2\nembedding = 32\nwarmup_steps = 5\n{config}\n",
        shakespeare("train.txt.gz").display(),
        shakespeare("val.txt.gz").display(),
    );
    let path = dir.join("job.toml");
    std::fs::write(&path, &text).unwrap();
    job::parse(&path, &text).unwrap_or_else(|e| panic!("{e}\n{text}"))
}

fn load(job: &JobSpec) -> Model {
    let train_job = TrainJob {
        name: &job.name,
        spec: spec(job),
        memory_limit: None,
    };
    Model::load(&train_job, &cpu()[0], &options()).unwrap()
}

#[test]
fn a_small_gpt_learns_and_its_checkpoint_evaluates_and_samples() {
    let dir = tempfile::tempdir().unwrap();
    let job = gpt_job(
        dir.path(),
        "steps = 60\nbatch_size = 8\neval_every = 30\neval_batches = 4",
        "lr = 3e-3",
        "",
    );
    let summary = run(&job, &cpu(), &options()).unwrap();
    assert_eq!(summary.steps, 60);
    assert_eq!(summary.eval_accuracy, None, "text has no accuracy");
    let closing = summary
        .sample
        .clone()
        .expect("a text run ends with a sample");
    assert_eq!(closing.chars().count(), 200, "{closing:?}");

    let out = &spec(&job).out;
    let records = read_metrics(&out.join("metrics.jsonl"));
    let evals: Vec<(u64, f64)> = records
        .iter()
        .filter_map(|r| match r {
            Record::Eval {
                step,
                eval_loss,
                eval_accuracy: None,
                ..
            } => Some((*step, *eval_loss)),
            _ => None,
        })
        .collect();
    assert_eq!(evals.iter().map(|e| e.0).collect::<Vec<_>>(), vec![30, 60]);
    let vocab_size = 73.0f64;
    assert!(
        evals[1].1 < vocab_size.ln() - 0.8,
        "val loss {evals:?} against {} at random",
        vocab_size.ln()
    );
    assert!(
        !records.iter().any(|r| matches!(r, Record::Epoch { .. })),
        "text has no epochs"
    );

    // The checkpoint knows its vocabulary: the train text's 73 sorted characters.
    let checkpoint = Checkpoint::load(&out.join("checkpoint")).unwrap();
    let stored = checkpoint.meta.vocab.clone().expect("a vocabulary");
    let Some(Vocab::Chars(chars)) = Vocab::from_stored(&stored) else {
        panic!("{stored}");
    };
    assert_eq!(chars.len(), 73);
    assert!(chars.windows(2).all(|w| w[0] < w[1]));

    // Outside the run: the same windows give the same loss the run recorded.
    let mut model = load(&job);
    assert_eq!(model.checkpoint_step(), Some(60));
    let eval = model.evaluate().unwrap();
    assert_eq!((eval.rows, eval.batches), (32, 4));
    assert!(
        (eval.loss - evals[1].1).abs() < 1e-5,
        "{} vs the run's {}",
        eval.loss,
        evals[1].1
    );
    // The run's closing sample, saved beside its metrics, is what the checkpoint writes after a
    // newline with the job's seed at orch sample's temperature.
    assert_eq!(
        std::fs::read_to_string(out.join("sample.txt")).unwrap(),
        closing
    );
    let newline = model
        .vocab()
        .unwrap()
        .encode("\n", orch_data::Unknown::Error, "prompt")
        .unwrap();
    let again = model
        .sample(
            &newline,
            &SampleOptions {
                tokens: 200,
                temperature: orch_trainer::SAMPLE_TEMPERATURE,
                top_k: None,
                seed: 5,
            },
        )
        .unwrap();
    assert_eq!(again.text, closing);
    let vocab = model.vocab().unwrap().clone();
    let prompt = vocab
        .encode("ROMEO:\n", orch_data::Unknown::Error, "prompt")
        .unwrap();
    let sample = |model: &mut Model, seed, temperature| {
        model
            .sample(
                &prompt,
                &SampleOptions {
                    tokens: 40,
                    temperature,
                    top_k: Some(10),
                    seed,
                },
            )
            .unwrap()
    };
    let a = sample(&mut model, 1, 0.8);
    assert_eq!(a.tokens.len(), 40);
    assert_eq!(a.next_logits.len(), 73);
    assert_eq!(a.text, vocab.decode(&a.tokens));
    assert_eq!(
        a,
        sample(&mut model, 1, 0.8),
        "the same seed, the same text"
    );
    assert_ne!(
        a.tokens,
        sample(&mut model, 2, 0.8).tokens,
        "another seed, another text"
    );
    let greedy = sample(&mut model, 3, 0.0);
    assert_eq!(
        greedy,
        sample(&mut model, 4, 0.0),
        "temperature 0 draws nothing"
    );
    // More context than the block: only the last 16 tokens are fed.
    let long: Vec<u32> = prompt.iter().cycle().take(50).copied().collect();
    let out = model
        .sample(
            &long,
            &SampleOptions {
                tokens: 3,
                temperature: 0.0,
                top_k: None,
                seed: 0,
            },
        )
        .unwrap();
    assert_eq!(out.tokens.len(), 3);
}

#[test]
fn a_text_run_asked_for_no_sample_writes_none() {
    let dir = tempfile::tempdir().unwrap();
    let job = gpt_job(
        dir.path(),
        "steps = 2\nbatch_size = 4\nsample_tokens = 0",
        "",
        "",
    );
    // A sample an earlier run left in the folder is not this run's: it goes.
    std::fs::create_dir_all(&spec(&job).out).unwrap();
    std::fs::write(spec(&job).out.join("sample.txt"), "an earlier run's").unwrap();
    let summary = run(&job, &cpu(), &options()).unwrap();
    assert_eq!(summary.sample, None);
    assert!(!spec(&job).out.join("sample.txt").exists());
}

#[test]
fn four_sim_replicas_with_dropout_match_one_replica_after_20_steps() {
    let train = "steps = 20\nbatch_size = 8";
    // Without biases, as nanoGPT's CPU run: the key projection's bias gets a gradient that is
    // zero but for rounding (softmax ignores a constant added to a row of scores), which Adam
    // turns into steps of +-lr in whatever direction the rounding points, so runs that round
    // differently (4 replicas summing in another order) end apart there by about 1e-6
    // absolute (measured: 2.4e-6, everything else within 1e-8).
    let config = "dropout = 0.1";
    let one_dir = tempfile::tempdir().unwrap();
    let one = gpt_job(one_dir.path(), train, config, "");
    run(&one, &cpu(), &options()).unwrap();

    let four_dir = tempfile::tempdir().unwrap();
    let four = gpt_job(four_dir.path(), train, config, "");
    let (devices, pools) = sims(4, 256 << 20);
    let summary = run(&four, &devices, &options()).unwrap();
    assert_eq!((summary.steps, summary.replicas), (20, 4));
    let diff = max_relative_difference(&final_params(&one), &final_params(&four));
    assert!(diff < 1e-4, "parameters differ by {diff} (relative)");
    for pool in pools {
        assert_eq!(pool.in_use(), 0, "every tensor of the run is freed");
    }

    // And dropout did something: without it the run ends elsewhere.
    let plain_dir = tempfile::tempdir().unwrap();
    let plain = gpt_job(plain_dir.path(), train, "dropout = 0.0", "");
    run(&plain, &cpu(), &options()).unwrap();
    let diff = max_relative_difference(&final_params(&one), &final_params(&plain));
    assert!(diff > 1e-3, "dropout changed nothing ({diff})");
}

#[test]
fn a_quota_too_small_for_the_activations_fails_at_the_step_with_sizes() {
    let dir = tempfile::tempdir().unwrap();
    // The parameters (about 60 kB with Adam's moments) fit in 600 kB; a step's activations
    // at batch 64 (attention probabilities alone are 64 x 2 x 16 x 16 floats a layer, and every
    // op's output is kept for backward) do not.
    let job = gpt_job(
        dir.path(),
        "steps = 5\nbatch_size = 64",
        "",
        "memory_limit = \"600KB\"",
    );
    let err = run(&job, &cpu(), &options()).unwrap_err().to_string();
    assert!(err.contains("out of memory"), "{err}");
    assert!(err.contains("requested") && err.contains("limit"), "{err}");
    assert!(err.contains("step 1"), "the first step: {err}");
}
