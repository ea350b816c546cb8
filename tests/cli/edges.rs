//! The daemon and its clients at their edges, with real processes: hostile job names, a name
//! that got into the database before names were checked, a closed pipe, errors on stderr only,
//! a port another program holds, names in `serve.toml` this machine does not know, a queue
//! policy file that is not there, and a working folder the job's user cannot enter.

use crate::held_leases::http;
use crate::serve::{Daemon, as_user, job_file, root_or_skip, test_user, world_dir};
use crate::*;
use std::os::fd::FromRawFd;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The characters no job name may hold, as TOML escapes, with what the refusal names.
const HOSTILE: &[(&str, &str)] = &[
    ("\\u001b]0;owned\\u0007\\u001b[2J", "U+001B"),
    ("ring\\u0007", "U+0007"),
    ("row\\rforged", "U+000D"),
    ("two\\nlines", "U+000A"),
    ("nul\\u0000", "U+0000"),
    ("txt.\\u202Eexe", "U+202E"),
];

fn job_text(name: &str) -> String {
    format!("[job]\nname = \"{name}\"\n[command]\nargv = [\"true\"]\n")
}

/// Refused at submission, by `POST /v1/jobs` and `POST /v1/leases` alike, with a 400 and one
/// sentence naming the rule and the name's line:col; the CLI exits 2 with that sentence. A name
/// the quick form derives from a program is cleaned instead.
#[test]
fn hostile_job_names_are_refused_at_submission() {
    let d = Daemon::start("names");
    let long = "n".repeat(10_000);
    let mut cases: Vec<(&str, &str)> = HOSTILE.to_vec();
    cases.push((&long, "is 10000 characters long"));
    for (name, words) in &cases {
        for path in ["/v1/jobs", "/v1/leases"] {
            let body = serde_json::json!({
                "job_text": job_text(name),
                "job_path": "/tmp/hostile/job.toml",
                "cwd": "/tmp",
            });
            let (status, answer) = http(&d, "POST", path, &body);
            let error = answer["error"].as_str().unwrap_or_default();
            assert_eq!(status, 400, "{path} {name:.40}: {answer}");
            assert!(
                error.starts_with("/tmp/hostile/job.toml:2:8: [job] name ")
                    && error.contains(words)
                    && error.contains("at most 128 printable characters"),
                "{path}: {error}"
            );
            assert!(error.len() < 1000 && !error.contains(['\n', '\r', '\u{1b}', '\u{202e}']));
        }
    }
    let file = job_file(&d.state, "hostile.toml", &job_text(HOSTILE[0].0));
    let out = d.client(&["submit", &file]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("hostile.toml:2:8: [job] name holds the unprintable character U+001B")
            && err.trim().lines().count() == 1
            && !err.contains('\u{1b}'),
        "{err:?}"
    );
    assert_eq!(stdout(&out), "");
    let listed = stdout(&d.client(&["jobs", "--all", "--json"]));
    assert_eq!(listed.trim(), "[]", "nothing was accepted");

    // The quick form names the job after its program: cleaned, not refused.
    let out = d.client(&["submit", "--", "/bin/ev\u{1b}[2Jil\u{202e}"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let id = stdout(&out).trim().to_string();
    assert_eq!(d.wait_state(&id, "failed")["name"], "ev_[2Jil_");
}

/// A row written before names were checked (straight into the database here) prints escaped in
/// every human form: no escape reaches the terminal, every job stays one row. `--json` is JSON.
#[test]
fn a_name_from_an_older_database_prints_escaped() {
    let mut d = Daemon::prepare("older");
    let me = me();
    let config = d.state.join("serve.toml");
    // A tenant name an admin typed is shown escaped as well.
    std::fs::write(
        &config,
        format!("admins = [\"{me}\"]\n[[tenant]]\nname = \"lab\\u001b[31m\"\nusers = [\"{me}\"]\n"),
    )
    .unwrap();
    d.config = Some(config);
    d.restart();
    let id = d.submit(&["--", "true"]);
    d.wait_state(&id, "succeeded");
    let hostile = "x\u{1b}]0;owned\u{7}\u{1b}[2J\rforged row\nsecond\0\u{202e}gpj";
    let db = rusqlite::Connection::open(d.state.join("jobs.sqlite3")).unwrap();
    db.execute(
        "UPDATE jobs SET name = ?1, reason = ?1, user = ?1 WHERE id = ?2",
        rusqlite::params![hostile, id.parse::<i64>().unwrap()],
    )
    .unwrap();
    db.execute(
        "INSERT INTO events (job_id, at_ms, kind, message) VALUES (?1, 0, ?2, ?2)",
        rusqlite::params![id.parse::<i64>().unwrap(), hostile],
    )
    .unwrap();
    drop(db);
    let escaped = "x\\u{1b}]0;owned\\u{7}\\u{1b}[2J\\rforged row\\nsecond\\u{0}\\u{202e}gpj";
    let raw = ['\u{1b}', '\u{7}', '\r', '\0', '\u{202e}'];
    let jobs = d.client(&["jobs", "--all"]);
    assert!(jobs.status.success(), "{}", stderr(&jobs));
    let table = stdout(&jobs);
    assert!(!table.contains(raw), "{table:?}");
    assert_eq!(table.lines().count(), 2, "a header and one row: {table:?}");
    assert!(table.contains(escaped), "{table:?}");
    assert!(table.contains("lab\\u{1b}[31m"), "{table:?}");
    let status = d.client(&["status", &id]);
    assert!(status.status.success(), "{}", stderr(&status));
    let shown = stdout(&status);
    assert!(!shown.contains(raw), "{shown:?}");
    for line in ["job", "tenant", "reason"] {
        let found = shown.lines().find(|l| l.starts_with(line)).unwrap_or("");
        assert!(found.contains("\\u{1b}"), "{line}: {shown:?}");
    }
    assert!(
        shown
            .lines()
            .any(|l| l.contains(&format!("{escaped:<9} {escaped}"))),
        "the event: {shown:?}"
    );
    let usage = stdout(&d.client(&["usage"]));
    assert!(
        usage.contains("lab\\u{1b}[31m") && !usage.contains('\u{1b}'),
        "{usage:?}"
    );
    // JSON output stays JSON, the name in it whole.
    let json: serde_json::Value =
        serde_json::from_slice(&d.client(&["jobs", "--all", "--json"]).stdout).unwrap();
    assert_eq!(json[0]["name"], hostile);
}

/// A reader that goes away ends the client as it ends any Unix tool: SIGPIPE, no panic, never
/// exit status 101. Tried with a pipe whose reader is gone before orch writes, and through a
/// shell's `| head -1`.
#[test]
fn a_closed_pipe_ends_the_client_quietly() {
    let d = Daemon::start("pipe");
    let id = d.submit(&["--", "echo", "hello"]);
    d.wait_state(&id, "succeeded");
    let socket = d.socket().display().to_string();
    for args in [
        vec!["jobs", "--all"],
        vec!["status", &id],
        vec!["usage"],
        vec!["logs", &id],
        vec!["devices", "--devices", &lab_sim()],
    ] {
        let mut fds = [0; 2];
        // SAFETY: pipe(2) fills two descriptors we then own.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: the read end is ours; closing it leaves a pipe nobody reads.
        unsafe { libc::close(fds[0]) };
        // SAFETY: the write end is ours, handed to the child as its stdout.
        let write_end = unsafe { std::os::fd::OwnedFd::from_raw_fd(fds[1]) };
        let out = Command::new(env!("CARGO_BIN_EXE_orch"))
            .args(&args)
            .env("ORCH_SERVER", &socket)
            .stdout(Stdio::from(write_end))
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        let err = stderr(&out);
        assert_ne!(out.status.code(), Some(101), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert!(
            out.status.success() || out.status.signal() == Some(libc::SIGPIPE),
            "{args:?}: {:?} {err}",
            out.status
        );
    }
    let orch = env!("CARGO_BIN_EXE_orch");
    let out = Command::new("sh")
        .args([
            "-c",
            &format!(
                "'{orch}' jobs --all | head -1; '{orch}' jobs --all 2>&1 | head -c 1 >/dev/null"
            ),
        ])
        .env("ORCH_SERVER", &socket)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).starts_with("ID "), "{}", stdout(&out));
    assert!(!stderr(&out).contains("panicked"), "{}", stderr(&out));
}

/// An error answer is a sentence on stderr; stdout carries only what was asked for.
#[test]
fn errors_go_to_stderr_only() {
    let d = Daemon::start("stderr");
    for args in [
        vec!["logs", "424242"],
        vec!["logs", "--stderr", "424242"],
        vec!["status", "424242"],
        vec!["cancel", "424242"],
        vec!["wait", "424242"],
    ] {
        let out = d.client(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert_eq!(stdout(&out), "", "{args:?}");
        assert_eq!(
            stderr(&out),
            "orch: no job 424242 (orch jobs --all lists yours)\n",
            "{args:?}"
        );
    }
}

/// `orch serve ARGS` as a start that is expected to fail: its output, within `limit`.
fn serve_expecting_failure(state: &Path, config: &Path, limit: Duration) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_orch"));
    cmd.args(["serve", "--config"])
        .arg(config)
        .env("ORCH_STATE_DIR", state)
        .env("ORCH_DEVICES", lab_sim())
        .env_remove("RUST_LOG");
    crate::serve::serve_refusal(cmd, limit)
}

/// Socket files left in the state folder (the daemon's, or one bound beside it; its lock file,
/// `orch.sock.lock`, is no socket).
fn sockets_in(dir: &Path) -> Vec<String> {
    use std::os::unix::fs::FileTypeExt;
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_type().is_ok_and(|t| t.is_socket()))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("orch.sock"))
        .collect()
}

