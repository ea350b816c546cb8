//! Job dependencies on the daemon (`--after-ok`, `--after-any`, `--after-failed`, `--singleton`
//! and the `[job]` keys), with real daemons and processes.

use crate::serve::{Daemon, as_user, job_file, root_or_skip, test_user, two_tenants};
use crate::*;
use std::time::{Duration, Instant};

/// Waits until queued job `id` says `reason` (the reasons come from the next pass).
fn wait_reason(d: &Daemon, id: &str, reason: &str) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let s = d.status(id);
        if s["reason"] == reason {
            return s;
        }
        assert!(
            Instant::now() < deadline,
            "job {id} never said \"{reason}\": {s}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn ms(s: &serde_json::Value, key: &str) -> u64 {
    s[key].as_u64().unwrap_or_else(|| panic!("no {key} in {s}"))
}

/// A file in the daemon's state folder that the job `sh -c "while [ ! -e GO ]; ..."` waits for:
/// the test decides when the job ends.
fn gate(d: &Daemon, name: &str) -> (std::path::PathBuf, String) {
    let go = d.state.join(name);
    let script = format!(
        "i=0; while [ ! -e {} ] && [ $i -lt 400 ]; do sleep 0.05; i=$((i+1)); done",
        go.display()
    );
    (go, script)
}

#[test]
fn a_failed_jobs_after_ok_dependant_is_cancelled_naming_it_and_its_after_any_dependant_runs_after_it()
 {
    let d = Daemon::start("deps-fail");
    let (go, wait) = gate(&d, "go");
    let first = d.submit(&["--", "sh", "-c", &format!("{wait}; exit 3")]);
    d.wait_state(&first, "running");
    let ok = d.submit(&["--after-ok", &first, "--", "true"]);
    let chained = d.submit(&["--after-ok", &ok, "--", "true"]);
    let any = d.submit(&["--after-any", &first, "--", "true"]);
    let failed = d.submit(&["--after-failed", &first, "--", "true"]);
    // Each waits, saying on what, while seven devices stand free.
    let waiting = format!("waiting for job {first} (running)");
    wait_reason(&d, &ok, &waiting);
    wait_reason(&d, &any, &waiting);
    wait_reason(&d, &chained, &format!("waiting for job {ok} (queued)"));
    let listed = stdout(&d.client(&["jobs"]));
    assert!(listed.contains(&waiting), "{listed}");
    // Another job is not held back by them.
    let other = d.submit(&["--", "true"]);
    d.wait_state(&other, "succeeded");
    assert_eq!(d.status(&ok)["state"], "queued");

    std::fs::write(&go, "").unwrap();
    let ended = d.wait_state(&first, "failed");
    let s = d.wait_state(&ok, "cancelled");
    assert_eq!(
        s["reason"],
        format!("dependency never satisfied: job {first} failed (exit 3)"),
        "{s}"
    );
    assert!(s["started_at_ms"].is_null(), "{s}");
    let s = d.wait_state(&chained, "cancelled");
    assert_eq!(
        s["reason"],
        format!("dependency never satisfied: job {ok} was cancelled"),
        "{s}"
    );
    for id in [&any, &failed] {
        let s = d.wait_state(id, "succeeded");
        assert!(
            ms(&s, "started_at_ms") >= ms(&ended, "ended_at_ms"),
            "job {id} started before job {first} ended: {s} {ended}"
        );
    }
    // A dependency already ended decides at submission: after_failed on a success never runs.
    let won = d.submit(&["--", "true"]);
    d.wait_state(&won, "succeeded");
    let never = d.submit(&["--after-failed", &won, "--", "true"]);
    let s = d.wait_state(&never, "cancelled");
    assert!(
        s["reason"]
            .as_str()
            .unwrap()
            .starts_with(&format!("dependency never satisfied: job {won} succeeded")),
        "{s}"
    );
}

