//! orch on a real Slurm: a one-node cluster (munged, slurmctld, slurmd on loopback, as root,
//! `tests/slurm/start.sh`) with four GPUs declared as links to /dev/null, and a sim inventory of
//! four GPUs standing for them. Covers the grant inside `srun` and `sbatch`, `orch submit
//! --slurm`, `jobs`, `cancel`, `logs`, `wait`, a sweep as a job array, and the refusals.

use crate::*;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// The cluster, stopped when dropped.
struct Cluster {
    base: PathBuf,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new(root().join("tests/slurm/stop.sh"))
            .arg(&self.base)
            .output();
    }
}

/// Starts a cluster of `nodes` nodes (one: named as this host; more: `node1`, `node2`, … each
/// with its own slurmd on this host); `None` (skipped) without root or Slurm, unless
/// `ORCH_REQUIRE_SLURM` is set.
fn cluster(test: &str, nodes: usize) -> Option<Cluster> {
    let have = ["slurmctld", "slurmd", "munged", "sbatch"].iter().all(|b| {
        Command::new("which")
            .arg(b)
            .output()
            .is_ok_and(|o| o.status.success())
    });
    let root_user = unsafe { libc::geteuid() } == 0;
    if !(have && root_user) {
        assert!(
            std::env::var_os("ORCH_REQUIRE_SLURM").is_none(),
            "{test} needs root and Slurm (slurmctld, slurmd, munge) and ORCH_REQUIRE_SLURM is set"
        );
        eprintln!("{test}: skipped (needs root and Slurm)");
        return None;
    }
    let base = std::env::temp_dir().join(format!("orch-slurm-{nodes}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    let ports: Vec<String> = (0..nodes).map(|_| free_port().to_string()).collect();
    let out = Command::new(root().join("tests/slurm/start.sh"))
        .arg(&base)
        .arg(free_port().to_string())
        .arg(ports.join(","))
        .output()
        .unwrap();
    let cluster = Cluster { base };
    assert!(
        out.status.success(),
        "the test cluster did not start: {}{}",
        stdout(&out),
        stderr(&out)
    );
    Some(cluster)
}

/// A sim inventory of the cluster's four GPUs.
fn sim(dir: &Path) -> PathBuf {
    let mut text = String::new();
    for i in 0..4 {
        text.push_str(&format!(
            "[[gpu]]\nname = \"NVIDIA A100-SXM4-40GB\"\nmemory_total = \"40GiB\"\nuuid = \"GPU-{i:08x}-1111-4000-8000-000000000000\"\n"
        ));
    }
    let path = dir.join("sim4.toml");
    std::fs::write(&path, text).unwrap();
    path
}

struct Env {
    conf: String,
    devices: String,
    state: String,
    dir: PathBuf,
}

impl Env {
    fn new(c: &Cluster) -> Env {
        let dir = c.base.join("work");
        std::fs::create_dir_all(&dir).unwrap();
        Env {
            conf: c.base.join("etc/slurm.conf").display().to_string(),
            devices: format!("sim:{}", sim(&dir).display()),
            state: dir.join("state").display().to_string(),
            dir,
        }
    }

    fn vars(&self) -> [(&str, &str); 3] {
        [
            ("SLURM_CONF", &self.conf),
            ("ORCH_DEVICES", &self.devices),
            ("ORCH_STATE_DIR", &self.state),
        ]
    }

    fn orch(&self, args: &[&str]) -> std::process::Output {
        orch(args, &self.vars())
    }

    fn srun(&self, args: &[&str]) -> std::process::Output {
        Command::new("srun")
            .args(args)
            .envs(self.vars())
            .current_dir(&self.dir)
            .output()
            .unwrap()
    }

    fn job(&self, name: &str, text: &str) -> String {
        let path = self.dir.join(format!("{name}.toml"));
        std::fs::write(&path, text).unwrap();
        path.display().to_string()
    }

    fn submit(&self, file: &str) -> String {
        let out = self.orch(&["submit", "--slurm", file]);
        assert!(out.status.success(), "{}", stderr(&out));
        stdout(&out).trim().to_string()
    }
}

fn uuids(text: &str) -> Vec<String> {
    text.split(|c: char| c == ',' || c.is_whitespace() || c == '=')
        .filter(|w| w.starts_with("GPU-"))
        .map(String::from)
        .collect()
}

#[test]
fn orch_on_a_real_slurm() {
    let Some(c) = cluster("orch_on_a_real_slurm", 1) else {
        return;
    };
    let env = Env::new(&c);
    let dir = env.dir.clone();
    let orch_bin = env!("CARGO_BIN_EXE_orch");

    // Inside `srun --gres=gpu:2`: two devices are visible, the others hidden, and orch run
    // chooses among the granted ones only.
    let out = env.srun(&["--gres=gpu:2", orch_bin, "devices", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let devices: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let visible: Vec<&serde_json::Value> = devices
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| !d["visible_index"].is_null())
        .collect();
    assert_eq!(visible.len(), 2, "{devices}");
    let granted: Vec<String> = visible
        .iter()
        .map(|d| d["uuid"].as_str().unwrap().to_string())
        .collect();
    let out = env.srun(&[
        "--gres=gpu:2",
        orch_bin,
        "run",
        "--gpus",
        "2",
        "--",
        "sh",
        "-c",
        "echo CVD=$CUDA_VISIBLE_DEVICES",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let mut got = uuids(&stdout(&out));
    got.sort();
    let mut want = granted.clone();
    want.sort();
    assert_eq!(
        got, want,
        "orch run inside the grant takes the granted devices"
    );
    let out = env.srun(&["--gres=gpu:2", orch_bin, "run", "--gpus", "3", "--", "true"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("only 2 of the 4"), "{}", stderr(&out));

    // orch submit --slurm: the batch job runs `orch run` inside its allocation.
    let file = env.job(
        "hello",
        "[job]\nname = \"hello\"\nmax_runtime = \"10m\"\n[resources]\ngpus = 2\n[slurm]\ngpu_type = \"a100\"\npartition = \"debug\"\n[command]\nargv = [\"sh\", \"-c\", \"echo CVD=$CUDA_VISIBLE_DEVICES; echo to-stderr >&2\"]\n",
    );
    let dry = env.orch(&["submit", "--slurm", "--dry-run", &file]);
    assert!(
        stdout(&dry).contains("#SBATCH --gres=gpu:a100:2\n"),
        "{}",
        stdout(&dry)
    );
    assert!(stdout(&dry).contains("#SBATCH --time=10\n"));
    let id = env.submit(&file);
    let out = env.orch(&["wait", "--slurm", &id]);
    assert!(out.status.success(), "{}", stderr(&out));
    let logs = stdout(&env.orch(&["logs", "--slurm", &id]));
    assert_eq!(uuids(&logs).len(), 2, "{logs}");
    assert!(stdout(&env.orch(&["logs", "--slurm", "--stderr", &id])).contains("to-stderr"));
    let script = dir.join(format!("orch-slurm/hello-{id}.sbatch"));
    assert!(script.is_file(), "the script is kept beside the logs");

    // A failing job: wait exits with its status. A long one: jobs lists it, cancel ends it.
    let failing = env.job(
        "fails",
        "[job]\nname = \"fails\"\n[command]\nargv = [\"sh\", \"-c\", \"exit 3\"]\n",
    );
    let id = env.submit(&failing);
    assert_eq!(env.orch(&["wait", "--slurm", &id]).status.code(), Some(3));

    // Dependencies go to Slurm with Slurm's ids: on a job that fails, `after_ok` (a flag here)
    // is never met and ends the job unrun; `after_failed` (a key here) runs once it failed.
    let first = env.job(
        "first",
        "[job]\nname = \"first\"\n[command]\nargv = [\"sh\", \"-c\", \"sleep 2; exit 4\"]\n",
    );
    let first = env.submit(&first);
    let never = env.job(
        "never",
        "[job]\nname = \"never\"\n[command]\nargv = [\"echo\", \"ran anyway\"]\n",
    );
    let out = env.orch(&["submit", "--slurm", "--after-ok", &first, &never]);
    assert!(out.status.success(), "{}", stderr(&out));
    let never = stdout(&out).trim().to_string();
    let cleanup = env.job(
        "cleanup",
        &format!(
            "[job]\nname = \"cleanup\"\nafter_failed = [{first}]\n[command]\nargv = [\"sh\", \"-c\", \"echo cleaned after $(cat {})\"]\n",
            dir.join(format!("orch-slurm/first-{first}.exit")).display()
        ),
    );
    let cleanup = env.submit(&cleanup);
    let out = env.orch(&["wait", "--slurm", &cleanup]);
    assert!(out.status.success(), "{}", stderr(&out));
    let logs = stdout(&env.orch(&["logs", "--slurm", &cleanup]));
    assert!(
        logs.contains("cleaned after {\"exit_code\": 4}"),
        "after_failed ran only once its job had failed: {logs}"
    );
    let out = env.orch(&["wait", "--slurm", &never]);
    assert_ne!(out.status.code(), Some(0), "{}", stdout(&out));
    assert!(
        !dir.join(format!("orch-slurm/never-{never}.out")).exists(),
        "a job whose after_ok failed never runs"
    );
    let slow = env.job(
        "slow",
        "[job]\nname = \"slow\"\n[command]\nargv = [\"sleep\", \"300\"]\n",
    );
    let id = env.submit(&slow);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let listed = stdout(&env.orch(&["jobs", "--slurm", "--json"]));
        let jobs: serde_json::Value = serde_json::from_str(&listed).unwrap();
        if jobs
            .as_array()
            .unwrap()
            .iter()
            .any(|j| j["id"] == id.as_str() && j["state"] == "RUNNING")
        {
            break;
        }
        assert!(Instant::now() < deadline, "job {id} never ran: {listed}");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(env.orch(&["cancel", "--slurm", &id]).status.success());
    let cancelled = Instant::now();
    let out = env.orch(&["wait", "--slurm", &id]);
    eprintln!("cancel to end: {:?}", cancelled.elapsed());
    assert_ne!(out.status.code(), Some(0));
    // The cancel reached the job's processes through orch: its devices are free again.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let leases = stdout(&env.orch(&["leases", "--json"]));
        if leases.trim() == "[]" {
            eprintln!("cancel to free devices: {:?}", cancelled.elapsed());
            break;
        }
        assert!(
            Instant::now() < deadline,
            "a cancelled job still holds: {leases}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    // A sweep of 2 x 2 is an array of 4 tasks, each with its own parameters.
    let sweep = env.job(
        "sweep",
        "[job]\nname = \"sweep\"\n[sweep]\nlr = [0.1, 0.01]\nseed = [7, 8]\n[command]\nargv = [\"sh\", \"-c\", \"echo lr=$LR seed=$SEED arg={lr}; sleep 3\"]\n",
    );
    let id = env.submit(&sweep);
    // While they run, `orch jobs --slurm` shows each task with its parameters.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let listed = stdout(&env.orch(&["jobs", "--slurm", "--json"]));
        let jobs: serde_json::Value = serde_json::from_str(&listed).unwrap();
        let task = jobs
            .as_array()
            .unwrap()
            .iter()
            .find(|j| j["id"] == format!("{id}_1").as_str() && j["state"] == "RUNNING");
        if let Some(task) = task {
            assert_eq!(
                task["params"],
                serde_json::json!([["lr", "0.1"], ["seed", "8"]]),
                "{listed}"
            );
            break;
        }
        assert!(Instant::now() < deadline, "task {id}_1 never ran: {listed}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let table = stdout(&env.orch(&["jobs", "--slurm"]));
    assert!(table.contains("PARAMS"), "{table}");
    let out = env.orch(&["wait", "--slurm", &id]);
    assert!(
        out.status.success(),
        "{}\n{}",
        stderr(&out),
        stdout(&env.orch(&["jobs", "--slurm"]))
    );
    let expected = [
        "lr=0.1 seed=7 arg=0.1",
        "lr=0.1 seed=8 arg=0.1",
        "lr=0.01 seed=7 arg=0.01",
        "lr=0.01 seed=8 arg=0.01",
    ];
    for (task, line) in expected.iter().enumerate() {
        let logs = stdout(&env.orch(&["logs", "--slurm", &format!("{id}_{task}")]));
        assert!(logs.contains(line), "task {task}: {logs}");
    }
    // The same sweep locally: one task after another.
    let out = env.orch(&["run", &sweep]);
    assert!(out.status.success(), "{}", stderr(&out));
    for line in expected {
        assert!(stdout(&out).contains(line), "{}", stdout(&out));
    }

    // Bad [slurm] keys are refused before anything is submitted.
    let bad = env.job(
        "bad",
        "[job]\nname = \"bad\"\n[slurm]\npartiton = \"debug\"\n[command]\nargv = [\"true\"]\n",
    );
    let out = env.orch(&["submit", "--slurm", &bad]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("bad.toml:4:1") && stderr(&out).contains("unknown [slurm] key"),
        "{}",
        stderr(&out)
    );
}

/// What one process of a multi-node job printed: orch's variables and Slurm's.
fn rank_lines(logs: &str) -> Vec<std::collections::BTreeMap<String, String>> {
    logs.lines()
        .filter_map(|l| l.strip_prefix("VARS "))
        .map(|l| {
            l.split_whitespace()
                .filter_map(|kv| kv.split_once('='))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        })
        .collect()
}

/// A `nodes = 2` job on two Slurm nodes (two slurmd on this host, `node1` and `node2`):
/// `orch submit --slurm` runs one `orch run` per node through srun, and every process's
/// torch.distributed variables agree with what Slurm says of its task.
#[test]
fn a_two_node_job_gets_ranks_that_agree_with_slurms() {
    let Some(c) = cluster("a_two_node_job_gets_ranks_that_agree_with_slurms", 2) else {
        return;
    };
    let env = Env::new(&c);
    let print = "echo VARS rank=$RANK local=$LOCAL_RANK world=$WORLD_SIZE local_world=$LOCAL_WORLD_SIZE addr=$MASTER_ADDR port=$MASTER_PORT node=$NODE_RANK nnodes=$NNODES procid=$SLURM_PROCID localid=$SLURM_LOCALID ntasks=$SLURM_NTASKS nodeid=$SLURM_NODEID nodelist=$SLURM_JOB_NODELIST nodename=$SLURMD_NODENAME cvd=$CUDA_VISIBLE_DEVICES";
    // Both nodes are this host and share its lease store, where each node's grant names the
    // same two sim GPUs: the job shares them (`exclusive = false`), as two machines would not
    // need to.
    let job = |name: &str, gpus: u32, launch: &str| {
        env.job(
            name,
            &format!(
                "[job]\nname = \"{name}\"\nmax_runtime = \"5m\"\n[resources]\ngpus = {gpus}\nnodes = 2\nexclusive = false\n[slurm]\ngpu_type = \"a100\"\n[command]\nargv = [\"sh\", \"-c\", \"{print}\"]\nlaunch = \"{launch}\"\n"
            ),
        )
    };
    let run = |file: &str| {
        let id = env.submit(file);
        let out = env.orch(&["wait", "--slurm", &id]);
        let logs = stdout(&env.orch(&["logs", "--slurm", &id]));
        let errors = stdout(&env.orch(&["logs", "--slurm", "--stderr", &id]));
        assert!(out.status.success(), "{}\n{logs}\n{errors}", stderr(&out));
        (rank_lines(&logs), format!("{logs}\n{errors}"))
    };
    let number = |p: &std::collections::BTreeMap<String, String>, key: &str| -> u32 {
        p.get(key)
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{key} is not a number: {p:?}"))
    };
    let hosts = |list: &str| -> Vec<String> {
        let out = Command::new("scontrol")
            .args(["show", "hostnames", list])
            .env("SLURM_CONF", &env.conf)
            .output()
            .unwrap();
        stdout(&out).lines().map(String::from).collect()
    };

    // One process per node (a single launch): RANK is Slurm's task rank.
    let (procs, logs) = run(&job("ranks1", 1, "single"));
    assert_eq!(procs.len(), 2, "{logs}");
    for p in &procs {
        assert_eq!(p["rank"], p["procid"], "{logs}");
        assert_eq!(p["local"], "0", "{logs}");
        assert_eq!(p["localid"], "0", "{logs}");
        assert_eq!(p["world"], p["ntasks"], "{logs}");
        assert_eq!(p["world"], "2", "{logs}");
        assert_eq!(p["node"], p["nodeid"], "{logs}");
        assert_eq!(p["nnodes"], "2", "{logs}");
        assert_eq!(
            p["nodename"],
            format!("node{}", number(p, "node") + 1),
            "{logs}"
        );
        assert_eq!(hosts(&p["nodelist"]), ["node1", "node2"], "{logs}");
        assert_eq!(p["addr"], "node1", "MASTER_ADDR is the first node: {logs}");
        assert_eq!(p["port"], procs[0]["port"], "one MASTER_PORT: {logs}");
    }
    let mut ranks: Vec<u32> = procs.iter().map(|p| number(p, "rank")).collect();
    ranks.sort();
    assert_eq!(ranks, [0, 1], "{logs}");

    // One process per device, two devices per node: RANK = SLURM_PROCID x LOCAL_WORLD_SIZE +
    // LOCAL_RANK (docs/SLURM.md), WORLD_SIZE = SLURM_NTASKS x LOCAL_WORLD_SIZE.
    let (procs, logs) = run(&job("ranks2", 2, "per-device"));
    assert_eq!(procs.len(), 4, "{logs}");
    for p in &procs {
        let (procid, local) = (number(p, "procid"), number(p, "local"));
        assert_eq!(number(p, "local_world"), 2, "{logs}");
        assert_eq!(number(p, "rank"), procid * 2 + local, "{logs}");
        assert_eq!(number(p, "world"), number(p, "ntasks") * 2, "{logs}");
        assert_eq!(p["world"], "4", "{logs}");
        assert_eq!(p["localid"], "0", "one orch run per node: {logs}");
        assert_eq!(p["node"], p["nodeid"], "{logs}");
        assert_eq!(number(p, "node"), procid, "{logs}");
        assert_eq!(p["nodename"], format!("node{}", procid + 1), "{logs}");
        assert_eq!(p["addr"], "node1", "{logs}");
        assert_eq!(p["port"], procs[0]["port"], "{logs}");
        assert!(
            p["cvd"].starts_with("GPU-") && !p["cvd"].contains(','),
            "{logs}"
        );
    }
    let mut ranks: Vec<u32> = procs.iter().map(|p| number(p, "rank")).collect();
    ranks.sort();
    assert_eq!(ranks, [0, 1, 2, 3], "{logs}");
}

#[test]
fn without_slurm_one_sentence_and_exit_2() {
    let dir = std::env::temp_dir().join(format!("orch-noslurm-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("job.toml");
    std::fs::write(&file, "[job]\nname = \"x\"\n[command]\nargv = [\"true\"]\n").unwrap();
    let out = orch(
        &["submit", "--slurm", file.to_str().unwrap()],
        &[("PATH", "/nonexistent")],
    );
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("`sbatch` is not installed here") && err.lines().count() == 1,
        "{err}"
    );
    // A multi-node job outside an allocation says how to run it.
    let multi = dir.join("multi.toml");
    std::fs::write(
        &multi,
        "[job]\nname = \"m\"\n[resources]\nnodes = 2\n[command]\nargv = [\"true\"]\n",
    )
    .unwrap();
    let out = orch(
        &["run", multi.to_str().unwrap()],
        &[("ORCH_DEVICES", &lab_sim())],
    );
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("orch submit --slurm"),
        "{}",
        stderr(&out)
    );
}
