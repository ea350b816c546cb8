//! Checkpoints: `model.safetensors` (the parameters and buffers by name, as PyTorch's
//! `state_dict` holds both; `state.json` lists which are buffers), `optimizer.safetensors` (the
//! optimizers' state tensors) and `state.json` (step, data position, optimizer kinds, learning
//! rates and step counts, and what the run was, to refuse a resume that cannot continue it).
//!
//! Each checkpoint is a folder of its own, `checkpoints/step-000000000123/`, written under a
//! temporary name, its files and the folder fsynced, then renamed into place. The run's
//! `checkpoint` is a symbolic link to the newest one, switched by renaming a new link over it
//! (atomic) and fsyncing the run's folder: at every instant `checkpoint/` is one whole
//! checkpoint, old or new, whatever crashes when. The two newest folders are kept (the one the
//! link names and the one before it); older ones are removed once the link has moved on.

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

/// An optimizer (or one parameter group of one: each group is an entry of its own, in order)
/// as a checkpoint holds it.
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
    /// Buffers (`params.register-buffer`): replica 0's values.
    pub buffers: Vec<NamedTensor>,
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
    /// Which tensors of `model.safetensors` are buffers (absent in checkpoints made before
    /// buffers existed: none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub buffers: Vec<String>,
    /// Text: the vocabulary token ids stand for, `chars:` and the sorted characters (token `i`
    /// is the `i`-th), or `bytes`; what `orch sample` encodes and decodes with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vocab: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OptimizerMeta {
    pub kind: String,
    pub lr: f32,
    pub params: Vec<String>,
    /// Adam's per-parameter step counts (`null` before a parameter's first update).
    pub steps: Vec<Option<u32>>,
}

/// The run's checkpoint: a link to the newest checkpoint folder (its home is
/// [`orch_core::checkpoint`], for the crates that look for one without the trainer).
pub fn dir(out: &Path) -> PathBuf {
    orch_core::checkpoint::dir(out)
}

/// Where the run's checkpoint folders live.
pub fn history(out: &Path) -> PathBuf {
    out.join("checkpoints")
}

/// Checkpoint folders kept: the current one and the one before it.
const KEEP: usize = 2;

/// Writes `bytes` to `path` and makes them durable before returning.
fn write_synced(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut file = std::fs::File::create(path)?;
    std::io::Write::write_all(&mut file, bytes)?;
    file.sync_all()
}

/// Makes a folder's entries (a rename, a new file) durable.
fn sync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

/// The checkpoint folder a link names, as a name inside `history` (`None`: no link).
fn linked(pointer: &Path) -> Option<String> {
    let target = std::fs::read_link(pointer).ok()?;
    target.file_name().map(|n| n.to_string_lossy().into_owned())
}

/// A checkpoint folder's name: `step-` and the step, zero-padded so names sort by step.
fn folder_name(step: u64, attempt: u32) -> String {
    match attempt {
        0 => format!("step-{step:012}"),
        n => format!("step-{step:012}.{n}"),
    }
}

fn io_error(path: &Path, e: impl std::fmt::Display) -> crate::TrainError {
    crate::TrainError::Checkpoint {
        path: path.to_path_buf(),
        reason: e.to_string(),
    }
}

/// Where writing a checkpoint failed, and why.
type WriteFailure = (PathBuf, String);

/// `e` at `path` as a [`WriteFailure`].
fn at(path: &Path) -> impl FnOnce(std::io::Error) -> WriteFailure + '_ {
    move |e| (path.to_path_buf(), io_reason(&e))
}

/// An I/O error as the end of a sentence: "no space left on device", without "(os error 28)".
pub(crate) fn io_reason(e: &std::io::Error) -> String {
    let text = e.to_string();
    let text = match (e.raw_os_error(), text.rfind(" (os error ")) {
        (Some(_), Some(at)) => &text[..at],
        _ => text.as_str(),
    };
    let mut chars = text.chars();
    match chars.next() {
        Some(first) => first.to_lowercase().chain(chars).collect(),
        None => String::new(),
    }
}

impl Checkpoint {
    /// Writes the checkpoint as a new folder under `history(out)` and points `dir(out)` at
    /// it; keeps the previous one and removes older ones. On failure nothing half-written is
    /// left (the temporary folder is removed) and the link still names the previous one.
    pub fn save(&self, out: &Path) -> Result<(), crate::TrainError> {
        self.try_save(out)
            .map_err(|(path, reason)| crate::TrainError::CheckpointWrite {
                step: self.meta.step,
                path,
                reason,
            })
    }

