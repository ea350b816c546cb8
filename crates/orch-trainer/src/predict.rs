//! `inference.predict` outside a run: the trainer's outputs for one batch of features, in eval
//! mode (autograd off, dropout the identity), from the job's checkpoint when it has one. What
//! `orch predict` and `orch sample` call.
//!
//! Design decision: one replica on the first granted device, built exactly as a run builds its
//! replica 0 (`init-replica` with the job's config and data set's sizes, then the checkpoint's
//! parameters and buffers), so a prediction sees the model the run saved. `predict` is an
//! optional export of contract 0.3.0 (world `predicting-trainer`): a trainer without it, or of
//! an older contract, is refused with a sentence.

use crate::checkpoint::{self, Checkpoint};
use crate::collective::Collective;
use crate::error::{Stage, TrainError};
use crate::host::{Phase, ReplicaState, Shared};
use crate::run::{GrantedDevice, Prepared, RunOptions, TrainJob, device_slots};
use crate::state::load;
use orch_host::{PluginState, Ticker, deadline_ticks, printable};
use orch_tensor::Tensor;
use orch_wit::Version;
use orch_wit::predicting::exports::orch::plugin::inference::GuestIndices;
use orch_wit::trainer::Trainer;
use std::sync::Arc;
use wasmtime::Store;

/// What `predict` returned: the output tensor's shape and values, row-major.
#[derive(Debug, Clone, PartialEq)]
pub struct Prediction {
    pub shape: Vec<usize>,
    pub values: Vec<f32>,
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
    let prepared = Prepared::new(job, options)?;
    let plugin = prepared.plugin.clone();
    let failed = |message: String| TrainError::Failed {
        plugin: plugin.clone(),
        stage: Stage::Predict,
        message,
    };
    let crate::world::AnyTrainerPre::V0_3(pre) = &prepared.pre else {
        return Err(failed(format!(
            "the trainer implements contract {}; predict is an export of contract {} (world `predicting-trainer`)",
            prepared.pre.version(),
            Version::V0_3
        )));
    };
    let indices = GuestIndices::new(pre.instance_pre()).map_err(|_| {
        failed("the trainer does not export `orch:plugin/inference` (world `predicting-trainer`): it cannot predict".into())
    })?;
    let first = devices
        .first()
        .ok_or_else(|| TrainError::Setup("predict needs a device".into()))?;
    let spec = job.spec;
    let shared = Arc::new(Shared {
        devices: device_slots(std::slice::from_ref(first), job.memory_limit)?,
        data: prepared.data,
        replicas: 1,
        seed: spec.seed,
        max_tensors: options.max_tensors,
        max_graph_nodes: options.max_graph_nodes,
        exchange_timeout: prepared.limits.deadline,
        grads: Collective::new(1),
        broadcast: Collective::new(1),
    });
    let _ticker = Ticker::start(&prepared.engine)
        .map_err(|e| TrainError::Engine(format!("cannot start the epoch ticker: {e}")))?;
    let state = ReplicaState::new(
        PluginState::new(&plugin, &prepared.limits),
        Arc::clone(&shared),
        0,
    );
    let mut store = Store::new(&prepared.engine, state);
    store.limiter(|s| &mut s.sandbox.limiter);
    store.set_hostcall_fuel(prepared.limits.memory_bytes.saturating_add(1 << 20));
    store.set_epoch_deadline(deadline_ticks(prepared.limits.deadline));
    let engine_error = |e: wasmtime::Error| failed(format!("{e:#}"));

    store.data_mut().phase = Phase::Init;
    let instance = pre
        .instance_pre()
        .instantiate(&mut store)
        .map_err(engine_error)?;
    let trainer = Trainer::new(&mut store, &instance).map_err(engine_error)?;
    let inference = indices.load(&mut store, &instance).map_err(engine_error)?;
    let schedule = crate::data::Schedule {
        samples: shared.data.train.len(),
        batch_size: spec.batch_size as usize,
        seed: spec.seed,
        epochs: spec.epochs,
        replicas: 1,
        steps: spec.steps,
        windows: shared.data.train.is_text(),
    };
    let info = crate::replica::run_info(&schedule, &shared.data, 0);
    trainer
        .orch_plugin_training()
        .call_init_replica(&mut store, &spec.config, &info)
        .map_err(engine_error)?
        .map_err(|m| failed(printable(&m)))?;
    store.data_mut().phase = Phase::Idle;
    let saved = checkpoint::dir(&spec.out);
    if saved.exists() {
        load(store.data_mut(), &Checkpoint::load(&saved)?)?;
    }

    store.set_epoch_deadline(deadline_ticks(prepared.limits.deadline));
    let state = store.data_mut();
    let pool = state
        .pool(None)
        .map_err(|e| failed(format!("the device: {e:?}")))?;
    let input = Tensor::from_vec(features, shape, &pool).map_err(|e| failed(e.to_string()))?;
    let handle = state
        .give(input)
        .map_err(|e| failed(format!("the features: {e:?}")))?;
    let output = orch_tensor::no_grad(|| inference.call_predict(&mut store, handle))
        .map_err(engine_error)?
        .map_err(|m| failed(printable(&m)))?;
    let state = store.data_mut();
    let tensor = state
        .tensor(&output)
        .map_err(|e| failed(format!("predict's result: {e:?}")))?;
    state.drop_tensor(output).map_err(engine_error)?;
    Ok(Prediction {
        shape: tensor.shape().to_vec(),
        values: tensor.to_vec().map_err(|e| failed(e.to_string()))?,
    })
}
