//! Policy components tenants send to `orch serve`: uploaded once by digest, compiled off the
//! scheduling thread within each tenant's budget and the compile caps, so that one tenant's
//! components hold up nobody else's jobs. Real processes: a daemon on the 8-GPU sim, `orch`
//! clients, and raw HTTP over the socket where the client has no command for it.
//!
//! The JavaScript tests build examples/policies/coolest-js (12 MB, seconds to compile) with
//! componentize-js, as tests/cli/languages.rs does, and skip without it unless
//! `ORCH_REQUIRE_GUEST_TOOLCHAINS` is set.

use crate::serve::{Daemon, job_file};
use crate::*;
use serde_json::Value;
use std::io::{Read, Write};
use std::time::{Duration, Instant};

/// One request over the daemon's socket: the status and the body.
pub fn http(d: &Daemon, method: &str, path: &str, body: &[u8]) -> (u16, String) {
    let mut s = std::os::unix::net::UnixStream::connect(d.socket()).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: orch\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .unwrap();
    s.write_all(body).unwrap();
    let mut answer = Vec::new();
    s.read_to_end(&mut answer).unwrap();
    let answer = String::from_utf8_lossy(&answer).into_owned();
    let status = answer.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = answer
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_string();
    (status, body)
}

/// The lowercase hex SHA-256 of `bytes`, as a component's address names it.
pub fn sha256(bytes: &[u8]) -> String {
    use sha2::Digest as _;
    sha2::Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// `wasm` with a custom section appended: another digest, the same component to wasmtime.
fn variant(wasm: &[u8], tag: &str, padding: usize) -> Vec<u8> {
    let name = format!("orch-test-{tag}");
    let mut payload = leb128(name.len() as u64);
    payload.extend_from_slice(name.as_bytes());
    payload.resize(payload.len() + padding, 0);
    let mut out = wasm.to_vec();
    out.push(0);
    out.extend(leb128(payload.len() as u64));
    out.extend(payload);
    out
}

fn leb128(mut n: u64) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let byte = (n & 0x7f) as u8;
        n >>= 7;
        if n == 0 {
            out.push(byte);
            return out;
        }
        out.push(byte | 0x80);
    }
}

/// The built-in `explicit` policy's component (chooses the devices `[policy.config] devices`
/// names): small and quick to compile.
fn explicit() -> Vec<u8> {
    std::fs::read(std::path::Path::new(orch_host::PLUGIN_WASM_DIR).join("explicit.wasm")).unwrap()
}

/// A daemon with `config` (tenants of this user) on a fresh state folder.
fn daemon(tag: &str, config: &str) -> Daemon {
    let mut d = Daemon::prepare(tag);
    let path = d.state.join("serve.toml");
    std::fs::write(&path, config).unwrap();
    d.config = Some(path);
    d.restart();
    d
}

/// A job file under the daemon's folder whose policy is `policy` (a file there).
fn policy_job(d: &Daemon, name: &str, tenant: &str, policy: &str, extra: &str) -> String {
    job_file(
        &d.state,
        &format!("{name}.toml"),
        &format!(
            "[job]\nname = \"{name}\"\ntenant = \"{tenant}\"\n[policy]\nplugin = \"{policy}\"\n{extra}[command]\nargv = [\"true\"]\n"
        ),
    )
}

fn uuid_of_device(d: &Daemon, index: usize) -> String {
    let devices: Value = serde_json::from_str(&stdout(&d.client(&["devices", "--json"]))).unwrap();
    devices[index]["uuid"].as_str().unwrap().to_string()
}

fn wait_ended(d: &Daemon, id: &str) -> Value {
    wait_ended_within(d, id, Duration::from_secs(120))
}