    fn try_save(&self, out: &Path) -> Result<(), WriteFailure> {
        let root = history(out);
        std::fs::create_dir_all(&root).map_err(at(&root))?;
        let pointer = dir(out);
        let previous = adopt_old_layout(out, &pointer)?.or_else(|| linked(&pointer));
        // A folder of this step from a run that crashed before switching the link is replaced;
        // the one the link names is never touched.
        let mut attempt = 0;
        while previous.as_deref() == Some(folder_name(self.meta.step, attempt).as_str()) {
            attempt += 1;
        }
        let name = folder_name(self.meta.step, attempt);
        let tmp = root.join(format!(".tmp-{name}"));
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir(&tmp).map_err(at(&tmp))?;
        let folder = root.join(&name);
        let written = self
            .write_files(&tmp)
            .and_then(|()| sync_dir(&tmp).map_err(at(&tmp)))
            .and_then(|()| {
                if folder.exists() {
                    std::fs::remove_dir_all(&folder).map_err(at(&folder))?;
                }
                std::fs::rename(&tmp, &folder).map_err(at(&folder))
            });
        if let Err(failure) = written {
            // A half-written folder is of no use to anyone, and on a full disk it holds the
            // space the next attempt needs.
            let _ = std::fs::remove_dir_all(&tmp);
            return Err(failure);
        }
        sync_dir(&root).map_err(at(&root))?;

        // The switch: a new link renamed over the old one.
        let link_tmp = out.join(".checkpoint.tmp");
        let _ = std::fs::remove_file(&link_tmp);
        let target = Path::new(root.file_name().unwrap_or_default()).join(&name);
        std::os::unix::fs::symlink(&target, &link_tmp).map_err(at(&link_tmp))?;
        if let Err(e) = std::fs::rename(&link_tmp, &pointer) {
            let _ = std::fs::remove_file(&link_tmp);
            return Err(at(&pointer)(e));
        }
        sync_dir(out).map_err(at(out))?;

        prune(&root, &[Some(name), previous])
    }

    /// The three files of a checkpoint, each written and fsynced.
    fn write_files(&self, folder: &Path) -> Result<(), WriteFailure> {
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
        meta.buffers = self.buffers.iter().map(|b| b.name.clone()).collect();
        let model: Vec<NamedTensor> = self.params.iter().chain(&self.buffers).cloned().collect();
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
            ("model.safetensors", encode(&model, &step)),
            ("optimizer.safetensors", encode(&state_tensors, &step)),
            (
                "state.json",
                serde_json::to_vec_pretty(&meta).map_err(|e| e.to_string()),
            ),
        ];
        for (name, bytes) in files {
            let path = folder.join(name);
            let bytes = bytes.map_err(|e| (path.clone(), e.to_string()))?;
            write_synced(&path, &bytes).map_err(at(&path))?;
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
        let (buffers, params): (Vec<NamedTensor>, Vec<NamedTensor>) = read("model.safetensors")?
            .into_iter()
            .partition(|t| meta.buffers.contains(&t.name));
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
            buffers,
            optimizers,
        })
    }
}

/// A `checkpoint/` folder from before numbered folders becomes one of them (its name is
/// returned), so the link can take its place and nothing of it is lost.
fn adopt_old_layout(out: &Path, pointer: &Path) -> Result<Option<String>, WriteFailure> {
    let is_folder = std::fs::symlink_metadata(pointer).is_ok_and(|m| m.is_dir());
    if !is_folder {
        return Ok(None);
    }
    let name = "step-earlier".to_string();
    let moved = history(out).join(&name);
    std::fs::rename(pointer, &moved).map_err(at(&moved))?;
    sync_dir(out).map_err(at(out))?;
    Ok(Some(name))
}

