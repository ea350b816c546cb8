//! MIG slices as devices: a box whose GPU 0 is in MIG mode with three `1g.10gb` slices and whose
//! GPUs 1 and 2 are whole. Slices are leased one job each, never the GPU whole; a job of several
//! slices runs one process per slice; the device constraint opens a slice's capability nodes and
//! no other slice's; NVML over the simulated library lists the same slices; the daemon runs a
//! slice job.

use crate::serve::Daemon;
use crate::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The slices' uuids, in the file's order.
const SLICES: [&str; 3] = [
    "MIG-11111111-0000-4000-8000-000000000001",
    "MIG-11111111-0000-4000-8000-000000000002",
    "MIG-11111111-0000-4000-8000-000000000003",
];

/// GPU 0 in MIG mode (minor 0): three `1g.10gb` slices in GPU instances 7, 8, 9 (compute
/// instance 0 each), whose capability minors are 10/11, 12/13, 14/15; the third has 9 GiB of its
/// memory in use. GPUs 1 and 2 whole.
fn mig_box() -> String {
    let mut text = String::from(
        "[[gpu]]\nname = \"NVIDIA H100 80GB HBM3\"\nmemory_total = \"80GiB\"\nuuid = \"GPU-00000000-0000-4000-8000-000000000000\"\nminor_number = 0\nmig_mode = true\n",
    );
    for (i, uuid) in SLICES.iter().enumerate() {
        let gi = 7 + i;
        text.push_str(&format!(
            "[[gpu.mig]]\nuuid = \"{uuid}\"\nname = \"1g.10gb\"\nmemory_total = \"10GiB\"\ngpu_instance_id = {gi}\ncompute_instance_id = 0\ngpu_instance_cap_minor = {}\ncompute_instance_cap_minor = {}\n",
            10 + 2 * i,
            11 + 2 * i
        ));
        if i == 2 {
            text.push_str("memory_used = \"9GiB\"\n");
        }
    }
    for g in 1..3 {
        text.push_str(&format!(
            "[[gpu]]\nname = \"NVIDIA H100 80GB HBM3\"\nmemory_total = \"80GiB\"\nuuid = \"GPU-00000000-0000-4000-8000-00000000000{g}\"\nminor_number = {g}\n"
        ));
    }
    text
}

/// The driver's `mig-minors` listing for [`mig_box`].
fn mig_minors() -> String {
    let mut text = String::from("config 1\nmonitor 2\n");
    for i in 0..3 {
        let gi = 7 + i;
        text.push_str(&format!(
            "gpu0/gi{gi}/access {}\ngpu0/gi{gi}/ci0/access {}\n",
            10 + 2 * i,
            11 + 2 * i
        ));
    }
    text
}

struct MigLab {
    dir: PathBuf,
    sim: String,
    state: String,
}

impl Drop for MigLab {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn lab(tag: &str) -> MigLab {
    let dir = scratch_dir(&format!("mig-{tag}"));
    std::fs::write(dir.join("box.toml"), mig_box()).unwrap();
    MigLab {
        sim: format!("sim:{}", dir.join("box.toml").display()),
        state: dir.join("state").display().to_string(),
        dir,
    }
}

impl MigLab {
    fn orch(&self, args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
        let mut all = vec![("ORCH_DEVICES", self.sim.as_str())];
        all.push(("ORCH_STATE_DIR", self.state.as_str()));
        all.extend_from_slice(env);
        orch(args, &all)
    }