/// With the TCP port taken, the daemon binds its listeners first, announces none, exits 2 with
/// one sentence, and leaves no socket behind: neither its own nor a dead daemon's, which would
/// make clients wait 15 s for a daemon that is not coming.
#[test]
fn a_taken_port_fails_the_start_with_exit_2_and_no_socket() {
    let d = Daemon::prepare("port");
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = taken.local_addr().unwrap();
    let config = d.state.join("serve.toml");
    std::fs::write(
        &config,
        format!(
            "listen = \"{address}\"\nadmins = [\"{me}\"]\n[[tenant]]\nname = \"a\"\nusers = [\"{me}\"]\n",
            me = me()
        ),
    )
    .unwrap();
    // A dead daemon's socket: the file is there, nobody answers.
    drop(std::os::unix::net::UnixListener::bind(d.state.join("orch.sock")).unwrap());
    let out = serve_expecting_failure(&d.state, &config, Duration::from_secs(30));
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    let last = err.trim().lines().last().unwrap_or_default();
    assert!(
        last.starts_with(&format!(
            "orch: cannot listen on {address} (`listen` in {}",
            config.display()
        )) && last.contains("give `listen` another address"),
        "{err}"
    );
    assert!(
        !err.contains("listening on"),
        "nothing was announced: {err}"
    );
    assert_eq!(sockets_in(&d.state), Vec::<String>::new(), "{err}");
    // A client is told at once that no daemon answers.
    let started = Instant::now();
    let out = d.client(&["jobs"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("no orch daemon answers"),
        "{}",
        stderr(&out)
    );
    assert!(started.elapsed() < Duration::from_secs(5));
    drop(taken);
}

/// A queue policy file that is not there is an error at its line and column in `serve.toml`,
/// like the config's other errors; the start fails with exit 2 and no socket.
#[test]
fn a_missing_queue_policy_file_points_at_its_line() {
    let d = Daemon::prepare("queuefile");
    let config = d.state.join("serve.toml");
    std::fs::write(
        &config,
        format!(
            "admins = [\"{me}\"]\nqueue_policy = \"policies/missing.wasm\"\n[[tenant]]\nname = \"a\"\nusers = [\"{me}\"]\n",
            me = me()
        ),
    )
    .unwrap();
    let out = serve_expecting_failure(&d.state, &config, Duration::from_secs(60));
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains(&format!("orch: {}:2:16: ", config.display()))
            && err.contains(&d.state.join("policies/missing.wasm").display().to_string()),
        "{err}"
    );
    assert_eq!(sockets_in(&d.state), Vec::<String>::new(), "{err}");
}

