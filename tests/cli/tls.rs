//! The daemon's TCP listener made safe: HTTPS with `tls_cert` and `tls_key` (a CA and a server
//! certificate made here with rcgen, clients built on rustls that verify it), certificates that
//! cannot serve stopping the start, `metrics_tokens` that read `/metrics` and nothing else, and
//! the warning for a plain listener other machines can reach.

use crate::browser::{Answer, http};
use crate::serve::Daemon;
use crate::*;
use rustls::pki_types::{CertificateDer, ServerName};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// `sha256:HEX` of a token, as the config stores it.
pub fn hashed(token: &str) -> String {
    orch_serve::core::config::TokenHash::of(token).to_string()
}

const ADMIN: &str = "admin-token-for-tls-tests";
const TENANT: &str = "token-of-tenant-vision";
const SCRAPER: &str = "token-of-the-prometheus-scraper";

/// The sentence a plain listener that other machines reach logs once at start.
const CLEARTEXT: &str = "travel in clear";

/// A CA, and a server certificate it signed for `localhost` and 127.0.0.1.
struct Certs {
    ca: CertificateDer<'static>,
    /// The server's certificate, then the CA's: what `tls_cert` holds.
    chain_pem: String,
    key_pem: String,
}

fn make_certs() -> Certs {
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose,
    };
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "orch test CA");
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca_cert = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca_params, ca_key);
    let key = KeyPair::generate().unwrap();
    let mut params =
        CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).unwrap();
    params
        .distinguished_name
        .push(DnType::CommonName, "localhost");
    let cert = params.signed_by(&key, &issuer).unwrap();
    Certs {
        ca: ca_cert.der().clone(),
        chain_pem: format!("{}{}", cert.pem(), ca_cert.pem()),
        key_pem: key.serialize_pem(),
    }
}

/// A client that trusts `ca` alone (none: trusts nobody).
fn client(ca: Option<&CertificateDer<'static>>) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    if let Some(ca) = ca {
        roots.add(ca.clone()).unwrap();
    }
    Arc::new(
        rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth(),
    )
}

/// One request over HTTPS on a fresh connection, the server's certificate verified for `name`;
/// the handshake's or the connection's failure as an error.
fn https(
    port: u16,
    config: &Arc<rustls::ClientConfig>,
    name: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> std::io::Result<Answer> {
    let tcp = TcpStream::connect(("127.0.0.1", port))?;
    tcp.set_read_timeout(Some(Duration::from_secs(30)))?;
    let connection = rustls::ClientConnection::new(
        Arc::clone(config),
        ServerName::try_from(name.to_string()).unwrap(),
    )
    .map_err(std::io::Error::other)?;
    let mut stream = rustls::StreamOwned::new(connection, tcp);
    let mut request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {name}:{port}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (header, value) in headers {
        request.push_str(&format!("{header}: {value}\r\n"));
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes())?;
    stream.write_all(body)?;
    stream.flush()?;
    let mut raw = Vec::new();
    match stream.read_to_end(&mut raw) {
        Ok(_) => {}
        // A peer that closes without close_notify, after a whole answer.
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !raw.is_empty() => {}
        Err(e) => return Err(e),
    }
    Ok(parse(&raw))
}

/// An HTTP/1.1 answer with a `Content-Length` body (what the daemon's JSON and forms are).
fn parse(raw: &[u8]) -> Answer {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no whole answer: {:?}", String::from_utf8_lossy(raw)));
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .expect("a status line");
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    Answer {
        status,
        headers,
        body: raw[split + 4..].to_vec(),
    }
}

/// The first bytes of a TLS ClientHello, the rest never sent: a handshake that stalls.
fn stalled_handshake(port: u16) -> TcpStream {
    let mut tcp = TcpStream::connect(("127.0.0.1", port)).unwrap();
    tcp.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01])
        .unwrap();
    tcp
}

