//! What a careless admin can do to a daemon, and what a client can expect of one: a second daemon
//! on a live socket or on the machine's devices, a database restored from a backup, a daemon
//! stopped while its jobs end, a daemon that never answers.

use crate::serve::Daemon;
use crate::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// A folder of this test's own under the temporary folder, empty.
fn scratch(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("orch-trust-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `orch serve` on `state` and `socket` expected to refuse to start: its output, within 30 s.
fn serve_refused(
    state: &Path,
    socket: &Path,
    config: Option<&Path>,
    env: &[(&str, &str)],
) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_orch"));
    cmd.arg("serve")
        .arg("--socket")
        .arg(socket)
        .env("ORCH_STATE_DIR", state)
        .env("ORCH_DEVICES", lab_sim())
        .env_remove("RUST_LOG")
        .envs(env.iter().copied());
    if let Some(config) = config {
        cmd.arg("--config").arg(config);
    }
    crate::serve::serve_refusal(cmd, Duration::from_secs(30))
}

/// In `dir`, a config with `machine_lock = true` (tenant `lab`: this user) and the path of the
/// machine lock; and a daemon (`tag`) started on both. The config, the lock and the daemon.
fn machine_locked_daemon(dir: &Path, tag: &str) -> (PathBuf, PathBuf, Daemon) {
    let lock = dir.join("machine.lock");
    let config = dir.join("serve.toml");
    std::fs::write(
        &config,
        format!(
            "machine_lock = true\n[[tenant]]\nname = \"lab\"\nusers = [\"{}\"]\n",
            me()
        ),
    )
    .unwrap();
    let mut daemon = Daemon::prepare(tag);
    daemon.config = Some(config.clone());
    daemon
        .env
        .push(("ORCH_MACHINE_LOCK", lock.display().to_string()));
    daemon.restart();
    (config, lock, daemon)
}

fn pid_of(d: &Daemon) -> u32 {
    d.child.as_ref().unwrap().id()
}

/// Stops the daemon as systemd would (SIGTERM) and waits for it (30 s at most).
fn stop(d: &mut Daemon) {
    let mut child = d.child.take().unwrap();
    // SAFETY: kill(2) on the daemon this test started.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGTERM);
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait().unwrap().is_none() {
        assert!(
            Instant::now() < deadline,
            "the daemon did not stop on SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Two daemons, two state folders, one socket: the second is refused with the first's pid and
/// the socket, and leaves both alone (the first serves on, its socket stays after the second
/// exits). A socket something answers on without orch's lock is refused the same way. A dead
/// daemon's socket (kill -9) is replaced by the next start, whatever its state folder.
#[test]
fn a_live_socket_is_never_taken_over_and_a_dead_ones_is_replaced() {
    let dir = scratch("socket");
    let socket = dir.join("shared.sock");
    let mut first = Daemon::prepare("socket-a");
    first.socket = Some(socket.clone());
    first.restart();
    let other = scratch("socket-b");
    let out = serve_refused(&other, &socket, None, &[]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains(&format!("pid {}", pid_of(&first)))
            && err.contains(&socket.display().to_string()),
        "the sentence names the first daemon's pid and the socket: {err}"
    );
    assert!(socket.exists(), "the refused daemon removed the socket");
    // The first daemon still answers there, and runs jobs.
    let id = first.submit(&["--", "echo", "still here"]);
    first.wait_state(&id, "succeeded");
    assert_eq!(stdout(&first.client(&["logs", &id])), "still here\n");

    // Something that answers without the lock (another program, an older orch): refused too,
    // named by the pid its socket's credentials give.
    let foreign = dir.join("foreign.sock");
    let listener = std::os::unix::net::UnixListener::bind(&foreign).unwrap();
    let out = serve_refused(&other, &foreign, None, &[]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains(&format!("pid {}", std::process::id())),
        "the pid of what answers: {err}"
    );
    assert!(foreign.exists(), "{err}");
    drop(listener);

    // kill -9 leaves a socket file nobody answers on: the next daemon, on another state
    // folder, takes the path over, and a restart of it keeps working.
    first.kill9();
    assert!(socket.exists());
    let mut second = Daemon::prepare("socket-c");
    second.socket = Some(socket.clone());
    second.restart();
    let id = second.submit(&["--", "echo", "second"]);
    second.wait_state(&id, "succeeded");
    second.kill9();
    second.restart();
    assert!(second.client(&["jobs"]).status.success());
    // A clean stop removes the socket it bound, and no other: one put in its place stays.
    std::fs::rename(&socket, dir.join("aside.sock")).unwrap();
    let replacement = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    stop(&mut second);
    assert!(
        socket.exists(),
        "a clean stop removed a socket it did not bind"
    );
    drop(replacement);
    second.restart();
    stop(&mut second);
    assert!(!socket.exists(), "a clean stop removes its own socket");
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&other);
}

/// Daemons that take the machine-wide lock (`machine_lock = true`, as every daemon of real GPUs
/// does) are one per machine: a second, on another state folder and socket, is refused with the
/// first's pid and socket. A sim daemon that takes no lock starts beside it.
#[test]
fn a_second_daemon_of_the_machines_devices_is_refused() {
    let dir = scratch("machine");
    let (config, lock, mut first) = machine_locked_daemon(&dir, "machine-a");
    let lock_var = lock.display().to_string();
    let other = scratch("machine-b");
    let out = serve_refused(
        &other,
        &other.join("orch.sock"),
        Some(&config),
        &[("ORCH_MACHINE_LOCK", &lock_var)],
    );
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("another orch serve owns this machine's devices")
            && err.contains(&format!("pid {}", pid_of(&first)))
            && err.contains(&first.socket().display().to_string()),
        "{err}"
    );
    assert!(!other.join("orch.sock").exists(), "{err}");
    // A daemon of simulated devices with no `machine_lock` takes no machine lock.
    let mut beside = Daemon::prepare("machine-c");
    beside.env.push(("ORCH_MACHINE_LOCK", lock_var.clone()));
    beside.restart();
    assert!(beside.client(&["jobs"]).status.success());
    assert!(first.client(&["jobs"]).status.success());
    // The lock dies with its daemon: after kill -9 the next one takes it.
    first.kill9();
    let mut next = Daemon::prepare("machine-d");
    next.config = Some(config);
    next.env.push(("ORCH_MACHINE_LOCK", lock_var));
    next.restart();
    assert!(next.client(&["jobs"]).status.success());
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&other);
}

/// A daemon's locks are its own (mode 0600): another user can neither open them to take the
/// lock in the gap of a restart nor start a daemon of the machine's devices beside it; that
/// user's daemon is refused with the holder's pid and told to submit to it or serve simulated or
/// CPU devices, never to take a private lock (which would exclude nobody).
#[test]
fn another_user_can_neither_hold_a_daemons_locks_nor_serve_its_devices() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    if !crate::serve::root_or_skip("another_user_can_neither_hold_a_daemons_locks") {
        return;
    }
    let user = crate::serve::test_user("orchtesta");
    let dir = scratch("locks-user");
    crate::serve::world_dir(&dir);
    let (config, lock, first) = machine_locked_daemon(&dir, "locks-root");
    let lock_var = lock.display().to_string();
    let mut socket_lock = first.socket().into_os_string();
    socket_lock.push(".lock");
    for file in [lock.clone(), PathBuf::from(socket_lock)] {
        let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{}", file.display());
        let out = Command::new("flock")
            .arg("-n")
            .arg(&file)
            .arg("true")
            .uid(user.0)
            .gid(user.1)
            .output()
            .unwrap();
        assert!(
            !out.status.success(),
            "{} opened by another user",
            file.display()
        );
    }
    let out = Command::new(env!("CARGO_BIN_EXE_orch"))
        .arg("serve")
        .arg("--socket")
        .arg(dir.join("user.sock"))
        .arg("--config")
        .arg(&config)
        .env("ORCH_STATE_DIR", dir.join("user-state"))
        .env("ORCH_DEVICES", lab_sim())
        .env("ORCH_MACHINE_LOCK", &lock_var)
        .env_remove("RUST_LOG")
        .current_dir(&dir)
        .uid(user.0)
        .gid(user.1)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("belong to the machine's daemon")
            && err.contains(&format!("pid {}", pid_of(&first)))
            && err.contains("--devices sim:")
            && !err.contains("ORCH_MACHINE_LOCK"),
        "{err}"
    );
    assert!(!dir.join("user.sock").exists(), "{err}");
    // A symbolic link planted where a socket's lock goes is not followed: the start is refused
    // and what it points at is untouched.
    let victim = dir.join("victim");
    std::fs::write(&victim, "precious\n").unwrap();
    let planted = scratch("locks-planted");
    std::os::unix::fs::symlink(&victim, planted.join("orch.sock.lock")).unwrap();
    let out = serve_refused(&planted, &planted.join("orch.sock"), None, &[]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("symbolic link"), "{err}");
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious\n");
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&planted);
}

