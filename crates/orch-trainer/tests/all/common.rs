//! Jobs, devices and runs for the tests.

use orch_core::job::{self, JobSpec, TrainSpec, Work};
use orch_tensor::{Device, MemoryPool};
use orch_trainer::checkpoint::Checkpoint;
use orch_trainer::safetensors::NamedTensor;
use orch_trainer::{GrantedDevice, RunOptions, Summary, TrainError, TrainJob, train};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The bundled 8x8 digits: 1797 samples, 64 features, 10 classes.
pub fn digits() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/digits/data/digits.csv.gz")
}

/// The test fixture component.
pub fn fixture() -> PathBuf {
    Path::new(orch_trainer::TRAINER_WASM_DIR).join("trainer_fixture.wasm")
}

/// A job in `dir` whose `[train]` table is `train` plus the digits data (as its own test set).
pub fn job(dir: &Path, train: &str) -> JobSpec {
    let digits = digits();
    let text = format!(
        "[job]\nname = \"t\"\n[train]\n{train}\n[train.data]\nformat = \"csv\"\ntrain = \"{d}\"\ntest = \"{d}\"\nscale = 16\n",
        d = digits.display()
    );
    let path = dir.join("job.toml");
    std::fs::write(&path, &text).expect("write job.toml");
    job::parse(&path, &text).unwrap_or_else(|e| panic!("{e}\n{text}"))
}

pub fn spec(job: &JobSpec) -> &TrainSpec {
    match &job.work {
        Work::Train(t) => t,
        Work::Command(_) => panic!("not a train job"),
    }
}

pub fn cpu() -> Vec<GrantedDevice> {
    vec![GrantedDevice::cpu()]
}

/// `n` simulated GPUs of `bytes` each, with their device-wide pools (to check what is freed).
pub fn sims(n: usize, bytes: u64) -> (Vec<GrantedDevice>, Vec<Arc<MemoryPool>>) {
    let pools: Vec<Arc<MemoryPool>> = (0..n)
        .map(|i| MemoryPool::new(Device::Sim(i), Some(bytes)).expect("sim pool"))
        .collect();
    let devices = pools
        .iter()
        .enumerate()
        .map(|(i, pool)| GrantedDevice {
            device: Device::Sim(i),
            name: format!("sim {i}"),
            memory_total: Some(bytes),
            memory_free: Some(bytes),
            pool: Some(Arc::clone(pool)),
        })
        .collect();
    (devices, pools)
}

/// Options for tests: quiet, compiled components cached for the whole test run.
pub fn options() -> RunOptions {
    RunOptions {
        cache_dir: Some(Path::new(env!("CARGO_TARGET_TMPDIR")).join("orch-trainer-cache")),
        ..RunOptions::default()
    }
}

pub fn run(
    job: &JobSpec,
    devices: &[GrantedDevice],
    options: &RunOptions,
) -> Result<Summary, TrainError> {
    let train_job = TrainJob {
        name: &job.name,
        spec: spec(job),
        memory_limit: job.resources.memory_limit.map(|s| s.bytes()),
    };
    train(&train_job, devices, options)
}

/// The parameters of the run's last checkpoint.
pub fn final_params(job: &JobSpec) -> Vec<NamedTensor> {
    Checkpoint::load(&spec(job).out.join("checkpoint"))
        .expect("a checkpoint")
        .params
}

/// Largest `|a - b| / max(|a|, |b|, 1e-3)` over all parameters (same names and shapes).
pub fn max_relative_difference(a: &[NamedTensor], b: &[NamedTensor]) -> f32 {
    assert_eq!(a.len(), b.len());
    let mut worst = 0.0f32;
    for (x, y) in a.iter().zip(b) {
        assert_eq!((&x.name, &x.shape), (&y.name, &y.shape));
        for (u, v) in x.data.iter().zip(&y.data) {
            let rel = (u - v).abs() / u.abs().max(v.abs()).max(1e-3);
            worst = worst.max(rel);
        }
    }
    worst
}
