//! A job runs on its GPUs' NUMA nodes' CPUs (`[resources] cpu_bind`), and programs that refuse
//! UUIDs get the indices CUDA numbers their GPUs by (`[command] device_ids = "index"`): `orch
//! run`, a per-device launch and the daemon's jobs, on a sim box of two nodes over this
//! machine's real CPUs 0 and 1.

use crate::serve::Daemon;
use crate::*;
use std::path::PathBuf;

/// A scratch folder with the sim box: GPUs 0-1 on NUMA node 0 near CPU 0, GPUs 2-3 on node 1
/// near CPU 1; GPUs 0-1 have 8 GiB, 2-3 80 GiB (so `--min-free-memory 40GiB` gets 2 and 3).
/// Each GPU has a minor number, so a root orch confines jobs to their GPUs' nodes.
struct Box2 {
    dir: PathBuf,
    sim: String,
}

impl Drop for Box2 {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn uuid(i: u32) -> String {
    format!("GPU-00000000-0000-4000-8000-00000000b1d{i}")
}

fn two_nodes(tag: &str) -> Box2 {
    let dir = std::env::temp_dir().join(format!("orch-bind-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut sim = String::new();
    for i in 0..4u32 {
        let (node, memory) = if i < 2 { (0, "8GiB") } else { (1, "80GiB") };
        sim.push_str(&format!(
            "[[gpu]]\nname = \"sim\"\nmemory_total = \"{memory}\"\nuuid = \"{}\"\nminor_number = {i}\nnuma_node = {node}\ncpus = \"{node}\"\n",
            uuid(i)
        ));
    }
    std::fs::write(dir.join("gpus.toml"), sim).unwrap();
    let sim = format!("sim:{}", dir.join("gpus.toml").display());
    Box2 { dir, sim }
}

/// Whether this process may run on CPUs 0 and 1 (the tests bind to each); else a skip.
fn has_cpus_0_and_1(test: &str) -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let allowed: orch_core::CpuList = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    if allowed.contains(0) && allowed.contains(1) {
        return true;
    }
    assert!(
        std::env::var_os("ORCH_REQUIRE_CPU_BIND").is_none(),
        "{test} needs CPUs 0 and 1 (has {allowed}) and ORCH_REQUIRE_CPU_BIND is set"
    );
    eprintln!("{test}: skipped (needs CPUs 0 and 1, has {allowed})");
    false
}

/// The `Cpus_allowed_list` value a job's `grep Cpus_allowed_list /proc/self/status` printed.
fn allowed(output: &str) -> String {
    output
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .unwrap_or_else(|| panic!("no Cpus_allowed_list in {output:?}"))
        .trim()
        .to_string()
}

fn run(b: &Box2, args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let state = b.dir.join("state").display().to_string();
    let mut all = vec!["--devices", b.sim.as_str(), "run"];
    all.extend_from_slice(args);
    let mut env = env.to_vec();
    env.push(("ORCH_STATE_DIR", &state));
    orch(&all, &env)
}

const GREP: [&str; 3] = ["grep", "Cpus_allowed_list", "/proc/self/status"];

#[test]
fn a_job_on_gpus_2_and_3_runs_on_node_1s_cpu_and_none_leaves_it_unbound() {
    if !has_cpus_0_and_1("a_job_on_gpus_2_and_3") {
        return;
    }
    let b = two_nodes("run");
    let mut args = vec!["--gpus", "2", "--min-free-memory", "40GiB", "--"];
    args.extend(GREP);
    let out = run(&b, &args, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(allowed(&stdout(&out)), "1", "{}", stderr(&out));
    // Said with the placement (the default log level shows orch_runner's lines).
    assert!(
        stderr(&out).contains("bound to CPUs 1, memory preferred on NUMA node 0"),
        "{}",
        stderr(&out)
    );
    // GPUs 0-1: node 0's CPU.
    let mut args = vec!["--gpus", "2", "--"];
    args.extend(GREP);
    let pci = ("CUDA_DEVICE_ORDER", "PCI_BUS_ID");
    let out = run(&b, &args, &[("CUDA_VISIBLE_DEVICES", "0,1"), pci]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(allowed(&stdout(&out)), "0");
    // Unbound: where orch itself runs.
    let mut args = vec![
        "--gpus",
        "2",
        "--min-free-memory",
        "40GiB",
        "--cpu-bind",
        "none",
        "--",
    ];
    args.extend(GREP);
    let out = run(&b, &args, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let own = allowed(&std::fs::read_to_string("/proc/self/status").unwrap());
    assert_eq!(allowed(&stdout(&out)), own);
    assert!(!stderr(&out).contains("bound to"), "{}", stderr(&out));
}

#[test]
fn per_device_ranks_each_run_on_their_own_gpus_node() {
    if !has_cpus_0_and_1("per_device_ranks") {
        return;
    }
    let b = two_nodes("ranks");
    let out = run(
        &b,
        &[
            "--gpus",
            "2",
            "--per-device",
            "--",
            "sh",
            "-c",
            "echo \"$RANK $CUDA_VISIBLE_DEVICES $(grep Cpus_allowed_list /proc/self/status | cut -f2)\"",
        ],
        // GPU 0 (node 0) and GPU 2 (node 1).
        &[
            ("CUDA_VISIBLE_DEVICES", "0,2"),
            ("CUDA_DEVICE_ORDER", "PCI_BUS_ID"),
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let mut lines: Vec<String> = stdout(&out).lines().map(str::to_string).collect();
    lines.sort();
    let rank_cpu = |line: &str| {
        let words: Vec<&str> = line.split_whitespace().collect();
        let gpu = if words[1] == uuid(0) { 0 } else { 2 };
        (gpu, words[2].to_string())
    };
    let mut seen: Vec<(u32, String)> = lines.iter().map(|l| rank_cpu(l)).collect();
    seen.sort();
    assert_eq!(
        seen,
        vec![(0, "0".to_string()), (2, "1".to_string())],
        "{lines:?}"
    );
}

#[test]
fn a_bad_cpu_bind_or_device_ids_is_one_sentence_at_its_place() {
    let b = two_nodes("bad");
    let job = b.dir.join("job.toml");
    std::fs::write(
        &job,
        "[job]\nname = \"j\"\n[resources]\ncpu_bind = \"socket\"\n[command]\nargv = [\"true\"]\n",
    )
    .unwrap();
    let out = run(&b, &[job.to_str().unwrap()], &[]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("job.toml:4:12: cpu_bind = \"socket\" is not known"),
        "{}",
        stderr(&out)
    );
    std::fs::write(
        &job,
        "[job]\nname = \"j\"\n[command]\nargv = [\"true\"]\ndevice_ids = \"ordinal\"\n",
    )
    .unwrap();
    let out = run(&b, &[job.to_str().unwrap()], &[]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("job.toml:5:14: device_ids = \"ordinal\" is not known"),
        "{}",
        stderr(&out)
    );
}

/// The indices a job printed (`echo $CUDA_VISIBLE_DEVICES`), sorted.
fn indices(output: &str) -> Vec<String> {
    let mut ids: Vec<String> = output.trim().split(',').map(str::to_string).collect();
    ids.sort();
    ids
}

/// Whether this orch, as root, confines jobs to their GPUs' nodes here.
fn confines() -> bool {
    // SAFETY: geteuid cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    root && orch_exec::devices::Mechanism::detect_with(orch_exec::devices::Choice::Auto).is_ok()
}

#[test]
fn index_ids_are_the_job_relative_numbers_when_confined_and_physical_when_not() {
    let b = two_nodes("index");
    let args = [
        "--gpus",
        "2",
        "--min-free-memory",
        "40GiB",
        "--device-ids",
        "index",
        "--",
        "sh",
        "-c",
        "echo $CUDA_VISIBLE_DEVICES; echo $CUDA_DEVICE_ORDER >&2",
    ];
    // Unconfined, CUDA sees all four GPUs: 2 and 3 are its numbers 2 and 3.
    let out = run(&b, &args, &[("ORCH_DEVICE_CONSTRAINT", "off")]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(indices(&stdout(&out)), ["2", "3"]);
    assert!(stderr(&out).contains("PCI_BUS_ID"), "{}", stderr(&out));
    // The default stays UUIDs.
    let out = run(
        &b,
        &[
            "--gpus",
            "1",
            "--",
            "sh",
            "-c",
            "echo $CUDA_VISIBLE_DEVICES",
        ],
        &[],
    );
    assert!(stdout(&out).starts_with("GPU-"), "{}", stdout(&out));
    if !confines() {
        assert!(
            std::env::var_os("ORCH_REQUIRE_DEVICE_CONSTRAINT").is_none(),
            "index_ids…: the confined half needs root and a device constraint, and ORCH_REQUIRE_DEVICE_CONSTRAINT is set"
        );
        eprintln!("index_ids…: the confined half skipped (not root, or no device constraint here)");
        return;
    }
    // Confined, the job can open GPUs 2 and 3 alone: CUDA numbers them 0 and 1.
    let out = run(&b, &args, &[("ORCH_DEVICE_CONSTRAINT", "auto")]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(indices(&stdout(&out)), ["0", "1"]);
}

#[test]
fn index_ids_refuse_a_mig_slice_with_a_sentence() {
    let b = two_nodes("mig");
    let mig = "MIG-00000000-0000-4000-8000-0000000000aa";
    std::fs::write(
        b.dir.join("mig.toml"),
        format!(
            "[[gpu]]\nname = \"sim\"\nmemory_total = \"80GiB\"\nuuid = \"{}\"\n[[gpu.mig]]\nuuid = \"{mig}\"\nname = \"1g.10gb\"\nmemory_total = \"10GiB\"\n",
            uuid(9)
        ),
    )
    .unwrap();
    let sim = format!("sim:{}", b.dir.join("mig.toml").display());
    let state = b.dir.join("state").display().to_string();
    let out = orch(
        &[
            "--devices",
            &sim,
            "run",
            "--gpus",
            "1",
            "--device-ids",
            "index",
            "--",
            "true",
        ],
        &[("CUDA_VISIBLE_DEVICES", mig), ("ORCH_STATE_DIR", &state)],
    );
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains(&format!(
            "device_ids = \"index\" cannot name the MIG slice {mig}"
        )),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_daemon_job_is_bound_and_gets_its_tenants_index_default() {
    if !has_cpus_0_and_1("a_daemon_job_is_bound") || !crate::serve::root_or_skip("bind serve") {
        return;
    }
    let b = two_nodes("serve");
    let mut d = Daemon::prepare("bind");
    let config = d.state.join("serve.toml");
    std::fs::write(
        &config,
        "[[tenant]]\nname = \"t\"\nusers = [\"root\"]\ndevice_ids = \"index\"\n",
    )
    .unwrap();
    d.config = Some(config);
    d.devices = Some(b.sim.clone());
    d.restart();
    let id = d.submit(&[
        "--gpus",
        "2",
        "--min-free-memory",
        "40GiB",
        "--",
        "sh",
        "-c",
        "echo $CUDA_VISIBLE_DEVICES; grep Cpus_allowed_list /proc/self/status",
    ]);
    let out = d.client(&["wait", &id]);
    assert!(out.status.success(), "{}\n{}", stderr(&out), d.log());
    let logs = stdout(&d.client(&["logs", &id]));
    assert_eq!(allowed(&logs), "1", "{logs}");
    let first = logs.lines().next().unwrap_or_default();
    let expected = if confines() { ["0", "1"] } else { ["2", "3"] };
    assert_eq!(indices(first), expected, "{logs}");
    // A job that says uuid keeps UUIDs.
    let job = b.dir.join("uuid.toml");
    std::fs::write(
        &job,
        "[job]\nname = \"u\"\n[resources]\ncpu_bind = \"none\"\n[command]\nargv = [\"sh\", \"-c\", \"echo $CUDA_VISIBLE_DEVICES; grep Cpus_allowed_list /proc/self/status\"]\ndevice_ids = \"uuid\"\n",
    )
    .unwrap();
    let id = d.submit(&[job.to_str().unwrap()]);
    let out = d.client(&["wait", &id]);
    assert!(out.status.success(), "{}\n{}", stderr(&out), d.log());
    let logs = stdout(&d.client(&["logs", &id]));
    assert!(logs.starts_with("GPU-"), "{logs}");
    let own = allowed(&std::fs::read_to_string("/proc/self/status").unwrap());
    assert_eq!(allowed(&logs), own, "{logs}");
    let _ = std::fs::remove_dir_all(&d.state);
}

#[test]
fn an_alloc_shell_is_bound_and_named_by_index_too() {
    if !has_cpus_0_and_1("an_alloc_shell_is_bound") {
        return;
    }
    let b = two_nodes("alloc");
    let state = b.dir.join("state").display().to_string();
    let out = orch(
        &[
            "--devices",
            &b.sim,
            "alloc",
            "--gpus",
            "2",
            "--min-free-memory",
            "40GiB",
            "--device-ids",
            "index",
            "--",
            "sh",
            "-c",
            "echo $CUDA_VISIBLE_DEVICES; grep Cpus_allowed_list /proc/self/status",
        ],
        &[
            ("ORCH_STATE_DIR", &state),
            ("ORCH_DEVICE_CONSTRAINT", "off"),
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert_eq!(allowed(&text), "1", "{text}");
    assert_eq!(indices(text.lines().next().unwrap()), ["2", "3"], "{text}");
}

/// A user's `orch run` through a root daemon: the daemon confines the user's process, so the
/// indices are the daemon's (job-relative), with the tenant's default `index`.
#[test]
fn a_users_orch_run_through_the_daemon_gets_the_daemons_indices() {
    if !has_cpus_0_and_1("a_users_orch_run") || !crate::serve::root_or_skip("bind held") {
        return;
    }
    let b = two_nodes("held");
    let user = crate::serve::test_user("orchtestc");
    let public = b.dir.join("public");
    crate::serve::world_dir(&public);
    let mut d = Daemon::prepare("bind-held");
    let config = d.state.join("serve.toml");
    std::fs::write(
        &config,
        "[[tenant]]\nname = \"c\"\nusers = [\"orchtestc\"]\ndevice_ids = \"index\"\n",
    )
    .unwrap();
    d.config = Some(config);
    d.devices = Some(b.sim.clone());
    d.socket = Some(public.join("orch.sock"));
    d.restart();
    let out = crate::serve::as_user(
        user,
        &d.socket(),
        &public,
        &[
            "run",
            "--gpus",
            "2",
            "--min-free-memory",
            "40GiB",
            "--",
            "sh",
            "-c",
            "echo $CUDA_VISIBLE_DEVICES; grep Cpus_allowed_list /proc/self/status",
        ],
    );
    assert!(out.status.success(), "{}\n{}", stderr(&out), d.log());
    let text = stdout(&out);
    assert_eq!(allowed(&text), "1", "{text}");
    let expected = if confines() { ["0", "1"] } else { ["2", "3"] };
    assert_eq!(
        indices(text.lines().next().unwrap()),
        expected,
        "{text}\n{}",
        stderr(&out)
    );
    let _ = std::fs::remove_dir_all(&d.state);
}

/// Whether orch, as root here, can fence CPUs with a cpuset: its cgroup (where a job's cgroup
/// is made) has the v2 cpuset controller.
fn cpusets() -> bool {
    // SAFETY: geteuid cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    let v2 = orch_core::process::cgroup_v2_dir(std::process::id()).is_some_and(|d| {
        std::fs::read_to_string(d.join("cgroup.controllers"))
            .is_ok_and(|c| c.split_whitespace().any(|w| w == "cpuset"))
    });
    root && v2
}

#[test]
fn where_orch_makes_a_cpuset_a_bound_job_cannot_widen_its_cpus() {
    if !has_cpus_0_and_1("a_bound_job_cannot_widen") {
        return;
    }
    if !cpusets() {
        assert!(
            std::env::var_os("ORCH_REQUIRE_CPUSET").is_none(),
            "a_bound_job_cannot_widen needs root and the v2 cpuset controller, and ORCH_REQUIRE_CPUSET is set"
        );
        eprintln!(
            "a_bound_job_cannot_widen: skipped (not root, or no v2 cpuset controller for job cgroups)"
        );
        return;
    }
    let b = two_nodes("fence");
    let out = run(
        &b,
        &[
            "--gpus",
            "2",
            "--min-free-memory",
            "40GiB",
            "--",
            "sh",
            "-c",
            "taskset -pc 0-1 $$ >/dev/null 2>&1; grep Cpus_allowed_list /proc/self/status",
        ],
        &[],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(allowed(&stdout(&out)), "1", "{}", stderr(&out));
    // Unbound, the same command widens (so the fence above is the cpuset's, not taskset's).
    let out = run(
        &b,
        &[
            "--gpus",
            "2",
            "--min-free-memory",
            "40GiB",
            "--cpu-bind",
            "none",
            "--",
            "sh",
            "-c",
            "taskset -pc 1 $$ >/dev/null; taskset -pc 0-1 $$ >/dev/null; grep Cpus_allowed_list /proc/self/status",
        ],
        &[],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(allowed(&stdout(&out)), "0-1");
}

#[test]
fn orch_plan_says_the_binding() {
    let b = two_nodes("plan");
    let state = b.dir.join("state").display().to_string();
    let plan = |text: &str, json: bool| {
        let job = b.dir.join("job.toml");
        std::fs::write(&job, text).unwrap();
        let mut args = vec!["--devices", b.sim.as_str(), "plan", job.to_str().unwrap()];
        if json {
            args.push("--json");
        }
        let out = orch(
            &args,
            &[
                ("ORCH_STATE_DIR", state.as_str()),
                ("CUDA_DEVICE_ORDER", "PCI_BUS_ID"),
            ],
        );
        assert!(out.status.success(), "{}", stderr(&out));
        stdout(&out)
    };
    let own = allowed(&std::fs::read_to_string("/proc/self/status").unwrap());
    let own: orch_core::CpuList = own.parse().unwrap();
    let job = "[job]\nname = \"p\"\n[resources]\ngpus = 2\nmin_free_memory = \"40GiB\"\n[command]\nargv = [\"true\"]\n";
    let text = plan(job, false);
    if own.contains(1) {
        assert!(
            text.contains("cpu binding: CPUs 1, memory preferred on NUMA node"),
            "{text}"
        );
        let json: serde_json::Value = serde_json::from_str(&plan(job, true)).unwrap();
        assert_eq!(json["cpu_binding"][0]["cpus"], "1", "{json}");
    } else {
        assert!(
            text.contains("cpu binding: not bound (none of the GPUs' CPUs"),
            "{text}"
        );
    }
    let per_rank = plan(
        &job.replace(
            "argv = [\"true\"]",
            "argv = [\"true\"]\nlaunch = \"per-device\"",
        ),
        false,
    );
    assert!(per_rank.contains("cpu binding of rank 0: "), "{per_rank}");
    assert!(per_rank.contains("cpu binding of rank 1: "), "{per_rank}");
    let none = plan(
        &job.replace("gpus = 2", "gpus = 2\ncpu_bind = \"none\""),
        false,
    );
    assert!(!none.contains("cpu binding"), "{none}");
    // A trainer is bound when the daemon runs it, and the plan says so.
    let train = plan(
        &format!(
            "[job]\nname = \"t\"\n[resources]\ngpus = 2\nmin_free_memory = \"40GiB\"\n[train]\nplugin = \"mlp\"\nbatch_size = 64\nepochs = 1\n[train.data]\nformat = \"mnist-idx\"\ntrain = \"{}\"\n",
            root().join("examples/mnist/data").display()
        ),
        false,
    );
    assert!(train.contains("cpu binding: "), "{train}");
    assert!(train.contains("when the daemon runs it"), "{train}");
}
