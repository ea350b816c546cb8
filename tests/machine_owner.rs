//! The machine daemon's claim on the real GPUs, as every other orch on the machine sees it.
//!
//! This test writes the machine-wide owner record (`/run/orch/owner.json`) as a live machine
//! daemon leaves it, and while it is there every claim of real GPUs on the machine is refused:
//! it runs in a test binary of its own, so that no other test's NVML daemon or claim runs
//! beside it.

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Removes the owner record when the test ends, however it ends: a record left behind would
/// refuse every later claim of this machine's real GPUs.
struct Record<'a>(&'a std::path::Path);

impl Drop for Record<'_> {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(self.0);
    }
}

/// `cmd`'s output once it exits; kills it and fails the test if it still runs after 60 s.
fn output_within_a_minute(mut cmd: Command) -> Output {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("it kept running: {:?}", child.wait_with_output());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn root_or_skip(test: &str) -> bool {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        return true;
    }
    assert!(
        std::env::var_os("ORCH_REQUIRE_ROOT").is_none(),
        "{test} needs root and ORCH_REQUIRE_ROOT is set"
    );
    eprintln!("{test}: skipped (needs root to write /run/orch)");
    false
}

#[test]
fn a_users_own_daemon_and_local_claims_are_refused_beside_a_machine_daemon_that_owns_gpus() {
    if !root_or_skip(
        "a_users_own_daemon_and_local_claims_are_refused_beside_a_machine_daemon_that_owns_gpus",
    ) {
        return;
    }
    // The machine daemon's record, as a live one leaves it: this test's process stands in.
    let owner = std::path::Path::new(orch_leases::OWNER_FILE);
    std::fs::create_dir_all(owner.parent().unwrap()).unwrap();
    let lock = std::fs::File::create(owner.with_file_name("test.lock")).unwrap();
    // SAFETY: flock on a file this test owns.
    assert_eq!(
        unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&lock), libc::LOCK_EX) },
        0
    );
    if orch_leases::Owner::read().is_some() {
        // CI's machine has none: there the test must run, not skip.
        assert!(
            std::env::var_os("ORCH_REQUIRE_ROOT").is_none(),
            "a machine daemon of this machine runs, and ORCH_REQUIRE_ROOT is set: stop it to run this test"
        );
        eprintln!("a machine daemon of this machine runs: skipped");
        return;
    }
    orch_leases::Owner {
        holder: orch_leases::Holder::current(),
        inventory: "auto".into(),
        real: true,
        socket: orch_leases::MACHINE_SOCKET.into(),
    }
    .write(owner)
    .unwrap();
    let record = Record(owner);
    let state = std::env::temp_dir().join(format!("orch-own-serve-{}", std::process::id()));
    let mut serve = Command::new(env!("CARGO_BIN_EXE_orch"));
    serve
        .args(["--devices", "nvml", "serve"])
        .env("ORCH_STATE_DIR", &state);
    let out = output_within_a_minute(serve);
    // A local claim of the real GPUs (here: an orch of its own, by ORCH_STATE_DIR) is refused
    // with a sentence naming the daemon, before NVML is read; a simulated inventory is nobody's.
    let run = |devices: &str| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_orch"));
        cmd.args(["--devices", devices, "run", "--gpus", "1", "--", "true"])
            .env("ORCH_STATE_DIR", &state)
            .env_remove("ORCH_SERVER")
            .env_remove("ORCH_JOB_ID");
        output_within_a_minute(cmd)
    };
    let claimed = run("nvml");
    std::fs::create_dir_all(&state).unwrap();
    let sim = state.join("one.toml");
    std::fs::write(&sim, "[[gpu]]\nname = \"Sim\"\nmemory_total = \"16GiB\"\n").unwrap();
    let simulated = run(&format!("sim:{}", sim.display()));
    // A simulated inventory is nobody's: that daemon would start (not tried: it would serve).
    drop(record);
    let _ = std::fs::remove_dir_all(&state);
    assert_eq!(claimed.status.code(), Some(1), "{}", stderr(&claimed));
    assert!(
        stderr(&claimed)
            .contains("this machine's GPUs belong to the orch daemon at /run/orch/orch.sock (pid "),
        "{}",
        stderr(&claimed)
    );
    assert!(simulated.status.success(), "{}", stderr(&simulated));
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("belong to the orch daemon at /run/orch/orch.sock"),
        "{err}"
    );
}
