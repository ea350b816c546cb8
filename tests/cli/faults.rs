//! The daemon under faults and hostile input, with real processes: a flood of idle connections
//! against a low open-file limit, a state folder that fills up or turns read-only while jobs
//! run, a huge body sent without a token. In every case the running job ends with its true
//! status, no device is handed to a second job while the first holds it, and the daemon is back
//! on its feet with no restart.

use crate::serve::{Daemon, job_file, root_or_skip, test_user};
use crate::*;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A Python program that opens `count` connections to the Unix socket `socket` (or TCP
/// `host:port`), holds them `seconds`, and prints how many it opened.
const FLOOD: &str = r#"
import resource, socket, sys, time
target, count, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, count + 64), hard))
held = []
deadline = time.time() + seconds
for _ in range(count):
    try:
        if target.startswith("/"):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(2)
            s.connect(target)
        else:
            host, port = target.rsplit(":", 1)
            s = socket.create_connection((host, int(port)), timeout=2)
        held.append(s)
    except OSError:
        pass
print(f"opened {len(held)}", flush=True)
time.sleep(max(0.0, deadline - time.time()))
"#;

fn flood(
    target: &str,
    count: usize,
    seconds: f64,
    user: Option<(u32, u32)>,
) -> std::process::Child {
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new("python3");
    cmd.args([
        "-c",
        FLOOD,
        target,
        &count.to_string(),
        &seconds.to_string(),
    ])
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    if let Some((uid, gid)) = user {
        cmd.uid(uid).gid(gid);
    }
    cmd.spawn().expect("python3 runs")
}

fn ms(v: &serde_json::Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a time: {v}"))
}

/// The time a job's status gives in `key`, in milliseconds.
fn at(status: &serde_json::Value, key: &str) -> u64 {
    ms(&status[key])
}

#[test]
fn a_thousand_idle_connections_neither_lose_a_job_nor_free_its_devices() {
    if !root_or_skip("a_thousand_idle_connections") {
        return;
    }
    let flooder = test_user("orchflood");
    let mut d = Daemon::prepare("flood");
    let port = free_port();
    let config = d.state.join("serve.toml");
    std::fs::write(
        &config,
        format!("listen = \"127.0.0.1:{port}\"\n[[tenant]]\nname = \"lab\"\nusers = [\"root\"]\n"),
    )
    .unwrap();
    d.config = Some(config);
    // As systemd starts a service: 1,024 open files, and here no more to raise it to.
    d.nofile = Some(1024);
    // A socket the flooding user can reach.
    let world = std::env::temp_dir().join(format!("orch-flood-{}", std::process::id()));
    crate::serve::world_dir(&world);
    d.socket = Some(world.join("orch.sock"));
    d.restart();
    let socket = d.socket();
    let first = d.submit(&["--gpus", "8", "--", "sleep", "12"]);
    d.wait_state(&first, "running");
    let mut floods = [
        flood(&socket.display().to_string(), 1100, 10.0, Some(flooder)),
        flood(&format!("127.0.0.1:{port}"), 1100, 10.0, None),
    ];
    std::thread::sleep(Duration::from_secs(2));
    let second = d.submit(&["--gpus", "8", "--", "true"]);
    // Other clients are answered meanwhile.
    let started = Instant::now();
    let jobs = d.client(&["jobs"]);
    assert!(jobs.status.success(), "{}", stderr(&jobs));
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "orch jobs took {:?} during the flood",
        started.elapsed()
    );
    assert_eq!(d.status(&first)["state"], "running");
    assert_eq!(d.status(&second)["state"], "queued");
    for f in &mut floods {
        let out = f.wait().unwrap();
        assert!(out.success());
    }
    let first_status = d.wait_state(&first, "succeeded");
    let second_status = d.wait_state(&second, "succeeded");
    assert!(
        at(&second_status, "started_at_ms") >= at(&first_status, "ended_at_ms"),
        "the second job started on the first's devices while it ran: {first_status} {second_status}"
    );
    let log = d.log();
    assert!(!log.contains("lost"), "{log}");
    assert!(log.contains("connection refused"), "{log}");
    assert!(log.contains("open-file limit 1024"), "{log}");
}

