use super::*;
use crate::{AssignedDevice, JobEnv};

fn spec(script: &str, devices: usize, per_device: bool) -> LaunchSpec {
    LaunchSpec {
        argv: vec!["sh".into(), "-c".into(), script.into()],
        cwd: None,
        job: JobEnv {
            job_id: "test-job".into(),
            devices: (0..devices)
                .map(|i| AssignedDevice {
                    cuda_id: format!("GPU-{i}"),
                    memory_total_bytes: None,
                })
                .collect(),
            exclusive: true,
            ..JobEnv::default()
        },
        per_device,
        grace: Duration::from_secs(5),
        stdio: StdioMode::Inherit,
        credentials: None,
        base_env: None,
        cgroup: None,
        devices: None,
        cpu_binding: Vec::new(),
        forward_signals: true,
        warning_signal: None,
    }
}

#[test]
fn exit_codes_pass_through() {
    assert_eq!(
        launch(&spec("exit 0", 1, false), |_| {}, None).unwrap(),
        ExitOutcome::Exited(0)
    );
    let outcome = launch(&spec("exit 7", 1, false), |_| {}, None).unwrap();
    assert_eq!((outcome.code(), outcome), (7, ExitOutcome::Exited(7)));
}

#[test]
fn death_by_signal_is_128_plus_n() {
    let outcome = launch(&spec("kill -KILL $$", 1, false), |_| {}, None).unwrap();
    assert_eq!(outcome, ExitOutcome::Signaled(9));
    assert_eq!(outcome.code(), 137);
}

