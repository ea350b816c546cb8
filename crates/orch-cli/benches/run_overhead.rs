//! What `orch run` adds before a job starts: from starting `orch` to the job's first instruction,
//! for a trivial job on the 8-GPU sim inventory, policy decision and lease claim included; beside
//! the same job started with a hand-set `CUDA_VISIBLE_DEVICES` (what orch replaces).
//!
//! `cargo bench -p orch-cli --bench run_overhead` (release). The job is `/bin/date +%s%N`, whose
//! printed clock marks its own start; the median of 40 runs is reported.

use std::path::PathBuf;
use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

const RUNS: usize = 40;

fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

/// Milliseconds from spawning `cmd` to the job printing its clock, and the whole run.
fn time_once(cmd: &mut Command) -> (f64, f64) {
    let start = now_ns();
    let out = cmd.output().expect("the command runs");
    let end = now_ns();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let job_start: u128 = text
        .trim()
        .lines()
        .last()
        .and_then(|l| l.parse().ok())
        .expect("date printed its clock");
    ((job_start - start) as f64 / 1e6, (end - start) as f64 / 1e6)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn measure(mut make: impl FnMut() -> Command) -> (f64, f64) {
    let (starts, totals): (Vec<f64>, Vec<f64>) = (0..RUNS).map(|_| time_once(&mut make())).unzip();
    (median(starts), median(totals))
}

fn main() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let sim = format!("sim:{}", root.join("examples/sim/lab-8gpu.toml").display());
    let state = std::env::temp_dir().join(format!("orch-bench-{}", std::process::id()));
    let cache = state.join("cache");
    let orch = |policy: &str| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_orch"));
        c.args([
            "run",
            "--gpus",
            "1",
            "--policy",
            policy,
            "--",
            "/bin/date",
            "+%s%N",
        ])
        .env("ORCH_DEVICES", &sim)
        .env("ORCH_STATE_DIR", &state)
        .env("ORCH_CACHE_DIR", &cache)
        .env("RUST_LOG", "warn");
        c
    };
    // The first run compiles the policy component and caches it on disk; later runs load it.
    let (cold, _) = time_once(&mut orch("least-loaded"));
    let (least_start, least_total) = measure(|| orch("least-loaded"));
    let (first_start, first_total) = measure(|| orch("first-fit"));
    let (hand_start, hand_total) = measure(|| {
        let mut c = Command::new("/bin/date");
        c.arg("+%s%N").env(
            "CUDA_VISIBLE_DEVICES",
            "GPU-1c7b4a55-0f0e-4d5c-9b37-6a2e0e1d4c21",
        );
        c
    });
    println!("orch run overhead (median of {RUNS}, ms; job = /bin/date on the 8-GPU sim)");
    println!(
        "{:<46} {:>14} {:>12}",
        "how the job was started", "to job start", "whole run"
    );
    println!(
        "{:<46} {:>14.2} {:>12.2}",
        "hand-set CUDA_VISIBLE_DEVICES (baseline)", hand_start, hand_total
    );
    println!(
        "{:<46} {:>14.2} {:>12.2}",
        "orch run --gpus 1 --policy least-loaded", least_start, least_total
    );
    println!(
        "{:<46} {:>14.2} {:>12.2}",
        "orch run --gpus 1 --policy first-fit", first_start, first_total
    );
    println!(
        "{:<46} {:>14.2} {:>12}",
        "orch run, first ever (policy compiled, cached)", cold, ""
    );
    println!(
        "orch adds {:.2} ms before the job starts (target <= 20 ms)",
        least_start - hand_start
    );
    let _ = std::fs::remove_dir_all(&state);
}
