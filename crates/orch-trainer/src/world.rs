//! The trainer world, in both versions of the contract orch loads: 0.2.0 (`wit/`: the exports
//! in the `training` interface) and 0.1.0 (bare `init`, `train-step`, `eval-step`). Both import
//! the same interfaces, so a 0.1.0 trainer gets the very same host functions, linked under the
//! 0.1.0 names.

use crate::host::ReplicaState;
use orch_host::{Identity, WorldKind};
use orch_wit::trainer::exports::orch::plugin::training::{
    EvalReport, RunInfo, StepInfo, StepReport,
};
use orch_wit::trainer::orch::plugin as imports;
use orch_wit::trainer::{Trainer, TrainerPre};
use orch_wit::{Version, v0_1};
use wasmtime::Store;
use wasmtime::component::{Component, HasSelf, InstancePre, Linker};

/// A trainer's bindings, by the version of the contract it implements.
pub(crate) enum AnyTrainerPre {
    V0_1(v0_1::trainer::TrainerPre<ReplicaState>),
    V0_2(TrainerPre<ReplicaState>),
}

/// A trainer instance's exports, by version.
pub(crate) enum AnyTrainer {
    V0_1(v0_1::trainer::Trainer),
    V0_2(Trainer),
}

/// What a component is as a trainer: the version it implements, or why it is none.
pub(crate) fn trainer_version(
    engine: &wasmtime::Engine,
    component: &Component,
) -> Result<Version, String> {
    match orch_host::identify(engine, component) {
        Identity::Known(found) if found.world == WorldKind::Trainer => Ok(found.version),
        identity => Err(orch_host::mismatch(&identity, WorldKind::Trainer).unwrap_or_default()),
    }
}

/// Adds the trainer world's imports to `linker`, under the names of both versions.
pub(crate) fn add_imports(linker: &mut Linker<ReplicaState>) -> wasmtime::Result<()> {
    Trainer::add_to_linker::<ReplicaState, HasSelf<ReplicaState>>(linker, |s| s)?;
    // The 0.1.0 names of the same interfaces: `orch:plugin/tensors@0.1.0`, ...
    macro_rules! link_v0_1 {
        ($($interface:ident),*) => {$(
            imports::$interface::add_to_linker_instance::<ReplicaState, HasSelf<ReplicaState>>(
                &mut linker.instance(&format!(
                    "orch:plugin/{}@{}",
                    stringify!($interface),
                    Version::V0_1
                ))?,
                |s| s,
            )?;
        )*};
    }
    link_v0_1!(tensors, autograd, params, optim, data, devices, metrics);
    Ok(())
}

impl AnyTrainerPre {
    pub(crate) fn new(
        pre: InstancePre<ReplicaState>,
        version: Version,
    ) -> wasmtime::Result<AnyTrainerPre> {
        Ok(match version {
            Version::V0_1 => AnyTrainerPre::V0_1(v0_1::trainer::TrainerPre::new(pre)?),
            Version::V0_2 => AnyTrainerPre::V0_2(TrainerPre::new(pre)?),
        })
    }

    pub(crate) fn instantiate(
        &self,
        store: &mut Store<ReplicaState>,
    ) -> wasmtime::Result<AnyTrainer> {
        Ok(match self {
            AnyTrainerPre::V0_1(pre) => AnyTrainer::V0_1(pre.instantiate(store)?),
            AnyTrainerPre::V0_2(pre) => AnyTrainer::V0_2(pre.instantiate(store)?),
        })
    }
}

impl AnyTrainer {
    /// `init-replica` (0.1.0: `init`).
    pub(crate) fn init(
        &self,
        store: &mut Store<ReplicaState>,
        config: &Vec<(String, String)>,
        info: RunInfo,
    ) -> wasmtime::Result<Result<(), String>> {
        match self {
            AnyTrainer::V0_2(t) => t
                .orch_plugin_training()
                .call_init_replica(store, config, info),
            AnyTrainer::V0_1(t) => t.call_init(store, config, v0_1_run_info(info)),
        }
    }

    pub(crate) fn train_step(
        &self,
        store: &mut Store<ReplicaState>,
        info: StepInfo,
    ) -> wasmtime::Result<Result<StepReport, String>> {
        match self {
            AnyTrainer::V0_2(t) => t.orch_plugin_training().call_train_step(store, info),
            AnyTrainer::V0_1(t) => Ok(t
                .call_train_step(store, v0_1_step_info(info))?
                .map(|r| StepReport { loss: r.loss })),
        }
    }

    pub(crate) fn eval_step(
        &self,
        store: &mut Store<ReplicaState>,
        info: StepInfo,
    ) -> wasmtime::Result<Result<EvalReport, String>> {
        match self {
            AnyTrainer::V0_2(t) => t.orch_plugin_training().call_eval_step(store, info),
            AnyTrainer::V0_1(t) => {
                Ok(t.call_eval_step(store, v0_1_step_info(info))?
                    .map(|r| EvalReport {
                        loss: r.loss,
                        correct: r.correct,
                        rows: r.rows,
                    }))
            }
        }
    }
}

fn v0_1_run_info(i: RunInfo) -> v0_1::trainer::RunInfo {
    v0_1::trainer::RunInfo {
        replica: i.replica,
        replicas: i.replicas,
        epochs: i.epochs,
        batch_size: i.batch_size,
        steps_per_epoch: i.steps_per_epoch,
        features: i.features,
        classes: i.classes,
        train_samples: i.train_samples,
        eval_samples: i.eval_samples,
        seed: i.seed,
    }
}

fn v0_1_step_info(i: StepInfo) -> v0_1::trainer::StepInfo {
    v0_1::trainer::StepInfo {
        step: i.step,
        epoch: i.epoch,
        batch: i.batch,
        batches: i.batches,
    }
}
