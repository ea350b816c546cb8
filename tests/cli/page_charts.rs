//! The page over time: the daemon's timeline of each GPU's utilization and memory and of the
//! queue's length (`GET /v1/timeline`), drawn as charts by the page's script in headless
//! Chromium, and the jobs that ended with their accounting; names stay text, and a phone's width
//! holds it all.

use crate::browser::{Browser, chromium, http};
use crate::operate::{ADMIN, TOKEN_A, bearer, busy, daemon, output_dir};
use crate::serve::{Daemon, job_file};
use serde_json::Value;
use std::path::Path;
use std::time::{Duration, Instant};

const GIB: u64 = 1 << 30;

/// Writes a sim file of GPUs with these (utilization percent, memory used GiB), atomically (the
/// daemon reads it again every second).
fn write_sim(path: &Path, gpus: &[(u32, u64)]) {
    let mut text = String::new();
    for (i, (utilization, used)) in gpus.iter().enumerate() {
        text.push_str(&format!(
            "[[gpu]]\nname = \"NVIDIA H100 80GB HBM3\"\nmemory_total = \"80GiB\"\nmemory_used = \"{used}GiB\"\nutilization = {utilization}\nuuid = \"GPU-{i:08x}-0000-4000-8000-00000000abcd\"\n"
        ));
    }
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

fn timeline(port: u16, token: &str, query: &str) -> Value {
    let answer = http(
        port,
        "GET",
        &format!("/v1/timeline{query}"),
        &[("Authorization", &bearer(token))],
        b"",
    );
    assert_eq!(answer.status, 200, "{}", answer.text());
    serde_json::from_slice(&answer.body).unwrap()
}

fn submit_named(d: &Daemon, name: &str, tenant: &str, gpus: u32, argv: &str) -> String {
    let work = d.state.join("work");
    std::fs::create_dir_all(&work).unwrap();
    let file = job_file(
        &work,
        &format!("{name}.toml"),
        &format!(
            "[job]\nname = \"{name}\"\ntenant = \"{tenant}\"\n[resources]\ngpus = {gpus}\n[policy]\nplugin = \"first-fit\"\n[command]\nargv = {argv}\n"
        ),
    );
    d.submit(&[&file])
}

fn log_in(browser: &mut Browser, url: &str, token: &str) {
    browser.navigate(url);
    browser.eval(&format!(
        "document.getElementById('token').value = '{token}'; document.getElementById('login').submit(); true"
    ));
    ready(browser);
}

fn ready(browser: &mut Browser) {
    browser.wait_for(
        "document.body && document.body.dataset.ready === '1'",
        Duration::from_secs(30),
    );
}

/// Each GPU chart's data: uuid, caption, and per line its points (x, y in the 1000 x 100 box).
fn charts(browser: &mut Browser) -> Vec<Value> {
    let text = browser.eval(
        "(() => { const xy = (f, c) => [...f.querySelectorAll('polyline.' + c)].flatMap(p => Array.from({length: p.points.numberOfItems}, (_, i) => [p.points.getItem(i).x, p.points.getItem(i).y])); return JSON.stringify([...document.querySelectorAll('#gpu-charts figure')].map(f => ({uuid: f.dataset.uuid, caption: f.querySelector('figcaption').textContent, axis: f.querySelector('.axis').textContent, util: xy(f, 'util'), mem: xy(f, 'mem')}))); })()",
    );
    serde_json::from_str(text.as_str().unwrap()).unwrap()
}

/// Four GPUs whose readings change while the page watches: the API's timeline has their
/// samples and the queue's counts (a tenant sees its own), the page draws one chart per GPU with
/// a point per sample and a chart of the queue, the newest reading shows as it changes, jobs that
/// ended are listed with exit, wall time, queue wait and devices, and at 390 px nothing overflows.
#[test]
fn the_page_charts_each_gpu_and_the_queue_over_time() {
    let (d, port, sim) = daemon("charts", &busy(4), "timeline_interval = \"1s\"", "");
    let pattern = |step: u32| -> Vec<(u32, u64)> {
        vec![
            (85 + step % 3 * 5, 61),
            (20 + step * 7 % 50, 12 + u64::from(step % 4)),
            (60 + step * 3 % 30, 33),
            (0, 0),
        ]
    };
    write_sim(&sim, &pattern(0));
    // Two that end, then three that run or wait.
    let ok = submit_named(&d, "prep-data", "a", 1, "[\"true\"]");
    let bad = submit_named(&d, "eval-sweep", "a", 1, "[\"sh\", \"-c\", \"exit 3\"]");
    d.wait_state(&ok, "succeeded");
    d.wait_state(&bad, "failed");
    let mine = submit_named(&d, "resnet50-train", "a", 1, "[\"sleep\", \"60\"]");
    d.wait_state(&mine, "running");
    let theirs = submit_named(&d, "llm-finetune", "b", 2, "[\"sleep\", \"60\"]");
    d.wait_state(&theirs, "running");
    let waiting = submit_named(&d, "llm-finetune-2", "b", 2, "[\"sleep\", \"60\"]");
    d.wait_state(&waiting, "queued");

    // The API: samples come once a second; the admin counts every tenant's jobs, tenant a its own.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut step = 0;
    let admin = loop {
        step += 1;
        write_sim(&sim, &pattern(step));
        std::thread::sleep(Duration::from_millis(500));
        let t = timeline(port, ADMIN, "");
        let n = t["times_ms"].as_array().unwrap().len();
        if n >= 4 && t["queued"].as_array().unwrap().last() == Some(&Value::from(1)) {
            break t;
        }
        assert!(Instant::now() < deadline, "the timeline never filled: {t}");
    };
    assert_eq!(admin["interval_s"], 1.0, "{admin}");
    assert_eq!(admin["span_s"], 21_600.0, "{admin}");
    assert_eq!(admin["running"].as_array().unwrap().last().unwrap(), 2);
    let devices = admin["devices"].as_array().unwrap();
    assert_eq!(devices.len(), 4, "{admin}");
    let util0: Vec<u64> = devices[0]["utilization_percent"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_u64)
        .collect();
    // The first samples may predate the pattern.
    assert!(
        util0.len() >= 4
            && util0[util0.len() - 3..]
                .iter()
                .all(|u| (85..=95).contains(u)),
        "{util0:?}"
    );
    assert_eq!(
        devices[0]["memory_used_bytes"]
            .as_array()
            .unwrap()
            .last()
            .unwrap(),
        61 * GIB
    );
    assert_eq!(devices[0]["memory_total_bytes"], 80 * GIB);
    let a = timeline(port, TOKEN_A, "");
    assert_eq!(a["devices"].as_array().unwrap().len(), 4, "{a}");
    let newest = |t: &Value, key: &str| t[key].as_array().unwrap().last().cloned();
    assert_eq!(newest(&a, "running"), Some(Value::from(1)), "{a}");
    assert_eq!(newest(&a, "queued"), Some(Value::from(0)), "{a}");
    let thin = timeline(port, ADMIN, "?points=2");
    assert_eq!(thin["times_ms"].as_array().unwrap().len(), 2, "{thin}");
    let last_ms = admin["times_ms"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .as_u64()
        .unwrap();
    let since = timeline(port, ADMIN, &format!("?since={last_ms}"));
    assert!(
        since["times_ms"]
            .as_array()
            .unwrap()
            .iter()
            .all(|t| t.as_u64().unwrap() > last_ms),
        "{since}"
    );
    let zero = http(
        port,
        "GET",
        "/v1/timeline?points=0",
        &[("Authorization", &bearer(ADMIN))],
        b"",
    );
    assert_eq!(zero.status, 400, "{}", zero.text());
    assert!(zero.text().contains("points=0"), "{}", zero.text());
    let anonymous = http(port, "GET", "/v1/timeline", &[], b"");
    assert_eq!(anonymous.status, 401, "{}", anonymous.text());

    // The page, as the admin.
    let Some(binary) = chromium("the_page_charts_each_gpu_and_the_queue_over_time") else {
        return;
    };
    let out = output_dir("page-charts");
    let mut browser = Browser::start(&binary, &out.join("profile"));
    let url = format!("http://127.0.0.1:{port}/");
    log_in(&mut browser, &url, ADMIN);
    let gpus = charts(&mut browser);
    assert_eq!(gpus.len(), 4, "{gpus:?}");
    for g in &gpus {
        let points = g["util"].as_array().unwrap().len();
        assert!(points >= 4, "a point per sample: {g}");
        assert_eq!(g["mem"].as_array().unwrap().len(), points, "{g}");
    }
    // GPU 0 runs at 85-95%: its line ends near the top (y = 100 - percent), its memory at 61
    // of 80 GiB; the idle GPU 3 lies on the bottom. (The first samples may predate the pattern.)
    let ys = |g: &Value, line: &str| -> Vec<f64> {
        let all: Vec<f64> = g[line]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p[1].as_f64().unwrap())
            .collect();
        all[all.len() - 3..].to_vec()
    };
    assert!(
        ys(&gpus[0], "util")
            .iter()
            .all(|y| (4.0..=16.0).contains(y)),
        "{}",
        gpus[0]
    );
    assert!(
        ys(&gpus[0], "mem")
            .iter()
            .all(|y| (23.0..=25.0).contains(y)),
        "{}",
        gpus[0]
    );
    assert!(
        ys(&gpus[3], "util").iter().all(|y| *y == 100.0),
        "{}",
        gpus[3]
    );
    let caption = gpus[0]["caption"].as_str().unwrap();
    assert!(
        caption.contains("GPU 0 · NVIDIA H100 80GB HBM3")
            && caption.contains("61.0 GiB / 80.0 GiB"),
        "{caption}"
    );
    assert!(
        gpus[0]["axis"].as_str().unwrap().contains(':'),
        "times on the axis: {}",
        gpus[0]
    );
    // The newest reading shows: GPU 3 gets busy.
    let mut later = pattern(step);
    later[3] = (73, 5);
    write_sim(&sim, &later);
    let deadline = Instant::now() + Duration::from_secs(20);
    while !charts(&mut browser)[3]["caption"]
        .as_str()
        .unwrap()
        .contains("73% · 5.0 GiB")
    {
        assert!(Instant::now() < deadline, "GPU 3's chart never showed 73%");
        std::thread::sleep(Duration::from_millis(250));
    }
    let queue = browser.eval(
        "JSON.stringify({caption: document.querySelector('#queue figcaption').textContent, queued: document.querySelectorAll('#queue polyline.queued').length, running: [...document.querySelectorAll('#queue polyline.running')].reduce((n, p) => n + p.points.numberOfItems, 0), top: document.querySelector('#queue .ytop').textContent})",
    );
    let queue: Value = serde_json::from_str(queue.as_str().unwrap()).unwrap();
    assert!(
        queue["caption"]
            .as_str()
            .unwrap()
            .contains("1 queued · 2 running"),
        "{queue}"
    );
    assert!(queue["queued"].as_u64().unwrap() >= 1, "{queue}");
    assert!(queue["running"].as_u64().unwrap() >= 4, "{queue}");
    assert_eq!(queue["top"], "2 jobs", "{queue}");
    let span = browser.eval("document.getElementById('span').textContent");
    assert!(
        span.as_str()
            .unwrap()
            .contains("a sample every 1s, kept 6h00m"),
        "{span}"
    );
    // The jobs that ended, newest first: state, exit, wall time, queue wait, devices.
    let finished = browser.eval(
        "JSON.stringify([...document.querySelectorAll('#finished tbody tr')].map(tr => Object.fromEntries([...tr.cells].map(c => [c.dataset.k, c.textContent]))))",
    );
    let finished: Vec<Value> = serde_json::from_str(finished.as_str().unwrap()).unwrap();
    assert_eq!(finished.len(), 2, "{finished:?}");
    let by_name = |name: &str| finished.iter().find(|f| f["Name"] == name).unwrap();
    assert_eq!(by_name("eval-sweep")["State"], "failed", "{finished:?}");
    assert_eq!(by_name("eval-sweep")["Exit"], "3", "{finished:?}");
    assert_eq!(by_name("prep-data")["State"], "succeeded", "{finished:?}");
    assert_eq!(by_name("prep-data")["Exit"], "0", "{finished:?}");
    for f in &finished {
        assert!(f["Wall"].as_str().unwrap().ends_with('s'), "{f}");
        assert!(f["Queue wait"].as_str().unwrap().ends_with('s'), "{f}");
        assert!(f["Devices"].as_str().unwrap().starts_with("GPU "), "{f}");
    }
    let active = browser.eval("document.querySelector('#jobs tbody').innerText");
    assert!(
        !active.as_str().unwrap().contains("prep-data"),
        "ended jobs are listed apart: {active}"
    );
    browser.screenshot(&out.join("desktop.png"));

    // A phone: the charts take the width, and nothing scrolls sideways.
    browser.as_phone();
    browser.navigate(&url);
    ready(&mut browser);
    let fits = browser.eval(
        "document.documentElement.scrollWidth <= window.innerWidth + 1 && [...document.querySelectorAll('#over svg')].every(s => { const r = s.getBoundingClientRect(); return r.width > 250 && r.right <= window.innerWidth; })",
    );
    assert_eq!(fits, true, "the charts overflow a phone's width");
    assert_eq!(charts(&mut browser).len(), 4);
    browser.screenshot(&out.join("phone.png"));
    assert!(
        browser.errors.is_empty(),
        "the console reported errors: {:?}",
        browser.errors
    );
    eprintln!("screenshots in {}", out.display());
}

/// A job name written into the database before names were checked stays text in the list of
/// ended jobs and in a chart's title; the accounting the daemon attaches to an ended job fills
/// its columns (hidden while no job has any), first as recorded, then with set values.
#[test]
fn finished_jobs_show_their_accounting_and_hostile_names_stay_text() {
    let Some(binary) = chromium("finished_jobs_show_their_accounting_and_hostile_names_stay_text")
    else {
        return;
    };
    let (d, port, sim) = daemon("charts-names", &busy(2), "timeline_interval = \"1s\"", "");
    let gpu_name = "<svg onload=\"document.body.dataset.pwned=2\">";
    let tmp = sim.with_extension("tmp");
    std::fs::write(
        &tmp,
        format!("[[gpu]]\nname = '{gpu_name}'\nmemory_total = \"80GiB\"\nutilization = 40\nuuid = \"GPU-00000000-0000-4000-8000-00000000abcd\"\n"),
    )
    .unwrap();
    std::fs::rename(&tmp, &sim).unwrap();
    let id = submit_named(&d, "plain", "a", 1, "[\"sh\", \"-c\", \"exit 7\"]");
    d.wait_state(&id, "failed");
    let hostile = "<img src=x onerror=\"document.body.dataset.pwned=1\">";
    rusqlite::Connection::open(d.state.join("jobs.sqlite3"))
        .unwrap()
        .execute(
            "UPDATE jobs SET name = ?1 WHERE id = ?2",
            rusqlite::params![hostile, id.parse::<i64>().unwrap()],
        )
        .unwrap();
    let out = output_dir("page-charts-names");
    let mut browser = Browser::start(&binary, &out.join("profile"));
    let url = format!("http://127.0.0.1:{port}/");
    log_in(&mut browser, &url, TOKEN_A);
    browser.wait_for(
        "document.querySelector('#gpu-charts figcaption b').textContent.includes('onload')",
        Duration::from_secs(20),
    );
    let row = |browser: &mut Browser| -> Value {
        let text = browser.eval(&format!(
            "JSON.stringify({{chart: document.querySelector('#gpu-charts figcaption b').textContent, svgs: document.querySelectorAll('main svg').length === document.querySelectorAll('#over figure').length, cells: Object.fromEntries([...document.querySelector('#finished tr[data-id=\"{id}\"]').cells].map(c => [c.dataset.k, c.textContent])), imgs: document.querySelectorAll('main img').length, pwned: document.body.dataset.pwned || null, hidden: getComputedStyle(document.querySelector('#finished th.acct')).display === 'none'}})"
        ));
        serde_json::from_str(text.as_str().unwrap()).unwrap()
    };
    let shown = row(&mut browser);
    assert_eq!(shown["cells"]["Name"], hostile, "{shown}");
    assert_eq!(shown["chart"], format!("GPU 0 · {gpu_name}"), "{shown}");
    assert_eq!(shown["svgs"], true, "a chart's svg and no other: {shown}");
    assert_eq!(shown["cells"]["Exit"], "7", "{shown}");
    assert_eq!(shown["imgs"], 0, "{shown}");
    assert_eq!(shown["pwned"], Value::Null, "{shown}");
    // The daemon recorded the job's accounting: its columns show, with what it measured.
    assert_eq!(shown["hidden"], false, "{shown}");
    let wall = shown["cells"]["Wall"].as_str().unwrap_or_default();
    assert!(wall.ends_with('s') && wall != "s", "{shown}");
    assert!(
        !shown["cells"]["GPU-hours"]
            .as_str()
            .unwrap_or_default()
            .is_empty(),
        "{shown}"
    );

    // Set values in the accounting object, to check how the page writes each one.
    browser.call(
        "Page.addScriptToEvaluateOnNewDocument",
        serde_json::json!({"source": r#"
            const plain = window.fetch;
            window.fetch = async (path, options) => {
              const r = await plain(path, options);
              if (!String(path).startsWith("/v1/jobs")) return r;
              const jobs = await r.json();
              for (const j of jobs) if (j.ended_at_ms != null) j.accounting = {
                devices: j.devices, gpu_seconds: 3.0, wall_s: 1.5, queue_wait_s: 0.25,
                cpu_seconds: 1.0, peak_rss_bytes: 1048576,
                peak_gpu_memory_bytes: 1610612736, mean_gpu_utilization: 42.0};
              return new Response(JSON.stringify(jobs), {status: r.status, headers: r.headers});
            };
        "#}),
    );
    browser.navigate(&url);
    ready(&mut browser);
    let shown = row(&mut browser);
    let cells = &shown["cells"];
    assert_eq!(shown["hidden"], false, "{shown}");
    assert_eq!(cells["Wall"], "1.5s", "{shown}");
    assert_eq!(cells["Queue wait"], "0.25s", "{shown}");
    assert_eq!(cells["GPU-hours"], "0.0008", "{shown}");
    assert_eq!(cells["Peak GPU memory"], "1.5 GiB", "{shown}");
    assert_eq!(cells["Mean GPU util."], "42%", "{shown}");
    assert_eq!(cells["Devices"], "GPU 0", "{shown}");
    assert_eq!(shown["pwned"], Value::Null, "{shown}");
    assert!(
        browser.errors.is_empty(),
        "the console reported errors: {:?}",
        browser.errors
    );
}

/// Makes the screenshot docs/OPERATIONS.md shows (about two minutes): four GPUs whose readings
/// follow the jobs on them, jobs that run, wait, succeed and fail, then the page as an admin sees
/// it. Run it when the page changes: `cargo test -p orch-cli --test cli
/// page_charts::docs_screenshot -- --ignored`.
#[test]
#[ignore = "makes docs/images/page-charts.png in about two minutes"]
fn docs_screenshot() {
    let Some(binary) = chromium("docs_screenshot") else {
        return;
    };
    let (d, port, sim) = daemon("charts-docs", &busy(4), "timeline_interval = \"2s\"", "");
    let wave = |t: f64, period: f64| (t / period).sin();
    let reading = |t: u32| -> Vec<(u32, u64)> {
        let f = f64::from(t);
        let busy = |on: bool, level: f64, swing: f64, period: f64| -> u32 {
            if on {
                (level + swing * wave(f, period)).clamp(0.0, 100.0) as u32
            } else {
                0
            }
        };
        vec![
            (busy(t >= 2, 88.0, 6.0, 5.0), if t >= 2 { 61 } else { 0 }),
            (
                busy(t >= 12, 70.0, 20.0, 7.0),
                if t >= 12 { 38 + u64::from(t % 6) } else { 0 },
            ),
            (
                busy(t >= 12, 66.0, 24.0, 9.0),
                if t >= 12 { 38 + u64::from(t % 5) } else { 0 },
            ),
            (
                busy(
                    (22..37).contains(&t) || (42..62).contains(&t) || (82..96).contains(&t),
                    55.0,
                    35.0,
                    3.0,
                ),
                if (42..62).contains(&t) {
                    22
                } else if (22..37).contains(&t) || (82..96).contains(&t) {
                    9
                } else {
                    0
                },
            ),
        ]
    };
    let plan: Vec<(u32, &str, &str, u32, &str)> = vec![
        (0, "resnet50-train", "a", 1, "[\"sleep\", \"600\"]"),
        (10, "llm-finetune", "b", 2, "[\"sleep\", \"600\"]"),
        (20, "prep-data", "a", 1, "[\"sleep\", \"15\"]"),
        (
            40,
            "eval-sweep",
            "a",
            1,
            "[\"sh\", \"-c\", \"sleep 20; exit 3\"]",
        ),
        (50, "llm-finetune-2", "b", 2, "[\"sleep\", \"600\"]"),
        (64, "smoke-test", "a", 1, "[\"true\"]"),
        (80, "tokenize", "a", 1, "[\"sleep\", \"14\"]"),
    ];
    let started = Instant::now();
    for t in 0..110u32 {
        write_sim(&sim, &reading(t));
        for (at, name, tenant, gpus, argv) in &plan {
            if *at == t {
                submit_named(&d, name, tenant, *gpus, argv);
            }
        }
        let next = started + Duration::from_secs(u64::from(t) + 1);
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
    }
    let out = output_dir("page-charts-docs");
    let mut browser = Browser::start(&binary, &out.join("profile"));
    browser.call(
        "Emulation.setDeviceMetricsOverride",
        serde_json::json!({"width": 1100, "height": 900, "deviceScaleFactor": 1, "mobile": false}),
    );
    log_in(&mut browser, &format!("http://127.0.0.1:{port}/"), ADMIN);
    let path = crate::root().join("docs/images/page-charts.png");
    browser.screenshot(&path);
    let size = std::fs::metadata(&path).unwrap().len();
    assert!(size < 300_000, "{} is {size} bytes", path.display());
    eprintln!("{} ({size} bytes)", path.display());
}
