//! A trained model outside a run: the job's trainer loaded with its checkpoint, to score the
//! evaluation data (`orch predict`), to compute outputs for given inputs (`inference.predict`)
//! and to generate text (`orch sample`).
//!
//! Design decision: one replica on one device, built exactly as a run builds its replica 0
//! (`init-replica` with the job's config and the run's `run-info`, then the checkpoint's
//! parameters and buffers), so what it computes is what the run saved. Evaluation calls the
//! trainer's own `eval-step` on the run's evaluation batches (the same windows for text), so
//! its loss is the loss the run reported. `predict` is an optional export of contract 0.3.0
//! (world `predicting-trainer`): a trainer without it can still be evaluated, and is refused
//! with a sentence when asked to predict. Sampling is the host's: the trainer gives logits,
//! orch picks the tokens (temperature, top-k, a seeded generator), so every trainer samples
//! alike.

use crate::checkpoint::{self, Checkpoint};
use crate::collective::Collective;
use crate::data::Data;
use crate::data::{Schedule, eval_batches};
use crate::error::{Stage, TrainError, plugin_message};
use crate::host::{BatchSlot, DeviceSlot, Phase, ReplicaState, Shared};
use crate::job::{GrantedDevice, RunOptions, TrainJob, eval_batch_size};
use crate::prepare::Prepared;
use crate::progress::{ProgressEvent, ProgressSink};
use crate::state::load;
use crate::world::{AnyTrainer, AnyTrainerPre};
use orch_data::{SplitMix64, Vocab};
use orch_host::{Limits, PluginState, Ticker};
use orch_tensor::Tensor;
use orch_wit::Version;
use orch_wit::predicting::exports::orch::plugin::inference::{Guest, GuestIndices};
use orch_wit::trainer::Trainer;
use orch_wit::trainer::exports::orch::plugin::training::StepInfo;
use orch_wit::trainer::orch::plugin::tensors::Tensor as WitTensor;
use orch_wit::v0_3::predicting::exports::orch::plugin::inference as v0_3_inference;
use orch_wit::v0_4::predicting::exports::orch::plugin::inference as v0_4_inference;
use std::sync::Arc;
use wasmtime::component::Resource;
use wasmtime::{Engine, Store};

/// Most values [`Model::predict`] copies out of the trainer's output (1 GiB of `f32`): a guest
/// can return an expanded view whose shape shows far more than it holds.
pub const MAX_PREDICT_VALUES: usize = 1 << 28;

/// What `predict` returned: the output tensor's shape and values, row-major.
#[derive(Debug, Clone, PartialEq)]
pub struct Prediction {
    pub shape: Vec<usize>,
    pub values: Vec<f32>,
}

/// The evaluation data scored by a checkpoint.
#[derive(Debug, Clone, PartialEq)]
pub struct Evaluation {
    /// Mean loss per row.
    pub loss: f64,
    /// Rows predicted right (`None` for text, which has no accuracy).
    pub accuracy: Option<f64>,
    pub rows: u64,
    pub batches: usize,
}

/// How `orch sample` picks each next token.
#[derive(Debug, Clone, PartialEq)]
pub struct SampleOptions {
    /// Tokens to generate.
    pub tokens: usize,
    /// Logits are divided by this; 0 picks the most likely token every time.
    pub temperature: f32,
    /// Only the `k` most likely tokens are drawn from (`None`: all).
    pub top_k: Option<usize>,
    pub seed: u64,
}

/// Text generated from a prompt.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// The generated tokens (the prompt left out), and as text.
    pub tokens: Vec<u32>,
    pub text: String,
    /// The logits the model gave for the token after the prompt.
    pub next_logits: Vec<f32>,
}

/// A trainer's `inference` export, by the version of the contract (the same function).
enum Inference {
    V0_3(v0_3_inference::Guest),
    V0_4(v0_4_inference::Guest),
    V0_5(Guest),
}

impl Inference {
    fn call_predict(
        &self,
        store: &mut Store<ReplicaState>,
        features: Resource<WitTensor>,
    ) -> wasmtime::Result<Result<Resource<WitTensor>, String>> {
        match self {
            Inference::V0_3(guest) => guest.call_predict(store, features),
            Inference::V0_4(guest) => guest.call_predict(store, features),
            Inference::V0_5(guest) => guest.call_predict(store, features),
        }
    }
}