/// Admins, users and groups `serve.toml` names that this machine does not know are each named in
/// a warning line at start; the daemon starts all the same.
#[test]
fn unknown_users_groups_and_admins_are_warned_about_at_start() {
    let mut d = Daemon::prepare("unknown");
    let config = d.state.join("serve.toml");
    std::fs::write(
        &config,
        format!(
            "admins = [\"{me}\", \"orch-no-such-admin\"]\n[[tenant]]\nname = \"a\"\nusers = [\"{me}\", \"orch-no-such-user\"]\ngroups = [\"orch-no-such-group\", \"root\"]\n",
            me = me()
        ),
    )
    .unwrap();
    d.config = Some(config.clone());
    d.restart();
    let log = d.log();
    let warning = |words: &str| log.lines().filter(|l| l.contains(words)).count();
    let at = config.display().to_string();
    assert_eq!(
        warning(&format!(
            "{at}: admin \"orch-no-such-admin\" is no user of this machine"
        )),
        1,
        "{log}"
    );
    assert_eq!(
        warning("tenant \"a\" lists user \"orch-no-such-user\", who is no user of this machine"),
        1,
        "{log}"
    );
    assert_eq!(
        warning("tenant \"a\" lists group \"orch-no-such-group\", which is no group"),
        1,
        "{log}"
    );
    assert_eq!(
        warning("no passwd entry") + warning("no group entry"),
        3,
        "{log}"
    );
    assert!(d.client(&["jobs"]).status.success());
}