#[test]
fn a_restart_keeps_both_kinds_of_dependants_waiting() {
    let mut d = Daemon::start("deps-restart");
    let (go, wait) = gate(&d, "go");
    let first = d.submit(&["--", "sh", "-c", &wait]);
    d.wait_state(&first, "running");
    let ok = d.submit(&["--after-ok", &first, "--", "true"]);
    // The job file's own key, beside a flag.
    let file = job_file(
        &d.state,
        "any.toml",
        &format!("[job]\nname = \"any\"\nafter_any = [{first}]\n[command]\nargv = [\"true\"]\n"),
    );
    let any = d.submit(&[&file]);
    let waiting = format!("waiting for job {first} (running)");
    wait_reason(&d, &ok, &waiting);
    wait_reason(&d, &any, &waiting);

    d.kill9();
    d.restart();
    // Adopted again, the first job still runs, and both still wait for it.
    wait_reason(&d, &ok, &waiting);
    wait_reason(&d, &any, &waiting);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(d.status(&ok)["state"], "queued");
    assert_eq!(d.status(&any)["state"], "queued");

    let out = d.client(&["cancel", &first]);
    assert!(out.status.success(), "{}", stderr(&out));
    let _ = std::fs::write(&go, "");
    d.wait_state(&first, "cancelled");
    let s = d.wait_state(&ok, "cancelled");
    assert_eq!(
        s["reason"],
        format!("dependency never satisfied: job {first} was cancelled"),
        "{s}"
    );
    d.wait_state(&any, "succeeded");
}

#[test]
fn singleton_runs_one_job_of_a_user_and_name_at_a_time() {
    let d = Daemon::start("deps-singleton");
    let (go, wait) = gate(&d, "go");
    let file = job_file(
        &d.state,
        "single.toml",
        &format!(
            "[job]\nname = \"nightly\"\nsingleton = true\n[command]\nargv = [\"sh\", \"-c\", \"{wait}\"]\n"
        ),
    );
    let first = d.submit(&[&file]);
    d.wait_state(&first, "running");
    let second = d.submit(&[&file]);
    let third = d.submit(&["--singleton", &file]);
    let s = wait_reason(
        &d,
        &second,
        &format!(
            "waiting for job {first} (running): singleton, one job of this user and name runs at a time"
        ),
    );
    assert_eq!(s["state"], "queued");
    assert_eq!(d.status(&third)["state"], "queued");
    std::fs::write(&go, "").unwrap();
    let a = d.wait_state(&first, "succeeded");
    let b = d.wait_state(&second, "succeeded");
    let c = d.wait_state(&third, "succeeded");
    assert!(ms(&b, "started_at_ms") >= ms(&a, "ended_at_ms"), "{a} {b}");
    assert!(ms(&c, "started_at_ms") >= ms(&b, "ended_at_ms"), "{b} {c}");
}

