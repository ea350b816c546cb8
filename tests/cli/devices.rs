use crate::*;
use serde_json::Value;

fn json_devices(env: &[(&str, &str)]) -> Vec<Value> {
    let sim = lab_sim();
    let mut all = vec![("ORCH_DEVICES", sim.as_str())];
    all.extend_from_slice(env);
    let out = orch(&["devices", "--json"], &all);
    assert!(out.status.success(), "{}", stderr(&out));
    serde_json::from_slice::<Value>(&out.stdout)
        .expect("JSON")
        .as_array()
        .expect("array")
        .clone()
}

fn visible(devices: &[Value]) -> Vec<(u64, Option<u64>)> {
    devices
        .iter()
        .map(|d| (d["index"].as_u64().unwrap(), d["visible_index"].as_u64()))
        .collect()
}

#[test]
fn no_gpu_shows_the_cpu_and_says_why() {
    if has_nvml() {
        eprintln!("skipped: this machine has an NVIDIA driver");
        return;
    }
    let out = orch(&["devices"], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("CPU-0"), "{}", stdout(&out));
    assert!(
        stdout(&out).contains("CUDA: not available ("),
        "{}",
        stdout(&out)
    );
    let err = stderr(&out);
    assert_eq!(
        err.lines()
            .filter(|l| l.contains("no NVIDIA driver found"))
            .count(),
        1,
        "{err}"
    );

    let out = orch(&["--devices", "nvml", "devices"], &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("no NVIDIA driver found"),
        "{}",
        stderr(&out)
    );
    assert!(!stderr(&out).contains("panicked"));
}

#[test]
fn json_has_exactly_the_documented_fields() {
    let devices = json_devices(&[]);
    assert_eq!(devices.len(), 8);
    let mut keys: Vec<&str> = devices[0]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    keys.sort_unstable();
    let mut expected = vec![
        "index",
        "visible_index",
        "uuid",
        "name",
        "backend",
        "memory_total_bytes",
        "memory_used_bytes",
        "memory_free_bytes",
        "utilization_gpu_percent",
        "utilization_memory_percent",
        "temperature_c",
        "power_draw_w",
        "compute_capability",
        "pci_bus_id",
        "processes",
        "foreign_processes",
        "numa_node",
        "cpus",
        "links",
        "state",
        "health",
        "mig_mode",
        "mig_devices",
    ];
    expected.sort_unstable();
    assert_eq!(keys, expected);
    assert_eq!(devices[0]["backend"], "sim");
    assert_eq!(devices[0]["compute_capability"], "9.0");
    assert_eq!(devices[0]["processes"][0]["pid"], 31337);
    assert_eq!(devices[3]["processes"].as_array().unwrap().len(), 2);
    // No lease covers the lab's processes: nobody scheduled them through orch.
    assert_eq!(devices[0]["foreign_processes"][0]["pid"], 31337);
    assert_eq!(devices[1]["foreign_processes"], serde_json::json!([]));
}

#[test]
fn cpu_fields_it_cannot_read_are_null() {
    let out = orch(&["--devices", "cpu", "devices", "--json"], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let devices: Value = serde_json::from_slice(&out.stdout).unwrap();
    let cpu = &devices[0];
    assert_eq!(cpu["backend"], "cpu");
    assert!(cpu["memory_total_bytes"].as_u64().unwrap() > 0);
    for field in [
        "utilization_gpu_percent",
        "temperature_c",
        "power_draw_w",
        "compute_capability",
        "processes",
    ] {
        assert!(cpu[field].is_null(), "{field} should be null, not invented");
    }
}

#[test]
fn cuda_visible_devices_renumbers_in_list_order() {
    let devices = json_devices(&[("CUDA_VISIBLE_DEVICES", "3,1")]);
    assert_eq!(
        visible(&devices),
        vec![
            (0, None),
            (1, Some(1)),
            (2, None),
            (3, Some(0)),
            (4, None),
            (5, None),
            (6, None),
            (7, None)
        ]
    );
}

#[test]
fn cuda_visible_devices_stops_at_an_invalid_entry() {
    let out = orch(
        &["devices", "--json"],
        &[
            ("ORCH_DEVICES", &lab_sim()),
            ("CUDA_VISIBLE_DEVICES", "0,2,-1,1"),
        ],
    );
    let devices: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    let shown: Vec<u64> = visible(&devices)
        .into_iter()
        .filter_map(|(i, v)| v.map(|_| i))
        .collect();
    assert_eq!(shown, vec![0, 2]);
    assert!(
        stderr(&out).contains("\"-1\""),
        "the ignored entry is explained: {}",
        stderr(&out)
    );
}

#[test]
fn uuid_prefixes_and_slurm_grants() {
    let devices = json_devices(&[("CUDA_VISIBLE_DEVICES", "GPU-5e6a0b3c,GPU-8932")]);
    assert_eq!(devices[3]["visible_index"], 0);
    assert_eq!(devices[0]["visible_index"], 1);
    let devices = json_devices(&[("SLURM_JOB_GPUS", "4,6")]);
    let shown: Vec<(u64, Option<u64>)> = visible(&devices)
        .into_iter()
        .filter(|(_, v)| v.is_some())
        .collect();
    assert_eq!(shown, vec![(4, Some(0)), (6, Some(1))]);
}

#[test]
fn human_table_shows_both_numberings() {
    let out = orch(
        &["devices"],
        &[("ORCH_DEVICES", &lab_sim()), ("CUDA_VISIBLE_DEVICES", "3")],
    );
    let text = stdout(&out);
    let header = text.lines().next().unwrap();
    assert!(
        header.starts_with("GPU") && header.contains("CUDA"),
        "{header}"
    );
    let row3 = text.lines().find(|l| l.starts_with("3 ")).unwrap();
    assert!(row3.split_whitespace().nth(1) == Some("0"), "{row3}");
    let row0 = text.lines().find(|l| l.starts_with("0 ")).unwrap();
    assert!(row0.split_whitespace().nth(1) == Some("-"), "{row0}");
}

#[test]
fn bad_sim_files_and_specs_exit_2_with_a_location() {
    let dir = std::env::temp_dir().join(format!("orch-cli-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("bad.toml");
    std::fs::write(&bad, "[[gpu]]\nname = \"x\"\nmemory_total = \"lots\"\n").unwrap();
    let spec = format!("sim:{}", bad.display());
    let out = orch(&["--devices", &spec, "devices"], &[]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(err.contains(&format!("{}:3:16", bad.display())), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "one sentence: {err}");

    let out = orch(&["--devices", "sim:/nonexistent/lab.toml", "devices"], &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("/nonexistent/lab.toml"));

    let out = orch(&["devices"], &[("ORCH_DEVICES", "gpus")]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("\"gpus\"") && stderr(&out).contains("sim:PATH"),
        "{}",
        stderr(&out)
    );

    let out = orch(
        &["devices", "--watch", "0"],
        &[("ORCH_DEVICES", &lab_sim())],
    );
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn watch_refreshes_until_the_reader_goes() {
    use std::io::Read;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_orch"))
        .args(["devices", "--watch", "0.05", "--json"])
        .env("ORCH_DEVICES", lab_sim())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut buf = vec![0u8; 64 * 1024];
    let mut text = String::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while text.matches("\"index\": 0,").count() < 2 && std::time::Instant::now() < deadline {
        let n = stdout.read(&mut buf).unwrap();
        text.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    drop(stdout);
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        text.matches("\"index\": 0,").count() >= 2,
        "two refreshes: {text}"
    );
}
