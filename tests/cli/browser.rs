//! Test helpers for the daemon's TCP side: a plain HTTP/1.1 client, and headless Chromium driven
//! over the DevTools protocol on a pipe (`--remote-debugging-pipe`: JSON messages separated by
//! NUL bytes on file descriptors 3 and 4), so a test logs in, waits for the page's script and
//! reads the rendered DOM the way a person's browser would show it.

use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// An answer: status, headers (names lower-case), body.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Answer {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// One request on a fresh connection (`Connection: close`).
pub fn http(port: u16, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Answer {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("the daemon's TCP listener");
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut request = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes()).unwrap();
    stream.write_all(body).unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).unwrap();
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a complete answer");
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .expect("a status line");
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let mut body = raw[split + 4..].to_vec();
    if headers
        .iter()
        .any(|(n, v)| n == "transfer-encoding" && v.contains("chunked"))
    {
        body = dechunk(&body);
    }
    Answer {
        status,
        headers,
        body,
    }
}

fn dechunk(mut data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let Some(end) = data.windows(2).position(|w| w == b"\r\n") else {
            return out;
        };
        let size = usize::from_str_radix(
            String::from_utf8_lossy(&data[..end])
                .split(';')
                .next()
                .unwrap_or("0")
                .trim(),
            16,
        )
        .unwrap_or(0);
        if size == 0 {
            return out;
        }
        let start = end + 2;
        out.extend_from_slice(&data[start..start + size]);
        data = &data[start + size + 2..];
    }
}

/// The Chromium binary, when installed; with `ORCH_REQUIRE_CHROMIUM` set, missing is a failure.
pub fn chromium(test: &str) -> Option<PathBuf> {
    for name in ["chromium", "chromium-browser", "google-chrome"] {
        if let Ok(out) = Command::new("which").arg(name).output()
            && out.status.success()
        {
            return Some(PathBuf::from(
                String::from_utf8_lossy(&out.stdout).trim().to_string(),
            ));
        }
    }
    assert!(
        std::env::var_os("ORCH_REQUIRE_CHROMIUM").is_none(),
        "{test} needs chromium and ORCH_REQUIRE_CHROMIUM is set"
    );
    eprintln!("{test}: skipped (no chromium)");
    None
}

/// Headless Chromium with one page, driven over the DevTools protocol.
pub struct Browser {
    child: Child,
    to: std::fs::File,
    from: BufReader<std::fs::File>,
    next: u64,
    session: String,
    /// Console errors, uncaught exceptions and failed loads the page reported.
    pub errors: Vec<String>,
}

fn pipe() -> (OwnedFd, OwnedFd) {
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills two new descriptors we then own.
    let rc = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
    assert_eq!(rc, 0, "pipe2");
    // SAFETY: both descriptors are fresh and ours.
    unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
}

