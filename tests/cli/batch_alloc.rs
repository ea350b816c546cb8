//! `orch alloc`, an interactive allocation: through a daemon it holds its lease while its
//! command runs, shows as an allocation (`orch jobs`, `orch status`, the metrics), exits with the
//! command's status and gives the lease back; the daemon ends it at `--idle` (its GPUs idle that
//! long, read from the sim file) and at `--time`, with a line on its terminal; without a daemon
//! it takes a lease of the local store and keeps `--time` itself.

use crate::serve::Daemon;
use crate::{stderr, stdout};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const UUID_0: &str = "GPU-0a000000-0000-0000-0000-000000000001";
const UUID_1: &str = "GPU-0a000000-0000-0000-0000-000000000002";

/// Two sim GPUs at these utilizations, written whole (the daemon reads the file every second).
fn write_sim(path: &Path, utilization: [u32; 2]) {
    let text: String = [UUID_0, UUID_1]
        .iter()
        .zip(utilization)
        .map(|(uuid, u)| {
            format!(
                "[[gpu]]\nname = \"Sim\"\nmemory_total = \"16GiB\"\nutilization = {u}\nuuid = \"{uuid}\"\n"
            )
        })
        .collect();
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// A daemon over two sim GPUs (the user who starts it is its one tenant); the sim file's path.
fn daemon(tag: &str, utilization: [u32; 2]) -> (Daemon, std::path::PathBuf) {
    let mut d = Daemon::prepare(tag);
    let sim = d.state.join("two.toml");
    write_sim(&sim, utilization);
    d.devices = Some(format!("sim:{}", sim.display()));
    d.restart();
    (d, sim)
}

/// `orch alloc ARGS` asking daemon `d` (and no lease store of its own), left running.
fn alloc(d: &Daemon, args: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_orch"))
        .arg("alloc")
        .args(args)
        .env("ORCH_SERVER", d.socket())
        .env_remove("ORCH_STATE_DIR")
        .env_remove("ORCH_DEVICES")
        .env_remove("ORCH_JOB_ID")
        .env_remove("CUDA_VISIBLE_DEVICES")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn jobs(d: &Daemon) -> Vec<serde_json::Value> {
    let out = d.client(&["jobs", "--all", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn wait_for(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < deadline, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The child's output once it has ended, which must be within `limit`.
fn ended_within(mut child: Child, limit: Duration) -> Output {
    let deadline = Instant::now() + limit;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "orch alloc still ran after {limit:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

fn running_id(d: &Daemon) -> String {
    let mut id = String::new();
    wait_for(
        "the allocation's lease",
        Duration::from_secs(15),
        || match jobs(d).iter().find(|j| j["state"] == "running") {
            Some(j) => {
                id = j["id"].as_str().unwrap().to_string();
                true
            }
            None => false,
        },
    );
    id
}

#[test]
fn an_alloc_holds_its_lease_while_its_command_runs_shows_as_an_allocation_and_exits_with_its_status()
 {
    let (d, _) = daemon("alloc-hold", [0, 0]);
    let stop = d.state.join("stop");
    let child = alloc(
        &d,
        &[
            "--gpus",
            "2",
            "--",
            "sh",
            "-c",
            &format!(
                "echo $CUDA_VISIBLE_DEVICES; while [ ! -e {} ]; do sleep 0.02; done; exit 3",
                stop.display()
            ),
        ],
    );
    let id = running_id(&d);
    // While its command runs: an allocation of 2 GPUs, interactive, in every view.
    let listed = jobs(&d);
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(
        (
            &listed[0]["alloc"],
            &listed[0]["interactive"],
            &listed[0]["gpus"]
        ),
        (&true.into(), &true.into(), &2.into()),
        "{listed:?}"
    );
    let table = stdout(&d.client(&["jobs"]));
    assert!(table.contains("sh (interactive alloc)"), "{table}");
    let status = stdout(&d.client(&["status", &id]));
    assert!(
        status.contains("kind         interactive allocation (orch alloc)"),
        "{status}"
    );
    let (code, metrics) = crate::held_leases::http_text(&d, "GET", "/metrics", "");
    assert_eq!(code, 200, "{metrics}");
    let tenant = listed[0]["tenant"].as_str().unwrap();
    for gauge in ["orch_alloc_jobs", "orch_interactive_jobs"] {
        assert!(
            metrics.contains(&format!("{gauge}{{tenant=\"{tenant}\"}} 1")),
            "{gauge}: {metrics}"
        );
    }
    let leases = stdout(&d.client(&["leases", "--json"]));
    let leases: Vec<serde_json::Value> = serde_json::from_str(&leases).unwrap();
    assert_eq!(leases.len(), 1, "{leases:?}");

    // Its command ends with status 3: so does orch alloc, and the lease is given back.
    std::fs::write(&stop, "").unwrap();
    let out = ended_within(child, Duration::from_secs(15));
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let visible = stdout(&out);
    assert_eq!(visible.trim(), format!("{UUID_0},{UUID_1}"), "{visible}");
    let err = stderr(&out);
    assert!(
        err.contains(&format!("orch: granted job {id}: GPU 0, 1 (Sim)")),
        "{err}"
    );
    let s = d.status(&id);
    assert_eq!(
        (&s["state"], &s["reason"]),
        (&"succeeded".into(), &"released by its process".into()),
        "{s}"
    );
    d.wait_no_leases();
    let (_, metrics) = crate::held_leases::http_text(&d, "GET", "/metrics", "");
    assert!(
        metrics.contains(&format!("orch_alloc_jobs{{tenant=\"{tenant}\"}} 0")),
        "{metrics}"
    );
}

#[test]
fn an_alloc_whose_gpus_stay_idle_is_released_with_a_line_on_its_terminal() {
    // Its GPU is busy at first: it is not released, however long that lasts.
    let (d, sim) = daemon("alloc-idle", [90, 90]);
    let child = alloc(&d, &["--gpus", "1", "--idle", "2s", "--", "sleep", "60"]);
    let id = running_id(&d);
    assert_eq!(jobs(&d)[0]["idle_limit_s"], 2.0);
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(d.status(&id)["state"], "running");
    // Idle from now: released about 2 s later (the daemon reads the devices every second).
    write_sim(&sim, [0, 0]);
    let idle_at = Instant::now();
    let out = ended_within(child, Duration::from_secs(12));
    assert!(idle_at.elapsed() >= Duration::from_secs(2));
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains(&format!(
            "orch: job {id} released after 2s idle on its GPUs"
        )),
        "{err}"
    );
    assert!(err.contains("idle limit 2s"), "{err}");
    let s = d.status(&id);
    assert_eq!(
        (&s["state"], &s["reason"]),
        (
            &"failed".into(),
            &"released after 2s idle on its GPUs".into()
        ),
        "{s}"
    );
    d.wait_no_leases();
}

#[test]
fn the_daemon_ends_an_alloc_at_its_time_limit() {
    let (d, _) = daemon("alloc-time", [90, 90]);
    let started = Instant::now();
    let child = alloc(&d, &["--gpus", "1", "--time", "2s", "--", "sleep", "60"]);
    let out = ended_within(child, Duration::from_secs(15));
    assert!(started.elapsed() >= Duration::from_secs(2));
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(err.contains(" until "), "{err}");
    let id = jobs(&d)[0]["id"].as_str().unwrap().to_string();
    assert!(
        err.contains(&format!("orch: job {id} released at its time limit (2s)")),
        "{err}"
    );
    let s = d.status(&id);
    assert_eq!(
        (&s["state"], &s["reason"]),
        (&"failed".into(), &"released at its time limit (2s)".into()),
        "{s}"
    );
    d.wait_no_leases();
}

#[test]
fn without_a_daemon_an_alloc_holds_a_local_lease_and_keeps_its_time_limit() {
    let state = std::env::temp_dir().join(format!("orch-alloc-local-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&state);
    std::fs::create_dir_all(&state).unwrap();
    let sim = state.join("two.toml");
    write_sim(&sim, [0, 0]);
    let orch = |args: &[&str]| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_orch"));
        cmd.args(args)
            .env("ORCH_STATE_DIR", &state)
            .env("ORCH_DEVICES", format!("sim:{}", sim.display()))
            .env_remove("ORCH_SERVER")
            .env_remove("ORCH_JOB_ID")
            .env_remove("CUDA_VISIBLE_DEVICES")
            .stdin(Stdio::null());
        cmd
    };
    // Its command sees its devices and its lease, and its status is orch alloc's.
    let out = orch(&[
        "alloc",
        "--gpus",
        "1",
        "--",
        "sh",
        "-c",
        "echo $CUDA_VISIBLE_DEVICES; orch leases --json; exit 7",
    ])
    .env(
        "PATH",
        format!(
            "{}:{}",
            Path::new(env!("CARGO_BIN_EXE_orch"))
                .parent()
                .unwrap()
                .display(),
            std::env::var("PATH").unwrap_or_default()
        ),
    )
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(7), "{}", stderr(&out));
    let text = stdout(&out);
    let (visible, leases) = text.split_once('\n').unwrap();
    assert!(visible.starts_with("GPU-0a"), "{text}");
    let leases: Vec<serde_json::Value> = serde_json::from_str(leases).unwrap();
    assert_eq!(leases.len(), 1, "{text}");
    assert_eq!(leases[0]["devices"][0], visible, "{text}");
    let err = stderr(&out);
    assert!(err.contains("orch: granted lease sh-"), "{err}");
    let after = orch(&["leases", "--json"]).output().unwrap();
    assert_eq!(stdout(&after).trim(), "[]", "the lease went back");

    // --time: this process ends its command then.
    let started = Instant::now();
    let out = orch(&["alloc", "--gpus", "1", "--time", "1s", "--", "sleep", "60"])
        .output()
        .unwrap();
    assert!(started.elapsed() < Duration::from_secs(10));
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(err.contains("released at its time limit (1s)"), "{err}");
    let after = orch(&["leases", "--json"]).output().unwrap();
    assert_eq!(stdout(&after).trim(), "[]");

    // --idle needs the daemon: one sentence, exit 2.
    let out = orch(&["alloc", "--gpus", "1", "--idle", "30m", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("--idle needs the machine's orch daemon"),
        "{}",
        stderr(&out)
    );
    let _ = std::fs::remove_dir_all(&state);
}

#[test]
fn a_cancelled_alloc_ends_its_command_and_says_so() {
    let (d, _) = daemon("alloc-cancel", [90, 90]);
    let marker = d.state.join("started");
    let script = format!("touch {}; sleep 60", marker.display());
    let child = alloc(&d, &["--gpus", "1", "--", "sh", "-c", &script]);
    let id = running_id(&d);
    wait_for("the allocation's command", Duration::from_secs(15), || {
        marker.exists()
    });
    let out = d.client(&["cancel", &id]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = ended_within(child, Duration::from_secs(15));
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(err.contains(&format!("orch: job {id} cancelled")), "{err}");
    d.wait_state(&id, "cancelled");
    d.wait_no_leases();
}

#[test]
fn a_restarted_daemon_keeps_an_allocs_time_limit_from_its_start() {
    let (mut d, _) = daemon("alloc-restart", [90, 90]);
    let started = Instant::now();
    let marker = d.state.join("granted");
    let script = format!("touch {}; sleep 60", marker.display());
    let child = alloc(
        &d,
        &["--gpus", "1", "--time", "4s", "--", "sh", "-c", &script],
    );
    let id = running_id(&d);
    // Once its command runs (the grant answered), the daemon is killed and started again.
    wait_for("the allocation's command", Duration::from_secs(15), || {
        marker.exists()
    });
    d.kill9();
    d.restart();
    let out = ended_within(child, Duration::from_secs(15));
    assert!(started.elapsed() >= Duration::from_secs(4));
    let err = stderr(&out);
    assert!(
        err.contains(&format!("orch: job {id} released at its time limit (4s)")),
        "{err}"
    );
    let s = d.status(&id);
    assert_eq!(s["state"], "failed", "{s}");
    assert!(
        crate::serve::event_kinds(&s).contains(&"adopted"),
        "adopted after the restart: {s}"
    );
}
