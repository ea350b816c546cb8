//! Job arrays on the daemon: a `[sweep]` submitted with `orch submit` queues one job per task,
//! runs at most `max_parallel` of them at once, folds in `orch jobs`, and is cancelled and waited
//! for as one.

use crate::serve::{Daemon, job_file};
use crate::*;
use std::time::{Duration, Instant};

/// `orch jobs --json` (every job with `--all`).
fn jobs_json(d: &Daemon, all: bool) -> Vec<serde_json::Value> {
    let mut args = vec!["jobs", "--json"];
    if all {
        args.push("--all");
    }
    let out = d.client(&args);
    assert!(out.status.success(), "{}", stderr(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Waits (bounded) until `ok` holds of the array's tasks as `orch jobs --json --all` lists them.
fn wait_tasks(
    d: &Daemon,
    array: &str,
    what: &str,
    ok: impl Fn(&[serde_json::Value]) -> bool,
) -> Vec<serde_json::Value> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let tasks: Vec<serde_json::Value> = jobs_json(d, true)
            .into_iter()
            .filter(|j| j["array_id"] == array)
            .collect();
        if ok(&tasks) {
            return tasks;
        }
        assert!(Instant::now() < deadline, "never {what}: {tasks:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn count(tasks: &[serde_json::Value], state: &str) -> usize {
    tasks.iter().filter(|t| t["state"] == state).count()
}

#[test]
fn a_sweep_of_six_runs_six_tasks_at_most_max_parallel_at_once_each_with_its_parameters() {
    let d = Daemon::start("array-six");
    let work = d.state.join("work");
    std::fs::create_dir_all(&work).unwrap();
    // Each task records when it ran (its own clock, inside the daemon's start and end).
    let file = job_file(
        &work,
        "sweep.toml",
        &format!(
            "[job]\nname = \"sw\"\n[sweep]\nlr = [0.1, 0.01, 0.001]\nseed = [1, 2]\nmax_parallel = 2\n[command]\nargv = [\"sh\", \"-c\", \"echo task=$ORCH_SWEEP_TASK lr=$LR seed=$SEED arg={{lr}}; date +%s%N > {w}/start-$ORCH_SWEEP_TASK; sleep 0.7; date +%s%N > {w}/end-$ORCH_SWEEP_TASK\"]\n",
            w = work.display()
        ),
    );
    let out = d.client(&["submit", &file]);
    assert!(out.status.success(), "{}", stderr(&out));
    let id = stdout(&out).trim().to_string();
    assert!(
        stderr(&out).contains(&format!("job array {id}[0-5]: 6 task(s)")),
        "{}",
        stderr(&out)
    );
    let out = d.client(&["wait", &id]);
    assert!(
        out.status.success(),
        "{}{}",
        stderr(&out),
        d.client_status_text(&id)
    );
    let tasks = wait_tasks(&d, &id, "six tasks", |t| t.len() == 6);
    assert_eq!(count(&tasks, "succeeded"), 6, "{tasks:?}");
    // Each task saw its own combination: keys in order, the last varying fastest.
    let lrs = ["0.1", "0.01", "0.001"];
    for k in 0..6usize {
        let logs = stdout(&d.client(&["logs", &format!("{id}[{k}]")]));
        let lr = lrs[k / 2];
        assert_eq!(
            logs.trim(),
            format!("task={k} lr={lr} seed={} arg={lr}", k % 2 + 1),
            "task {k}"
        );
    }
    // At most two at once, and two did run together.
    let read = |name: String| -> u128 {
        std::fs::read_to_string(work.join(name))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    let spans: Vec<(u128, u128)> = (0..6)
        .map(|k| (read(format!("start-{k}")), read(format!("end-{k}"))))
        .collect();
    let most = spans
        .iter()
        .map(|&(start, _)| {
            spans
                .iter()
                .filter(|&&(s, e)| s <= start && start < e)
                .count()
        })
        .max()
        .unwrap();
    assert_eq!(most, 2, "tasks at once: {spans:?}");
    // The daemon's own records agree: no moment with more than two tasks running.
    let recorded: Vec<(u64, u64)> = tasks
        .iter()
        .map(|t| {
            (
                t["started_at_ms"].as_u64().unwrap(),
                t["ended_at_ms"].as_u64().unwrap(),
            )
        })
        .collect();
    for &(start, _) in &recorded {
        let at_once = recorded
            .iter()
            .filter(|&&(s, e)| s <= start && start < e)
            .count();
        assert!(at_once <= 2, "{recorded:?}");
    }
    // Every task is a job of the array, numbered from the array's id.
    let mut seen: Vec<u64> = tasks
        .iter()
        .map(|t| t["array_task"].as_u64().unwrap())
        .collect();
    seen.sort();
    assert_eq!(seen, [0, 1, 2, 3, 4, 5]);
    let first = tasks.iter().find(|t| t["array_task"] == 0).unwrap();
    assert_eq!(first["id"], id.as_str());
    // `orch status ID` is the array: its first task with every task's state.
    let s = d.status(&id);
    assert_eq!(s["array"]["tasks"], 6, "{s}");
    assert_eq!(s["array"]["succeeded"], 6, "{s}");
    assert_eq!(s["array"]["max_parallel"], 2, "{s}");
    let text = stdout(&d.client(&["status", &id]));
    assert!(
        text.contains(&format!(
            "array        {id}[0-5]: 6 task(s) (at most 2 at once): 6 succeeded"
        )),
        "{text}"
    );
    // Each task was charged like any job.
    for t in &tasks {
        assert!(t["gpu_seconds"].as_f64().unwrap() > 0.0, "{t}");
    }
}

impl Daemon {
    /// `orch status ID` as text, for failure messages.
    fn client_status_text(&self, id: &str) -> String {
        stdout(&self.client(&["status", id]))
    }
}

#[test]
fn orch_jobs_folds_an_array_and_cancel_of_the_array_cancels_what_is_left() {
    let d = Daemon::start("array-cancel");
    let file = job_file(
        &d.state,
        "hold.toml",
        "[job]\nname = \"hold\"\n[sweep]\nk = [0, 1, 2, 3, 4]\nmax_parallel = 2\n[command]\nargv = [\"sleep\", \"30\"]\n",
    );
    let id = d.submit(&[&file]);
    let tasks = wait_tasks(&d, &id, "two running", |t| {
        count(t, "running") == 2 && count(t, "queued") == 3
    });
    // Two tasks run however many devices are free: the others wait, saying why.
    let why = format!("array {id}: 2 of 2 tasks running (max_parallel)");
    let queued = d.status(&format!("{id}[4]"));
    assert_eq!(queued["state"], "queued");
    assert!(
        queued["reason"].as_str().unwrap_or("").starts_with(&why),
        "{queued}"
    );
    let running: Vec<u64> = tasks
        .iter()
        .filter(|t| t["state"] == "running")
        .map(|t| t["array_task"].as_u64().unwrap())
        .collect();
    assert_eq!(running, [0, 1]);
    // The table folds the queued tasks; running ones stand alone.
    let table = stdout(&d.client(&["jobs"]));
    let ids: Vec<&str> = table
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    let want: Vec<String> = vec![format!("{id}[2-4]"), format!("{id}[0]"), format!("{id}[1]")];
    assert_eq!(ids, want, "{table}");
    assert!(table.contains(&why), "{table}");
    let expanded = stdout(&d.client(&["jobs", "--expand"]));
    assert_eq!(expanded.lines().count(), 6, "{expanded}");
    assert!(expanded.contains(&format!("{id}[3] ")), "{expanded}");
    // One task alone: by `ID[N]`.
    let out = d.client(&["cancel", &format!("{id}[3]")]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(d.status(&format!("{id}[3]"))["state"], "cancelled");
    assert_eq!(d.status(&format!("{id}[2]"))["state"], "queued");
    // The array: every task left, running and queued.
    let out = d.client(&["cancel", &id]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains(&format!(
            "job array {id} cancelled (2 running task(s) being stopped)"
        )),
        "{}",
        stdout(&out)
    );
    let tasks = wait_tasks(&d, &id, "all cancelled", |t| count(t, "cancelled") == 5);
    assert_eq!(tasks.len(), 5);
    // None of the queued ones started.
    for t in &tasks {
        if t["array_task"].as_u64().unwrap() >= 2 {
            assert!(t["started_at_ms"].is_null(), "{t}");
        }
    }
    d.wait_no_leases();
    // Waiting for the array: every task ended, not all succeeded.
    let out = d.client(&["wait", &id]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains(&format!(
            "job array {id}: 5 of 5 task(s) did not succeed ({id}[0-4]): {id}[0-4]: 5 task(s) (at most 2 at once): 5 cancelled"
        )),
        "{}",
        stderr(&out)
    );
    // Nothing is left to cancel.
    let out = d.client(&["cancel", &id]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains(&format!("job array {id} has already ended")),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_tenants_max_queued_refuses_the_whole_array() {
    let mut d = Daemon::prepare("array-limits");
    let me = stdout(
        &std::process::Command::new("id")
            .arg("-un")
            .output()
            .unwrap(),
    )
    .trim()
    .to_string();
    let config = d.state.join("serve.toml");
    std::fs::write(
        &config,
        format!("[[tenant]]\nname = \"lab\"\nusers = [\"{me}\"]\nmax_queued = 4\n"),
    )
    .unwrap();
    d.config = Some(config);
    d.restart();
    let six = job_file(
        &d.state,
        "six.toml",
        "[job]\nname = \"six\"\n[sweep]\nk = [0, 1, 2, 3, 4, 5]\n[command]\nargv = [\"true\"]\n",
    );
    let out = d.client(&["submit", &six]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out)
            .contains("this [sweep] adds 6, past its max_queued = 4: the whole array is refused"),
        "{}",
        stderr(&out)
    );
    assert!(jobs_json(&d, true).is_empty(), "no task was queued");
    // An array that fits is taken whole.
    let four = job_file(
        &d.state,
        "four.toml",
        "[job]\nname = \"four\"\n[sweep]\nk = [0, 1, 2, 3]\n[command]\nargv = [\"true\"]\n",
    );
    let id = d.submit(&[&four]);
    let out = d.client(&["wait", &id]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(jobs_json(&d, true).len(), 4);
}

#[test]
fn a_train_sweep_runs_each_task_with_its_parameters_in_its_own_folder() {
    let d = Daemon::start("array-train");
    let digits = root().join("examples/digits/data/digits.csv.gz");
    let work = d.state.join("work");
    std::fs::create_dir_all(&work).unwrap();
    let file = job_file(
        &work,
        "train.toml",
        &format!(
            "[job]\nname = \"digits\"\n[sweep]\nseed = [3, 4]\n[train]\nplugin = \"mlp\"\nsteps = 5\nbatch_size = 32\n[train.config]\nhidden = \"16\"\n[train.data]\nformat = \"csv\"\ntrain = \"{d}\"\ntest = \"{d}\"\nscale = 16\n",
            d = digits.display()
        ),
    );
    let id = d.submit(&[&file]);
    let out = d.client(&["wait", &id]);
    assert!(
        out.status.success(),
        "{}\n{}",
        stderr(&out),
        stdout(&d.client(&["logs", "--stderr", &format!("{id}[1]")]))
    );
    for k in 0..2 {
        let folder = work.join(format!("runs/digits/sweep-{k}"));
        assert!(
            folder.join("metrics.jsonl").is_file(),
            "task {k} wrote no metrics in {}",
            folder.display()
        );
    }
    assert!(!work.join("runs/digits/metrics.jsonl").exists());
    // Each ran its own seed, recorded in its checkpoint.
    for (k, seed) in [(0, 3), (1, 4)] {
        let state = work.join(format!("runs/digits/sweep-{k}/checkpoint/state.json"));
        let meta: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&state).unwrap()).unwrap();
        assert_eq!(meta["seed"], seed, "task {k}: {meta}");
    }
}

#[test]
fn an_array_keeps_its_tasks_and_its_bound_across_a_daemon_restart() {
    let mut d = Daemon::start("array-restart");
    let file = job_file(
        &d.state,
        "hold.toml",
        "[job]\nname = \"hold\"\n[sweep]\nk = [0, 1, 2, 3]\nmax_parallel = 2\n[command]\nargv = [\"sleep\", \"30\"]\n",
    );
    let id = d.submit(&[&file]);
    wait_tasks(&d, &id, "two running", |t| {
        count(t, "running") == 2 && count(t, "queued") == 2
    });
    d.kill9();
    d.restart();
    // The running tasks are adopted and still count against max_parallel: nothing more starts.
    std::thread::sleep(Duration::from_millis(500));
    let tasks = wait_tasks(&d, &id, "adopted", |t| t.len() == 4);
    assert_eq!((count(&tasks, "running"), count(&tasks, "queued")), (2, 2));
    let queued = d.status(&format!("{id}[3]"));
    assert!(
        queued["reason"]
            .as_str()
            .unwrap_or("")
            .starts_with(&format!("array {id}: 2 of 2 tasks running (max_parallel)")),
        "{queued}"
    );
    // One task ends: one more starts, to two again.
    assert!(d.client(&["cancel", &format!("{id}[0]")]).status.success());
    let tasks = wait_tasks(&d, &id, "the next task running", |t| {
        count(t, "running") == 2 && count(t, "cancelled") == 1
    });
    assert_eq!(count(&tasks, "queued"), 1);
    assert!(d.client(&["cancel", &id]).status.success());
    wait_tasks(&d, &id, "all ended", |t| count(t, "cancelled") == 4);
}

#[test]
fn the_api_names_a_task_as_array_and_index_and_a_lease_is_never_an_array() {
    use crate::held_leases::http;
    let d = Daemon::start("array-api");
    let sweep = "[job]\nname = \"nb\"\n[sweep]\nk = [0, 1]\n[command]\nargv = [\"true\"]\n";
    let (status, answer) = http(
        &d,
        "POST",
        "/v1/leases",
        &serde_json::json!({
            "job_text": sweep, "job_path": "/tmp/orch.lease()", "cwd": "/tmp", "wait": false,
        }),
    );
    assert_eq!(status, 400, "{answer}");
    assert!(
        answer["error"]
            .as_str()
            .unwrap()
            .starts_with("/tmp/orch.lease(): a lease is one job, not a [sweep]"),
        "{answer}"
    );
    let (status, answer) = http(
        &d,
        "POST",
        "/v1/jobs",
        &serde_json::json!({ "job_text": sweep, "job_path": "/tmp/nb.toml", "cwd": "/tmp" }),
    );
    assert_eq!(status, 201, "{answer}");
    let id = answer["id"].as_str().unwrap().to_string();
    let (status, task) = http(
        &d,
        "GET",
        &format!("/v1/jobs/{id}%5B1%5D"),
        &serde_json::json!({}),
    );
    assert_eq!(status, 200, "{task}");
    assert_eq!(
        (&task["array_id"], &task["array_task"]),
        (&serde_json::json!(id), &serde_json::json!(1))
    );
    assert!(
        task.get("array").is_none(),
        "one task is not the array: {task}"
    );
    assert_ne!(task["id"], id.as_str());
    let (_, head) = http(&d, "GET", &format!("/v1/jobs/{id}"), &serde_json::json!({}));
    assert_eq!(head["array"]["tasks"], 2, "{head}");
    for missing in [
        format!("{id}%5B2%5D"),
        format!("{id}%5B-1%5D"),
        format!("{id}%5B"),
    ] {
        let (status, _) = http(
            &d,
            "GET",
            &format!("/v1/jobs/{missing}"),
            &serde_json::json!({}),
        );
        assert_eq!(status, 404, "{missing}");
    }
}
