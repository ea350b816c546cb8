//! A `[train]` job: the Wasm trainer (orch-trainer) on the devices the lease holds. A simulated
//! GPU computes on the CPU with its memory as the cap, the CPU inventory is the host CPU, an NVML
//! GPU is the CUDA device with its UUID; the job's `memory_limit` is the per-device quota.

use crate::error::RunError;
use crate::plan::Plan;
use orch_core::ByteSize;
use orch_core::job::{JobSpec, Work};
use orch_devices::{Backend, Inventory};
use orch_tensor::Device;
use orch_trainer::{GrantedDevice, Prepared, ProgressSink, RunOptions, TrainJob};

/// Everything the job needs that no device does: the trainer read, compiled and checked, the
/// data loaded. Done before the lease, so a typo in a path fails at once, not after a wait for
/// GPUs, and the leased devices do not sit idle while the data loads.
pub(crate) fn prepare(
    job: &JobSpec,
    resume: bool,
    progress: Option<ProgressSink>,
) -> Result<crate::runner::Prepared<'_>, RunError> {
    prepare_in(job, resume, progress, None)
}

/// [`prepare`] with the compiled-component cache at `cache_dir` (`None`: this process's
/// default), for a trainer run on behalf of another user.
pub(crate) fn prepare_in(
    job: &JobSpec,
    resume: bool,
    progress: Option<ProgressSink>,
    cache_dir: Option<std::path::PathBuf>,
) -> Result<crate::runner::Prepared<'_>, RunError> {
    let Work::Train(spec) = &job.work else {
        return Err(RunError::BadInput(format!(
            "{}: --resume is for [train] jobs",
            job.path.display()
        )));
    };
    let train_job = TrainJob {
        name: &job.name,
        spec,
        memory_limit: job.resources.memory_limit.map(ByteSize::bytes),
    };
    let options = RunOptions {
        resume,
        progress,
        cache_dir,
        ..RunOptions::default()
    };
    Ok(crate::runner::Prepared::Train(Box::new(Prepared::new(
        &train_job, &options,
    )?)))
}

/// The devices of `plan`, as the trainer opens them.
pub(crate) fn granted(
    job: &JobSpec,
    plan: &Plan,
    inventory: &Inventory,
) -> Result<Vec<GrantedDevice>, RunError> {
    plan.chosen
        .iter()
        .map(|chosen| {
            let device = chosen.in_inventory(inventory);
            Ok(GrantedDevice {
                device: match inventory.backend {
                    Backend::Cpu => Device::Cpu,
                    Backend::Sim => Device::Sim(chosen.physical_index as usize),
                    // CUDA numbers devices its own way (CUDA_DEVICE_ORDER, CUDA_VISIBLE_DEVICES):
                    // the UUID is the one name both NVML and CUDA agree on.
                    Backend::Nvml => Device::Cuda(
                        orch_devices::cuda::ordinal_of_uuid(&chosen.uuid).map_err(|e| {
                            RunError::Device(format!(
                                "job {}: cannot open GPU {} for training: {e}",
                                job.name, chosen.physical_index
                            ))
                        })?,
                    ),
                },
                name: chosen.name.clone(),
                memory_total: device.and_then(|d| d.memory_total_bytes),
                memory_free: chosen.memory_free,
                pool: None,
            })
        })
        .collect()
}
