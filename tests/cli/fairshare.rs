//! Fair share on a real daemon: the order jobs start in against the simulator's, preemption of a
//! Wasm trainer that resumes from its checkpoint, `max_priority`, a tenant's `max_runtime`, and
//! `orch usage`.

use crate::serve::{Daemon, job_file, supervisor_pid};
use crate::*;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A daemon whose config is `text` (with `{me}` standing for this user).
fn daemon(tag: &str, text: &str) -> Daemon {
    let mut d = Daemon::prepare(tag);
    let config = d.state.join("serve.toml");
    std::fs::write(&config, text.replace("{me}", &me())).unwrap();
    d.config = Some(config);
    d.restart();
    d
}

fn started_ms(d: &Daemon, id: &str) -> u64 {
    d.status(id)["started_at_ms"].as_u64().unwrap()
}

/// Two tenants of equal share (this user is in both and names one per job). `b` first holds the
/// whole machine for `hold_s`; meanwhile both queue jobs of `job_s` seconds on all eight devices,
/// `rounds` times `per_round` (in that order). Returns the tenants in the order their jobs
/// started on the daemon, after checking that `orch simulate`, given the same trace, starts them
/// in the same order.
fn order_against_the_simulator(
    d: &Daemon,
    hold_s: u32,
    job_s: u32,
    rounds: usize,
    per_round: &[(&'static str, usize)],
) -> Vec<&'static str> {
    let hold = d.submit(&[
        "--tenant",
        "b",
        "--gpus",
        "8",
        "--",
        "sleep",
        &hold_s.to_string(),
    ]);
    d.wait_state(&hold, "running");
    let mut jobs = Vec::new();
    for _ in 0..rounds {
        for &(tenant, n) in per_round {
            for _ in 0..n {
                let id = d.submit(&[
                    "--tenant",
                    tenant,
                    "--gpus",
                    "8",
                    "--",
                    "sleep",
                    &job_s.to_string(),
                ]);
                jobs.push((id, tenant));
            }
        }
    }
    for (id, _) in &jobs {
        d.wait_state(id, "succeeded");
    }
    let mut real: Vec<(u64, &str)> = jobs
        .iter()
        .map(|(id, tenant)| (started_ms(d, id), *tenant))
        .collect();
    real.sort();
    let real: Vec<&'static str> = real.into_iter().map(|(_, t)| t).collect();

    // The same trace through `orch simulate`.
    let mut trace =
        format!("{{\"at\": 0, \"tenant\": \"b\", \"gpus\": 8, \"duration\": {hold_s}}}\n");
    for _ in 0..rounds {
        for &(tenant, n) in per_round {
            for _ in 0..n {
                trace.push_str(&format!(
                    "{{\"at\": 0.2, \"tenant\": \"{tenant}\", \"gpus\": 8, \"duration\": {job_s}}}\n"
                ));
            }
        }
    }
    let trace_path = d.state.join("trace.jsonl");
    std::fs::write(&trace_path, trace).unwrap();
    let config_path = d.state.join("serve.toml");
    let out = d.client(&[
        "simulate",
        "--config",
        config_path.to_str().unwrap(),
        trace_path.to_str().unwrap(),
        "--json",
        "--jobs",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut simulated: Vec<(f64, String)> = report["jobs"].as_array().unwrap()[1..]
        .iter()
        .map(|j| {
            (
                j["started"].as_f64().unwrap(),
                j["tenant"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    simulated.sort_by(|x, y| x.0.total_cmp(&y.0));
    let simulated: Vec<&str> = simulated.iter().map(|(_, t)| t.as_str()).collect();
    assert_eq!(
        real, simulated,
        "the daemon's order against the simulator's"
    );
    // The config gives each tenant an equal share and no limits: the simulator's default when
    // given none, with the trace on its standard input.
    let mut child = Command::new(env!("CARGO_BIN_EXE_orch"))
        .args(["simulate", "--json", "--jobs"])
        .env("ORCH_DEVICES", d.devices.clone().unwrap_or_else(lab_sim))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(
        &mut child.stdin.take().unwrap(),
        &std::fs::read(&trace_path).unwrap(),
    )
    .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let again: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(again["jobs"], report["jobs"], "{again}");
    real
}

const TWO_TENANTS: &str =
    "[[tenant]]\nname = \"a\"\nusers = [\"{me}\"]\n[[tenant]]\nname = \"b\"\nusers = [\"{me}\"]\n";

/// Fair share alternates the two tenants, starting with `a`, which has used nothing; the
/// simulator, given the same trace, starts them in the same order.
#[test]
fn two_tenants_start_in_the_order_the_simulator_gives() {
    let d = daemon("fairorder", TWO_TENANTS);
    let real = order_against_the_simulator(&d, 1, 2, 4, &[("b", 1), ("a", 1)]);
    assert_eq!(real, ["a", "b", "a", "b", "a", "b", "a", "b"]);

    // Both used about the same (b: the hold and four jobs; a: four jobs).
    let out = d.client(&["usage", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let usage: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let used = |name: &str| {
        usage
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["name"] == name)
            .unwrap()["usage_gpu_seconds"]
            .as_f64()
            .unwrap()
    };
    assert!(
        used("a") > 8.0 * 4.0 * 1.9 && used("b") > used("a"),
        "{usage}"
    );
    let table = stdout(&d.client(&["usage"]));
    assert!(
        table.contains("FAIR-SHARE") && table.lines().count() == 3,
        "{table}"
    );
}

/// The same against the simulator when one tenant asks ten times as much as the other: `b`
/// queues ten jobs for each of `a`'s. `a`, which has used nothing, is not held up behind `b`'s
/// backlog: its two jobs start first, then `b`'s twenty.
#[test]
fn a_light_and_a_heavy_tenant_start_in_the_order_the_simulator_gives() {
    let d = daemon("fairten", TWO_TENANTS);
    // The hold lasts while the 22 jobs are submitted, so all wait for the same pass.
    let real = order_against_the_simulator(&d, 5, 1, 2, &[("b", 10), ("a", 1)]);
    let mut expected = vec!["a", "a"];
    expected.extend(["b"; 20]);
    assert_eq!(real, expected);
}

#[test]
fn max_priority_and_a_tenants_max_runtime_hold() {
    let config =
        "[[tenant]]\nname = \"lab\"\nusers = [\"{me}\"]\nmax_priority = 5\nmax_runtime = \"1s\"\n";
    let d = daemon("maxprio", config);
    let high = job_file(
        &d.state,
        "high.toml",
        "[job]\nname = \"high\"\npriority = 9\n[command]\nargv = [\"true\"]\n",
    );
    let out = d.client(&["submit", &high]);
    assert_ne!(out.status.code(), Some(0));
    assert!(
        stderr(&out).contains("priority = 9 is above tenant lab's max_priority = 5"),
        "{}",
        stderr(&out)
    );
    let ok = job_file(
        &d.state,
        "ok.toml",
        "[job]\nname = \"ok\"\npriority = 5\n[command]\nargv = [\"sleep\", \"60\"]\n",
    );
    let id = d.submit(&[&ok]);
    let started = Instant::now();
    let s = d.wait_state(&id, "failed");
    assert_eq!(s["reason"], "time limit", "{s}");
    assert!(started.elapsed() < Duration::from_secs(30));
}

/// Tenant `b` fills the machine: seven devices with jobs that may not be preempted, one with a
/// preemptible Wasm trainer that checkpoints. Tenant `a` (no usage) asks for one device: the
/// trainer is stopped, queued again, and once `a` is done it resumes from its checkpoint and ends
/// with the same parameters as a run that was never stopped.
#[test]
fn a_preemptible_trainer_is_stopped_for_a_tenant_under_its_share_and_resumes() {
    let config = "[[tenant]]\nname = \"a\"\nusers = [\"{me}\"]\n[[tenant]]\nname = \"b\"\nusers = [\"{me}\"]\n";
    let d = daemon("preempt", config);
    let digits = root().join("examples/digits/data/digits.csv.gz");
    let train = |dir: &std::path::Path, preemptible: bool| {
        std::fs::create_dir_all(dir).unwrap();
        job_file(
            dir,
            "train.toml",
            &format!(
                "[job]\nname = \"digits\"\ntenant = \"b\"\npreemptible = {preemptible}\n[resources]\ngpus = 1\nmemory_limit = \"256MiB\"\n[train]\nplugin = \"mlp\"\nepochs = 60\nbatch_size = 64\nseed = 3\ncheckpoint_every = 10\n[train.config]\nhidden = \"32\"\nlr = 0.1\n[train.data]\nformat = \"csv\"\ntrain = \"{g}\"\ntest = \"{g}\"\nscale = 16\n",
                g = digits.display()
            ),
        )
    };
    let blockers: Vec<String> = (0..7)
        .map(|_| d.submit(&["--tenant", "b", "--", "sleep", "120"]))
        .collect();
    for id in &blockers {
        d.wait_state(id, "running");
    }
    let work = d.state.join("preempted");
    let job = d.submit(&[&train(&work, true)]);
    d.wait_state(&job, "running");
    // Wait for its first checkpoint, then ask for a device as `a`.
    let checkpoint = work.join("runs/digits/checkpoint/state.json");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !checkpoint.is_file() {
        assert!(Instant::now() < deadline, "no checkpoint: {}", d.log());
        std::thread::sleep(Duration::from_millis(20));
    }
    let small = d.submit(&["--tenant", "a", "--", "sleep", "3"]);
    d.wait_state(&small, "running");
    let s = d.status(&job);
    assert_eq!(s["state"], "queued", "{s}");
    assert!(
        s["reason"].as_str().unwrap().contains(&format!(
            "preempted for job {small}: tenant a is under its share"
        )),
        "{s}"
    );
    d.wait_state(&small, "succeeded");
    let s = d.wait_state(&job, "succeeded");
    assert_eq!(s["attempt"], 2, "{s}");
    let logs = stdout(&d.client(&["logs", &job]));
    assert!(logs.contains("resuming after step"), "{logs}");
    for id in &blockers {
        assert_eq!(
            d.status(id)["state"],
            "running",
            "a job that did not opt in is never preempted"
        );
        assert!(d.client(&["cancel", id]).status.success());
    }

    // The same training, never stopped, through `orch run`.
    let whole = d.state.join("whole");
    let file = train(&whole, false);
    let out = d.client(&["run", &file]);
    assert!(out.status.success(), "{}", stderr(&out));
    let params = |dir: &std::path::Path| {
        std::fs::read(dir.join("runs/digits/checkpoint/model.safetensors")).unwrap()
    };
    assert!(
        params(&work) == params(&whole),
        "the preempted run ends with the parameters of the run never stopped"
    );
}

fn usage_of(d: &Daemon, tenant: &str) -> f64 {
    let out = d.client(&["usage", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let all: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    all.as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == tenant)
        .unwrap()["usage_gpu_seconds"]
        .as_f64()
        .unwrap()
}

/// Usage is written as a job runs: after `kill -9` of the daemon and of the job's supervisor,
/// the restarted daemon still counts what the job used up to its last sample (every 10 s).
#[test]
fn usage_recorded_while_a_job_runs_survives_a_crash() {
    let config = "[[tenant]]\nname = \"lab\"\nusers = [\"{me}\"]\n";
    let mut d = daemon("usagecrash", config);
    let id = d.submit(&["--gpus", "7", "--", "sleep", "60"]);
    d.wait_state(&id, "running");
    // A second job, whose supervisor survives the crash: adopted again, and it says so.
    let kept = d.submit(&["--gpus", "1", "--", "sleep", "60"]);
    d.wait_state(&kept, "running");
    // Wait for a sample written while the job runs (the database is the daemon's record).
    let recorded = || -> f64 {
        let db = rusqlite::Connection::open(d.state.join("jobs.sqlite3")).unwrap();
        db.query_row(
            "SELECT gpu_seconds FROM jobs WHERE id = ?1",
            [id.parse::<i64>().unwrap()],
            |r| r.get(0),
        )
        .unwrap()
    };
    let deadline = Instant::now() + Duration::from_secs(25);
    let sampled = loop {
        let v = recorded();
        if v > 0.0 {
            break v;
        }
        assert!(Instant::now() < deadline, "no usage sample within 25 s");
        std::thread::sleep(Duration::from_millis(200));
    };
    let pid = supervisor_pid(&d, &id, 1);
    d.kill9();
    // SAFETY: kill(2) on the supervisor this test's daemon started.
    unsafe {
        libc::kill(pid, libc::SIGKILL);
    }
    d.restart();
    let s = d.wait_state(&id, "lost");
    // The lost job keeps at least what was sampled before the crash; the tenant's usage holds it
    // and the adopted job's, charged on through the crash.
    let job_used = s["gpu_seconds"].as_f64().unwrap();
    assert!(
        job_used >= sampled && job_used <= 7.0 * 30.0,
        "{sampled} then {job_used}; {s}"
    );
    let used = usage_of(&d, "lab");
    assert!(
        used >= sampled && used <= 8.0 * 40.0,
        "{used} GPU-seconds; {s}"
    );
    let kinds: Vec<String> = d.status(&kept)["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(kinds, ["queued", "started", "adopted"]);
    assert!(d.client(&["cancel", &kept]).status.success());
}

fn queue_fixture(name: &str) -> String {
    std::path::Path::new(orch_host::PLUGIN_WASM_DIR)
        .join(format!("{name}.wasm"))
        .display()
        .to_string()
}

/// A queue policy that loops, traps or answers nonsense loses its pass, not the daemon: the pass
/// runs fifo, the daemon logs a sentence naming the plugin, and jobs still start in order.
#[test]
fn a_hostile_queue_policy_leaves_each_pass_to_fifo() {
    for fixture in [
        "hostile_queue_spin",
        "hostile_queue_trap",
        "hostile_queue_wrong_ids",
        "hostile_queue_duplicates",
        "hostile_queue_memory_bomb",
    ] {
        let config = format!(
            "queue_policy = \"{}\"\n[[tenant]]\nname = \"lab\"\nusers = [\"{{me}}\"]\n",
            queue_fixture(fixture)
        );
        let d = daemon(&format!("hostile-{fixture}"), &config);
        let ids: Vec<String> = (0..3).map(|_| d.submit(&["--", "true"])).collect();
        for id in &ids {
            d.wait_state(id, "succeeded");
        }
        let log = d.log();
        assert!(
            log.contains(&format!("queue policy `{fixture}.wasm`"))
                && log.contains("; this pass used fifo"),
            "{fixture}: {log}"
        );
    }
}

#[test]
fn a_config_naming_a_placement_policy_as_queue_policy_is_refused() {
    let mut d = Daemon::prepare("wrongworld");
    let config = d.state.join("serve.toml");
    std::fs::write(
        &config,
        format!(
            "queue_policy = \"{}\"\n[[tenant]]\nname = \"lab\"\nusers = [\"{}\"]\n",
            queue_fixture("least_loaded"),
            me()
        ),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_orch"))
        .args(["serve", "--config", config.to_str().unwrap()])
        .env("ORCH_STATE_DIR", &d.state)
        .env("ORCH_DEVICES", lab_sim())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains(
            "`least_loaded.wasm` is not a queue policy orch can load: it implements orch:plugin/policy@0.5.0, and orch expected orch:plugin/queue@0.5.0 (or 0.4.0, 0.3.0, 0.2.0, 0.1.0)"
        ),
        "{}",
        stderr(&out)
    );
    d.config = None;
}
