//! orch's NVML backend run for real against the simulated NVML library
//! (`target/<profile>/liborch_nvml_sim.so`, `cargo build -p orch-nvml-sim`) through
//! `ORCH_NVML_LIBRARY`: the same box as `sim:FILE`, the topology matrix, one-sentence failures,
//! the daemon's device watcher and the device-node confinement by NVML's minor numbers.

use crate::held_leases::http;
use crate::serve::Daemon;
use crate::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The simulated NVML library beside the `orch` under test; `None` (a skip) when it was not built,
/// a failure under `ORCH_REQUIRE_NVML_SIM` (CI builds it before the tests).
pub(crate) fn library(test: &str) -> Option<String> {
    let so = Path::new(env!("CARGO_BIN_EXE_orch"))
        .parent()
        .expect("the binary's folder")
        .join("liborch_nvml_sim.so");
    if so.is_file() {
        return Some(so.display().to_string());
    }
    assert!(
        std::env::var_os("ORCH_REQUIRE_NVML_SIM").is_none(),
        "{test}: {} is missing and ORCH_REQUIRE_NVML_SIM is set: build it with `cargo build -p orch-nvml-sim`",
        so.display()
    );
    eprintln!(
        "{test}: skipped ({} is missing: build it with `cargo build -p orch-nvml-sim`)",
        so.display()
    );
    None
}

/// A daemon of `--devices nvml` over the simulated library `lib` serving `sim`, started.
pub(crate) fn nvml_daemon(tag: &str, lib: &str, sim: &Path) -> Daemon {
    let mut d = Daemon::prepare(tag);
    d.devices = Some("nvml".into());
    d.env = vec![
        ("ORCH_NVML_LIBRARY", lib.to_string()),
        ("ORCH_NVML_SIM", sim.display().to_string()),
    ];
    d.restart();
    d
}

/// `orch --devices nvml ARGS` over the simulated library serving `sim`.
pub(crate) fn through_nvml(lib: &str, sim: &Path, args: &[&str]) -> std::process::Output {
    let sim = sim.display().to_string();
    let mut all = vec!["--devices", "nvml"];
    all.extend_from_slice(args);
    orch(
        &all,
        &[("ORCH_NVML_LIBRARY", lib), ("ORCH_NVML_SIM", sim.as_str())],
    )
}

/// `orch --devices sim:FILE ARGS`.
pub(crate) fn through_sim(sim: &Path, args: &[&str]) -> std::process::Output {
    let spec = format!("sim:{}", sim.display());
    let mut all = vec!["--devices", spec.as_str()];
    all.extend_from_slice(args);
    orch(&all, &[])
}

pub(crate) fn json(out: &std::process::Output) -> Vec<Value> {
    assert!(out.status.success(), "{}", stderr(out));
    serde_json::from_slice::<Value>(&out.stdout)
        .expect("JSON")
        .as_array()
        .expect("an array")
        .clone()
}

/// A PCIe box without NVSwitches: GPUs 0 and 1 under one PCIe switch with 2 NVLinks between
/// them, GPU 2 on the same NUMA node, GPU 3 on the other one; GPU 3 has no power readings.
const PCIE_BOX: &str = r#"
[[gpu]]
name = "NVIDIA L40S"
memory_total = "48GiB"
utilization = 30
memory_utilization = 12
temperature = 45
power_draw_w = 120.5
compute_capability = "8.9"
minor_number = 0
pci_bus_id = "0000:3b:00.0"
numa_node = 0
cpus = "0-15"
pcie_switch = 1
[[gpu.nvlink]]
peer = 1
links = 2
[[gpu.process]]
pid = 4000001
used_memory = "10GiB"

[[gpu]]
name = "NVIDIA L40S"
memory_total = "48GiB"
minor_number = 1
numa_node = 0
cpus = "0-15"
pcie_switch = 1
[[gpu.mig]]
uuid = "MIG-11111111-2222-3333-4444-555555555555"
name = "1g.10gb"
memory_total = "10GiB"

[[gpu]]
name = "NVIDIA L40S"
memory_total = "48GiB"
minor_number = 2
numa_node = 0
cpus = "0-15"

[[gpu]]
name = "NVIDIA L40S"
memory_total = "48GiB"
minor_number = 3
numa_node = 1
cpus = "16-31"
"#;

fn pcie_box(tag: &str) -> (PathBuf, PathBuf) {
    let dir = scratch_dir(tag);
    let sim = dir.join("box.toml");
    std::fs::write(&sim, PCIE_BOX).unwrap();
    (dir, sim)
}

