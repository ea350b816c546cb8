//! `orch run` of a `[train]` job: a Wasm trainer on the leased devices, its output, `--resume`,
//! and how failures exit.

use crate::*;
use std::path::PathBuf;
use std::process::Output;

fn scratch(tag: &str) -> PathBuf {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let dir = std::env::temp_dir().join(format!("orch-train-{tag}-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Writes `dir/job.toml`: `gpus` devices, the digits data (as its own test set), `train` lines.
fn write_job(dir: &Path, gpus: u32, train: &str) -> PathBuf {
    let digits = root().join("examples/digits/data/digits.csv.gz");
    let text = format!(
        "[job]\nname = \"digits\"\n[resources]\ngpus = {gpus}\nmemory_limit = \"256MiB\"\n[train]\n{train}\n[train.data]\nformat = \"csv\"\ntrain = \"{d}\"\ntest = \"{d}\"\nscale = 16\n",
        d = digits.display()
    );
    let path = dir.join("job.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// `orch ARGS` on the 8-GPU sim with `dir/state` as the state folder and a shared cache.
fn orch_in(dir: &Path, args: &[&str]) -> Output {
    let sim = lab_sim();
    let state = dir.join("state").display().to_string();
    let cache = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("orch-cli-cache")
        .display()
        .to_string();
    orch(
        args,
        &[
            ("ORCH_DEVICES", &sim),
            ("ORCH_STATE_DIR", &state),
            ("ORCH_CACHE_DIR", &cache),
        ],
    )
}

fn no_leases_left(dir: &Path) {
    let out = orch_in(dir, &["leases", "--json"]);
    assert_eq!(stdout(&out).trim(), "[]", "{}", stderr(&out));
}

#[test]
fn a_train_job_runs_data_parallel_on_sim_gpus_and_resumes() {
    let dir = scratch("dp");
    let train = "plugin = \"mlp\"\nepochs = 1\nbatch_size = 64\nseed = 5\n[train.config]\nhidden = \"32\"\nlr = 0.1";
    let job = write_job(&dir, 2, train);
    let out = orch_in(&dir, &["run", job.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("2 replica(s) on sim:"), "{text}");
    assert!(
        text.contains("epoch 1/1: train loss") && text.contains("test accuracy"),
        "{text}"
    );
    let run = dir.join("runs/digits");
    for file in [
        "metrics.jsonl",
        "plot.svg",
        "checkpoint/model.safetensors",
        "checkpoint/state.json",
    ] {
        assert!(run.join(file).is_file(), "{file} written");
    }
    no_leases_left(&dir);

    // One more epoch, from the checkpoint.
    write_job(&dir, 2, &train.replace("epochs = 1", "epochs = 2"));
    let out = orch_in(&dir, &["run", job.to_str().unwrap(), "--resume"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains("resuming after step 29") && text.contains("epoch 2/2: train loss"),
        "{text}"
    );
    assert!(
        !text.contains("epoch 1/2:"),
        "epoch 1 is not trained again: {text}"
    );
    no_leases_left(&dir);
}

#[test]
fn bad_trainers_and_bad_flags_exit_with_a_clear_reason() {
    let dir = scratch("bad");
    let job = write_job(&dir, 1, "plugin = \"nope\"\nepochs = 1\nbatch_size = 64");
    let out = orch_in(&dir, &["run", job.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("unknown built-in trainer `nope`"),
        "{}",
        stderr(&out)
    );

    let fixture = std::path::Path::new(orch_trainer::TRAINER_WASM_DIR).join("trainer_fixture.wasm");
    let trap = format!(
        "plugin = \"{}\"\nepochs = 1\nbatch_size = 64\n[train.config]\nmode = \"trap\"\nat = 2",
        fixture.display()
    );
    let job = write_job(&dir, 1, &trap);
    let out = orch_in(&dir, &["run", job.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("trainer `trainer_fixture` crashed at step 2")
            && err.contains("deliberate panic"),
        "{err}"
    );
    no_leases_left(&dir);

    let out = orch_in(&dir, &["run", "--resume", "--gpus", "1", "--", "true"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
}

#[test]
fn bad_data_or_plugin_fails_before_any_device_is_leased() {
    let dir = scratch("preflight");
    let job = dir.join("job.toml");
    std::fs::write(dir.join("fake.wasm"), "not a component").unwrap();
    for (what, train) in [
        (
            "data",
            "plugin = \"mlp\"\nepochs = 1\nbatch_size = 64\n[train.data]\nformat = \"mnist-idx\"\ntrain = \"nowhere\"",
        ),
        (
            "plugin",
            "plugin = \"fake.wasm\"\nepochs = 1\nbatch_size = 64\n[train.data]\nformat = \"mnist-idx\"\ntrain = \"nowhere\"",
        ),
    ] {
        std::fs::write(
            &job,
            format!("[job]\nname = \"early\"\n[resources]\ngpus = 1\n[train]\n{train}\n"),
        )
        .unwrap();
        let out = orch_in(&dir, &["run", job.to_str().unwrap()]);
        let said = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "bad {what}: {said}");
        assert!(
            !said.contains(": lease "),
            "bad {what} is found before placement, so no device was leased: {said}"
        );
        let expected = if what == "data" {
            "no MNIST file found"
        } else {
            "is not a trainer component"
        };
        assert!(said.contains(expected), "bad {what}: {said}");
    }
    no_leases_left(&dir);
}

/// Writes `dir/gpt.toml`: a small character GPT on the bundled Shakespeare.
fn write_gpt_job(dir: &Path, steps: u32) -> PathBuf {
    let data = root().join("examples/gpt/data");
    let text = format!(
        "[job]\nname = \"tiny-gpt\"\n[resources]\ngpus = 1\n[train]\nplugin = \"gpt\"\nsteps = {steps}\nbatch_size = 8\neval_every = 10\neval_batches = 2\n[train.data]\nformat = \"text\"\ntrain = \"{}\"\nval = \"{}\"\nblock_size = 16\n[train.config]\nlayers = 1\nheads = 2\nembedding = 32\nwarmup_steps = 2\nlr = 3e-3\n",
        data.join("train.txt.gz").display(),
        data.join("val.txt.gz").display()
    );
    let path = dir.join("gpt.toml");
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn predict_and_sample_use_the_checkpoint_of_a_text_job() {
    let dir = scratch("sample");
    let job = write_gpt_job(&dir, 20);
    let job = job.to_str().unwrap();

    // Before training there is nothing to load: a sentence and exit 2.
    let out = orch_in(&dir, &["sample", job]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("no checkpoint in"),
        "{}",
        stderr(&out)
    );

    let out = orch_in(&dir, &["run", job]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("step 10/20: eval loss"), "{text}");
    assert!(
        text.contains("; eval loss"),
        "the summary has the loss: {text}"
    );
    // The run ends with a sample of 200 characters, saved beside its metrics; `orch sample`
    // with the job's seed (0) and as many characters writes it again from the checkpoint.
    let saved = std::fs::read_to_string(dir.join("runs/tiny-gpt/sample.txt")).unwrap();
    assert_eq!(saved.chars().count(), 200, "{saved:?}");
    assert!(
        text.contains("sample, 200 characters at temperature 0.8 with seed 0")
            && text.contains(saved.trim_end_matches('\n')),
        "{text}"
    );
    let out = orch_in(&dir, &["sample", job, "--tokens", "200", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let again: serde_json::Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert_eq!(again["text"], saved.as_str());

    // `orch predict` scores the same windows the run's last evaluation did.
    let metrics = std::fs::read_to_string(dir.join("runs/tiny-gpt/metrics.jsonl")).unwrap();
    let last_eval: serde_json::Value = metrics
        .lines()
        .rfind(|l| l.contains("\"kind\":\"eval\""))
        .map(|l| serde_json::from_str(l).unwrap())
        .expect("an eval record");
    let out = orch_in(&dir, &["predict", "--json", job]);
    assert!(out.status.success(), "{}", stderr(&out));
    let predicted: serde_json::Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert_eq!(predicted["checkpoint_step"], 20);
    assert_eq!(predicted["rows"], 16);
    assert!(predicted["eval_accuracy"].is_null(), "text has no accuracy");
    let (a, b) = (
        predicted["eval_loss"].as_f64().unwrap(),
        last_eval["eval_loss"].as_f64().unwrap(),
    );
    assert!((a - b).abs() < 1e-5, "predict {a}, the run {b}");

    // The same seed gives the same text; the text continues the prompt.
    let sample = |seed: &str| {
        let out = orch_in(
            &dir,
            &[
                "sample", job, "--prompt", "KING:", "--tokens", "30", "--seed", seed, "--json",
            ],
        );
        assert!(out.status.success(), "{}", stderr(&out));
        serde_json::from_str::<serde_json::Value>(stdout(&out).trim()).unwrap()
    };
    let (one, again) = (sample("7"), sample("7"));
    assert_eq!(one["text"], again["text"]);
    assert_eq!(one["prompt"], "KING:");
    assert_eq!(one["tokens"].as_array().unwrap().len(), 30);
    assert_eq!(one["next_logits"].as_array().unwrap().len(), 73);
    let out = orch_in(
        &dir,
        &["sample", job, "--prompt", "KING:", "--tokens", "10"],
    );
    assert!(stdout(&out).starts_with("KING:"), "{}", stdout(&out));

    // A prompt character the vocabulary lacks, and a job that is not text, are refused.
    let out = orch_in(&dir, &["sample", job, "--prompt", "caf\u{e9}"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("not in the vocabulary"),
        "{}",
        stderr(&out)
    );
    let digits = write_job(
        &dir,
        1,
        "plugin = \"mlp\"\nsteps = 3\nbatch_size = 64\n[train.config]\nhidden = \"8\"",
    );
    let out = orch_in(&dir, &["run", digits.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = orch_in(&dir, &["sample", digits.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("use orch predict"),
        "{}",
        stderr(&out)
    );
    let out = orch_in(&dir, &["predict", digits.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("checkpoint of step 3: eval loss"),
        "{}",
        stdout(&out)
    );
    no_leases_left(&dir);
}
