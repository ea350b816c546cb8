//! Placement that knows the box's shape, through the `orch` binary, on
//! examples/sim/two-sockets-4gpu.toml: GPUs 0-1 on NUMA node 0 and NVLinked (NV12), 2-3 on node 1
//! and NVLinked, only PCIe (`SYS`) between the sockets; GPU 1 has 2 GiB free. A 2-GPU job that
//! needs 10 GiB per GPU gets GPUs 2 and 3, not 0 and 2, and `orch plan` says why.

use crate::*;
use serde_json::Value;
use std::path::Path;

fn two_sockets() -> String {
    format!(
        "sim:{}",
        root().join("examples/sim/two-sockets-4gpu.toml").display()
    )
}

fn on_two_sockets(state: &Path, args: &[&str]) -> std::process::Output {
    let sim = two_sockets();
    let state = state.display().to_string();
    let cache = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("orch-cache")
        .display()
        .to_string();
    orch(
        args,
        &[
            ("ORCH_DEVICES", &sim),
            ("ORCH_STATE_DIR", &state),
            ("ORCH_CACHE_DIR", &cache),
        ],
    )
}

#[test]
fn plan_takes_the_nvlinked_pair_on_one_node_and_says_why() {
    let state = scratch_dir("topo-plan");
    let out = on_two_sockets(
        &state,
        &["plan", "examples/plan/two-gpus-near.toml", "--json"],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let plan: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let chosen: Vec<u64> = plan["devices"]
        .as_array()
        .expect("devices")
        .iter()
        .map(|d| d["index"].as_u64().expect("index"))
        .collect();
    assert_eq!(chosen, vec![2, 3], "{plan}");
    let reason = plan["reason"].as_str().expect("reason");
    assert!(
        reason.starts_with(
            "GPUs 2,3: one NUMA node (1), NV12 (the NUMA node decided); first fit (lowest CUDA index that fits): GPU 2"
        ),
        "{reason}"
    );
    // GPU 0 fits and is the policy's first pick alone; the plan says so.
    let rejected = plan["rejected"].as_array().expect("rejected");
    let why = |index: u64| {
        rejected
            .iter()
            .find(|r| r["index"] == index)
            .and_then(|r| r["why"].as_str())
            .unwrap_or_default()
            .to_string()
    };
    assert_eq!(why(0), "fits, not chosen by first-fit");
    assert!(why(1).contains("free"), "{}", why(1));
    // The table says the same.
    let out = on_two_sockets(&state, &["plan", "examples/plan/two-gpus-near.toml"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("reason: GPUs 2,3: one NUMA node (1), NV12 (the NUMA node decided)"),
        "{}",
        stdout(&out)
    );
}

#[test]
fn four_gpus_fit_on_no_node_and_the_plan_says_so() {
    let state = scratch_dir("topo-four");
    let job = state.join("four.toml");
    std::fs::write(
        &job,
        "[job]\nname = \"wide\"\n[resources]\ngpus = 4\n[policy]\nplugin = \"least-loaded\"\n[command]\nargv = [\"true\"]\n",
    )
    .unwrap();
    let out = on_two_sockets(&state, &["plan", job.to_str().unwrap(), "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let plan: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let reason = plan["reason"].as_str().expect("reason");
    assert!(
        reason.starts_with("GPUs 0,1,2,3: no NUMA node fits 4 GPUs; NUMA nodes 0,1, 24 NVLinks in all, SYS at worst"),
        "{reason}"
    );
}

#[test]
fn run_hands_the_job_the_pair_on_one_node() {
    let state = scratch_dir("topo-run");
    let out = on_two_sockets(
        &state,
        &[
            "run",
            "--gpus",
            "2",
            "--min-free-memory",
            "10GiB",
            "--policy",
            "first-fit",
            "--",
            "sh",
            "-c",
            "echo \"CVD=$CUDA_VISIBLE_DEVICES\"",
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains(
            "CVD=GPU-0c000000-0000-4000-8000-000000000000,GPU-0d000000-0000-4000-8000-000000000000"
        ),
        "{text}"
    );
}

/// examples/policies/numa-pack, built with cargo alone as a user would: it fills the fullest
/// NUMA node that takes the job, and spills over as few nodes as it can.
#[test]
fn the_numa_pack_example_fills_one_node_before_the_next() {
    let wasm = build_example_policy("numa-pack");
    let state = scratch_dir("topo-numa-pack");
    let plan = |gpus: u32| {
        let job = state.join(format!("job-{gpus}.toml"));
        std::fs::write(
            &job,
            format!(
                "[job]\nname = \"p\"\n[resources]\ngpus = {gpus}\nmin_free_memory = \"10GiB\"\n[policy]\nplugin = \"{}\"\n[command]\nargv = [\"true\"]\n",
                wasm.display()
            ),
        )
        .unwrap();
        let out = on_two_sockets(&state, &["plan", job.to_str().unwrap(), "--json"]);
        assert!(out.status.success(), "{}", stderr(&out));
        let plan: Value = serde_json::from_slice(&out.stdout).expect("JSON");
        let chosen: Vec<u64> = plan["devices"]
            .as_array()
            .expect("devices")
            .iter()
            .map(|d| d["index"].as_u64().expect("index"))
            .collect();
        (
            chosen,
            plan["reason"].as_str().unwrap_or_default().to_string(),
        )
    };
    // One GPU: node 0 has one that fits (GPU 1 is full), node 1 two: node 0 is the fuller.
    let (one, reason) = plan(1);
    assert_eq!(one, vec![0], "{reason}");
    assert_eq!(
        reason,
        "numa-pack: NUMA node 0, the fullest that fits (1 of its devices fit): GPU 0"
    );
    // Two: only node 1 takes both.
    let (two, reason) = plan(2);
    assert_eq!(two, vec![2, 3], "{reason}");
    // Three fit on no node: node 1's two, then node 0's one.
    let (three, reason) = plan(3);
    assert_eq!(three, vec![2, 3, 0], "{reason}");
    assert!(reason.contains("no NUMA node fits 3 GPUs"), "{reason}");
}

/// MIG instances have no NVLink or peer-to-peer: their GPUs' links do not pull a job of two
/// instances onto two GPUs; the policy's own order (first fit: both on GPU 0) stands.
#[test]
fn two_mig_instances_stay_where_the_policy_puts_them() {
    let dir = scratch_dir("topo-mig");
    let mut sim = String::new();
    let mut visible = Vec::new();
    for g in 0..2 {
        sim.push_str(&format!(
            "[[gpu]]\nname = \"NVIDIA H100 80GB HBM3\"\nmemory_total = \"80GiB\"\nuuid = \"GPU-0000000{g}-1111-4000-8000-000000000000\"\nnuma_node = 0\n[[gpu.nvlink]]\npeer = {}\nlinks = 18\n",
            1 - g
        ));
        for m in 0..2 {
            let uuid = format!("MIG-0000000{g}-000{m}-4000-8000-000000000000");
            sim.push_str(&format!(
                "[[gpu.mig]]\nuuid = \"{uuid}\"\nname = \"3g.40gb\"\nmemory_total = \"40GiB\"\n"
            ));
            visible.push(uuid);
        }
    }
    std::fs::write(dir.join("mig.toml"), sim).unwrap();
    std::fs::write(
        dir.join("job.toml"),
        "[job]\nname = \"two-slices\"\n[resources]\ngpus = 2\n[policy]\nplugin = \"first-fit\"\n[command]\nargv = [\"true\"]\n",
    )
    .unwrap();
    let sim = format!("sim:{}", dir.join("mig.toml").display());
    let state = dir.join("state").display().to_string();
    let job = dir.join("job.toml").display().to_string();
    let visible = visible.join(",");
    let out = orch(
        &["plan", &job, "--json"],
        &[
            ("ORCH_DEVICES", &sim),
            ("ORCH_STATE_DIR", &state),
            ("CUDA_VISIBLE_DEVICES", &visible),
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let plan: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let uuids: Vec<&str> = plan["devices"]
        .as_array()
        .expect("devices")
        .iter()
        .map(|d| d["uuid"].as_str().expect("uuid"))
        .collect();
    assert_eq!(
        uuids,
        vec![
            "MIG-00000000-0000-4000-8000-000000000000",
            "MIG-00000000-0001-4000-8000-000000000000"
        ],
        "{plan}"
    );
}