#[test]
fn an_unknown_job_and_a_bad_id_are_refused_at_submission() {
    let d = Daemon::start("deps-refused");
    let known = d.submit(&["--", "true"]);
    d.wait_state(&known, "succeeded");
    // Unknown, and an id not given yet (this job's own, or later).
    for id in ["99999", &(known.parse::<i64>().unwrap() + 1).to_string()] {
        let out = d.client(&[
            "submit",
            "--after-ok",
            &format!("{known},{id}"),
            "--",
            "true",
        ]);
        assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
        assert!(
            stderr(&out).contains(&format!(
                "after_ok names job {id}, and there is no job {id} you may see"
            )),
            "{}",
            stderr(&out)
        );
    }
    let listed = stdout(&d.client(&["jobs", "--all", "--json"]));
    let jobs: serde_json::Value = serde_json::from_str(&listed).unwrap();
    assert_eq!(
        jobs.as_array().unwrap().len(),
        1,
        "a refused job was queued"
    );
    let out = d.client(&["submit", "--after-any", "0", "--", "true"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let file = job_file(
        &d.state,
        "bad.toml",
        "[job]\nname = \"bad\"\nafter_ok = [\"12\"]\n[command]\nargv = [\"true\"]\n",
    );
    let out = d.client(&["submit", &file]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("bad.toml:3:"), "{}", stderr(&out));
}

#[test]
fn another_tenants_job_is_refused_as_unknown() {
    if !root_or_skip("another_tenants_job_is_refused_as_unknown") {
        return;
    }
    let alice = test_user("orchtesta");
    let bob = test_user("orchtestb");
    let (d, public) = two_tenants("deps-tenants", |_| {});
    let socket = d.socket();
    let out = as_user(alice, &socket, &public, &["submit", "--", "sleep", "5"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let hers = stdout(&out).trim().to_string();
    let out = as_user(
        bob,
        &socket,
        &public,
        &["submit", "--after-any", &hers, "--", "true"],
    );
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains(&format!(
            "after_any names job {hers}, and there is no job {hers} you may see"
        )),
        "{}",
        stderr(&out)
    );
    // Alice may wait on her own; the admin cancels hers, and her dependant goes.
    let out = as_user(
        alice,
        &socket,
        &public,
        &["submit", "--after-ok", &hers, "--", "true"],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let mine = stdout(&out).trim().to_string();
    assert!(d.client(&["cancel", &hers]).status.success());
    d.wait_state(&mine, "cancelled");
}

/// A job array's id stands for all of its tasks: `--after-ok` waits for every task and is
/// cancelled when one fails; `--after-any` runs once the last task ended; `--after-failed` on an
/// array is refused, since its tasks may end some one way and some the other.
#[test]
fn a_dependency_on_an_array_waits_for_every_task() {
    let d = Daemon::start("deps-array");
    let work = d.state.join("work");
    std::fs::create_dir_all(&work).unwrap();
    let (go, wait) = gate(&d, "go");
    // Task 1 fails; tasks 0 and 2 succeed; all wait for the gate.
    let sweep = job_file(
        &work,
        "sweep.toml",
        &format!(
            "[job]\nname = \"sw\"\n[sweep]\nk = [0, 1, 2]\n[command]\nargv = [\"sh\", \"-c\", \"{}; test {{k}} != 1\"]\n",
            wait.replace('"', "\\\"")
        ),
    );
    let array = d.submit(&[&sweep]);
    let ok = d.submit(&["--after-ok", &array, "--", "true"]);
    let any = d.submit(&["--after-any", &array, "--", "true"]);
    let refused = d.client(&["submit", "--after-failed", &array, "--", "true"]);
    assert_eq!(refused.status.code(), Some(2), "{}", stderr(&refused));
    assert!(
        stderr(&refused).contains("after_failed names job array"),
        "{}",
        stderr(&refused)
    );
    std::fs::write(&go, b"").unwrap();
    let s = d.wait_state(&ok, "cancelled");
    let reason = s["reason"].as_str().unwrap_or_default().to_string();
    assert!(reason.contains("dependency never satisfied"), "{s}");
    let a = d.wait_state(&any, "succeeded");
    let tasks: Vec<serde_json::Value> =
        (0..3).map(|t| d.status(&format!("{array}[{t}]"))).collect();
    let last_end = tasks.iter().map(|t| ms(t, "ended_at_ms")).max().unwrap();
    assert!(
        ms(&a, "started_at_ms") >= last_end,
        "the after-any dependant started before the array's last task ended: {a} {tasks:?}"
    );
}

/// `orch run` keeps no dependencies (the daemon and Slurm do): it says so and runs the job now.
#[test]
fn orch_run_says_it_does_not_wait_for_dependencies() {
    let dir = scratch_dir("deps-run");
    let sim = dir.join("sim.toml");
    std::fs::write(&sim, "[[gpu]]\nname = \"a\"\nmemory_total = \"8GiB\"\n").unwrap();
    let job = dir.join("job.toml");
    std::fs::write(
        &job,
        "[job]\nname = \"eval\"\nafter_ok = [12]\n[command]\nargv = [\"echo\", \"ran now\"]\n",
    )
    .unwrap();
    let sim = format!("sim:{}", sim.display());
    let state = dir.join("state").display().to_string();
    let out = orch(
        &["run", &job.display().to_string()],
        &[("ORCH_DEVICES", &sim), ("ORCH_STATE_DIR", &state)],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("ran now"), "{}", stdout(&out));
    assert!(
        stderr(&out)
            .contains("after_ok, after_any, after_failed and singleton are kept by `orch submit`"),
        "{}",
        stderr(&out)
    );
}
