//! Accounting at scale: a daemon whose database holds 100,000 finished jobs with their
//! accounting records (put there by this bench, not run), 10,000 of which ended in the last day.
//! Goals in brackets:
//! - `orch history --since 1d --json`, the command as a user runs it, 10,000 jobs [≤ 300 ms];
//! - `orch jobs` [≤ 50 ms];
//! - submit to the job's first instruction with that history in place [unchanged, about 17 ms];
//! - the daemon's RSS and the state folder's size;
//! - a purge of 90,000 of those jobs (`retention` shortened) and the background vacuum after it:
//!   how long the vacuum took, what it gave back, and submit-to-start while it runs.
//!
//! `cargo bench -p orch-cli --bench history` (release).

mod common;

use common::http;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const JOBS: usize = 100_000;
const RECENT: usize = 10_000;
const DAY_MS: i64 = 86_400_000;

fn me() -> String {
    let out = Command::new("id").arg("-un").output().unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

struct Daemon {
    child: Child,
    socket: PathBuf,
}

impl Daemon {
    fn start(state: &Path, sim: &Path, retention: &str) -> Daemon {
        let config = state.join("serve.toml");
        let me = me();
        std::fs::write(
            &config,
            format!(
                "admins = [\"{me}\"]\nretention = \"{retention}\"\n[[tenant]]\nname = \"lab\"\nusers = [\"{me}\"]\n"
            ),
        )
        .unwrap();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(state.join("daemon.log"))
            .unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_orch"))
            .arg("serve")
            .arg("--config")
            .arg(&config)
            .env("ORCH_STATE_DIR", state)
            .env("ORCH_DEVICES", format!("sim:{}", sim.display()))
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let socket = state.join("orch.sock");
        let deadline = Instant::now() + Duration::from_secs(120);
        while UnixStream::connect(&socket).is_err() {
            assert!(Instant::now() < deadline, "the daemon did not start");
            std::thread::sleep(Duration::from_millis(10));
        }
        Daemon { child, socket }
    }

    fn rss_mib(&self) -> f64 {
        common::rss_mib(self.child.id())
    }

    fn stop(mut self) {
        // SIGTERM: a clean stop, its write-ahead log folded into jobs.sqlite3.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// Bytes of every file under `dir`.
fn size_of(dir: &Path) -> u64 {
    let mut total = 0;
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let Ok(meta) = entry.metadata() else { continue };
        if meta.is_dir() {
            total += size_of(&entry.path());
        } else {
            total += meta.len();
        }
    }
    total
}

/// 100,000 finished jobs and their accounting records, straight into the database (as a
/// long-lived daemon would have them): `RECENT` ended in the last day, the rest over 300 days.
fn fill(dir: &Path) {
    let conn = rusqlite::Connection::open(dir.join("jobs.sqlite3")).unwrap();
    let submission = serde_json::json!({
        "job_text": "[job]\nname = \"done\"\n[command]\nargv = [\"python\", \"train.py\"]\n",
        "job_path": "/home/alice/job.toml", "cwd": "/home/alice",
        "env": (0..40).map(|i| [format!("VAR_{i}"), "x".repeat(40)]).collect::<Vec<_>>(),
        "identity": {"uid": 1000, "gid": 1000, "name": "alice", "groups": [1000]}
    })
    .to_string();
    let now = now_ms();
    conn.execute_batch("BEGIN").unwrap();
    {
        let mut job = conn
            .prepare(
                "INSERT INTO jobs (id, name, tenant, user, uid, state, gpus, priority, requeue,
                 submitted_at_ms, started_at_ms, ended_at_ms, exit_code, attempt, devices,
                 gpu_seconds, submission)
                 VALUES (?1, 'done', ?2, ?3, 1000, ?4, 2, 0, 0, ?5, ?6, ?7, ?8, 1, ?9, ?10, ?11)",
            )
            .unwrap();
        let mut record = conn
            .prepare(
                "INSERT INTO accounting (job_id, name, tenant, user, state, submitted_at_ms,
                 started_at_ms, ended_at_ms, attempt, devices, gpus, gpu_seconds, wall_s,
                 queue_wait_s, cpu_seconds, peak_rss_bytes, peak_gpu_memory_bytes,
                 mean_gpu_utilization, exit_code, signal, reason)
                 VALUES (?1, 'done', ?2, ?3, ?4, ?5, ?6, ?7, 1, ?8, 2, ?9, ?10, ?11, ?12, ?13, ?14,
                 ?15, ?16, NULL, ?17)",
            )
            .unwrap();
        let states = ["succeeded", "succeeded", "succeeded", "failed", "cancelled"];
        for i in 0..JOBS {
            let id = i as i64 + 1;
            // The oldest first; the last RECENT within the last day (from 10 minutes inside it).
            let ended = if i >= JOBS - RECENT {
                now - DAY_MS
                    + 600_000
                    + (DAY_MS - 1_200_000) * (i - (JOBS - RECENT)) as i64 / RECENT as i64
            } else {
                now - 300 * DAY_MS + (298 * DAY_MS) * i as i64 / (JOBS - RECENT) as i64
            };
            let wall = 600 + (i as i64 % 7200) * 1000 / 1000;
            let started = ended - wall * 1000;
            let submitted = started - (i as i64 % 900) * 1000;
            let state = states[i % states.len()];
            let code = if state == "failed" { 1 } else { 0 };
            let devices = format!(
                "[\"GPU-{:08x}-0000-4000-8000-000000000000\",\"GPU-{:08x}-0000-4000-8000-000000000000\"]",
                i % 8,
                (i + 1) % 8
            );
            let tenant = format!("t{}", i % 8);
            let user = format!("user{}", i % 40);
            let gpu_s = 2.0 * wall as f64;
            job.execute(rusqlite::params![
                id, tenant, user, state, submitted, started, ended, code, devices, gpu_s,
                submission
            ])
            .unwrap();
            let reason = (state == "failed").then_some("exit status 1");
            record
                .execute(rusqlite::params![
                    id,
                    tenant,
                    user,
                    state,
                    submitted,
                    started,
                    ended,
                    devices,
                    gpu_s,
                    wall as f64,
                    (started - submitted) as f64 / 1000.0,
                    wall as f64 * 0.9,
                    (2i64 << 30) + (i as i64 % 1024) * (1 << 20),
                    (20i64 << 30) + (i as i64 % 4096) * (1 << 20),
                    (i % 100) as f64,
                    code,
                    reason
                ])
                .unwrap();
        }
    }
    conn.execute_batch("COMMIT").unwrap();
}

