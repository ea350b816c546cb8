//! `orch:plugin/data`, `orch:plugin/devices` and `orch:plugin/metrics`.

use super::convert::Fail;
use super::{BatchSlot, Phase, ReplicaState};
use orch_tensor::Tensor;
use orch_wit::trainer::orch::plugin::data::{Batch, Host as Data};
use orch_wit::trainer::orch::plugin::devices::{DeviceInfo, Host as Devices};
use orch_wit::trainer::orch::plugin::metrics::{Host as Metrics, Level};
use orch_wit::trainer::orch::plugin::tensors::{DeviceIndex, TensorError as WitError};

impl ReplicaState {
    /// The current batch as tensors on the current device (made once per call, then shared).
    fn batch(&mut self, train: bool) -> Result<Batch, Fail> {
        let pool = self.pool(None)?;
        let data = &self.shared.data;
        let (slot, set): (&mut BatchSlot, _) = match (&mut self.phase, train) {
            (Phase::Train(slot), true) => (slot, &data.train),
            (Phase::Eval(slot), false) => match &data.eval {
                Some(eval) => (slot, eval),
                None => return Err(not_now("the job has no evaluation data")),
            },
            (_, true) => return Err(not_now("data.train-batch is for train-step")),
            (_, false) => return Err(not_now("data.eval-batch is for eval-step")),
        };
        let (features, labels) = match &slot.tensors {
            Some(made) => made.clone(),
            None => {
                let (x, labels) = set.gather(&slot.indices);
                let rows = slot.indices.len();
                let mut label_shape = vec![rows];
                label_shape.extend(set.label_shape());
                let made = (
                    Tensor::from_vec(x, &[rows, set.feature_dim()], &pool)?,
                    Tensor::from_vec(labels, &label_shape, &pool)?,
                );
                slot.tensors = Some(made.clone());
                made
            }
        };
        let rows = u32::try_from(features.shape()[0]).unwrap_or(u32::MAX);
        Ok(Batch {
            features: self.give(features)?,
            labels: self.give(labels)?,
            rows,
        })
    }
}

fn not_now(message: &str) -> Fail {
    Fail::Wit(WitError::NotNow(message.to_string()))
}

impl Data for ReplicaState {
    fn train_batch(&mut self) -> wasmtime::Result<Result<Batch, WitError>> {
        self.run("data.train-batch", |s| s.batch(true))
    }

    fn eval_batch(&mut self) -> wasmtime::Result<Result<Batch, WitError>> {
        self.run("data.eval-batch", |s| s.batch(false))
    }
}

impl Devices for ReplicaState {
    fn granted(&mut self) -> wasmtime::Result<Vec<DeviceInfo>> {
        Ok(self
            .shared
            .devices
            .iter()
            .enumerate()
            .map(|(i, slot)| DeviceInfo {
                index: u32::try_from(i).unwrap_or(u32::MAX),
                kind: slot.kind.clone(),
                name: slot.name.clone(),
                memory_free: slot.memory_free,
                quota: slot.quota,
                in_use: slot.pool.in_use(),
            })
            .collect())
    }

    fn current(&mut self) -> wasmtime::Result<DeviceIndex> {
        Ok(u32::try_from(self.current).unwrap_or(u32::MAX))
    }

    fn set_current(&mut self, index: DeviceIndex) -> wasmtime::Result<Result<(), WitError>> {
        self.run("devices.set-current", |s| {
            if (index as usize) < s.shared.devices.len() {
                s.current = index as usize;
                Ok(())
            } else {
                Err(Fail::Wit(WitError::NoSuchDevice(index)))
            }
        })
    }
}

impl Metrics for ReplicaState {
    fn log(&mut self, level: Level, message: String) -> wasmtime::Result<()> {
        self.push_log(level, &message);
        Ok(())
    }

    fn scalar(&mut self, name: String, value: f64) -> wasmtime::Result<()> {
        self.push_scalar(&name, value);
        Ok(())
    }
}