/// `request`, again while the daemon refuses it for its address's connection cap (3 in the HTTPS
/// test), for 3 s at most: a connection of the request before may still be closing on the
/// daemon's side and count against the cap. The last answer or error is returned.
fn past_the_cap(request: impl Fn() -> std::io::Result<Answer>) -> std::io::Result<Answer> {
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let answer = request();
        let capped = match &answer {
            Ok(a) => a.status == 503 && a.text().contains("max_connections_per_peer"),
            // A refused request's body can meet a connection the daemon has closed.
            Err(e) => matches!(
                e.kind(),
                std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset
            ),
        };
        if !capped || Instant::now() > deadline {
            return answer;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Asks `whoami` until it is served (200), for `within` at most; else fails with `what`.
fn served_within(whoami: &dyn Fn() -> std::io::Result<Answer>, within: Duration, what: &str) {
    let deadline = Instant::now() + within;
    loop {
        let answer = whoami().unwrap_or_else(|e| panic!("{what}: {e}"));
        if answer.status == 200 {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: {}", answer.text());
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Whether the daemon closes `connection` (a stalled handshake) within `within`.
fn closed_by_the_daemon(mut connection: &TcpStream, within: Duration) -> bool {
    connection.set_read_timeout(Some(within)).unwrap();
    let mut byte = [0u8; 1];
    match connection.read(&mut byte) {
        Ok(0) => true,
        Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
        Ok(_) => panic!("the daemon answered a handshake that never finished"),
    }
}

/// A daemon serving HTTPS on a free port with `certs` (relative paths, beside the config), one
/// tenant `vision` (this user; token TENANT), an admin token, `extra` config lines.
fn tls_daemon(tag: &str, certs: &Certs, extra: &str) -> (Daemon, u16) {
    let mut d = Daemon::prepare(tag);
    std::fs::create_dir_all(d.state.join("tls")).unwrap();
    std::fs::write(d.state.join("tls/cert.pem"), &certs.chain_pem).unwrap();
    std::fs::write(d.state.join("tls/key.pem"), &certs.key_pem).unwrap();
    let port = free_port();
    let config = d.state.join("serve.toml");
    std::fs::write(
        &config,
        format!(
            "listen = \"127.0.0.1:{port}\"\ntls_cert = \"tls/cert.pem\"\ntls_key = \"tls/key.pem\"\n\
             admin_tokens = [\"{}\"]\n{extra}\n\
             [[tenant]]\nname = \"vision\"\nusers = [\"{}\"]\ntokens = [\"{}\"]\n",
            hashed(ADMIN),
            me(),
            hashed(TENANT)
        ),
    )
    .unwrap();
    d.config = Some(config);
    d.restart();
    (d, port)
}

#[test]
fn https_with_a_certificate_the_client_verifies_and_nothing_in_the_clear() {
    let certs = make_certs();
    let (d, port) = tls_daemon("tls", &certs, "max_connections_per_peer = 3");
    let trusted = client(Some(&certs.ca));
    let bearer = format!("Bearer {TENANT}");
    let whoami = || {
        https(
            port,
            &trusted,
            "localhost",
            "GET",
            "/v1/whoami",
            &[("Authorization", &bearer)],
            b"",
        )
    };
    let answer = whoami().expect("a client that trusts the CA is served");
    assert_eq!(answer.status, 200, "{}", answer.text());
    let who: serde_json::Value = serde_json::from_slice(&answer.body).unwrap();
    assert_eq!(who["tenants"], serde_json::json!(["vision"]), "{who}");
    assert_eq!(who["admin"], false);
    // By address too: the certificate names 127.0.0.1.
    let by_ip = past_the_cap(|| {
        https(
            port,
            &trusted,
            "127.0.0.1",
            "GET",
            "/v1/whoami",
            &[("Authorization", &bearer)],
            b"",
        )
    })
    .unwrap();
    assert_eq!(by_ip.status, 200);
    assert!(
        d.log()
            .contains(&format!("tokens on https://127.0.0.1:{port}")),
        "{}",
        d.log()
    );
    assert!(!d.log().contains(CLEARTEXT), "loopback: no warning");

    // A client that does not trust the certificate fails its handshake; so does one that
    // trusts the CA but asks for a name the certificate does not carry.
    let untrusted = https(
        port,
        &client(None),
        "localhost",
        "GET",
        "/v1/whoami",
        &[("Authorization", &bearer)],
        b"",
    )
    .expect_err("an unknown issuer");
    assert!(
        untrusted.to_string().contains("UnknownIssuer"),
        "{untrusted}"
    );
    let wrong_name = https(port, &trusted, "example.org", "GET", "/v1/whoami", &[], b"")
        .expect_err("a name the certificate does not carry");
    assert!(
        wrong_name.to_string().contains("not valid for name"),
        "{wrong_name}"
    );

    // Plain HTTP to the port, with a valid token: one sentence saying to use https, no data.
    let plain = http(
        port,
        "GET",
        "/v1/whoami",
        &[("Authorization", &bearer)],
        b"",
    );
    assert_eq!(plain.status, 400, "{}", plain.text());
    assert!(
        plain.text().contains("serves HTTPS only"),
        "{}",
        plain.text()
    );
    assert!(!plain.text().contains("vision"), "{}", plain.text());

    // The page's login sets a Secure cookie, which then works over HTTPS.
    let login = past_the_cap(|| {
        https(
            port,
            &trusted,
            "localhost",
            "POST",
            "/login",
            &[("Content-Type", "application/x-www-form-urlencoded")],
            format!("token={TENANT}").as_bytes(),
        )
    })
    .unwrap();
    assert_eq!(login.status, 303, "{}", login.text());
    let cookie = login.header("set-cookie").unwrap().to_string();
    assert!(
        cookie.contains("; Secure") && cookie.contains("HttpOnly"),
        "{cookie}"
    );
    let session = cookie.split(';').next().unwrap().to_string();
    let jobs = past_the_cap(|| {
        https(
            port,
            &trusted,
            "localhost",
            "GET",
            "/v1/jobs",
            &[("Cookie", &session)],
            b"",
        )
    })
    .unwrap();
    assert_eq!(jobs.status, 200, "{}", jobs.text());

    // A stalled handshake can fail to count without any fault: refused at its accept because a
    // connection of an earlier request was still closing on the daemon's side (the daemon then
    // closes it a second later), or, on a machine loaded enough, closed by the daemon's
    // handshake timeout (10 s). A request served beside three of them is a failure only if all
    // three are still open; otherwise the check starts over with fresh ones (five tries).
    let mut tries = 0;
    loop {
        tries += 1;
        // Two clients stalled in their handshakes hold up nobody else...
        let mut stalled: Vec<TcpStream> = (0..2).map(|_| stalled_handshake(port)).collect();
        // (Again, briefly, while the connections above may still be closing on the daemon's
        // side and count against the cap; the stalled ones stay open throughout.)
        served_within(
            &whoami,
            Duration::from_secs(3),
            "not served beside two stalled handshakes",
        );
        // ...and count against their address's cap (3 here): with a third, the next connection
        // is refused, over TLS, with the sentence.
        stalled.push(stalled_handshake(port));
        std::thread::sleep(Duration::from_millis(200));
        let refused = whoami().expect("a refusal the client can read");
        if refused.status == 503 {
            assert!(
                refused.text().contains("max_connections_per_peer"),
                "{}",
                refused.text()
            );
            break;
        }
        assert_eq!(refused.status, 200, "{}", refused.text());
        assert!(
            tries < 5,
            "served beside three stalled handshakes in each of {tries} tries"
        );
        let closed = stalled
            .iter()
            .filter(|c| closed_by_the_daemon(c, Duration::from_secs(3)))
            .count();
        assert!(
            closed > 0,
            "served although three stalled handshakes were open"
        );
        eprintln!(
            "{closed} of the three stalled handshakes did not count (refused or timed out); again"
        );
    }
    served_within(
        &whoami,
        Duration::from_secs(10),
        "the stalled connections never stopped counting",
    );
}

/// `orch serve --config CONFIG` on a fresh state folder, which must fail to start: its exit
/// status and stderr.
fn start_fails(tag: &str, config: &Path) -> (Option<i32>, String) {
    let state = std::env::temp_dir().join(format!("orch-tls-fails-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&state);
    std::fs::create_dir_all(&state).unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_orch"))
        .arg("serve")
        .arg("--config")
        .arg(config)
        .env("ORCH_STATE_DIR", &state)
        .env("ORCH_DEVICES", lab_sim())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("orch serve started with {}", config.display());
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(
        !state.join("orch.sock").exists(),
        "a failed start left its socket"
    );
    let _ = std::fs::remove_dir_all(&state);
    (status.code(), err)
}

#[test]
fn a_certificate_or_key_that_cannot_serve_stops_the_start_with_one_sentence() {
    let dir = std::env::temp_dir().join(format!("orch-tls-bad-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let certs = make_certs();
    let other = make_certs();
    std::fs::write(dir.join("cert.pem"), &certs.chain_pem).unwrap();
    std::fs::write(dir.join("key.pem"), &certs.key_pem).unwrap();
    std::fs::write(dir.join("other-key.pem"), &other.key_pem).unwrap();
    std::fs::write(dir.join("notes.txt"), "not a certificate\n").unwrap();
    let config = dir.join("serve.toml");
    let port = free_port();
    let tenant = format!("[[tenant]]\nname = \"a\"\nusers = [\"{}\"]\n", me());
    let cases = [
        (
            "missing",
            "tls_cert = \"missing.pem\"\ntls_key = \"key.pem\"",
            format!("tls_cert {}/missing.pem", dir.display()),
            "cannot be read",
        ),
        (
            "no certificate",
            "tls_cert = \"notes.txt\"\ntls_key = \"key.pem\"",
            format!("tls_cert {}/notes.txt", dir.display()),
            "holds no certificate",
        ),
        (
            "no key",
            "tls_cert = \"cert.pem\"\ntls_key = \"notes.txt\"",
            format!("tls_key {}/notes.txt", dir.display()),
            "holds no private key",
        ),
        (
            "another certificate's key",
            "tls_cert = \"cert.pem\"\ntls_key = \"other-key.pem\"",
            format!("tls_key {}/other-key.pem", dir.display()),
            "is not the private key of the certificate",
        ),
        (
            "a key without its certificate",
            "tls_key = \"key.pem\"",
            "serve.toml:2".to_string(),
            "tls_key is set without tls_cert",
        ),
    ];
    for (case, lines, file, what) in cases {
        std::fs::write(
            &config,
            format!("listen = \"127.0.0.1:{port}\"\n{lines}\n{tenant}"),
        )
        .unwrap();
        let (code, err) = start_fails(&case.replace(' ', "-"), &config);
        assert_eq!(code, Some(2), "{case}: {err}");
        // The daemon's log lines before it, then the error: one line, naming the file.
        let errors: Vec<&str> = err.lines().filter(|l| l.starts_with("orch: ")).collect();
        assert_eq!(errors.len(), 1, "{case}: {err}");
        assert!(
            errors[0].contains(&file) && errors[0].contains(what),
            "{case}: {err}"
        );
    }
    std::fs::write(
        &config,
        format!("tls_cert = \"cert.pem\"\ntls_key = \"key.pem\"\n{tenant}"),
    )
    .unwrap();
    let (code, err) = start_fails("no-listen", &config);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("listen is not"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_metrics_token_reads_metrics_and_nothing_else() {
    let mut d = Daemon::prepare("metrics-token");
    let port = free_port();
    let config = d.state.join("serve.toml");
    std::fs::write(
        &config,
        format!(
            "listen = \"127.0.0.1:{port}\"\nadmin_tokens = [\"{}\"]\nmetrics_tokens = [\"{}\"]\n\
             [[tenant]]\nname = \"vision\"\nusers = [\"{}\"]\ntokens = [\"{}\"]\n",
            hashed(ADMIN),
            hashed(SCRAPER),
            me(),
            hashed(TENANT)
        ),
    )
    .unwrap();
    d.config = Some(config);
    d.restart();
    let id = d.submit(&["--gpus", "1", "--", "sleep", "60"]);
    d.wait_state(&id, "running");
    let scraper = format!("Bearer {SCRAPER}");
    let auth = [("Authorization", scraper.as_str())];

    let metrics = http(port, "GET", "/metrics", &auth, b"");
    assert_eq!(metrics.status, 200, "{}", metrics.text());
    assert!(
        metrics
            .header("content-type")
            .unwrap()
            .starts_with("text/plain; version=0.0.4"),
        "{:?}",
        metrics.headers
    );
    assert!(
        metrics.text().contains("# TYPE orch_jobs gauge")
            && metrics
                .text()
                .contains("orch_jobs{state=\"running\",tenant=\"vision\"} 1"),
        "{}",
        metrics.text()
    );
    // Everything else is refused with one sentence, the page and a cancel included.
    let cancel = format!("/v1/jobs/{id}/cancel");
    let job = format!("/v1/jobs/{id}");
    for (method, path) in [
        ("GET", "/v1/jobs"),
        ("GET", "/v1/devices"),
        ("GET", "/v1/tenants"),
        ("GET", "/v1/whoami"),
        ("GET", job.as_str()),
        ("POST", cancel.as_str()),
        ("GET", "/"),
        ("POST", "/logout"),
    ] {
        let answer = http(port, method, path, &auth, b"");
        assert_eq!(answer.status, 403, "{method} {path}: {}", answer.text());
        assert!(
            answer.text().contains("this token only reads /metrics"),
            "{method} {path}: {}",
            answer.text()
        );
    }
    assert_eq!(d.status(&id)["state"], "running", "the cancel did nothing");
    // It opens no session on the page.
    let login = http(
        port,
        "POST",
        "/login",
        &[("Content-Type", "application/x-www-form-urlencoded")],
        format!("token={SCRAPER}").as_bytes(),
    );
    assert_eq!(login.status, 403, "{}", login.text());
    assert!(login.header("set-cookie").is_none());
    assert!(
        login.text().contains("only reads /metrics"),
        "{}",
        login.text()
    );

    // A tenant's token may not scrape (as before); an admin token may.
    let tenant = format!("Bearer {TENANT}");
    let refused = http(port, "GET", "/metrics", &[("Authorization", &tenant)], b"");
    assert_eq!(refused.status, 403, "{}", refused.text());
    assert!(
        refused.text().contains("metrics_tokens"),
        "{}",
        refused.text()
    );
    let admin = format!("Bearer {ADMIN}");
    let answer = http(port, "GET", "/metrics", &[("Authorization", &admin)], b"");
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert!(answer.text().contains("# TYPE orch_jobs gauge"));
    // Without TLS the page's cookie is not Secure (it could not come back over plain HTTP).
    let login = http(
        port,
        "POST",
        "/login",
        &[("Content-Type", "application/x-www-form-urlencoded")],
        format!("token={TENANT}").as_bytes(),
    );
    assert_eq!(login.status, 303);
    assert!(!login.header("set-cookie").unwrap().contains("Secure"));
    assert!(!d.log().contains(CLEARTEXT), "loopback: no warning");
    assert!(d.client(&["cancel", &id]).status.success());
    d.wait_state(&id, "cancelled");
}

#[test]
fn a_plain_listener_on_every_interface_warns_once_at_start() {
    let mut d = Daemon::prepare("cleartext");
    let port = free_port();
    let config = d.state.join("serve.toml");
    std::fs::write(
        &config,
        format!(
            "listen = \"0.0.0.0:{port}\"\n[[tenant]]\nname = \"a\"\nusers = [\"{}\"]\n",
            me()
        ),
    )
    .unwrap();
    d.config = Some(config);
    d.restart();
    // The warning is written before the socket answers; the daemon is stopped at once.
    let log = d.log();
    d.kill9();
    let warnings: Vec<&str> = log.lines().filter(|l| l.contains(CLEARTEXT)).collect();
    assert_eq!(warnings.len(), 1, "{log}");
    assert!(
        warnings[0].contains(&format!("listen = \"0.0.0.0:{port}\""))
            && warnings[0].contains("set tls_cert and tls_key"),
        "{log}"
    );
}
