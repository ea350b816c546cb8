//! What one tenant can do to the others through the daemon's shared parts, with real processes:
//! a job that prints far more than its state folder holds (a real tmpfs), another tenant's views
//! of a job it may not see (its name, its lease's id), and requests at the API's edges (unknown
//! fields, NUL bytes, over-long arguments, what hyper answers before the API sees a request).

use crate::serve::{Daemon, as_user, root_or_skip, test_user, two_tenants};
use crate::*;
use std::io::{Read, Write};
use std::process::Command;
use std::time::{Duration, Instant};

/// Mounts a tmpfs of `size` on `dir` (root only); unmounted on drop.
struct Tmpfs(std::path::PathBuf);

impl Tmpfs {
    fn mount(dir: &std::path::Path, size: &str) -> Tmpfs {
        std::fs::create_dir_all(dir).unwrap();
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .output()
            .unwrap();
        assert!(out.status.success(), "mount: {}", stderr(&out));
        Tmpfs(dir.to_path_buf())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).output();
    }
}

fn submitted(out: &std::process::Output) -> String {
    assert!(out.status.success(), "submit: {}", stderr(out));
    stdout(out).trim().to_string()
}

/// A job printing ~200 MB into a 64 MiB state folder: the folder keeps room for the daemon's
/// records, so another tenant's submission is accepted and its job runs meanwhile; the chatty job
/// is recorded as ended when its processes end (its GPU freed), and its log holds the newest
/// output under a line saying how much earlier output was dropped.
#[test]
fn a_chatty_job_keeps_its_newest_output_and_leaves_the_state_folder_to_the_others() {
    if !root_or_skip("a_chatty_job") {
        return;
    }
    let alice = test_user("orchtesta");
    let bob = test_user("orchtestb");
    let mut mount = None;
    let (d, public) = two_tenants("chatty", |d| {
        mount = Some(Tmpfs::mount(&d.state, "64m"));
    });
    let socket = d.socket();
    let started = Instant::now();
    // Two bursts of 100 MB, each followed by a pause, then a last line.
    let chatty = submitted(&as_user(
        alice,
        &socket,
        &public,
        &[
            "submit",
            "--gpus",
            "1",
            "--",
            "sh",
            "-c",
            "for i in 1 2; do yes chatty-line-of-output | head -c 100000000; touch burst-$i; sleep 3; done; echo THE-END",
        ],
    ));
    d.wait_state(&chatty, "running");
    // Once its first burst is out (it has filled the folder, or been capped), the other tenant
    // submits, and its job runs.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !public.join("burst-1").exists() {
        assert!(
            Instant::now() < deadline,
            "the first burst never ended: {}",
            d.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let other = submitted(&as_user(
        bob,
        &socket,
        &public,
        &["submit", "--gpus", "1", "--", "echo", "bob-ran"],
    ));
    let out = as_user(bob, &socket, &public, &["wait", &other]);
    assert!(out.status.success(), "{}: {}", stderr(&out), d.log());
    assert_eq!(
        stdout(&as_user(bob, &socket, &public, &["logs", &other])),
        "bob-ran\n"
    );
    assert_eq!(
        d.status(&chatty)["state"],
        "running",
        "the other job ran while the chatty one printed"
    );

    // The chatty job ends, is recorded as ended, and its GPU is free.
    let out = as_user(alice, &socket, &public, &["wait", &chatty]);
    assert!(out.status.success(), "{}: {}", stderr(&out), d.log());
    assert!(
        started.elapsed() < Duration::from_secs(90),
        "{:?}",
        started.elapsed()
    );
    d.wait_no_leases();
    let logs = as_user(alice, &socket, &public, &["logs", &chatty]);
    assert!(logs.status.success(), "{}", stderr(&logs));
    let text = stdout(&logs);
    let (first, rest) = text.split_once('\n').unwrap();
    assert!(
        first.starts_with("[orch] ")
            && first.contains("bytes (")
            && first.contains(
                "of earlier output were dropped: a job keeps at most max_log_size = 64.0 MiB"
            ),
        "{first}"
    );
    assert!(
        rest.ends_with("THE-END\n") && rest.contains("\nchatty-line-of-output\n"),
        "the newest output is kept: {:?}",
        &rest[rest.len().saturating_sub(100)..]
    );
    // Kept plus dropped is all it printed; what is kept fits the cap.
    let dropped: u64 = first
        .strip_prefix("[orch] ")
        .and_then(|t| t.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap();
    assert_eq!(dropped + rest.len() as u64, 200_000_000 + 8, "{first}");
    assert!(rest.len() as u64 <= 64 << 20, "{}", rest.len());
    let log = d.log();
    assert!(!log.contains("is full"), "{log}");
    drop(d);
    drop(mount);
}

/// The same text in a tenant's every view of the machine, as raw bodies and CLI output.
fn bobs_views(bob: (u32, u32), socket: &std::path::Path, public: &std::path::Path) -> String {
    const VIEWS: &str = r#"
import json, socket, sys
def call(method, path, body=None):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(30)
    s.connect(sys.argv[1])
    data = json.dumps(body).encode() if body is not None else b""
    s.sendall(f"{method} {path} HTTP/1.1\r\nHost: orch\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode() + data)
    out = b""
    while True:
        chunk = s.recv(65536)
        if not chunk:
            break
        out += chunk
    return out.decode(errors="replace")
for path in ["/v1/leases", "/v1/devices", "/v1/jobs?all=true&events=true", "/v1/jobs?events=true&all=true&recent=20", "/v1/tenants", "/v1/whoami", "/metrics", "/"]:
    print(call("GET", path))
# A lease of its own, placed beside the other tenant's job: what it was told of the devices
# it did not get.
job = "[job]\nname = \"mine\"\n[resources]\ngpus = 1\n[command]\nargv = [\"python3\"]\n"
answer = call("POST", "/v1/leases", {"job_text": job, "job_path": sys.argv[2] + "/lease.toml", "cwd": sys.argv[2]})
print(answer)
body = answer.split("\r\n\r\n", 1)[1]
print(call("GET", "/v1/leases/" + json.loads(body)["job_id"]))
print(call("GET", "/v1/leases"))
"#;
    use std::os::unix::process::CommandExt;
    let out = Command::new("python3")
        .args(["-c", VIEWS])
        .arg(socket)
        .arg(public)
        .current_dir(public)
        .uid(bob.0)
        .gid(bob.1)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let mut all = stdout(&out);
    assert!(
        all.contains("\"lease_id\"") && all.contains("held exclusively"),
        "the lease was placed beside the other job: {all}"
    );
    for args in [
        vec!["leases"],
        vec!["leases", "--json"],
        vec!["jobs", "--all"],
        vec!["jobs", "--all", "--json"],
        vec!["devices"],
        vec!["usage"],
    ] {
        let out = as_user(bob, socket, public, &args);
        all.push_str(&stdout(&out));
        all.push_str(&stderr(&out));
    }
    all
}

/// Another tenant's job name reaches no view of a tenant that may not see the job: not through
/// the lease's id (`orch leases`, `GET /v1/leases`), nor the reasons placement gives its own lease
/// for the devices it did not get, nor the devices, jobs, page data or metrics.
#[test]
fn another_tenants_job_name_is_in_none_of_a_tenants_views() {
    if !root_or_skip("another_tenants_job_name") {
        return;
    }
    let alice = test_user("orchtesta");
    let bob = test_user("orchtestb");
    let (d, public) = two_tenants("opaque", |_| {});
    let socket = d.socket();
    let secret = "acquisition-of-initech-model";
    let file = public.join("secret.toml");
    std::fs::write(
        &file,
        format!("[job]\nname = \"{secret}\"\n[resources]\ngpus = 4\n[command]\nargv = [\"sleep\", \"60\"]\n"),
    )
    .unwrap();
    let id = submitted(&as_user(
        alice,
        &socket,
        &public,
        &["submit", &file.display().to_string()],
    ));
    d.wait_state(&id, "running");
    // Its own tenant (and the admin) read the name where it is shown.
    let own = stdout(&as_user(alice, &socket, &public, &["leases", "--json"]));
    assert!(own.contains(secret), "{own}");

    let views = bobs_views(bob, &socket, &public);
    let leaked: Vec<&str> = views.lines().filter(|l| l.contains(secret)).collect();
    assert!(leaked.is_empty(), "the job's name leaked: {leaked:?}");
    assert!(
        views.contains("(another tenant's job)") && views.contains("\"id\":\"lease-"),
        "the lease is listed, hidden: {views}"
    );
    assert!(d.client(&["cancel", &id]).status.success());
    d.wait_state(&id, "cancelled");
}

/// One raw request over the socket: the status and the body (the answer is read to its end).
fn raw(d: &Daemon, request: &[u8]) -> (u16, String) {
    let mut stream = std::os::unix::net::UnixStream::connect(d.socket()).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let _ = stream.write_all(request);
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    let answer = String::from_utf8_lossy(&answer).into_owned();
    let status = answer
        .get(9..12)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no answer: {answer:?}"));
    let body = answer
        .split_once("\r\n\r\n")
        .map_or(String::new(), |(_, b)| b.to_string());
    (status, body)
}

fn post(path: &str, body: &str) -> Vec<u8> {
    format!(
        "POST {path} HTTP/1.1\r\nHost: orch\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// The answer is `{"error": SENTENCE}` with this status; the sentence, returned.
fn refused(d: &Daemon, request: &[u8], status: u16) -> String {
    let (got, body) = raw(d, request);
    let json: serde_json::Value = serde_json::from_str(&body)
        .unwrap_or_else(|e| panic!("status {got}: the body is not JSON ({e}): {body:?}"));
    assert_eq!(got, status, "{body}");
    let error = json["error"].as_str().unwrap_or_default().to_string();
    assert!(
        !error.is_empty() && !error.contains('\n') && error.len() < 1000,
        "{error:?}"
    );
    error
}

fn submission(job_text: &str, cwd: &str, env: serde_json::Value) -> String {
    serde_json::json!({
        "job_text": job_text,
        "job_path": "/tmp/edges/job.toml",
        "cwd": cwd,
        "env": env,
    })
    .to_string()
}

/// A job submission (`job_text` from `cwd` with the client's `env`) the daemon refuses with 400:
/// its error.
fn refused_job(d: &Daemon, job_text: &str, cwd: &str, env: serde_json::Value) -> String {
    refused(d, &post("/v1/jobs", &submission(job_text, cwd, env)), 400)
}

/// Unknown fields, NUL bytes and over-long command lines are refused at submission with a
/// sentence; every error, hyper's own 400 and 431 included, is the daemon's JSON shape.
#[test]
fn the_apis_edges_answer_one_json_sentence() {
    let d = Daemon::start("api-edges");
    let job = "[job]\nname = \"e\"\n[command]\nargv = [\"true\"]\n";

    // Unknown fields, named; a known one still works.
    let mut body: serde_json::Value =
        serde_json::from_str(&submission(job, "/tmp", serde_json::json!([]))).unwrap();
    body["wiat"] = true.into();
    for path in ["/v1/jobs", "/v1/leases"] {
        let error = refused(&d, &post(path, &body.to_string()), 400);
        assert!(error.contains("unknown field \"wiat\""), "{path}: {error}");
    }

    // NUL bytes in the argv, the job's env, the client's env, the working folder.
    let nul_argv = "[job]\nname = \"e\"\n[command]\nargv = [\"echo\", \"a\\u0000b\"]\n";
    let error = refused_job(&d, nul_argv, "/tmp", serde_json::json!([]));
    assert!(
        error.contains("argv[1]") && error.contains("NUL byte"),
        "{error}"
    );
    let nul_env = "[job]\nname = \"e\"\n[command]\nargv = [\"true\"]\nenv = { A = \"x\\u0000\" }\n";
    let error = refused_job(&d, nul_env, "/tmp", serde_json::json!([]));
    assert!(
        error.contains("[command] env variable \"A\" holds a NUL byte"),
        "{error}"
    );
    let error = refused_job(&d, job, "/tmp", serde_json::json!([["HOME", "/x\u{0}y"]]));
    assert!(
        error.contains("variable \"HOME\" holds a NUL byte"),
        "{error}"
    );
    let error = refused_job(&d, job, "/tm\u{0}p", serde_json::json!([]));
    assert!(
        error.contains("the working folder") && error.contains("NUL byte"),
        "{error}"
    );

    // A 1 MB argument; arguments and environment over 1 MiB together.
    let long = format!(
        "[job]\nname = \"e\"\n[command]\nargv = [\"echo\", \"{}\"]\n",
        "x".repeat(1_000_000)
    );
    let error = refused_job(&d, &long, "/tmp", serde_json::json!([]));
    assert!(
        error.contains("argv[1] is 1000000 bytes long") && error.contains("131071"),
        "{error}"
    );
    let env: Vec<(String, String)> = (0..10)
        .map(|i| (format!("V{i}"), "y".repeat(120_000)))
        .collect();
    let error = refused_job(&d, job, "/tmp", serde_json::json!(env));
    assert!(
        error.contains("bytes together; at most 1048576 bytes"),
        "{error}"
    );
    let listed = stdout(&d.client(&["jobs", "--all", "--json"]));
    assert_eq!(listed.trim(), "[]", "nothing was accepted");

    // What hyper answers itself, and what axum's extractors refuse.
    let error = refused(&d, b"GARBAGE\r\n\r\n", 400);
    assert!(error.contains("could not be read as HTTP/1.1"), "{error}");
    let error = refused(
        &d,
        b"GET /v1/jobs HTTP/1.1\r\nHost: orch\r\nBad Header\r\n\r\n",
        400,
    );
    assert!(error.contains("could not be read as HTTP/1.1"), "{error}");
    let many: String = (0..150).map(|i| format!("X-H{i}: v\r\n")).collect();
    let request = format!("GET /v1/jobs HTTP/1.1\r\nHost: orch\r\n{many}Connection: close\r\n\r\n");
    let error = refused(&d, request.as_bytes(), 431);
    assert!(error.contains("headers are too large"), "{error}");
    // Far past hyper's read buffer (about 400 KB, which one read may overshoot when the whole
    // head already waits in the socket): the head can never be read whole.
    let request = format!(
        "GET /v1/jobs HTTP/1.1\r\nHost: orch\r\nX-Big: {}\r\nConnection: close\r\n\r\n",
        "z".repeat(4_000_000)
    );
    let error = refused(&d, request.as_bytes(), 431);
    assert!(error.contains("headers are too large"), "{error}");
    let request = "POST /v1/jobs HTTP/1.1\r\nHost: orch\r\nContent-Type: application/json\r\nContent-Length: 999999999\r\nConnection: close\r\n\r\n{";
    refused(&d, request.as_bytes(), 413);
    refused(&d, &post("/v1/jobs", "{not json"), 400);
    refused(
        &d,
        b"GET /v1/jobs?limit=many HTTP/1.1\r\nHost: orch\r\nConnection: close\r\n\r\n",
        400,
    );

    let error = refused(
        &d,
        b"DELETE /v1/jobs HTTP/1.1\r\nHost: orch\r\nConnection: close\r\n\r\n",
        405,
    );
    assert!(error.contains("does not take that method"), "{error}");

    // The daemon is still fine.
    let out = d.client(&["submit", "--", "true"]);
    let id = submitted(&out);
    d.wait_state(&id, "succeeded");
}

/// A followed log goes on across rotations: a reader that keeps up misses nothing, and a later
/// `orch logs` keeps the newest output under the line saying how much went.
#[test]
fn a_followed_log_goes_on_across_rotations() {
    let mut d = Daemon::prepare("follow-rotate");
    let config = d.state.join("serve.toml");
    std::fs::write(
        &config,
        format!(
            "max_log_size = \"16KiB\"\n[[tenant]]\nname = \"me\"\nusers = [\"{}\"]\n",
            me()
        ),
    )
    .unwrap();
    d.config = Some(config);
    d.restart();
    // 1,500 lines of 50 bytes, 100 at a time every 0.2 s: a rotation (8 KiB) every ~0.3 s.
    let script = "i=1; while [ $i -le 1500 ]; do printf 'line-%05d-xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\\n' $i; \
                  [ $((i % 100)) -eq 0 ] && sleep 0.2; i=$((i + 1)); done";
    let id = d.submit(&["--", "sh", "-c", script]);
    let followed = d.client(&["logs", "--follow", &id]);
    assert!(followed.status.success(), "{}", stderr(&followed));
    let expected: String = (1..=1500)
        .map(|i| format!("line-{i:05}-xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\n"))
        .collect();
    let text = stdout(&followed);
    // The follower may start after the first rotation: then it is told, and the rest is whole.
    let body = match text.split_once('\n') {
        Some((first, rest)) if first.starts_with("[orch] ") => rest.to_string(),
        _ => text.clone(),
    };
    assert!(
        expected.ends_with(&body) && body.len() > 60_000,
        "the followed log is the job's output: {} bytes, starting {:?}",
        body.len(),
        &body[..body.len().min(200)]
    );
    assert_eq!(d.status(&id)["state"], "succeeded");
    let later = stdout(&d.client(&["logs", &id]));
    let (first, rest) = later.split_once('\n').unwrap();
    assert!(
        first.contains(
            "of earlier output were dropped: a job keeps at most max_log_size = 16.0 KiB"
        ),
        "{first}"
    );
    assert!(
        rest.len() <= 16 << 10 && rest.len() >= 8 << 10,
        "{}",
        rest.len()
    );
    assert!(
        expected.ends_with(rest),
        "the newest output, whole lines or not"
    );
}