/// The job's trainer with its checkpoint loaded, ready to evaluate, predict and sample.
pub struct Model {
    store: Store<ReplicaState>,
    trainer: AnyTrainer,
    inference: Option<Inference>,
    plugin: String,
    version: Version,
    limits: Limits,
    eval_batch: usize,
    eval_batches: Option<u32>,
    checkpoint: Option<u64>,
    vocab: Option<Vocab>,
    _ticker: Option<Ticker>,
}

/// What building a [`Model`] needs that a run has already: the plugin's name, the data, the
/// limits and the compiled trainer.
pub(crate) struct Parts<'a> {
    pub plugin: String,
    pub data: Data,
    pub limits: Limits,
    pub engine: &'a Engine,
    pub pre: &'a AnyTrainerPre,
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model")
            .field("plugin", &self.plugin)
            .field("checkpoint", &self.checkpoint)
            .finish_non_exhaustive()
    }
}

impl Model {
    /// Loads the job's trainer on `device`, with the parameters of the checkpoint in the job's
    /// output folder when there is one (else those `init-replica` made).
    pub fn load(
        job: &TrainJob<'_>,
        device: &GrantedDevice,
        options: &RunOptions,
    ) -> Result<Model, TrainError> {
        let prepared = Prepared::new(job, options)?;
        let ticker = prepared.start_ticker()?;
        let parts = Parts {
            plugin: prepared.plugin.clone(),
            data: prepared.data.clone(),
            limits: prepared.limits,
            engine: prepared.engine(),
            pre: prepared.pre(),
        };
        Model::with_parts(job, device, options, parts, Some(ticker))
    }

    /// [`Model::load`] from what a run has already read and compiled. `ticker`: the one that
    /// drives `engine`'s deadlines, when no other does (a second would halve them).
    pub(crate) fn with_parts(
        job: &TrainJob<'_>,
        device: &GrantedDevice,
        options: &RunOptions,
        parts: Parts<'_>,
        ticker: Option<Ticker>,
    ) -> Result<Model, TrainError> {
        let Parts {
            plugin,
            data,
            limits,
            engine,
            pre,
        } = parts;
        let failed = |message: String| TrainError::Failed {
            plugin: plugin.clone(),
            stage: Stage::Init,
            message,
        };
        let spec = job.spec;
        let schedule = Schedule {
            samples: data.train.len(),
            batch_size: spec.batch_size as usize,
            seed: spec.seed,
            epochs: spec.epochs,
            replicas: 1,
            steps: spec.steps,
            windows: data.train.is_text(),
        };
        let eval_batch = eval_batch_size(spec.batch_size, data.train.is_text());
        let data_vocab = data.vocab.clone();
        let shared = Arc::new(Shared {
            devices: DeviceSlot::of_devices(std::slice::from_ref(device), job.memory_limit)?,
            data,
            replicas: 1,
            seed: spec.seed,
            max_tensors: options.max_tensors,
            max_graph_nodes: options.max_graph_nodes,
            exchange_timeout: limits.deadline,
            grads: Collective::new(1),
            broadcast: Collective::new(1),
            checkpoints: Collective::new(1),
            stops: Collective::new(1),
        });
        let state = ReplicaState::new(PluginState::new(&plugin, &limits), Arc::clone(&shared), 0);
        let mut store = Store::new(engine, state);
        store.limiter(|s| &mut s.sandbox.limiter);
        store.set_hostcall_fuel(limits.memory_bytes.saturating_add(1 << 20));
        crate::host::arm_deadline(&mut store, limits.deadline);
        let engine_error = |e: wasmtime::Error| failed(plugin_message(&format!("{e:#}")));

        store.data_mut().phase = Phase::Init;
        let version = pre.version();
        let (trainer, inference) = match pre {
            AnyTrainerPre::V0_5(pre) => {
                let instance = pre
                    .instance_pre()
                    .instantiate(&mut store)
                    .map_err(engine_error)?;
                let trainer = Trainer::new(&mut store, &instance).map_err(engine_error)?;
                let inference = match GuestIndices::new(pre.instance_pre()) {
                    Ok(indices) => Some(Inference::V0_5(
                        indices.load(&mut store, &instance).map_err(engine_error)?,
                    )),
                    Err(_) => None,
                };
                (AnyTrainer::V0_5(trainer), inference)
            }
            AnyTrainerPre::V0_4(pre) => {
                let instance = pre
                    .instance_pre()
                    .instantiate(&mut store)
                    .map_err(engine_error)?;
                let trainer = orch_wit::v0_4::trainer::Trainer::new(&mut store, &instance)
                    .map_err(engine_error)?;
                let inference = match v0_4_inference::GuestIndices::new(pre.instance_pre()) {
                    Ok(indices) => Some(Inference::V0_4(
                        indices.load(&mut store, &instance).map_err(engine_error)?,
                    )),
                    Err(_) => None,
                };
                (AnyTrainer::V0_4(trainer), inference)
            }
            AnyTrainerPre::V0_3(pre) => {
                let instance = pre
                    .instance_pre()
                    .instantiate(&mut store)
                    .map_err(engine_error)?;
                let trainer = orch_wit::v0_3::trainer::Trainer::new(&mut store, &instance)
                    .map_err(engine_error)?;
                let inference = match v0_3_inference::GuestIndices::new(pre.instance_pre()) {
                    Ok(indices) => Some(Inference::V0_3(
                        indices.load(&mut store, &instance).map_err(engine_error)?,
                    )),
                    Err(_) => None,
                };
                (AnyTrainer::V0_3(trainer), inference)
            }
            older => (older.instantiate(&mut store).map_err(engine_error)?, None),
        };
        let info = crate::replica::run_info(&schedule, &shared.data, 0);
        trainer
            .init(&mut store, &spec.config, info)
            .map_err(engine_error)?
            .map_err(|m| failed(plugin_message(&m)))?;
        store.data_mut().phase = Phase::Idle;
        let saved = checkpoint::dir(&spec.out);
        let (checkpoint, vocab) = if saved.join("state.json").exists() {
            let checkpoint = Checkpoint::load(&saved)?;
            load(store.data_mut(), &checkpoint)?;
            let vocab = match &checkpoint.meta.vocab {
                Some(stored) => Some(Vocab::from_stored(stored).ok_or_else(|| {
                    TrainError::Checkpoint {
                        path: saved.join("state.json"),
                        reason: format!(
                            "its vocab {stored:?} is not `bytes` or `chars:` and sorted characters"
                        ),
                    }
                })?),
                None => data_vocab,
            };
            (Some(checkpoint.meta.step), vocab)
        } else {
            (None, data_vocab)
        };
        Ok(Model {
            store,
            trainer,
            inference,
            plugin,
            version,
            limits,
            eval_batch,
            eval_batches: spec.eval_batches,
            checkpoint,
            vocab,
            _ticker: ticker,
        })
    }

