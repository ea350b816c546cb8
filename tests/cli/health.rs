//! GPUs that fail and GPUs taken out for maintenance: Xid errors, uncorrected ECC errors and lost
//! GPUs from the sim file and through the simulated NVML library make a GPU unhealthy; `orch
//! drain` / `orch undrain` (admins, kept across a daemon restart, honoured by `orch run` without a
//! daemon); what `orch devices`, `/v1/devices`, `orch status` and `/metrics` say of both.

use crate::held_leases::{http, http_text};
use crate::serve::{Daemon, as_user, event_kinds, root_or_skip, test_user, two_tenants};
use crate::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A sim file of `n` H100s; `extra(i)` adds lines to GPU `i`'s table.
fn gpus(n: usize, extra: impl Fn(usize) -> String) -> String {
    (0..n)
        .map(|i| {
            format!(
                "[[gpu]]\nname = \"H100\"\nmemory_total = \"80GiB\"\n{}\n",
                extra(i)
            )
        })
        .collect()
}

/// A folder of its own with `sim.toml` holding `text`.
fn sim_dir(tag: &str, text: &str) -> (PathBuf, PathBuf) {
    let dir = std::env::temp_dir().join(format!(
        "orch-health-{tag}-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let sim = dir.join("sim.toml");
    std::fs::write(&sim, text).unwrap();
    (dir, sim)
}

/// Writes the sim file whole and renames it over the old one, as docs/DEVICES.md says to.
fn rewrite(sim: &Path, text: &str) {
    let next = sim.with_extension("next");
    std::fs::write(&next, text).unwrap();
    std::fs::rename(&next, sim).unwrap();
}

fn devices(d: &Daemon) -> Vec<Value> {
    let (status, devices) = http(d, "GET", "/v1/devices", &Value::Null);
    assert_eq!(status, 200, "{devices}");
    devices.as_array().unwrap().clone()
}

/// Polls `/v1/devices` until GPU `index` is in `state`; how long that took. Fails after 10 s.
fn until_state(d: &Daemon, index: usize, state: &str) -> Duration {
    let started = Instant::now();
    loop {
        let all = devices(d);
        if all[index]["state"] == state {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "GPU {index} never became {state}: {}",
            all[index]
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The index of the GPU with `uuid` in `/v1/devices`.
fn index_of(d: &Daemon, uuid: &str) -> usize {
    devices(d)
        .iter()
        .position(|g| g["uuid"] == uuid)
        .unwrap_or_else(|| panic!("no GPU {uuid}"))
}

/// The one device a job holds.
fn device_of(status: &Value) -> String {
    let devices = status["devices"].as_array().unwrap();
    assert_eq!(devices.len(), 1, "{status}");
    devices[0].as_str().unwrap().to_string()
}

/// Waits until job `id`'s reason contains `words`.
fn until_reason(d: &Daemon, id: &str, words: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let s = d.status(id);
        if s["reason"].as_str().is_some_and(|r| r.contains(words)) {
            return s;
        }
        assert!(
            Instant::now() < deadline,
            "job {id} never said {words:?}: {s}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `/metrics` as the daemon's admin (root, the daemon's own user), checked by promtool where
/// it is installed.
fn metrics(d: &Daemon) -> String {
    let (status, text) = http_text(d, "GET", "/metrics", "");
    assert_eq!(status, 200, "{text}");
    match std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
    {
        Ok(mut child) => {
            use std::io::Write;
            child
                .stdin
                .take()
                .unwrap()
                .write_all(text.as_bytes())
                .unwrap();
            let out = child.wait_with_output().unwrap();
            assert!(
                out.status.success(),
                "promtool: {}{}",
                stdout(&out),
                stderr(&out)
            );
        }
        Err(_) => assert!(
            std::env::var_os("ORCH_REQUIRE_PROMTOOL").is_none(),
            "promtool is not installed and ORCH_REQUIRE_PROMTOOL is set"
        ),
    }
    text
}

fn gauge(text: &str, name: &str, uuid: &str) -> Option<u8> {
    text.lines()
        .find(|l| l.starts_with(&format!("{name}{{uuid=\"{uuid}\"")))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[test]
fn an_xid_in_the_sim_file_makes_the_gpu_unhealthy_at_once_its_job_is_told_and_new_jobs_avoid_it() {
    let (dir, sim) = sim_dir("xid", &gpus(2, |_| String::new()));
    let mut d = Daemon::prepare("health-xid");
    d.devices = Some(format!("sim:{}", sim.display()));
    d.restart();
    let running = d.submit(&["--gpus", "1", "--", "sleep", "60"]);
    let held = device_of(&d.wait_state(&running, "running"));
    let sick = index_of(&d, &held);
    let text = gpus(2, |i| {
        if i == sick {
            "xid_errors = [13, 79]".into()
        } else {
            String::new()
        }
    });
    rewrite(&sim, &text);
    let took = until_state(&d, sick, "unhealthy");
    assert!(took <= Duration::from_secs(1), "took {took:?}");
    let gpu = &devices(&d)[sick];
    let problems = gpu["health"]["problems"].as_array().unwrap();
    // Xid 13 is an application's error: only 79 counts.
    assert_eq!(problems.len(), 1, "{gpu}");
    assert_eq!(problems[0]["kind"], "xid");
    assert_eq!(problems[0]["xid"], 79);
    assert!(problems[0]["since_ms"].as_u64().unwrap() > 0, "{gpu}");
    // The health object leads with the state, why and since when.
    let health = &gpu["health"];
    assert_eq!(health["state"], "unhealthy", "{gpu}");
    assert_eq!(
        health["reason"], "Xid 79: the GPU has fallen off the bus",
        "{gpu}"
    );
    assert_eq!(health["since_ms"], problems[0]["since_ms"], "{gpu}");
    let since = health["since"].as_str().unwrap();
    assert!(
        since.len() == 20 && since.ends_with('Z') && since.as_bytes()[10] == b'T',
        "RFC 3339, UTC to the second: {gpu}"
    );
    assert_eq!(devices(&d)[1 - sick]["health"]["state"], "ok");
    assert!(devices(&d)[1 - sick]["health"]["reason"].is_null());

    // The running job is told, and keeps running.
    let told = until_reason(&d, &running, "Xid 79");
    assert!(event_kinds(&told).contains(&"device-unhealthy"), "{told}");
    assert_eq!(told["state"], "running", "{told}");
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(d.status(&running)["state"], "running");

    // The next job goes to the other GPU. Once the first ends, its GPU is free but unhealthy:
    // one more job waits, saying why.
    let next = d.submit(&["--gpus", "1", "--", "sleep", "60"]);
    assert_ne!(device_of(&d.wait_state(&next, "running")), held);
    assert!(d.client(&["cancel", &running]).status.success());
    d.wait_state(&running, "cancelled");
    let third = d.submit(&["--gpus", "1", "--", "true"]);
    let waiting = until_reason(&d, &third, "unhealthy");
    assert_eq!(waiting["state"], "queued", "{waiting}");
    assert!(
        waiting["reason"]
            .as_str()
            .unwrap()
            .contains(&format!("GPU {sick} is unhealthy (Xid 79")),
        "{waiting}"
    );

    // `orch devices` reads the same file: STATE says so, -v says why.
    let out = d.client(&["devices", "-v"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let line = stdout(&out)
        .lines()
        .find(|l| l.starts_with(&format!("{sick} ")))
        .unwrap()
        .to_string();
    assert!(
        line.ends_with("unhealthy: Xid 79: the GPU has fallen off the bus"),
        "{line}"
    );
    let text = metrics(&d);
    assert_eq!(
        gauge(&text, "orch_device_healthy", &held),
        Some(0),
        "{text}"
    );
    for id in [&next, &third] {
        d.client(&["cancel", id]);
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_lost_gpu_and_uncorrected_ecc_errors_are_unhealthy_for_the_daemon_and_for_orch_run() {
    let (dir, sim) = sim_dir("lost", &gpus(3, |_| String::new()));
    let mut d = Daemon::prepare("health-lost");
    d.devices = Some(format!("sim:{}", sim.display()));
    d.restart();
    assert_eq!(devices(&d)[0]["state"], "ok");
    let text = gpus(3, |i| match i {
        0 => "lost = true".into(),
        1 => "ecc_uncorrected = 2".into(),
        _ => "retired_pages_pending = false".into(),
    });
    rewrite(&sim, &text);
    assert!(until_state(&d, 0, "unhealthy") <= Duration::from_secs(1));
    until_state(&d, 1, "unhealthy");
    let all = devices(&d);
    assert_eq!(
        all[0]["health"]["problems"][0]["kind"], "lost",
        "{}",
        all[0]
    );
    assert_eq!(all[1]["health"]["problems"][0]["kind"], "ecc", "{}", all[1]);
    assert!(
        all[1]["health"]["problems"][0]["message"]
            .as_str()
            .unwrap()
            .starts_with("2 uncorrected ECC error(s)"),
        "{}",
        all[1]
    );
    assert_eq!(all[2]["state"], "ok");
    assert_eq!(
        all[2]["health"]["retired_pages_pending"], false,
        "{}",
        all[2]
    );
    let uuid2 = all[2]["uuid"].as_str().unwrap().to_string();
    d.kill9();

    // Without the daemon, orch run reads the same file: GPU 2 is the one it may have.
    let spec = format!("sim:{}", sim.display());
    let state = d.state.display().to_string();
    let env = [
        ("ORCH_DEVICES", spec.as_str()),
        ("ORCH_STATE_DIR", state.as_str()),
    ];
    let out = orch(
        &[
            "run",
            "--gpus",
            "1",
            "--",
            "sh",
            "-c",
            "echo $CUDA_VISIBLE_DEVICES",
        ],
        &env,
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out).trim(), uuid2);
    let out = orch(&["run", "--gpus", "2", "--", "true"], &env);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let said = stderr(&out);
    assert!(
        said.contains("GPU 0 is unhealthy (the GPU is lost"),
        "{said}"
    );
    assert!(
        said.contains("GPU 1 is unhealthy (2 uncorrected ECC"),
        "{said}"
    );
    assert_eq!(said.trim().lines().count(), 1, "one sentence: {said}");
    // Pages waiting to be retired (a GPU before Ampere) take GPU 2 out of service too.
    rewrite(
        &sim,
        &gpus(3, |i| match i {
            0 => "lost = true".into(),
            1 => "ecc_uncorrected = 2".into(),
            _ => "retired_pages_pending = true".into(),
        }),
    );
    let out = orch(&["run", "--gpus", "1", "--", "true"], &env);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let said = stderr(&out);
    assert!(
        said.contains(
            "GPU 2 is unhealthy (memory pages wait to be retired: the GPU needs a reset)"
        ),
        "{said}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// One daemon of NVML devices at a time: it takes the machine's lock on them
/// (`/run/orch/machine.lock`), and a second one is refused.
pub static NVML_DAEMON: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// [`NVML_DAEMON`], held for the length of a test.
pub fn one_nvml_daemon() -> std::sync::MutexGuard<'static, ()> {
    NVML_DAEMON.lock().unwrap_or_else(|e| e.into_inner())
}

#[test]
fn through_nvml_an_xid_event_makes_the_gpu_unhealthy_and_the_record_reaches_orch_run() {
    let Some(lib) = crate::nvml_sim::library("through_nvml_an_xid_event") else {
        return;
    };
    let _one = one_nvml_daemon();
    let (dir, sim) = sim_dir("nvml", &gpus(3, |_| String::new()));
    let mut d = crate::nvml_sim::nvml_daemon("health-nvml", &lib, &sim);
    assert_eq!(devices(&d)[1]["backend"], "nvml");
    // The daemon's Xid thread registers its event set as it starts: an entry written before
    // that is no event (as with NVML), so the test waits for it.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !d.log().contains("waiting for Xid events on 3 GPU(s)") {
        assert!(
            Instant::now() < deadline,
            "no Xid event thread: {}",
            d.log()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // An application's Xid on GPU 0, a critical one on GPU 1.
    let text = gpus(3, |i| match i {
        0 => "xid_errors = [43]".into(),
        1 => "xid_errors = [79]".into(),
        _ => String::new(),
    });
    rewrite(&sim, &text);
    let took = until_state(&d, 1, "unhealthy");
    assert!(took <= Duration::from_secs(1), "took {took:?}");
    let all = devices(&d);
    assert_eq!(all[1]["health"]["problems"][0]["xid"], 79, "{}", all[1]);
    assert_eq!(all[0]["state"], "ok", "{}", all[0]);
    // NVML's readings: uncorrected ECC errors on GPU 2.
    rewrite(&sim, &(text.clone() + "ecc_uncorrected = 1\n"));
    until_state(&d, 2, "unhealthy");
    d.kill9();

    // The Xid was an event: no reading shows it again. The daemon recorded it in the lease
    // store, where orch run without the daemon finds it.
    let sim_path = sim.display().to_string();
    let state = d.state.display().to_string();
    let env = [
        ("ORCH_DEVICES", "nvml"),
        ("ORCH_NVML_LIBRARY", lib.as_str()),
        ("ORCH_NVML_SIM", sim_path.as_str()),
        ("ORCH_STATE_DIR", state.as_str()),
    ];
    rewrite(&sim, &text);
    let out = orch(&["run", "--gpus", "3", "--", "true"], &env);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("GPU 1 is unhealthy (Xid 79"),
        "{}",
        stderr(&out)
    );
    let out = orch(&["devices", "-v"], &env);
    assert!(
        stdout(&out).contains("unhealthy: Xid 79"),
        "{}",
        stdout(&out)
    );
    // An admin who has seen to the GPU puts it back.
    let out = orch(&["undrain", "1"], &env);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = orch(&["run", "--gpus", "3", "--", "true"], &env);
    assert!(out.status.success(), "{}", stderr(&out));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_drain_holds_a_daemon_job_back_until_undrain_and_survives_a_restart() {
    let (dir, sim) = sim_dir("drain", &gpus(1, |_| String::new()));
    let mut d = Daemon::prepare("health-drain");
    d.devices = Some(format!("sim:{}", sim.display()));
    d.restart();
    let out = d.client(&["drain", "0", "--reason", "fan replacement"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).starts_with("drained GPU 0 ("),
        "{}",
        stdout(&out)
    );
    assert_eq!(devices(&d)[0]["state"], "drained");
    let uuid = devices(&d)[0]["uuid"].as_str().unwrap().to_string();
    let id = d.submit(&["--gpus", "1", "--", "true"]);
    let held = until_reason(&d, &id, "GPU 0 is drained (fan replacement)");
    assert_eq!(held["state"], "queued", "{held}");
    let text = metrics(&d);
    assert_eq!(
        gauge(&text, "orch_device_drained", &uuid),
        Some(1),
        "{text}"
    );
    assert_eq!(
        gauge(&text, "orch_device_healthy", &uuid),
        Some(1),
        "{text}"
    );

    // A restart keeps the drain (the lease store's) and the job waiting.
    d.kill9();
    d.restart();
    assert_eq!(devices(&d)[0]["state"], "drained");
    assert_eq!(
        devices(&d)[0]["health"]["drains"][0]["reason"],
        "fan replacement"
    );
    assert_eq!(
        (
            &devices(&d)[0]["health"]["state"],
            &devices(&d)[0]["health"]["reason"]
        ),
        (&"drained".into(), &"fan replacement".into())
    );
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(d.status(&id)["state"], "queued");
    let out = d.client(&["devices"]);
    assert!(
        stdout(&out).lines().nth(1).unwrap().ends_with(" drained"),
        "{}",
        stdout(&out)
    );

    let out = d.client(&["undrain", "0"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(devices(&d)[0]["state"], "ok");
    d.wait_state(&id, "succeeded");
    // A name that is no device is one sentence, exit 2.
    let out = d.client(&["drain", "GPU-nothing-like-it"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("no device is \"GPU-nothing-like-it\""),
        "{}",
        stderr(&out)
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn orch_run_without_a_daemon_avoids_a_drained_gpu_and_fails_when_only_drained_or_unhealthy_fit() {
    let (dir, sim) = sim_dir(
        "local",
        &gpus(3, |i| {
            if i == 2 {
                "xid_errors = [48]\n[[gpu.mig]]\nuuid = \"MIG-2a2a2a2a-0000-4000-8000-000000000000\"\nname = \"1g.10gb\"".into()
            } else {
                String::new()
            }
        }),
    );
    let spec = format!("sim:{}", sim.display());
    let state = dir.join("state").display().to_string();
    let env = [
        ("ORCH_DEVICES", spec.as_str()),
        ("ORCH_STATE_DIR", state.as_str()),
    ];
    let out = orch(&["drain", "0", "--reason", "maintenance"], &env);
    assert!(out.status.success(), "{}", stderr(&out));
    let which = orch(
        &[
            "run",
            "--gpus",
            "1",
            "--",
            "sh",
            "-c",
            "echo $CUDA_VISIBLE_DEVICES",
        ],
        &env,
    );
    assert!(which.status.success(), "{}", stderr(&which));
    assert!(
        stdout(&which)
            .trim()
            .starts_with("GPU-51300001-0000-4000-8000-000000000001")
    );
    let out = orch(&["run", "--gpus", "2", "--", "true"], &env);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let said = stderr(&out);
    assert!(said.contains("GPU 0 is drained (maintenance)"), "{said}");
    // GPU 2 is in MIG mode, never a whole GPU's candidate; its slices are unhealthy with it.
    let out = orch(&["run", "--mig", "1g.10gb", "--", "true"], &env);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let said = stderr(&out);
    assert!(
        said.contains("of GPU 2 is unhealthy (Xid 48: double-bit ECC error)"),
        "{said}"
    );
    // The plan says why each device was not chosen.
    let job = dir.join("job.toml");
    std::fs::write(
        &job,
        "[job]\nname = \"j\"\n[resources]\ngpus = 1\n[command]\nargv = [\"true\"]\n",
    )
    .unwrap();
    let out = orch(&["plan", job.to_str().unwrap()], &env);
    assert!(
        stdout(&out).contains("GPU 0 is drained (maintenance)"),
        "{}",
        stdout(&out)
    );
    // A slice is drained by its uuid, and shows as drained in --json.
    let out = orch(&["drain", "MIG-2a2a2a2a-0000-4000-8000-000000000000"], &env);
    assert!(out.status.success(), "{}", stderr(&out));
    let listed: Value = serde_json::from_slice(&orch(&["devices", "--json"], &env).stdout).unwrap();
    assert_eq!(listed[0]["state"], "drained");
    assert_eq!(listed[1]["state"], "ok");
    assert_eq!(listed[2]["state"], "unhealthy");
    assert_eq!(
        listed[2]["health"]["drains"][0]["uuid"],
        "MIG-2a2a2a2a-0000-4000-8000-000000000000"
    );
    assert_eq!(listed[2]["mig_devices"][0]["state"], "unhealthy");
    // A slice's health is its state with why: its GPU's problem here.
    assert_eq!(listed[2]["mig_devices"][0]["health"]["state"], "unhealthy");
    assert_eq!(
        listed[2]["mig_devices"][0]["health"]["reason"],
        "Xid 48: double-bit ECC error"
    );
    assert_eq!(listed[0]["health"]["state"], "drained");
    assert_eq!(listed[0]["health"]["reason"], "maintenance");
    assert!(listed[0]["health"]["since_ms"].as_u64().unwrap() > 0);
    let out = orch(&["undrain", "0"], &env);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = orch(&["run", "--gpus", "2", "--", "true"], &env);
    assert!(out.status.success(), "{}", stderr(&out));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn only_admins_may_drain_through_the_daemon() {
    if !root_or_skip("only_admins_may_drain_through_the_daemon") {
        return;
    }
    let alice = test_user("orchtesta");
    let (d, public) = two_tenants("health-admins", |_| {});
    let socket = d.socket();
    let out = as_user(
        alice,
        &socket,
        &public,
        &["drain", "0", "--reason", "mine now"],
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("only an admin may drain a device (user orchtesta"),
        "{}",
        stderr(&out)
    );
    let out = as_user(alice, &socket, &public, &["undrain", "0"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert_eq!(devices(&d)[0]["state"], "ok");
    // root is the daemon's admin.
    let out = d.client(&["drain", "0"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(devices(&d)[0]["state"], "drained");
    assert_eq!(devices(&d)[0]["health"]["drains"][0]["by"], "root");
    // A user sees the daemon's drains in orch devices, though the lease store is root's.
    let sim = lab_sim();
    let out = as_user(
        alice,
        &socket,
        &public,
        &["--devices", &sim, "devices", "-v"],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let listed = stdout(&out);
    assert!(
        listed.lines().nth(1).unwrap().ends_with(" drained"),
        "{listed}"
    );
    assert!(listed.lines().nth(2).unwrap().ends_with(" ok"), "{listed}");
}

#[test]
fn a_drained_gpu_is_no_free_room_for_the_scheduler_a_starving_job_holds_the_rest() {
    let (dir, sim) = sim_dir("room", &gpus(3, |_| String::new()));
    let mut d = Daemon::prepare("health-room");
    d.devices = Some(format!("sim:{}", sim.display()));
    let me = stdout(
        &std::process::Command::new("id")
            .arg("-un")
            .output()
            .unwrap(),
    )
    .trim()
    .to_string();
    let config = d.state.join("serve.toml");
    std::fs::write(
        &config,
        format!("starvation_limit = \"1s\"\nadmins = [\"{me}\"]\n[[tenant]]\nname = \"lab\"\nusers = [\"{me}\"]\n"),
    )
    .unwrap();
    d.config = Some(config);
    d.restart();
    let out = d.client(&["drain", "2", "--reason", "maintenance"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let running = d.submit(&["--gpus", "1", "--", "sleep", "60"]);
    d.wait_state(&running, "running");
    // One GPU is free and one drained: the two-GPU job waits for one more, and once it has
    // waited over the starvation limit it holds the free one (a drained GPU is no room).
    let big = d.submit(&["--gpus", "2", "--", "true"]);
    let waiting = until_reason(&d, &big, "holding the 1 free ones for it");
    assert!(
        waiting["reason"]
            .as_str()
            .unwrap()
            .contains("out of service: GPU 2 is drained (maintenance)"),
        "{waiting}"
    );
    let small = d.submit(&["--gpus", "1", "--", "true"]);
    std::thread::sleep(Duration::from_millis(700));
    assert_eq!(d.status(&small)["state"], "queued", "{}", d.status(&small));
    assert!(d.client(&["cancel", &running]).status.success());
    d.wait_state(&big, "succeeded");
    d.wait_state(&small, "succeeded");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn orch_run_inside_a_running_job_keeps_its_drained_gpu_and_not_an_unhealthy_one() {
    let (dir, sim) = sim_dir("inner", &gpus(2, |_| String::new()));
    let mut d = Daemon::prepare("health-inner");
    let spec = format!("sim:{}", sim.display());
    d.devices = Some(spec.clone());
    d.restart();
    let go = dir.join("go");
    let orch_bin = env!("CARGO_BIN_EXE_orch");
    // The job waits for the test's word, then runs `orch run` on the GPU it holds.
    let script = format!(
        "while [ ! -e {go} ]; do sleep 0.05; done; ORCH_DEVICES={spec} {orch_bin} run -- sh -c 'echo inner $CUDA_VISIBLE_DEVICES'",
        go = go.display()
    );
    let id = d.submit(&["--gpus", "1", "--", "sh", "-c", &script]);
    let held = device_of(&d.wait_state(&id, "running"));
    let index = index_of(&d, &held);
    let out = d.client(&["drain", &index.to_string(), "--reason", "after this job"]);
    assert!(out.status.success(), "{}", stderr(&out));
    std::fs::write(&go, "").unwrap();
    let out = d.client(&["wait", &id]);
    assert!(
        out.status.success(),
        "{}",
        stdout(&d.client(&["logs", "--stderr", &id]))
    );
    assert_eq!(
        stdout(&d.client(&["logs", &id])).trim(),
        format!("inner {held}")
    );
    // An unhealthy GPU stays out of service, inside a job too.
    let go2 = dir.join("go2");
    let script = script.replace(&go.display().to_string(), &go2.display().to_string());
    assert!(d.client(&["undrain", &index.to_string()]).status.success());
    let id = d.submit(&["--gpus", "1", "--", "sh", "-c", &script]);
    let held = device_of(&d.wait_state(&id, "running"));
    let sick = index_of(&d, &held);
    rewrite(
        &sim,
        &gpus(2, |i| {
            if i == sick {
                "xid_errors = [79]".into()
            } else {
                String::new()
            }
        }),
    );
    until_state(&d, sick, "unhealthy");
    std::fs::write(&go2, "").unwrap();
    let out = d.client(&["wait", &id]);
    assert!(
        !out.status.success(),
        "the inner run was placed on an unhealthy GPU"
    );
    assert!(
        stdout(&d.client(&["logs", "--stderr", &id])).contains("is unhealthy (Xid 79"),
        "{}",
        stdout(&d.client(&["logs", "--stderr", &id]))
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn without_a_daemon_a_user_who_is_not_root_must_name_the_store_a_drain_goes_to() {
    if !root_or_skip("without_a_daemon_a_user_who_is_not_root_must_name_the_store") {
        return;
    }
    let alice = test_user("orchtesta");
    let public = std::env::temp_dir().join(format!("orch-health-local-{}", std::process::id()));
    crate::serve::world_dir(&public);
    let sim = lab_sim();
    // No daemon answers at this socket: the drain would go to alice's own store.
    let socket = public.join("nobody.sock");
    let out = as_user(alice, &socket, &public, &["--devices", &sim, "drain", "0"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let said = stderr(&out);
    assert!(
        said.contains("orch drain as orchtesta would only mark orchtesta's own lease store"),
        "{said}"
    );
    assert!(said.contains("set ORCH_STATE_DIR"), "{said}");
    assert_eq!(said.trim().lines().count(), 1, "one sentence: {said}");
    let out = as_user(
        alice,
        &socket,
        &public,
        &["--devices", &sim, "undrain", "0"],
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));

    // A reason is checked as the daemon checks it: one line of at most 200 characters.
    let state = public.join("state").display().to_string();
    let env = [
        ("ORCH_DEVICES", sim.as_str()),
        ("ORCH_STATE_DIR", state.as_str()),
    ];
    let long = "x".repeat(201);
    for bad in [long.as_str(), "two\nlines"] {
        let out = orch(&["drain", "0", "--reason", bad], &env);
        assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
        assert!(
            stderr(&out)
                .contains("--reason: a drain's reason is one line of at most 200 characters"),
            "{}",
            stderr(&out)
        );
    }
    let out = orch(&["devices", "--json"], &env);
    let listed: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(listed[0]["state"], "ok", "nothing was drained");
    let _ = std::fs::remove_dir_all(public);
}

#[test]
fn an_undrain_does_not_flicker_back_while_the_watcher_reads_the_devices() {
    let text = gpus(2, |_| String::new());
    let (dir, sim) = sim_dir("flicker", &text);
    let mut d = Daemon::prepare("health-flicker");
    d.devices = Some(format!("sim:{}", sim.display()));
    d.restart();
    // A writer keeps the sim file changing, so the watcher reads the devices every few ms.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (stop, sim) = (std::sync::Arc::clone(&stop), sim.clone());
        std::thread::spawn(move || {
            let mut n = 0u32;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) && n < 5_000 {
                n += 1;
                rewrite(&sim, &format!("{text}# {n}\n"));
                std::thread::sleep(Duration::from_millis(2));
            }
        })
    };
    let mut flickers = Vec::new();
    for round in 0..30 {
        let (status, body) = http(&d, "POST", "/v1/devices/1/drain", &serde_json::json!({}));
        assert_eq!(status, 200, "{body}");
        let (status, body) = http(&d, "POST", "/v1/devices/1/undrain", &Value::Null);
        assert_eq!(status, 200, "{body}");
        for _ in 0..10 {
            let state = devices(&d)[1]["state"].clone();
            if state != "ok" {
                flickers.push((round, state));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    writer.join().unwrap();
    assert!(flickers.is_empty(), "undrained GPU 1 showed {flickers:?}");
    let _ = std::fs::remove_dir_all(dir);
}

/// Waits until the daemon's log has said `words` `times` times. Fails after 10 s.
fn until_logged(d: &Daemon, words: &str, times: usize) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while d.log().matches(words).count() < times {
        assert!(
            Instant::now() < deadline,
            "never logged {words:?}: {}",
            d.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn through_nvml_a_lost_gpu_is_a_lost_device_not_a_failed_reading() {
    let Some(lib) = crate::nvml_sim::library("a_lost_gpu_is_a_lost_device") else {
        return;
    };
    let (dir, sim) = sim_dir(
        "nvml-lost",
        &gpus(3, |i| {
            if i == 1 {
                "lost = true".into()
            } else {
                String::new()
            }
        }),
    );
    let sim_path = sim.display().to_string();
    let state = dir.join("state").display().to_string();
    let env = [
        ("ORCH_DEVICES", "nvml"),
        ("ORCH_NVML_LIBRARY", lib.as_str()),
        ("ORCH_NVML_SIM", sim_path.as_str()),
        ("ORCH_STATE_DIR", state.as_str()),
    ];
    // The driver answers GPU_IS_LOST to GPU 1's handle: the other two are read, GPU 1 is lost
    // (this process never read it before: its uuid is made of its index).
    let out = orch(&["devices", "--json"], &env);
    assert!(out.status.success(), "{}", stderr(&out));
    let listed: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(listed.as_array().unwrap().len(), 3, "{listed}");
    assert_eq!(listed[1]["uuid"], "GPU-lost-1", "{}", listed[1]);
    assert_eq!(listed[1]["state"], "unhealthy");
    assert_eq!(listed[1]["health"]["problems"][0]["kind"], "lost");
    assert_eq!(listed[0]["state"], "ok");
    let out = orch(
        &[
            "run",
            "--gpus",
            "2",
            "--",
            "sh",
            "-c",
            "echo $CUDA_VISIBLE_DEVICES",
        ],
        &env,
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!stdout(&out).contains("lost"), "{}", stdout(&out));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn through_nvml_the_xid_thread_registers_a_new_gpu_and_names_a_lost_one_by_its_uuid() {
    let Some(lib) = crate::nvml_sim::library("the_xid_thread_registers_a_new_gpu") else {
        return;
    };
    let _one = one_nvml_daemon();
    let (dir, sim) = sim_dir("nvml-new", &gpus(2, |_| String::new()));
    let d = crate::nvml_sim::nvml_daemon("health-nvml-new", &lib, &sim);
    until_logged(&d, "waiting for Xid events on 2 GPU(s)", 1);
    // A third GPU appears: the thread registers it within a few seconds.
    rewrite(&sim, &gpus(3, |_| String::new()));
    until_logged(&d, "waiting for Xid events on 3 GPU(s)", 1);
    until_state(&d, 2, "ok");
    let uuid = devices(&d)[2]["uuid"].as_str().unwrap().to_string();
    // It falls off the bus: an Xid 79, and from then on GPU_IS_LOST to its uuid and handle.
    rewrite(
        &sim,
        &gpus(3, |i| {
            if i == 2 {
                "lost = true\nxid_errors = [79]".into()
            } else {
                String::new()
            }
        }),
    );
    until_state(&d, 2, "unhealthy");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let gpu = devices(&d)[2].clone();
        // Still named by its uuid (the daemon's last reading of it), with the Xid its event
        // carried (named through the handle it was registered by) and the lost reading.
        assert_eq!(gpu["uuid"], uuid, "{gpu}");
        let kinds: Vec<Value> = gpu["health"]["problems"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["kind"].clone())
            .collect();
        if kinds.contains(&Value::from("xid")) && kinds.contains(&Value::from("lost")) {
            break;
        }
        assert!(Instant::now() < deadline, "{gpu}\n{}", d.log());
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        !d.log().contains("could not read the devices again"),
        "{}",
        d.log()
    );
    let _ = std::fs::remove_dir_all(dir);
}
