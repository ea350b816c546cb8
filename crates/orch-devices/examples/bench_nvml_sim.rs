//! How long one inventory read takes through NVML (the simulated NVML library `ORCH_NVML_LIBRARY`
//! names, serving `ORCH_NVML_SIM`) and through the `sim:` backend reading the same file directly:
//! `nvml::read()` against `sim::read()`, in alternating rounds, medians and their ratio.
//! Run by `scripts/bench-nvml-sim.sh`, which sets the two variables.
//!
//!   bench_nvml_sim FILE [READS]

use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

fn median(samples: &mut [Duration]) -> Duration {
    samples.sort_unstable();
    samples[samples.len() / 2]
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let Some(file) = args.get(1) else {
        eprintln!("usage: bench_nvml_sim FILE [READS]");
        return ExitCode::from(2);
    };
    let reads: usize = match args.get(2).map(|n| n.parse::<usize>()) {
        None => 400,
        Some(Ok(n)) if n >= 4 => n,
        Some(_) => {
            eprintln!("READS is a whole number of at least 4");
            return ExitCode::from(2);
        }
    };
    if std::env::var_os("ORCH_NVML_LIBRARY").is_none() {
        eprintln!("set ORCH_NVML_LIBRARY (the simulated library) and ORCH_NVML_SIM={file}");
        return ExitCode::from(2);
    }
    let path = Path::new(file);
    let nvml_read = || orch_devices::nvml::read().map(|d| d.len());
    let sim_read = || orch_devices::sim::read(path).map(|d| d.len());
    // Both read the same box, once before timing (the first load of the library included there).
    match (nvml_read(), sim_read()) {
        (Ok(a), Ok(b)) if a == b => println!("{a} GPUs, {reads} reads each"),
        (Ok(a), Ok(b)) => {
            eprintln!("NVML reads {a} GPUs but the file has {b}: is ORCH_NVML_SIM {file}?");
            return ExitCode::FAILURE;
        }
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    }
    let (mut through_nvml, mut direct) = (Vec::new(), Vec::new());
    for _round in 0..4 {
        for _ in 0..reads / 4 {
            let start = Instant::now();
            if let Err(e) = nvml_read() {
                eprintln!("{e}");
                return ExitCode::FAILURE;
            }
            through_nvml.push(start.elapsed());
        }
        for _ in 0..reads / 4 {
            let start = Instant::now();
            if let Err(e) = sim_read() {
                eprintln!("{e}");
                return ExitCode::FAILURE;
            }
            direct.push(start.elapsed());
        }
    }
    let (a, b) = (median(&mut through_nvml), median(&mut direct));
    println!(
        "nvml::read() through the simulated NVML library: {:.1} µs (median)",
        a.as_secs_f64() * 1e6
    );
    println!(
        "sim::read() of the same file:                    {:.1} µs (median)",
        b.as_secs_f64() * 1e6
    );
    println!("ratio nvml/sim: {:.2}", a.as_secs_f64() / b.as_secs_f64());
    ExitCode::SUCCESS
}
