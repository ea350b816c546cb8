//! `orch predict` and `orch sample`: a `[train]` job's checkpoint put to use, on the CPU.
//!
//! Both load the job's trainer with the checkpoint in its output folder (orch-trainer's
//! [`Model`]). They take no lease: they compute on the host's CPU, as an evaluation or a
//! sample is small next to the training, and a checkpoint is plain host data.

use crate::cli::{PredictArgs, SampleArgs};
use crate::failure::{CmdResult, Failure};
use orch_core::ByteSize;
use orch_core::job::{JobSpec, TrainSpec, Work};
use orch_trainer::{
    GrantedDevice, Model, RunOptions, SampleOptions, TrainError, TrainJob, checkpoint,
};
use serde::Serialize;
use std::path::Path;

fn read_train_job(path: &Path) -> Result<(JobSpec, TrainSpec), Failure> {
    let job = orch_core::job::read(path).map_err(Failure::bad_input)?;
    let Work::Train(spec) = &job.work else {
        return Err(Failure::bad_input_msg(format!(
            "{}: not a [train] job; orch predict and orch sample use a trainer's checkpoint",
            path.display()
        )));
    };
    let spec = spec.clone();
    Ok((job, spec))
}

/// The job's trainer with its checkpoint, on the CPU; no checkpoint is bad input.
fn load(job: &JobSpec, spec: &TrainSpec) -> Result<Model, Failure> {
    let dir = checkpoint::dir(&spec.out);
    if !dir.join("state.json").is_file() {
        return Err(Failure::bad_input_msg(format!(
            "job {}: no checkpoint in {}; train it first with `orch run {}`",
            job.name,
            dir.display(),
            job.path.display()
        )));
    }
    let train_job = TrainJob {
        name: &job.name,
        spec,
        memory_limit: job.resources.memory_limit.map(ByteSize::bytes),
    };
    let cpu = GrantedDevice::cpu();
    Model::load(&train_job, &cpu, &RunOptions::default()).map_err(trainer_failure)
}

fn trainer_failure(e: TrainError) -> Failure {
    if e.is_bad_input() {
        Failure::bad_input(e)
    } else {
        Failure::failed(e)
    }
}

#[derive(Serialize)]
struct PredictJson<'a> {
    job: &'a str,
    checkpoint_step: Option<u64>,
    eval_loss: f64,
    eval_accuracy: Option<f64>,
    rows: u64,
    batches: usize,
}

pub fn predict(args: &PredictArgs) -> CmdResult {
    let (job, spec) = read_train_job(&args.job)?;
    let mut model = load(&job, &spec)?;
    let eval = model.evaluate().map_err(trainer_failure)?;
    let step = model.checkpoint_step();
    if args.json {
        let value = PredictJson {
            job: &job.name,
            checkpoint_step: step,
            eval_loss: eval.loss,
            eval_accuracy: eval.accuracy,
            rows: eval.rows,
            batches: eval.batches,
        };
        println!(
            "{}",
            serde_json::to_string(&value).map_err(Failure::failed)?
        );
        return Ok(());
    }
    let accuracy = eval
        .accuracy
        .map_or_else(String::new, |a| format!(", accuracy {:.2}%", a * 100.0));
    println!(
        "{}: checkpoint of step {}: eval loss {:.4}{accuracy} over {} rows ({} batches)",
        job.name,
        step.unwrap_or(0),
        eval.loss,
        eval.rows,
        eval.batches
    );
    Ok(())
}

#[derive(Serialize)]
struct SampleJson<'a> {
    job: &'a str,
    checkpoint_step: Option<u64>,
    prompt: &'a str,
    text: &'a str,
    tokens: &'a [u32],
    next_logits: &'a [f32],
}

pub fn sample(args: &SampleArgs) -> CmdResult {
    if !(args.temperature.is_finite() && args.temperature >= 0.0) {
        return Err(Failure::bad_input_msg(format!(
            "--temperature {} is impossible: give 0 (always the most likely token) or more",
            args.temperature
        )));
    }
    if args.top_k == Some(0) {
        return Err(Failure::bad_input_msg(
            "--top-k 0 leaves no token to draw: give at least 1, or leave it out",
        ));
    }
    let (job, spec) = read_train_job(&args.job)?;
    let mut model = load(&job, &spec)?;
    let Some(vocab) = model.vocab().cloned() else {
        return Err(Failure::bad_input_msg(format!(
            "{}: orch sample generates text, and this job's data is not text ([train.data] format = \"text\"); use orch predict",
            job.path.display()
        )));
    };
    let prompt = args.prompt.clone().unwrap_or_else(|| "\n".to_string());
    let ids = vocab
        .encode(&prompt, orch_data::Unknown::Error, "the prompt")
        .map_err(Failure::bad_input_msg)?;
    if ids.is_empty() {
        return Err(Failure::bad_input_msg(
            "the prompt is empty: give --prompt TEXT with at least one character",
        ));
    }
    let options = SampleOptions {
        tokens: args.tokens,
        temperature: args.temperature,
        top_k: args.top_k,
        seed: args.seed,
    };
    let sample = model.sample(&ids, &options).map_err(trainer_failure)?;
    if args.json {
        let value = SampleJson {
            job: &job.name,
            checkpoint_step: model.checkpoint_step(),
            prompt: &prompt,
            text: &sample.text,
            tokens: &sample.tokens,
            next_logits: &sample.next_logits,
        };
        println!(
            "{}",
            serde_json::to_string(&value).map_err(Failure::failed)?
        );
    } else {
        println!("{prompt}{}", sample.text);
    }
    Ok(())
}
