//! Operating a shared machine through the daemon's TCP listener: `/metrics` checked by
//! `promtool`, the web page in headless Chromium, tokens and sessions, idle reclaim on a sim GPU
//! whose utilization drops, and foreign processes shown and avoided.

use crate::browser::{Browser, chromium, http};
use crate::serve::{Daemon, job_file};
use crate::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// `sha256:HEX` of a token, as the config stores it.
fn hashed(token: &str) -> String {
    let hash = orch_serve::core::config::TokenHash::of(token);
    let hex: String = hash.0.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

pub(crate) const ADMIN: &str = "admin-token-for-tests";
pub(crate) const TOKEN_A: &str = "token-of-tenant-a";
pub(crate) const TOKEN_B: &str = "token-of-tenant-b";

/// One GPU of a sim file: utilization and the pids of processes on it.
#[derive(Clone)]
pub(crate) struct SimGpu {
    utilization: u32,
    processes: Vec<u32>,
}

fn uuid(i: usize) -> String {
    format!("GPU-{i:08x}-0000-4000-8000-00000000abcd")
}

/// Writes the sim file (atomically: the daemon re-reads it every second).
fn write_sim(path: &Path, gpus: &[SimGpu]) {
    let mut text = String::new();
    for (i, g) in gpus.iter().enumerate() {
        text.push_str(&format!(
            "[[gpu]]\nname = \"NVIDIA H100 80GB HBM3\"\nmemory_total = \"80GiB\"\nutilization = {}\nuuid = \"{}\"\ntemperature = {}\npower_draw_w = {}.5\n",
            g.utilization,
            uuid(i),
            40 + i,
            100 + i
        ));
        for pid in &g.processes {
            text.push_str(&format!(
                "[[gpu.process]]\npid = {pid}\nused_memory = \"2GiB\"\n"
            ));
        }
    }
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// A daemon on its own sim file and a TCP port, with `extra` config lines and two tenants `a`
/// and `b` (this user in both; tokens TOKEN_A and TOKEN_B), `tenant_extra` in each.
pub(crate) fn daemon(
    tag: &str,
    gpus: &[SimGpu],
    extra: &str,
    tenant_extra: &str,
) -> (Daemon, u16, PathBuf) {
    let mut d = Daemon::prepare(tag);
    let sim = d.state.join("sim.toml");
    write_sim(&sim, gpus);
    let port = free_port();
    let config = d.state.join("serve.toml");
    std::fs::write(
        &config,
        format!(
            "listen = \"127.0.0.1:{port}\"\nadmin_tokens = [\"{}\"]\n{extra}\n\
             [[tenant]]\nname = \"a\"\nusers = [\"{me}\"]\ntokens = [\"{}\"]\n{tenant_extra}\n\
             [[tenant]]\nname = \"b\"\nusers = [\"{me}\"]\ntokens = [\"{}\"]\n{tenant_extra}\n",
            hashed(ADMIN),
            hashed(TOKEN_A),
            hashed(TOKEN_B),
            me = me()
        ),
    )
    .unwrap();
    d.config = Some(config);
    d.devices = Some(format!("sim:{}", sim.display()));
    d.restart();
    (d, port, sim)
}

pub(crate) fn busy(n: usize) -> Vec<SimGpu> {
    vec![
        SimGpu {
            utilization: 60,
            processes: Vec::new(),
        };
        n
    ]
}

pub(crate) fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

/// Where a test leaves what a person may want to look at (screenshots).
pub(crate) fn output_dir(test: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("orch-cli")
        .join(test);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn the_listener_wants_a_token_and_a_login_sets_a_strict_cookie() {
    let (d, port, _) = daemon("tokens", &busy(2), "", "");
    let id = d.submit(&["--tenant", "a", "--", "sleep", "30"]);
    d.wait_state(&id, "running");
    // No token: 401 with a sentence on the API, the login form (never data) on the page.
    let answer = http(port, "GET", "/v1/jobs", &[], b"");
    assert_eq!(answer.status, 401, "{}", answer.text());
    assert!(
        answer.text().contains("Authorization: Bearer"),
        "{}",
        answer.text()
    );
    let page = http(port, "GET", "/", &[], b"");
    assert_eq!(page.status, 200);
    assert!(page.text().contains("id=\"login\"") && !page.text().contains("sleep"));
    assert_eq!(http(port, "GET", "/metrics", &[], b"").status, 401);
    // A wrong token is refused like none.
    let wrong = bearer("nope");
    assert_eq!(
        http(port, "GET", "/v1/jobs", &[("Authorization", &wrong)], b"").status,
        401
    );
    // A's token sees A's job; B's token does not; submitting over TCP is refused.
    let a = bearer(TOKEN_A);
    let jobs: serde_json::Value =
        serde_json::from_slice(&http(port, "GET", "/v1/jobs", &[("Authorization", &a)], b"").body)
            .unwrap();
    assert_eq!(jobs.as_array().unwrap().len(), 1);
    let b = bearer(TOKEN_B);
    let jobs = http(port, "GET", "/v1/jobs", &[("Authorization", &b)], b"").text();
    assert_eq!(jobs.trim(), "[]");
    let submit = http(port, "POST", "/v1/jobs", &[("Authorization", &a)], b"{}");
    assert_eq!(submit.status, 403, "{}", submit.text());
    // The login form posts the token; the answer is a session cookie, no token in any URL.
    let login = http(
        port,
        "POST",
        "/login",
        &[("Content-Type", "application/x-www-form-urlencoded")],
        format!("token={TOKEN_A}").as_bytes(),
    );
    assert_eq!(login.status, 303, "{}", login.text());
    let cookie = login.header("set-cookie").unwrap().to_string();
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    assert!(!login.header("location").unwrap().contains(TOKEN_A));
    let session = cookie.split(';').next().unwrap().to_string();
    let jobs = http(port, "GET", "/v1/jobs", &[("Cookie", &session)], b"");
    assert_eq!(jobs.status, 200);
    assert!(jobs.text().contains(&format!("\"id\":\"{id}\"")));
    // A failed login says so on the form.
    let failed = http(
        port,
        "POST",
        "/login",
        &[("Content-Type", "application/x-www-form-urlencoded")],
        b"token=guess",
    );
    assert_eq!(failed.status, 401);
    assert!(
        failed.text().contains("not valid here"),
        "{}",
        failed.text()
    );
    // A post from another site is refused, whatever it carries.
    let foreign = http(
        port,
        "POST",
        &format!("/v1/jobs/{id}/cancel"),
        &[("Cookie", &session), ("Origin", "http://evil.example")],
        b"",
    );
    assert_eq!(foreign.status, 403, "{}", foreign.text());
    assert_eq!(d.status(&id)["state"], "running");
    // Logging out ends the session.
    http(port, "POST", "/logout", &[("Cookie", &session)], b"");
    assert_eq!(
        http(port, "GET", "/v1/jobs", &[("Cookie", &session)], b"").status,
        401
    );
}

/// The value of the sample `name{labels}` in a metrics page.
fn sample(text: &str, name_and_labels: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(name_and_labels) && l[name_and_labels.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[test]
fn metrics_pass_promtool_and_match_the_devices_and_the_job_table() {
    let mut gpus = busy(4);
    gpus[3].processes = vec![4_000_000];
    let (d, port, _) = daemon("metrics", &gpus, "", "");
    let running = d.submit(&["--tenant", "a", "--gpus", "2", "--", "sleep", "30"]);
    d.wait_state(&running, "running");
    let done = d.submit(&["--tenant", "b", "--", "true"]);
    d.wait_state(&done, "succeeded");
    std::thread::sleep(Duration::from_millis(1500)); // the device thread's next reading
    let admin = bearer(ADMIN);
    let answer = http(port, "GET", "/metrics", &[("Authorization", &admin)], b"");
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert!(
        answer
            .header("content-type")
            .unwrap()
            .starts_with("text/plain; version=0.0.4")
    );
    let text = answer.text();
    // A tenant's token may not scrape.
    let a = bearer(TOKEN_A);
    assert_eq!(
        http(port, "GET", "/metrics", &[("Authorization", &a)], b"").status,
        403
    );

    // Prometheus' own parser and linter.
    match Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    {
        Ok(mut child) => {
            use std::io::Write;
            child
                .stdin
                .take()
                .unwrap()
                .write_all(text.as_bytes())
                .unwrap();
            let out = child.wait_with_output().unwrap();
            assert!(
                out.status.success(),
                "promtool: {}{}\n{text}",
                stdout(&out),
                stderr(&out)
            );
        }
        Err(_) => {
            assert!(
                std::env::var_os("ORCH_REQUIRE_PROMTOOL").is_none(),
                "promtool is not installed and ORCH_REQUIRE_PROMTOOL is set"
            );
            eprintln!(
                "promtool: not installed; the format is checked by the assertions below only"
            );
        }
    }

    // Values against `orch devices --json` and the job table.
    let devices: serde_json::Value =
        serde_json::from_slice(&d.client(&["devices", "--json"]).stdout).unwrap();
    for dev in devices.as_array().unwrap() {
        let labels = format!(
            "{{uuid=\"{}\",index=\"{}\",name=\"{}\"}}",
            dev["uuid"].as_str().unwrap(),
            dev["index"],
            dev["name"].as_str().unwrap()
        );
        assert_eq!(
            sample(&text, &format!("orch_device_memory_total_bytes{labels}")),
            dev["memory_total_bytes"].as_f64(),
            "{labels}"
        );
        assert_eq!(
            sample(&text, &format!("orch_device_utilization_ratio{labels}")),
            dev["utilization_gpu_percent"].as_f64().map(|u| u / 100.0)
        );
        let foreign = dev["foreign_processes"].as_array().unwrap().len() as f64;
        assert_eq!(
            sample(&text, &format!("orch_device_foreign_processes{labels}")),
            Some(foreign)
        );
    }
    assert_eq!(
        sample(&text, "orch_jobs{state=\"running\",tenant=\"a\"}"),
        Some(1.0)
    );
    assert_eq!(
        sample(&text, "orch_jobs{state=\"succeeded\",tenant=\"b\"}"),
        Some(1.0)
    );
    assert_eq!(
        sample(&text, "orch_jobs{state=\"queued\",tenant=\"a\"}"),
        Some(0.0)
    );
    assert_eq!(sample(&text, "orch_submits_total{tenant=\"a\"}"), Some(1.0));
    assert_eq!(sample(&text, "orch_leases"), Some(1.0));
    assert_eq!(
        text.lines()
            .filter(
                |l| l.starts_with("orch_device_held{") && l.contains(&format!("job=\"{running}\""))
            )
            .count(),
        2
    );
    assert!(text.contains("orch_queue_wait_seconds_count{tenant=\"a\"} 1"));
    assert!(text.contains("orch_policy_decision_duration_seconds_count{kind=\"placement\"}"));
    // Job-level counters, added at each job's end: `b`'s finished job, not `a`'s running one.
    assert_eq!(
        sample(
            &text,
            "orch_jobs_finished_total{tenant=\"b\",state=\"succeeded\"}"
        ),
        Some(1.0)
    );
    assert!(sample(&text, "orch_job_gpu_seconds_total{tenant=\"b\"}").is_some_and(|s| s >= 0.0));
    assert_eq!(
        sample(&text, "orch_job_gpu_seconds_total{tenant=\"a\"}"),
        None
    );
    assert!(text.contains("orch_job_queue_wait_seconds_count{tenant=\"b\"} 1"));
}

/// Tenant `a` logs in with its token in a real browser: it sees every GPU, its own job's name on
/// the device it holds, "(another tenant's job)" on `b`'s, the foreign process, and only its own
/// job in the list; the console stays clean; the page fits a phone.
#[test]
fn the_web_page_in_headless_chromium() {
    let Some(binary) = chromium("the_web_page_in_headless_chromium") else {
        return;
    };
    let mut gpus = busy(4);
    gpus[3].processes = vec![4_000_001];
    let (d, port, _) = daemon("web", &gpus, "", "");
    let work = d.state.join("work");
    std::fs::create_dir_all(&work).unwrap();
    let mine = job_file(
        &work,
        "mine.toml",
        "[job]\nname = \"alpha-resnet\"\ntenant = \"a\"\n[policy]\nplugin = \"first-fit\"\n[command]\nargv = [\"sleep\", \"60\"]\n",
    );
    let theirs = job_file(
        &work,
        "theirs.toml",
        "[job]\nname = \"beta-secret-llm\"\ntenant = \"b\"\n[policy]\nplugin = \"first-fit\"\n[command]\nargv = [\"sleep\", \"60\"]\n",
    );
    let a = d.submit(&[&mine]);
    d.wait_state(&a, "running");
    let b = d.submit(&[&theirs]);
    d.wait_state(&b, "running");

    let out = output_dir("web");
    let mut browser = Browser::start(&binary, &out.join("profile"));
    let url = format!("http://127.0.0.1:{port}/");
    browser.navigate(&url);
    // Not logged in: the form, and no data.
    assert_eq!(
        browser.eval("document.getElementById('login') !== null"),
        true
    );
    let text = browser.eval("document.body.innerText");
    assert!(!text.as_str().unwrap().contains("alpha-resnet"));
    browser.eval(&format!(
        "document.getElementById('token').value = '{TOKEN_A}'; document.getElementById('login').submit(); true"
    ));
    browser.wait_for(
        "document.body && document.body.dataset.ready === '1'",
        Duration::from_secs(30),
    );
    let gpus = browser.eval(
        "JSON.stringify([...document.querySelectorAll('#gpus tbody tr')].map(tr => ({uuid: tr.dataset.uuid, holder: tr.querySelector('.holder').textContent, text: tr.innerText})))",
    );
    let gpus: Vec<serde_json::Value> = serde_json::from_str(gpus.as_str().unwrap()).unwrap();
    assert_eq!(gpus.len(), 4, "{gpus:?}");
    // first-fit: a's job on GPU 0, b's on GPU 1.
    let holder = |i: usize| gpus[i]["holder"].as_str().unwrap().to_string();
    assert!(
        holder(0).contains(&format!("job {a} alpha-resnet (a)")),
        "{gpus:?}"
    );
    assert!(holder(1).contains("(another tenant's job)"), "{gpus:?}");
    assert!(!holder(1).contains("beta-secret-llm"));
    assert_eq!(holder(2), "free");
    assert!(
        gpus[3]["text"].as_str().unwrap().contains("pid 4000001"),
        "{gpus:?}"
    );
    // Every GPU is in service: the State column says so.
    assert!(
        gpus.iter()
            .all(|g| g["text"].as_str().unwrap().trim_end().ends_with("ok")),
        "{gpus:?}"
    );
    let jobs = browser.eval("document.querySelector('#jobs tbody').innerText");
    let jobs = jobs.as_str().unwrap();
    assert!(
        jobs.contains("alpha-resnet") && !jobs.contains("beta-secret-llm"),
        "{jobs}"
    );
    let tenants = browser.eval("document.querySelector('#tenants tbody').rows.length");
    assert_eq!(tenants, 1, "a tenant sees its own standing");
    // A lease `orch run` holds through the daemon is an interactive job of its tenant.
    let held = job_file(
        &work,
        "held.toml",
        "[job]\nname = \"alpha-notebook\"\ntenant = \"a\"\n[policy]\nplugin = \"first-fit\"\n[command]\nargv = [\"sleep\", \"60\"]\n",
    );
    let mut interactive = Command::new(env!("CARGO_BIN_EXE_orch"))
        .args(["run", &held])
        .env("ORCH_SERVER", d.socket())
        .env_remove("ORCH_STATE_DIR")
        .env_remove("ORCH_JOB_ID")
        .env_remove("CUDA_VISIBLE_DEVICES")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !stdout(&d.client(&["jobs", "--json"])).contains("alpha-notebook") {
        assert!(
            Instant::now() < deadline,
            "the interactive job never showed"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    browser.navigate(&url);
    browser.wait_for(
        "document.body && document.body.dataset.ready === '1'",
        Duration::from_secs(30),
    );
    let listed = browser.eval("document.querySelector('#jobs tbody').innerText");
    assert!(
        listed
            .as_str()
            .unwrap()
            .contains("alpha-notebook (interactive)"),
        "{listed}"
    );
    // SIGTERM: `orch run` passes it to its job, which ends, and the lease with it.
    // SAFETY: kill on the pid of a child this test started and has not reaped.
    unsafe { libc::kill(interactive.id() as i32, libc::SIGTERM) };
    interactive.wait().unwrap();
    // A name of 10,000 characters (from before names were checked: written into the database)
    // is cut with an ellipsis, whole in its tooltip, and every column stays in view.
    let long = format!("alpha-resnet-{}", "x".repeat(10_000));
    rusqlite::Connection::open(d.state.join("jobs.sqlite3"))
        .unwrap()
        .execute(
            "UPDATE jobs SET name = ?1 WHERE id = ?2",
            rusqlite::params![long, a.parse::<i64>().unwrap()],
        )
        .unwrap();
    browser.navigate(&url);
    browser.wait_for(
        "document.body && document.body.dataset.ready === '1'",
        Duration::from_secs(30),
    );
    let shown = browser.eval(&format!(
        "(() => {{ const s = document.querySelector('#jobs tr[data-id=\"{a}\"] td.name .clip'); const t = document.getElementById('jobs'); return JSON.stringify({{title: s.title.length, text: s.textContent.length, cut: s.scrollWidth > s.clientWidth, overflow: getComputedStyle(s).textOverflow, fits: t.scrollWidth <= t.parentElement.clientWidth + 1}}); }})()"
    ));
    let shown: serde_json::Value = serde_json::from_str(shown.as_str().unwrap()).unwrap();
    assert_eq!(shown["title"], long.len(), "{shown}");
    assert_eq!(shown["text"], long.len(), "{shown}");
    assert_eq!(shown["cut"], true, "{shown}");
    assert_eq!(shown["overflow"], "ellipsis", "{shown}");
    assert_eq!(shown["fits"], true, "the columns stay in view: {shown}");
    browser.screenshot(&out.join("desktop.png"));

    browser.as_phone();
    browser.navigate(&url);
    browser.wait_for(
        "document.body && document.body.dataset.ready === '1'",
        Duration::from_secs(30),
    );
    let fits = browser.eval("document.documentElement.scrollWidth <= window.innerWidth + 1");
    assert_eq!(fits, true, "the page scrolls sideways on a phone");
    browser.screenshot(&out.join("phone.png"));
    assert!(
        browser.errors.is_empty(),
        "the console reported errors: {:?}",
        browser.errors
    );
    // The page's whole first load is small.
    let size: usize = ["/", "/app.js"]
        .iter()
        .map(|p| {
            http(port, "GET", p, &[("Authorization", &bearer(TOKEN_A))], b"")
                .body
                .len()
        })
        .sum();
    assert!(size < 20_000, "{size} bytes");
    eprintln!("screenshots in {}", out.display());
}

#[test]
fn idle_reclaim_warns_then_stops_a_job_whose_gpu_went_idle() {
    let (d, _, sim) = daemon(
        "idle",
        &busy(2),
        "",
        "idle_timeout = \"2s\"\nidle_grace = \"2s\"\nidle_utilization = 10",
    );
    let id = d.submit(&["--tenant", "a", "--gpus", "2", "--", "sleep", "120"]);
    d.wait_state(&id, "running");
    // Busy for a while: nothing happens.
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(d.status(&id)["state"], "running");
    // One device goes idle: still not the whole job.
    let mut gpus = busy(2);
    gpus[0].utilization = 0;
    write_sim(&sim, &gpus);
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(d.status(&id)["state"], "running");
    // Both idle: a warning (event and stderr line), then the stop.
    gpus[1].utilization = 3;
    write_sim(&sim, &gpus);
    let started = Instant::now();
    let s = d.wait_state(&id, "failed");
    assert_eq!(s["reason"], "idle for 2s; GPUs reclaimed", "{s}");
    assert!(started.elapsed() >= Duration::from_secs(3));
    let kinds = crate::serve::event_kinds(&s);
    assert_eq!(
        kinds,
        ["queued", "started", "idle", "stopping", "finished"],
        "{s}"
    );
    let log = stdout(&d.client(&["logs", "--stderr", &id]));
    assert!(
        log.contains("orch: its GPUs have stayed under 10% utilization for 2s"),
        "{log}"
    );
    d.wait_no_leases();
    let status = stdout(&d.client(&["status", &id]));
    assert!(
        status.contains("idle      its GPUs have stayed"),
        "{status}"
    );
}

#[test]
fn foreign_processes_are_shown_and_avoided() {
    let mut gpus = busy(2);
    gpus[0].processes = vec![4_000_002];
    let (d, port, sim) = daemon("foreign", &gpus, "foreign = \"avoid\"", "");
    // `orch devices` names the process nobody scheduled.
    let table = stdout(&d.client(&["devices"]));
    assert!(
        table.contains("FOREIGN") && table.contains("pid 4000002"),
        "{table}"
    );
    // first-fit would take GPU 0; "avoid" keeps the job off it.
    let work = d.state.join("work");
    std::fs::create_dir_all(&work).unwrap();
    let marker = work.join("pid");
    let file = job_file(
        &work,
        "job.toml",
        &format!(
            "[job]\nname = \"fits\"\ntenant = \"a\"\n[policy]\nplugin = \"first-fit\"\n[command]\nargv = [\"sh\", \"-c\", \"echo $$ > {}; exec sleep 60\"]\n",
            marker.display()
        ),
    );
    std::thread::sleep(Duration::from_millis(1500));
    let id = d.submit(&[&file]);
    let s = d.wait_state(&id, "running");
    assert_eq!(s["devices"], serde_json::json!([uuid(1)]), "{s}");
    // The job's own process on its device is not foreign; the stranger on GPU 0 still is.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !marker.is_file() {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(20));
    }
    let pid: u32 = std::fs::read_to_string(&marker)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    gpus[1].processes = vec![pid];
    write_sim(&sim, &gpus);
    std::thread::sleep(Duration::from_millis(2500));
    let devices: serde_json::Value = serde_json::from_slice(
        &http(
            port,
            "GET",
            "/v1/devices",
            &[("Authorization", &bearer(TOKEN_A))],
            b"",
        )
        .body,
    )
    .unwrap();
    let foreign = |i: usize| devices[i]["foreign_processes"].as_array().unwrap().len();
    assert_eq!((foreign(0), foreign(1)), (1, 0), "{devices}");
    assert_eq!(devices[1]["held_by"][0]["name"], "fits");
}