/// Mounts a tmpfs of `size` on `dir` (root only); unmounted on drop.
struct Tmpfs(std::path::PathBuf);

impl Tmpfs {
    fn mount(dir: &std::path::Path, options: &str) -> Tmpfs {
        std::fs::create_dir_all(dir).unwrap();
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", options, "tmpfs"])
            .arg(dir)
            .output()
            .unwrap();
        assert!(out.status.success(), "mount: {}", stderr(&out));
        Tmpfs(dir.to_path_buf())
    }

    fn unmount(&self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).output();
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        self.unmount();
    }
}

/// Fills the file system of `dir` to the last byte; returns the filler's path.
fn fill(dir: &std::path::Path) -> std::path::PathBuf {
    use std::io::Write;
    let path = dir.join("filler");
    let mut file = std::fs::File::create(&path).unwrap();
    let block = vec![0u8; 4096];
    while file.write_all(&block).is_ok() {}
    while file.write_all(&[0]).is_ok() {}
    let _ = file.sync_all();
    path
}

#[test]
fn a_full_state_folder_delays_records_and_loses_nothing() {
    if !root_or_skip("a_full_state_folder") {
        return;
    }
    let mut d = Daemon::prepare("full");
    let fs = Tmpfs::mount(&d.state, "size=3m");
    d.restart();
    let outside = std::env::temp_dir().join(format!("orch-full-{}", std::process::id()));
    std::fs::create_dir_all(&outside).unwrap();
    // It writes nothing while the disk is full (a write of its own would fail, as it should),
    // and it ends once the folder is full (when `go`, outside the folder, appears).
    let go = outside.join("go");
    let script = format!(
        "echo started; i=0; while [ ! -e {} ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done",
        go.display()
    );
    let running = d.submit(&["--gpus", "8", "--", "sh", "-c", &script]);
    d.wait_state(&running, "running");
    let out = d
        .state
        .join("jobs")
        .join(format!("{running}-1"))
        .join("stdout");
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::fs::read_to_string(&out).unwrap_or_default() != "started\n" {
        assert!(
            Instant::now() < deadline,
            "the job never started: {}",
            d.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let queued = d.submit(&["--gpus", "8", "--", "true"]);
    let filler = fill(&d.state);
    let filled = Instant::now();
    std::fs::write(&go, "").unwrap();
    // While it is full: the running job finishes but cannot be recorded; it stays running and
    // its devices stay held; a submission is refused with the sentence, or taken in full.
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(d.status(&running)["state"], "running", "{}", d.log());
    assert_eq!(d.status(&queued)["state"], "queued");
    let out = d.client(&["submit", "--gpus", "1", "--", "true"]);
    let refused = stderr(&out);
    let accepted_later = if out.status.success() {
        Some(stdout(&out).trim().to_string())
    } else {
        assert!(refused.contains("is full"), "{refused}");
        None
    };
    std::thread::sleep(Duration::from_secs(5).saturating_sub(filled.elapsed()));
    std::fs::remove_file(&filler).unwrap();
    let freed = Instant::now();
    let s = d.wait_state(&running, "succeeded");
    assert!(
        s["reason"]
            .as_str()
            .unwrap_or("")
            .contains("exit record written late"),
        "{s}"
    );
    // Its end is when it ended, not when the record could be written.
    assert!(
        at(&s, "ended_at_ms") < at(&s, "started_at_ms") + 4_000,
        "{s}"
    );
    let q = d.wait_state(&queued, "succeeded");
    assert!(at(&q, "started_at_ms") >= at(&s, "ended_at_ms"));
    if let Some(id) = accepted_later {
        d.wait_state(&id, "succeeded");
    }
    assert!(freed.elapsed() < Duration::from_secs(30));
    assert_eq!(stdout(&d.client(&["logs", &running])), "started\n");
    let log = d.log();
    assert!(log.contains("is full"), "{log}");
    assert!(log.contains("takes writes again"), "{log}");
    assert!(!log.contains("lost"), "{log}");
    d.kill9();
    drop(fs);
}

#[test]
fn a_read_only_job_folder_refuses_submissions_and_keeps_what_was_accepted() {
    if !root_or_skip("a_read_only_job_folder") {
        return;
    }
    let d = Daemon::start("readonly");
    let jobs = d.state.join("jobs");
    std::fs::create_dir_all(&jobs).unwrap();
    // A read-only file system over the job folders, while the database still takes writes.
    let ro = Tmpfs::mount(&jobs, "ro,size=1m");
    let accepted = d.submit(&["--gpus", "1", "--", "echo", "kept"]);
    // It cannot start (its folder cannot be made): it stays queued, saying why.
    let deadline = Instant::now() + Duration::from_secs(20);
    let refused = loop {
        let out = d.client(&["submit", "--gpus", "1", "--", "true"]);
        if !out.status.success() {
            break stderr(&out);
        }
        assert!(
            Instant::now() < deadline,
            "submissions never refused: {}",
            d.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(refused.contains("read-only"), "{refused}");
    let s = d.status(&accepted);
    assert_eq!(s["state"], "queued", "{s}");
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(d.status(&accepted)["state"], "queued", "{}", d.log());
    ro.unmount();
    let s = d.wait_state(&accepted, "succeeded");
    assert_eq!(stdout(&d.client(&["logs", &accepted])), "kept\n", "{s}");
    // Every job the daemon took ends, and none twice or lost.
    let all: serde_json::Value =
        serde_json::from_slice(&d.client(&["jobs", "--all", "--json"]).stdout).unwrap();
    for job in all.as_array().unwrap() {
        let id = job["id"].as_str().unwrap().to_string();
        let s = d.wait_state(&id, "succeeded");
        assert_eq!(s["attempt"], 1, "{s}");
    }
    let log = d.log();
    assert!(log.contains("read-only"), "{log}");
    assert!(log.contains("takes writes again"), "{log}");
}

#[test]
fn a_huge_body_without_a_token_is_refused_before_it_is_read() {
    let mut d = Daemon::prepare("bigbody");
    let port = free_port();
    let config = d.state.join("serve.toml");
    std::fs::write(
        &config,
        format!(
            "listen = \"127.0.0.1:{port}\"\n[[tenant]]\nname = \"lab\"\nusers = [\"{}\"]\n",
            me()
        ),
    )
    .unwrap();
    d.config = Some(config);
    d.restart();
    let pid = d.child.as_ref().unwrap().id();
    let rss = || {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
        line.split_whitespace()
            .nth(1)
            .unwrap()
            .parse::<u64>()
            .unwrap()
            * 1024
    };
    // One small request first, so that the runtime's threads exist before the measurement.
    let _ = post(port, 16, true);
    let before = rss();
    let answers: Vec<String> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..32)
            .map(|i| scope.spawn(move || post(port, 15 << 20, i % 2 == 0)))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let after = rss();
    println!(
        "32 bodies of 15 MB without a token: daemon RSS {:.1} MiB before, {:.1} MiB after",
        before as f64 / (1 << 20) as f64,
        after as f64 / (1 << 20) as f64
    );
    for answer in &answers {
        assert!(
            answer.is_empty() || answer.starts_with("HTTP/1.1 401"),
            "{answer}"
        );
    }
    assert!(
        answers.iter().any(|a| a.starts_with("HTTP/1.1 401")),
        "no answer was read: {answers:?}"
    );
    assert!(
        after < before + (10 << 20),
        "the daemon grew from {before} to {after} bytes"
    );
}

/// POSTs a body of `size` bytes to `/v1/jobs` with no token (with a Content-Length, or chunked);
/// returns the answer's head, or nothing when the daemon closed before one could be read.
fn post(port: u16, size: usize, with_length: bool) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let head = if with_length {
        format!(
            "POST /v1/jobs HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: {size}\r\n\r\n"
        )
    } else {
        "POST /v1/jobs HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n".to_string()
    };
    let _ = stream.write_all(head.as_bytes());
    let chunk = vec![b'x'; 1 << 16];
    let mut sent = 0;
    while sent < size {
        let n = chunk.len().min(size - sent);
        let ok = if with_length {
            stream.write_all(&chunk[..n])
        } else {
            stream
                .write_all(format!("{n:x}\r\n").as_bytes())
                .and_then(|_| stream.write_all(&chunk[..n]))
                .and_then(|_| stream.write_all(b"\r\n"))
        };
        if ok.is_err() {
            break;
        }
        sent += n;
    }
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    let text = String::from_utf8_lossy(&answer).into_owned();
    text.lines().next().unwrap_or("").to_string()
}

#[test]
fn a_job_killed_with_its_supervisor_says_so() {
    let d = Daemon::start("killed-supervisor");
    let file = job_file(
        &d.state,
        "long.toml",
        "[job]\nname = \"long\"\n[command]\nargv = [\"sleep\", \"60\"]\n",
    );
    let id = d.submit(&[&file]);
    d.wait_state(&id, "running");
    let pid = crate::serve::supervisor_pid(&d, &id, 1);
    unsafe { libc::kill(pid, libc::SIGKILL) };
    let s = d.wait_state(&id, "lost");
    let reason = s["reason"].as_str().unwrap();
    assert!(
        reason.contains(&format!(
            "its supervisor (pid {pid}) was killed by signal 9"
        )),
        "{s}"
    );
    let leases = d.client(&["leases", "--json"]);
    assert_eq!(stdout(&leases).trim(), "[]", "{}", d.log());
}

/// Seconds the soak runs: `ORCH_SOAK_S` (`.ci/run` sets 180), else 30.
fn soak_seconds() -> u64 {
    std::env::var("ORCH_SOAK_S")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(30)
}

/// A steady submit load while the daemon is `kill -9`ed and restarted, supervisors are killed,
/// connections flood in and the state folder fills up for short spells. At the end every job the
/// daemon accepted ended exactly once, with its true status; no two jobs overlapped on a device;
/// only jobs whose supervisor was killed are lost.
#[test]
fn a_soak_of_kills_floods_and_full_disks_loses_and_doubles_nothing() {
    if !root_or_skip("a_soak_of_kills_floods_and_full_disks") {
        return;
    }
    use std::collections::{BTreeMap, BTreeSet};
    let seconds = soak_seconds();
    let flooder = test_user("orchflood");
    let mut d = Daemon::prepare("soak");
    // Room for the database and the folders of the ~500 jobs a 3-minute soak accepts (each with
    // its spec, fence, logs, exit record and usage record: ~24 KiB on tmpfs), beside the spells
    // in which the test fills it to the last byte.
    let fs = Tmpfs::mount(&d.state, "size=48m");
    let world = std::env::temp_dir().join(format!("orch-soak-{}", std::process::id()));
    crate::serve::world_dir(&world);
    d.socket = Some(world.join("orch.sock"));
    d.restart();
    let runs = world.join("runs.log");
    let _ = std::fs::remove_file(&runs);
    // Job `token` records its start and end with its devices, outside the state folder; odd
    // tokens exit 3 (failed), even ones 0.
    let command = |token: u64| {
        format!(
            "echo \"$(date +%s%3N) start {token} $CUDA_VISIBLE_DEVICES\" >> {log}; sleep 0.{pause}; echo \"$(date +%s%3N) end {token}\" >> {log}; exit {code}",
            log = runs.display(),
            pause = 2 + token % 5,
            code = if token % 2 == 1 { 3 } else { 0 },
        )
    };
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let d = std::sync::Mutex::new(d);
    let mut tokens: BTreeMap<String, u64> = BTreeMap::new();
    let mut killed: BTreeSet<String> = BTreeSet::new();
    let (mut kills, mut supervisor_kills, mut floods, mut spells, mut refused) = (0, 0, 0, 0, 0);
    std::thread::scope(|scope| {
        let submitter = scope.spawn(|| {
            let mut accepted = BTreeMap::new();
            let mut refused = 0;
            let mut token = 0u64;
            while Instant::now() < deadline {
                token += 1;
                let gpus = (1 + token % 4).to_string();
                let client = {
                    let d = d.lock().unwrap();
                    (d.socket(), d.state.clone())
                };
                let out = orch(
                    &["submit", "--gpus", &gpus, "--", "sh", "-c", &command(token)],
                    &[
                        ("ORCH_SERVER", &client.0.display().to_string()),
                        ("ORCH_STATE_DIR", &client.1.display().to_string()),
                        ("ORCH_DEVICES", &lab_sim()),
                    ],
                );
                if out.status.success() {
                    accepted.insert(stdout(&out).trim().to_string(), token);
                } else {
                    refused += 1;
                }
                std::thread::sleep(Duration::from_millis(300));
            }
            (accepted, refused)
        });
        let mut round = 0u64;
        while Instant::now() + Duration::from_secs(3) < deadline {
            std::thread::sleep(Duration::from_millis(1500 + (round * 7919) % 2500));
            round += 1;
            match round % 4 {
                0 => {
                    let mut d = d.lock().unwrap();
                    d.kill9();
                    d.restart();
                    kills += 1;
                }
                1 => {
                    let d = d.lock().unwrap();
                    let jobs: serde_json::Value =
                        serde_json::from_slice(&d.client(&["jobs", "--json"]).stdout)
                            .unwrap_or_default();
                    let running = jobs.as_array().into_iter().flatten().find(|j| {
                        j["state"] == "running" && !killed.contains(j["id"].as_str().unwrap_or(""))
                    });
                    if let Some(job) = running {
                        let id = job["id"].as_str().unwrap().to_string();
                        let fence = d.state.join("jobs").join(format!("{id}-1")).join("started");
                        if let Ok(text) = std::fs::read_to_string(&fence)
                            && let Ok(v) = serde_json::from_str::<serde_json::Value>(&text)
                            && let Some(pid) = v["supervisor"]["pid"].as_i64()
                        {
                            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
                            killed.insert(id);
                            supervisor_kills += 1;
                        }
                    }
                }
                2 => {
                    let socket = d.lock().unwrap().socket();
                    let mut f = flood(&socket.display().to_string(), 600, 2.0, Some(flooder));
                    let _ = f.wait();
                    floods += 1;
                }
                _ => {
                    let state = d.lock().unwrap().state.clone();
                    let filler = fill(&state);
                    std::thread::sleep(Duration::from_millis(1500));
                    std::fs::remove_file(&filler).unwrap();
                    spells += 1;
                }
            }
        }
        let (accepted, r) = submitter.join().unwrap();
        tokens = accepted;
        refused = r;
    });
    let d = d.into_inner().unwrap();
    // Everything accepted ends.
    let settle = Instant::now() + Duration::from_secs(90);
    let finals = ["succeeded", "failed", "lost", "cancelled"];
    let all = loop {
        let out = d.client(&["jobs", "--all", "--json"]);
        let jobs: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        let jobs = jobs.as_array().cloned().unwrap_or_default();
        if !jobs.is_empty()
            && jobs
                .iter()
                .all(|j| finals.contains(&j["state"].as_str().unwrap_or("")))
        {
            break jobs;
        }
        if Instant::now() >= settle {
            let open: Vec<String> = jobs
                .iter()
                .filter(|j| !finals.contains(&j["state"].as_str().unwrap_or("")))
                .map(|j| j.to_string())
                .collect();
            panic!("jobs never all ended: {open:?}\n{}", d.log());
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let log = std::fs::read_to_string(&runs).unwrap_or_default();
    let mut starts: BTreeMap<u64, (u64, Vec<String>)> = BTreeMap::new();
    let mut ends: BTreeMap<u64, u64> = BTreeMap::new();
    let mut doubled = 0;
    for line in log.lines() {
        let parts: Vec<&str> = line.split_whitespace().collect();
        let (Some(at), Some(kind), Some(token)) = (
            parts.first().and_then(|v| v.parse::<u64>().ok()),
            parts.get(1),
            parts.get(2).and_then(|v| v.parse::<u64>().ok()),
        ) else {
            continue;
        };
        if *kind == "start" {
            let devices = parts
                .get(3)
                .map_or(Vec::new(), |v| v.split(',').map(String::from).collect());
            if starts.insert(token, (at, devices)).is_some() {
                doubled += 1;
            }
        } else {
            ends.insert(token, at);
        }
    }
    assert_eq!(doubled, 0, "a job ran twice: {log}");
    let mut lost = 0;
    let mut intervals: BTreeMap<String, Vec<(u64, u64, u64)>> = BTreeMap::new();
    for job in &all {
        let id = job["id"].as_str().unwrap().to_string();
        let state = job["state"].as_str().unwrap();
        // Jobs the submitter never heard of (an answer lost to a kill) still have a token.
        let token = tokens.get(&id).copied();
        match state {
            "lost" => {
                lost += 1;
                let supervisor_log = std::fs::read_to_string(
                    d.state
                        .join("jobs")
                        .join(format!("{id}-1"))
                        .join("supervisor.log"),
                )
                .unwrap_or_default();
                assert!(
                    killed.contains(&id),
                    "job {id} lost, yet its supervisor was not killed: {job}\nits supervisor.log: {supervisor_log}"
                );
            }
            "succeeded" | "failed" => {
                if let Some(token) = token {
                    let want = if token % 2 == 1 {
                        "failed"
                    } else {
                        "succeeded"
                    };
                    assert_eq!(
                        state, want,
                        "job {id} (token {token}) ended with the wrong status: {job}"
                    );
                    assert!(
                        ends.contains_key(&token),
                        "job {id} ended {state} without running to its end: {job}"
                    );
                }
            }
            other => panic!("job {id} ended {other}: {job}"),
        }
        if let Some(token) = token
            && let Some((start, devices)) = starts.get(&token)
        {
            let end = ends
                .get(&token)
                .copied()
                .unwrap_or_else(|| job["ended_at_ms"].as_u64().unwrap_or(u64::MAX));
            for device in devices {
                intervals
                    .entry(device.clone())
                    .or_default()
                    .push((*start, end, token));
            }
        }
    }
    let mut overlaps = 0;
    for list in intervals.values_mut() {
        list.sort();
        for pair in list.windows(2) {
            if pair[1].0 < pair[0].1 {
                overlaps += 1;
                eprintln!(
                    "overlap: token {} [{}, {}] and token {} [{}, {}]",
                    pair[0].2, pair[0].0, pair[0].1, pair[1].2, pair[1].0, pair[1].1
                );
            }
        }
    }
    println!(
        "soak {seconds}s: jobs {}, refused submissions {refused}, daemon kills {kills}, supervisor kills {supervisor_kills}, floods {floods}, disk-full spells {spells}, overlaps {overlaps}, lost {lost}",
        all.len()
    );
    assert_eq!(overlaps, 0);
    assert!(all.len() >= tokens.len());
    drop(d);
    drop(fs);
}
