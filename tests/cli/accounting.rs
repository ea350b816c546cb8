//! Per-job accounting on the daemon: what a job used recorded at its end (GPU-seconds, wall time,
//! CPU, memory, the device readings while it ran), `orch history` with its filters, JSON and CSV
//! and per-tenant sums, records outliving `retention`, and who sees which jobs.

use crate::serve::{Daemon, as_user, job_file, root_or_skip, test_user, two_tenants};
use crate::*;
use std::time::{Duration, Instant};

const GIB: u64 = 1 << 30;

/// A sim file of two GPUs at `utilization`, with `processes` (pid, memory per GPU) on them,
/// written whole and renamed into place (the daemon's reader never sees half a file).
fn write_sim(path: &std::path::Path, utilization: u32, processes: &[(u32, [u64; 2])]) {
    let mut text = String::new();
    for gpu in 0..2 {
        text.push_str(&format!(
            "[[gpu]]\nname = \"Sim GPU\"\nmemory_total = \"80GiB\"\nutilization = {utilization}\nuuid = \"GPU-acc0000{gpu}-0000-0000-0000-000000000000\"\n"
        ));
        for (pid, memory) in processes {
            text.push_str(&format!(
                "[[gpu.process]]\npid = {pid}\nused_memory = \"{}\"\n",
                memory[gpu]
            ));
        }
    }
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// A daemon over a two-GPU sim file of its own, with `config` (a `[[tenant]]` for this user is
/// added); returns it and the sim file's path.
fn daemon(tag: &str, config: &str) -> (Daemon, std::path::PathBuf) {
    let mut d = Daemon::with_lab_tenant(tag, config);
    let sim = d.state.join("gpus.toml");
    write_sim(&sim, 20, &[]);
    d.devices = Some(format!("sim:{}", sim.display()));
    d.restart();
    (d, sim)
}

fn history(d: &Daemon, args: &[&str]) -> serde_json::Value {
    let mut all = vec!["history", "--json"];
    all.extend_from_slice(args);
    let out = d.client(&all);
    assert!(out.status.success(), "{}", stderr(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn f64_of(v: &serde_json::Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}

#[test]
fn a_two_gpu_job_is_recorded_with_its_gpu_time_exit_code_and_its_devices_readings() {
    let (d, sim) = daemon("acct-job", "");
    // 1.5 s on both GPUs, exit status 3.
    let id = d.submit(&["--gpus", "2", "--", "sh", "-c", "sleep 1.5; exit 3"]);
    let status = d.wait_state(&id, "failed");
    let a = &status["accounting"];
    assert_eq!(status["exit_code"], 3, "{status}");
    assert_eq!(a["devices"].as_array().unwrap().len(), 2, "{status}");
    let gpu_s = f64_of(&a["gpu_seconds"]);
    let wall = f64_of(&a["wall_s"]);
    assert!((2.9..7.0).contains(&gpu_s), "{gpu_s} GPU-seconds: {status}");
    assert!((1.45..3.5).contains(&wall), "{wall} s: {status}");
    assert!(f64_of(&a["queue_wait_s"]) >= 0.0);
    assert!(a["cpu_seconds"].is_number(), "{status}");
    assert!(a["peak_rss_bytes"].as_u64().unwrap() > 0, "{status}");
    // The sim file lists no processes of it: no GPU memory of its own; utilization 20 throughout.
    assert_eq!(a["peak_gpu_memory_bytes"], 0, "{status}");
    assert!(
        (f64_of(&a["mean_gpu_utilization"]) - 20.0).abs() < 1e-9,
        "{status}"
    );
    // The same in the history, with how it ended.
    let rows = history(&d, &[]);
    let row = &rows.as_array().unwrap()[0];
    assert_eq!(row["id"], id.as_str());
    assert_eq!(
        (row["state"].as_str(), row["exit_code"].as_i64()),
        (Some("failed"), Some(3))
    );
    assert_eq!(row["gpus"], 2);
    assert_eq!(row["gpu_seconds"], a["gpu_seconds"]);
    // `orch status` shows them.
    let text = stdout(&d.client(&["status", &id]));
    assert!(
        text.contains("wall time") && text.contains("cpu time"),
        "{text}"
    );

    // Readings that change while a job runs: its processes' memory and its GPUs' utilization.
    let pidfile = d.state.join("job.pid");
    let id = d.submit(&[
        "--gpus",
        "2",
        "--",
        "sh",
        "-c",
        &format!("echo $$ > {}; sleep 5", pidfile.display()),
    ]);
    let deadline = Instant::now() + Duration::from_secs(15);
    let pid: u32 = loop {
        if let Some(pid) = std::fs::read_to_string(&pidfile)
            .ok()
            .and_then(|t| t.trim().parse().ok())
        {
            break pid;
        }
        assert!(Instant::now() < deadline, "the job never started");
        std::thread::sleep(Duration::from_millis(20));
    };
    write_sim(&sim, 20, &[(pid, [GIB, GIB])]);
    std::thread::sleep(Duration::from_millis(2500));
    write_sim(
        &sim,
        80,
        &[(pid, [3 * GIB, GIB]), (4_000_000, [9 * GIB, 9 * GIB])],
    );
    let status = d.wait_state(&id, "succeeded");
    let a = &status["accounting"];
    // Its own processes' memory on one GPU at most, not a stranger's (pid 4000000).
    assert_eq!(
        a["peak_gpu_memory_bytes"].as_u64(),
        Some(3 * GIB),
        "{status}"
    );
    let util = f64_of(&a["mean_gpu_utilization"]);
    assert!(util > 20.0 && util < 80.0, "both readings count: {util}");
}

#[test]
fn retention_removes_an_old_jobs_row_and_folder_and_keeps_its_tenants_totals() {
    let (d, _) = daemon("acct-retention", "retention = \"4s\"");
    let id = d.submit(&["--gpus", "1", "--", "sleep", "1"]);
    d.wait_state(&id, "succeeded");
    let folder = d.state.join("jobs").join(format!("{id}-1"));
    assert!(folder.is_dir());
    let deadline = Instant::now() + Duration::from_secs(20);
    while d.client(&["status", &id]).status.code() != Some(2) {
        assert!(Instant::now() < deadline, "job {id} was never purged");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(!folder.exists(), "its folder went with its row");
    let sums = history(&d, &["--by", "tenant", "--since", "365d"]);
    let lab = &sums.as_array().unwrap()[0];
    assert_eq!(
        (lab["key"].as_str(), lab["jobs"].as_u64()),
        (Some("lab"), Some(1))
    );
    let hours = f64_of(&lab["gpu_hours"]);
    assert!(hours > 0.9 / 3600.0 && hours < 4.0 / 3600.0, "{sums}");
    let table = stdout(&d.client(&["history", "--by", "tenant"]));
    assert!(
        table.starts_with("TENANT") && table.contains("lab"),
        "{table}"
    );
    // The job itself is still in the history, and its window filters it.
    assert_eq!(history(&d, &[]).as_array().unwrap().len(), 1);
    let later = history(&d, &["--since", "2099-01-01"]);
    assert_eq!(later.as_array().unwrap().len(), 0);
}

/// `text` as CSV (RFC 4180: quoted fields, doubled quotes, line breaks inside quotes).
fn parse_csv(text: &str) -> Vec<Vec<String>> {
    let mut rows = Vec::new();
    let mut row = Vec::new();
    let mut field = String::new();
    let mut quoted = false;
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match (quoted, c) {
            (true, '"') if chars.peek() == Some(&'"') => {
                chars.next();
                field.push('"');
            }
            (true, '"') => quoted = false,
            (true, c) => field.push(c),
            (false, '"') => quoted = true,
            (false, ',') => row.push(std::mem::take(&mut field)),
            (false, '\n') => {
                row.push(std::mem::take(&mut field));
                rows.push(std::mem::take(&mut row));
            }
            (false, c) => field.push(c),
        }
    }
    rows
}

#[test]
fn csv_has_a_header_and_one_job_a_line_and_parses_back_to_the_json() {
    let (d, _) = daemon("acct-csv", "");
    let work = d.state.join("work");
    std::fs::create_dir_all(&work).unwrap();
    let file = job_file(
        &work,
        "odd.toml",
        "[job]\nname = \"a, \\\"quoted\\\" name\"\n[command]\nargv = [\"true\"]\n",
    );
    let odd = stdout(&d.client(&["submit", &file])).trim().to_string();
    // One after the other: the rows below come in the order they ended.
    d.wait_state(&odd, "succeeded");
    let plain = d.submit(&["--", "sh", "-c", "exit 2"]);
    d.wait_state(&plain, "failed");
    let out = d.client(&["history", "--csv"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let rows = parse_csv(&stdout(&out));
    let json = history(&d, &[]);
    let jobs = json.as_array().unwrap();
    assert_eq!(rows.len(), 1 + jobs.len(), "{rows:?}");
    let header = &rows[0];
    assert_eq!(header[0], "id");
    for row in &rows {
        assert_eq!(row.len(), header.len(), "{row:?}");
    }
    let col = |name: &str| header.iter().position(|h| h == name).unwrap();
    for (row, job) in rows[1..].iter().zip(jobs) {
        assert_eq!(row[col("id")], job["id"].as_str().unwrap());
        assert_eq!(row[col("name")], job["name"].as_str().unwrap());
        assert_eq!(row[col("state")], job["state"].as_str().unwrap());
        assert_eq!(
            row[col("gpu_seconds")].parse::<f64>().unwrap(),
            f64_of(&job["gpu_seconds"])
        );
    }
    assert_eq!(rows[1][col("name")], "a, \"quoted\" name");
    assert_eq!(rows[2][col("exit_code")], "2");
    // --state filters; --by with --csv sums.
    let failed = parse_csv(&stdout(
        &d.client(&["history", "--csv", "--state", "failed"]),
    ));
    assert_eq!(failed.len(), 2);
    let sums = parse_csv(&stdout(&d.client(&["history", "--csv", "--by", "user"])));
    assert_eq!(sums[0][..3], ["user", "jobs", "gpu_hours"]);
    assert_eq!(sums[1][1], "2");
}

#[test]
fn a_bad_time_or_state_is_one_sentence_and_exit_2() {
    for (args, says) in [
        (
            vec!["history", "--since", "yesterday-ish"],
            "--since \"yesterday-ish\" is neither a duration",
        ),
        (
            vec!["history", "--until", "2026-13-45"],
            "--until \"2026-13-45\" is neither",
        ),
        (
            vec!["history", "--state", "running"],
            "--state running is not a state a finished job has",
        ),
    ] {
        let out = orch(&args, &[("ORCH_SERVER", "/nonexistent/orch.sock")]);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        let text = stderr(&out);
        assert!(text.contains(says), "{args:?}: {text}");
        assert_eq!(text.trim().lines().count(), 1, "{text}");
    }
}

#[test]
fn a_user_sees_the_history_of_their_own_tenant_and_the_admin_everyones() {
    if !root_or_skip("a_user_sees_the_history_of_their_own_tenant") {
        return;
    }
    let alice = test_user("orchtesta");
    let bob = test_user("orchtestb");
    let (d, public) = two_tenants("acct-users", |_| {});
    let socket = d.socket();
    let mut ids = Vec::new();
    for who in [alice, bob] {
        let out = as_user(who, &socket, &public, &["submit", "--", "true"]);
        assert!(out.status.success(), "{}", stderr(&out));
        let id = stdout(&out).trim().to_string();
        d.wait_state(&id, "succeeded");
        ids.push(id);
    }
    let seen = |who: (u32, u32)| -> Vec<String> {
        let out = as_user(who, &socket, &public, &["history", "--json"]);
        assert!(out.status.success(), "{}", stderr(&out));
        let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        rows.as_array()
            .unwrap()
            .iter()
            .map(|r| r["id"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(seen(alice), [ids[0].clone()]);
    assert_eq!(seen(bob), [ids[1].clone()]);
    // Asking for another tenant's is refused, not answered.
    let out = as_user(bob, &socket, &public, &["history", "--tenant", "vision"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("is not in tenant \"vision\""),
        "{}",
        stderr(&out)
    );
    let sums = as_user(
        alice,
        &socket,
        &public,
        &["history", "--by", "tenant", "--json"],
    );
    let sums: serde_json::Value = serde_json::from_slice(&sums.stdout).unwrap();
    assert_eq!(sums.as_array().unwrap().len(), 1, "{sums}");
    // The admin (root) sees both.
    let all = history(&d, &[]);
    assert_eq!(all.as_array().unwrap().len(), 2, "{all}");
}

#[test]
fn a_job_that_ends_while_the_daemon_is_down_still_gets_its_record() {
    let (mut d, _) = daemon("acct-restart", "");
    let id = d.submit(&["--gpus", "1", "--", "sh", "-c", "sleep 2; exit 4"]);
    d.wait_state(&id, "running");
    d.kill9();
    // It ends while no daemon watches; its supervisor records how, and what it used.
    std::thread::sleep(Duration::from_millis(4000));
    d.restart();
    let status = d.wait_state(&id, "failed");
    let a = &status["accounting"];
    assert_eq!(status["exit_code"], 4, "{status}");
    assert!(
        a["cpu_seconds"].is_number(),
        "its supervisor's count: {status}"
    );
    let gpu_s = f64_of(&a["gpu_seconds"]);
    // Its own two seconds and its start, not the daemon's four seconds away.
    assert!((1.9..3.8).contains(&gpu_s), "{gpu_s}: {status}");
    // No daemon looked at its devices meanwhile: those readings are unknown, not zero.
    assert!(a["mean_gpu_utilization"].is_null(), "{status}");
    assert_eq!(
        history(&d, &["--state", "failed"])
            .as_array()
            .unwrap()
            .len(),
        1
    );
}

#[test]
fn an_interactive_allocation_and_each_task_of_an_array_get_a_record_too() {
    let (d, _) = daemon("acct-kinds", "");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_orch"))
        .args(["alloc", "--gpus", "1", "--", "sleep", "1.2"])
        .env("ORCH_SERVER", d.socket())
        .env_remove("ORCH_STATE_DIR")
        .env_remove("ORCH_DEVICES")
        .env_remove("ORCH_JOB_ID")
        .env_remove("CUDA_VISIBLE_DEVICES")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let work = d.state.join("work");
    std::fs::create_dir_all(&work).unwrap();
    let file = job_file(
        &work,
        "sweep.toml",
        "[job]\nname = \"sw\"\n[sweep]\nseed = [1, 2]\n[command]\nargv = [\"true\"]\n",
    );
    let array = stdout(&d.client(&["submit", &file])).trim().to_string();
    assert!(d.client(&["wait", &array]).status.success());
    // The allocation's end is recorded once its process released it.
    let deadline = Instant::now() + Duration::from_secs(15);
    let rows = loop {
        let rows = history(&d, &[]);
        if rows.as_array().unwrap().len() == 3 {
            break rows;
        }
        assert!(
            Instant::now() < deadline,
            "not every job was recorded: {rows}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let rows = rows.as_array().unwrap();
    let alloc = rows.iter().find(|r| r["name"] != "sw").unwrap();
    assert_eq!(alloc["state"], "succeeded", "{alloc}");
    assert_eq!(alloc["gpus"], 1, "{alloc}");
    let gpu_s = f64_of(&alloc["gpu_seconds"]);
    assert!((1.0..3.0).contains(&gpu_s), "{alloc}");
    assert_eq!(rows.iter().filter(|r| r["name"] == "sw").count(), 2);
}

#[test]
fn a_job_cancelled_while_queued_is_recorded_with_its_wait_and_counted() {
    let me = stdout(
        &std::process::Command::new("id")
            .arg("-un")
            .output()
            .unwrap(),
    )
    .trim()
    .to_string();
    // An admin, to read the metrics.
    let (d, _) = daemon("acct-cancel-queued", &format!("admins = [\"{me}\"]"));
    let blocker = d.submit(&["--gpus", "2", "--", "sleep", "30"]);
    d.wait_state(&blocker, "running");
    let queued = d.submit(&["--gpus", "2", "--", "true"]);
    d.wait_state(&queued, "queued");
    std::thread::sleep(Duration::from_millis(600));
    let out = d.client(&["cancel", &queued]);
    assert!(out.status.success(), "{}", stderr(&out));
    let rows = history(&d, &["--state", "cancelled"]);
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0]["id"], queued.as_str(), "{rows:?}");
    let wait = f64_of(&rows[0]["queue_wait_s"]);
    assert!((0.5..30.0).contains(&wait), "{rows:?}");
    assert_eq!(f64_of(&rows[0]["wall_s"]), 0.0, "{rows:?}");
    let (status, metrics) = crate::held_leases::http_text(&d, "GET", "/metrics", "");
    assert_eq!(status, 200, "{metrics}");
    assert!(
        metrics.contains("orch_jobs_finished_total{tenant=\"lab\",state=\"cancelled\"} 1\n"),
        "{metrics}"
    );
    // An array's queued tasks, cancelled with their array, likewise.
    let work = d.state.join("work");
    std::fs::create_dir_all(&work).unwrap();
    let file = job_file(
        &work,
        "wait.toml",
        "[job]\nname = \"wait\"\n[resources]\ngpus = 2\n[sweep]\nk = [0, 1]\n[command]\nargv = [\"true\"]\n",
    );
    let array = d.submit(&[&file]);
    d.wait_state(&format!("{array}[1]"), "queued");
    let out = d.client(&["cancel", &array]);
    assert!(out.status.success(), "{}", stderr(&out));
    let rows = history(&d, &["--state", "cancelled"]);
    assert_eq!(rows.as_array().unwrap().len(), 3, "{rows}");
    let (_, metrics) = crate::held_leases::http_text(&d, "GET", "/metrics", "");
    assert!(
        metrics.contains("orch_jobs_finished_total{tenant=\"lab\",state=\"cancelled\"} 3\n"),
        "{metrics}"
    );
    let out = d.client(&["cancel", &blocker]);
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
fn a_history_moment_past_the_largest_is_refused_with_a_sentence() {
    let (d, _) = daemon("acct-ms-range", "");
    for query in [
        "since_ms=18446744073709551615",
        "until_ms=9223372036854775808",
    ] {
        let (status, body) =
            crate::held_leases::http_text(&d, "GET", &format!("/v1/history?{query}"), "");
        assert_eq!(status, 400, "{query}: {body}");
        assert!(body.contains("milliseconds since the Unix epoch"), "{body}");
    }
    let (status, body) =
        crate::held_leases::http_text(&d, "GET", "/v1/history?until_ms=9223372036854775807", "");
    assert_eq!(status, 200, "{body}");
}

#[test]
fn history_shows_the_newest_thousand_by_default_and_says_when_more_matched() {
    let (d, _) = daemon("acct-limit", "");
    let mut ids = Vec::new();
    for _ in 0..3 {
        let id = d.submit(&["--", "true"]);
        d.wait_state(&id, "succeeded");
        ids.push(id);
    }
    let out = d.client(&["history", "--json", "--limit", "2"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let shown: Vec<&str> = rows
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap())
        .collect();
    assert_eq!(shown, [ids[1].as_str(), ids[2].as_str()]);
    let text = stderr(&out);
    assert!(text.contains("--limit N"), "{text}");
    assert!(text.contains("--since"), "{text}");
    for args in [vec!["history"], vec!["history", "--limit", "0"]] {
        let out = d.client(&args);
        assert!(out.status.success(), "{}", stderr(&out));
        assert_eq!(stderr(&out), "", "{args:?}");
        let table = stdout(&out);
        assert_eq!(table.lines().count(), 4, "{table}");
    }
    let out = d.client(&["history", "--by", "user", "--limit", "1", "--json"]);
    let groups: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(groups[0]["jobs"], 3, "{groups}");
}

#[test]
fn a_job_ended_by_a_signal_says_which_in_its_status_and_its_history() {
    let (d, _) = daemon("acct-signal", "");
    let id = d.submit(&["--gpus", "1", "--", "sh", "-c", "kill -KILL $$"]);
    let status = d.wait_state(&id, "failed");
    assert_eq!(status["signal"], 9, "{status}");
    let listed = history(&d, &[]);
    let row = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|j| j["id"] == id.as_str())
        .unwrap_or_else(|| panic!("{listed}"));
    assert_eq!(row["signal"], 9, "{row}");
    // A job that exits by itself names no signal.
    let id = d.submit(&["--gpus", "1", "--", "true"]);
    let status = d.wait_state(&id, "succeeded");
    assert!(status["signal"].is_null(), "{status}");
}