impl Browser {
    pub fn start(binary: &Path, profile: &Path) -> Browser {
        use std::os::fd::AsRawFd;
        use std::os::unix::process::CommandExt;
        let (child_reads, we_write) = pipe();
        let (we_read, child_writes) = pipe();
        let (r, w) = (child_reads.as_raw_fd(), child_writes.as_raw_fd());
        let mut command = Command::new(binary);
        command
            .args([
                "--headless=new",
                "--remote-debugging-pipe",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--no-default-browser-check",
                "--disable-extensions",
                "--disable-background-networking",
                "--window-size=1280,900",
            ])
            .arg(format!("--user-data-dir={}", profile.display()))
            .arg("about:blank")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // SAFETY: only fcntl and dup2 (async-signal-safe) between fork and exec. The pipe ends
        // are first copied above 10, so that placing them on 3 and 4 cannot overwrite one with
        // the other, and dup2 onto another number clears close-on-exec on 3 and 4.
        unsafe {
            command.pre_exec(move || {
                let high_r = libc::fcntl(r, libc::F_DUPFD_CLOEXEC, 10);
                let high_w = libc::fcntl(w, libc::F_DUPFD_CLOEXEC, 10);
                if high_r < 0
                    || high_w < 0
                    || libc::dup2(high_r, 3) < 0
                    || libc::dup2(high_w, 4) < 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = command.spawn().expect("chromium starts");
        drop(child_reads);
        drop(child_writes);
        let mut browser = Browser {
            child,
            to: std::fs::File::from(we_write),
            from: BufReader::new(std::fs::File::from(we_read)),
            next: 0,
            session: String::new(),
            errors: Vec::new(),
        };
        let target = browser.call("Target.createTarget", json!({"url": "about:blank"}));
        let target_id = target["targetId"].as_str().unwrap().to_string();
        let attached = browser.call(
            "Target.attachToTarget",
            json!({"targetId": target_id, "flatten": true}),
        );
        browser.session = attached["sessionId"].as_str().unwrap().to_string();
        for domain in ["Page.enable", "Runtime.enable", "Log.enable"] {
            browser.call(domain, json!({}));
        }
        browser
    }

    /// Sends one command (to the page once attached) and waits for its answer.
    pub fn call(&mut self, method: &str, params: Value) -> Value {
        self.next += 1;
        let id = self.next;
        let mut message = json!({"id": id, "method": method, "params": params});
        if !self.session.is_empty() {
            message["sessionId"] = json!(self.session);
        }
        let mut bytes = serde_json::to_vec(&message).unwrap();
        bytes.push(0);
        self.to.write_all(&bytes).unwrap();
        loop {
            let mut raw = Vec::new();
            let n = self.from.read_until(0, &mut raw).unwrap();
            assert!(n > 0, "chromium closed the pipe while {method} was waiting");
            raw.pop();
            let answer: Value = serde_json::from_slice(&raw).unwrap();
            if answer["id"] == id {
                if let Some(error) = answer.get("error") {
                    panic!("{method}: {error}");
                }
                return answer["result"].clone();
            }
            self.note_event(&answer);
        }
    }

    fn note_event(&mut self, event: &Value) {
        let p = &event["params"];
        match event["method"].as_str() {
            Some("Runtime.consoleAPICalled") if p["type"] == "error" => {
                self.errors.push(format!("console.error: {}", p["args"]));
            }
            Some("Runtime.exceptionThrown") => {
                self.errors
                    .push(format!("exception: {}", p["exceptionDetails"]));
            }
            Some("Log.entryAdded") if p["entry"]["level"] == "error" => {
                self.errors.push(format!(
                    "{}: {}",
                    p["entry"]["url"].as_str().unwrap_or(""),
                    p["entry"]["text"].as_str().unwrap_or("")
                ));
            }
            _ => {}
        }
    }

    /// Evaluates `expression` in the page (promises awaited) and returns its value.
    pub fn eval(&mut self, expression: &str) -> Value {
        let r = self.call(
            "Runtime.evaluate",
            json!({"expression": expression, "returnByValue": true, "awaitPromise": true}),
        );
        if let Some(e) = r.get("exceptionDetails") {
            panic!("{expression}: {e}");
        }
        r["result"]["value"].clone()
    }

    pub fn navigate(&mut self, url: &str) {
        self.call("Page.navigate", json!({"url": url}));
        self.wait_for(
            "document.readyState === 'complete'",
            Duration::from_secs(20),
        );
    }

    /// Waits until `expression` is true in the page.
    pub fn wait_for(&mut self, expression: &str, limit: Duration) {
        let deadline = Instant::now() + limit;
        loop {
            let value = self.call(
                "Runtime.evaluate",
                json!({"expression": expression, "returnByValue": true}),
            );
            if value["result"]["value"] == true {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the page never got to `{expression}`; errors: {:?}",
                self.errors
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// A PNG of the page as it is, saved at `path`.
    pub fn screenshot(&mut self, path: &Path) {
        use base64::Engine as _;
        let shot = self.call(
            "Page.captureScreenshot",
            json!({"format": "png", "captureBeyondViewport": true}),
        );
        let png = base64::engine::general_purpose::STANDARD
            .decode(shot["data"].as_str().unwrap())
            .unwrap();
        std::fs::write(path, png).unwrap();
    }

    /// Lays the page out as a phone would (390 x 844 CSS pixels, touch, mobile viewport).
    pub fn as_phone(&mut self) {
        self.call(
            "Emulation.setDeviceMetricsOverride",
            json!({"width": 390, "height": 844, "deviceScaleFactor": 2, "mobile": true}),
        );
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
