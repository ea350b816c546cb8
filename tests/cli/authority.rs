//! One lease authority per machine: `orch run` takes its lease from the daemon it finds (here
//! named by `ORCH_SERVER`; the machine's own socket is tested with real users in
//! tests/python/test_authority.py), waits in its queue, shows as an interactive job, and keeps
//! its devices while its job runs even when `orch run` itself is killed; a user's own daemon
//! does not start beside a machine daemon that owns real GPUs.

use crate::serve::{Daemon, root_or_skip};
use crate::{stderr, stdout};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const TWO_GPUS: &str = "[[gpu]]\nname = \"Sim\"\nmemory_total = \"16GiB\"\nuuid = \"GPU-0a000000-0000-0000-0000-000000000001\"\n\
[[gpu]]\nname = \"Sim\"\nmemory_total = \"16GiB\"\nuuid = \"GPU-0a000000-0000-0000-0000-000000000002\"\n";

fn two_gpu_daemon(tag: &str) -> Daemon {
    let mut d = Daemon::prepare(tag);
    let sim = d.state.join("two.toml");
    std::fs::write(&sim, TWO_GPUS).unwrap();
    d.devices = Some(format!("sim:{}", sim.display()));
    d.restart();
    d
}

/// `orch ARGS` that asks the daemon `d` (and no lease store of its own).
fn through(d: &Daemon, args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_orch"));
    cmd.args(args)
        .env("ORCH_SERVER", d.socket())
        .env_remove("ORCH_STATE_DIR")
        .env_remove("ORCH_DEVICES")
        .env_remove("ORCH_JOB_ID")
        .env_remove("CUDA_VISIBLE_DEVICES");
    cmd
}

/// `orch run --gpus 2 -- sh -c SCRIPT` through `d`, started and left running.
fn hold_both(d: &Daemon, script: String, out: Stdio) -> std::process::Child {
    through(d, &["run", "--gpus", "2", "--", "sh", "-c", &script])
        .stdout(out)
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

fn jobs(d: &Daemon) -> Vec<serde_json::Value> {
    let out = d.client(&["jobs", "--all", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !done() {
        assert!(Instant::now() < deadline, "{what}: not within 30 s");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn orch_run_takes_its_lease_from_the_daemon_waits_in_its_queue_and_is_an_interactive_job() {
    let d = two_gpu_daemon("authority-run");
    let stop = d.state.join("stop");
    // Both GPUs through the daemon, held by an `orch run` whose job waits for a file.
    let holder = hold_both(
        &d,
        format!(
            "echo $CUDA_VISIBLE_DEVICES; while [ ! -e {} ]; do sleep 0.02; done",
            stop.display()
        ),
        Stdio::piped(),
    );
    wait_for("the first orch run's lease", || {
        jobs(&d).iter().any(|j| j["state"] == "running")
    });
    let listed = jobs(&d);
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0]["interactive"], true, "{listed:?}");
    assert_eq!(listed[0]["gpus"], 2);
    let table = stdout(&d.client(&["jobs"]));
    assert!(table.contains("sh (interactive)"), "{table}");
    // The metrics count it as an interactive job of its user's tenant.
    let (status, metrics) = crate::held_leases::http_text(&d, "GET", "/metrics", "");
    assert_eq!(status, 200, "{metrics}");
    let tenant = listed[0]["tenant"].as_str().unwrap();
    assert!(
        metrics.contains(&format!("orch_interactive_jobs{{tenant=\"{tenant}\"}} 1")),
        "{metrics}"
    );
    // `orch leases` lists the daemon's lease.
    let out = through(&d, &["leases", "--json"]).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let leases: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(leases.len(), 1, "{leases:?}");
    assert_eq!(leases[0]["devices"].as_array().unwrap().len(), 2);

    // No fit without --wait: exit 1 with the daemon's reason, and nothing left queued.
    let out = through(&d, &["run", "--gpus", "1", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("waiting for 1 free device") && err.contains("add --wait"),
        "{err}"
    );
    assert!(!jobs(&d).iter().any(|j| j["state"] == "queued"));

    // With --wait it queues, says so, and starts once the first job ends.
    let waiter = through(
        &d,
        &[
            "run",
            "--gpus",
            "1",
            "--wait",
            "--",
            "sh",
            "-c",
            "echo $CUDA_VISIBLE_DEVICES",
        ],
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    wait_for("the waiting orch run in the queue", || {
        jobs(&d).iter().any(|j| j["state"] == "queued")
    });
    std::fs::write(&stop, "").unwrap();
    let first = holder.wait_with_output().unwrap();
    assert!(first.status.success());
    let second = waiter.wait_with_output().unwrap();
    assert!(second.status.success(), "{}", stderr(&second));
    assert!(
        stderr(&second).contains("waits in the daemon's queue (1st of 1 waiting): waiting for"),
        "{}",
        stderr(&second)
    );
    let first_devices = stdout(&first);
    let got = stdout(&second).trim().to_string();
    assert!(
        first_devices.contains(&got) && got.starts_with("GPU-0a"),
        "{got} / {first_devices}"
    );
    // Every lease ended with its job: the daemon's store is empty, every job final.
    wait_for("every lease to end", || {
        jobs(&d)
            .iter()
            .all(|j| j["state"] != "running" && j["state"] != "queued")
    });
    let out = through(&d, &["leases", "--json"]).output().unwrap();
    assert_eq!(stdout(&out).trim(), "[]");
}

#[test]
fn a_killed_orch_run_keeps_its_lease_while_its_job_runs() {
    if !root_or_skip("a_killed_orch_run_keeps_its_lease_while_its_job_runs") {
        return;
    }
    let d = two_gpu_daemon("authority-kill");
    let stop = d.state.join("stop");
    let ready = d.state.join("ready");
    // A job that outlives the SIGTERM its parent's death sends it (a trainer saving, a process
    // stuck in the driver): it still has the devices.
    let mut run = hold_both(
        &d,
        format!(
            "trap '' TERM; touch {}; while [ ! -e {} ]; do sleep 0.02; done",
            ready.display(),
            stop.display()
        ),
        Stdio::null(),
    );
    wait_for("the job to start", || ready.exists());
    // The daemon moved `orch run` into a cgroup of its own before it answered.
    let cgroup = std::fs::read_to_string(format!("/proc/{}/cgroup", run.id())).unwrap();
    assert!(cgroup.contains("orch-holder-"), "{cgroup}");
    run.kill().unwrap();
    run.wait().unwrap();
    // Its job runs on: the lease stays, however long the daemon looks.
    std::thread::sleep(Duration::from_millis(600));
    let listed = jobs(&d);
    assert_eq!(listed[0]["state"], "running", "{listed:?}");
    let out = through(&d, &["run", "--gpus", "1", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    // The job ends: so does the lease.
    std::fs::write(&stop, "").unwrap();
    wait_for("the lease to end with the job", || {
        jobs(&d)[0]["state"] == "succeeded"
    });
    let out = through(&d, &["run", "--gpus", "2", "--", "true"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
}
