//! A trainer run in this process inside its job's confinement (`Ready::InJob`, the daemon's
//! supervisor for its own user's job): a panic on the way fails the job with a sentence, and
//! what was entered (the job's cgroup, its logs, this process's stderr) is left again.

use orch_exec::{LogCap, StdioMode};
use orch_runner::{Control, Placement, ProcessOptions, Ready, RunError};

/// Says a line on this process's stderr (fd 2, as tracing's lines go), then panics.
fn panicking_progress(_: Box<dyn std::io::Write + Send>) -> orch_trainer::ProgressSink {
    let line = b"said on stderr while the trainer ran\n";
    // SAFETY: writes the bytes of a live slice to fd 2.
    unsafe { libc::write(libc::STDERR_FILENO, line.as_ptr().cast(), line.len()) };
    panic!("boom in the trainer's progress");
}

#[test]
fn a_panic_in_an_in_job_trainer_fails_the_job_and_leaves_its_confinement() {
    let dir = std::env::temp_dir().join(format!("orch-in-job-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let job_path = dir.join("train.toml");
    let text = "[job]\nname = \"panics\"\n[resources]\ngpus = 1\n[train]\nplugin = \"mlp\"\nepochs = 1\nbatch_size = 8\n[train.data]\nformat = \"csv\"\ntrain = \"train.csv\"\n";
    std::fs::write(&job_path, text).unwrap();
    let job = orch_core::job::parse(&job_path, text).unwrap();
    let inventory = orch_devices::Inventory::load(&orch_devices::InventorySpec::Cpu).unwrap();
    let lease = orch_leases::Lease {
        id: format!("in-job-{}", std::process::id()),
        job_name: "panics".into(),
        devices: Vec::new(),
        exclusive: false,
        memory_reserved_bytes: 0,
        holders: Vec::new(),
        created_at_ms: 0,
    };
    let placement = Placement {
        lease: orch_runner::LeaseGuard::granted(lease, orch_runner::GiveBack(Box::new(|_| {}))),
        plan: orch_runner::Plan {
            job: "panics".into(),
            policy: "test".into(),
            chosen: Vec::new(),
            reason: String::new(),
            rejected: Vec::new(),
            hidden: 0,
        },
        granted_names: None,
    };
    let own_cgroup = || orch_core::process::cgroup_v2_dir(std::process::id());
    let before = own_cgroup();
    let options = ProcessOptions {
        stdio: StdioMode::Files {
            stdout: dir.join("stdout"),
            stderr: dir.join("stderr"),
            cap: LogCap {
                max_bytes: 1 << 20,
                reserve_bytes: 0,
            },
        },
        ..ProcessOptions::default()
    };
    let ended = orch_runner::run_placed(
        &job,
        Ready::InJob {
            resume: false,
            progress: panicking_progress,
            child: None,
        },
        placement,
        &inventory,
        &options,
        Control::default(),
    );
    match &ended.outcome {
        Err(RunError::Device(sentence)) => assert!(
            sentence.contains("job panics: the trainer ended on an internal error")
                && sentence.contains("boom in the trainer's progress"),
            "{sentence}"
        ),
        other => panic!("a failure with a sentence, not {other:?}"),
    }
    assert!(ended.lease.is_some(), "the lease goes back to the caller");
    // Back in the cgroup it came from; what was said on stderr meanwhile is in the job's log.
    assert_eq!(own_cgroup(), before);
    let err = std::fs::read_to_string(dir.join("stderr")).unwrap();
    assert!(
        err.contains("said on stderr while the trainer ran"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
