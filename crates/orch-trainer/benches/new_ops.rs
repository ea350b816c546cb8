//! What a contract 0.3.0 op costs across the Wasm boundary. Run:
//! `cargo bench -p orch-trainer --bench new_ops`.
//!
//! `maximum` of two 64-element tensors (and dropping the result), `ITERS` times in one
//! `train-step` of the fixture trainer (mode `bench-new-op`), beside the same op called natively
//! on orch-tensor. Per-call cost = (run with N calls - run with 0 calls) / N, so instantiation
//! and data loading cancel out; each side is the median of 5 runs.

use orch_core::job::{self, JobSpec, Work};
use orch_tensor::{MemoryPool, Tensor};
use orch_trainer::{GrantedDevice, RunOptions, TrainJob, train};
use std::hint::black_box;
use std::path::Path;
use std::time::Instant;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

const ITERS: u64 = 100_000;

fn main() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let fixture = Path::new(orch_trainer::TRAINER_WASM_DIR).join("trainer_fixture.wasm");
    let digits =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/digits/data/digits.csv.gz");
    let make = |n: u64| -> Result<JobSpec> {
        let path = dir.path().join(format!("new-op-{n}.toml"));
        let text = format!(
            "[job]\nname = \"new-op-{n}\"\n[train]\nplugin = \"{}\"\nepochs = 1\nbatch_size = 1797\n[train.data]\nformat = \"csv\"\ntrain = \"{}\"\n[train.config]\nmode = \"bench-new-op\"\niters = \"{n}\"",
            fixture.display(),
            digits.display()
        );
        std::fs::write(&path, &text)?;
        Ok(job::parse(&path, &text)?)
    };
    let (none, many) = (make(0)?, make(ITERS)?);
    run_secs(&none)?; // compiles and caches the component
    let base = median(|| run_secs(&none))?;
    let with = median(|| run_secs(&many))?;
    let wasm = (with - base) / ITERS as f64;

    let pool = MemoryPool::cpu();
    let a = Tensor::full(&[64], 1.0, &pool)?;
    let b = Tensor::full(&[64], 2.0, &pool)?;
    let native = median(|| {
        let started = Instant::now();
        for _ in 0..ITERS {
            drop(black_box(a.maximum(&b)?));
        }
        Ok(started.elapsed().as_secs_f64())
    })? / ITERS as f64;
    println!("maximum [64] and [64], {ITERS} calls, median of 5:");
    println!("  from wasm  {:>8.2} us/call", wasm * 1e6);
    println!("  native     {:>8.2} us/call", native * 1e6);
    println!("  boundary   {:>8.2} us/call", (wasm - native) * 1e6);
    Ok(())
}

fn run_secs(job: &JobSpec) -> Result<f64> {
    let Work::Train(spec) = &job.work else {
        return Err("not a train job".into());
    };
    let options = RunOptions {
        stop_after: Some(1),
        cache_dir: Some(Path::new(env!("CARGO_TARGET_TMPDIR")).join("orch-trainer-cache")),
        ..RunOptions::default()
    };
    let devices = [GrantedDevice::cpu()];
    let train_job = TrainJob {
        name: &job.name,
        spec,
        memory_limit: None,
    };
    Ok(train(&train_job, &devices, &options)?.seconds)
}

fn median(mut f: impl FnMut() -> Result<f64>) -> Result<f64> {
    let mut times = (0..5).map(|_| f()).collect::<Result<Vec<f64>>>()?;
    times.sort_by(f64::total_cmp);
    Ok(times[2])
}
