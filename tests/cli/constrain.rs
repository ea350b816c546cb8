//! Jobs orch starts as root may open only their granted GPUs' device nodes, whatever they do with
//! `CUDA_VISIBLE_DEVICES`: `orch run` and the daemon's jobs, on four GPU nodes made with mknod
//! (195:0..3, which no driver serves: the granted one fails with ENXIO, "No such device or
//! address"; a refused one with EPERM, "Operation not permitted") and a sim file naming them.

use crate::serve::Daemon;
use crate::*;
use orch_exec::devices::{Choice, Mechanism, Unconstrained};
use std::path::PathBuf;

/// The folder of nodes, the probe script and the sim file.
pub(crate) struct Lab {
    pub(crate) dir: PathBuf,
    sim: String,
}

impl Drop for Lab {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Root with a way to confine jobs, else `None` (a skip; a failure under
/// `ORCH_REQUIRE_DEVICE_CONSTRAINT`).
pub(crate) fn lab(tag: &str) -> Option<Lab> {
    let required = std::env::var_os("ORCH_REQUIRE_DEVICE_CONSTRAINT").is_some();
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        assert!(
            !required,
            "{tag}: ORCH_REQUIRE_DEVICE_CONSTRAINT is set but this is not root"
        );
        eprintln!("{tag}: skipped (needs root)");
        return None;
    }
    // What the orch processes of these tests find (they get ORCH_DEVICE_CONSTRAINT explicitly).
    match Mechanism::detect_with(Choice::Auto) {
        Ok(_) => {}
        Err(Unconstrained::Unavailable(why)) => {
            assert!(
                !required,
                "{tag}: ORCH_REQUIRE_DEVICE_CONSTRAINT is set but {why}"
            );
            eprintln!("{tag}: skipped ({why})");
            return None;
        }
        Err(why) => panic!("{tag}: {why}"),
    }
    let dir = std::env::temp_dir().join(format!(
        "orch-constrain-{tag}-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let mut sim = String::new();
    for minor in 0..4 {
        let out = std::process::Command::new("mknod")
            .args(["-m", "666"])
            .arg(dir.join(format!("nvidia{minor}")))
            .args(["c", "195", &minor.to_string()])
            .output()
            .unwrap();
        assert!(out.status.success(), "mknod: {}", stderr(&out));
        sim.push_str(&format!(
            "[[gpu]]\nname = \"sim\"\nmemory_total = \"16GiB\"\nuuid = \"GPU-00000000-0000-4000-8000-00000000000{minor}\"\nminor_number = {minor}\n"
        ));
    }
    // A character device of another major (as /dev/null): no GPU's, always open.
    let out = std::process::Command::new("mknod")
        .args(["-m", "666"])
        .arg(dir.join("other"))
        .args(["c", "1", "3"])
        .output()
        .unwrap();
    assert!(out.status.success(), "mknod: {}", stderr(&out));
    std::fs::write(dir.join("gpus.toml"), sim).unwrap();
    // One line per node: `LABEL NODE: ok` or `LABEL NODE: ERROR TEXT`.
    std::fs::write(
        dir.join("probe.sh"),
        format!(
            "for n in {d}/nvidia0 {d}/nvidia1 {d}/nvidia2 {d}/nvidia3 {d}/other /dev/null; do\n\
             if e=$(cat $n 2>&1 >/dev/null); then echo \"$1 ${{n##*/}}: ok\"; else echo \"$1 ${{n##*/}}: ${{e##*: }}\"; fi\n\
             done\n",
            d = dir.display()
        ),
    )
    .unwrap();
    let sim = format!("sim:{}", dir.join("gpus.toml").display());
    Some(Lab { dir, sim })
}

impl Lab {
    /// The job's command: its grant, then the probe as the job, without `CUDA_VISIBLE_DEVICES`,
    /// with every GPU in it, and from a grandchild.
    pub(crate) fn script(&self) -> String {
        let probe = self.dir.join("probe.sh").display().to_string();
        format!(
            "echo \"granted $CUDA_VISIBLE_DEVICES\"; sh {probe} job; \
             (unset CUDA_VISIBLE_DEVICES; sh {probe} unset); \
             CUDA_VISIBLE_DEVICES=0,1,2,3 sh {probe} all; \
             sh -c 'sh -c \"sh {probe} grandchild\"'"
        )
    }
}

/// What the probe prints for a job granted GPU `granted` (`None`: nothing refused).
pub(crate) fn expected(granted: Option<u32>) -> String {
    let mut out = String::new();
    for label in ["job", "unset", "all", "grandchild"] {
        for minor in 0..4 {
            let error = match granted {
                Some(g) if g != minor => "Operation not permitted",
                _ => "No such device or address",
            };
            out.push_str(&format!("{label} nvidia{minor}: {error}\n"));
        }
        out.push_str(&format!("{label} other: ok\n{label} null: ok\n"));
    }
    out
}

/// The granted GPU's minor (its uuid's last digit, by the sim file) and the probe's lines.
pub(crate) fn granted_and_lines(output: &str) -> (u32, String) {
    let (first, rest) = output.split_once('\n').expect("the job printed its grant");
    let uuid = first.strip_prefix("granted ").expect("a grant line");
    assert!(
        uuid.starts_with("GPU-") && !uuid.contains(','),
        "one GPU: {output}"
    );
    (uuid[uuid.len() - 1..].parse().unwrap(), rest.to_string())
}

fn run_as_root(lab: &Lab, constraint: &str, extra: &[(&str, &str)]) -> std::process::Output {
    let state = lab.dir.join("state").display().to_string();
    let mut env = vec![
        ("ORCH_STATE_DIR", state.as_str()),
        ("ORCH_DEVICE_CONSTRAINT", constraint),
    ];
    env.extend_from_slice(extra);
    let script = lab.script();
    orch(
        &[
            "--devices",
            &lab.sim,
            "run",
            "--gpus",
            "1",
            "--",
            "sh",
            "-c",
            &script,
        ],
        &env,
    )
}

#[test]
fn roots_orch_run_opens_only_its_gpus_node() {
    let Some(lab) = lab("run") else { return };
    let out = run_as_root(&lab, "auto", &[("RUST_LOG", "orch_runner=debug")]);
    assert!(out.status.success(), "{}", stderr(&out));
    let (granted, lines) = granted_and_lines(&stdout(&out));
    assert_eq!(lines, expected(Some(granted)));
    // Said once, at debug level.
    let said = "jobs may open only their granted GPUs' device nodes (";
    assert_eq!(stderr(&out).matches(said).count(), 1, "{}", stderr(&out));
    // The leases are released and the next job gets the same rule.
    let again = run_as_root(&lab, "auto", &[]);
    assert!(again.status.success(), "{}", stderr(&again));
    let (granted, lines) = granted_and_lines(&stdout(&again));
    assert_eq!(lines, expected(Some(granted)));
    assert!(!stderr(&again).contains(said), "not at the default level");
}

#[test]
fn the_v2_device_program_confines_a_job_too() {
    let Some(lab) = lab("bpf") else { return };
    if let Err(why) = Mechanism::detect_with(Choice::Bpf) {
        assert!(
            std::env::var_os("ORCH_REQUIRE_DEVICE_CONSTRAINT").is_none()
                || orch_core::process::cgroup_v2_mount().is_none(),
            "a cgroup v2 hierarchy is mounted but the device program is not available: {why}"
        );
        eprintln!("the_v2_device_program_confines_a_job_too: skipped ({why})");
        return;
    }
    let out = run_as_root(&lab, "bpf", &[("RUST_LOG", "orch_runner=debug")]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("(a cgroup v2 device program (BPF))"),
        "{}",
        stderr(&out)
    );
    let (granted, lines) = granted_and_lines(&stdout(&out));
    assert_eq!(lines, expected(Some(granted)));
}

#[test]
fn off_leaves_every_node_open() {
    let Some(lab) = lab("off") else { return };
    let out = run_as_root(&lab, "off", &[("RUST_LOG", "orch_runner=debug")]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out)
            .contains("not confined to their GPUs' device nodes: ORCH_DEVICE_CONSTRAINT is off"),
        "{}",
        stderr(&out)
    );
    let (_, lines) = granted_and_lines(&stdout(&out));
    assert_eq!(lines, expected(None));
}

#[test]
fn a_daemon_job_opens_only_its_gpus_node() {
    let Some(lab) = lab("serve") else { return };
    if std::env::var("ORCH_DEVICE_CONSTRAINT").is_ok_and(|v| v == "off") {
        eprintln!(
            "a_daemon_job_opens_only_its_gpus_node: skipped (ORCH_DEVICE_CONSTRAINT=off here)"
        );
        return;
    }
    let mut d = Daemon::prepare("constrain");
    d.devices = Some(lab.sim.clone());
    d.restart();
    assert!(
        d.log()
            .contains("orch serve: jobs may open only their granted GPUs' device nodes ("),
        "{}",
        d.log()
    );
    let script = lab.script();
    let id = d.submit(&["--gpus", "1", "--", "sh", "-c", &script]);
    let out = d.client(&["wait", &id]);
    assert!(out.status.success(), "{}", stderr(&out));
    let (granted, lines) = granted_and_lines(&stdout(&d.client(&["logs", &id])));
    assert_eq!(lines, expected(Some(granted)));
    let _ = std::fs::remove_dir_all(&d.state);
}

/// A root daemon on the lab's GPUs with one tenant, the test user `orchtestc`, on a socket in a
/// folder everyone may enter; its environment gets `env` too. The daemon, the user's ids and
/// that folder.
fn users_daemon(
    lab: &Lab,
    tag: &str,
    env: Vec<(&'static str, String)>,
) -> (Daemon, (u32, u32), PathBuf) {
    let user = crate::serve::test_user("orchtestc");
    let public = lab.dir.join("public");
    crate::serve::world_dir(&public);
    let mut d = Daemon::prepare(tag);
    let config = d.state.join("serve.toml");
    std::fs::write(
        &config,
        "[[tenant]]\nname = \"c\"\nusers = [\"orchtestc\"]\n",
    )
    .unwrap();
    d.config = Some(config);
    d.devices = Some(lab.sim.clone());
    d.socket = Some(public.join("orch.sock"));
    d.env = env;
    d.restart();
    (d, user, public)
}

#[test]
fn a_users_orch_run_through_the_daemon_opens_only_its_gpus_node() {
    let Some(lab) = lab("held") else { return };
    if std::env::var("ORCH_DEVICE_CONSTRAINT").is_ok_and(|v| v == "off") {
        eprintln!("a_users_orch_run_through_the_daemon: skipped (ORCH_DEVICE_CONSTRAINT=off here)");
        return;
    }
    // Not root: its own orch confines nothing; the rule is the daemon's, on the holder.
    let (d, user, public) = users_daemon(&lab, "constrain-held", Vec::new());
    let script = lab.script();
    let out = crate::serve::as_user(
        user,
        &d.socket(),
        &public,
        &["run", "--gpus", "1", "--", "sh", "-c", &script],
    );
    assert!(out.status.success(), "{}\n{}", stderr(&out), d.log());
    let (granted, lines) = granted_and_lines(&stdout(&out));
    assert_eq!(lines, expected(Some(granted)));
    // The lease ended and its rule went with it: the next one is confined to its own GPU.
    let again = crate::serve::as_user(
        user,
        &d.socket(),
        &public,
        &["run", "--gpus", "1", "--", "sh", "-c", &script],
    );
    assert!(again.status.success(), "{}", stderr(&again));
    let (granted, lines) = granted_and_lines(&stdout(&again));
    assert_eq!(lines, expected(Some(granted)));
    let _ = std::fs::remove_dir_all(&d.state);
}

/// With `ORCH_CGROUPS=off` the device program has no cgroup to sit on: the daemon says so at
/// start-up and a holder's lease runs unconfined, as the daemon's own jobs do, instead of every
/// lease failing.
#[test]
fn without_cgroups_the_daemon_says_its_holders_are_not_confined_and_serves_them() {
    let Some(lab) = lab("nocg") else { return };
    if let Err(why) = Mechanism::detect_with(Choice::Bpf) {
        assert!(
            std::env::var_os("ORCH_REQUIRE_DEVICE_CONSTRAINT").is_none()
                || orch_core::process::cgroup_v2_mount().is_none(),
            "a cgroup v2 hierarchy is mounted but the device program is not available: {why}"
        );
        eprintln!("without_cgroups_the_daemon_says: skipped ({why})");
        return;
    }
    let (d, user, public) = users_daemon(
        &lab,
        "constrain-nocg",
        vec![
            ("ORCH_CGROUPS", "off".into()),
            ("ORCH_DEVICE_CONSTRAINT", "bpf".into()),
        ],
    );
    assert!(
        d.log().contains(
            "jobs are not confined to their GPUs' device nodes: the cgroup v2 device program needs each job's own cgroup, and ORCH_CGROUPS=off turns those off"
        ),
        "{}",
        d.log()
    );
    let out = crate::serve::as_user(
        user,
        &d.socket(),
        &public,
        &["run", "--gpus", "1", "--", "sh", "-c", &lab.script()],
    );
    assert!(out.status.success(), "{}\n{}", stderr(&out), d.log());
    let (_, lines) = granted_and_lines(&stdout(&out));
    assert_eq!(lines, expected(None));
    assert!(
        d.log().contains(
            "is not confined to its GPUs' device nodes: the device program needs a cgroup"
        ),
        "{}",
        d.log()
    );
    let _ = std::fs::remove_dir_all(&d.state);
}