fn job_ids(db: &Path) -> Vec<i64> {
    let conn = rusqlite::Connection::open(db).unwrap();
    let mut stmt = conn.prepare("SELECT id FROM jobs ORDER BY id").unwrap();
    stmt.query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

/// A backup taken from the running daemon (`VACUUM INTO`, as docs/OPERATIONS.md says), restored
/// after more jobs ran: the next job is numbered above every job folder, runs, is recorded
/// normally, and its logs are its own; the jobs the backup shows running or queued are recorded
/// from their folders, never run again. A clean stop leaves every job in jobs.sqlite3 alone.
#[test]
fn a_restored_backup_never_reuses_a_job_id() {
    let mut d = Daemon::start("restore");
    let db = d.state.join("jobs.sqlite3");
    for i in 1..=2 {
        let id = d.submit(&["--", "echo", &format!("before the backup {i}")]);
        d.wait_state(&id, "succeeded");
    }
    // At the backup, one job runs on every device and another waits for one.
    let holding = d.submit(&["--gpus", "8", "--", "sleep", "4"]);
    d.wait_state(&holding, "running");
    let waiting = d.submit(&["--gpus", "1", "--", "echo", "ran once"]);
    assert_eq!(d.status(&waiting)["state"], "queued");
    let backup = d.state.join("backup.sqlite3");
    rusqlite::Connection::open(&db)
        .unwrap()
        .execute("VACUUM INTO ?1", [backup.display().to_string()])
        .unwrap();
    d.wait_state(&waiting, "succeeded");
    let mut later = Vec::new();
    for i in 1..=3 {
        let id = d.submit(&["--", "echo", &format!("secret of a later job {i}")]);
        d.wait_state(&id, "succeeded");
        later.push(id.parse::<i64>().unwrap());
    }
    stop(&mut d);
    // A clean stop checkpoints the WAL: the database file alone holds every job.
    let wal = d.state.join("jobs.sqlite3-wal");
    assert!(
        std::fs::metadata(&wal).map_or(0, |m| m.len()) == 0,
        "the WAL still holds {} bytes after a clean stop",
        std::fs::metadata(&wal).unwrap().len()
    );
    assert!(
        d.log()
            .contains("the job database's write-ahead log went into jobs.sqlite3"),
        "{}",
        d.log()
    );
    let alone = d.state.join("alone.sqlite3");
    std::fs::copy(&db, &alone).unwrap();
    assert_eq!(job_ids(&alone), [1, 2, 3, 4, 5, 6, 7]);

    // Restore the older backup, as an admin would: the file, without its -wal and -shm.
    std::fs::copy(&backup, &db).unwrap();
    for extra in ["jobs.sqlite3-wal", "jobs.sqlite3-shm"] {
        let _ = std::fs::remove_file(d.state.join(extra));
    }
    assert_eq!(job_ids(&db), [1, 2, 3, 4]);
    d.restart();
    // What the backup shows running or queued ran since: each is recorded as it ended there,
    // and none runs again.
    assert_eq!(d.wait_state(&holding, "succeeded")["exit_code"], 0);
    let s = d.wait_state(&waiting, "succeeded");
    assert!(
        s["reason"]
            .as_str()
            .is_some_and(|r| r.contains("ran after the database's backup")),
        "{s}"
    );
    assert_eq!(stdout(&d.client(&["logs", &waiting])), "ran once\n");
    // Its end there is accounted for, as any end.
    assert!(s["accounting"].is_object(), "{s}");
    let id: i64 = d.submit(&["--", "echo", "mine"]).parse().unwrap();
    let highest = *later.iter().max().unwrap();
    assert!(id > highest, "job {id} reuses an id at or below {highest}");
    let s = d.wait_state(&id.to_string(), "succeeded");
    let (started, ended) = (
        s["started_at_ms"].as_u64().unwrap(),
        s["ended_at_ms"].as_u64().unwrap(),
    );
    assert!(ended >= started, "{s}");
    assert_eq!(s["exit_code"], 0, "{s}");
    assert_eq!(stdout(&d.client(&["logs", &id.to_string()])), "mine\n");
    assert_eq!(
        crate::serve::event_kinds(&s),
        ["queued", "started", "finished"],
        "{s}"
    );
    let log = d.log();
    assert!(
        log.contains("is older than its job folders")
            && log.contains(&format!("up to job {highest}")),
        "{log}"
    );
}

/// One job's charge, against the runtime the job measured itself (its first and last line: the
/// clock in nanoseconds).
struct Charge {
    id: String,
    charged_s: f64,
    runtime_s: f64,
    recorded_s: f64,
}

fn charge_of(d: &Daemon, id: &str) -> Charge {
    let s = d.wait_state(id, "succeeded");
    let out = stdout(&d.client(&["logs", id]));
    let clock: Vec<f64> = out
        .lines()
        .map(|l| l.trim().parse::<f64>().unwrap() / 1e9)
        .collect();
    assert_eq!(clock.len(), 2, "{out}");
    Charge {
        id: id.to_string(),
        charged_s: s["gpu_seconds"].as_f64().unwrap(),
        runtime_s: clock[1] - clock[0],
        recorded_s: (s["ended_at_ms"].as_u64().unwrap() - s["started_at_ms"].as_u64().unwrap())
            as f64
            / 1000.0,
    }
}

const TWO_SECONDS: [&str; 4] = ["--", "sh", "-c", "date +%s%N; sleep 2; date +%s%N"];

fn usage_of(d: &Daemon) -> f64 {
    let out = d.client(&["usage", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let all: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    all[0]["usage_gpu_seconds"].as_f64().unwrap()
}

/// Jobs that end while the daemon is stopped (SIGSTOP, then kill -9 and a restart) are charged to
/// the end their exit record gives, never to when the daemon noticed: each within 0.25 s of its
/// recorded runtime and within 2 s of the runtime the job measured itself (its `sh` starting
/// under load lies between the two), and the tenant's usage is their sum.
#[test]
fn usage_is_charged_to_each_jobs_recorded_end() {
    let mut d = Daemon::start("charge");
    let charges = |d: &Daemon, ids: &[String]| -> Vec<Charge> {
        ids.iter().map(|id| charge_of(d, id)).collect()
    };
    let start = |d: &Daemon, n: usize| -> Vec<String> {
        let ids: Vec<String> = (0..n).map(|_| d.submit(&TWO_SECONDS)).collect();
        for id in &ids {
            d.wait_state(id, "running");
        }
        ids
    };
    // Stopped for 8 s while four 2-second jobs end.
    let stalled = start(&d, 4);
    // SAFETY: kill(2) on the daemon this test started.
    unsafe {
        libc::kill(pid_of(&d) as i32, libc::SIGSTOP);
    }
    std::thread::sleep(Duration::from_secs(8));
    unsafe {
        libc::kill(pid_of(&d) as i32, libc::SIGCONT);
    }
    let mut all = charges(&d, &stalled);
    // Killed while two more end, restarted 6 s later.
    let restarted = start(&d, 2);
    d.kill9();
    std::thread::sleep(Duration::from_secs(6));
    d.restart();
    all.extend(charges(&d, &restarted));
    let mut sum = 0.0;
    for c in &all {
        eprintln!(
            "job {}: charged {:.3} GPU-s, ran {:.3} s (its own clock), {:.3} s recorded",
            c.id, c.charged_s, c.runtime_s, c.recorded_s
        );
        assert!(
            (c.charged_s - c.runtime_s).abs() < 2.0 && (c.charged_s - c.recorded_s).abs() < 0.25,
            "job {}: charged {} GPU-seconds for {} s of running ({} s recorded)",
            c.id,
            c.charged_s,
            c.runtime_s,
            c.recorded_s
        );
        sum += c.charged_s;
    }
    let usage = usage_of(&d);
    assert!(
        (usage - sum).abs() < 0.5,
        "the tenant is charged {usage} GPU-seconds for jobs that used {sum}"
    );
}

/// A daemon that accepts and never answers: a client gives up after ORCH_CLIENT_TIMEOUT with a
/// sentence naming the socket and what to check. Commands that wait by design wait on through
/// that bound, and say on stderr that they wait.
#[test]
fn clients_give_up_on_a_silent_daemon_and_waiting_commands_say_they_wait() {
    let dir = scratch("silent");
    let socket = dir.join("silent.sock");
    let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    listener.set_nonblocking(true).unwrap();
    let holder = std::thread::spawn(move || {
        // Accepts for 20 s at most, and answers nothing.
        let mut held = Vec::new();
        let until = Instant::now() + Duration::from_secs(20);
        while Instant::now() < until {
            if let Ok((stream, _)) = listener.accept() {
                held.push(stream);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    });
    let socket_text = socket.display().to_string();
    for args in [vec!["jobs"], vec!["status", "1"], vec!["wait", "1"]] {
        let started = Instant::now();
        let out = orch(
            &args,
            &[("ORCH_SERVER", &socket_text), ("ORCH_CLIENT_TIMEOUT", "1")],
        );
        let took = started.elapsed();
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(took < Duration::from_secs(5), "{args:?} took {took:?}");
        assert!(
            err.contains(&format!(
                "the orch daemon at {socket_text} did not answer within 1s"
            )) && err.contains("is running and not stopped or overloaded")
                && err.contains("ORCH_CLIENT_TIMEOUT"),
            "{args:?}: {err}"
        );
    }
    let out = orch(
        &["jobs"],
        &[
            ("ORCH_SERVER", &socket_text),
            ("ORCH_CLIENT_TIMEOUT", "soon"),
        ],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("ORCH_CLIENT_TIMEOUT=soon is not a duration"),
        "{}",
        stderr(&out)
    );

    // A real daemon and a job silent for longer than the bound: `wait` and `logs --follow` wait.
    // The bound is 5 s here (each of their requests must still be answered within it, on a
    // loaded machine too), and the jobs are silent for 8.
    let d = Daemon::start("patient");
    let id = d.submit(&["--", "sh", "-c", "sleep 8; echo done"]);
    let patient = |args: &[&str]| {
        orch(
            args,
            &[
                ("ORCH_SERVER", &d.socket().display().to_string()),
                ("ORCH_CLIENT_TIMEOUT", "5"),
            ],
        )
    };
    let out = patient(&["logs", "--follow", &id]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), "done\n");
    assert!(
        stderr(&out).contains(&format!(
            "orch: following job {id}'s stdout until the job ends"
        )),
        "{}",
        stderr(&out)
    );
    let id = d.submit(&["--", "sleep", "8"]);
    let out = patient(&["wait", &id]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains(&format!("orch: waiting for job {id} (")),
        "{}",
        stderr(&out)
    );
    holder.join().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
