use super::*;
use crate::{JobCgroup, JobEnv, LaunchSpec, StdioMode};
use std::path::PathBuf;
use std::time::{Duration, Instant};

#[test]
fn granting_denies_every_other_gpu_minor_and_never_the_control_nodes() {
    let rule = DeviceRule::granting(&[1, 3]);
    assert_eq!(rule.denied().len(), 252);
    assert!(!rule.denied().contains(&1) && !rule.denied().contains(&3));
    assert!(rule.denied().contains(&0) && rule.denied().contains(&253));
    assert!(!rule.denied().iter().any(|&m| m >= 254));
    assert_eq!(rule.to_string(), "c 195:0,2,4-253");
    assert_eq!(DeviceRule::granting(&[]).to_string(), "c 195:0-253");
    assert_eq!(DeviceRule::denying(&[255, 254]).to_string(), "nothing");
}

#[test]
fn a_grant_with_known_nodes_denies_all_others() {
    let rule = DeviceRule::for_grant(&[Some(2)], &[0, 1, 2, 3]).unwrap();
    assert_eq!(rule, DeviceRule::granting(&[2]));
    // Nodes the inventory does not list are denied too: a GPU orch does not know is no job's.
    assert!(rule.denied().contains(&200));
    // No GPU at all: every GPU node is denied.
    assert_eq!(
        DeviceRule::for_grant(&[], &[0, 1]).unwrap(),
        DeviceRule::granting(&[])
    );
}

#[test]
fn a_grant_with_an_unknown_node_denies_only_the_other_known_ones() {
    let rule = DeviceRule::for_grant(&[None, Some(1)], &[0, 1, 2]).unwrap();
    assert_eq!(rule.denied(), &[0, 2]);
    // Every known node granted, one GPU unknown: nothing to deny.
    assert_eq!(DeviceRule::for_grant(&[None, Some(1)], &[1]), None);
    // No node known at all (a sim file without minor_number): no rule.
    assert_eq!(DeviceRule::for_grant(&[None], &[]), None);
    assert_eq!(DeviceRule::for_grant(&[], &[]), None);
}

