//! The NVML backend (`nvml::read`) over the simulated NVML library reads exactly the devices the
//! `sim:` backend reads from the same file: every field of the model, MIG instances, minor
//! numbers and topology included. Each test runs itself again in a child process whose
//! environment names the library (`ORCH_NVML_LIBRARY`) and the file (`ORCH_NVML_SIM`): the
//! environment of this process is never changed.

use orch_devices::{Backend, Device, nvml, sim};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Set in the child: the sim file, read through NVML there.
const CHILD: &str = "ORCH_TEST_NVML_SIM_CHILD";

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `target/<profile>/liborch_nvml_sim.so` (this test is `target/<profile>/deps/nvml_sim-…`);
/// `None` (a skip) when not built, a failure under `ORCH_REQUIRE_NVML_SIM`.
fn library(test: &str) -> Option<PathBuf> {
    let exe = std::env::current_exe().expect("the test's path");
    let so = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>")
        .join("liborch_nvml_sim.so");
    if so.is_file() {
        return Some(so);
    }
    assert!(
        std::env::var_os("ORCH_REQUIRE_NVML_SIM").is_none(),
        "{test}: {} is missing and ORCH_REQUIRE_NVML_SIM is set: build it with `cargo build -p orch-nvml-sim`",
        so.display()
    );
    eprintln!("{test}: skipped ({} is missing)", so.display());
    None
}

/// In the child: NVML's reading, its backend set to `sim`, equals the sim backend's. In the
/// parent: runs the child and checks it passed.
fn same_devices(test: &str, file: &Path) {
    if std::env::var_os(CHILD).is_some() {
        let mut through_nvml = nvml::read().expect("NVML over the simulated library");
        assert!(through_nvml.iter().all(|d| d.backend == Backend::Nvml));
        for device in &mut through_nvml {
            device.backend = Backend::Sim;
        }
        let direct: Vec<Device> = sim::read(file).expect("the sim file");
        assert_eq!(through_nvml, direct);
        return;
    }
    let Some(lib) = library(test) else { return };
    let out = Command::new(std::env::current_exe().unwrap())
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .env("ORCH_NVML_LIBRARY", &lib)
        .env("ORCH_NVML_SIM", file)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    assert!(text.contains("1 passed"), "the child ran the test: {text}");
}

#[test]
fn the_lab_box_through_nvml() {
    same_devices(
        "the_lab_box_through_nvml",
        &root().join("examples/sim/lab-8gpu.toml"),
    );
}

#[test]
fn the_nvswitch_box_through_nvml() {
    same_devices(
        "the_nvswitch_box_through_nvml",
        &root().join("examples/sim/hgx-8gpu.toml"),
    );
}

#[test]
fn mig_minor_numbers_and_pcie_levels_through_nvml() {
    let test = "mig_minor_numbers_and_pcie_levels_through_nvml";
    let file = std::env::temp_dir().join(format!("orch-devices-{test}.toml"));
    if std::env::var_os(CHILD).is_none() {
        std::fs::write(
            &file,
            r#"
[[gpu]]
name = "NVIDIA A100-SXM4-80GB"
memory_total = "80GiB"
minor_number = 5
numa_node = 3
cpus = "24-31,88-95"
pcie_switch = 2
[[gpu.nvlink]]
peer = 1
links = 12
[[gpu.mig]]
uuid = "MIG-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"
name = "3g.40gb"
memory_total = "40GiB"
[[gpu.mig]]
uuid = "MIG-ffffffff-bbbb-cccc-dddd-eeeeeeeeeeee"
[[gpu.process]]
pid = 7
used_memory = "3GiB"

[[gpu]]
name = "NVIDIA A100-SXM4-80GB"
memory_total = "80GiB"
minor_number = 4
numa_node = 3
pcie_switch = 2

[[gpu]]
name = "a GPU the file says little of"
memory_total = "1GiB"
"#,
        )
        .unwrap();
    }
    same_devices(test, &file);
}