/// Wall-clock ms of `orch ARGS` as a user runs it (process start to exit), `runs` times,
/// sorted; the last run's stdout.
fn client(socket: &Path, args: &[&str], runs: usize) -> (Vec<f64>, String) {
    let mut times = Vec::new();
    let mut last = String::new();
    for _ in 0..runs {
        let t = Instant::now();
        let out = Command::new(env!("CARGO_BIN_EXE_orch"))
            .args(args)
            .env("ORCH_SERVER", socket)
            .env_remove("ORCH_STATE_DIR")
            .output()
            .unwrap();
        times.push(t.elapsed().as_secs_f64() * 1e3);
        assert!(
            out.status.success(),
            "orch {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        last = String::from_utf8_lossy(&out.stdout).into_owned();
    }
    times.sort_by(f64::total_cmp);
    (times, last)
}

/// Milliseconds from the submit request to the job's first instruction, `runs` times, sorted.
fn submit_to_start(d: &Daemon, dir: &Path, runs: usize, pause: Duration) -> Vec<f64> {
    let mut out = Vec::new();
    for i in 0..runs {
        let mark = dir.join(format!("start-{i}-{}", now_ms()));
        let job = format!(
            "[job]\nname = \"bench\"\n[resources]\ngpus = 1\n[command]\nargv = [\"sh\", \"-c\", \"date +%s%N > {}\"]\n",
            mark.display()
        );
        let body = serde_json::json!({
            "job_text": job,
            "job_path": dir.join("bench.toml").display().to_string(),
            "cwd": dir.display().to_string(),
            "env": [["PATH", std::env::var("PATH").unwrap_or_default()]],
        })
        .to_string();
        let sent = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let (status, answer) = http(&d.socket, "POST", "/v1/jobs", &body);
        assert_eq!(status, 201, "{answer}");
        let deadline = Instant::now() + Duration::from_secs(20);
        let started: u128 = loop {
            if let Ok(text) = std::fs::read_to_string(&mark)
                && let Ok(ns) = text.trim().parse()
            {
                break ns;
            }
            assert!(Instant::now() < deadline, "job {i} never started");
            std::thread::sleep(Duration::from_micros(200));
        };
        out.push(started.saturating_sub(sent) as f64 / 1e6);
        std::thread::sleep(pause);
    }
    out.sort_by(f64::total_cmp);
    out
}

fn main() {
    println!(
        "orch history benchmarks (release build, {} CPUs)",
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    let dir = std::env::temp_dir().join(format!("orch-bench-history-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let sim = dir.join("sim.toml");
    let mut text = String::new();
    for i in 0..8 {
        text.push_str(&format!(
            "[[gpu]]\nname = \"NVIDIA H100 80GB HBM3\"\nmemory_total = \"80GiB\"\nutilization = 50\nuuid = \"GPU-{i:08x}-0000-4000-8000-000000000000\"\n"
        ));
    }
    std::fs::write(&sim, text).unwrap();
    let state = dir.join("state");
    std::fs::create_dir_all(&state).unwrap();
    Daemon::start(&state, &sim, "400d").stop();
    let t = Instant::now();
    fill(&state);
    println!(
        "filled: {JOBS} finished jobs with their accounting ({RECENT} in the last day) in {:.1} s",
        t.elapsed().as_secs_f64()
    );

    let d = Daemon::start(&state, &sim, "400d");
    std::thread::sleep(Duration::from_millis(1500));
    let (times, out) = client(
        &d.socket,
        &["history", "--since", "1d", "--limit", "0", "--json"],
        10,
    );
    let rows: serde_json::Value = serde_json::from_str(&out).unwrap();
    let n = rows.as_array().map_or(0, Vec::len);
    assert_eq!(n, RECENT, "the last day's jobs");
    println!(
        "orch history --since 1d --json ({n} jobs, {} KiB): p50 {:.1} ms, max {:.1} ms   (goal <= 300 ms)",
        out.len() / 1024,
        percentile(&times, 0.5),
        percentile(&times, 1.0)
    );
    let (times, _) = client(
        &d.socket,
        &["history", "--by", "tenant", "--since", "365d"],
        10,
    );
    println!(
        "orch history --by tenant --since 365d ({JOBS} jobs summed): p50 {:.1} ms",
        percentile(&times, 0.5)
    );
    let (times, _) = client(&d.socket, &["jobs"], 20);
    println!(
        "orch jobs: p50 {:.1} ms, max {:.1} ms   (goal <= 50 ms)",
        percentile(&times, 0.5),
        percentile(&times, 1.0)
    );
    let (times, _) = client(&d.socket, &["--version"], 20);
    println!(
        "  (orch --version, the client's start alone: p50 {:.1} ms)",
        percentile(&times, 0.5)
    );
    let latency = submit_to_start(&d, &dir, 60, Duration::from_millis(30));
    println!(
        "submit-to-start with the history in place: p50 {:.1} ms, p99 {:.1} ms   (goal: unchanged, about 17 ms)",
        percentile(&latency, 0.5),
        percentile(&latency, 0.99)
    );
    println!(
        "daemon RSS after these: {:.1} MiB; state folder {:.1} MiB",
        d.rss_mib(),
        size_of(&state) as f64 / (1 << 20) as f64
    );
    d.stop();

    // `retention` shortened to 30 days: the daemon purges 90% of the jobs at start, then gives
    // the pages back in the background while jobs are submitted and started.
    let before = size_of(&state);
    let log_before = std::fs::read_to_string(state.join("daemon.log"))
        .unwrap_or_default()
        .len();
    let d = Daemon::start(&state, &sim, "30d");
    let during = submit_to_start(&d, &dir, 60, Duration::from_millis(30));
    let deadline = Instant::now() + Duration::from_secs(300);
    let vacuumed = loop {
        let log = std::fs::read_to_string(state.join("daemon.log")).unwrap_or_default();
        if let Some(line) = log[log_before.min(log.len())..]
            .lines()
            .find(|l| l.contains("free page(s) of the job database back"))
        {
            break line.to_string();
        }
        assert!(Instant::now() < deadline, "no vacuum in 5 minutes");
        std::thread::sleep(Duration::from_millis(200));
    };
    let purged = std::fs::read_to_string(state.join("daemon.log"))
        .unwrap_or_default()
        .lines()
        .rev()
        .find(|l| l.contains("purged") && l.contains("job(s)"))
        .map(str::to_string)
        .unwrap_or_default();
    let (status, body) = http(&d.socket, "GET", "/v1/history?by=tenant", "");
    assert_eq!(status, 200, "{body}");
    let groups: serde_json::Value = serde_json::from_str(&body).unwrap();
    let kept: u64 = groups
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["jobs"].as_u64().unwrap_or(0))
        .sum();
    println!(
        "retention 30d: {}",
        purged.split("INFO").last().unwrap_or(&purged).trim()
    );
    println!(
        "  vacuum: {}",
        vacuumed.split("INFO").last().unwrap_or(&vacuumed).trim()
    );
    println!(
        "  submit-to-start while the purge and vacuum ran: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        percentile(&during, 0.5),
        percentile(&during, 0.99),
        percentile(&during, 1.0)
    );
    println!(
        "  state folder {:.1} MiB before, {:.1} MiB after; accounting records kept: {kept} (of {})",
        before as f64 / (1 << 20) as f64,
        size_of(&state) as f64 / (1 << 20) as f64,
        JOBS + 120
    );
    d.stop();
    let _ = std::fs::remove_dir_all(&dir);
}