/// As root, a job whose user may not enter the folder it was submitted from fails with that
/// reason; root's own job from the same folder runs (the folder is entered as the job's user).
#[test]
fn a_working_folder_the_user_cannot_enter_is_the_reason() {
    if !root_or_skip("a_working_folder_the_user_cannot_enter_is_the_reason") {
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    let alice = test_user("orchtesta");
    let mut d = Daemon::prepare("cwd");
    let public = std::env::temp_dir().join(format!("orch-cwd-public-{}", std::process::id()));
    world_dir(&public);
    let locked = public.join("root-only");
    std::fs::create_dir_all(&locked).unwrap();
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o700)).unwrap();
    let config = d.state.join("serve.toml");
    std::fs::write(
        &config,
        "admins = [\"root\"]\n[[tenant]]\nname = \"vision\"\nusers = [\"orchtesta\"]\n[[tenant]]\nname = \"ops\"\nusers = [\"root\"]\n",
    )
    .unwrap();
    d.config = Some(config);
    d.socket = Some(public.join("orch.sock"));
    d.restart();
    // As `sudo -u orchtesta orch submit` from root's folder: the client keeps a working folder
    // its user may not enter.
    let c_locked = std::ffi::CString::new(locked.as_os_str().as_encoded_bytes()).unwrap();
    let (uid, gid) = alice;
    let mut submit = Command::new(env!("CARGO_BIN_EXE_orch"));
    submit
        .args(["submit", "--", "true"])
        .env("ORCH_SERVER", d.socket());
    // SAFETY: only system calls between fork and exec, on data made before the fork.
    unsafe {
        submit.pre_exec(move || {
            if libc::chdir(c_locked.as_ptr()) != 0
                || libc::setgroups(0, std::ptr::null()) != 0
                || libc::setgid(gid) != 0
                || libc::setuid(uid) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let out = submit.output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let id = stdout(&out).trim().to_string();
    let job = d.wait_state(&id, "failed");
    let reason = job["reason"].as_str().unwrap_or_default();
    assert!(
        reason.starts_with(&format!(
            "cannot enter the working folder {} as user orchtesta",
            locked.display()
        )),
        "{job}"
    );
    assert!(!reason.contains("is it executable"), "{reason}");
    let out = as_user(alice, &d.socket(), &public, &["status", &id]);
    assert!(
        stdout(&out).contains("cannot enter the working folder"),
        "{}",
        stderr(&out)
    );
    // Root's own job from the same folder runs there.
    let out = Command::new(env!("CARGO_BIN_EXE_orch"))
        .args(["submit", "--", "pwd"])
        .current_dir(&locked)
        .env("ORCH_SERVER", d.socket())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let mine = stdout(&out).trim().to_string();
    d.wait_state(&mine, "succeeded");
    let logs = stdout(&d.client(&["logs", &mine]));
    assert_eq!(logs.trim(), locked.display().to_string());
}
