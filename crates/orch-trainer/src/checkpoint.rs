//! Checkpoints: `model.safetensors` (the parameters by name), `optimizer.safetensors` (the
//! optimizers' state tensors) and `state.json` (step, data position, optimizer kinds, learning
//! rates and step counts, and what the run was, to refuse a resume that cannot continue it).
//!
//! Files are written to temporary names and renamed, `state.json` last: a checkpoint is the
//! three files whose step agrees, and a crash mid-write leaves the previous one readable.

use crate::safetensors::{NamedTensor, decode, encode};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub const FORMAT: &str = "orch-checkpoint/1";

/// One optimizer's state for one parameter: its tensors (`momentum`, or `m` and `v`) and
/// Adam's step count. Empty before the parameter's first update.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ParamState {
    pub tensors: Vec<(String, Vec<f32>)>,
    pub steps: Option<u32>,
}

/// An optimizer as a checkpoint holds it.
#[derive(Debug, Clone, PartialEq)]
pub struct OptimizerState {
    /// `sgd` or `adam`.
    pub kind: String,
    pub lr: f32,
    /// The parameters it updates, by name, and their state in the same order.
    pub params: Vec<String>,
    pub state: Vec<ParamState>,
}

/// Everything needed to continue a run where it was.
#[derive(Debug, Clone, PartialEq)]
pub struct Checkpoint {
    pub meta: Meta,
    pub params: Vec<NamedTensor>,
    pub optimizers: Vec<OptimizerState>,
}

/// `state.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Meta {
    pub format: String,
    pub job: String,
    pub plugin: String,
    pub plugin_sha256: String,
    /// Training steps done.
    pub step: u64,
    /// The data position of the next step: epoch and batch within it. A checkpoint at the end
    /// of an epoch is taken after that epoch's evaluation, so `batch` 0 means it is done.
    pub epoch: u32,
    pub batch: u32,
    pub batch_size: u32,
    pub seed: u64,
    pub train_samples: u64,
    pub replicas: u32,
    pub optimizers: Vec<OptimizerMeta>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OptimizerMeta {
    pub kind: String,
    pub lr: f32,
    pub params: Vec<String>,
    /// Adam's per-parameter step counts (`null` before a parameter's first update).
    pub steps: Vec<Option<u32>>,
}

/// The folder a run's checkpoint lives in.
pub fn dir(out: &Path) -> PathBuf {
    out.join("checkpoint")
}

fn io_error(path: &Path, e: impl std::fmt::Display) -> crate::TrainError {
    crate::TrainError::Checkpoint {
        path: path.to_path_buf(),
        reason: e.to_string(),
    }
}

impl Checkpoint {
    /// Writes the checkpoint into `dir` (created if needed).
    pub fn save(&self, dir: &Path) -> Result<(), crate::TrainError> {
        std::fs::create_dir_all(dir).map_err(|e| io_error(dir, e))?;
        let step = BTreeMap::from([("step".to_string(), self.meta.step.to_string())]);
        let mut state_tensors = Vec::new();
        for (i, opt) in self.optimizers.iter().enumerate() {
            for (param, state) in opt.params.iter().zip(&opt.state) {
                for (slot, data) in &state.tensors {
                    state_tensors.push(NamedTensor {
                        name: format!("optimizer.{i}.{param}.{slot}"),
                        shape: vec![data.len()],
                        data: data.clone(),
                    });
                }
            }
        }
        let mut meta = self.meta.clone();
        meta.optimizers = self
            .optimizers
            .iter()
            .map(|o| OptimizerMeta {
                kind: o.kind.clone(),
                lr: o.lr,
                params: o.params.clone(),
                steps: o.state.iter().map(|s| s.steps).collect(),
            })
            .collect();
        let files = [
            ("model.safetensors", encode(&self.params, &step)),
            ("optimizer.safetensors", encode(&state_tensors, &step)),
            (
                "state.json",
                serde_json::to_vec_pretty(&meta).map_err(|e| e.to_string()),
            ),
        ];
        for (name, bytes) in files {
            let path = dir.join(name);
            let bytes = bytes.map_err(|e| io_error(&path, e))?;
            let tmp = dir.join(format!(".{name}.tmp"));
            std::fs::write(&tmp, bytes).map_err(|e| io_error(&tmp, e))?;
            std::fs::rename(&tmp, &path).map_err(|e| io_error(&path, e))?;
        }
        Ok(())
    }