#[test]
fn devices_through_the_simulated_nvml_library_are_the_sim_box() {
    let Some(lib) = library("devices_through_the_simulated_nvml_library_are_the_sim_box") else {
        return;
    };
    let (dir, pcie) = pcie_box("nvml-same");
    let files = [
        root().join("examples/sim/lab-8gpu.toml"),
        root().join("examples/sim/hgx-8gpu.toml"),
        pcie,
    ];
    for file in &files {
        let mut nvml = json(&through_nvml(&lib, file, &["devices", "--json"]));
        let sim = json(&through_sim(file, &["devices", "--json"]));
        for device in &mut nvml {
            assert_eq!(device["backend"], "nvml", "{}", file.display());
            device["backend"] = "sim".into();
        }
        assert_eq!(nvml, sim, "{}: NVML and sim: differ", file.display());
        let topo = through_nvml(&lib, file, &["devices", "--topo"]);
        assert!(topo.status.success(), "{}", stderr(&topo));
        assert_eq!(
            stdout(&topo),
            stdout(&through_sim(file, &["devices", "--topo"]))
        );
    }
    // What the comparison covered, read through NVML: processes nobody scheduled, the NVSwitch
    // box's NV18 everywhere, NUMA nodes and CPU lists, the PCIe levels.
    let lab = json(&through_nvml(&lib, &files[0], &["devices", "--json"]));
    assert_eq!(lab[0]["foreign_processes"][0]["pid"], 31337);
    assert_eq!(lab[0]["power_draw_w"], 612.4);
    let hgx = json(&through_nvml(&lib, &files[1], &["devices", "--json"]));
    assert_eq!(hgx[7]["numa_node"], 1);
    assert_eq!(hgx[7]["cpus"], "56-111,168-223");
    let links = hgx[0]["links"].as_array().unwrap();
    assert_eq!(links.len(), 7);
    assert!(links.iter().all(|l| l["link"] == "NV18"), "{links:?}");
    let pcie = json(&through_nvml(&lib, &files[2], &["devices", "--json"]));
    assert_eq!(pcie[0]["pci_bus_id"], "00000000:3B:00.0");
    assert_eq!(
        pcie[0]["links"],
        serde_json::json!([
            {"peer": 1, "link": "NV2", "nvlinks": 2, "pcie": "PIX"},
            {"peer": 2, "link": "NODE", "nvlinks": 0, "pcie": "NODE"},
            {"peer": 3, "link": "SYS", "nvlinks": 0, "pcie": "SYS"},
        ])
    );
    assert!(
        pcie[3]["power_draw_w"].is_null(),
        "a board without power readings"
    );
    assert_eq!(pcie[0]["foreign_processes"][0]["pid"], 4000001);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn topo_prints_the_matrix_as_nvidia_smi_does() {
    let (dir, sim) = pcie_box("nvml-topo");
    let out = through_sim(&sim, &["devices", "--topo"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let matrix: Vec<&str> = text.lines().take(5).collect();
    assert_eq!(
        matrix,
        [
            "      GPU0  GPU1  GPU2  GPU3  CPU Affinity  NUMA Affinity",
            "GPU0  X     NV2   NODE  SYS   0-15          0",
            "GPU1  NV2   X     NODE  SYS   0-15          0",
            "GPU2  NODE  NODE  X     SYS   0-15          0",
            "GPU3  SYS   SYS   SYS   X     16-31         1",
        ],
        "{text}"
    );
    for label in [
        "X    = Self",
        "NV#  = ",
        "PIX  = ",
        "PXB  = ",
        "PHB  = ",
        "NODE = ",
        "SYS  = ",
    ] {
        assert!(text.contains(label), "the legend explains {label}: {text}");
    }
    // A box whose inventory says nothing of links: unknown, never guessed.
    let lab = orch(&["--devices", &lab_sim(), "devices", "--topo"], &[]);
    assert!(
        stdout(&lab).starts_with("      GPU0  GPU1"),
        "{}",
        stdout(&lab)
    );
    assert!(
        stdout(&lab).contains("GPU0  X     ?     ?"),
        "{}",
        stdout(&lab)
    );
    // The CPU device is a one-device box.
    let cpu = orch(&["--devices", "cpu", "devices", "--topo"], &[]);
    assert!(cpu.status.success(), "{}", stderr(&cpu));
    assert!(
        stdout(&cpu).starts_with(
            "      CPU0  CPU Affinity  NUMA Affinity\nCPU0  X     N/A           N/A\n"
        ),
        "{}",
        stdout(&cpu)
    );
    // --topo and --json are two answers: asking for both is refused.
    let both = through_sim(&sim, &["devices", "--topo", "--json"]);
    assert_eq!(both.status.code(), Some(2), "{}", stderr(&both));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_missing_library_or_sim_file_is_one_sentence() {
    let Some(lib) = library("a_missing_library_or_sim_file_is_one_sentence") else {
        return;
    };
    let missing = "/nonexistent/libnvidia-ml.so.1";
    let out = orch(
        &["--devices", "nvml", "devices"],
        &[("ORCH_NVML_LIBRARY", missing)],
    );
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains(missing) && err.contains("ORCH_NVML_LIBRARY"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");

    let out = orch(
        &["--devices", "nvml", "devices"],
        &[("ORCH_NVML_LIBRARY", lib.as_str())],
    );
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("ORCH_NVML_SIM is not set"),
        "{}",
        stderr(&out)
    );

    let dir = scratch_dir("nvml-broken");
    let broken = dir.join("box.toml");
    std::fs::write(&broken, "[[gpu]]\nname = \"a\"\nmemory_total = \"lots\"\n").unwrap();
    let out = through_nvml(&lib, &broken, &["devices"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("box.toml:3:16"), "{}", stderr(&out));
    assert!(!stderr(&out).contains("panicked"), "{}", stderr(&out));
    // `auto` falls back to the CPU and says why.
    let sim = broken.display().to_string();
    let out = orch(
        &["devices"],
        &[
            ("ORCH_NVML_LIBRARY", lib.as_str()),
            ("ORCH_NVML_SIM", sim.as_str()),
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("CPU-0"), "{}", stdout(&out));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn the_daemon_sees_a_file_change_through_nvml() {
    let Some(lib) = library("the_daemon_sees_a_file_change_through_nvml") else {
        return;
    };
    let _one = crate::health::one_nvml_daemon();
    let (dir, sim) = pcie_box("nvml-watch");
    let d = nvml_daemon("nvml-watch", &lib, &sim);
    let reading = |d: &Daemon| {
        let (status, devices) = http(d, "GET", "/v1/devices", &Value::Null);
        assert_eq!(status, 200, "{devices}");
        devices
    };
    let before = reading(&d);
    assert_eq!(before[2]["utilization_gpu_percent"], 0, "{before}");
    assert_eq!(before[2]["backend"], "nvml", "{before}");
    // Written whole and renamed over the old file, as docs/DEVICES.md says.
    let changed = PCIE_BOX.replacen(
        "minor_number = 2\nnuma_node = 0\ncpus = \"0-15\"\n",
        "minor_number = 2\nnuma_node = 0\ncpus = \"0-15\"\nutilization = 77\n[[gpu.process]]\npid = 4000003\nused_memory = \"1GiB\"\n",
        1,
    );
    assert_ne!(changed, PCIE_BOX);
    let next = dir.join("box.next");
    std::fs::write(&next, changed).unwrap();
    std::fs::rename(&next, &sim).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now = reading(&d);
        if now[2]["utilization_gpu_percent"] == 77 {
            assert_eq!(now[2]["foreign_processes"][0]["pid"], 4000003, "{now}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the daemon never saw the change: {now}\n{}",
            d.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(d);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn roots_jobs_open_only_their_gpus_node_by_nvmls_minor_numbers() {
    let Some(lib) = library("roots_jobs_open_only_their_gpus_node_by_nvmls_minor_numbers") else {
        return;
    };
    let Some(lab) = crate::constrain::lab("nvml") else {
        return;
    };
    let state = lab.dir.join("state").display().to_string();
    let sim = lab.dir.join("gpus.toml").display().to_string();
    let script = lab.script();
    let out = orch(
        &[
            "--devices",
            "nvml",
            "run",
            "--gpus",
            "1",
            "--",
            "sh",
            "-c",
            &script,
        ],
        &[
            ("ORCH_STATE_DIR", state.as_str()),
            ("ORCH_DEVICE_CONSTRAINT", "auto"),
            ("ORCH_NVML_LIBRARY", lib.as_str()),
            ("ORCH_NVML_SIM", sim.as_str()),
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let (granted, lines) = crate::constrain::granted_and_lines(&stdout(&out));
    assert_eq!(lines, crate::constrain::expected(Some(granted)));
}
