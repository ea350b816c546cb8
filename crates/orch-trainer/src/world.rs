//! The trainer world, in the five versions of the contract orch loads: 0.5.0 (`wit/`), 0.4.0 and
//! 0.3.0 (the same world under older versions), 0.2.0 (the same `training` export, fewer
//! imports) and 0.1.0 (bare `init`, `train-step`, `eval-step`). Every version's imports are
//! subsets of 0.5.0's with the same types, so an older trainer gets the very same host
//! functions, linked under its version's names; it simply does not import what 0.3.0 added.
//!
//! [`TrainerWorld`] is the trainer world as orch-host's generic host sees it: the host compiles,
//! caches, checks and links a trainer as it does a policy, under the same limits and with the
//! same errors; what is the trainer's own is the store (a replica's tensors, [`ReplicaState`])
//! and the imports that work on it ([`add_imports`]).

use crate::host::ReplicaState;
use orch_host::{PluginKind, WorldKind};
use orch_wit::trainer::exports::orch::plugin::training::{
    EvalReport, RunInfo, StepInfo, StepReport,
};
use orch_wit::trainer::orch::plugin as imports;
use orch_wit::trainer::{Trainer, TrainerPre};
use orch_wit::{Version, v0_1, v0_2, v0_3, v0_4};
use std::path::Path;
use wasmtime::Store;
use wasmtime::component::{HasSelf, InstancePre, Linker};

use v0_2::trainer::exports::orch::plugin::training as v0_2_training;
use v0_3::trainer::exports::orch::plugin::training as v0_3_training;
use v0_4::trainer::exports::orch::plugin::training as v0_4_training;

/// `run-info` of another version: the fields every version has, and the `extra` ones the
/// version adds (0.3.0 and 0.4.0 have 0.5.0's `sample_shape`, `label_shape`, `total_steps`).
macro_rules! same_record {
    ($i:expr => $ty:path $(; $($extra:ident),+)?) => {{
        let i = $i;
        $ty {
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
            $($($extra: i.$extra,)+)?
        }
    }};
}

/// `step-info` of another version: the same fields.
macro_rules! same_step {
    ($i:expr => $ty:path) => {{
        let i = $i;
        $ty {
            step: i.step,
            epoch: i.epoch,
            batch: i.batch,
            batches: i.batches,
        }
    }};
}

/// A trainer's bindings, by the version of the contract it implements.
pub(crate) enum AnyTrainerPre {
    V0_1(v0_1::trainer::TrainerPre<ReplicaState>),
    V0_2(v0_2::trainer::TrainerPre<ReplicaState>),
    V0_3(v0_3::trainer::TrainerPre<ReplicaState>),
    V0_4(v0_4::trainer::TrainerPre<ReplicaState>),
    V0_5(TrainerPre<ReplicaState>),
}

/// A trainer instance's exports, by version.
pub(crate) enum AnyTrainer {
    V0_1(v0_1::trainer::Trainer),
    V0_2(v0_2::trainer::Trainer),
    V0_3(v0_3::trainer::Trainer),
    V0_4(v0_4::trainer::Trainer),
    V0_5(Trainer),
}

/// The `trainer` world, the third world of orch-host's generic host.
pub(crate) struct TrainerWorld;

impl orch_host::World for TrainerWorld {
    const KIND: PluginKind = PluginKind::Trainer;
    const WORLD: WorldKind = WorldKind::Trainer;
    type State = ReplicaState;
    type Pre = AnyTrainerPre;
    type Exports = AnyTrainer;
    type Extra = ();

    fn builtin(name: &str) -> Option<(&'static [u8], ())> {
        orch_host::trainer_builtin(name).map(|b| (b.wasm, ()))
    }

    fn add_imports(linker: &mut Linker<ReplicaState>) -> wasmtime::Result<()> {
        add_imports(linker)
    }

    /// A trainer file is named by its stem (`trainer_fixture`), as its checkpoints record it.
    fn file_plugin_name(path: &Path) -> String {
        path.file_stem().map_or_else(
            || path.display().to_string(),
            |s| s.to_string_lossy().into_owned(),
        )
    }

    fn pre(pre: InstancePre<ReplicaState>, version: Version) -> wasmtime::Result<AnyTrainerPre> {
        AnyTrainerPre::new(pre, version)
    }

    fn instantiate(
        pre: &AnyTrainerPre,
        store: &mut Store<ReplicaState>,
    ) -> wasmtime::Result<AnyTrainer> {
        pre.instantiate(store)
    }
}

/// Adds the trainer world's imports to `linker`, under the names of every version.
fn add_imports(linker: &mut Linker<ReplicaState>) -> wasmtime::Result<()> {
    Trainer::add_to_linker::<ReplicaState, HasSelf<ReplicaState>>(linker, |s| s)?;
    // The older names of the same interfaces: `orch:plugin/tensors@0.1.0`, `…@0.2.0`, ...
    macro_rules! link_as {
        ($version:expr; $($interface:ident),*) => {$(
            imports::$interface::add_to_linker_instance::<ReplicaState, HasSelf<ReplicaState>>(
                &mut linker.instance(&format!(
                    "orch:plugin/{}@{}",
                    stringify!($interface),
                    $version
                ))?,
                |s| s,
            )?;
        )*};
    }
    for version in [Version::V0_1, Version::V0_2, Version::V0_3, Version::V0_4] {
        link_as!(version; tensors, autograd, params, optim, data, devices, metrics);
    }
    Ok(())
}