/// The four GPU nodes `nvidia0..3` (195:0..3) and `other`, a character device of another major
/// (1:3, as `/dev/null`), in a folder of their own.
fn nodes(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("orch-devices-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let node = |name: &str, major: u32, minor: u32| {
        let path = std::ffi::CString::new(dir.join(name).as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: mknod on a NUL-terminated path; the result is checked.
        let rc = unsafe {
            libc::mknod(
                path.as_ptr(),
                libc::S_IFCHR | 0o666,
                libc::makedev(major, minor),
            )
        };
        assert_eq!(rc, 0, "mknod {name}: {}", std::io::Error::last_os_error());
    };
    for minor in 0..4 {
        node(&format!("nvidia{minor}"), NVIDIA_MAJOR, minor);
    }
    node("other", 1, 3);
    dir
}

/// A shell script that prints, per node, `NAME: ok` or `NAME: ERROR TEXT`.
fn probe_script(dir: &Path) -> String {
    format!(
        "for n in nvidia0 nvidia1 nvidia2 nvidia3 other; do \
           if e=$(cat {}/$n 2>&1 >/dev/null); then echo \"$n: ok\"; else echo \"$n: ${{e##*: }}\"; fi; \
         done",
        dir.display()
    )
}

/// What a process confined to GPU 1 reads.
const GRANTED_1: &str = "nvidia0: Operation not permitted\nnvidia1: No such device or address\nnvidia2: Operation not permitted\nnvidia3: Operation not permitted\nother: ok\n";

/// Root, and `mechanism` works here; otherwise skips (fails under
/// `ORCH_REQUIRE_DEVICE_CONSTRAINT` when no mechanism at all does).
fn available(mechanism: &str) -> bool {
    // SAFETY: geteuid cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    let v1 = root && v1_available();
    let program = root && orch_core::process::cgroup_v2_mount().is_some() && bpf::probe().is_ok();
    let here = if mechanism == "v1" { v1 } else { program };
    if !here {
        assert!(
            std::env::var_os("ORCH_REQUIRE_DEVICE_CONSTRAINT").is_none() || v1 || program,
            "ORCH_REQUIRE_DEVICE_CONSTRAINT is set but neither the v1 devices controller nor a device program works here (root: {root})"
        );
        eprintln!("skipped: the {mechanism} device constraint is not available here");
    }
    here
}

/// Starts the probe script through the launcher, with the constraint joined as jobs join it.
fn launch_probe(dir: &Path, cgroup: Option<&JobCgroup>, join: Option<DeviceJoin>) -> String {
    let out = dir.join("stdout");
    // The launcher appends to its logs.
    let _ = std::fs::remove_file(&out);
    let spec = LaunchSpec {
        argv: vec![
            "sh".into(),
            "-c".into(),
            format!(
                "{}; sh -c 'cat {}/nvidia2' 2>&1; true",
                probe_script(dir),
                dir.display()
            ),
        ],
        cwd: None,
        job: JobEnv::default(),
        per_device: false,
        grace: Duration::from_secs(5),
        stdio: StdioMode::Files {
            stdout: out.clone(),
            stderr: dir.join("stderr"),
            cap: crate::LogCap {
                max_bytes: 1 << 20,
                reserve_bytes: 0,
            },
        },
        credentials: None,
        base_env: None,
        cgroup: cgroup.map(|c| c.path().to_path_buf()),
        devices: join,
        cpu_binding: Vec::new(),
        forward_signals: false,
        warning_signal: None,
    };
    let outcome = crate::launch(&spec, |_| {}, None).unwrap();
    assert!(outcome.success(), "{outcome}");
    std::fs::read_to_string(out).unwrap()
}

fn assert_confined_to_gpu_1(output: &str) {
    let (nodes, grandchild) = output.split_at(GRANTED_1.len().min(output.len()));
    assert_eq!(nodes, GRANTED_1, "{output}");
    assert!(
        grandchild.ends_with("Operation not permitted\n"),
        "a grandchild is refused too: {output}"
    );
}

#[test]
fn a_job_in_a_v1_devices_cgroup_opens_only_its_gpu() {
    if !available("v1") {
        return;
    }
    let dir = nodes("v1-job");
    let mount = orch_core::process::cgroup_v1_mount("devices").unwrap();
    let name = format!("test-v1-{}", std::process::id());
    let constraint = DeviceConstraint::prepare(
        &Mechanism::DevicesCgroup { mount },
        &name,
        None,
        &DeviceRule::granting(&[1]),
    )
    .unwrap();
    let Some(DeviceJoin::DevicesCgroup(cgroup_dir)) = constraint.join() else {
        panic!("a v1 constraint is joined by its devices cgroup");
    };
    assert!(cgroup_dir.ends_with(format!("orch-{name}")));
    assert_confined_to_gpu_1(&launch_probe(&dir, None, constraint.join()));
    drop(constraint);
    assert!(!cgroup_dir.exists(), "removed once empty");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_job_under_a_v2_device_program_opens_only_its_gpu() {
    if !available("bpf") {
        return;
    }
    let dir = nodes("bpf-job");
    let cgroup = JobCgroup::create(&format!("test-bpf-{}", std::process::id()))
        .expect("root with a cgroup2 mount makes a job cgroup");
    let constraint = DeviceConstraint::prepare(
        &Mechanism::Bpf,
        "test-bpf",
        Some(cgroup.path()),
        &DeviceRule::granting(&[1]),
    )
    .unwrap();
    assert_eq!(constraint.join(), Some(DeviceJoin::JobCgroup));
    assert_confined_to_gpu_1(&launch_probe(&dir, Some(&cgroup), constraint.join()));
    // Lifted, the program is gone: every node opens as far as the kernel lets it.
    constraint.lift();
    let output = launch_probe(&dir, Some(&cgroup), None);
    assert!(
        !output.contains("Operation not permitted"),
        "detached: {output}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A process that waits for `go` in `dir`, then probes the nodes into `dir/out`.
fn waiting_probe(dir: &Path) -> std::process::Child {
    let script = format!(
        "i=0; while [ ! -e {d}/go ] && [ $i -lt 500 ]; do sleep 0.01; i=$((i+1)); done; ({p}) > {d}/out",
        d = dir.display(),
        p = probe_script(dir)
    );
    std::process::Command::new("sh")
        .args(["-c", &script])
        .spawn()
        .unwrap()
}

fn read_after_go(dir: &Path, mut child: std::process::Child) -> String {
    std::fs::write(dir.join("go"), "").unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while child.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "the probe never ended");
        std::thread::sleep(Duration::from_millis(10));
    }
    std::fs::read_to_string(dir.join("out")).unwrap()
}

#[test]
fn a_running_lease_holder_is_confined_in_place() {
    if !available("v1") && !available("bpf") {
        return;
    }
    let Ok(mechanism) = detected() else {
        // ORCH_DEVICE_CONSTRAINT=off in the test's environment.
        return;
    };
    let dir = nodes("holder");
    let child = waiting_probe(&dir);
    let pid = child.id();
    let name = format!("test-holder-{pid}");
    // What the daemon does first: the holder's own v2 cgroup.
    let cgroup = JobCgroup::create(&name);
    if let Some(c) = &cgroup {
        std::fs::write(c.path().join("cgroup.procs"), pid.to_string()).unwrap();
    }
    if *mechanism == Mechanism::Bpf {
        assert!(
            cgroup.is_some(),
            "the device program needs the holder's v2 cgroup"
        );
    }
    let constraint = constrain_process(
        &name,
        pid,
        cgroup.as_ref().map(JobCgroup::path),
        &DeviceRule::granting(&[1]),
    )
    .unwrap()
    .expect("a mechanism was detected");
    assert_eq!(read_after_go(&dir, child), GRANTED_1);
    drop(constraint);
    remove_leftover(&name).unwrap();
    if let Ok(Mechanism::DevicesCgroup { .. }) = detected() {
        assert!(!v1::place(&name).unwrap().0.exists());
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_v2_holder_outside_the_cgroup_named_is_refused() {
    if !available("bpf") || detected().as_ref().ok() != Some(&Mechanism::Bpf) {
        return;
    }
    let cgroup = JobCgroup::create(&format!("test-outside-{}", std::process::id())).unwrap();
    let err = constrain_process(
        "outside",
        std::process::id(),
        Some(cgroup.path()),
        &DeviceRule::granting(&[0]),
    )
    .unwrap_err();
    assert!(err.contains("move it there first"), "{err}");
}

#[test]
fn a_v1_constraint_stays_while_its_process_runs_and_lift_frees_it() {
    if !available("v1") || !matches!(detected(), Ok(Mechanism::DevicesCgroup { .. })) {
        return;
    }
    let rule = DeviceRule::granting(&[0]);
    let sleeper = || {
        std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap()
    };
    let devices_dir = |pid: u32| orch_core::process::cgroup_v1_dir(pid, "devices").unwrap();

    // Kept (or dropped) while the process runs: the rule stays on it; remove_leftover says why.
    let mut kept = sleeper();
    let name = format!("test-kept-{}", kept.id());
    let constraint = constrain_process(&name, kept.id(), None, &rule)
        .unwrap()
        .unwrap();
    let dir = v1::place(&name).unwrap().0;
    assert_eq!(devices_dir(kept.id()), dir);
    constraint.keep();
    let err = remove_leftover(&name).unwrap_err();
    assert!(err.contains(&kept.id().to_string()), "{err}");
    assert_eq!(devices_dir(kept.id()), dir, "still confined");
    kept.kill().unwrap();
    kept.wait().unwrap();
    remove_leftover(&name).unwrap();
    assert!(!dir.exists());

    // Lifted: the process is back in the parent, and the cgroup gone.
    let mut lifted = sleeper();
    let before = devices_dir(lifted.id());
    let name = format!("test-lifted-{}", lifted.id());
    let constraint = constrain_process(&name, lifted.id(), None, &rule)
        .unwrap()
        .unwrap();
    constraint.lift();
    assert_eq!(devices_dir(lifted.id()), before);
    assert!(!v1::place(&name).unwrap().0.exists());
    lifted.kill().unwrap();
    lifted.wait().unwrap();
}
