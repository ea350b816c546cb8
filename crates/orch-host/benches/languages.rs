//! What a placement policy costs by the language it is written in: the same `coolest` policy
//! (examples/policies/coolest, coolest-py, coolest-js) built with cargo, componentize-py and
//! componentize-js, run through the public `PolicyHost` API. For each: the component's size,
//! the first compile (no cache), a load from the disk cache, a warm decision at 8 and 64
//! candidates, a fresh-instance decision (instantiation included) at 8, and the smallest memory
//! cap under which a fresh instance decides.
//!
//! `scripts/bench-languages.sh` builds the three and runs this in release. By hand:
//!
//! ```sh
//! ORCH_BENCH_RUST=…/coolest.wasm ORCH_BENCH_PYTHON=…/coolest-py.wasm \
//!   ORCH_BENCH_JAVASCRIPT=…/coolest-js.wasm cargo bench -p orch-host --bench languages
//! ```
//!
//! A language whose variable is unset is left out. The timings run under a 2 s deadline and a
//! 256 MiB memory cap (`ORCH_BENCH_DEADLINE_MS`, `ORCH_BENCH_MEMORY_MIB`), so that a slow
//! language is measured rather than stopped; the last column says what each needs.

use orch_host::types::Decision;
use orch_host::{Limits, PolicyHost};
use std::hint::black_box;
use std::path::PathBuf;
use std::time::{Duration, Instant};

mod common;

use common::{candidates, request};

/// Time per call of `f`: the best of 7 batches, each sized to take about 50 ms (the machines
/// this runs on are shared; the best batch is the one least disturbed).
fn time(mut f: impl FnMut()) -> Duration {
    let start = Instant::now();
    f(); // warm up, and an estimate
    let once = start.elapsed().max(Duration::from_nanos(100));
    let per_batch =
        (Duration::from_millis(50).as_nanos() / once.as_nanos()).clamp(3, 20_000) as u32;
    (0..7)
        .map(|_| {
            let start = Instant::now();
            for _ in 0..per_batch {
                f();
            }
            start.elapsed() / per_batch
        })
        .min()
        .unwrap_or_default()
}

fn micros(d: Duration) -> String {
    format!("{:.1} µs", d.as_secs_f64() * 1e6)
}

fn millis(d: Duration) -> String {
    let ms = d.as_secs_f64() * 1e3;
    if ms < 10.0 {
        format!("{ms:.2} ms")
    } else {
        format!("{ms:.0} ms")
    }
}