    /// Reads the checkpoint in `dir`, checking its files belong together.
    pub fn load(dir: &Path) -> Result<Checkpoint, crate::TrainError> {
        let state_path = dir.join("state.json");
        let text = std::fs::read(&state_path).map_err(|e| io_error(&state_path, e))?;
        let meta: Meta = serde_json::from_slice(&text).map_err(|e| io_error(&state_path, e))?;
        if meta.format != FORMAT {
            return Err(io_error(
                &state_path,
                format!("format `{}`, expected `{FORMAT}`", meta.format),
            ));
        }
        let read = |name: &str| -> Result<Vec<NamedTensor>, crate::TrainError> {
            let path = dir.join(name);
            let bytes = std::fs::read(&path).map_err(|e| io_error(&path, e))?;
            let (tensors, file_meta) = decode(&bytes).map_err(|e| io_error(&path, e))?;
            if file_meta.get("step") != Some(&meta.step.to_string()) {
                return Err(io_error(
                    &path,
                    format!("not from step {} (state.json's)", meta.step),
                ));
            }
            Ok(tensors)
        };
        let params = read("model.safetensors")?;
        let mut state_tensors: BTreeMap<String, Vec<f32>> = read("optimizer.safetensors")?
            .into_iter()
            .map(|t| (t.name, t.data))
            .collect();
        let optimizers = meta
            .optimizers
            .iter()
            .enumerate()
            .map(|(i, o)| OptimizerState {
                kind: o.kind.clone(),
                lr: o.lr,
                params: o.params.clone(),
                state: o
                    .params
                    .iter()
                    .zip(&o.steps)
                    .map(|(param, steps)| {
                        let prefix = format!("optimizer.{i}.{param}.");
                        let mut tensors = Vec::new();
                        for slot in ["momentum", "m", "v"] {
                            if let Some(data) = state_tensors.remove(&format!("{prefix}{slot}")) {
                                tensors.push((slot.to_string(), data));
                            }
                        }
                        ParamState {
                            tensors,
                            steps: *steps,
                        }
                    })
                    .collect(),
            })
            .collect();
        Ok(Checkpoint {
            meta,
            params,
            optimizers,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn saves_and_loads_with_optimizer_state() {
        let dir = tempfile::tempdir().unwrap();
        let checkpoint = Checkpoint {
            meta: Meta {
                format: FORMAT.into(),
                job: "j".into(),
                plugin: "mlp".into(),
                plugin_sha256: "00".into(),
                step: 7,
                epoch: 1,
                batch: 2,
                batch_size: 32,
                seed: 3,
                train_samples: 100,
                replicas: 2,
                optimizers: Vec::new(),
            },
            params: vec![NamedTensor {
                name: "w".into(),
                shape: vec![2],
                data: vec![1.0, 2.0],
            }],
            optimizers: vec![OptimizerState {
                kind: "adam".into(),
                lr: 0.01,
                params: vec!["w".into()],
                state: vec![ParamState {
                    tensors: vec![("m".into(), vec![0.5, 0.5]), ("v".into(), vec![0.1, 0.2])],
                    steps: Some(7),
                }],
            }],
        };
        checkpoint.save(dir.path()).unwrap();
        let back = Checkpoint::load(dir.path()).unwrap();
        assert_eq!(back.params, checkpoint.params);
        assert_eq!(back.optimizers, checkpoint.optimizers);
        assert_eq!(
            (back.meta.step, back.meta.epoch, back.meta.batch),
            (7, 1, 2)
        );

        // A model file from another step is refused.
        let mut other = checkpoint.clone();
        other.meta.step = 8;
        other.save(dir.path()).unwrap();
        std::fs::write(
            dir.path().join("state.json"),
            serde_json::to_vec(&checkpoint.meta).unwrap(),
        )
        .unwrap();
        let err = Checkpoint::load(dir.path()).unwrap_err().to_string();
        assert!(err.contains("not from step 7"), "{err}");
    }
}