/// The job's status once it has ended; fails the test if it has not within `within`.
pub fn wait_ended_within(d: &Daemon, id: &str, within: Duration) -> Value {
    let deadline = Instant::now() + within;
    loop {
        let s = d.status(id);
        if ["succeeded", "failed", "cancelled", "lost"].contains(&s["state"].as_str().unwrap_or(""))
        {
            return s;
        }
        assert!(Instant::now() < deadline, "job {id} never ended: {s}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn policies_travel_by_digest_once_and_a_wrong_or_unknown_digest_is_one_sentence() {
    let me = me();
    let d = daemon(
        "plugins-digest",
        &format!("[[tenant]]\nname = \"lab\"\nusers = [\"{me}\"]\n"),
    );
    let wasm = variant(&explicit(), "digest", 0);
    let hex = sha256(&wasm);
    let address = format!("/v1/plugins/sha256:{hex}");

    let (status, body) = http(&d, "GET", &address, b"");
    assert_eq!(status, 404, "{body}");
    assert!(body.contains("has no policy component"), "{body}");
    let (status, body) = http(&d, "GET", "/v1/plugins/sha256:abc", b"");
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("64 hex digits"), "{body}");

    // Bytes that are not what the address names are refused, and not kept.
    let mut wrong = wasm.clone();
    wrong.push(0);
    let (status, body) = http(&d, "PUT", &address, &wrong);
    assert_eq!(status, 400, "{body}");
    assert!(
        body.contains(&format!("not the {hex} their address names")),
        "{body}"
    );
    assert_eq!(http(&d, "HEAD", &address, b"").0, 404);

    // A submission naming a component the daemon lacks.
    let job_text = "[job]\nname = \"by-digest\"\n[policy]\nplugin = \"mine.wasm\"\n[policy.config]\ndevices = \"3\"\n[command]\nargv = [\"true\"]\n";
    let submit = |digest: &str| {
        let body = serde_json::json!({
            "job_text": job_text, "job_path": d.state.join("j.toml"), "cwd": "/tmp", "env": [],
            "policy_digest": digest,
        });
        http(&d, "POST", "/v1/jobs", body.to_string().as_bytes())
    };
    let (status, body) = submit(&format!("sha256:{hex}"));
    assert_eq!(status, 400, "{body}");
    assert!(
        body.contains(&format!("has no policy component sha256:{hex}"))
            && body.contains("PUT /v1/plugins"),
        "{body}"
    );

    // Uploaded once (201), known after (200 for the same bytes); the job names the digest.
    let (status, body) = http(&d, "PUT", &address, &wasm);
    assert_eq!(status, 201, "{body}");
    let (status, body) = http(&d, "PUT", &address, &wasm);
    assert_eq!(status, 200, "{body}");
    let (status, body) = submit(&format!("sha256:{hex}"));
    assert_eq!(status, 201, "{body}");
    let id = serde_json::from_str::<Value>(&body).unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let s = wait_ended(&d, &id);
    assert_eq!(s["state"], "succeeded", "{s}");
    assert_eq!(s["devices"][0], uuid_of_device(&d, 3).as_str(), "{s}");
    let (status, body) = http(&d, "GET", &address, b"");
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["state"],
        "compiled"
    );

    // The old way still works: the bytes in the submission (base64).
    let inline = variant(&explicit(), "inline", 0);
    let body = serde_json::json!({
        "job_text": job_text, "job_path": d.state.join("j.toml"), "cwd": "/tmp", "env": [],
        "policy_wasm": base64_encode(&inline),
    });
    let (status, body) = http(&d, "POST", "/v1/jobs", body.to_string().as_bytes());
    assert_eq!(status, 201, "{body}");
    let id = serde_json::from_str::<Value>(&body).unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(wait_ended(&d, &id)["state"], "succeeded");

    // A kept copy a crash damaged (its bytes no longer have its digest): the compile finds it,
    // the job fails saying so, and the copy goes, so that the next upload replaces it.
    let damaged = sha256(&variant(&explicit(), "damaged", 0));
    let kept = d.state.join("plugins").join(format!("{damaged}.wasm"));
    std::fs::write(&kept, &wasm[..wasm.len() / 2]).unwrap();
    let (status, body) = submit(&format!("sha256:{damaged}"));
    assert_eq!(status, 201, "{body}");
    let id = serde_json::from_str::<Value>(&body).unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let s = wait_ended(&d, &id);
    assert_eq!(s["state"], "failed", "{s}");
    assert!(s["reason"].as_str().unwrap().contains("was damaged"), "{s}");
    assert!(!kept.exists());

    // `orch submit` uploads a 20 MB policy (over the 16 MiB a submission carries) once, then
    // names it; a second job of the same policy sends nothing but the digest.
    let big = variant(&explicit(), "big", 20 << 20);
    std::fs::write(d.state.join("big.wasm"), &big).unwrap();
    let file = policy_job(
        &d,
        "big",
        "lab",
        "big.wasm",
        "[policy.config]\ndevices = \"5\"\n",
    );
    let first = d.submit(&[&file]);
    let second = d.submit(&[&file]);
    for id in [&first, &second] {
        let s = wait_ended(&d, id);
        assert_eq!(s["state"], "succeeded", "{s}");
        assert_eq!(s["devices"][0], uuid_of_device(&d, 5).as_str(), "{s}");
    }
    let kept: Vec<String> = std::fs::read_dir(d.state.join("plugins"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".wasm"))
        .collect();
    assert_eq!(kept.len(), 3, "one file per component: {kept:?}");
    assert!(kept.contains(&format!("{}.wasm", sha256(&big))), "{kept:?}");
}

