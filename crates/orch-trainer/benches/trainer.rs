//! What the Wasm boundary costs. Run: `cargo bench -p orch-trainer --bench trainer`.
//!
//! 1. One small tensor op (an add of two 4-element tensors, and dropping its result) called from
//!    a Wasm trainer, beside the same op called natively; and one trivial call (`tensor.device`).
//!    Per-call cost = (run with N calls - run with 0 calls) / N, so instantiation and data loading
//!    cancel out.
//! 2. An MNIST epoch (784-512-256-10 MLP, batch 128, SGD momentum) trained by the built-in `mlp`
//!    Wasm trainer, beside the same model written natively against orch-tensor with the same
//!    data pipeline, and PyTorch CPU with the same model, batch, optimizer and pipeline
//!    (`scripts/bench_mnist_torch.py`, run by the Python of `ORCH_BENCH_PYTHON`, default
//!    `/tmp/orch-bench-venv/bin/python`, when it has torch). The sides alternate, round by round
//!    (`ORCH_BENCH_ROUNDS`, default 5), and each keeps its best: the machines here are shared.
//!    `ORCH_BENCH_STEPS=N` limits every side to N steps.

use orch_core::job::{self, JobSpec, Work};
use orch_data::{EpochOrder, Split, load_mnist};
use orch_tensor::optim::{Optimizer, Sgd, SgdConfig};
use orch_tensor::{MemoryPool, Tensor};
use orch_trainer::{GrantedDevice, RunOptions, TrainJob, train};
use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::time::Instant;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