/// Removes checkpoint folders (and half-written ones) other than `keep`.
fn prune(root: &Path, keep: &[Option<String>; KEEP]) -> Result<(), WriteFailure> {
    let entries = std::fs::read_dir(root).map_err(at(root))?;
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let ours = name.starts_with("step-") || name.starts_with(".tmp-step-");
        if ours && !keep.iter().flatten().any(|k| *k == name) {
            let path = entry.path();
            std::fs::remove_dir_all(&path).map_err(at(&path))?;
        }
    }
    Ok(())
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
                buffers: Vec::new(),
                vocab: None,
            },
            params: vec![NamedTensor {
                name: "w".into(),
                shape: vec![2],
                data: vec![1.0, 2.0],
            }],
            buffers: vec![NamedTensor {
                name: "bn.running_mean".into(),
                shape: vec![3],
                data: vec![0.25, 0.5, 0.75],
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
        let back = Checkpoint::load(&super::dir(dir.path())).unwrap();
        assert_eq!(back.params, checkpoint.params);
        assert_eq!(back.buffers, checkpoint.buffers);
        assert_eq!(back.optimizers, checkpoint.optimizers);
        assert_eq!(
            (back.meta.step, back.meta.epoch, back.meta.batch),
            (7, 1, 2)
        );

        // A model file from another step is refused.
        let mut other = checkpoint.clone();
        other.meta.step = 8;
        other.save(dir.path()).unwrap();
        let current = super::dir(dir.path());
        std::fs::write(
            current.join("state.json"),
            serde_json::to_vec(&checkpoint.meta).unwrap(),
        )
        .unwrap();
        let err = Checkpoint::load(&current).unwrap_err().to_string();
        assert!(err.contains("not from step 7"), "{err}");
    }

    fn at_step(step: u64) -> Checkpoint {
        Checkpoint {
            meta: Meta {
                format: FORMAT.into(),
                job: "j".into(),
                plugin: "mlp".into(),
                plugin_sha256: "00".into(),
                step,
                epoch: 0,
                batch: 0,
                batch_size: 1,
                seed: 0,
                train_samples: 1,
                replicas: 1,
                optimizers: Vec::new(),
                buffers: Vec::new(),
                vocab: None,
            },
            params: vec![NamedTensor {
                name: "w".into(),
                shape: vec![1],
                data: vec![step as f32],
            }],
            buffers: Vec::new(),
            optimizers: Vec::new(),
        }
    }

    fn folders(out: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(history(out))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn each_checkpoint_is_a_folder_and_the_last_two_are_kept() {
        let out = tempfile::tempdir().unwrap();
        for step in 1..=4 {
            at_step(step).save(out.path()).unwrap();
            let current = Checkpoint::load(&dir(out.path())).unwrap();
            assert_eq!(current.meta.step, step);
        }
        assert_eq!(
            folders(out.path()),
            ["step-000000000003", "step-000000000004"]
        );
        assert_eq!(
            std::fs::read_link(dir(out.path())).unwrap(),
            Path::new("checkpoints/step-000000000004")
        );
    }

    #[test]
    fn a_crash_before_the_switch_leaves_the_previous_checkpoint_whole() {
        let out = tempfile::tempdir().unwrap();
        at_step(5).save(out.path()).unwrap();
        // A later save that died mid-write: a half-written folder, the link untouched.
        let half = history(out.path()).join(".tmp-step-000000000006");
        std::fs::create_dir_all(&half).unwrap();
        std::fs::write(half.join("model.safetensors"), b"cut sh").unwrap();
        let loaded = Checkpoint::load(&dir(out.path())).unwrap();
        assert_eq!(loaded.meta.step, 5);
        // The next save cleans it up.
        at_step(6).save(out.path()).unwrap();
        assert_eq!(
            folders(out.path()),
            ["step-000000000005", "step-000000000006"]
        );
        // A folder of the current step is never overwritten in place (a resumed run that
        // saves the step it resumed from gets a folder of its own).
        at_step(6).save(out.path()).unwrap();
        assert_eq!(
            folders(out.path()),
            ["step-000000000006", "step-000000000006.1"]
        );
        assert_eq!(Checkpoint::load(&dir(out.path())).unwrap().meta.step, 6);
    }

    #[test]
    fn a_checkpoint_folder_of_the_old_layout_is_kept_as_the_previous_one() {
        let out = tempfile::tempdir().unwrap();
        let old = dir(out.path());
        std::fs::create_dir_all(&old).unwrap();
        at_step(3).write_files(&old).unwrap();
        at_step(4).save(out.path()).unwrap();
        assert_eq!(folders(out.path()), ["step-000000000004", "step-earlier"]);
        assert_eq!(Checkpoint::load(&old).unwrap().meta.step, 4);
        let kept = Checkpoint::load(&history(out.path()).join("step-earlier")).unwrap();
        assert_eq!(kept.meta.step, 3);
    }

    /// Checkpoints written by the hand-written safetensors encoder orch had before it used the
    /// `safetensors` crate (a folder saved then, in tests/fixtures) load whole.
    #[test]
    fn checkpoints_written_before_the_safetensors_crate_still_load() {
        let old = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/checkpoint-before-safetensors-crate");
        let loaded = Checkpoint::load(&old).unwrap();
        assert_eq!(
            (loaded.meta.step, loaded.meta.epoch, loaded.meta.batch),
            (12, 1, 3)
        );
        let tensor = |name: &str, shape: Vec<usize>, data: Vec<f32>| NamedTensor {
            name: name.into(),
            shape,
            data,
        };
        assert_eq!(
            loaded.params,
            [
                tensor("b", vec![3], vec![0.25, -0.5, 0.125]),
                tensor("scale", vec![], vec![7.0]),
                tensor(
                    "w",
                    vec![2, 3],
                    vec![1.0, -2.0, 3.5, 0.0, f32::MIN_POSITIVE, 1e30]
                ),
            ]
        );
        assert_eq!(
            loaded.optimizers,
            [
                OptimizerState {
                    kind: "sgd".into(),
                    lr: 0.1,
                    params: vec!["b".into()],
                    state: vec![ParamState {
                        tensors: vec![("momentum".into(), vec![0.5, 0.25, -1.0])],
                        steps: None,
                    }],
                },
                OptimizerState {
                    kind: "adam".into(),
                    lr: 0.001,
                    params: vec!["w".into(), "scale".into()],
                    state: vec![
                        ParamState {
                            tensors: vec![
                                ("m".into(), vec![0.1, 0.2, 0.3, 0.4, 0.5, 0.6]),
                                ("v".into(), vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]),
                            ],
                            steps: Some(12),
                        },
                        ParamState::default(),
                    ],
                },
            ]
        );
        // Saved again by the crate, it reads back the same.
        let out = tempfile::tempdir().unwrap();
        loaded.save(out.path()).unwrap();
        let again = Checkpoint::load(&dir(out.path())).unwrap();
        assert_eq!(
            (again.params, again.optimizers),
            (loaded.params, loaded.optimizers)
        );
    }
}
