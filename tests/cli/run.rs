//! `orch run`: leases, the environment a job gets, exit statuses, signals, per-device launch.

use crate::*;
use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn scratch(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "orch-run-{tag}-{}-{}",
        std::process::id(),
        rand_suffix()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn rand_suffix() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

/// `orch ARGS` on the 8-GPU sim with its own state folder.
fn orch_run(state: &Path, args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let sim = lab_sim();
    let state = state.display().to_string();
    let mut all: Vec<(&str, &str)> = vec![("ORCH_DEVICES", &sim), ("ORCH_STATE_DIR", &state)];
    all.extend_from_slice(env);
    orch(args, &all)
}

#[test]
fn the_command_gets_exactly_its_devices() {
    let state = scratch("env");
    let out = orch_run(
        &state,
        &[
            "run",
            "--gpus",
            "2",
            "--policy",
            "first-fit",
            "--",
            "sh",
            "-c",
            "echo \"CVD=$CUDA_VISIBLE_DEVICES ORDER=$CUDA_DEVICE_ORDER JOB=$ORCH_JOB_ID\"",
        ],
        &[],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    // first-fit on the lab box: the first two devices with room, by UUID, in rank order.
    assert!(
        text.contains(
            "CVD=GPU-8932f937-d72c-4106-c12f-20bd9faed9f6,GPU-1c7b4a55-0f0e-4d5c-9b37-6a2e0e1d4c21 "
        ),
        "{text}"
    );
    assert!(text.contains("ORDER=PCI_BUS_ID"), "{text}");
    assert!(text.contains("JOB=") && !text.contains("JOB= "), "{text}");
    // Released by orch run itself as the job ends (not left for the next reader to reclaim).
    assert!(!stderr(&out).contains("stays held"), "{}", stderr(&out));
    let after = orch_run(&state, &["leases", "--json"], &[]);
    assert_eq!(stdout(&after).trim(), "[]", "released on exit");
    assert!(!stderr(&after).contains("reclaimed"), "{}", stderr(&after));
}

#[test]
fn exit_status_and_signals_pass_through() {
    let state = scratch("status");
    let out = orch_run(
        &state,
        &["run", "--gpus", "1", "--", "sh", "-c", "exit 42"],
        &[],
    );
    assert_eq!(out.status.code(), Some(42));
    let out = orch_run(
        &state,
        &["run", "--gpus", "1", "--", "sh", "-c", "kill -TERM $$"],
        &[],
    );
    assert_eq!(out.status.code(), Some(128 + 15));

    // SIGTERM to orch reaches the job, which reports it and exits 3.
    let marker = state.join("got-term");
    let ready = state.join("trap-set");
    let script = format!(
        "trap 'touch {}; exit 3' TERM; touch {}; sleep 30 & wait",
        marker.display(),
        ready.display()
    );
    let mut child = spawn_orch(&state, &["run", "--gpus", "1", "--", "sh", "-c", &script]);
    wait_for_lease(&state, 1);
    // The signal is sent once the job's trap is set (the lease comes before the job starts).
    let deadline = Instant::now() + Duration::from_secs(30);
    while !ready.exists() {
        assert!(Instant::now() < deadline, "the job never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    unsafe { libc_kill(child.id() as i32, 15) };
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(3), "orch exits with the job's status");
    assert!(marker.exists(), "the job got SIGTERM");
    assert_eq!(lease_count(&state), 0);
}

#[test]
fn no_fit_exits_1_with_the_reason_and_wait_times_out() {
    let state = scratch("nofit");
    let out = orch_run(&state, &["run", "--gpus", "9", "--", "true"], &[]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "more GPUs than exist is bad input: {}",
        stderr(&out)
    );
    let said = stderr(&out);
    assert!(
        said.contains("command line: gpus = 9, but this machine has 8 device(s)"),
        "the quick form's errors name the command line, with no made-up position: {said}"
    );
    let out = orch_run(
        &state,
        &[
            "run",
            "--gpus",
            "1",
            "--min-free-memory",
            "200GiB",
            "--",
            "true",
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("free"), "{}", stderr(&out));
    let started = Instant::now();
    let out = orch_run(
        &state,
        &[
            "run",
            "--gpus",
            "1",
            "--min-free-memory",
            "200GiB",
            "--wait",
            "--timeout",
            "1s",
            "--",
            "true",
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(started.elapsed() < Duration::from_secs(20));
    assert!(
        stderr(&out).contains("waiting"),
        "says why it waits: {}",
        stderr(&out)
    );
}

#[test]
fn per_device_launch_and_failure_propagation() {
    let state = scratch("perdev");
    let script = "echo \"rank=$RANK local=$LOCAL_RANK world=$WORLD_SIZE cvd=$CUDA_VISIBLE_DEVICES addr=$MASTER_ADDR port=$MASTER_PORT\"";
    let out = orch_run(
        &state,
        &[
            "run",
            "--gpus",
            "3",
            "--per-device",
            "--",
            "sh",
            "-c",
            script,
        ],
        &[],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let lines: Vec<&str> = text.lines().filter(|l| l.starts_with("rank=")).collect();
    assert_eq!(lines.len(), 3, "{text}");
    for rank in 0..3 {
        let line = lines
            .iter()
            .find(|l| l.starts_with(&format!("rank={rank} ")))
            .unwrap();
        assert!(line.contains(&format!("local={rank} world=3")), "{line}");
        assert!(
            !line.contains("cvd=GPU-") || !line.contains(','),
            "one device each: {line}"
        );
        assert!(line.contains("addr=127.0.0.1 port="), "{line}");
    }
    let started = Instant::now();
    let out = orch_run(
        &state,
        &[
            "run",
            "--gpus",
            "2",
            "--per-device",
            "--",
            "sh",
            "-c",
            "if [ $RANK = 1 ]; then exit 9; fi; sleep 60",
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(9));
    assert!(started.elapsed() < Duration::from_secs(30));
    assert_eq!(lease_count(&state), 0);
}

#[test]
fn kill_9_of_orch_keeps_the_lease_while_a_grandchild_lives_then_frees_it() {
    let state = scratch("kill9");
    let pidfile = state.join("job.pid");
    // The pid is written once the grandchild runs: killing the shell before it forked `sleep`
    // would leave no process of the job, and the lease would rightly go.
    let script = format!("sleep 60 & echo $$ > {}; wait", pidfile.display());
    let mut child = spawn_orch(
        &state,
        &[
            "run",
            "--gpus",
            "8",
            "--exclusive",
            "--",
            "sh",
            "-c",
            &script,
        ],
    );
    wait_for_lease(&state, 1);
    let deadline = Instant::now() + Duration::from_secs(20);
    while !pidfile.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let job_pid: i32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // orch and the job's shell die; the shell's child (sleep, a grandchild of orch) lives on
    // and still uses the devices: the lease must outlive orch and the shell.
    unsafe {
        libc_kill(child.id() as i32, 9);
        libc_kill(job_pid, 9);
    }
    child.wait().unwrap();
    let out = orch_run(
        &state,
        &["run", "--gpus", "8", "--exclusive", "--", "true"],
        &[],
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("no fit"), "{}", stderr(&out));
    // Once the last process of the job is gone, the next orch reclaims the lease and can take
    // all eight devices again.
    unsafe {
        libc_kill(-job_pid, 9);
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    let out = loop {
        let out = orch_run(
            &state,
            &["run", "--gpus", "8", "--exclusive", "--", "true"],
            &[],
        );
        if out.status.success() || Instant::now() > deadline {
            break out;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains("reclaimed"), "{}", stderr(&out));
}

#[test]
fn fifty_concurrent_exclusive_runs_never_share_a_device() {
    let state = scratch("fifty");
    let log = state.join("intervals.log");
    // Each job appends "uuid start end" with nanosecond clocks; it holds its device ~100 ms.
    let script = format!(
        "s=$(date +%s%N); sleep 0.1; e=$(date +%s%N); echo \"$CUDA_VISIBLE_DEVICES $s $e\" >> {}",
        log.display()
    );
    let children: Vec<_> = (0..50)
        .map(|_| {
            Command::new(env!("CARGO_BIN_EXE_orch"))
                .args([
                    "run",
                    "--gpus",
                    "1",
                    "--exclusive",
                    "--wait",
                    "--timeout",
                    "300s",
                    "--",
                    "sh",
                    "-c",
                    &script,
                ])
                .env("ORCH_DEVICES", lab_sim())
                .env("ORCH_STATE_DIR", &state)
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for child in children {
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let text = std::fs::read_to_string(&log).unwrap();
    let mut by_device: HashMap<String, Vec<(u128, u128)>> = HashMap::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(f.len(), 3, "one device per job: {line}");
        by_device
            .entry(f[0].into())
            .or_default()
            .push((f[1].parse().unwrap(), f[2].parse().unwrap()));
    }
    assert_eq!(
        by_device.values().map(Vec::len).sum::<usize>(),
        50,
        "all 50 ran"
    );
    for (device, mut spans) in by_device {
        spans.sort_unstable();
        for pair in spans.windows(2) {
            assert!(
                pair[0].1 <= pair[1].0,
                "two holders of {device} at once: {pair:?}"
            );
        }
    }
}

/// `orch ARGS` in the background on the 8-GPU sim, output discarded.
fn spawn_orch(state: &Path, args: &[&str]) -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_orch"))
        .args(args)
        .env("ORCH_DEVICES", lab_sim())
        .env("ORCH_STATE_DIR", state)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

fn lease_count(state: &Path) -> usize {
    let out = orch_run(state, &["leases", "--json"], &[]);
    serde_json::from_slice::<serde_json::Value>(&out.stdout)
        .map_or(0, |v| v.as_array().map_or(0, Vec::len))
}

fn wait_for_lease(state: &Path, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while lease_count(state) < n {
        assert!(Instant::now() < deadline, "no lease appeared");
        std::thread::sleep(Duration::from_millis(20));
    }
}

unsafe fn libc_kill(pid: i32, signal: i32) {
    unsafe extern "C" {
        fn kill(pid: i32, sig: i32) -> i32;
    }
    // SAFETY: plain kill(2) on a pid this test started.
    unsafe {
        kill(pid, signal);
    }
}

#[test]
fn the_three_everyday_examples_run_as_written() {
    let state = scratch("examples");
    let example = |name: &str| root().join("examples/run").join(name).display().to_string();

    let out = orch_run(&state, &["run", &example("one-task-per-gpu.toml")], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    // least-loaded with >= 20 GiB free and <= 50% busy: an idle card (1 or 4), by full UUID.
    assert!(
        stdout(&out).contains("CUDA_VISIBLE_DEVICES=GPU-1c7b4a55-0f0e-4d5c-9b37-6a2e0e1d4c21"),
        "{}",
        stdout(&out)
    );

    let out = orch_run(&state, &["run", &example("multi-gpu.toml")], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    for rank in 0..4 {
        assert!(
            text.contains(&format!("[rank {rank}] WORLD_SIZE=4")),
            "{text}"
        );
    }
    assert_eq!(
        text.matches("XLA_PYTHON_CLIENT_MEM_FRACTION=0.500").count(),
        4,
        "{text}"
    );

    let out = orch_run(
        &state,
        &["run", &example("cloud-gpu-id.toml")],
        &[("CLOUD_GPU_ID", "5")],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("CUDA_VISIBLE_DEVICES=GPU-9b0e2f3a-4c5d-4e6f-9a7b-8c9d0e1f2a3b"),
        "{}",
        stdout(&out)
    );
}

#[test]
fn plan_and_run_see_the_leases_of_running_jobs() {
    let state = scratch("seen");
    let mut holder = spawn_orch(
        &state,
        &[
            "run",
            "--gpus",
            "1",
            "--policy",
            "first-fit",
            "--",
            "sleep",
            "30",
        ],
    );
    wait_for_lease(&state, 1);
    let plan = orch_run(
        &state,
        &[
            "plan",
            &root()
                .join("examples/plan/first-fit.toml")
                .display()
                .to_string(),
        ],
        &[],
    );
    let text = stdout(&plan);
    assert!(
        text.contains("GPU 0: held exclusively by job sleep"),
        "{text}"
    );
    // A second exclusive first-fit job skips the held GPU 0.
    let out = orch_run(
        &state,
        &[
            "run",
            "--gpus",
            "1",
            "--policy",
            "first-fit",
            "--",
            "sh",
            "-c",
            "echo $CUDA_VISIBLE_DEVICES",
        ],
        &[],
    );
    assert!(stdout(&out).starts_with("GPU-1c7b4a55"), "{}", stdout(&out));
    holder.kill().unwrap();
    holder.wait().unwrap();
}

#[test]
fn plugin_inspect_knows_trainers() {
    let mlp = Path::new(orch_trainer::TRAINER_WASM_DIR).join("trainer_mlp.wasm");
    let out = orch(&["plugin", "inspect", &mlp.display().to_string()], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("orch:plugin/trainer@0.5.0"), "{text}");
    assert!(text.contains("orch:plugin/training@0.5.0"), "{text}");
    // A trainer built for 0.1.0 is named as such.
    let old = Path::new(orch_trainer::TRAINER_WASM_DIR).join("compat_trainer_mlp.wasm");
    let out = orch(&["plugin", "inspect", &old.display().to_string()], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains("a component of world orch:plugin/trainer@0.1.0"),
        "{text}"
    );
    assert!(text.contains("note: built for contract 0.1.0, an older version than this orch's 0.5.0: orch still loads and runs it"), "{text}");
    assert!(text.contains("func train-step"), "{text}");
}

/// `orch ARGS` on the 8-GPU sim with `input` on its stdin; killed after 30 s.
fn orch_with_input(state: &Path, args: &[&str], input: &str) -> std::process::Output {
    use std::io::Write;
    let mut child = Command::new(env!("CARGO_BIN_EXE_orch"))
        .args(args)
        .env("ORCH_DEVICES", lab_sim())
        .env("ORCH_STATE_DIR", state)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(input.as_bytes()).unwrap();
    drop(stdin);
    let pid = child.id() as i32;
    let watchdog = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(30));
        unsafe { libc_kill(pid, 9) };
    });
    let out = child.wait_with_output().unwrap();
    drop(watchdog);
    out
}

#[test]
fn a_job_reads_the_stdin_orch_was_given() {
    let state = scratch("stdin");
    let out = orch_with_input(
        &state,
        &["run", "--", "sh", "-c", "read x; echo got:$x"],
        "hello\n",
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), "got:hello\n");
}

#[test]
fn with_per_device_launch_only_rank_0_reads_stdin() {
    let state = scratch("stdin-ranks");
    let out = orch_with_input(
        &state,
        &[
            "run",
            "--gpus",
            "2",
            "--per-device",
            "--",
            "sh",
            "-c",
            "read x; echo $RANK:$x",
        ],
        "hello\n",
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let mut lines: Vec<&str> = std::str::from_utf8(&out.stdout).unwrap().lines().collect();
    lines.sort();
    assert_eq!(lines, ["0:hello", "1:"]);
}

/// In a terminal (a pseudo-terminal from `script`), the job reads the keyboard instead of
/// stopping on SIGTTIN, and the shell gets the terminal back when orch ends.
#[test]
fn in_a_terminal_the_job_gets_the_terminal_and_gives_it_back() {
    let state = scratch("tty");
    let orch = env!("CARGO_BIN_EXE_orch");
    let inner = format!("{orch} run -- sh -c 'read x; echo got:$x'; read y; echo back:$y");
    let mut child = Command::new("script")
        .args(["-qec", &inner, "/dev/null"])
        .env("ORCH_DEVICES", lab_sim())
        .env("ORCH_STATE_DIR", &state)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("script (util-linux) runs");
    let mut stdin = child.stdin.take().unwrap();
    let pid = child.id() as i32;
    let feeder = std::thread::spawn(move || {
        use std::io::Write;
        std::thread::sleep(Duration::from_millis(500));
        let _ = stdin.write_all(b"hello\nworld\n");
        // Keep the terminal open while the job reads; close it afterwards.
        std::thread::sleep(Duration::from_secs(3));
        drop(stdin);
    });
    let watchdog = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(30));
        unsafe { libc_kill(pid, 9) };
    });
    let out = child.wait_with_output().unwrap();
    feeder.join().unwrap();
    drop(watchdog);
    let text = stdout(&out);
    assert!(
        text.contains("got:hello"),
        "the job did not read the terminal: {text}"
    );
    assert!(
        text.contains("back:world"),
        "the shell did not get the terminal back: {text}"
    );
}

#[test]
fn enforcing_a_memory_limit_where_it_cannot_be_enforced_is_refused() {
    let state = scratch("enforce");
    let job = state.join("job.toml");
    std::fs::write(
        &job,
        "[job]\nname = \"e\"\n[resources]\nmemory_limit = \"8GiB\"\nenforce_memory_limit = true\n[command]\nargv = [\"true\"]\n",
    )
    .unwrap();
    let out = orch_run(&state, &["run", job.to_str().unwrap()], &[]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("enforce_memory_limit") && err.contains("sim"),
        "{err}"
    );
    assert_eq!(lease_count(&state), 0, "refused before any lease");
}