    /// The step of the checkpoint loaded (`None`: none was there; the parameters are the
    /// trainer's initial ones).
    pub fn checkpoint_step(&self) -> Option<u64> {
        self.checkpoint
    }

    /// Whether the trainer exports `predict` (contract 0.3.0's `predicting-trainer`).
    pub fn can_predict(&self) -> bool {
        self.inference.is_some()
    }

    /// Text: the vocabulary (the checkpoint's).
    pub fn vocab(&self) -> Option<&Vocab> {
        self.vocab.as_ref()
    }

    /// Text: the tokens of context the model takes (`block_size`).
    pub fn block_size(&self) -> Option<usize> {
        let data = &self.store.data().shared.data;
        data.train.is_text().then(|| data.train.feature_dim())
    }

    fn failed(&self, stage: Stage, message: String) -> TrainError {
        TrainError::Failed {
            plugin: self.plugin.clone(),
            stage,
            message,
        }
    }

    /// Scores the job's evaluation data (the batches, or text windows, of a run's
    /// evaluations) with the trainer's `eval-step`, autograd off.
    pub fn evaluate(&mut self) -> Result<Evaluation, TrainError> {
        let stage = Stage::Eval { epoch: 0 };
        let Some(eval) = self.store.data().shared.data.eval.clone() else {
            return Err(TrainError::Data(
                "the job has no evaluation data: give [train.data] test (or val)".into(),
            ));
        };
        let batches = eval_batches(&eval, self.eval_batch, self.eval_batches);
        let count = u32::try_from(batches.len()).unwrap_or(u32::MAX);
        let step = self.checkpoint.unwrap_or(0);
        let (mut loss_sum, mut correct, mut total) = (0.0f64, 0u64, 0u64);
        for (batch, ids) in batches.iter().enumerate() {
            let rows = ids.len() as u64;
            self.store.data_mut().phase = Phase::Eval(BatchSlot {
                indices: ids.clone(),
                global_rows: ids.len(),
                step,
                ..BatchSlot::default()
            });
            let info = StepInfo {
                step,
                epoch: 0,
                batch: u32::try_from(batch).unwrap_or(u32::MAX),
                batches: count,
            };
            crate::host::arm_deadline(&mut self.store, self.limits.deadline);
            let (store, trainer) = (&mut self.store, &self.trainer);
            let outcome = orch_tensor::no_grad(|| trainer.eval_step(store, info));
            self.store.data_mut().phase = Phase::Idle;
            let report = outcome
                .map_err(|e| self.failed(stage, plugin_message(&format!("{e:#}"))))?
                .map_err(|m| self.failed(stage, plugin_message(&m)))?;
            if u64::from(report.rows) != rows || u64::from(report.correct) > rows {
                return Err(self.failed(
                    stage,
                    format!(
                        "eval-step reported correct = {} of rows = {}, but its batch had {rows} rows",
                        report.correct, report.rows
                    ),
                ));
            }
            loss_sum += f64::from(report.loss) * rows as f64;
            correct += u64::from(report.correct);
            total += rows;
        }
        let text = eval.is_text();
        Ok(Evaluation {
            loss: loss_sum / total.max(1) as f64,
            accuracy: (!text).then(|| correct as f64 / total.max(1) as f64),
            rows: total,
            batches: batches.len(),
        })
    }

