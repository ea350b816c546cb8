//! A job's warning signal (`[job] signal`, `--signal`) and grace period (`[job] grace`, capped by
//! `max_grace`) on a real daemon, with real processes: when the signal comes, what a cancel
//! sends, when SIGKILL follows; a `[train]` job that saves on its signal and resumes.

use crate::serve::{Daemon, job_file};
use crate::*;
use std::path::Path;
use std::time::{Duration, Instant};

fn daemon(tag: &str, config: &str) -> Daemon {
    let mut d = Daemon::prepare(tag);
    let path = d.state.join("serve.toml");
    std::fs::write(&path, config.replace("{me}", &me())).unwrap();
    d.config = Some(path);
    d.restart();
    d
}

/// Polls `what` every 20 ms until it holds; fails the test after `limit`.
fn until(limit: Duration, what: &str, mut done: impl FnMut() -> bool) {
    let give_up = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < give_up, "{what}: not after {limit:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// A shell script that writes its pid to `dir/pid`, and a line to `dir/log` at its start and at
/// each signal it traps (`usr1`, `term`; the time in seconds after it), then loops. `on_term` is
/// what it does at SIGTERM after writing.
fn script(dir: &Path, on_term: &str) -> String {
    let log = dir.join("log").display().to_string();
    let pid = dir.join("pid").display().to_string();
    format!(
        "now() {{ date +%s.%N; }}; trap 'echo usr1 $(now) >> {log}' USR1; \
         trap 'echo term $(now) >> {log}; {on_term}' TERM; \
         echo start $(now) >> {log}; echo $$ > {pid}; while :; do sleep 0.05; done"
    )
}

/// The seconds after `start` that the log line starting with `word` was written.
fn at(log: &str, word: &str) -> Option<f64> {
    let time = |w: &str| {
        log.lines()
            .find_map(|l| l.strip_prefix(&format!("{w} ")))
            .and_then(|t| t.trim().parse::<f64>().ok())
    };
    Some(time(word)? - time("start")?)
}

fn alive(pid: &str) -> bool {
    !pid.is_empty() && Path::new("/proc").join(pid.trim()).exists()
}

/// `signal = "USR1@5s"` with an 8 s limit: SIGUSR1 about 3 s after the job starts, the job runs
/// on, and SIGTERM comes at the limit itself.
#[test]
fn the_warning_signal_comes_that_long_before_the_time_limit() {
    let d = daemon(
        "sigwarn",
        "[[tenant]]\nname = \"lab\"\nusers = [\"{me}\"]\n",
    );
    let work = d.state.join("warn");
    std::fs::create_dir_all(&work).unwrap();
    let file = job_file(
        &work,
        "job.toml",
        &format!(
            "[job]\nname = \"warned\"\nmax_runtime = \"8s\"\nsignal = \"USR1@5s\"\n[command]\nargv = [\"sh\", \"-c\", {}]\n",
            toml_string(&script(&work, "exit 0"))
        ),
    );
    let id = d.submit(&[&file]);
    let s = d.wait_state(&id, "failed");
    assert_eq!(s["reason"], "time limit", "{s}");
    let log = read(&work.join("log"));
    let usr1 = at(&log, "usr1").unwrap_or_else(|| panic!("no SIGUSR1: {log}"));
    assert!(
        (2.5..4.5).contains(&usr1),
        "SIGUSR1 {usr1} s after the start: {log}"
    );
    let term = at(&log, "term").unwrap_or_else(|| panic!("no SIGTERM at the limit: {log}"));
    assert!(
        term >= 7.5,
        "SIGTERM at the limit, {term} s after the start: {log}"
    );
    assert_eq!(
        log.matches("usr1").count(),
        1,
        "the warning comes once: {log}"
    );
}

fn toml_string(s: &str) -> String {
    toml::Value::String(s.to_string()).to_string()
}

/// At a cancel a job with a warning signal gets that signal (not SIGTERM), one that ignores it
/// lives through its grace period and is killed after it, not before; a job that asks for more
/// grace than `max_grace` gets `max_grace`. The quick form's `--signal` and `--grace` are the
/// job file's keys.
#[test]
fn a_cancel_sends_the_signal_then_sigkill_after_the_capped_grace() {
    let d = daemon(
        "sigcancel",
        "max_grace = \"3s\"\n[[tenant]]\nname = \"lab\"\nusers = [\"{me}\"]\n",
    );
    let warned = d.state.join("warned");
    let greedy = d.state.join("greedy");
    for dir in [&warned, &greedy] {
        std::fs::create_dir_all(dir).unwrap();
    }
    // Traps USR1 and TERM and goes on after either.
    let a = d.submit(&[
        "--signal",
        "SIGUSR1@1h",
        "--grace",
        "1500ms",
        "--",
        "sh",
        "-c",
        &script(&warned, ":"),
    ]);
    // No warning signal: SIGTERM at the cancel, which it ignores; asks for 60 s of grace.
    let b_file = job_file(
        &greedy,
        "job.toml",
        &format!(
            "[job]\nname = \"greedy\"\ngrace = \"60s\"\n[command]\nargv = [\"sh\", \"-c\", {}]\n",
            toml_string(&script(&greedy, ":"))
        ),
    );
    let b = d.submit(&[&b_file]);
    for (id, dir) in [(&a, &warned), (&b, &greedy)] {
        d.wait_state(id, "running");
        until(Duration::from_secs(20), "the job started", || {
            alive(&read(&dir.join("pid")))
        });
    }
    let (pid_a, pid_b) = (read(&warned.join("pid")), read(&greedy.join("pid")));
    let cancelled = Instant::now();
    for id in [&a, &b] {
        assert!(d.client(&["cancel", id]).status.success());
    }
    let (mut gone_a, mut gone_b) = (None, None);
    until(Duration::from_secs(20), "both jobs killed", || {
        if gone_a.is_none() && !alive(&pid_a) {
            gone_a = Some(cancelled.elapsed());
        }
        if gone_b.is_none() && !alive(&pid_b) {
            gone_b = Some(cancelled.elapsed());
        }
        gone_a.is_some() && gone_b.is_some()
    });
    let (gone_a, gone_b) = (gone_a.unwrap(), gone_b.unwrap());
    let log_a = read(&warned.join("log"));
    assert!(
        log_a.contains("usr1") && !log_a.contains("term"),
        "a cancel sends the job's signal instead of SIGTERM: {log_a}"
    );
    assert!(
        gone_a >= Duration::from_millis(1400) && gone_a < Duration::from_secs(10),
        "killed after its grace of 1.5 s, not before: {gone_a:?}"
    );
    let log_b = read(&greedy.join("log"));
    assert!(log_b.contains("term") && !log_b.contains("usr1"), "{log_b}");
    assert!(
        gone_b >= Duration::from_millis(2900) && gone_b < Duration::from_secs(15),
        "60 s asked, max_grace = 3s given: killed after {gone_b:?}"
    );
    for id in [&a, &b] {
        d.wait_state(id, "cancelled");
    }
    // The supervisor's log says the grace was capped.
    let supervisor_log = std::fs::read_dir(d.state.join("jobs"))
        .unwrap()
        .flatten()
        .map(|e| read(&e.path().join("supervisor.log")))
        .collect::<String>();
    assert!(
        supervisor_log.contains("over max_grace: it gets 3 s"),
        "{supervisor_log}"
    );
}

/// A warning that does not fit in the job's time limit, or a grace period that is no duration,
/// is refused at submit, one sentence with its place.
#[test]
fn a_bad_signal_is_refused_with_its_place() {
    let d = daemon("sigbad", "[[tenant]]\nname = \"lab\"\nusers = [\"{me}\"]\n");
    let file = job_file(
        &d.state,
        "bad.toml",
        "[job]\nname = \"bad\"\nsignal = \"KILL@30s\"\n[command]\nargv = [\"true\"]\n",
    );
    let out = d.client(&["submit", &file]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("bad.toml:3:10: signal = SIGKILL cannot be a warning signal"),
        "{}",
        stderr(&out)
    );
    let out = d.client(&["submit", "--signal", "USR1", "--", "true"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("--signal: \"USR1\" is not NAME@DURATION"),
        "{}",
        stderr(&out)
    );
}

/// A `[train]` job cancelled mid-run saves a checkpoint on its signal at the end of the step it
/// is in (it has no periodic checkpoints); submitted again, it resumes from there and ends with
/// the parameters of a run never stopped.
#[test]
fn a_cancelled_trainer_saves_on_its_signal_and_resumes_to_the_same_parameters() {
    let d = daemon(
        "sigtrain",
        "[[tenant]]\nname = \"lab\"\nusers = [\"{me}\"]\n",
    );
    let digits = root().join("examples/digits/data/digits.csv.gz");
    let train = |dir: &Path| {
        std::fs::create_dir_all(dir).unwrap();
        job_file(
            dir,
            "train.toml",
            &format!(
                "[job]\nname = \"digits\"\nsignal = \"USR1@1h\"\ngrace = \"30s\"\n[resources]\ngpus = 2\nmemory_limit = \"256MiB\"\n[train]\nplugin = \"mlp\"\nepochs = 600\nbatch_size = 64\nseed = 3\n[train.config]\nhidden = \"32\"\nlr = 0.1\n[train.data]\nformat = \"csv\"\ntrain = \"{g}\"\ntest = \"{g}\"\nscale = 16\n",
                g = digits.display()
            ),
        )
    };
    let work = d.state.join("stopped");
    let file = train(&work);
    let first = d.submit(&[&file]);
    d.wait_state(&first, "running");
    let metrics = work.join("runs/digits/metrics.jsonl");
    // Training is under way (the trainer handles its signals by now). 600 epochs take seconds
    // even on a fast idle machine: the cancel reaches it mid-run.
    until(Duration::from_secs(60), "a step done", || {
        read(&metrics).lines().count() >= 1
    });
    assert!(d.client(&["cancel", &first]).status.success());
    let s = d.wait_state(&first, "cancelled");
    assert_eq!(s["reason"], "cancelled", "{s}");
    let state = read(&work.join("runs/digits/checkpoint/state.json"));
    let meta: serde_json::Value = serde_json::from_str(&state)
        .unwrap_or_else(|e| panic!("no checkpoint after the signal ({e}): {state}"));
    let step = meta["step"].as_u64().unwrap();
    assert!(step >= 1, "saved at step {step}");
    let log = stdout(&d.client(&["logs", &first]));
    assert!(
        log.contains(&format!("stopped as asked after {step} steps")),
        "{log}"
    );
    let err = stdout(&d.client(&["logs", "--stderr", &first]));
    assert!(
        err.contains(&format!(
            "stopped on SIGUSR1 after step {step}, with its checkpoint in"
        )),
        "{err}"
    );

    let second = d.submit(&[&file]);
    let out = d.client(&["wait", &second]);
    assert!(
        out.status.success(),
        "{}",
        stdout(&d.client(&["logs", "--stderr", &second]))
    );
    let logs = stdout(&d.client(&["logs", &second]));
    assert!(
        logs.contains(&format!("resuming after step {step}")),
        "{logs}"
    );

    let whole = d.state.join("whole");
    let out = d.client(&["run", &train(&whole)]);
    assert!(out.status.success(), "{}", stderr(&out));
    let last: serde_json::Value =
        serde_json::from_str(&read(&whole.join("runs/digits/checkpoint/state.json"))).unwrap();
    assert!(
        step < last["step"].as_u64().unwrap(),
        "stopped before the end"
    );
    let params =
        |dir: &Path| std::fs::read(dir.join("runs/digits/checkpoint/model.safetensors")).unwrap();
    assert!(
        params(&work) == params(&whole),
        "the run stopped on its signal and resumed ends with the parameters of the run never stopped"
    );
}

/// A `[train]` job warned before its time limit saves at the end of its step and stops; the job
/// fails with the trainer's sentence, which says how to go on.
#[test]
fn a_trainer_warned_before_its_time_limit_saves_and_says_how_to_go_on() {
    let d = daemon(
        "sigtrainlimit",
        "[[tenant]]\nname = \"lab\"\nusers = [\"{me}\"]\n",
    );
    let digits = root().join("examples/digits/data/digits.csv.gz");
    let work = d.state.join("limited");
    std::fs::create_dir_all(&work).unwrap();
    let file = job_file(
        &work,
        "train.toml",
        &format!(
            "[job]\nname = \"digits\"\nmax_runtime = \"30s\"\nsignal = \"USR2@29s\"\n[train]\nplugin = \"mlp\"\nepochs = 600\nbatch_size = 64\nseed = 3\n[train.config]\nhidden = \"32\"\nlr = 0.1\n[train.data]\nformat = \"csv\"\ntrain = \"{g}\"\ntest = \"{g}\"\nscale = 16\n",
            g = digits.display()
        ),
    );
    let id = d.submit(&[&file]);
    let s = d.wait_state(&id, "failed");
    let meta: serde_json::Value =
        serde_json::from_str(&read(&work.join("runs/digits/checkpoint/state.json"))).unwrap();
    let step = meta["step"].as_u64().unwrap();
    assert_eq!(
        s["reason"],
        format!(
            "job digits stopped on SIGUSR2 after step {step}, with its checkpoint in {}: submitted again, the job goes on from it",
            work.join("runs/digits").display()
        ),
        "{s}"
    );
    assert_eq!(s["exit_code"], 128 + libc::SIGUSR2, "{s}");
    assert!(step < 29 * 600, "stopped before the end: {step}");
}

/// On a one-GPU machine, tenant `b`'s preemptible `[train]` job (no periodic checkpoints) is
/// preempted for tenant `a`: it gets its warning signal, saves at the end of its step, is queued
/// again, and once `a`'s job is done resumes from that step to the parameters of a run never
/// stopped.
#[test]
fn a_preempted_trainer_saves_on_its_signal_and_resumes_to_the_same_parameters() {
    let mut d = Daemon::prepare("sigpreempt");
    let sim = d.state.join("one-gpu.toml");
    std::fs::write(
        &sim,
        "[[gpu]]\nname = \"Sim\"\nmemory_total = \"16GiB\"\nuuid = \"GPU-00000000-0000-4000-8000-000000000001\"\n",
    )
    .unwrap();
    d.devices = Some(format!("sim:{}", sim.display()));
    let config = d.state.join("serve.toml");
    std::fs::write(
        &config,
        "[[tenant]]\nname = \"a\"\nusers = [\"{me}\"]\n[[tenant]]\nname = \"b\"\nusers = [\"{me}\"]\n"
            .replace("{me}", &me()),
    )
    .unwrap();
    d.config = Some(config);
    d.restart();
    let digits = root().join("examples/digits/data/digits.csv.gz");
    let train = |dir: &Path, preemptible: bool| {
        std::fs::create_dir_all(dir).unwrap();
        job_file(
            dir,
            "train.toml",
            &format!(
                "[job]\nname = \"digits\"\ntenant = \"b\"\npreemptible = {preemptible}\nsignal = \"USR1@1h\"\n[resources]\nmemory_limit = \"256MiB\"\n[train]\nplugin = \"mlp\"\nepochs = 600\nbatch_size = 64\nseed = 3\n[train.config]\nhidden = \"32\"\nlr = 0.1\n[train.data]\nformat = \"csv\"\ntrain = \"{g}\"\ntest = \"{g}\"\nscale = 16\n",
                g = digits.display()
            ),
        )
    };
    let work = d.state.join("preempted");
    let job = d.submit(&[&train(&work, true)]);
    d.wait_state(&job, "running");
    let metrics = work.join("runs/digits/metrics.jsonl");
    // Training is under way (the trainer handles its signals by now). 600 epochs take seconds
    // even on a fast idle machine: the preemption reaches it mid-run.
    until(Duration::from_secs(60), "a step done", || {
        read(&metrics).lines().count() >= 1
    });
    let small = d.submit(&["--tenant", "a", "--", "sleep", "3"]);
    d.wait_state(&small, "running");
    let s = d.status(&job);
    assert_eq!(s["state"], "queued", "{s}");
    let meta: serde_json::Value =
        serde_json::from_str(&read(&work.join("runs/digits/checkpoint/state.json")))
            .expect("a checkpoint written on the signal");
    let step = meta["step"].as_u64().unwrap();
    assert!((1..29 * 600).contains(&step), "saved at step {step}");
    d.wait_state(&small, "succeeded");
    let s = d.wait_state(&job, "succeeded");
    assert_eq!(s["attempt"], 2, "{s}");
    let logs = stdout(&d.client(&["logs", &job]));
    assert!(
        logs.contains(&format!("resuming after step {step}")),
        "{logs}"
    );

    let whole = d.state.join("whole");
    let out = d.client(&["run", &train(&whole, false)]);
    assert!(out.status.success(), "{}", stderr(&out));
    let params =
        |dir: &Path| std::fs::read(dir.join("runs/digits/checkpoint/model.safetensors")).unwrap();
    assert!(
        params(&work) == params(&whole),
        "the preempted run ends with the parameters of the run never stopped"
    );
}

/// `orch run` passes the job's warning signal on (from Slurm's `--signal=B:…`, or a `kill`)
/// instead of dying of it: the job saves and exits, and orch exits with its status.
#[test]
fn orch_run_passes_the_jobs_warning_signal_on() {
    let state = scratch_dir("signal-run");
    let marker = state.join("saved");
    let pid = state.join("pid");
    let script = format!(
        "trap 'touch {}; exit 0' USR1; echo $$ > {}; while :; do sleep 0.05; done",
        marker.display(),
        pid.display()
    );
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_orch"))
        .args([
            "run", "--gpus", "1", "--signal", "USR1@1m", "--", "sh", "-c",
        ])
        .arg(&script)
        .env("ORCH_DEVICES", lab_sim())
        .env("ORCH_STATE_DIR", &state)
        .env_remove("ORCH_SERVER")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    until(Duration::from_secs(20), "the job started", || {
        alive(&read(&pid))
    });
    // SAFETY: kill(2) on the orch process this test started.
    unsafe { libc::kill(child.id() as i32, libc::SIGUSR1) };
    let give_up = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > give_up {
            let _ = child.kill();
            panic!("orch run did not end after the job's signal");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(0), "orch exits with the job's status");
    assert!(marker.exists(), "the job got SIGUSR1");
    let _ = std::fs::remove_dir_all(&state);
}

/// `orch run` of a `[train]` job, without a daemon: SIGTERM makes it save at the end of its step
/// and exit 143 with the sentence of how to go on; `orch run --resume` then ends where a run
/// never stopped ends.
#[test]
fn orch_run_of_a_trainer_saves_on_sigterm_and_resume_goes_on() {
    let state = scratch_dir("signal-train");
    let digits = root().join("examples/digits/data/digits.csv.gz");
    let train = |dir: &Path| {
        std::fs::create_dir_all(dir).unwrap();
        job_file(
            dir,
            "train.toml",
            &format!(
                "[job]\nname = \"digits\"\n[resources]\ngpus = 2\nmemory_limit = \"256MiB\"\n[train]\nplugin = \"mlp\"\nepochs = 120\nbatch_size = 64\nseed = 3\n[train.config]\nhidden = \"32\"\nlr = 0.1\n[train.data]\nformat = \"csv\"\ntrain = \"{g}\"\ntest = \"{g}\"\nscale = 16\n",
                g = digits.display()
            ),
        )
    };
    let sim = lab_sim();
    let state_s = state.display().to_string();
    let env = [("ORCH_DEVICES", sim.as_str()), ("ORCH_STATE_DIR", &state_s)];
    let work = state.join("stopped");
    let file = train(&work);
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_orch"))
        .args(["run", &file])
        .envs(env)
        .env_remove("ORCH_SERVER")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let metrics = work.join("runs/digits/metrics.jsonl");
    until(Duration::from_secs(60), "a few steps done", || {
        read(&metrics).lines().count() >= 3
    });
    // SAFETY: kill(2) on the orch process this test started.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let out = child.wait_with_output().unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(128 + libc::SIGTERM), "{err}");
    let meta: serde_json::Value =
        serde_json::from_str(&read(&work.join("runs/digits/checkpoint/state.json"))).unwrap();
    let step = meta["step"].as_u64().unwrap();
    assert!(
        err.contains(&format!(
            "job digits stopped on SIGTERM after step {step}, with its checkpoint in {}: `orch run --resume {file}` goes on from it",
            work.join("runs/digits").display()
        )),
        "{err}"
    );
    let out = orch(&["run", "--resume", &file], &env);
    assert!(out.status.success(), "{}", stderr(&out));
    let whole = state.join("whole");
    let out = orch(&["run", &train(&whole)], &env);
    assert!(out.status.success(), "{}", stderr(&out));
    let params =
        |dir: &Path| std::fs::read(dir.join("runs/digits/checkpoint/model.safetensors")).unwrap();
    assert!(
        params(&work) == params(&whole),
        "stopped on SIGTERM and resumed, the run ends with the parameters of the run never stopped"
    );
    let _ = std::fs::remove_dir_all(&state);
}

/// A local sweep of `[train]` tasks with a warning signal: the warning and then SIGTERM (as
/// Slurm sends them, `--signal=B:USR1@T` then the time limit) stop the task at a step with its
/// checkpoint: the second, different signal does not kill the trainer mid-write, and the
/// sweep's next task never starts.
#[test]
fn a_warning_then_sigterm_stop_a_local_train_sweep_with_a_checkpoint_and_no_next_task() {
    let state = scratch_dir("signal-sweep");
    let digits = root().join("examples/digits/data/digits.csv.gz");
    let file = job_file(
        &state,
        "train.toml",
        &format!(
            "[job]\nname = \"digits\"\nsignal = \"USR1@1h\"\n[sweep]\nseed = [3, 4]\n[train]\nplugin = \"mlp\"\nepochs = 600\nbatch_size = 64\n[train.config]\nhidden = \"32\"\nlr = 0.1\n[train.data]\nformat = \"csv\"\ntrain = \"{g}\"\ntest = \"{g}\"\nscale = 16\n",
            g = digits.display()
        ),
    );
    let sim = lab_sim();
    let state_s = state.display().to_string();
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_orch"))
        .args(["run", &file])
        .envs([("ORCH_DEVICES", sim.as_str()), ("ORCH_STATE_DIR", &state_s)])
        .env_remove("ORCH_SERVER")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let task0 = state.join("runs/digits/sweep-0");
    until(Duration::from_secs(60), "a step done", || {
        read(&task0.join("metrics.jsonl")).lines().count() >= 1
    });
    // SAFETY: kill(2) on the orch process this test started.
    unsafe { libc::kill(child.id() as i32, libc::SIGUSR1) };
    std::thread::sleep(Duration::from_millis(20));
    // SAFETY: as above.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let out = child.wait_with_output().unwrap();
    let err = stderr(&out);
    assert!(
        [Some(128 + libc::SIGUSR1), Some(128 + libc::SIGTERM)].contains(&out.status.code()),
        "ended with {:?}, not as a trainer that saved: {err}",
        out.status
    );
    assert!(err.contains("job digits-0 stopped on SIG"), "{err}");
    let meta: serde_json::Value =
        serde_json::from_str(&read(&task0.join("checkpoint/state.json"))).unwrap();
    assert!(meta["step"].as_u64().unwrap() >= 1, "{meta}");
    assert!(
        !state.join("runs/digits/sweep-1").exists(),
        "the sweep's next task started after the stop: {err}"
    );
    let _ = std::fs::remove_dir_all(&state);
}
