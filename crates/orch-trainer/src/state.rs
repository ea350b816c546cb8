//! A replica's model state in and out: the snapshot a checkpoint is made of, parameters and
//! buffers set by name (the broadcast from replica 0, a checkpoint), and optimizer state
//! restored. An optimizer's parameter groups are checkpoint entries of their own, in order.

use crate::checkpoint::{Checkpoint, OptimizerState, ParamState};
use crate::error::TrainError;
use crate::host::{Group, OptKind, ReplicaState};
use crate::safetensors::NamedTensor;
use orch_tensor::{Tensor, TensorError};
use std::sync::Arc;

/// Named tensors copied to the host.
pub(crate) fn named(list: &[(String, Tensor)]) -> Result<Vec<NamedTensor>, TensorError> {
    list.iter()
        .map(|(name, p)| {
            Ok(NamedTensor {
                name: name.clone(),
                shape: p.shape().to_vec(),
                data: p.to_vec()?,
            })
        })
        .collect()
}

/// What a checkpoint holds of a replica: parameters, buffers and optimizer state.
pub(crate) type Snapshot = (Vec<NamedTensor>, Vec<NamedTensor>, Vec<OptimizerState>);

/// Replica state as a checkpoint holds it, copied to the host.
pub(crate) fn snapshot(state: &ReplicaState) -> Result<Snapshot, TensorError> {
    let params = named(&state.params)?;
    let buffers = named(&state.buffers)?;
    let mut optimizers = Vec::new();
    for opt in state
        .optimizers
        .iter()
        .flat_map(|o| o.iter().flat_map(|o| &o.groups))
    {
        let (kind, lr, per_param) = match &opt.kind {
            OptKind::Sgd(sgd) => {
                let states = sgd
                    .momentum_buffers()
                    .iter()
                    .map(|b| {
                        let tensors = match b {
                            Some(t) => vec![("momentum".to_string(), t.to_vec()?)],
                            None => Vec::new(),
                        };
                        Ok(ParamState {
                            tensors,
                            steps: None,
                        })
                    })
                    .collect::<Result<Vec<_>, TensorError>>()?;
                ("sgd", sgd.config().lr, states)
            }
            OptKind::Adam(adam) => {
                let states = adam
                    .moments()
                    .into_iter()
                    .map(|s| match s {
                        Some((m, v, steps)) => Ok(ParamState {
                            tensors: vec![
                                ("m".to_string(), m.to_vec()?),
                                ("v".to_string(), v.to_vec()?),
                            ],
                            steps: Some(steps),
                        }),
                        None => Ok(ParamState::default()),
                    })
                    .collect::<Result<Vec<_>, TensorError>>()?;
                ("adam", adam.config().lr, states)
            }
        };
        optimizers.push(OptimizerState {
            kind: kind.to_string(),
            lr,
            params: opt.names.clone(),
            state: per_param,
        });
    }
    Ok((params, buffers, optimizers))
}

/// Overwrites the registered parameters with `values` (same names, same shapes).
pub(crate) fn assign_params(state: &ReplicaState, values: &[NamedTensor]) -> Result<(), String> {
    assign_named(&state.params, values, "parameter")
}

/// Overwrites the tensors of `list` with `values` (same names, same shapes); `what` names
/// them in errors (`parameter`, `buffer`).
pub(crate) fn assign_named(
    list: &[(String, Tensor)],
    values: &[NamedTensor],
    what: &str,
) -> Result<(), String> {
    if values.len() != list.len() {
        return Err(format!("{} {what}s, expected {}", list.len(), values.len()));
    }
    for v in values {
        let (_, p) = list
            .iter()
            .find(|(n, _)| *n == v.name)
            .ok_or_else(|| format!("no {what} `{}`", v.name))?;
        if p.shape() != v.shape.as_slice() {
            return Err(format!(
                "`{}` has shape {:?}, expected {:?}",
                v.name,
                p.shape(),
                v.shape
            ));
        }
        let src = Tensor::from_slice(&v.data, &v.shape, p.pool()).map_err(|e| e.to_string())?;
        p.assign(&src).map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// Puts a checkpoint's parameters and optimizer state into this replica.
pub(crate) fn load(state: &mut ReplicaState, checkpoint: &Checkpoint) -> Result<(), TrainError> {
    let resume = |why: String| {
        TrainError::Resume(format!(
            "the checkpoint does not fit the trainer's model: {why}"
        ))
    };
    assign_params(state, &checkpoint.params).map_err(resume)?;
    assign_named(&state.buffers, &checkpoint.buffers, "buffer").map_err(resume)?;
    let live: Vec<&mut Group> = state
        .optimizers
        .iter_mut()
        .flatten()
        .flat_map(|o| o.groups.iter_mut())
        .collect();
    if live.len() != checkpoint.optimizers.len() {
        return Err(resume(format!(
            "{} optimizers (parameter groups counted apart), the checkpoint has {}",
            live.len(),
            checkpoint.optimizers.len()
        )));
    }
    for (index, (opt, saved)) in live.into_iter().zip(&checkpoint.optimizers).enumerate() {
        if opt.names != saved.params {
            return Err(resume(format!(
                "optimizer {index} updates other parameters"
            )));
        }
        let shapes: Vec<Vec<usize>> = opt.params().iter().map(|p| p.shape().to_vec()).collect();
        let tensor = |j: usize, data: &[f32], pool: &Arc<orch_tensor::MemoryPool>| {
            Tensor::from_slice(data, &shapes[j], pool).map_err(|e| resume(e.to_string()))
        };
        opt.inner().set_lr(saved.lr);
        let pools: Vec<Arc<orch_tensor::MemoryPool>> =
            opt.params().iter().map(|p| Arc::clone(p.pool())).collect();
        match (&mut opt.kind, saved.kind.as_str()) {
            (OptKind::Sgd(sgd), "sgd") => {
                for (j, s) in saved.state.iter().enumerate() {
                    if let Some((_, data)) = s.tensors.iter().find(|(slot, _)| slot == "momentum") {
                        let t = tensor(j, data, &pools[j])?;
                        sgd.set_momentum_buffer(j, &t)
                            .map_err(|e| resume(e.to_string()))?;
                    }
                }
            }
            (OptKind::Adam(adam), "adam") => {
                for (j, s) in saved.state.iter().enumerate() {
                    let slot =
                        |name: &str| s.tensors.iter().find(|(n, _)| n == name).map(|(_, d)| d);
                    if let (Some(m), Some(v), Some(steps)) = (slot("m"), slot("v"), s.steps) {
                        let (m, v) = (tensor(j, m, &pools[j])?, tensor(j, v, &pools[j])?);
                        adam.set_moments(j, &m, &v, steps)
                            .map_err(|e| resume(e.to_string()))?;
                    }
                }
            }
            (_, kind) => return Err(resume(format!("optimizer {index} is not `{kind}`"))),
        }
    }
    Ok(())
}