fn base64_encode(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

#[test]
fn past_its_compile_budget_a_tenants_submission_gets_429_with_the_sentence() {
    let me = me();
    let d = daemon(
        "plugins-budget",
        &format!(
            "[[tenant]]\nname = \"lab\"\nusers = [\"{me}\"]\ncompile_cpu = \"1ms\"\ncompile_window = \"1h\"\n[[tenant]]\nname = \"none\"\nusers = [\"{me}\"]\ncompile_concurrency = 0\n"
        ),
    );
    let config = "[policy.config]\ndevices = \"2\"\n";
    let write = |name: &str, tag: &str| {
        std::fs::write(d.state.join(name), variant(&explicit(), tag, 0)).unwrap();
    };
    write("one.wasm", "budget-one");
    write("two.wasm", "budget-two");
    let one = d.submit(&[&policy_job(&d, "one", "lab", "one.wasm", config)]);
    assert_eq!(wait_ended(&d, &one)["state"], "succeeded");

    // Its first compile spent more than 1 ms of CPU: a new component is refused, saying which
    // budget and when it frees up.
    let out = d.client(&["submit", &policy_job(&d, "two", "lab", "two.wasm", config)]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let e = stderr(&out);
    assert!(
        e.contains("tenant lab used")
            && e.contains("compile_cpu = 1ms per compile_window = 1h")
            && e.contains("frees up in"),
        "{e}"
    );
    // A component compiled already costs nothing.
    let again = d.submit(&[&policy_job(&d, "one-again", "lab", "one.wasm", config)]);
    assert_eq!(wait_ended(&d, &again)["state"], "succeeded");
    // A tenant that may compile nothing.
    let out = d.client(&[
        "submit",
        &policy_job(&d, "three", "none", "two.wasm", config),
    ]);
    assert!(
        stderr(&out).contains("compile_concurrency = 0"),
        "{}",
        stderr(&out)
    );
    // The raw answer is a 429.
    let hex = sha256(&std::fs::read(d.state.join("two.wasm")).unwrap());
    let body = serde_json::json!({
        "job_text": "[job]\nname = \"x\"\ntenant = \"lab\"\n[policy]\nplugin = \"two.wasm\"\n[command]\nargv = [\"true\"]\n",
        "job_path": d.state.join("x.toml"), "cwd": "/tmp", "env": [],
        "policy_digest": format!("sha256:{hex}"),
    });
    let (status, body) = http(&d, "POST", "/v1/jobs", body.to_string().as_bytes());
    assert_eq!(status, 429, "{body}");
}

#[test]
fn a_component_over_the_compile_memory_cap_fails_its_job_with_the_sentence() {
    let me = me();
    let d = daemon(
        "plugins-memory-cap",
        &format!("[compile]\nmemory = \"1MiB\"\n[[tenant]]\nname = \"lab\"\nusers = [\"{me}\"]\n"),
    );
    std::fs::write(
        d.state.join("p.wasm"),
        variant(&explicit(), "memory-cap", 0),
    )
    .unwrap();
    let id = d.submit(&[&policy_job(&d, "capped", "lab", "p.wasm", "")]);
    let s = wait_ended(&d, &id);
    assert_eq!(s["state"], "failed", "{s}");
    let reason = s["reason"].as_str().unwrap_or("");
    assert!(
        reason.contains("compile memory cap of 1.0 MiB") && reason.contains("[compile] memory"),
        "{reason}"
    );
    // Not a component at all: its job fails saying so, and the daemon serves on.
    std::fs::write(d.state.join("junk.wasm"), b"\0asm\x0d\0\x01\0junk").unwrap();
    let id = d.submit(&[&policy_job(&d, "junk", "lab", "junk.wasm", "")]);
    let s = wait_ended(&d, &id);
    assert_eq!(s["state"], "failed", "{s}");
    assert!(
        s["reason"]
            .as_str()
            .unwrap_or("")
            .contains("does not compile"),
        "{s}"
    );
    let plain = d.submit(&["--gpus", "1", "--", "true"]);
    assert_eq!(wait_ended(&d, &plain)["state"], "succeeded");
}

/// The job-file lines that give the JavaScript policy room in a debug build.
const JS_LIMITS: &str = "deadline = \"1s\"\nmemory = \"128MiB\"\n";

/// The JavaScript `coolest`, with a tag of its own (another digest).
fn js_variant(test: &str, d: &Daemon, tag: &str) -> Option<String> {
    let wasm = std::fs::read(crate::languages::coolest_js(test)?).unwrap();
    let name = format!("coolest-{tag}.wasm");
    std::fs::write(d.state.join(&name), variant(&wasm, tag, 0)).unwrap();
    Some(name)
}

#[test]
fn a_job_says_it_waits_compiling_its_policy_then_runs_with_it() {
    let _heavy = heavy();
    let me = me();
    let d = daemon(
        "plugins-js-wait",
        &format!("[[tenant]]\nname = \"lab\"\nusers = [\"{me}\"]\n"),
    );
    let Some(policy) = js_variant("a_job_says_it_waits_compiling", &d, "wait") else {
        return;
    };
    let file = policy_job(&d, "js", "lab", &policy, JS_LIMITS);
    let id = d.submit(&[&file]);
    let mut reasons = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    let s = loop {
        let s = d.status(&id);
        if s["state"] != "queued" {
            break s;
        }
        reasons.push(s["reason"].as_str().unwrap_or("").to_string());
        assert!(Instant::now() < deadline, "never started: {s}");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(
        reasons
            .iter()
            .any(|r| r.starts_with("waiting: compiling its policy (12.")),
        "{reasons:?}"
    );
    let jobs = stdout(&d.client(&["jobs"]));
    eprintln!("{jobs}");
    let s = if s["state"] == "running" {
        wait_ended(&d, &id)
    } else {
        s
    };
    assert_eq!(s["state"], "succeeded", "{s}");
    // The JavaScript coolest chooses device 4 of the lab sim for one GPU (languages.rs).
    assert_eq!(s["devices"][0], uuid_of_device(&d, 4).as_str(), "{s}");
}

#[test]
fn a_component_over_the_compile_time_cap_fails_its_job_with_the_sentence() {
    let _heavy = heavy();
    let me = me();
    let d = daemon(
        "plugins-js-cpu",
        &format!("[compile]\ncpu = \"1s\"\n[[tenant]]\nname = \"lab\"\nusers = [\"{me}\"]\n"),
    );
    let Some(policy) = js_variant("a_component_over_the_compile_time_cap", &d, "cpu") else {
        return;
    };
    let id = d.submit(&[&policy_job(&d, "slow", "lab", &policy, JS_LIMITS)]);
    let s = wait_ended(&d, &id);
    assert_eq!(s["state"], "failed", "{s}");
    let reason = s["reason"].as_str().unwrap_or("");
    assert!(
        reason.contains("compile time cap of 1 CPU-s") && reason.contains("[compile] cpu"),
        "{reason}"
    );
}

/// p-th percentile (0..=100) of sorted values.
fn percentile(sorted: &[f64], p: f64) -> f64 {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Submit-to-start of the plain jobs `ids`, milliseconds, sorted.
fn latencies(d: &Daemon, ids: &[String]) -> Vec<f64> {
    let (status, body) = http(d, "GET", "/v1/jobs?all=true", b"");
    assert_eq!(status, 200, "{body}");
    let rows: Vec<Value> = serde_json::from_str(&body).unwrap();
    let mut out: Vec<f64> = rows
        .iter()
        .filter(|r| ids.iter().any(|id| r["id"] == id.as_str()))
        .map(|r| {
            let submitted = r["submitted_at_ms"].as_f64().unwrap();
            let started = r["started_at_ms"].as_f64().unwrap_or(f64::INFINITY);
            started - submitted
        })
        .collect();
    assert_eq!(out.len(), ids.len());
    out.sort_by(f64::total_cmp);
    out
}

/// Submits plain one-GPU jobs of tenant `plain`, a steady stream of about five a second, until
/// `done` says so (at most `max` of them); their ids.
fn plain_jobs(d: &Daemon, max: usize, done: &dyn Fn() -> bool) -> Vec<String> {
    let mut ids = Vec::new();
    while ids.len() < max && !done() {
        let next = Instant::now() + Duration::from_millis(200);
        ids.push(d.submit(&["--tenant", "plain", "--gpus", "1", "--", "true"]));
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
    }
    for id in &ids {
        wait_ended(d, id);
    }
    ids
}

#[test]
fn a_tenant_streaming_components_does_not_hold_up_another_tenants_plain_jobs() {
    let _heavy = heavy();
    let me = me();
    let d = daemon(
        "plugins-stream",
        &format!(
            "[[tenant]]\nname = \"stream\"\nusers = [\"{me}\"]\ncompile_cpu = \"1h\"\ncompile_window = \"1h\"\n[[tenant]]\nname = \"plain\"\nusers = [\"{me}\"]\n"
        ),
    );
    let test = "a_tenant_streaming_components";
    // Distinct components: the same policy, each with a tag of its own.
    const STREAM: usize = 2;
    let mut files = Vec::new();
    for k in 0..STREAM {
        let Some(policy) = js_variant(test, &d, &format!("stream-{k}")) else {
            return;
        };
        files.push(policy_job(
            &d,
            &format!("js-{k}"),
            "stream",
            &policy,
            JS_LIMITS,
        ));
    }

    // The plain jobs alone, for comparison.
    let before = latencies(&d, &plain_jobs(&d, 30, &|| false));

    // The stream: each next component as soon as the budget (one compile at a time) lets it.
    let streaming = std::sync::atomic::AtomicBool::new(true);
    let started = Instant::now();
    let (during, stream_ids, refused) = std::thread::scope(|s| {
        let stream = s.spawn(|| {
            // Until job `id` has left the queue (its policy compiled).
            let compiled = |id: &str| {
                while d.status(id)["state"] == "queued" {
                    assert!(
                        started.elapsed() < Duration::from_secs(240),
                        "the stream took too long"
                    );
                    std::thread::sleep(Duration::from_millis(250));
                }
            };
            let mut ids: Vec<String> = Vec::new();
            let mut refused = 0;
            for file in &files {
                loop {
                    let out = d.client(&["submit", file]);
                    if out.status.success() {
                        ids.push(stdout(&out).trim().to_string());
                        break;
                    }
                    // Past its budget of one compile at a time: the next one once this is done.
                    let e = stderr(&out);
                    assert!(e.contains("compile_concurrency = 1"), "{e}");
                    refused += 1;
                    compiled(ids.last().expect("the first submission is accepted"));
                }
            }
            compiled(ids.last().unwrap());
            streaming.store(false, std::sync::atomic::Ordering::Relaxed);
            (ids, refused)
        });
        let during = plain_jobs(&d, 200, &|| {
            !streaming.load(std::sync::atomic::Ordering::Relaxed)
                || started.elapsed() > Duration::from_secs(240)
        });
        let (ids, refused) = stream.join().unwrap();
        (during, ids, refused)
    });
    let streamed_for = started.elapsed();
    for id in &stream_ids {
        let s = wait_ended(&d, id);
        assert_eq!(s["state"], "succeeded", "{s}");
    }
    assert!(
        refused >= 1,
        "the next component was refused while one compiled"
    );
    let during = latencies(&d, &during);
    // The plain jobs alone again: how loaded the machine itself is.
    let after = latencies(&d, &plain_jobs(&d, 30, &|| false));
    let show = |l: &[f64]| {
        format!(
            "{} jobs, p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
            l.len(),
            percentile(l, 50.0),
            percentile(l, 99.0),
            l[l.len() - 1]
        )
    };
    eprintln!(
        "plain jobs alone: {}, and after: {}; while tenant stream sent {STREAM} distinct 12 MB JavaScript components over {:.1} s ({refused} submission(s) refused with 429 while one compiled): {}",
        show(&before),
        show(&after),
        streamed_for.as_secs_f64(),
        show(&during)
    );
    assert!(during.len() >= 20, "too few plain jobs: {}", show(&during));
    // The goal is 100 ms. A machine so loaded that plain jobs alone miss 50 ms cannot show it;
    // there the stream may add no more than 100 ms to what the machine does anyway (a compile
    // on the scheduling thread held them up by tens of seconds).
    let noise = percentile(&before, 99.0).max(percentile(&after, 99.0));
    let limit = if noise <= 50.0 { 100.0 } else { noise + 100.0 };
    if noise > 50.0 {
        eprintln!(
            "this machine is loaded (plain jobs alone: p99 {noise:.0} ms): allowing p99 {limit:.0} ms"
        );
    }
    assert!(
        percentile(&during, 99.0) <= limit,
        "plain jobs were held up: {}",
        show(&during)
    );
}
