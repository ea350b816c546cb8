//! `orch plan` on the 8-GPU lab sim (examples/sim/lab-8gpu.toml), one test per built-in policy
//! with hand-checked expectations, rejections, bad input, hostile plugins, a user's policy, and
//! `orch plugin inspect`.
//!
//! The lab (free memory, utilization, processes): GPU 0 9.0 GiB 97% 1, GPU 1 79.5 GiB 0% 0,
//! GPU 2 60 GiB 45% 1, GPU 3 2.1 GiB 88% 2, GPU 4 79.5 GiB 0% 0, GPU 5 70 GiB 12% 1,
//! GPU 6 40 GiB 60% 0, GPU 7 79 GiB 3% 0.

use crate::*;
use serde_json::Value;
use std::path::PathBuf;
use std::process::Output;

/// A compile cache of the tests' own (never the user's `~/.cache`).
fn cache_dir() -> String {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("orch-cache")
        .display()
        .to_string()
}

fn plan_with(args: &[&str], env: &[(&str, &str)]) -> Output {
    let sim = lab_sim();
    let cache = cache_dir();
    let mut all = vec![
        ("ORCH_DEVICES", sim.as_str()),
        ("ORCH_CACHE_DIR", cache.as_str()),
    ];
    all.extend_from_slice(env);
    let mut argv = vec!["plan"];
    argv.extend_from_slice(args);
    orch(&argv, &all)
}

/// `orch plan FILE --json`, which must succeed.
fn plan_json(file: &str, env: &[(&str, &str)]) -> Value {
    let out = plan_with(&[file, "--json"], env);
    assert!(out.status.success(), "{file}: {}", stderr(&out));
    serde_json::from_slice(&out.stdout).expect("JSON")
}

fn chosen(plan: &Value) -> Vec<u64> {
    plan["devices"]
        .as_array()
        .expect("devices")
        .iter()
        .map(|d| d["index"].as_u64().expect("index"))
        .collect()
}

fn why(plan: &Value, index: u64) -> String {
    plan["rejected"]
        .as_array()
        .expect("rejected")
        .iter()
        .find(|r| r["index"] == index)
        .and_then(|r| r["why"].as_str())
        .unwrap_or_else(|| panic!("GPU {index} is not among the rejected: {plan}"))
        .to_string()
}

/// A job file in the tests' temporary folder.
fn job_file(name: &str, text: &str) -> String {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("plan-jobs");
    std::fs::create_dir_all(&dir).expect("temp folder");
    let path = dir.join(name);
    std::fs::write(&path, text).expect("job file");
    path.display().to_string()
}

fn job_with(policy: &str, resources: &str) -> String {
    format!(
        "[job]\nname = \"t\"\n[resources]\n{resources}\n[policy]\nplugin = \"{policy}\"\n[command]\nargv = [\"true\"]\n"
    )
}

#[test]
fn least_loaded_picks_the_idle_gpus_and_explains_the_rest() {
    let plan = plan_json("examples/plan/least-loaded.toml", &[]);
    assert_eq!(plan["job"], "mnist-mlp");
    assert_eq!(plan["policy"], "least-loaded");
    assert_eq!(chosen(&plan), vec![1, 4]);
    assert_eq!(why(&plan, 0), "9.0 GiB free < 10.0 GiB requested");
    assert_eq!(why(&plan, 3), "2.1 GiB free < 10.0 GiB requested");
    assert_eq!(why(&plan, 6), "60% busy > 50% allowed");
    assert_eq!(why(&plan, 7), "fits, not chosen by least-loaded");
    assert_eq!(plan["rejected"].as_array().unwrap().len(), 6);
    let reason = plan["reason"].as_str().unwrap();
    assert!(
        reason.contains("GPU 1 (0% busy, 79.5 GiB free)"),
        "{reason}"
    );

    let out = plan_with(&["examples/plan/least-loaded.toml"], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.starts_with("job mnist-mlp: policy least-loaded chose 2 device(s)\n"),
        "{text}"
    );
    assert!(
        text.contains("GPU 3: 2.1 GiB free < 10.0 GiB requested"),
        "{text}"
    );
    assert!(text.contains("reason: least loaded"), "{text}");
}

#[test]
fn json_has_exactly_the_documented_fields() {
    let plan = plan_json("examples/plan/least-loaded.toml", &[]);
    let keys = |v: &Value| {
        let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
        k.sort();
        k
    };
    assert_eq!(
        keys(&plan),
        ["devices", "job", "policy", "reason", "rejected"]
    );
    assert_eq!(keys(&plan["devices"][0]), ["index", "uuid"]);
    assert_eq!(
        plan["devices"][0]["uuid"],
        "GPU-1c7b4a55-0f0e-4d5c-9b37-6a2e0e1d4c21"
    );
    assert_eq!(keys(&plan["rejected"][0]), ["index", "why"]);
}