    /// The trainer's outputs for `features` (of `shape`), in eval mode; an output of more
    /// than [`MAX_PREDICT_VALUES`] values is an error, not copied.
    pub fn predict(
        &mut self,
        features: Vec<f32>,
        shape: &[usize],
    ) -> Result<Prediction, TrainError> {
        self.predict_at_most(features, shape, MAX_PREDICT_VALUES, None)
    }

    /// [`Model::predict`], with an error instead of a copy when the output holds more than
    /// `limit` values (an expanded view can show terabytes while holding a few bytes); `expect`
    /// names the shape the caller wants, for the error's text.
    fn predict_at_most(
        &mut self,
        features: Vec<f32>,
        shape: &[usize],
        limit: usize,
        expect: Option<&[usize]>,
    ) -> Result<Prediction, TrainError> {
        let stage = Stage::Predict;
        let Some(inference) = &self.inference else {
            let why = if self.version < Version::V0_3 {
                format!(
                    "the trainer implements contract {}; predict is an export of contract {} (world `predicting-trainer`)",
                    self.version,
                    Version::V0_3
                )
            } else {
                "the trainer does not export `orch:plugin/inference` (world `predicting-trainer`): it cannot predict".to_string()
            };
            return Err(self.failed(stage, why));
        };
        crate::host::arm_deadline(&mut self.store, self.limits.deadline);
        let state = self.store.data_mut();
        let fail = |m: String| TrainError::Failed {
            plugin: self.plugin.clone(),
            stage,
            message: m,
        };
        let pool = state
            .pool(None)
            .map_err(|e| fail(format!("the device: {e:?}")))?;
        let input = Tensor::from_vec(features, shape, &pool).map_err(|e| fail(e.to_string()))?;
        let handle = state
            .give(input)
            .map_err(|e| fail(format!("the features: {e:?}")))?;
        let output = orch_tensor::no_grad(|| inference.call_predict(&mut self.store, handle))
            .map_err(|e| fail(plugin_message(&format!("{e:#}"))))?
            .map_err(|m| fail(plugin_message(&m)))?;
        let state = self.store.data_mut();
        let tensor = state
            .tensor(&output)
            .map_err(|e| fail(format!("predict's result: {e:?}")))?;
        state
            .drop_tensor(output)
            .map_err(|e| fail(format!("{e:#}")))?;
        let values = tensor
            .shape()
            .iter()
            .try_fold(1usize, |n, &d| n.checked_mul(d));
        if values.is_none_or(|v| v > limit) {
            let want = match expect {
                Some(want) => format!("a tensor of shape {want:?} was expected"),
                None => format!("at most {limit} values are read back"),
            };
            return Err(fail(format!(
                "predict returned a tensor of shape {:?} for features {shape:?}, more values than the host copies ({want}): return the model's outputs for these features only",
                tensor.shape()
            )));
        }
        Ok(Prediction {
            shape: tensor.shape().to_vec(),
            values: tensor.to_vec().map_err(|e| fail(e.to_string()))?,
        })
    }