    /// `orch run ARGS` started in the background, its output piped.
    fn spawn(&self, args: &[&str]) -> std::process::Child {
        Command::new(env!("CARGO_BIN_EXE_orch"))
            .args(args)
            .current_dir(root())
            .env_remove("CUDA_VISIBLE_DEVICES")
            .env("ORCH_DEVICES", &self.sim)
            .env("ORCH_STATE_DIR", &self.state)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    }
}

/// `out` is a refusal: exit status 2 and a sentence with `words`.
fn refused(out: &std::process::Output, words: &str) {
    assert_eq!(out.status.code(), Some(2), "{}", stderr(out));
    assert!(stderr(out).contains(words), "{}", stderr(out));
}

/// Waits (at most 20 s) until `path` exists.
fn wait_for(path: &Path) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !path.exists() {
        assert!(
            Instant::now() < deadline,
            "{} never appeared",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn three_one_slice_jobs_get_a_slice_each_and_a_fourth_waits_or_fails() {
    let lab = lab("three");
    let go = lab.dir.join("go");
    // Each job writes what it was given, then holds its slice until `go` exists (at most 20 s).
    let job = |n: usize| {
        format!(
            "printf %s \"$CUDA_VISIBLE_DEVICES\" > {dir}/got{n}.tmp && mv {dir}/got{n}.tmp {dir}/got{n}; \
             i=0; while [ ! -e {go} ] && [ $i -lt 400 ]; do sleep 0.05; i=$((i+1)); done",
            dir = lab.dir.display(),
            go = go.display()
        )
    };
    let scripts: Vec<String> = (0..3).map(job).collect();
    let mut holders: Vec<std::process::Child> = scripts
        .iter()
        .map(|s| lab.spawn(&["run", "--mig", "1g.10gb", "--", "sh", "-c", s]))
        .collect();
    let mut got: Vec<String> = (0..3)
        .map(|n| {
            let path = lab.dir.join(format!("got{n}"));
            wait_for(&path);
            std::fs::read_to_string(path).unwrap()
        })
        .collect();
    for uuid in &got {
        assert!(SLICES.contains(&uuid.as_str()), "one slice each: {got:?}");
    }
    got.sort();
    got.dedup();
    assert_eq!(got.len(), 3, "three different slices: {got:?}");

    // A fourth finds every slice held: without --wait it fails (exit 1, no fit) …
    let fourth = lab.orch(&["run", "--mig", "1g.10gb", "--", "true"], &[]);
    assert_eq!(fourth.status.code(), Some(1), "{}", stderr(&fourth));
    assert!(
        stderr(&fourth).contains("1g.10gb") || stderr(&fourth).contains("fit"),
        "{}",
        stderr(&fourth)
    );
    // … and with --wait it gets one once a job ends; the GPU whole and the whole GPUs never.
    let waiter = lab.spawn(&[
        "run",
        "--wait",
        "--timeout",
        "20s",
        "--mig",
        "1g.10gb",
        "--",
        "sh",
        "-c",
        "echo \"got $CUDA_VISIBLE_DEVICES\"",
    ]);
    std::thread::sleep(Duration::from_millis(300));
    std::fs::write(&go, "").unwrap();
    for holder in &mut holders {
        assert!(holder.wait().unwrap().success());
    }
    let waited = waiter.wait_with_output().unwrap();
    assert!(waited.status.success(), "{}", stderr(&waited));
    let line = stdout(&waited);
    let uuid = line.trim().strip_prefix("got ").unwrap_or_default();
    assert!(SLICES.contains(&uuid), "{line}");
}

#[test]
fn a_job_of_whole_gpus_never_gets_the_mig_gpu() {
    let lab = lab("whole");
    let out = lab.orch(
        &[
            "run",
            "--gpus",
            "2",
            "--",
            "sh",
            "-c",
            "echo $CUDA_VISIBLE_DEVICES",
        ],
        &[],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let mut got: Vec<String> = stdout(&out).trim().split(',').map(String::from).collect();
    got.sort();
    assert_eq!(
        got,
        [
            "GPU-00000000-0000-4000-8000-000000000001",
            "GPU-00000000-0000-4000-8000-000000000002"
        ]
    );
    let three = lab.orch(&["run", "--gpus", "3", "--", "true"], &[]);
    refused(
        &three,
        "gpus = 3, but this machine has 2 device(s); GPU 0 in MIG mode: its slices are leased with mig = PROFILE, never the GPU whole",
    );
    // `orch plan` of a job file says the same: the MIG GPU is no candidate.
    let job = lab.dir.join("job.toml");
    std::fs::write(
        &job,
        "[job]\nname = \"two\"\n[resources]\ngpus = 2\n[command]\nargv = [\"true\"]\n",
    )
    .unwrap();
    let plan = lab.orch(&["plan", &job.display().to_string(), "--json"], &[]);
    assert!(plan.status.success(), "{}", stderr(&plan));
    let plan: Value = serde_json::from_slice(&plan.stdout).unwrap();
    let rejected = plan["rejected"].as_array().unwrap();
    assert!(
        rejected.iter().all(|r| r["physical_index"] != 0),
        "the MIG GPU is not even a candidate: {plan}"
    );
}

#[test]
fn per_device_runs_one_process_per_slice_and_single_is_refused() {
    let lab = lab("launch");
    let out = lab.orch(
        &[
            "run",
            "--mig",
            "1g.10gb",
            "--gpus",
            "2",
            "--per-device",
            "--",
            "sh",
            "-c",
            "echo \"$RANK $CUDA_VISIBLE_DEVICES\"",
        ],
        &[],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let mut lines: Vec<String> = stdout(&out).lines().map(String::from).collect();
    lines.sort();
    assert_eq!(lines.len(), 2, "{lines:?}");
    let seen: Vec<&str> = lines.iter().map(|l| l.split_once(' ').unwrap().1).collect();
    assert!(lines[0].starts_with("0 MIG-") && lines[1].starts_with("1 MIG-"));
    assert!(
        seen.iter().all(|s| SLICES.contains(s)) && seen[0] != seen[1],
        "each process sees one slice of its own: {lines:?}"
    );

    // One process cannot use two slices: refused before anything is leased, with the reason.
    let single = lab.orch(
        &["run", "--mig", "1g.10gb", "--gpus", "2", "--", "true"],
        &[],
    );
    refused(
        &single,
        "needs launch = \"per-device\": a CUDA process enumerates at most one MIG instance",
    );
    let job = lab.dir.join("two.toml");
    std::fs::write(
        &job,
        "[job]\nname = \"two\"\n[resources]\ngpus = 2\nmig = \"1g.10gb\"\n[command]\nargv = [\"true\"]\n",
    )
    .unwrap();
    let file = lab.orch(&["run", &job.display().to_string()], &[]);
    refused(
        &file,
        "two.toml:5:1: mig = \"1g.10gb\" with gpus = 2 needs launch",
    );

    // A profile the machine has none of, and more slices than it has: bad input, one sentence.
    let unknown = lab.orch(&["run", "--mig", "3g.40gb", "--", "true"], &[]);
    assert_eq!(unknown.status.code(), Some(2), "{}", stderr(&unknown));
    assert!(
        stderr(&unknown)
            .contains("mig = \"3g.40gb\", but this machine has no MIG slice of that profile")
            && stderr(&unknown).contains("its slices are 1g.10gb"),
        "{}",
        stderr(&unknown)
    );
    let four = lab.orch(
        &[
            "run",
            "--mig",
            "1g.10gb",
            "--gpus",
            "4",
            "--per-device",
            "--",
            "true",
        ],
        &[],
    );
    refused(
        &four,
        "gpus = 4 with mig = \"1g.10gb\", but this machine has 3 slice(s) of that profile",
    );
    let bad = lab.orch(&["run", "--mig", "big", "--", "true"], &[]);
    assert_eq!(bad.status.code(), Some(2), "{}", stderr(&bad));
    assert!(stderr(&bad).contains("--mig \"big\" is not a MIG profile"));
    // An interactive allocation of a slice, as `orch run` gets one.
    let alloc = lab.orch(
        &[
            "alloc",
            "--mig",
            "1g.10gb",
            "--",
            "sh",
            "-c",
            "echo $CUDA_VISIBLE_DEVICES",
        ],
        &[],
    );
    assert!(alloc.status.success(), "{}", stderr(&alloc));
    assert!(
        SLICES.contains(&stdout(&alloc).trim()),
        "{}",
        stdout(&alloc)
    );
}

/// A character major that `/proc/devices` does not list, in the range Linux keeps for local use:
/// nodes of it open with ENXIO ("No such device or address") unless the constraint denies them.
fn unused_major() -> u32 {
    let listed = std::fs::read_to_string("/proc/devices").unwrap_or_default();
    (240..=254)
        .find(|m| {
            !listed
                .lines()
                .any(|l| l.split_whitespace().next() == Some(&m.to_string()))
        })
        .expect("a free local-use major")
}

#[test]
fn a_slice_job_opens_its_capability_nodes_and_no_other_slices() {
    let Some(constrain) = crate::constrain::lab("mig") else {
        return;
    };
    let lab = lab("caps");
    let caps = unused_major();
    let devices = lab.dir.join("devices");
    std::fs::write(
        &devices,
        format!("Character devices:\n195 nvidia\n{caps} nvidia-caps\n\nBlock devices:\n  7 loop\n"),
    )
    .unwrap();
    // Beyond the inventory's slices: the driver's config (1) and monitor (2) capabilities and an
    // instance the inventory does not know (16), as `mig-minors` lists them.
    let minors = lab.dir.join("mig-minors");
    std::fs::write(&minors, "config 1\nmonitor 2\ngpu0/gi9/access 16\n").unwrap();
    for minor in [1, 2, 10, 11, 12, 13, 14, 15, 16] {
        let out = Command::new("mknod")
            .args(["-m", "666"])
            .arg(lab.dir.join(format!("cap{minor}")))
            .args(["c", &caps.to_string(), &minor.to_string()])
            .output()
            .unwrap();
        assert!(out.status.success(), "mknod: {}", stderr(&out));
    }
    let probe = format!(
        "echo \"granted $CUDA_VISIBLE_DEVICES\"; for n in {g}/nvidia0 {g}/nvidia1 {d}/cap10 {d}/cap11 {d}/cap12 {d}/cap13 {d}/cap14 {d}/cap15 {d}/cap1 {d}/cap2 {d}/cap16; do \
         if e=$(cat $n 2>&1 >/dev/null); then echo \"${{n##*/}}: ok\"; else echo \"${{n##*/}}: ${{e##*: }}\"; fi; done",
        g = constrain.dir.display(),
        d = lab.dir.display()
    );
    let out = lab.orch(
        &["run", "--mig", "1g.10gb", "--", "sh", "-c", &probe],
        &[
            ("ORCH_DEVICE_CONSTRAINT", "auto"),
            ("ORCH_PROC_DEVICES", &devices.display().to_string()),
            ("ORCH_MIG_MINORS", &minors.display().to_string()),
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let (first, lines) = text.split_once('\n').unwrap();
    let granted = first.strip_prefix("granted ").unwrap();
    let slot = SLICES
        .iter()
        .position(|s| *s == granted)
        .expect("one slice");
    let (own_gi, own_ci) = (10 + 2 * slot, 11 + 2 * slot);
    let mut expected =
        String::from("nvidia0: No such device or address\nnvidia1: Operation not permitted\n");
    for minor in 10..16 {
        let error = if minor == own_gi || minor == own_ci {
            "No such device or address"
        } else {
            "Operation not permitted"
        };
        expected.push_str(&format!("cap{minor}: {error}\n"));
    }
    for minor in [1, 2, 16] {
        expected.push_str(&format!("cap{minor}: Operation not permitted\n"));
    }
    assert_eq!(
        lines, expected,
        "the parent GPU's node and its own capability nodes open; no other GPU's, no other slice's"
    );
}

#[test]
fn nvml_over_the_simulated_library_lists_the_same_slices() {
    let Some(lib) =
        crate::nvml_sim::library("nvml_over_the_simulated_library_lists_the_same_slices")
    else {
        return;
    };
    let lab = lab("nvml");
    let file = lab.dir.join("box.toml");
    let minors = lab.dir.join("mig-minors");
    std::fs::write(&minors, mig_minors()).unwrap();
    let minors_env = minors.display().to_string();
    let sim_env = file.display().to_string();
    let through_nvml = |args: &[&str]| {
        let mut all = vec!["--devices", "nvml"];
        all.extend_from_slice(args);
        orch(
            &all,
            &[
                ("ORCH_NVML_LIBRARY", lib.as_str()),
                ("ORCH_NVML_SIM", sim_env.as_str()),
                ("ORCH_MIG_MINORS", minors_env.as_str()),
            ],
        )
    };
    let mut nvml = crate::nvml_sim::json(&through_nvml(&["devices", "--json"]));
    let sim = crate::nvml_sim::json(&crate::nvml_sim::through_sim(&file, &["devices", "--json"]));
    for device in &mut nvml {
        device["backend"] = "sim".into();
    }
    assert_eq!(nvml, sim, "NVML and sim differ");
    let slices = nvml[0]["mig_devices"].as_array().unwrap();
    assert_eq!(slices.len(), 3);
    assert_eq!(slices[1]["uuid"], SLICES[1]);
    assert_eq!(slices[1]["gpu_instance_id"], 8);
    assert_eq!(slices[1]["compute_instance_cap_minor"], 13);
    assert_eq!(
        slices[1]["parent_uuid"],
        "GPU-00000000-0000-4000-8000-000000000000"
    );
    assert_eq!(nvml[0]["mig_mode"], true);
    assert_eq!(nvml[1]["mig_mode"], false);
    // Each slice's own memory in use, as NVML reads it of the instance.
    assert_eq!(slices[2]["memory_used_bytes"], 9u64 << 30);
    assert_eq!(slices[2]["memory_free_bytes"], 1u64 << 30);
    assert_eq!(slices[0]["memory_used_bytes"], 0);
    // The listing, as `nvidia-smi -L` shows slices under their GPU.
    let listed = through_nvml(&["devices"]);
    assert!(listed.status.success(), "{}", stderr(&listed));
    let text = stdout(&listed);
    assert!(
        text.contains(&format!(
            "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-00000000-0000-4000-8000-000000000000)\n  MIG 1g.10gb     Device  0: (UUID: {})\n  MIG 1g.10gb     Device  1: (UUID: {})\n",
            SLICES[0], SLICES[1]
        )),
        "{text}"
    );
    let from_sim = stdout(&crate::nvml_sim::through_sim(&file, &["devices"]));
    let block = |t: &str| {
        t[t.find("GPU 0: ").expect("the slices' block")..]
            .lines()
            .take(4)
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert_eq!(block(&text), block(&from_sim), "the same listing from both");
}

#[test]
fn the_daemon_runs_a_slice_job_and_refuses_one_that_never_fits() {
    let lab = lab("daemon");
    let mut d = Daemon::prepare("mig-daemon");
    d.devices = Some(lab.sim.clone());
    d.restart();
    let id = d.submit(&[
        "--mig",
        "1g.10gb",
        "--",
        "sh",
        "-c",
        "echo \"slice $CUDA_VISIBLE_DEVICES\"",
    ]);
    d.wait_state(&id, "succeeded");
    let logs = stdout(&d.client(&["logs", &id]));
    let uuid = logs.trim().strip_prefix("slice ").unwrap_or_default();
    assert!(SLICES.contains(&uuid), "{logs}");
    // Accounting charges a 1g slice of a 7-slot GPU 1/7 of a GPU per second. The job runs
    // until the test has looked at the devices (`go`), and at least 1.4 s.
    let go = lab.dir.join("go");
    let script = format!(
        "sleep 1.4; i=0; while [ ! -e {} ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done",
        go.display()
    );
    let id = d.submit(&["--mig", "1g.10gb", "--", "sh", "-c", &script]);
    d.wait_state(&id, "running");
    // Meanwhile the GPU of its slice shows the job holding it, the whole GPUs nobody (once the
    // device watcher's next reading, at most a second away, has seen the lease).
    let deadline = Instant::now() + Duration::from_secs(10);
    let devices = loop {
        let (code, devices) = crate::held_leases::http(&d, "GET", "/v1/devices", &Value::Null);
        assert_eq!(code, 200, "{devices}");
        if devices[0]["held_by"][0]["job_id"] == id.as_str() || Instant::now() > deadline {
            break devices;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(devices[0]["held_by"][0]["job_id"], id.as_str(), "{devices}");
    assert_eq!(devices[1]["held_by"], serde_json::json!([]), "{devices}");
    // Each slice carries its own state and health.
    let slice = &devices[0]["mig_devices"][0];
    assert_eq!(
        (&slice["state"], &slice["health"]["state"]),
        (&"ok".into(), &"ok".into()),
        "{devices}"
    );
    std::fs::write(&go, "").unwrap();
    let status = d.wait_state(&id, "succeeded");
    let a = &status["accounting"];
    let (gpu_s, wall) = (
        a["gpu_seconds"].as_f64().unwrap(),
        a["wall_s"].as_f64().unwrap(),
    );
    assert!((1.35..60.0).contains(&wall), "{status}");
    assert!(
        (gpu_s - wall / 7.0).abs() < 0.1,
        "{gpu_s} GPU-seconds for {wall} s on a 1g slice: {status}"
    );
    // A profile the machine lacks, or more slices than it has: refused at submission.
    let none = d.client(&["submit", "--mig", "2g.20gb", "--", "true"]);
    refused(
        &none,
        "mig = \"2g.20gb\", but this daemon's machine has no MIG slice of that profile; its slices are 1g.10gb",
    );
    let many = d.client(&[
        "submit",
        "--mig",
        "1g.10gb",
        "--gpus",
        "4",
        "--per-device",
        "--",
        "true",
    ]);
    refused(
        &many,
        "gpus = 4 with mig = \"1g.10gb\" is more than the 3 slice(s) of that profile this daemon places on",
    );
    // A job of whole GPUs asks for at most the two whole ones.
    let whole = d.client(&["submit", "--gpus", "3", "--", "true"]);
    refused(
        &whole,
        "gpus = 3 is more than the 2 device(s) this daemon places on; its GPUs in MIG mode are leased by slice: ask with mig = PROFILE (its slices are 1g.10gb)",
    );
}

#[test]
fn policies_see_the_slices_and_a_0_4_0_policy_still_places_them() {
    let lab = lab("policies");
    let job = lab.dir.join("one.toml");
    std::fs::write(
        &job,
        "[job]\nname = \"one\"\n[resources]\nmig = \"1g.10gb\"\n[command]\nargv = [\"true\"]\n",
    )
    .unwrap();
    let out = lab.orch(&["plan", &job.display().to_string(), "--json"], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let plan: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(plan["devices"][0]["uuid"], SLICES[0], "{plan}");
    // The built-in (contract 0.5.0) was told what the candidates are: slices of GPU 0, with
    // their own free memory (and no CUDA index: a slice has none of its own).
    let reason = plan["reason"].as_str().unwrap();
    assert!(
        reason.ends_with(": MIG 1g.10gb of GPU 0 (10.0 GiB free)"),
        "{reason}"
    );
    // A policy built for 0.4.0 is asked without the slices, and places one all the same.
    let old = std::path::Path::new(orch_host::PLUGIN_WASM_DIR).join("compat_policy_0_4.wasm");
    let run = lab.orch(
        &[
            "run",
            "--mig",
            "1g.10gb",
            "--policy",
            &old.display().to_string(),
            "--",
            "sh",
            "-c",
            "echo $CUDA_VISIBLE_DEVICES",
        ],
        &[],
    );
    assert!(run.status.success(), "{}", stderr(&run));
    assert_eq!(stdout(&run).trim(), SLICES[0]);
}

#[test]
fn a_slices_memory_in_use_counts_where_a_job_asks_for_free_memory() {
    let lab = lab("memory");
    let job = |gpus: u32| {
        let path = lab.dir.join(format!("roomy-{gpus}.toml"));
        std::fs::write(
            &path,
            format!(
                "[job]\nname = \"roomy\"\n[resources]\nmig = \"1g.10gb\"\ngpus = {gpus}\nmin_free_memory = \"5GiB\"\n[command]\nargv = [\"true\"]\nlaunch = \"per-device\"\n"
            ),
        )
        .unwrap();
        path.display().to_string()
    };
    // The third slice has 1 GiB free: a job that needs 5 GiB on each of two gets the other two.
    let out = lab.orch(&["plan", &job(2), "--json"], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let plan: Value = serde_json::from_slice(&out.stdout).unwrap();
    let chosen: Vec<&str> = plan["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["uuid"].as_str().unwrap())
        .collect();
    assert_eq!(chosen, [SLICES[0], SLICES[1]], "{plan}");
    // Three such slices there are not.
    let out = lab.orch(&["run", &job(3)], &[]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let said = stderr(&out);
    assert!(said.contains("free"), "{said}");
    // The listing shows each slice's memory in use.
    let listed: Value =
        serde_json::from_slice(&lab.orch(&["devices", "--json"], &[]).stdout).unwrap();
    let slice = &listed[0]["mig_devices"][2];
    assert_eq!(
        (&slice["memory_used_bytes"], &slice["memory_free_bytes"]),
        (&(9u64 << 30).into(), &(1u64 << 30).into()),
        "{listed}"
    );
    // A slice cannot use more than it has: refused where the file says so.
    let bad = lab.dir.join("bad.toml");
    std::fs::write(
        &bad,
        mig_box().replace("memory_used = \"9GiB\"", "memory_used = \"11GiB\""),
    )
    .unwrap();
    let out = orch(
        &["--devices", &format!("sim:{}", bad.display()), "devices"],
        &[],
    );
    refused(
        &out,
        "memory_used (11.0 GiB) exceeds the slice's memory_total (10.0 GiB)",
    );
}

#[test]
fn a_job_of_whole_gpus_on_a_box_of_slices_only_is_told_to_ask_for_slices() {
    let lab = lab("only");
    // GPU 0 of the lab box alone: in MIG mode, three 1g.10gb slices.
    let text = mig_box();
    let only = &text[..text.find("[[gpu]]\nname = \"NVIDIA H100 80GB HBM3\"\nmemory_total = \"80GiB\"\nuuid = \"GPU-00000000-0000-4000-8000-000000000001\"").unwrap()];
    let file = lab.dir.join("only.toml");
    std::fs::write(&file, only).unwrap();
    let out = orch(
        &[
            "--devices",
            &format!("sim:{}", file.display()),
            "run",
            "--gpus",
            "1",
            "--",
            "true",
        ],
        &[("ORCH_STATE_DIR", lab.state.as_str())],
    );
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let said = stderr(&out);
    assert!(
        said.contains("gpus = 1, but this machine has no whole GPU; GPU 0 in MIG mode")
            && said
                .contains("ask for slices with mig = PROFILE; this machine's profiles are 1g.10gb"),
        "{said}"
    );
}

#[test]
fn a_daemon_job_of_several_slices_past_the_starvation_limit_gets_them_before_one_slice_jobs() {
    let lab = lab("starve");
    let mut d = Daemon::with_lab_tenant("mig-starve", "starvation_limit = \"1s\"");
    d.devices = Some(lab.sim.clone());
    d.restart();
    // A one-slice job holds a slice until `go` appears (a minute at most).
    let go = lab.dir.join("go");
    let hold = format!(
        "i=0; while [ ! -e {} ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done",
        go.display()
    );
    let first = d.submit(&["--mig", "1g.10gb", "--", "sh", "-c", &hold]);
    d.wait_state(&first, "running");
    // A job of all three slices waits, until past its starvation limit it holds the two free.
    let big = d.submit(&[
        "--mig",
        "1g.10gb",
        "--gpus",
        "3",
        "--per-device",
        "--",
        "true",
    ]);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let b = d.status(&big);
        if b["reason"]
            .as_str()
            .is_some_and(|r| r.contains("holding the 2 free ones for it"))
        {
            break;
        }
        assert!(Instant::now() < deadline, "{b}");
        std::thread::sleep(Duration::from_millis(50));
    }
    // A one-slice job behind it finds the two free slices held for it.
    let small = d.submit(&["--mig", "1g.10gb", "--", "true"]);
    let deadline = Instant::now() + Duration::from_secs(20);
    let s = loop {
        let s = d.status(&small);
        if s["reason"]
            .as_str()
            .is_some_and(|r| r.contains(&format!("the free ones are held for job {big}")))
            || Instant::now() > deadline
        {
            break s;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(s["state"], "queued", "{s}");
    assert!(
        s["reason"]
            .as_str()
            .unwrap_or("")
            .contains(&format!("the free ones are held for job {big}")),
        "{s}"
    );
    let b = d.status(&big);
    assert!(
        b["reason"]
            .as_str()
            .unwrap_or("")
            .contains("holding the 2 free ones for it"),
        "{b}"
    );
    // The first job ends: the big one starts before the small one.
    std::fs::write(&go, "").unwrap();
    let b = d.wait_state(&big, "succeeded");
    let s = d.wait_state(&small, "succeeded");
    assert!(
        s["started_at_ms"].as_u64().unwrap() >= b["started_at_ms"].as_u64().unwrap(),
        "{b} {s}"
    );
}