impl AnyTrainerPre {
    /// The version of the contract the trainer implements.
    pub(crate) fn version(&self) -> Version {
        match self {
            AnyTrainerPre::V0_1(_) => Version::V0_1,
            AnyTrainerPre::V0_2(_) => Version::V0_2,
            AnyTrainerPre::V0_3(_) => Version::V0_3,
            AnyTrainerPre::V0_4(_) => Version::V0_4,
            AnyTrainerPre::V0_5(_) => Version::V0_5,
        }
    }

    pub(crate) fn new(
        pre: InstancePre<ReplicaState>,
        version: Version,
    ) -> wasmtime::Result<AnyTrainerPre> {
        Ok(match version {
            Version::V0_1 => AnyTrainerPre::V0_1(v0_1::trainer::TrainerPre::new(pre)?),
            Version::V0_2 => AnyTrainerPre::V0_2(v0_2::trainer::TrainerPre::new(pre)?),
            Version::V0_3 => AnyTrainerPre::V0_3(v0_3::trainer::TrainerPre::new(pre)?),
            Version::V0_4 => AnyTrainerPre::V0_4(v0_4::trainer::TrainerPre::new(pre)?),
            Version::V0_5 => AnyTrainerPre::V0_5(TrainerPre::new(pre)?),
        })
    }

    pub(crate) fn instantiate(
        &self,
        store: &mut Store<ReplicaState>,
    ) -> wasmtime::Result<AnyTrainer> {
        Ok(match self {
            AnyTrainerPre::V0_1(pre) => AnyTrainer::V0_1(pre.instantiate(store)?),
            AnyTrainerPre::V0_2(pre) => AnyTrainer::V0_2(pre.instantiate(store)?),
            AnyTrainerPre::V0_3(pre) => AnyTrainer::V0_3(pre.instantiate(store)?),
            AnyTrainerPre::V0_4(pre) => AnyTrainer::V0_4(pre.instantiate(store)?),
            AnyTrainerPre::V0_5(pre) => AnyTrainer::V0_5(pre.instantiate(store)?),
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
            AnyTrainer::V0_5(t) => t
                .orch_plugin_training()
                .call_init_replica(store, config, &info),
            AnyTrainer::V0_4(t) => {
                let info = same_record!(info => v0_4_training::RunInfo; sample_shape, label_shape, total_steps);
                t.orch_plugin_training()
                    .call_init_replica(store, config, &info)
            }
            AnyTrainer::V0_3(t) => {
                let info = same_record!(info => v0_3_training::RunInfo; sample_shape, label_shape, total_steps);
                t.orch_plugin_training()
                    .call_init_replica(store, config, &info)
            }
            AnyTrainer::V0_2(t) => t.orch_plugin_training().call_init_replica(
                store,
                config,
                same_record!(info => v0_2_training::RunInfo),
            ),
            AnyTrainer::V0_1(t) => {
                t.call_init(store, config, same_record!(info => v0_1::trainer::RunInfo))
            }
        }
    }

    pub(crate) fn train_step(
        &self,
        store: &mut Store<ReplicaState>,
        info: StepInfo,
    ) -> wasmtime::Result<Result<StepReport, String>> {
        match self {
            AnyTrainer::V0_5(t) => t.orch_plugin_training().call_train_step(store, info),
            AnyTrainer::V0_4(t) => Ok(t
                .orch_plugin_training()
                .call_train_step(store, same_step!(info => v0_4_training::StepInfo))?
                .map(|r| StepReport { loss: r.loss })),
            AnyTrainer::V0_3(t) => Ok(t
                .orch_plugin_training()
                .call_train_step(store, same_step!(info => v0_3_training::StepInfo))?
                .map(|r| StepReport { loss: r.loss })),
            AnyTrainer::V0_2(t) => Ok(t
                .orch_plugin_training()
                .call_train_step(store, same_step!(info => v0_2_training::StepInfo))?
                .map(|r| StepReport { loss: r.loss })),
            AnyTrainer::V0_1(t) => Ok(t
                .call_train_step(store, same_step!(info => v0_1::trainer::StepInfo))?
                .map(|r| StepReport { loss: r.loss })),
        }
    }

    pub(crate) fn eval_step(
        &self,
        store: &mut Store<ReplicaState>,
        info: StepInfo,
    ) -> wasmtime::Result<Result<EvalReport, String>> {
        let report = |loss, correct, rows| EvalReport {
            loss,
            correct,
            rows,
        };
        match self {
            AnyTrainer::V0_5(t) => t.orch_plugin_training().call_eval_step(store, info),
            AnyTrainer::V0_4(t) => Ok(t
                .orch_plugin_training()
                .call_eval_step(store, same_step!(info => v0_4_training::StepInfo))?
                .map(|r| report(r.loss, r.correct, r.rows))),
            AnyTrainer::V0_3(t) => Ok(t
                .orch_plugin_training()
                .call_eval_step(store, same_step!(info => v0_3_training::StepInfo))?
                .map(|r| report(r.loss, r.correct, r.rows))),
            AnyTrainer::V0_2(t) => Ok(t
                .orch_plugin_training()
                .call_eval_step(store, same_step!(info => v0_2_training::StepInfo))?
                .map(|r| report(r.loss, r.correct, r.rows))),
            AnyTrainer::V0_1(t) => Ok(t
                .call_eval_step(store, same_step!(info => v0_1::trainer::StepInfo))?
                .map(|r| report(r.loss, r.correct, r.rows))),
        }
    }
}
