//! `POST /v1/leases`: a lease held by the calling process itself (as the Python package takes
//! one while a daemon runs). Here the test process is that caller.

use crate::serve::Daemon;
use std::io::{Read, Write};

/// One request over the daemon's socket; the status and the JSON answer.
pub fn http(
    d: &Daemon,
    method: &str,
    path: &str,
    body: &serde_json::Value,
) -> (u16, serde_json::Value) {
    let (status, text) = http_text(d, method, path, &body.to_string());
    let json = serde_json::from_str(&text).unwrap_or(serde_json::Value::Null);
    (status, json)
}

/// One request over the daemon's socket; the status and the answer's body as text.
pub fn http_text(d: &Daemon, method: &str, path: &str, body: &str) -> (u16, String) {
    let mut stream = std::os::unix::net::UnixStream::connect(d.socket()).unwrap();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: orch\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    // One write: a server that answers without reading the body may close at once.
    let _ = stream.write_all(format!("{head}{body}").as_bytes());
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let status: u16 = answer[9..12].parse().unwrap();
    let body = answer
        .split_once("\r\n\r\n")
        .map_or(String::new(), |(_, b)| b.to_string());
    (status, body)
}

fn lease_request(gpus: u32, wait: bool) -> serde_json::Value {
    serde_json::json!({
        "job_text": format!("[job]\nname = \"notebook\"\n[resources]\ngpus = {gpus}\n[command]\nargv = [\"python\"]\n"),
        "job_path": "/tmp/orch.lease()",
        "cwd": "/tmp",
        "wait": wait,
    })
}

#[test]
fn a_held_lease_is_a_job_of_the_calling_process_until_it_releases_it() {
    let d = Daemon::start("held");
    let (status, lease) = http(&d, "POST", "/v1/leases", &lease_request(8, false));
    assert_eq!(status, 201, "{lease}");
    assert_eq!(lease["state"], "running");
    let devices = lease["devices"].as_array().unwrap();
    assert_eq!(devices.len(), 8);
    let uuids: Vec<&str> = devices
        .iter()
        .map(|d| d["uuid"].as_str().unwrap())
        .collect();
    assert_eq!(lease["env"]["CUDA_VISIBLE_DEVICES"], uuids.join(","));
    assert_eq!(lease["env"]["CUDA_DEVICE_ORDER"], "PCI_BUS_ID");
    assert!(
        lease["reason"].as_str().unwrap().contains("least loaded"),
        "{lease}"
    );
    let job = lease["job_id"].as_str().unwrap().to_string();

    // It is a job like any other: listed, and in the lease store under this process.
    let jobs = d.client(&["jobs", "--json"]);
    let jobs: serde_json::Value = serde_json::from_slice(&jobs.stdout).unwrap();
    assert!(
        jobs.as_array()
            .unwrap()
            .iter()
            .any(|j| j["id"] == job.as_str() && j["state"] == "running"),
        "{jobs}"
    );
    let leases = d.client(&["leases", "--json"]);
    let leases: serde_json::Value = serde_json::from_slice(&leases.stdout).unwrap();
    assert_eq!(
        leases[0]["holder_pids"],
        serde_json::json!([std::process::id()]),
        "the caller holds it, not the daemon: {leases}"
    );

    // Nothing else fits: a submitted job waits, another lease without wait is refused.
    let queued = d.submit(&["--gpus", "1", "--", "true"]);
    let (status, refused) = http(&d, "POST", "/v1/leases", &lease_request(1, false));
    assert_eq!(status, 409, "{refused}");
    assert!(
        refused["error"]
            .as_str()
            .unwrap()
            .contains("pass wait=True"),
        "{refused}"
    );
    // With wait, it queues; released while queued, it leaves the queue.
    let (status, waiting) = http(&d, "POST", "/v1/leases", &lease_request(1, true));
    assert_eq!(status, 202, "{waiting}");
    assert_eq!(waiting["state"], "queued");
    let waiting_id = waiting["job_id"].as_str().unwrap();
    let (status, gone) = http(
        &d,
        "POST",
        &format!("/v1/leases/{waiting_id}/release"),
        &serde_json::json!({}),
    );
    assert_eq!(
        (status, gone["state"].as_str()),
        (200, Some("cancelled")),
        "{gone}"
    );

    // Released: it ends succeeded, and the submitted job gets its device.
    let (status, ended) = http(
        &d,
        "POST",
        &format!("/v1/leases/{job}/release"),
        &serde_json::json!({}),
    );
    assert_eq!(status, 200, "{ended}");
    assert_eq!(ended["state"], "succeeded");
    assert_eq!(ended["reason"], "released by its process");
    d.wait_state(&queued, "succeeded");
    // A submitted job is not released this way.
    let (status, _) = http(
        &d,
        "POST",
        &format!("/v1/leases/{queued}/release"),
        &serde_json::json!({}),
    );
    assert_eq!(status, 409);
}
