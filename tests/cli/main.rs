//! End-to-end tests of the `orch` binary: what a user types, what they read, the exit status.

mod accounting;
mod authority;
mod batch_alloc;
mod batch_arrays;
mod batch_deps;
mod batch_signal;
mod bind;
mod browser;
mod constrain;
mod devices;
mod edges;
mod fairshare;
mod faults;
mod health;
mod held_leases;
mod languages;
mod manual;
mod mig;
mod nvml_sim;
mod one_path;
mod operate;
mod page_charts;
mod plan;
mod plugin_host;
mod policy_budget;
mod run;
mod serve;
mod serve_plugins;
mod slurm;
mod submit;
mod tenants;
mod tls;
mod topology_place;
mod train;
mod trust_daemon;
mod trust_output;
mod trust_trainer;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The repository root (tests run from the crate's folder).
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("repository root")
}

pub fn lab_sim() -> String {
    format!(
        "sim:{}",
        root().join("examples/sim/lab-8gpu.toml").display()
    )
}

/// Tests that compile large components (a Python or JavaScript plugin: tens of CPU-seconds) hold
/// this while they run, one at a time: the latency the streaming test measures is then the
/// daemon's, not a neighbour test's compile.
pub fn heavy() -> std::sync::MutexGuard<'static, ()> {
    static HEAVY: std::sync::Mutex<()> = std::sync::Mutex::new(());
    HEAVY
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// `orch ARGS` with a clean device environment plus `env`.
pub fn orch(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_orch"));
    cmd.args(args).current_dir(root());
    for var in [
        "CUDA_VISIBLE_DEVICES",
        "CUDA_DEVICE_ORDER",
        "SLURM_STEP_GPUS",
        "SLURM_JOB_GPUS",
        "ORCH_DEVICES",
        "RUST_LOG",
    ] {
        cmd.env_remove(var);
    }
    cmd.envs(env.iter().copied());
    cmd.output().expect("orch runs")
}

pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// True when this machine has a working NVIDIA driver (the no-GPU expectations do not apply).
pub fn has_nvml() -> bool {
    orch_devices::nvml::read().is_ok()
}

/// A new folder of this test's own under the temporary folder, `orch-TAG-PID-NANOS`.
pub fn scratch_dir(tag: &str) -> PathBuf {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let dir = std::env::temp_dir().join(format!("orch-{tag}-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Builds `examples/policies/NAME` with cargo alone, as a user would (release, wasm32-wasip2),
/// in one target folder all such tests share (wit-bindgen is built once); the component's path.
pub fn build_example_policy(name: &str) -> PathBuf {
    let example = root().join("examples/policies").join(name);
    let target = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("coolest-target");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
    let built = Command::new(cargo)
        .args([
            "build",
            "--release",
            "--target",
            "wasm32-wasip2",
            "--target-dir",
        ])
        .arg(&target)
        .current_dir(&example)
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .output()
        .expect("cargo runs");
    assert!(
        built.status.success(),
        "{}",
        String::from_utf8_lossy(&built.stderr)
    );
    target.join(format!(
        "wasm32-wasip2/release/{}.wasm",
        name.replace('-', "_")
    ))
}

/// A port nobody listens on now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// This user's name.
pub fn me() -> String {
    stdout(
        &std::process::Command::new("id")
            .arg("-un")
            .output()
            .unwrap(),
    )
    .trim()
    .to_string()
}