    /// Generates `options.tokens` tokens after `prompt` (token ids; at least one), feeding the
    /// model the last `block_size` tokens each time and drawing from its last position's
    /// logits.
    pub fn sample(
        &mut self,
        prompt: &[u32],
        options: &SampleOptions,
    ) -> Result<Sample, TrainError> {
        let stage = Stage::Predict;
        let (Some(block), Some(vocab)) = (self.block_size(), self.vocab.clone()) else {
            return Err(self.failed(
                stage,
                "sampling needs a text job ([train.data] format = \"text\")".into(),
            ));
        };
        if prompt.is_empty() {
            return Err(self.failed(stage, "the prompt has no tokens".into()));
        }
        let mut context: Vec<u32> = prompt.to_vec();
        let mut rng = SplitMix64(options.seed);
        let mut generated = Vec::with_capacity(options.tokens);
        let mut next_logits = Vec::new();
        for i in 0..=options.tokens {
            let window = &context[context.len().saturating_sub(block)..];
            let t = window.len();
            let features: Vec<f32> = window.iter().map(|&id| id as f32).collect();
            let classes = vocab.len();
            let out =
                self.predict_at_most(features, &[1, t], t * classes, Some(&[1, t, classes]))?;
            if out.shape != [1, t, classes] {
                return Err(self.failed(
                    stage,
                    format!(
                        "predict returned shape {:?} for tokens [1, {t}]; a text trainer returns logits [1, {t}, {classes}]",
                        out.shape
                    ),
                ));
            }
            let last = out.values[(t - 1) * classes..].to_vec();
            let used = i == 0 || i < options.tokens;
            if let Some((class, value)) = last.iter().enumerate().find(|(_, v)| !v.is_finite())
                && used
            {
                // Drawing from NaN or infinite logits would pick a token silently.
                return Err(self.failed(
                    stage,
                    format!(
                        "predict returned a non-finite logit ({value}) at [0, {}, {class}] of its [1, {t}, {classes}] logits, after {} generated tokens: its parameters or its forward pass give NaN or infinity there, and no token can be drawn from that",
                        t - 1,
                        generated.len()
                    ),
                ));
            }
            if i == 0 {
                next_logits = last.clone();
            }
            if i == options.tokens {
                break;
            }
            let token = pick(&last, options, &mut rng);
            generated.push(token);
            context.push(token);
        }
        Ok(Sample {
            text: vocab.decode(&generated),
            tokens: generated,
            next_logits,
        })
    }
}

/// Characters a text run's model writes at its end when the job does not say
/// (`[train] sample_tokens`).
pub const DEFAULT_SAMPLE_TOKENS: u64 = 200;

/// The temperature of the closing sample: `orch sample`'s default, so that
/// `orch sample JOB --tokens N --seed SEED` writes the same text from the same checkpoint.
pub const SAMPLE_TEMPERATURE: f32 = 0.8;

