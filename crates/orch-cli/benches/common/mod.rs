//! What the daemon benches share: one HTTP request over the daemon's socket, a process's RSS.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;

/// One HTTP request over the socket; returns the status and body.
pub fn http(socket: &Path, method: &str, path: &str, body: &str) -> (u16, String) {
    let mut s = UnixStream::connect(socket).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: orch\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    let status = answer[9..12].parse().unwrap();
    let body = answer
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_string();
    (status, body)
}

/// The resident memory of process `pid`, MiB.
pub fn rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kib / 1024.0
}
