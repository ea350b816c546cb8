//! `orch serve` and its clients, with real processes: a daemon on a temporary socket and state
//! folder over the 8-GPU sim, clients as separate `orch` processes.

use crate::*;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Daemon {
    pub state: PathBuf,
    pub child: Option<Child>,
    pub config: Option<PathBuf>,
    pub socket: Option<PathBuf>,
    run_as: Option<(u32, u32)>,
    /// `--devices` (default: the 8-GPU lab sim).
    pub devices: Option<String>,
    /// The daemon's open-file limit, soft and hard (default: the test's own).
    pub nofile: Option<u64>,
    /// More variables for the daemon's environment.
    pub env: Vec<(&'static str, String)>,
}

impl Daemon {
    pub fn start(tag: &str) -> Daemon {
        let state = std::env::temp_dir().join(format!(
            "orch-serve-{tag}-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        ));
        std::fs::create_dir_all(&state).unwrap();
        let mut d = Daemon {
            state,
            child: None,
            config: None,
            socket: None,
            run_as: None,
            devices: None,
            nofile: None,
            env: Vec::new(),
        };
        d.restart();
        d
    }

    /// Not started yet: set a config, a socket or a user first, then [`Daemon::restart`].
    pub fn prepare(tag: &str) -> Daemon {
        let state = std::env::temp_dir().join(format!("orch-serve-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&state);
        std::fs::create_dir_all(&state).unwrap();
        Daemon {
            state,
            child: None,
            config: None,
            socket: None,
            run_as: None,
            devices: None,
            nofile: None,
            env: Vec::new(),
        }
    }

    /// [`Daemon::prepare`] with a config of `settings` and one tenant `lab` of this test's user
    /// (not started yet).
    pub fn with_lab_tenant(tag: &str, settings: &str) -> Daemon {
        let mut d = Daemon::prepare(tag);
        let me = stdout(&Command::new("id").arg("-un").output().unwrap())
            .trim()
            .to_string();
        let config = d.state.join("serve.toml");
        std::fs::write(
            &config,
            format!("{settings}\n[[tenant]]\nname = \"lab\"\nusers = [\"{me}\"]\n"),
        )
        .unwrap();
        d.config = Some(config);
        d
    }

    pub fn socket(&self) -> PathBuf {
        self.socket
            .clone()
            .unwrap_or_else(|| self.state.join("orch.sock"))
    }

    /// Starts (again) on the same state folder and waits for the socket to answer.
    pub fn restart(&mut self) {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_orch"));
        cmd.arg("serve")
            .env("ORCH_DEVICES", self.devices.clone().unwrap_or_else(lab_sim))
            .env("ORCH_STATE_DIR", &self.state)
            .env_remove("CUDA_VISIBLE_DEVICES")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(self.state.join("daemon.log"))
                    .unwrap(),
            );
        cmd.envs(self.env.iter().map(|(k, v)| (k, v)));
        if let Some(config) = &self.config {
            cmd.arg("--config").arg(config);
        }
        if let Some(socket) = &self.socket {
            cmd.arg("--socket").arg(socket);
        }
        if let Some((uid, gid)) = self.run_as {
            use std::os::unix::process::CommandExt;
            cmd.uid(uid).gid(gid);
        }
        if let Some(n) = self.nofile {
            use std::os::unix::process::CommandExt;
            let limit = libc::rlimit {
                rlim_cur: n,
                rlim_max: n,
            };
            // SAFETY: setrlimit is async-signal-safe and reads a struct copied into the closure.
            unsafe {
                cmd.pre_exec(move || {
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        self.child = Some(cmd.spawn().unwrap());
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if std::os::unix::net::UnixStream::connect(self.socket()).is_ok() {
                return;
            }
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("orch serve exited with {status}: {}", self.log());
            }
            assert!(
                Instant::now() < deadline,
                "the daemon never listened: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.state.join("daemon.log")).unwrap_or_default()
    }

    /// `orch ARGS` as a client of this daemon.
    pub fn client(&self, args: &[&str]) -> std::process::Output {
        let socket = self.socket().display().to_string();
        let state = self.state.display().to_string();
        let sim = self.devices.clone().unwrap_or_else(lab_sim);
        orch(
            args,
            &[
                ("ORCH_SERVER", &socket),
                ("ORCH_STATE_DIR", &state),
                ("ORCH_DEVICES", &sim),
            ],
        )
    }

    pub fn submit(&self, args: &[&str]) -> String {
        let mut all = vec!["submit"];
        all.extend_from_slice(args);
        let out = self.client(&all);
        assert!(out.status.success(), "submit failed: {}", stderr(&out));
        stdout(&out).trim().to_string()
    }

    pub fn status(&self, id: &str) -> serde_json::Value {
        let out = self.client(&["status", id, "--json"]);
        assert!(out.status.success(), "{}", stderr(&out));
        serde_json::from_slice(&out.stdout).unwrap()
    }

    /// Waits until the daemon lists no lease: a job's lease is released just after its end is
    /// recorded, so a client may see the end a moment before the lease goes.
    pub fn wait_no_leases(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let listed = stdout(&self.client(&["leases", "--json"]));
            if listed.trim() == "[]" {
                return;
            }
            assert!(Instant::now() < deadline, "leases never ended: {listed}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn wait_state(&self, id: &str, want: &str) -> serde_json::Value {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let s = self.status(id);
            if s["state"] == want {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "job {id} never became {want}: {s}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// Runs `cmd`, an `orch serve` expected to refuse to start, with its output captured: that
/// output, once it has exited; fails the test if it still runs after `limit`.
pub fn serve_refusal(mut cmd: Command, limit: Duration) -> std::process::Output {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + limit;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("orch serve kept running: {:?}", child.wait_with_output());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

/// The kinds of a job's events (`orch status --json`'s `events`), in order.
pub fn event_kinds(status: &serde_json::Value) -> Vec<&str> {
    status["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap())
        .collect()
}

pub fn job_file(dir: &std::path::Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

#[test]
fn submit_wait_logs_status() {
    let d = Daemon::start("basic");
    let id = d.submit(&[
        "--gpus",
        "2",
        "--",
        "sh",
        "-c",
        "echo out $CUDA_VISIBLE_DEVICES; echo err >&2; exit 3",
    ]);
    let out = d.client(&["wait", &id]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(stderr(&out).contains("failed"), "{}", stderr(&out));
    let logs = stdout(&d.client(&["logs", &id]));
    assert!(logs.starts_with("out GPU-"), "{logs}");
    assert_eq!(logs.trim().split(',').count(), 2, "two devices: {logs}");
    assert_eq!(stdout(&d.client(&["logs", "--stderr", &id])).trim(), "err");
    let s = d.status(&id);
    assert_eq!(
        (s["state"].as_str(), s["exit_code"].as_i64()),
        (Some("failed"), Some(3))
    );
    assert_eq!(s["devices"].as_array().unwrap().len(), 2);
    let jobs = stdout(&d.client(&["jobs", "--all"]));
    assert!(jobs.contains("failed") && jobs.contains("STATE"), "{jobs}");
}

#[test]
fn the_job_runs_in_the_clients_folder_with_the_clients_environment() {
    let d = Daemon::start("env");
    let here = d.state.join("work");
    std::fs::create_dir_all(&here).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_orch"))
        .args(["submit", "--", "sh", "-c", "pwd; echo $ORCH_TEST_MARK"])
        .current_dir(&here)
        .env("ORCH_SERVER", d.socket())
        .env("ORCH_TEST_MARK", "from-the-client")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let id = stdout(&out).trim().to_string();
    assert!(d.client(&["wait", &id]).status.success());
    let logs = stdout(&d.client(&["logs", &id]));
    assert_eq!(logs, format!("{}\nfrom-the-client\n", here.display()));
}

#[test]
fn bad_input_and_unknown_ids() {
    let d = Daemon::start("bad");
    let file = job_file(
        &d.state,
        "bad.toml",
        "[job]\nname = \"x\"\n[resources]\ngpus = 2\nbogus = 1\n[command]\nargv = [\"true\"]\n",
    );
    let out = d.client(&["submit", &file]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("bad.toml:5:1"), "{}", stderr(&out));
    let too_many = job_file(
        &d.state,
        "many.toml",
        "[job]\nname = \"x\"\n[resources]\ngpus = 9\n[command]\nargv = [\"true\"]\n",
    );
    let out = d.client(&["submit", &too_many]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("many.toml:4") && stderr(&out).contains("8 device"),
        "{}",
        stderr(&out)
    );
    for id in ["424242", "../etc", "x y"] {
        let out = d.client(&["status", id]);
        assert_eq!(out.status.code(), Some(2), "{id}: {}", stderr(&out));
        assert!(stderr(&out).contains("no job"), "{}", stderr(&out));
    }
    let done = d.submit(&["--", "true"]);
    d.wait_state(&done, "succeeded");
    let out = d.client(&["cancel", &done]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("already ended"), "{}", stderr(&out));
}

#[test]
fn no_daemon_is_one_sentence_saying_how_to_start_one() {
    let out = orch(&["jobs"], &[("ORCH_SERVER", "/nonexistent/orch-test.sock")]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.contains("no orch daemon answers") && err.contains("orch serve"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "{err}");
}

#[test]
fn a_second_daemon_on_the_same_state_folder_refuses() {
    let d = Daemon::start("second");
    let out = orch(
        &["serve"],
        &[
            ("ORCH_STATE_DIR", &d.state.display().to_string()),
            ("ORCH_DEVICES", &lab_sim()),
        ],
    );
    // A start-up failure: exit 2, as for a bad config.
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("another orch serve is running"),
        "{}",
        stderr(&out)
    );
    // The first one still serves.
    assert!(d.client(&["jobs"]).status.success());
}

/// A process group with a running member.
fn group_alive(pgid: i32) -> bool {
    orch_core::process::group_running(pgid as u32)
}

#[test]
fn cancel_of_a_queued_and_of_a_running_job() {
    let d = Daemon::start("cancel");
    // The running one starts a grandchild: the whole tree must end.
    let pidfile = d.state.join("pid");
    let script = format!("echo $$ > {}; sleep 300 & sleep 300", pidfile.display());
    let running = d.submit(&["--gpus", "8", "--", "sh", "-c", &script]);
    d.wait_state(&running, "running");
    let queued = d.submit(&["--gpus", "8", "--", "true"]);
    assert_eq!(d.status(&queued)["state"], "queued");
    let out = d.client(&["cancel", &queued]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(d.status(&queued)["state"], "cancelled");

    let deadline = Instant::now() + Duration::from_secs(10);
    while !pidfile.exists() {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(10));
    }
    let pgid: i32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(group_alive(pgid));
    assert!(d.client(&["cancel", &running]).status.success());
    let s = d.wait_state(&running, "cancelled");
    assert_eq!(s["reason"], "cancelled");
    assert!(
        !group_alive(pgid),
        "a process of the cancelled job survived"
    );
    let leases = d.client(&["leases", "--json"]);
    assert_eq!(stdout(&leases).trim(), "[]", "the lease is freed");
    // The devices are free for the next job at once.
    let next = d.submit(&["--gpus", "8", "--", "true"]);
    d.wait_state(&next, "succeeded");
}

#[test]
fn max_runtime_stops_a_job_with_the_reason_time_limit() {
    let d = Daemon::start("timelimit");
    let file = job_file(
        &d.state,
        "slow.toml",
        "[job]\nname = \"slow\"\nmax_runtime = \"500ms\"\n[command]\nargv = [\"sleep\", \"60\"]\n",
    );
    let id = d.submit(&[&file]);
    let s = d.wait_state(&id, "failed");
    assert_eq!(s["reason"], "time limit", "{s}");
}

#[test]
fn a_big_job_does_not_block_smaller_ones_behind_it() {
    let d = Daemon::start("backfill");
    let hold = d.submit(&["--gpus", "4", "--", "sleep", "30"]);
    d.wait_state(&hold, "running");
    let big = d.submit(&["--gpus", "8", "--", "true"]);
    let small = d.submit(&["--gpus", "2", "--", "true"]);
    d.wait_state(&small, "succeeded");
    let s = d.status(&big);
    assert_eq!(s["state"], "queued");
    assert!(
        s["reason"].as_str().unwrap_or("").contains("waiting for 8"),
        "{s}"
    );
    assert!(d.client(&["cancel", &hold]).status.success());
    d.wait_state(&big, "succeeded");
}

#[test]
fn following_logs_streams_until_the_job_ends_and_a_vanishing_reader_harms_nothing() {
    let d = Daemon::start("follow");
    let id = d.submit(&[
        "--",
        "sh",
        "-c",
        "for i in 1 2 3; do echo line $i; sleep 0.2; done",
    ]);
    // A reader that goes away at once.
    let mut early = Command::new(env!("CARGO_BIN_EXE_orch"))
        .args(["logs", "--follow", &id])
        .env("ORCH_SERVER", d.socket())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let _ = early.kill();
    let _ = early.wait();
    let out = d.client(&["logs", "--follow", &id]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), "line 1\nline 2\nline 3\n");
    assert_eq!(d.status(&id)["state"], "succeeded");
}

#[test]
fn hostile_clients_do_not_stop_the_daemon() {
    use std::io::{Read, Write};
    let d = Daemon::start("hostile");
    // A half-open connection that never sends a request, and one that sends half a header.
    let _silent = std::os::unix::net::UnixStream::connect(d.socket()).unwrap();
    let mut half = std::os::unix::net::UnixStream::connect(d.socket()).unwrap();
    half.write_all(b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\n")
        .unwrap();
    // A body over the limit.
    let mut big = std::os::unix::net::UnixStream::connect(d.socket()).unwrap();
    let body = vec![b'a'; 40 << 20];
    let head = format!(
        "POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    big.write_all(head.as_bytes()).unwrap();
    let _ = big.write_all(&body);
    let mut answer = String::new();
    let _ = big.read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(
        answer.contains("{\"error\":"),
        "errors are JSON, the body limit's too: {answer}"
    );
    // Garbage instead of JSON.
    let mut junk = std::os::unix::net::UnixStream::connect(d.socket()).unwrap();
    junk.write_all(
        b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nConnection: close\r\n\r\n{{{{{",
    )
    .unwrap();
    let mut answer = String::new();
    junk.read_to_string(&mut answer).unwrap();
    assert!(
        answer.starts_with("HTTP/1.1 400") && answer.contains("\"error\""),
        "{answer}"
    );
    // Everyone else is served meanwhile.
    let id = d.submit(&["--", "true"]);
    d.wait_state(&id, "succeeded");
}

/// 200 one-GPU jobs from 8 clients at once, `orch run` jobs beside them, and three kill -9 of
/// the daemon meanwhile: every accepted job runs exactly once, no two jobs overlap on a device.
#[test]
fn two_hundred_jobs_from_eight_clients_through_three_crashes() {
    let mut d = Daemon::start("crash");
    let log = d.state.join("intervals.log");
    let record = format!(
        "s=$(date +%s%N); sleep 0.05; e=$(date +%s%N); echo \"$CUDA_VISIBLE_DEVICES $s $e $MARK\" >> {}",
        log.display()
    );
    let socket = d.socket();
    let state_dir = d.state.clone();
    let accepted: std::sync::Mutex<Vec<(String, String)>> = Default::default();
    std::thread::scope(|scope| {
        for client in 0..8 {
            let (record, socket, accepted) = (&record, &socket, &accepted);
            scope.spawn(move || {
                for i in 0..25 {
                    let mark = format!("daemon-{client}-{i}");
                    let script = format!("MARK={mark}; {record}");
                    // The daemon may be down for a moment: orch submit waits for it and sends
                    // again with the same key, so nothing is accepted twice.
                    let out = Command::new(env!("CARGO_BIN_EXE_orch"))
                        .args(["submit", "--", "sh", "-c", &script])
                        .env("ORCH_SERVER", socket)
                        .output()
                        .unwrap();
                    assert!(out.status.success(), "{}", stderr(&out));
                    let id = stdout(&out).trim().to_string();
                    accepted.lock().unwrap().push((id, mark));
                }
            });
        }
        // `orch run` jobs on the same lease store at the same time.
        for n in 0..4 {
            let (record, state) = (&record, &state_dir);
            scope.spawn(move || {
                for i in 0..5 {
                    let script = format!("MARK=run-{n}-{i}; {record}");
                    let out = Command::new(env!("CARGO_BIN_EXE_orch"))
                        .args([
                            "run",
                            "--wait",
                            "--timeout",
                            "120s",
                            "--",
                            "sh",
                            "-c",
                            &script,
                        ])
                        .env("ORCH_DEVICES", lab_sim())
                        .env("ORCH_STATE_DIR", state)
                        .output()
                        .unwrap();
                    assert!(out.status.success(), "{}", stderr(&out));
                }
            });
        }
        for _ in 0..3 {
            std::thread::sleep(Duration::from_millis(400));
            d.kill9();
            std::thread::sleep(Duration::from_millis(100));
            d.restart();
        }
    });
    let accepted = accepted.into_inner().unwrap();
    assert_eq!(accepted.len(), 200);
    let mut states = BTreeMap::new();
    for (id, _) in &accepted {
        let deadline = Instant::now() + Duration::from_secs(120);
        let state = loop {
            let s = d.status(id);
            let state = s["state"].as_str().unwrap().to_string();
            if state != "queued" && state != "running" {
                break state;
            }
            assert!(Instant::now() < deadline, "job {id} never ended: {s}");
            std::thread::sleep(Duration::from_millis(50));
        };
        *states.entry(state).or_insert(0) += 1;
    }
    // Supervisors outlive the daemon, so every job is adopted and ends by itself.
    assert_eq!(
        states.get("succeeded"),
        Some(&200),
        "{states:?}\n{}",
        d.log()
    );
    let text = std::fs::read_to_string(&log).unwrap();
    let mut runs: HashMap<String, usize> = HashMap::new();
    let mut by_device: HashMap<String, Vec<(u128, u128)>> = HashMap::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(f.len(), 4, "{line}");
        *runs.entry(f[3].to_string()).or_default() += 1;
        by_device
            .entry(f[0].to_string())
            .or_default()
            .push((f[1].parse().unwrap(), f[2].parse().unwrap()));
    }
    for (_, mark) in &accepted {
        assert_eq!(
            runs.get(mark),
            Some(&1),
            "{mark} ran {:?} times",
            runs.get(mark)
        );
    }
    assert_eq!(
        runs.len(),
        220,
        "200 daemon jobs and 20 orch run jobs, each once"
    );
    for (device, mut spans) in by_device {
        spans.sort();
        for pair in spans.windows(2) {
            assert!(
                pair[0].1 <= pair[1].0,
                "two jobs overlapped on {device}: {pair:?}"
            );
        }
    }
    let unique: BTreeSet<&String> = accepted.iter().map(|(id, _)| id).collect();
    assert_eq!(unique.len(), 200, "every job has an id of its own");
}

/// The supervisor's pid, from the job's fence file.
pub fn supervisor_pid(d: &Daemon, id: &str, attempt: u32) -> i32 {
    let fence = d
        .state
        .join("jobs")
        .join(format!("{id}-{attempt}"))
        .join("started");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(text) = std::fs::read_to_string(&fence)
            && let Ok(v) = serde_json::from_str::<serde_json::Value>(&text)
            && let Some(pid) = v["supervisor"]["pid"].as_i64()
        {
            return pid as i32;
        }
        assert!(Instant::now() < deadline, "no supervisor for job {id}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn after_a_crash_running_jobs_are_adopted_lost_or_queued_again() {
    let mut d = Daemon::start("recovery");
    let adopted = d.submit(&["--", "sh", "-c", "sleep 1; echo done"]);
    let lost = d.submit(&["--", "sleep", "60"]);
    let marker = d.state.join("second-attempt");
    let requeued_file = job_file(
        &d.state,
        "requeue.toml",
        &format!(
            "[job]\nname = \"again\"\nrequeue = true\n[command]\nargv = [\"sh\", \"-c\", \"if [ -f {m} ]; then echo second; exit 0; fi; touch {m}; sleep 60\"]\n",
            m = marker.display()
        ),
    );
    let requeued = d.submit(&[&requeued_file]);
    for id in [&adopted, &lost, &requeued] {
        d.wait_state(id, "running");
    }
    let doomed = [
        supervisor_pid(&d, &lost, 1),
        supervisor_pid(&d, &requeued, 1),
    ];
    // Wait for the requeue job to have made its marker, so its first attempt is a real one.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !marker.exists() {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(10));
    }
    d.kill9();
    for pid in doomed {
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    d.restart();
    let s = d.wait_state(&lost, "lost");
    assert!(s["reason"].as_str().unwrap().contains("vanished"), "{s}");
    d.wait_state(&adopted, "succeeded");
    assert_eq!(stdout(&d.client(&["logs", &adopted])), "done\n");
    let s = d.wait_state(&requeued, "succeeded");
    assert_eq!(s["attempt"], 2, "{s}");
    assert_eq!(stdout(&d.client(&["logs", &requeued])), "second\n");
    let leases = d.client(&["leases", "--json"]);
    assert_eq!(stdout(&leases).trim(), "[]", "{}", d.log());
}

#[test]
fn queued_jobs_stay_queued_in_order_across_a_crash() {
    let mut d = Daemon::start("order");
    let order = d.state.join("order.log");
    let hold = d.submit(&["--gpus", "8", "--", "sleep", "60"]);
    d.wait_state(&hold, "running");
    let queued: Vec<String> = (0..4)
        .map(|i| {
            d.submit(&[
                "--gpus",
                "8",
                "--",
                "sh",
                "-c",
                &format!("echo {i} >> {}", order.display()),
            ])
        })
        .collect();
    d.kill9();
    d.restart();
    for id in &queued {
        assert_eq!(d.status(id)["state"], "queued");
    }
    assert_eq!(d.status(&hold)["state"], "running");
    assert!(d.client(&["cancel", &hold]).status.success());
    for id in &queued {
        d.wait_state(id, "succeeded");
    }
    assert_eq!(std::fs::read_to_string(&order).unwrap(), "0\n1\n2\n3\n");
}

/// Creates (once) a Unix user for the tenant tests; returns (uid, gid).
pub fn test_user(name: &str) -> (u32, u32) {
    // Tests run in parallel threads: two useradd at once race on /etc/passwd.
    static CREATING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one_at_a_time = CREATING.lock().unwrap_or_else(|e| e.into_inner());
    let id = |flag: &str| {
        Command::new("id")
            .args([flag, name])
            .output()
            .ok()
            .filter(|o| o.status.success())
            .and_then(|o| stdout(&o).trim().parse::<u32>().ok())
    };
    if id("-u").is_none() {
        let out = Command::new("useradd")
            .args(["--no-create-home", "--shell", "/bin/sh", name])
            .output()
            .expect("useradd runs");
        assert!(
            out.status.success() || id("-u").is_some(),
            "useradd {name}: {}",
            stderr(&out)
        );
    }
    (id("-u").unwrap(), id("-g").unwrap())
}

/// True when the tests run as root; with ORCH_REQUIRE_ROOT set, not being root is a failure.
pub fn root_or_skip(test: &str) -> bool {
    if unsafe { libc::geteuid() } == 0 {
        return true;
    }
    assert!(
        std::env::var_os("ORCH_REQUIRE_ROOT").is_none(),
        "{test} needs root and ORCH_REQUIRE_ROOT is set"
    );
    eprintln!("{test}: skipped (needs root to create users)");
    false
}

/// `orch ARGS` as another user, from a folder everyone may enter.
pub fn as_user(
    user: (u32, u32),
    socket: &std::path::Path,
    cwd: &std::path::Path,
    args: &[&str],
) -> std::process::Output {
    use std::os::unix::process::CommandExt;
    Command::new(env!("CARGO_BIN_EXE_orch"))
        .args(args)
        .current_dir(cwd)
        .env("ORCH_SERVER", socket)
        .env_remove("ORCH_STATE_DIR")
        .uid(user.0)
        .gid(user.1)
        .output()
        .unwrap()
}

pub fn world_dir(path: &std::path::Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(path).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o1777)).unwrap();
}

/// A daemon as root with two tenants, `vision` (orchtesta) and `nlp` (orchtestb), on a socket in
/// a folder everyone may enter; `prepare` runs before it starts (a mount on its state folder).
pub fn two_tenants(tag: &str, prepare: impl FnOnce(&Daemon)) -> (Daemon, std::path::PathBuf) {
    let mut d = Daemon::prepare(tag);
    prepare(&d);
    let public = std::env::temp_dir().join(format!("orch-{tag}-public-{}", std::process::id()));
    world_dir(&public);
    let config = public.join("serve.toml");
    std::fs::write(
        &config,
        "admins = [\"root\"]\n[[tenant]]\nname = \"vision\"\nusers = [\"orchtesta\"]\n[[tenant]]\nname = \"nlp\"\nusers = [\"orchtestb\"]\n",
    )
    .unwrap();
    d.config = Some(config);
    d.socket = Some(public.join("orch.sock"));
    d.restart();
    (d, public)
}

#[test]
fn as_root_each_job_runs_as_its_user_and_tenants_see_only_their_own() {
    if !root_or_skip("as_root_each_job_runs_as_its_user") {
        return;
    }
    let alice = test_user("orchtesta");
    let bob = test_user("orchtestb");
    let (d, public) = two_tenants("tenants", |_| {});
    let socket = d.socket();

    let out = as_user(
        alice,
        &socket,
        &public,
        &["submit", "--", "sh", "-c", "id -u; id -g; pwd"],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let id = stdout(&out).trim().to_string();
    let out = as_user(alice, &socket, &public, &["wait", &id]);
    assert!(out.status.success(), "{}", stderr(&out));
    let logs = stdout(&as_user(alice, &socket, &public, &["logs", &id]));
    assert_eq!(
        logs,
        format!("{}\n{}\n{}\n", alice.0, alice.1, public.display())
    );
    assert_eq!(d.status(&id)["tenant"], "vision");

    // Bob cannot see, cancel or read Alice's job: to him it does not exist.
    for args in [vec!["status", &id], vec!["cancel", &id], vec!["logs", &id]] {
        let out = as_user(bob, &socket, &public, &args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(
            stderr(&out).contains(&format!("no job {id}")),
            "{}",
            stderr(&out)
        );
    }
    let listed = stdout(&as_user(
        bob,
        &socket,
        &public,
        &["jobs", "--all", "--json"],
    ));
    assert_eq!(listed.trim(), "[]");
    // A running job of Alice's cannot be cancelled by Bob either.
    let out = as_user(alice, &socket, &public, &["submit", "--", "sleep", "30"]);
    let running = stdout(&out).trim().to_string();
    d.wait_state(&running, "running");
    let out = as_user(bob, &socket, &public, &["cancel", &running]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(d.status(&running)["state"], "running");
    // The admin (root) sees and cancels it.
    assert!(d.client(&["cancel", &running]).status.success());
    d.wait_state(&running, "cancelled");
}

#[test]
fn a_daemon_that_is_not_root_serves_its_own_user_alone() {
    if !root_or_skip("a_daemon_that_is_not_root_serves_its_own_user_alone") {
        return;
    }
    let alice = test_user("orchtesta");
    let bob = test_user("orchtestb");
    let mut d = Daemon::prepare("nonroot");
    let public = std::env::temp_dir().join(format!("orch-nonroot-public-{}", std::process::id()));
    world_dir(&public);
    std::os::unix::fs::chown(&d.state, Some(alice.0), Some(alice.1)).unwrap();
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(d.state.join("daemon.log"))
        .unwrap();
    std::os::unix::fs::chown(d.state.join("daemon.log"), Some(alice.0), Some(alice.1)).unwrap();
    d.socket = Some(public.join("alice.sock"));
    d.run_as = Some(alice);
    d.restart();
    let socket = d.socket();
    let out = as_user(bob, &socket, &public, &["submit", "--", "true"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("serves that user alone"),
        "{}",
        stderr(&out)
    );
    let out = as_user(alice, &socket, &public, &["submit", "--", "id", "-u"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let id = stdout(&out).trim().to_string();
    assert!(
        as_user(alice, &socket, &public, &["wait", &id])
            .status
            .success()
    );
    let logs = stdout(&as_user(alice, &socket, &public, &["logs", &id]));
    assert_eq!(logs.trim(), alice.0.to_string());
}

#[test]
fn a_train_job_runs_through_the_daemon_on_its_leased_devices() {
    let d = Daemon::start("train");
    let digits = root().join("examples/digits/data/digits.csv.gz");
    let work = d.state.join("work");
    std::fs::create_dir_all(&work).unwrap();
    let file = job_file(
        &work,
        "train.toml",
        &format!(
            "[job]\nname = \"digits\"\n[resources]\ngpus = 2\nmemory_limit = \"256MiB\"\n[train]\nplugin = \"mlp\"\nepochs = 1\nbatch_size = 64\nseed = 5\n[train.config]\nhidden = \"32\"\nlr = 0.1\n[train.data]\nformat = \"csv\"\ntrain = \"{d}\"\ntest = \"{d}\"\nscale = 16\n",
            d = digits.display()
        ),
    );
    let id = d.submit(&[&file]);
    let out = d.client(&["wait", &id]);
    assert!(
        out.status.success(),
        "{}\n{}",
        stderr(&out),
        stdout(&d.client(&["logs", "--stderr", &id]))
    );
    let logs = stdout(&d.client(&["logs", &id]));
    assert!(
        logs.contains("2 replica(s) on sim:") && logs.contains("test accuracy"),
        "{logs}"
    );
    let s = d.status(&id);
    assert_eq!(s["devices"].as_array().unwrap().len(), 2, "{s}");
    assert!(work.join("runs/digits/metrics.jsonl").is_file());
    d.wait_no_leases();
}

#[test]
fn orch_run_inside_a_daemon_job_uses_the_jobs_own_devices() {
    let d = Daemon::start("nested");
    let sim = lab_sim();
    let orch_bin = env!("CARGO_BIN_EXE_orch");
    // The job holds 2 of the 8 devices and runs `orch run` twice inside them, one device each,
    // at the same time: each inner run gets one of the job's devices, never another's.
    let script = format!(
        "for i in 1 2; do ORCH_DEVICES={sim} {orch_bin} run --wait --timeout 30s -- sh -c 'echo $CUDA_VISIBLE_DEVICES; sleep 0.3' & done; wait"
    );
    let id = d.submit(&["--gpus", "2", "--", "sh", "-c", &script]);
    let out = d.client(&["wait", &id]);
    assert!(
        out.status.success(),
        "{}",
        stdout(&d.client(&["logs", "--stderr", &id]))
    );
    let s = d.status(&id);
    let outer: BTreeSet<String> = s["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    let inner: BTreeSet<String> = stdout(&d.client(&["logs", &id]))
        .lines()
        .map(str::to_string)
        .collect();
    assert_eq!(
        inner, outer,
        "the two inner runs took the job's two devices"
    );
}

#[test]
fn the_daemon_refuses_a_memory_limit_it_cannot_enforce() {
    let d = Daemon::start("enforce");
    let file = job_file(
        &d.state,
        "enforce.toml",
        "[job]\nname = \"e\"\n[resources]\nmemory_limit = \"8GiB\"\nenforce_memory_limit = true\n[command]\nargv = [\"true\"]\n",
    );
    let out = d.client(&["submit", &file]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("enforce_memory_limit"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn finished_jobs_and_their_logs_go_after_the_retention() {
    let mut d = Daemon::with_lab_tenant("retention", "retention = \"4s\"");
    d.restart();
    let id = d.submit(&["--", "echo", "hello"]);
    d.wait_state(&id, "succeeded");
    assert_eq!(stdout(&d.client(&["logs", &id])), "hello\n");
    let folder = d.state.join("jobs").join(format!("{id}-1"));
    assert!(folder.is_dir());
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let out = d.client(&["status", &id]);
        if out.status.code() == Some(2) {
            assert!(stderr(&out).contains("no job"), "{}", stderr(&out));
            break;
        }
        assert!(Instant::now() < deadline, "job {id} was never purged");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(!folder.exists(), "its folder and logs went with it");
}

#[test]
fn a_tenants_max_gpus_and_max_queued_hold() {
    let mut d = Daemon::prepare("limits");
    let me = stdout(&Command::new("id").arg("-un").output().unwrap())
        .trim()
        .to_string();
    let config = d.state.join("serve.toml");
    std::fs::write(
        &config,
        format!("[[tenant]]\nname = \"lab\"\nusers = [\"{me}\"]\nmax_gpus = 2\nmax_queued = 2\n"),
    )
    .unwrap();
    d.config = Some(config);
    d.restart();
    let big = d.submit(&["--gpus", "2", "--", "sleep", "30"]);
    d.wait_state(&big, "running");
    let one = d.submit(&["--", "true"]);
    let two = d.submit(&["--", "true"]);
    // The scheduler says why it holds the job back once it has looked at it.
    let deadline = Instant::now() + Duration::from_secs(30);
    let s = loop {
        let s = d.status(&one);
        if !s["reason"].is_null() || Instant::now() > deadline {
            break s;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(
        s["state"], "queued",
        "six devices are free, but the tenant holds its two"
    );
    assert!(
        s["reason"].as_str().unwrap().contains("max_gpus = 2"),
        "{s}"
    );
    let out = d.client(&["submit", "--", "true"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("max_queued = 2"), "{}", stderr(&out));
    assert!(d.client(&["cancel", &big]).status.success());
    d.wait_state(&one, "succeeded");
    d.wait_state(&two, "succeeded");
}

#[test]
fn a_clients_orch_job_id_gets_it_nothing_from_another_jobs_lease() {
    let d = Daemon::start("inside");
    let file = |name: &str, argv: &str| {
        job_file(
            &d.state,
            name,
            &format!(
                "[job]\nname = \"{name}\"\n[policy]\nplugin = \"explicit\"\n[policy.config]\ndevices = \"0\"\n[command]\nargv = {argv}\n"
            ),
        )
    };
    let holder = d.submit(&[&file("holder.toml", "[\"sleep\", \"30\"]")]);
    let lease = d.wait_state(&holder, "running")["lease_id"]
        .as_str()
        .unwrap()
        .to_string();
    // A submission whose environment names the running job's lease, as a job's own `orch submit`
    // would, or someone who read the id: it must wait for device 0 like anyone else.
    let out = Command::new(env!("CARGO_BIN_EXE_orch"))
        .args(["submit", &file("intruder.toml", "[\"true\"]")])
        .env("ORCH_SERVER", d.socket())
        .env("ORCH_JOB_ID", &lease)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let intruder = stdout(&out).trim().to_string();
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        d.status(&intruder)["state"],
        "queued",
        "it got device 0 through the holder's lease"
    );
    assert!(d.client(&["cancel", &holder]).status.success());
    d.wait_state(&intruder, "succeeded");
}

#[test]
fn a_variable_that_is_not_utf8_is_left_out_not_a_crash() {
    use std::os::unix::ffi::OsStrExt;
    let d = Daemon::start("utf8");
    let out = Command::new(env!("CARGO_BIN_EXE_orch"))
        .args(["submit", "--", "sh", "-c", "echo ${ORCH_TEST_ODD-absent}"])
        .env("ORCH_SERVER", d.socket())
        .env("ORCH_TEST_ODD", std::ffi::OsStr::from_bytes(b"caf\xe9"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("ORCH_TEST_ODD is not UTF-8"),
        "{}",
        stderr(&out)
    );
    let id = stdout(&out).trim().to_string();
    d.wait_state(&id, "succeeded");
    assert_eq!(stdout(&d.client(&["logs", &id])), "absent\n");
}

#[test]
fn a_file_policy_travels_with_the_submission_and_the_daemon_opens_no_user_path() {
    let d = Daemon::start("policy-file");
    let explicit = std::path::Path::new(orch_host::PLUGIN_WASM_DIR).join("explicit.wasm");
    let local = d.state.join("my-policy.wasm");
    std::fs::copy(&explicit, &local).unwrap();
    let file = job_file(
        &d.state,
        "mine.toml",
        "[job]\nname = \"mine\"\n[policy]\nplugin = \"my-policy.wasm\"\n[policy.config]\ndevices = \"3\"\n[command]\nargv = [\"sh\", \"-c\", \"echo $CUDA_VISIBLE_DEVICES\"]\n",
    );
    let id = d.submit(&[&file]);
    // The user's file may change or go: the daemon runs the copy it was sent.
    std::fs::remove_file(&local).unwrap();
    d.wait_state(&id, "succeeded");
    let device3 = d.status(&id)["devices"][0].as_str().unwrap().to_string();
    assert_eq!(stdout(&d.client(&["logs", &id])).trim(), device3);
    let devices = stdout(&d.client(&["devices", "--json"]));
    let listed: serde_json::Value = serde_json::from_str(&devices).unwrap();
    assert_eq!(
        listed[3]["uuid"],
        device3.as_str(),
        "the policy chose device 3"
    );

    // Something that is no file is refused by the client, which reads the policy.
    let zero = job_file(
        &d.state,
        "zero.toml",
        "[job]\nname = \"z\"\n[policy]\nplugin = \"/dev/zero\"\n[command]\nargv = [\"true\"]\n",
    );
    let out = d.client(&["submit", &zero]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("not a regular file"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_submission_naming_a_policy_path_without_its_bytes_is_refused() {
    use std::io::{Read, Write};
    let d = Daemon::start("policy-raw");
    let body = serde_json::json!({
        "job_text": "[job]\nname = \"x\"\n[policy]\nplugin = \"/root/secret.wasm\"\n[command]\nargv = [\"true\"]\n",
        "job_path": "/tmp/x.toml", "cwd": "/tmp", "env": []
    })
    .to_string();
    let mut s = std::os::unix::net::UnixStream::connect(d.socket()).unwrap();
    write!(
        s,
        "POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert!(answer.contains("came without its bytes"), "{answer}");
}