#[test]
fn most_free_memory_ranks_by_free_memory() {
    let plan = plan_json("examples/plan/most-free-memory.toml", &[]);
    assert_eq!(chosen(&plan), vec![1, 4, 7]);
    // The whole box, ranked: GPU 0 (9 GiB free) before GPU 3 (2.1 GiB), though 0 is busier.
    let all = job_file("mfm-all.toml", &job_with("most-free-memory", "gpus = 8"));
    assert_eq!(chosen(&plan_json(&all, &[])), vec![1, 4, 7, 5, 2, 6, 0, 3]);
    let all = job_file("ll-all.toml", &job_with("least-loaded", "gpus = 8"));
    assert_eq!(chosen(&plan_json(&all, &[])), vec![1, 4, 7, 5, 2, 6, 3, 0]);
}

#[test]
fn pack_fills_the_fullest_gpus_that_fit() {
    let plan = plan_json("examples/plan/pack.toml", &[]);
    assert_eq!(chosen(&plan), vec![6, 2]);
    assert_eq!(why(&plan, 1), "fits, not chosen by pack");
}

#[test]
fn spread_prefers_gpus_nobody_runs_on() {
    let plan = plan_json("examples/plan/spread.toml", &[]);
    assert_eq!(chosen(&plan), vec![1, 4, 7, 6]);
    let same = job_file(
        "ll-4.toml",
        &job_with("least-loaded", "gpus = 4\nmin_free_memory = \"10GiB\""),
    );
    assert_eq!(chosen(&plan_json(&same, &[])), vec![1, 4, 7, 5]);
}

#[test]
fn first_fit_takes_the_lowest_indices_that_fit() {
    let plan = plan_json("examples/plan/first-fit.toml", &[]);
    assert_eq!(chosen(&plan), vec![1, 2]);
    assert_eq!(why(&plan, 0), "9.0 GiB free < 20.0 GiB requested");
}