fn main() -> Result<()> {
    let dir = tempfile::tempdir()?;
    boundary(dir.path())?;
    mnist(dir.path())?;
    Ok(())
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn cpu() -> Vec<GrantedDevice> {
    vec![GrantedDevice::cpu()]
}

fn options(stop_after: u64) -> RunOptions {
    RunOptions {
        stop_after: Some(stop_after),
        cache_dir: Some(Path::new(env!("CARGO_TARGET_TMPDIR")).join("orch-trainer-cache")),
        ..RunOptions::default()
    }
}

fn job(dir: &Path, name: &str, body: &str) -> Result<JobSpec> {
    let path = dir.join(format!("{name}.toml"));
    let text = format!("[job]\nname = \"{name}\"\n{body}");
    std::fs::write(&path, &text)?;
    Ok(job::parse(&path, &text)?)
}

fn run_secs(job: &JobSpec, stop_after: u64) -> Result<f64> {
    let Work::Train(spec) = &job.work else {
        return Err("not a train job".into());
    };
    // From the replicas' start to the end: data loading and compiling are not counted.
    let summary = train(
        &TrainJob {
            name: &job.name,
            spec,
            memory_limit: None,
        },
        &cpu(),
        &options(stop_after),
    )?;
    Ok(summary.seconds)
}

/// Median of `runs` timings of `f`.
fn median(runs: usize, mut f: impl FnMut() -> Result<f64>) -> Result<f64> {
    let mut times = (0..runs).map(|_| f()).collect::<Result<Vec<f64>>>()?;
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}

fn boundary(dir: &Path) -> Result<()> {
    let fixture = Path::new(orch_trainer::TRAINER_WASM_DIR).join("trainer_fixture.wasm");
    let digits = root().join("examples/digits/data/digits.csv.gz");
    let iters = 200_000u64;
    println!("one small op across the Wasm boundary ({iters} calls, median of 5):");
    for mode in ["bench-op", "bench-call"] {
        let make = |n: u64| {
            job(
                dir,
                &format!("{mode}-{n}"),
                &format!(
                    "[train]\nplugin = \"{}\"\nepochs = 1\nbatch_size = 1797\n[train.data]\nformat = \"csv\"\ntrain = \"{}\"\n[train.config]\nmode = \"{mode}\"\niters = \"{n}\"",
                    fixture.display(),
                    digits.display()
                ),
            )
        };
        let (none, many) = (make(0)?, make(iters)?);
        run_secs(&none, 1)?; // compiles and caches the component
        let base = median(5, || run_secs(&none, 1))?;
        let with = median(5, || run_secs(&many, 1))?;
        let per_call = (with - base) / iters as f64;
        let what = if mode == "bench-op" {
            "wasm: add [4]+[4] and drop the result"
        } else {
            "wasm: tensor.device() (no op)"
        };
        println!("  {what:<44} {:>8.0} ns/call", per_call * 1e9);
    }
    let pool = MemoryPool::cpu();
    let a = Tensor::full(&[4], 1.0, &pool)?;
    let b = Tensor::full(&[4], 2.0, &pool)?;
    let native = median(5, || {
        let started = Instant::now();
        for _ in 0..iters {
            black_box(a.add(black_box(&b))?);
        }
        Ok(started.elapsed().as_secs_f64())
    })?;
    println!(
        "  {:<44} {:>8.0} ns/call",
        "native: add [4]+[4] and drop the result",
        native / iters as f64 * 1e9
    );
    Ok(())
}

fn mnist(dir: &Path) -> Result<()> {
    let data = root().join("examples/mnist/data");
    let batch = 128;
    let per_epoch = 60_000usize.div_ceil(batch) as u64;
    let steps: u64 = std::env::var("ORCH_BENCH_STEPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(per_epoch - 1);
    println!(
        "MNIST MLP 784-512-256-10, batch {batch}, SGD momentum 0.9, {steps} steps (one epoch: {per_epoch}):"
    );
    let wasm_job = job(
        dir,
        "mnist",
        &format!(
            "[train]\nplugin = \"mlp\"\nepochs = 1\nbatch_size = {batch}\nseed = 1\n[train.data]\nformat = \"mnist-idx\"\ntrain = \"{}\"\n[train.config]\nhidden = \"512,256\"\nlr = 0.05",
            data.display()
        ),
    )?;
    let mut train_set = load_mnist(&data, Split::Train)?;
    let (mean, std) = train_set.moments();
    train_set.standardize(mean, std);
    let torch = pytorch();
    let rounds: usize = std::env::var("ORCH_BENCH_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    // The native side computes inside a rayon pool of all cores, as a trainer replica does.
    let pool = rayon::ThreadPoolBuilder::new().build()?;
    let (mut wasm, mut native, mut torch_best) = (f64::MAX, f64::MAX, f64::MAX);
    for _ in 0..rounds {
        wasm = wasm.min(run_secs(&wasm_job, steps)?);
        let secs =
            pool.install(|| native_steps(&train_set, batch, steps).map_err(|e| e.to_string()))?;
        native = native.min(secs);
        if let Some(python) = &torch {
            torch_best = torch_best.min(pytorch_secs(python, steps)?);
        }
    }
    let line = |what: &str, secs: f64| {
        println!(
            "  {:<44} {:>8.2} s  ({:.0} samples/s)",
            what,
            secs,
            (steps as f64 * batch as f64) / secs
        );
    };
    line("wasm trainer `mlp`", wasm);
    line("native orch-tensor, same model and pipeline", native);
    match &torch {
        Some(_) => line("PyTorch CPU, same model, batch and optimizer", torch_best),
        None => println!(
            "  PyTorch: no Python with torch (set ORCH_BENCH_PYTHON, or run scripts/bench-tensor.sh once to make /tmp/orch-bench-venv)"
        ),
    }
    println!("  wasm / native: {:.3}x", wasm / native);
    if torch.is_some() {
        println!("  wasm / PyTorch: {:.3}x", wasm / torch_best);
    }
    Ok(())
}

/// A Python that imports torch: `ORCH_BENCH_PYTHON`, else the venv scripts/bench-tensor.sh makes.
fn pytorch() -> Option<PathBuf> {
    let python = std::env::var_os("ORCH_BENCH_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/tmp/orch-bench-venv/bin/python"));
    let ok = std::process::Command::new(&python)
        .args(["-c", "import torch"])
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    ok.then_some(python)
}

/// One round of scripts/bench_mnist_torch.py: its `kv pytorch_seconds` line.
fn pytorch_secs(python: &Path, steps: u64) -> Result<f64> {
    let out = std::process::Command::new(python)
        .arg(root().join("scripts/bench_mnist_torch.py"))
        .args(["1", &steps.to_string()])
        .env_remove("OPENBLAS_CORETYPE")
        .env_remove("OPENBLAS_L2_SIZE")
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(|l| l.strip_prefix("kv pytorch_seconds "))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| {
            format!(
                "bench_mnist_torch.py printed no time: {}",
                String::from_utf8_lossy(&out.stderr)
            )
            .into()
        })
}

/// The `mlp` trainer's model and step, natively: gather the batch, upload it, forward,
/// cross-entropy, backward, SGD step, read the loss.
fn native_steps(train_set: &orch_data::Dataset, batch: usize, steps: u64) -> Result<f64> {
    let pool = MemoryPool::cpu();
    let sizes = [784usize, 512, 256, 10];
    let mut layers = Vec::new();
    for (i, pair) in sizes.windows(2).enumerate() {
        let w = Tensor::randn(&[pair[0], pair[1]], i as u64, &pool)?
            .mul_scalar((2.0 / pair[0] as f32).sqrt())?
            .with_requires_grad();
        let b = Tensor::zeros(&[pair[1]], &pool)?.with_requires_grad();
        layers.push((w, b));
    }
    let params = layers
        .iter()
        .flat_map(|(w, b)| [w.clone(), b.clone()])
        .collect();
    let mut sgd = Sgd::new(
        params,
        SgdConfig {
            momentum: 0.9,
            ..SgdConfig::new(0.05)
        },
    )?;
    let order = EpochOrder::shuffled(train_set.len(), batch, 1, 0);
    let started = Instant::now();
    for step in 0..steps as usize {
        let (x, y) = train_set.gather(order.batch(step));
        let rows = y.len();
        let x = Tensor::from_vec(x, &[rows, 784], &pool)?;
        let y = Tensor::from_vec(y.iter().map(|&l| l as f32).collect(), &[rows], &pool)?;
        let mut h = x.matmul(&layers[0].0)?.add(&layers[0].1)?;
        for (w, b) in &layers[1..] {
            h = h.relu()?.matmul(w)?.add(b)?;
        }
        let loss = h.cross_entropy(&y)?;
        sgd.zero_grad();
        loss.backward()?;
        sgd.step()?;
        black_box(loss.to_scalar()?);
    }
    Ok(started.elapsed().as_secs_f64())
}