fn size(bytes: usize) -> String {
    if bytes < 1_000_000 {
        format!("{:.0} KB", bytes as f64 / 1e3)
    } else {
        format!("{:.1} MB", bytes as f64 / 1e6)
    }
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn limits(memory_bytes: usize) -> Limits {
    Limits {
        deadline: Duration::from_millis(env_u64("ORCH_BENCH_DEADLINE_MS", 2000)),
        memory_bytes,
        ..Limits::default()
    }
}

fn fail(what: &str) -> ! {
    eprintln!("{what}");
    std::process::exit(1);
}

/// One row of the table.
struct Row {
    language: &'static str,
    size: usize,
    compile: Duration,
    cached: Duration,
    warm: [Duration; 2],
    fresh: Duration,
    memory_mib: u64,
}

fn measure(language: &'static str, path: &PathBuf, expected: &mut Option<Vec<u32>>) -> Row {
    let wasm = std::fs::read(path)
        .unwrap_or_else(|e| fail(&format!("cannot read {}: {e}", path.display())));
    let name = path.file_name().map_or_else(
        || "plugin".to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    let cap = env_u64("ORCH_BENCH_MEMORY_MIB", 256) as usize * (1 << 20);
    let request = request();

    // First run: no cache anywhere, so loading compiles (Cranelift, every core module).
    let cache = std::env::temp_dir().join(format!("orch-bench-languages-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&cache);
    let mut host = PolicyHost::with_cache_dir(limits(cap), Some(cache.clone()))
        .unwrap_or_else(|e| fail(&format!("cannot start the policy host: {e}")));
    let start = Instant::now();
    let id = host
        .load_bytes(&name, &wasm)
        .unwrap_or_else(|e| fail(&format!("{language}: {e}")));
    let compile = start.elapsed();

    // Another process on the same machine: the compiled form comes from the disk cache.
    let mut again = PolicyHost::with_cache_dir(limits(cap), Some(cache.clone()))
        .unwrap_or_else(|e| fail(&format!("cannot start the policy host: {e}")));
    let start = Instant::now();
    again
        .load_bytes(&name, &wasm)
        .unwrap_or_else(|e| fail(&format!("{language}: {e}")));
    let cached = start.elapsed();

    let mut warm = [Duration::ZERO; 2];
    for (slot, n) in [8, 64].into_iter().enumerate() {
        let offered = candidates(n);
        let decided: Decision = host
            .decide(id, &request, &offered, &[])
            .unwrap_or_else(|e| fail(&format!("{language} at {n} candidates: {e}")));
        if n == 8 {
            // Every language must choose what the first one chose.
            match expected {
                Some(devices) if *devices != decided.devices => fail(&format!(
                    "{language} chose {:?}, the first language {devices:?}",
                    decided.devices
                )),
                Some(_) => {}
                None => *expected = Some(decided.devices.clone()),
            }
        }
        warm[slot] = time(|| {
            black_box(host.decide(id, &request, &offered, &[]).ok());
        });
    }
    let offered = candidates(8);
    let fresh = time(|| {
        host.discard_instance(id);
        black_box(host.decide(id, &request, &offered, &[]).ok());
    });

    // The smallest cap (whole MiB) under which a fresh instance decides: a binary search.
    let decides = |mib: u64| {
        let mut host =
            match PolicyHost::with_cache_dir(limits(mib as usize * (1 << 20)), Some(cache.clone()))
            {
                Ok(host) => host,
                Err(_) => return false,
            };
        host.load_bytes(&name, &wasm)
            .and_then(|id| host.decide(id, &request, &offered, &[]))
            .is_ok()
    };
    let (mut low, mut high) = (0u64, (cap >> 20) as u64);
    if !decides(high) {
        fail(&format!("{language} does not decide within {high} MiB"));
    }
    while high - low > 1 {
        let mid = (low + high) / 2;
        if decides(mid) {
            high = mid;
        } else {
            low = mid;
        }
    }
    let _ = std::fs::remove_dir_all(&cache);
    Row {
        language,
        size: wasm.len(),
        compile,
        cached,
        warm,
        fresh,
        memory_mib: high,
    }
}

fn main() {
    let languages = [
        ("Rust", "ORCH_BENCH_RUST"),
        ("Python", "ORCH_BENCH_PYTHON"),
        ("JavaScript", "ORCH_BENCH_JAVASCRIPT"),
    ];
    let mut expected = None;
    let mut rows = Vec::new();
    for (language, var) in languages {
        match std::env::var_os(var) {
            Some(path) => rows.push(measure(language, &PathBuf::from(path), &mut expected)),
            None => eprintln!("{language}: {var} is not set, left out"),
        }
    }
    if rows.is_empty() {
        fail(
            "no component given: set ORCH_BENCH_RUST, ORCH_BENCH_PYTHON or ORCH_BENCH_JAVASCRIPT (scripts/bench-languages.sh does)",
        );
    }
    println!(
        "policy coolest, request: 2 devices, >= 10 GiB free, <= 90% busy, exclusive; {} core(s)",
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    println!(
        "{:<11} {:>10} {:>12} {:>10} {:>11} {:>11} {:>11} {:>11}",
        "language", "size", "compile", "cached", "warm @8", "warm @64", "fresh @8", "memory"
    );
    for row in rows {
        println!(
            "{:<11} {:>10} {:>12} {:>10} {:>11} {:>11} {:>11} {:>11}",
            row.language,
            size(row.size),
            millis(row.compile),
            millis(row.cached),
            micros(row.warm[0]),
            micros(row.warm[1]),
            micros(row.fresh),
            format!("{} MiB", row.memory_mib)
        );
    }
    println!(
        "compile: the first load, no cache; cached: a load from the disk cache; fresh: \
         instantiation plus decision; memory: the smallest cap under which a fresh instance decides"
    );
}