#[test]
fn explicit_takes_the_listed_gpus_that_fit() {
    let plan = plan_json("examples/plan/explicit.toml", &[]);
    assert_eq!(chosen(&plan), vec![6, 7]);
    assert!(
        plan["reason"]
            .as_str()
            .unwrap()
            .starts_with("as config devices lists")
    );
    // UUID prefixes work too, and a list that cannot be met is a refusal (exit 1).
    let by_uuid = job_file(
        "explicit-uuid.toml",
        &job_with("explicit", "gpus = 1").replace(
            "[command]",
            "[policy.config]\ndevices = \"GPU-b2c3d4e5\"\n[command]",
        ),
    );
    assert_eq!(chosen(&plan_json(&by_uuid, &[])), vec![6]);
    let short = job_file(
        "explicit-short.toml",
        &job_with("explicit", "gpus = 2\nmin_free_memory = \"10GiB\"")
            .replace("[command]", "[policy.config]\ndevices = \"0,1\"\n[command]"),
    );
    let out = plan_with(&[&short], &[]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("GPU 0: 9.0 GiB free < 10.0 GiB requested"),
        "{}",
        stderr(&out)
    );
    // No list at all is the job's mistake (exit 2).
    let missing = job_file("explicit-none.toml", &job_with("explicit", "gpus = 1"));
    let out = plan_with(&[&missing], &[]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("explicit needs [policy.config] devices"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn env_takes_the_gpus_the_cluster_granted() {
    let plan = plan_json(
        "examples/plan/env.toml",
        &[("CLOUD_GPU_ID", "GPU-d4e5f6a7,5")],
    );
    assert_eq!(chosen(&plan), vec![7, 5]);
    let other_var = job_file(
        "env-var.toml",
        &job_with("env", "gpus = 1")
            .replace("[command]", "[policy.config]\nvar = \"MY_GPUS\"\n[command]"),
    );
    assert_eq!(chosen(&plan_json(&other_var, &[("MY_GPUS", "3")])), vec![3]);
    let out = plan_with(&["examples/plan/env.toml"], &[]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("CLOUD_GPU_ID is not set"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn no_fit_exits_1_with_the_refusal() {
    let out = plan_with(&["examples/plan/no-fit.toml"], &[]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.contains(
            "policy `least-loaded` found no fit: 6 device(s) needed, 5 of 8 candidate(s) fit"
        ),
        "{err}"
    );
    assert!(
        err.contains("GPU 6: 40.0 GiB free < 60.0 GiB requested"),
        "{err}"
    );
}

#[test]
fn bad_input_exits_2_with_a_location() {
    let cases = [
        (
            job_with("least-loaded", "gpus = 9"),
            "t.toml:4:8: gpus = 9, but this machine has 8 device(s)",
        ),
        (
            job_with("least-laoded", "gpus = 1"),
            "t.toml:6:10: unknown built-in policy `least-laoded`",
        ),
        (
            job_with("missing.wasm", "gpus = 1"),
            "t.toml:6:10: cannot read policy plugin",
        ),
        (
            job_with("least-loaded", "gpus = 0"),
            "t.toml:4:8: gpus = 0 is impossible",
        ),
        (
            job_with("least-loaded", "gpu = 1"),
            "t.toml:4:1: unknown field `gpu`",
        ),
    ];
    for (text, words) in cases {
        let file = job_file("t.toml", &text);
        let out = plan_with(&[&file], &[]);
        assert_eq!(out.status.code(), Some(2), "{text}: {}", stderr(&out));
        assert!(stderr(&out).contains(words), "{}", stderr(&out));
        assert_eq!(
            stderr(&out).lines().count(),
            1,
            "one sentence: {}",
            stderr(&out)
        );
    }
    let out = plan_with(&["no/such/job.toml"], &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("cannot read job file no/such/job.toml"),
        "{}",
        stderr(&out)
    );
}

fn fixture(name: &str) -> String {
    PathBuf::from(orch_host::PLUGIN_WASM_DIR)
        .join(name)
        .display()
        .to_string()
}

#[test]
fn hostile_plugins_fail_the_plan_not_the_process() {
    let spin = job_file(
        "spin.toml",
        &job_with(&fixture("hostile_spin.wasm"), "gpus = 1"),
    );
    let out = plan_with(&[&spin], &[]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains(
            "policy plugin `hostile_spin.wasm` did not answer within its deadline of 100 ms"
        ),
        "{}",
        stderr(&out)
    );
    let spin_20 = job_file(
        "spin-20.toml",
        &format!(
            "[job]\nname = \"t\"\n[resources]\ngpus = 1\n[policy]\nplugin = \"{}\"\ndeadline = \"20ms\"\n[command]\nargv = [\"true\"]\n",
            fixture("hostile_spin.wasm")
        ),
    );
    let out = plan_with(&[&spin_20], &[]);
    assert!(
        stderr(&out).contains("deadline of 20 ms and was stopped; if it needs longer, set `deadline` in [policy] of the job file"),
        "{}",
        stderr(&out)
    );
    // Past the machine's maximum: refused before the plugin runs, at the setting, naming the
    // setting that raises the maximum.
    let config = job_file("machine.toml", "[limits.policy]\nmax_deadline = \"10ms\"\n");
    let out = plan_with(&[&spin_20], &[("ORCH_CONFIG", &config)]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("spin-20.toml:7:12: deadline = 20 ms in [policy] of the job file is above this machine's maximum of 10 ms (`max_deadline` under [limits.policy] in "),
        "{}",
        stderr(&out)
    );

    let panic = job_file(
        "panic.toml",
        &job_with(&fixture("hostile_panic.wasm"), "gpus = 1"),
    );
    let out = plan_with(&[&panic], &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("`hostile_panic.wasm` crashed"),
        "{}",
        stderr(&out)
    );
    assert!(stderr(&out).contains("policy bug"), "{}", stderr(&out));

    let other = job_file(
        "other.toml",
        &job_with(&fixture("hostile-other-world.wasm"), "gpus = 1"),
    );
    let out = plan_with(&[&other], &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains(
            "is not a policy orch can load: it exports `wasi:cli/run@0.2.0` (an instance)"
        ),
        "{}",
        stderr(&out)
    );
}

#[test]
fn plugin_inspect_names_the_world_or_refuses() {
    let cache = cache_dir();
    let env = [("ORCH_CACHE_DIR", cache.as_str())];
    let out = orch(&["plugin", "inspect", "least-loaded", "--json"], &env);
    assert!(out.status.success(), "{}", stderr(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["world"], "orch:plugin/policy@0.5.0");
    assert_eq!(v["contract"], "0.5.0");
    assert_eq!(v["note"], Value::Null);
    assert_eq!(
        v["exports"],
        serde_json::json!(["instance orch:plugin/placement@0.5.0"])
    );
    assert!(v["size_bytes"].as_u64().unwrap() > 1000);
    assert!(
        v["imports"]
            .as_array()
            .unwrap()
            .iter()
            .any(|i| i.as_str().unwrap().contains("wasi:cli/stderr"))
    );

    let spin = fixture("hostile_spin.wasm");
    let out = orch(&["plugin", "inspect", &spin], &env);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("a component of world orch:plugin/policy@0.5.0"),
        "{}",
        stdout(&out)
    );

    let cases = [
        (
            fixture("hostile-other-world.wasm"),
            "is not a policy orch can load: it exports `wasi:cli/run@0.2.0` (an instance), and orch expected orch:plugin/policy@0.5.0",
        ),
        (
            root().join("Cargo.toml").display().to_string(),
            "is not a WebAssembly component (not a WebAssembly file)",
        ),
        ("nowhere.wasm".to_string(), "cannot read nowhere.wasm"),
    ];
    for (file, words) in cases {
        let out = orch(&["plugin", "inspect", &file], &env);
        assert_eq!(out.status.code(), Some(2), "{file}");
        assert!(stderr(&out).contains(words), "{}", stderr(&out));
    }
}

/// Builds examples/policies/coolest with cargo alone, as a user would, and plans with it by path.
#[test]
fn a_users_policy_builds_with_cargo_and_loads_by_path() {
    let wasm = build_example_policy("coolest");

    let cache = cache_dir();
    let out = orch(
        &["plugin", "inspect", &wasm.display().to_string()],
        &[("ORCH_CACHE_DIR", &cache)],
    );
    assert!(out.status.success(), "{}", stderr(&out));

    // Coolest first among the GPUs with 10 GiB free: GPU 4 (31 C), then GPU 1 (33 C).
    let job = job_file(
        "coolest.toml",
        &job_with(
            &wasm.display().to_string(),
            "gpus = 2\nmin_free_memory = \"10GiB\"",
        ),
    );
    let plan = plan_json(&job, &[]);
    assert_eq!(plan["policy"], "coolest.wasm");
    assert_eq!(chosen(&plan), vec![4, 1]);
    assert_eq!(why(&plan, 7), "fits, not chosen by coolest.wasm");
}

/// `orch plugin cache` lists the compiled plugins by use, keeps the folder under its cap
/// (`ORCH_CACHE_SIZE`, least recently used first) and clears it.
#[test]
fn plugin_cache_lists_evicts_and_clears() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("cache-cli-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let cache = dir.display().to_string();
    let env = [("ORCH_CACHE_DIR", cache.as_str())];
    for name in ["least-loaded", "pack"] {
        let out = orch(&["plugin", "inspect", name], &env);
        assert!(out.status.success(), "{}", stderr(&out));
    }
    let out = orch(&["plugin", "cache", "--json"], &env);
    assert!(out.status.success(), "{}", stderr(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["dir"], cache);
    assert_eq!(v["limit_bytes"], 1u64 << 30);
    let plugins: Vec<&str> = v["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["plugin"].as_str().unwrap())
        .collect();
    assert_eq!(
        plugins,
        vec!["pack", "least-loaded"],
        "most recently used first"
    );
    assert!(v["total_bytes"].as_u64().unwrap() > 10_000);

    // A cap below one entry: writing a third evicts the others, keeping the one just written.
    let small = [
        ("ORCH_CACHE_DIR", cache.as_str()),
        ("ORCH_CACHE_SIZE", "1KiB"),
    ];
    let out = orch(&["plugin", "inspect", "spread"], &small);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = orch(&["plugin", "cache"], &small);
    let text = stdout(&out);
    assert!(text.contains("1 compiled plugin(s)"), "{text}");
    assert!(text.contains("of 1 KiB (ORCH_CACHE_SIZE)"), "{text}");
    assert!(text.contains("spread"), "{text}");
    assert!(!text.contains("least-loaded"), "{text}");

    let bad = [
        ("ORCH_CACHE_DIR", cache.as_str()),
        ("ORCH_CACHE_SIZE", "lots"),
    ];
    let out = orch(&["plugin", "cache"], &bad);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("ORCH_CACHE_SIZE=\"lots\""),
        "{}",
        stderr(&out)
    );

    let out = orch(&["plugin", "cache", "--clear"], &env);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).starts_with("removed 1 compiled plugin(s)"),
        "{}",
        stdout(&out)
    );
    let out = orch(&["plugin", "cache", "--json"], &env);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["entries"], serde_json::json!([]));
    let _ = std::fs::remove_dir_all(&dir);
}
