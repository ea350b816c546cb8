//! The daemon's numbers (issue goals in brackets):
//! - durable submits per second over the socket with 1, 8 and 32 concurrent clients [≥ 2,000/s];
//! - submit-to-start latency on an idle daemon, p50 [≤ 20 ms] and p99;
//! - one scheduling pass over 10,000 queued jobs on 64 simulated GPUs [≤ 50 ms];
//! - the daemon's memory with 100,000 finished jobs in its history [≤ 200 MiB RSS].
//!
//! `cargo bench -p orch-cli --bench serve` (release). A real `orch serve` on a temporary socket
//! and state folder; clients speak HTTP over the socket from threads of this process, so the
//! figures are the daemon's, not the cost of starting a client process.

mod common;

use common::http;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

fn scratch(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("orch-bench-serve-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A sim inventory of `n` idle 80 GiB GPUs.
fn sim_file(dir: &Path, n: usize) -> PathBuf {
    let mut text = String::new();
    for i in 0..n {
        text.push_str(&format!(
            "[[gpu]]\nname = \"NVIDIA H100 80GB HBM3\"\nmemory_total = \"80GiB\"\nuuid = \"GPU-{i:08x}-0000-4000-8000-000000000000\"\n"
        ));
    }
    let path = dir.join(format!("sim-{n}.toml"));
    std::fs::write(&path, text).unwrap();
    path
}

struct Daemon {
    child: Child,
    socket: PathBuf,
}

impl Daemon {
    fn start(state: &Path, sim: &Path) -> Daemon {
        let child = Command::new(env!("CARGO_BIN_EXE_orch"))
            .arg("serve")
            .env("ORCH_STATE_DIR", state)
            .env("ORCH_DEVICES", format!("sim:{}", sim.display()))
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let socket = state.join("orch.sock");
        let deadline = Instant::now() + Duration::from_secs(30);
        while UnixStream::connect(&socket).is_err() {
            assert!(Instant::now() < deadline, "the daemon did not start");
            std::thread::sleep(Duration::from_millis(10));
        }
        Daemon { child, socket }
    }

    fn rss_mib(&self) -> f64 {
        common::rss_mib(self.child.id())
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn submit_body(argv: &[&str], gpus: u32, cwd: &Path) -> String {
    let argv: Vec<String> = argv.iter().map(|a| format!("{a:?}")).collect();
    let job = format!(
        "[job]\nname = \"bench\"\n[resources]\ngpus = {gpus}\n[command]\nargv = [{}]\n",
        argv.join(", ")
    );
    serde_json::json!({
        "job_text": job,
        "job_path": cwd.join("bench.toml").display().to_string(),
        "cwd": cwd.display().to_string(),
        "env": [["PATH", std::env::var("PATH").unwrap_or_default()]],
    })
    .to_string()
}

fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// Submits per second with `clients` threads, `per_client` submits each. Every job waits
/// behind one that holds all devices, so only the queue and its durability are measured.
fn submits_per_second(clients: usize, per_client: usize) -> f64 {
    let dir = scratch(&format!("submit-{clients}"));
    let sim = sim_file(&dir, 8);
    let d = Daemon::start(&dir, &sim);
    let (status, _) = http(
        &d.socket,
        "POST",
        "/v1/jobs",
        &submit_body(&["sleep", "600"], 8, &dir),
    );
    assert_eq!(status, 201);
    std::thread::sleep(Duration::from_millis(300));
    let body = submit_body(&["true"], 8, &dir);
    let started = Instant::now();
    std::thread::scope(|scope| {
        for _ in 0..clients {
            let (socket, body) = (&d.socket, &body);
            scope.spawn(move || {
                for _ in 0..per_client {
                    let (status, answer) = http(socket, "POST", "/v1/jobs", body);
                    assert_eq!(status, 201, "{answer}");
                }
            });
        }
    });
    (clients * per_client) as f64 / started.elapsed().as_secs_f64()
}

/// Milliseconds from the submit request to the job's first instruction (`date` prints its clock).
fn submit_to_start(runs: usize) -> Vec<f64> {
    let dir = scratch("latency");
    let sim = sim_file(&dir, 8);
    let d = Daemon::start(&dir, &sim);
    let mut out = Vec::new();
    for i in 0..runs {
        let mark = dir.join(format!("start-{i}"));
        let body = submit_body(
            &["sh", "-c", &format!("date +%s%N > {}", mark.display())],
            1,
            &dir,
        );
        let sent = now_ns();
        let (status, _) = http(&d.socket, "POST", "/v1/jobs", &body);
        assert_eq!(status, 201);
        let deadline = Instant::now() + Duration::from_secs(10);
        let started: u128 = loop {
            if let Ok(text) = std::fs::read_to_string(&mark)
                && let Ok(ns) = text.trim().parse()
            {
                break ns;
            }
            assert!(Instant::now() < deadline, "job {i} never started");
            std::thread::sleep(Duration::from_micros(200));
        };
        out.push((started.saturating_sub(sent)) as f64 / 1e6);
        std::thread::sleep(Duration::from_millis(30));
    }
    out.sort_by(f64::total_cmp);
    out
}

/// One scheduling pass over `queued` jobs on a 64-GPU sim with `free` devices free.
fn scheduling_pass(queued: usize, free: usize) -> f64 {
    use orch_serve::core::db::{Db, JobRow, Submission};
    use orch_serve::core::engine::Engine;
    use orch_serve::core::kick::Kick;
    use orch_serve::core::state::{MachineView, Shared};
    let dir = scratch(&format!("pass-{free}"));
    let sim = sim_file(&dir, 64);
    let devices = format!("sim:{}", sim.display());
    let inventory = orch_devices::Inventory::load(&devices.parse().unwrap()).unwrap();
    // Hold all but `free` devices with leases of a live holder (this process).
    let mut store = orch_leases::LeaseStore::open(&dir).unwrap();
    for d in inventory.devices.iter().skip(free) {
        let request = orch_leases::ClaimRequest {
            job_name: "holder".into(),
            exclusive: true,
            memory_reserved_bytes: 0,
            holder: orch_leases::Holder::current(),
            inside: None,
        };
        store
            .claim(&request, |_| Ok::<_, String>(vec![d.uuid.clone()]))
            .unwrap();
    }
    let db = Db::open(&dir).unwrap();
    let identity = orch_serve::core::users::Identity::of_uid(0, 0);
    let job_text = "[job]\nname = \"q\"\n[command]\nargv = [\"true\"]\n".to_string();
    let submission = Submission {
        job_text,
        job_path: dir.join("q.toml").display().to_string(),
        cwd: dir.display().to_string(),
        env: Vec::new(),
        identity,
        policy_file: None,
        holder: None,
        alloc: None,
        sweep_task: None,
    };
    let row = JobRow {
        name: "q".into(),
        tenant: "bench".into(),
        user: "bench".into(),
        gpus: 1,
        ..JobRow::queued(0)
    };
    db.write_blocking(move |tx| {
        for _ in 0..queued {
            orch_serve::core::db::insert_job(tx, &row, &submission, None)?;
        }
        Ok(0)
    })
    .unwrap();
    let (kick, kicks) = std::sync::mpsc::channel::<Kick>();
    let compiler = orch_serve::core::compile::Compiler::new(
        PathBuf::from("/bin/true"),
        &dir,
        Default::default(),
        kick.clone(),
    );
    let config = orch_serve::Config::single_user("bench");
    let policies = orch_serve::core::policy_worker::PolicyWorkers::new(
        PathBuf::from("/bin/true"),
        &config,
        kick.clone(),
    );
    let shared = std::sync::Arc::new(Shared {
        db,
        compiler,
        policies,
        config,
        state_dir: dir.clone(),
        devices,
        kick: std::sync::Mutex::new(kick),
        reasons: Default::default(),
        places: Default::default(),
        visible_devices: 64,
        backend: orch_devices::Backend::Sim,
        // Supervisors are not what is measured: `true` stands in for them.
        exe: PathBuf::from("/bin/true"),
        root: false,
        standing: Default::default(),
        machine: std::sync::Mutex::new(MachineView::new(inventory.clone())),
        metrics: Default::default(),
        health: orch_serve::core::health::StateHealth::new(&dir),
        supervisor_exits: Default::default(),
        timeline: Default::default(),
    });
    // The default queue policy, the built-in fair-share component, as the daemon runs it.
    let policy = orch_serve::core::queue_policy::for_daemon(&shared.config).unwrap();
    let mut engine = Engine::new(shared, kicks, inventory, policy).unwrap();
    engine.recover().unwrap();
    let started = Instant::now();
    engine.pass();
    started.elapsed().as_secs_f64() * 1e3
}

/// RSS of a daemon whose history holds `finished` jobs, after it listed the newest of them.
fn memory_with_history(finished: usize) -> (f64, f64) {
    let dir = scratch("memory");
    let sim = sim_file(&dir, 8);
    {
        let d = Daemon::start(&dir, &sim);
        drop(d);
    }
    // Fill the history straight into the database (as a long-lived daemon would have).
    let conn = rusqlite::Connection::open(dir.join("jobs.sqlite3")).unwrap();
    let submission = serde_json::json!({
        "job_text": "[job]\nname = \"done\"\n[command]\nargv = [\"python\", \"train.py\"]\n",
        "job_path": "/home/alice/job.toml", "cwd": "/home/alice",
        "env": (0..40).map(|i| [format!("VAR_{i}"), "x".repeat(40)]).collect::<Vec<_>>(),
        "identity": {"uid": 1000, "gid": 1000, "name": "alice", "groups": [1000]}
    })
    .to_string();
    conn.execute_batch("BEGIN").unwrap();
    {
        let mut stmt = conn
            .prepare(
                "INSERT INTO jobs (name, tenant, user, uid, state, gpus, priority, requeue,
                 submitted_at_ms, started_at_ms, ended_at_ms, exit_code, attempt, submission)
                 VALUES ('done', 'alice', 'alice', 1000, 'succeeded', 1, 0, 0, ?1, ?1, ?1, 0, 1, ?2)",
            )
            .unwrap();
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64;
        for _ in 0..finished {
            stmt.execute(rusqlite::params![now, submission]).unwrap();
        }
    }
    conn.execute_batch("COMMIT").unwrap();
    let d = Daemon::start(&dir, &sim);
    std::thread::sleep(Duration::from_millis(500));
    let at_start = d.rss_mib();
    for _ in 0..5 {
        let (status, body) = http(&d.socket, "GET", "/v1/jobs?all=true", "");
        assert_eq!(status, 200);
        assert!(body.len() > 1000);
    }
    (at_start, d.rss_mib())
}

/// `/metrics` with 64 GPUs and `jobs` jobs in the table (states and tenants mixed), scraped 200
/// times over the socket: p50 and p99 in ms, and the page's size. Then the web page's first load:
/// the page, its script and the four API answers its first refresh reads, in bytes.
fn metrics_scrape(jobs: usize) -> (f64, f64, usize, usize) {
    let dir = scratch("metrics");
    let sim = sim_file(&dir, 64);
    {
        let d = Daemon::start(&dir, &sim);
        drop(d);
    }
    let conn = rusqlite::Connection::open(dir.join("jobs.sqlite3")).unwrap();
    conn.execute_batch("BEGIN").unwrap();
    {
        let mut stmt = conn
            .prepare(
                "INSERT INTO jobs (name, tenant, user, uid, state, gpus, priority, requeue,
                 submitted_at_ms, started_at_ms, ended_at_ms, exit_code, attempt, submission)
                 VALUES ('done', ?1, 'alice', 1000, ?2, 1, 0, 0, ?3, ?3, ?3, 0, 1, '{}')",
            )
            .unwrap();
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64;
        let states = ["succeeded", "failed", "cancelled", "lost"];
        for i in 0..jobs {
            stmt.execute(rusqlite::params![
                format!("tenant-{}", i % 20),
                states[i % states.len()],
                now
            ])
            .unwrap();
        }
    }
    conn.execute_batch("COMMIT").unwrap();
    let d = Daemon::start(&dir, &sim);
    std::thread::sleep(Duration::from_millis(1500));
    let mut times = Vec::new();
    let mut size = 0;
    for _ in 0..200 {
        let t = Instant::now();
        let (status, body) = http(&d.socket, "GET", "/metrics", "");
        times.push(t.elapsed().as_secs_f64() * 1e3);
        assert_eq!(status, 200, "{body}");
        size = body.len();
    }
    times.sort_by(f64::total_cmp);
    let first_load: usize = [
        "/",
        "/app.js",
        "/v1/whoami",
        "/v1/devices",
        "/v1/jobs?events=true&all=true&recent=20",
        "/v1/tenants",
    ]
    .iter()
    .map(|path| {
        let (status, body) = http(&d.socket, "GET", path, "");
        assert_eq!(status, 200, "{path}: {body}");
        body.len()
    })
    .sum();
    (
        percentile(&times, 0.5),
        percentile(&times, 0.99),
        size,
        first_load,
    )
}

fn main() {
    println!(
        "orch serve benchmarks (release build, {} CPUs)",
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    for (clients, per) in [(1, 1000), (8, 500), (32, 200)] {
        let rate = submits_per_second(clients, per);
        println!("durable submits/s, {clients:>2} client(s): {rate:>7.0}   (goal >= 2000)");
    }
    let latency = submit_to_start(100);
    println!(
        "submit-to-start, idle daemon: p50 {:.1} ms, p99 {:.1} ms   (goal p50 <= 20 ms)",
        percentile(&latency, 0.5),
        percentile(&latency, 0.99)
    );
    for free in [0, 8] {
        let ms = (0..3)
            .map(|_| scheduling_pass(10_000, free))
            .fold(f64::MAX, f64::min);
        println!(
            "one scheduling pass, 10,000 queued, 64 GPUs, {free} free: {ms:.1} ms   (goal <= 50 ms)"
        );
    }
    let (p50, p99, size, first_load) = metrics_scrape(10_000);
    println!(
        "/metrics, 64 GPUs, 10,000 jobs in the table: p50 {p50:.2} ms, p99 {p99:.2} ms, {} KiB   (goal <= 5 ms)",
        size / 1024
    );
    println!(
        "web page first load (page, script, first refresh's API answers; 64 GPUs): {:.1} KiB   (goal <= 100 KB)",
        first_load as f64 / 1024.0
    );
    let (start, listed) = memory_with_history(100_000);
    println!(
        "RSS with 100,000 finished jobs: {start:.1} MiB at start, {listed:.1} MiB after listing   (goal <= 200 MiB)"
    );
}