#[test]
fn the_child_sees_its_devices() {
    let dir = std::env::temp_dir().join(format!("orch-exec-env-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("env.txt");
    let script = format!(
        "echo \"$CUDA_VISIBLE_DEVICES|$CUDA_DEVICE_ORDER|$ORCH_JOB_ID\" > {}",
        out.display()
    );
    launch(&spec(&script, 2, false), |_| {}, None).unwrap();
    assert_eq!(
        std::fs::read_to_string(&out).unwrap().trim(),
        "GPU-0,GPU-1|PCI_BUS_ID|test-job"
    );
}

#[test]
fn per_device_runs_one_process_per_device_with_ranks() {
    let dir = std::env::temp_dir().join(format!("orch-exec-ranks-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let script = format!(
        "echo \"$CUDA_VISIBLE_DEVICES $LOCAL_RANK $WORLD_SIZE $MASTER_ADDR $MASTER_PORT\" > {}/rank-$RANK",
        dir.display()
    );
    let mut pids = Vec::new();
    launch(&spec(&script, 3, true), |pid| pids.push(pid), None).unwrap();
    assert_eq!(pids.len(), 3);
    let mut ports = BTreeSet::new();
    for rank in 0..3 {
        let line = std::fs::read_to_string(dir.join(format!("rank-{rank}"))).unwrap();
        let fields: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(
            &fields[..4],
            &[
                format!("GPU-{rank}").as_str(),
                &rank.to_string(),
                "3",
                "127.0.0.1"
            ]
        );
        ports.insert(fields[4].to_string());
    }
    assert_eq!(ports.len(), 1, "one rendezvous port for all ranks");
}

#[test]
fn one_failure_stops_the_others_with_its_status() {
    let started = Instant::now();
    // Rank 1 fails at once; the others would sleep for a minute. They get SIGTERM.
    let script = "if [ \"$RANK\" = 1 ]; then exit 3; fi; sleep 60";
    let outcome = launch(&spec(script, 3, true), |_| {}, None).unwrap();
    assert_eq!(outcome, ExitOutcome::Exited(3));
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "the sleepers were stopped"
    );
}

#[test]
fn processes_that_ignore_sigterm_are_killed_after_the_grace_period() {
    let mut s = spec(
        "if [ \"$RANK\" = 0 ]; then exit 5; fi; trap '' TERM; while :; do sleep 0.1; done",
        2,
        true,
    );
    s.grace = Duration::from_millis(300);
    let started = Instant::now();
    assert_eq!(launch(&s, |_| {}, None).unwrap(), ExitOutcome::Exited(5));
    assert!(started.elapsed() < Duration::from_secs(20));
}

#[test]
fn a_missing_program_is_a_clear_error() {
    let mut s = spec("", 1, false);
    s.argv = vec!["/nonexistent/orch-test-program".into()];
    let err = launch(&s, |_| {}, None).unwrap_err().to_string();
    assert!(
        err.contains("/nonexistent/orch-test-program") && err.contains("no such program"),
        "{err}"
    );
}

/// A folder the job cannot enter is named as such, not taken for the program's own failure
/// (both are ENOENT or EACCES from `spawn`).
#[test]
fn a_working_folder_that_cannot_be_entered_is_named() {
    let mut s = spec("true", 1, false);
    s.cwd = Some("/nonexistent/orch-test-folder".into());
    let err = launch(&s, |_| {}, None).unwrap_err().to_string();
    assert!(
        err.starts_with("cannot enter the working folder /nonexistent/orch-test-folder as user ")
            && err.contains("(it does not exist)"),
        "{err}"
    );
    // A missing program in a folder that exists is still the program's failure.
    s.cwd = Some("/".into());
    s.argv = vec!["/nonexistent/orch-test-program".into()];
    let err = launch(&s, |_| {}, None).unwrap_err().to_string();
    assert!(err.contains("no such program"), "{err}");
}

#[test]
fn a_monitor_can_stop_the_job() {
    let started = Instant::now();
    let mut looks = 0;
    let monitor = Monitor {
        interval: Duration::from_millis(50),
        check: Box::new(move |pids| {
            looks += 1;
            assert!(!pids.is_empty(), "the monitor sees the job's processes");
            if looks >= 2 {
                Verdict::Stop("over its memory limit".into())
            } else {
                Verdict::Continue
            }
        }),
    };
    let outcome = launch(&spec("sleep 60", 1, false), |_| {}, Some(monitor)).unwrap();
    assert_eq!(
        outcome,
        ExitOutcome::Stopped("over its memory limit".into())
    );
    assert_eq!(outcome.code(), 1);
    assert!(started.elapsed() < Duration::from_secs(20));
}

#[test]
fn a_signal_forwarded_while_a_process_starts_reaches_it_when_it_joins() {
    // The forwarder passed SIGTERM on (to no group yet) while the job's process was spawning:
    // the process gets it as it joins the job's groups instead of running on unsignalled.
    let groups: Arc<Mutex<BTreeSet<i32>>> = Arc::default();
    let forwarder = SignalForwarder::start(Arc::clone(&groups), None).unwrap();
    forwarder.last.store(libc::SIGTERM, Ordering::SeqCst);
    let mut child = Command::new("sleep")
        .arg("30")
        .process_group(0)
        .spawn()
        .unwrap();
    join_groups(&groups, Some(&forwarder), child.id() as i32);
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "the late joiner never got the signal"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    assert_eq!(status.signal(), Some(libc::SIGTERM));
    assert!(lock(&groups).contains(&(child.id() as i32)));
    forwarder.stop();

    // Without a signal before it, joining sends nothing.
    let mut quiet = Command::new("sleep")
        .arg("0.3")
        .process_group(0)
        .spawn()
        .unwrap();
    join_groups(&groups, None, quiet.id() as i32);
    assert!(quiet.wait().unwrap().success());
}

/// A warning signal reaches the job and leaves it running; a stop with a signal of its own sends
/// that signal instead of SIGTERM, and SIGKILL only after the grace period.
#[test]
fn a_warning_signal_leaves_the_job_running_and_a_stop_may_use_another_signal() {
    let log = std::env::temp_dir().join(format!("orch-exec-warning-{}", std::process::id()));
    let _ = std::fs::remove_file(&log);
    let script = format!(
        "trap 'echo usr1 >> {0}' USR1; trap 'echo usr2 >> {0}' USR2; trap '' TERM; \
         echo started >> {0}; while :; do sleep 0.05; done",
        log.display()
    );
    let mut s = spec(&script, 1, false);
    s.grace = Duration::from_millis(800);
    s.forward_signals = false;
    let launched = start(&s, |_| {}).unwrap();
    let stopper = launched.stopper();
    let lines = |log: &std::path::Path| std::fs::read_to_string(log).unwrap_or_default();
    let waiter = std::thread::spawn(move || launched.wait(None));
    let until = |what: &str| {
        let give_up = Instant::now() + Duration::from_secs(10);
        while !lines(&log).contains(what) && Instant::now() < give_up {
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    until("started");
    stopper.signal(libc::SIGUSR1);
    until("usr1");
    assert!(!waiter.is_finished(), "a warning does not stop the job");
    let stopped = Instant::now();
    stopper.stop_with("cancelled", libc::SIGUSR2);
    let outcome = waiter.join().unwrap();
    let took = stopped.elapsed();
    assert_eq!(outcome, ExitOutcome::Stopped("cancelled".into()));
    assert_eq!(lines(&log), "started\nusr1\nusr2\n");
    assert!(
        took >= Duration::from_millis(700) && took < Duration::from_secs(10),
        "SIGKILL after the grace period, not before: {took:?}"
    );
    let _ = std::fs::remove_file(&log);
}
