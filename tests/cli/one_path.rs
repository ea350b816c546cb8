//! One path for a daemon's `[train]` job: the daemon places it once and its supervisor runs the
//! trainer on that placement: itself for its own user's job (its process tree is the supervisor
//! alone), in one `orch __train` process with the user's ids for another user's. Its policy
//! decides once, it writes as its user, and a cancel stops it at a step with its checkpoint.

use crate::serve::{Daemon, as_user, root_or_skip, supervisor_pid, test_user, two_tenants};
use crate::*;
use std::time::{Duration, Instant};

/// Waits (at most `limit`) for `done`.
fn until(limit: Duration, what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < deadline, "never happened: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// A `[train]` job of `epochs` on the digits, in `dir`, writing to `dir/runs/digits`.
fn train_file(dir: &Path, epochs: u32) -> String {
    let digits = root().join("examples/digits/data/digits.csv.gz");
    crate::serve::job_file(
        dir,
        "train.toml",
        &format!(
            "[job]\nname = \"digits\"\n[resources]\ngpus = 2\nmemory_limit = \"256MiB\"\n[train]\nplugin = \"mlp\"\nepochs = {epochs}\nbatch_size = 64\nseed = 3\n[train.config]\nhidden = \"32\"\nlr = 0.1\n[train.data]\nformat = \"csv\"\ntrain = \"{g}\"\ntest = \"{g}\"\nscale = 16\n",
            g = digits.display()
        ),
    )
}

/// `pid` and every process under it, from `/proc/PID/task/*/children`.
fn process_tree(pid: i32) -> Vec<i32> {
    let mut all = vec![pid];
    let mut next = 0;
    while next < all.len() && all.len() < 10_000 {
        let tasks = std::fs::read_dir(format!("/proc/{}/task", all[next]));
        for task in tasks.into_iter().flatten().flatten() {
            let children = read(&task.path().join("children"));
            all.extend(
                children
                    .split_whitespace()
                    .filter_map(|c| c.parse::<i32>().ok()),
            );
        }
        next += 1;
    }
    all
}

/// The processes of `tree` that run the orch binary.
fn orch_processes(tree: &[i32]) -> Vec<i32> {
    let orch = Path::new(env!("CARGO_BIN_EXE_orch"))
        .canonicalize()
        .unwrap();
    tree.iter()
        .copied()
        .filter(|pid| {
            std::fs::read_link(format!("/proc/{pid}/exe"))
                .is_ok_and(|exe| exe == orch || exe.starts_with(&orch))
        })
        .collect()
}

/// The lines of every log of a daemon's run (its own, and each job folder's) that say a policy
/// decided.
fn decisions(d: &Daemon) -> Vec<String> {
    let mut text = d.log();
    for folder in std::fs::read_dir(d.state.join("jobs")).unwrap().flatten() {
        for name in ["supervisor.log", "stderr", "stdout"] {
            text.push_str(&read(&folder.path().join(name)));
        }
    }
    text.lines()
        .filter(|l| l.contains("policy least-loaded chose devices"))
        .map(str::to_string)
        .collect()
}

/// A running daemon `[train]` job is one process, its supervisor, which runs the trainer itself;
/// its policy decided once, in the daemon; a cancel stops it at the end of a step with its
/// checkpoint, recorded as cancelled.
#[test]
fn a_daemon_train_job_is_its_supervisor_alone_placed_once_and_cancelled_at_a_step() {
    let mut d = Daemon::prepare("one-path");
    d.env.push(("RUST_LOG", "orch::policy=debug".to_string()));
    d.restart();
    let work = d.state.join("work");
    std::fs::create_dir_all(&work).unwrap();
    let file = train_file(&work, 600);
    let socket = d.socket().display().to_string();
    let state = d.state.display().to_string();
    // The submitting environment asks for the decisions too: a second placement in a process
    // of the job's would write its line in the job's logs.
    let out = orch(
        &["submit", &file],
        &[
            ("ORCH_SERVER", &socket),
            ("ORCH_STATE_DIR", &state),
            ("RUST_LOG", "orch::policy=debug"),
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let id = stdout(&out).trim().to_string();
    d.wait_state(&id, "running");
    let metrics = work.join("runs/digits/metrics.jsonl");
    until(Duration::from_secs(60), "a step done", || {
        !read(&metrics).is_empty()
    });

    let supervisor = supervisor_pid(&d, &id, 1);
    let tree = process_tree(supervisor);
    assert_eq!(
        orch_processes(&tree),
        vec![supervisor],
        "the job's processes are its supervisor alone: {tree:?}"
    );
    let threads = std::fs::read_dir(format!("/proc/{supervisor}/task"))
        .unwrap()
        .count();
    assert!(
        threads > 2,
        "the trainer's replicas run as threads of the supervisor ({threads} threads)"
    );
    let progress = stdout(&d.client(&["logs", &id]));
    assert!(progress.contains("2 replica(s) on sim:"), "{progress}");

    assert!(d.client(&["cancel", &id]).status.success());
    let s = d.wait_state(&id, "cancelled");
    assert_eq!(s["reason"], "cancelled", "{s}");
    let saved: serde_json::Value =
        serde_json::from_str(&read(&work.join("runs/digits/checkpoint/state.json")))
            .expect("a checkpoint saved at the cancel");
    let step = saved["step"].as_u64().unwrap();
    assert!(step >= 1, "saved at step {step}");
    let err = stdout(&d.client(&["logs", "--stderr", &id]));
    assert!(
        err.contains(&format!(
            "orch: job digits stopped on SIGTERM after step {step}, with its checkpoint in"
        )),
        "{err}"
    );
    d.wait_no_leases();

    let decided = decisions(&d);
    assert_eq!(
        decided.len(),
        1,
        "the policy decided once, in the daemon: {decided:#?}"
    );
    assert!(d.log().contains("chose devices"), "{}", d.log());
}

/// The real, effective, saved and file-system user ids of process `pid` (`/proc/PID/status`).
fn uids(pid: i32) -> Vec<u32> {
    read(Path::new(&format!("/proc/{pid}/status")))
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .map(|ids| {
            ids.split_whitespace()
                .filter_map(|i| i.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// `orch ARGS` as `user`, in `cwd`, against the daemon at `socket`, its environment asking for
/// the policy's decisions (a placement in a process of the job's would log one in its logs).
fn as_user_logging(
    user: (u32, u32),
    socket: &Path,
    cwd: &Path,
    args: &[&str],
) -> std::process::Output {
    use std::os::unix::process::CommandExt;
    std::process::Command::new(env!("CARGO_BIN_EXE_orch"))
        .args(args)
        .current_dir(cwd)
        .env("ORCH_SERVER", socket)
        .env("RUST_LOG", "orch::policy=debug")
        .env_remove("ORCH_STATE_DIR")
        .uid(user.0)
        .gid(user.1)
        .output()
        .unwrap()
}

/// A `[train]` job of another user, run by a root daemon, runs its trainer in one `orch __train`
/// process with the user's ids in full (real, effective, saved: never root's), started by its
/// supervisor: no `orch run`, no second placement. It reads and writes as that user: its
/// checkpoint, metrics and run folder are the user's, the job folder's records root's.
#[test]
fn a_daemon_train_job_of_another_user_runs_in_one_train_process_as_that_user() {
    if !root_or_skip("a_daemon_train_job_of_another_user_runs_in_one_train_process_as_that_user") {
        return;
    }
    use std::os::unix::fs::MetadataExt;
    let alice = test_user("orchtesta");
    let (mut d, public) = two_tenants("one-path-user", |_| {});
    d.kill9();
    d.env.push(("RUST_LOG", "orch::policy=debug".to_string()));
    d.restart();
    let work = public.join("alice-train");
    crate::serve::world_dir(&work);
    let file = train_file(&work, 600);
    let out = as_user_logging(alice, &d.socket(), &public, &["submit", &file]);
    assert!(out.status.success(), "{}", stderr(&out));
    let id = stdout(&out).trim().to_string();
    d.wait_state(&id, "running");
    let metrics = work.join("runs/digits/metrics.jsonl");
    until(Duration::from_secs(60), "a step done", || {
        !read(&metrics).is_empty()
    });

    let supervisor = supervisor_pid(&d, &id, 1);
    let tree = process_tree(supervisor);
    let orchs = orch_processes(&tree);
    assert_eq!(orchs.len(), 2, "the supervisor and its trainer: {tree:?}");
    assert_eq!(orchs[0], supervisor);
    let trainer = orchs[1];
    let argv = read(Path::new(&format!("/proc/{trainer}/cmdline"))).replace('\0', " ");
    assert!(argv.contains(" __train "), "{argv}");
    assert!(!argv.contains(" run "), "no orch run: {argv}");
    assert_eq!(
        uids(trainer),
        vec![alice.0; 4],
        "the trainer's real, effective, saved and file-system ids are the user's"
    );

    let out = as_user(alice, &d.socket(), &public, &["cancel", &id]);
    assert!(out.status.success(), "{}", stderr(&out));
    let s = d.wait_state(&id, "cancelled");
    assert_eq!(s["reason"], "cancelled", "{s}");
    for made in [
        "runs/digits",
        "runs/digits/checkpoint/state.json",
        "runs/digits/checkpoint/model.safetensors",
        "runs/digits/metrics.jsonl",
    ] {
        let meta = std::fs::metadata(work.join(made)).unwrap();
        assert_eq!(
            (meta.uid(), meta.gid()),
            alice,
            "{made} belongs to the job's user"
        );
    }
    let folder = d.state.join("jobs").join(format!("{id}-1"));
    for record in ["exit.json", "usage.json", "stdout"] {
        let meta = std::fs::metadata(folder.join(record)).unwrap();
        assert_eq!(meta.uid(), 0, "{record} is the daemon's");
    }
    let decided = decisions(&d);
    assert_eq!(
        decided.len(),
        1,
        "the policy decided once, in the daemon: {decided:#?}"
    );
    let _ = std::fs::remove_dir_all(&work);
}

/// The threads of `pid` whose name starts with `prefix` (`/proc/PID/task/*/comm`).
fn threads_named(pid: i32, prefix: &str) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
        .filter(|t| read(&t.path().join("comm")).starts_with(prefix))
        .count()
}

/// A trainer run in its supervisor sees the job's environment as a command job's process would
/// (here `RAYON_NUM_THREADS` of the submitting environment: each of its 2 replicas computes on
/// 4 threads), and the log lines said while it runs go to the job's stderr log, not the
/// supervisor's.
#[test]
fn a_trainer_in_its_supervisor_has_the_jobs_environment_and_its_lines_in_the_jobs_stderr() {
    let mut d = Daemon::prepare("one-path-env");
    d.env.push(("RUST_LOG", "orch_runner=debug".to_string()));
    d.restart();
    let work = d.state.join("work");
    std::fs::create_dir_all(&work).unwrap();
    let file = train_file(&work, 600);
    let socket = d.socket().display().to_string();
    let state = d.state.display().to_string();
    let cache = work.join("cache").display().to_string();
    let out = orch(
        &["submit", &file],
        &[
            ("ORCH_SERVER", &socket),
            ("ORCH_STATE_DIR", &state),
            ("RAYON_NUM_THREADS", "8"),
            ("ORCH_CACHE_DIR", &cache),
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let id = stdout(&out).trim().to_string();
    d.wait_state(&id, "running");
    let metrics = work.join("runs/digits/metrics.jsonl");
    until(Duration::from_secs(60), "a step done", || {
        !read(&metrics).is_empty()
    });
    let supervisor = supervisor_pid(&d, &id, 1);
    assert_eq!(
        threads_named(supervisor, "orch-replica-0-"),
        4,
        "RAYON_NUM_THREADS=8 over 2 replicas"
    );
    assert!(d.client(&["cancel", &id]).status.success());
    d.wait_state(&id, "cancelled");
    let err = stdout(&d.client(&["logs", "--stderr", &id]));
    // Said while the trainer's home is made: whether the job's GPU nodes are confined.
    assert!(
        err.contains("device nodes"),
        "the trainer's log lines in the job's stderr: {err}"
    );
    // The supervisor's own lines stay in its log.
    assert!(!err.contains("orch supervisor:"), "{err}");
    let own = read(
        &d.state
            .join("jobs")
            .join(format!("{id}-1"))
            .join("supervisor.log"),
    );
    assert!(own.contains("stopping the job (cancelled)"), "{own}");
}

/// Another user's trainer reads as that user: data only root may read fails the job, its
/// reason the sentence `orch __train` ended with (the last line of the job's stderr).
#[test]
fn another_users_trainer_cannot_read_roots_data_and_says_so_as_the_jobs_reason() {
    if !root_or_skip("another_users_trainer_cannot_read_roots_data_and_says_so_as_the_jobs_reason")
    {
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let alice = test_user("orchtesta");
    let (d, public) = two_tenants("one-path-denied", |_| {});
    let work = public.join("alice-denied");
    crate::serve::world_dir(&work);
    let secret = work.join("secret.csv.gz");
    std::fs::copy(root().join("examples/digits/data/digits.csv.gz"), &secret).unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    let file = crate::serve::job_file(
        &work,
        "train.toml",
        &format!(
            "[job]\nname = \"denied\"\n[resources]\ngpus = 1\n[train]\nplugin = \"mlp\"\nepochs = 1\nbatch_size = 64\n[train.config]\nhidden = \"32\"\n[train.data]\nformat = \"csv\"\ntrain = \"{s}\"\ntest = \"{s}\"\nscale = 16\n",
            s = secret.display()
        ),
    );
    let out = as_user(alice, &d.socket(), &public, &["submit", &file]);
    assert!(out.status.success(), "{}", stderr(&out));
    let id = stdout(&out).trim().to_string();
    let s = d.wait_state(&id, "failed");
    let reason = s["reason"].as_str().unwrap_or_default().to_string();
    assert!(
        reason.contains("secret.csv.gz") && reason.to_lowercase().contains("permission denied"),
        "{s}"
    );
    let _ = std::fs::remove_dir_all(&work);
}