/// The closing sample of a text run: the trainer with the checkpoint the run just saved, on the
/// CPU (built from the run's own compiled trainer and data, nothing read again), generates `sample_tokens` characters after a newline, drawn with the job's seed. It is
/// reported as [`ProgressEvent::Sample`] and saved as `sample.txt` in the output folder. The
/// run has succeeded by then, so a sample that cannot be made is a warning, not a failure; a
/// trainer without `predict` makes none, with a warning only where the job asked for one.
pub(crate) fn closing_sample(
    job: &TrainJob<'_>,
    options: &RunOptions,
    parts: Parts<'_>,
) -> Option<String> {
    let spec = job.spec;
    let path = spec.out.join("sample.txt");
    // A sample left by an earlier run in this folder is not this run's.
    let _ = std::fs::remove_file(&path);
    let tokens = spec.sample_tokens.unwrap_or(DEFAULT_SAMPLE_TOKENS);
    if tokens == 0 {
        return None;
    }
    let warn = |message: String| {
        ProgressSink::send(
            options.progress.as_ref(),
            ProgressEvent::Log {
                who: job.name.to_string(),
                warning: true,
                message,
            },
        );
        None
    };
    // The run's ticker still drives the engine's deadlines.
    let mut model = match Model::with_parts(job, &GrantedDevice::cpu(), options, parts, None) {
        Ok(model) => model,
        Err(e) => {
            return warn(format!(
                "no closing sample: the checkpoint did not load ({e})"
            ));
        }
    };
    if !model.can_predict() {
        if spec.sample_tokens.is_some() {
            return warn(format!(
                "no closing sample: trainer {} does not export predict (contract 0.3.0's world `predicting-trainer`)",
                spec.plugin
            ));
        }
        return None;
    }
    let Some(prompt) = model
        .vocab()
        .and_then(|v| v.encode("\n", orch_data::Unknown::Error, "the prompt").ok())
    else {
        return warn(
            "no closing sample: the vocabulary has no newline to start from; use `orch sample --prompt`"
                .into(),
        );
    };
    let sampled = model.sample(
        &prompt,
        &SampleOptions {
            tokens: usize::try_from(tokens).unwrap_or(usize::MAX),
            temperature: SAMPLE_TEMPERATURE,
            top_k: None,
            seed: spec.seed,
        },
    );
    let sample = match sampled {
        Ok(sample) => sample,
        Err(e) => return warn(format!("no closing sample: {e}")),
    };
    if let Err(e) = orch_core::fsutil::write_atomic(&path, sample.text.as_bytes()) {
        warn(format!(
            "the closing sample was not saved in {}: {e}",
            path.display()
        ));
    }
    ProgressSink::send(
        options.progress.as_ref(),
        ProgressEvent::Sample {
            text: sample.text.clone(),
            tokens,
            temperature: SAMPLE_TEMPERATURE,
            seed: spec.seed,
            path,
        },
    );
    Some(sample.text)
}

/// The next token from `logits`: the most likely at temperature 0, else a draw from the
/// softmax of `logits / temperature` over the `top_k` largest.
fn pick(logits: &[f32], options: &SampleOptions, rng: &mut SplitMix64) -> u32 {
    let argmax = || {
        logits
            .iter()
            .enumerate()
            .fold((0, f32::NEG_INFINITY), |best, (i, &v)| {
                if v > best.1 { (i, v) } else { best }
            })
            .0 as u32
    };
    if options.temperature <= 0.0 {
        return argmax();
    }
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
    order.truncate(options.top_k.unwrap_or(logits.len()).clamp(1, logits.len()));
    let top = f64::from(logits[order[0]]);
    let weights: Vec<f64> = order
        .iter()
        .map(|&i| ((f64::from(logits[i]) - top) / f64::from(options.temperature)).exp())
        .collect();
    let total: f64 = weights.iter().sum();
    if !total.is_finite() || total <= 0.0 {
        return argmax();
    }
    let mut draw = rng.next_f64() * total;
    for (&i, w) in order.iter().zip(&weights) {
        if draw < *w {
            return i as u32;
        }
        draw -= w;
    }
    order[order.len() - 1] as u32
}

/// The trainer's outputs for `features` (of `shape`), on `devices[0]`, with the parameters of
/// the checkpoint in the job's output folder when there is one (else those `init-replica`
/// made).
pub fn predict(
    job: &TrainJob<'_>,
    devices: &[GrantedDevice],
    options: &RunOptions,
    features: Vec<f32>,
    shape: &[usize],
) -> Result<Prediction, TrainError> {
    let first = devices
        .first()
        .ok_or_else(|| TrainError::Setup("predict needs a device".into()))?;
    Model::load(job, first, options)?.predict(features, shape)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(temperature: f32, top_k: Option<usize>) -> SampleOptions {
        SampleOptions {
            tokens: 1,
            temperature,
            top_k,
            seed: 1,
        }
    }

    #[test]
    fn temperature_zero_is_argmax_and_top_k_limits_the_draw() {
        let logits = [0.0, 3.0, 1.0, 2.9];
        let mut rng = SplitMix64(0);
        assert_eq!(pick(&logits, &options(0.0, None), &mut rng), 1);
        for _ in 0..200 {
            let t = pick(&logits, &options(1.0, Some(2)), &mut rng);
            assert!(t == 1 || t == 3, "{t}");
        }
        let mut counts = [0usize; 4];
        for _ in 0..2000 {
            counts[pick(&logits, &options(1.0, None), &mut rng) as usize] += 1;
        }
        // softmax([0, 3, 1, 2.9]) = [0.02, 0.47, 0.06, 0.43]
        assert!(
            counts[1] > 850 && counts[3] > 750 && counts[0] < 100,
            "{counts:?}"
        );
    }
}
