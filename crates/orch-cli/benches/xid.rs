//! Xid-to-unhealthy latency: the time from writing a new `xid_errors` entry into the sim file to
//! the daemon's `/v1/devices` saying the GPU is `unhealthy` [goal ≤ 1 s], N times, p50 and max:
//! - through the simulated NVML library (`--devices nvml`, `ORCH_NVML_LIBRARY`): the entry is an
//!   Xid event, delivered to the daemon's waiting `nvmlEventSetWait_v2`;
//! - through the sim backend (`--devices sim:FILE`): the daemon's device watcher reads the
//!   changed file.
//!
//! Between repetitions the GPU is put back (`POST /v1/devices/N/undrain`, which forgets the
//! recorded Xid; the sim file keeps its list, so the next entry is the next event) and the bench
//! waits until `/v1/devices` says `ok` again. The clock runs from the rename of the new file over
//! the old one to the first answer that says `unhealthy`, polled every millisecond.
//!
//! `cargo build --release -p orch-nvml-sim && cargo bench -p orch-cli --bench xid [-- N]`
//! (default N = 20; the library is looked for beside the `orch` under test).

// Of the shared helpers this bench uses the request alone.
#[allow(dead_code)]
mod common;

use common::http;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const GPUS: usize = 4;

struct Daemon {
    child: Child,
    socket: PathBuf,
}

impl Daemon {
    fn start(state: &Path, devices: &str, env: &[(&str, String)]) -> Daemon {
        std::fs::create_dir_all(state).unwrap();
        let log = std::fs::File::create(state.join("daemon.log")).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_orch"))
            .arg("serve")
            .env("ORCH_STATE_DIR", state)
            .env("ORCH_DEVICES", devices)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let socket = state.join("orch.sock");
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::os::unix::net::UnixStream::connect(&socket).is_err() {
            assert!(Instant::now() < deadline, "the daemon never listened");
            std::thread::sleep(Duration::from_millis(10));
        }
        Daemon { child, socket }
    }

    /// GPU `index`'s state in `/v1/devices`.
    fn state(&self, index: usize) -> String {
        let (status, body) = http(&self.socket, "GET", "/v1/devices", "");
        assert_eq!(status, 200, "{body}");
        let devices: serde_json::Value = serde_json::from_str(&body).unwrap();
        devices[index]["state"].as_str().unwrap_or("").to_string()
    }

    /// Polls until GPU `index` is in `want`; the time since `from`.
    fn until(&self, index: usize, want: &str, from: Instant) -> Duration {
        loop {
            if self.state(index) == want {
                return from.elapsed();
            }
            assert!(
                from.elapsed() < Duration::from_secs(30),
                "GPU {index} never became {want}"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The sim file with `xids[i]` as GPU `i`'s `xid_errors`.
fn sim_text(xids: &[Vec<u32>]) -> String {
    xids.iter()
        .map(|list| {
            let list: Vec<String> = list.iter().map(u32::to_string).collect();
            format!(
                "[[gpu]]\nname = \"NVIDIA H100 80GB HBM3\"\nmemory_total = \"80GiB\"\nxid_errors = [{}]\n",
                list.join(", ")
            )
        })
        .collect()
}

/// `runs` repetitions against a daemon of `devices`: the latency of each.
fn measure(
    work: &Path,
    name: &str,
    devices: &str,
    env: &[(&str, String)],
    runs: usize,
) -> Vec<Duration> {
    let sim = work.join("sim.toml");
    let mut xids = vec![Vec::new(); GPUS];
    std::fs::write(&sim, sim_text(&xids)).unwrap();
    let devices = devices.replace("SIM", &sim.display().to_string());
    let d = Daemon::start(&work.join(name), &devices, env);
    // The daemon's Xid thread registers its event set as it starts (a sim daemon has none).
    let log = work.join(name).join("daemon.log");
    let deadline = Instant::now() + Duration::from_secs(10);
    while devices == "nvml"
        && !std::fs::read_to_string(&log)
            .unwrap_or_default()
            .contains("waiting for Xid events")
    {
        assert!(
            Instant::now() < deadline,
            "the daemon waits for no Xid event"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut took = Vec::with_capacity(runs);
    for run in 0..runs {
        let gpu = run % GPUS;
        xids[gpu].push(79);
        let next = sim.with_extension("next");
        std::fs::write(&next, sim_text(&xids)).unwrap();
        let written = Instant::now();
        std::fs::rename(&next, &sim).unwrap();
        took.push(d.until(gpu, "unhealthy", written));
        // Put back: a drain's end forgets the recorded event; the sim backend reads the list
        // as it is, so there the entry is taken out of the file too.
        if devices.starts_with("sim:") {
            xids[gpu].clear();
            std::fs::write(&next, sim_text(&xids)).unwrap();
            std::fs::rename(&next, &sim).unwrap();
        }
        let (status, body) = http(&d.socket, "POST", &format!("/v1/devices/{gpu}/undrain"), "");
        assert_eq!(status, 200, "{body}");
        d.until(gpu, "ok", Instant::now());
    }
    took
}

fn report(name: &str, mut took: Vec<Duration>) {
    took.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let p50 = took[(took.len() - 1) / 2];
    let max = *took.last().unwrap();
    println!(
        "{name}: {} runs, p50 {:.1} ms, max {:.1} ms (goal ≤ 1000 ms)",
        took.len(),
        ms(p50),
        ms(max)
    );
}

fn main() {
    let runs: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(20);
    let orch = PathBuf::from(env!("CARGO_BIN_EXE_orch"));
    let library = orch.parent().unwrap().join("liborch_nvml_sim.so");
    let work = std::env::temp_dir().join(format!("orch-bench-xid-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).unwrap();
    if library.is_file() {
        let env = [
            ("ORCH_NVML_LIBRARY", library.display().to_string()),
            ("ORCH_NVML_SIM", work.join("sim.toml").display().to_string()),
        ];
        let took = measure(&work, "nvml", "nvml", &env, runs);
        report("through the simulated NVML library (an Xid event)", took);
    } else {
        println!(
            "skipped the NVML half: {} is missing (cargo build --release -p orch-nvml-sim)",
            library.display()
        );
    }
    let took = measure(&work, "sim", "sim:SIM", &[], runs);
    report("through the sim backend (the watcher reads the file)", took);
    let _ = std::fs::remove_dir_all(&work);
}
