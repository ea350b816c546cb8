//! Plugins in other languages: the `coolest` policy written in Python (componentize-py) and in
//! JavaScript (componentize-js), each built with its own toolchain as a user would, must choose
//! exactly what the Rust `coolest` chooses, through `orch plan`, on the lab sim and on a box of
//! ties and missing readings. And a trainer in Python learns the bundled digits through `orch run`.
//!
//! The toolchains come from `scripts/guest-toolchains.sh` (`target/guest-tools/`; the
//! `ORCH_GUEST_TOOLS` variable moves it), or from PATH. A test whose toolchain is missing says so
//! and passes; with `ORCH_REQUIRE_GUEST_TOOLCHAINS` set (as `.ci/run` sets it) it fails instead.

use crate::*;
use serde_json::Value;
use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::OnceLock;

const REQUIRE: &str = "ORCH_REQUIRE_GUEST_TOOLCHAINS";

/// The limits the job files give the Python and JavaScript plugins. They decide within the
/// defaults (64 MiB, 100 ms: a fresh instance needs 10-13 MiB and 1-2 ms in a release build,
/// docs/PLUGINS.md), but a debug build on a loaded machine is many times slower; the deadline
/// is the machine's default maximum.
const LIMITS: &str = "deadline = \"1s\"\nmemory = \"128MiB\"\n";

fn tmp() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("languages")
}

fn cache_dir() -> String {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("orch-cache")
        .display()
        .to_string()
}

fn guest_tools() -> PathBuf {
    match std::env::var_os("ORCH_GUEST_TOOLS") {
        Some(dir) => root().join(dir),
        None => root().join("target/guest-tools"),
    }
}

/// `None` after a line saying why the test is skipped; a failure instead under [`REQUIRE`].
fn missing(test: &str, what: &str) -> Option<PathBuf> {
    assert!(
        std::env::var_os(REQUIRE).is_none(),
        "{test} needs {what} and {REQUIRE} is set (scripts/guest-toolchains.sh installs it)"
    );
    eprintln!("{test}: skipped ({what} is not installed: run scripts/guest-toolchains.sh)");
    None
}

fn runs(program: &std::path::Path, arg: &str) -> bool {
    Command::new(program)
        .arg(arg)
        .output()
        .is_ok_and(|o| o.status.success())
}

/// componentize-py: the project's own, else one on PATH.
fn componentize_py(test: &str) -> Option<PathBuf> {
    let local = guest_tools().join("py/bin/componentize-py");
    for tool in [local, PathBuf::from("componentize-py")] {
        if runs(&tool, "--version") {
            return Some(tool);
        }
    }
    missing(test, "componentize-py")
}

/// componentize-js (a node script): the project's own, else the example's `npm ci`.
fn componentize_js(test: &str) -> Option<PathBuf> {
    let candidates = [
        guest_tools().join("node/node_modules/.bin/componentize-js"),
        root().join("examples/policies/coolest-js/node_modules/.bin/componentize-js"),
    ];
    if runs(std::path::Path::new("node"), "--version") {
        for tool in candidates {
            if tool.is_file() {
                return Some(tool);
            }
        }
    }
    missing(test, "node and componentize-js")
}

/// Runs an example's `build.sh OUT` with `tool` in `var`; the path of the component.
fn build_example(example: &str, var: &str, tool: &std::path::Path, out: &str) -> PathBuf {
    let wasm = tmp().join(out);
    let started = std::time::Instant::now();
    let built = Command::new(root().join(example).join("build.sh"))
        .arg(&wasm)
        .env(var, tool)
        .output()
        .expect("build.sh runs");
    assert!(
        built.status.success(),
        "{example}/build.sh: {}{}",
        stdout(&built),
        stderr(&built)
    );
    eprintln!(
        "{example}: built {} ({} bytes) in {:.1} s",
        wasm.display(),
        std::fs::metadata(&wasm).map_or(0, |m| m.len()),
        started.elapsed().as_secs_f64()
    );
    wasm
}

/// examples/policies/coolest built with cargo, once per test run (cargo's lock makes the build
/// folder safe to share with plan.rs's test).
fn rust_coolest() -> &'static PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        let target = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("coolest-target");
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
        let built = Command::new(cargo)
            .args([
                "build",
                "--release",
                "--target",
                "wasm32-wasip2",
                "--target-dir",
            ])
            .arg(&target)
            .current_dir(root().join("examples/policies/coolest"))
            .env_remove("CARGO_TARGET_DIR")
            .env_remove("RUSTFLAGS")
            .env_remove("CARGO_ENCODED_RUSTFLAGS")
            .output()
            .expect("cargo runs");
        assert!(built.status.success(), "{}", stderr(&built));
        target.join("wasm32-wasip2/release/coolest.wasm")
    })
}

/// A sim box of ties and missing readings: four GPUs at 40 C (three of them at 100 W), GPUs
/// without a temperature or a power reading, and one cool card.
const TIES: &str = r#"
[[gpu]]
name = "t0"
memory_total = "80GiB"
temperature = 40
power_draw_w = 100.0
[[gpu]]
name = "t1 (no temperature)"
memory_total = "80GiB"
power_draw_w = 50.0
[[gpu]]
name = "t2"
memory_total = "80GiB"
temperature = 40
power_draw_w = 100.0
[[gpu]]
name = "t3 (no power reading)"
memory_total = "80GiB"
temperature = 40
[[gpu]]
name = "t4"
memory_total = "80GiB"
memory_used = "75GiB"
temperature = 30
power_draw_w = 200.0
[[gpu]]
name = "t5"
memory_total = "80GiB"
utilization = 70
temperature = 40
power_draw_w = 90.0
[[gpu]]
name = "t6 (no readings)"
memory_total = "80GiB"
[[gpu]]
name = "t7"
memory_total = "80GiB"
temperature = 40
power_draw_w = 100.0
"#;

/// One request on one box, and what the Rust `coolest` answers (`None`: it refuses).
struct Case {
    sim: &'static str,
    visible: Option<&'static str>,
    resources: &'static str,
    rust: Option<&'static [u64]>,
}

const CASES: &[Case] = &[
    Case {
        sim: "lab",
        visible: None,
        resources: "gpus = 1",
        rust: Some(&[4]),
    },
    Case {
        sim: "lab",
        visible: None,
        resources: "gpus = 2",
        rust: Some(&[4, 1]),
    },
    Case {
        sim: "lab",
        visible: None,
        resources: "gpus = 4",
        rust: Some(&[4, 1, 7, 5]),
    },
    Case {
        sim: "lab",
        visible: None,
        resources: "gpus = 8",
        rust: Some(&[4, 1, 7, 5, 2, 6, 3, 0]),
    },
    Case {
        sim: "lab",
        visible: None,
        resources: "gpus = 2\nmin_free_memory = \"10GiB\"",
        rust: Some(&[4, 1]),
    },
    Case {
        sim: "lab",
        visible: None,
        resources: "gpus = 4\nmax_utilization = 50",
        rust: Some(&[4, 1, 7, 5]),
    },
    Case {
        sim: "lab",
        visible: None,
        resources: "gpus = 3\nmin_free_memory = \"50GiB\"\nmax_utilization = 50\nexclusive = true",
        rust: Some(&[4, 1, 7]),
    },
    Case {
        sim: "lab",
        visible: None,
        resources: "gpus = 4\nmin_free_memory = \"30GiB\"\nexclusive = false",
        rust: Some(&[4, 1, 7, 5]),
    },
    // Logical indices differ from physical ones: the answer is in logical indices, the reason
    // names physical GPUs.
    Case {
        sim: "lab",
        visible: Some("6,3,7,0,2"),
        resources: "gpus = 3\nmax_utilization = 90",
        rust: Some(&[2, 4, 0]),
    },
    Case {
        sim: "lab",
        visible: None,
        resources: "gpus = 6\nmin_free_memory = \"60GiB\"",
        rust: None,
    },
    Case {
        sim: "lab",
        visible: None,
        resources: "gpus = 1\nmax_utilization = 0\nmin_free_memory = \"80GiB\"",
        rust: None,
    },
    // Ties keep index order; a missing temperature or power reading counts as hottest.
    Case {
        sim: "ties",
        visible: None,
        resources: "gpus = 8",
        rust: Some(&[4, 5, 0, 2, 7, 3, 1, 6]),
    },
    Case {
        sim: "ties",
        visible: None,
        resources: "gpus = 5\nmax_utilization = 50\nmin_free_memory = \"10GiB\"",
        rust: Some(&[0, 2, 7, 3, 1]),
    },
    Case {
        sim: "ties",
        visible: None,
        resources: "gpus = 8\nmax_utilization = 50",
        rust: None,
    },
];

fn sim(name: &str) -> String {
    // Written once: the tests run in parallel, and one must not read it half-written.
    static TIES_SIM: OnceLock<String> = OnceLock::new();
    match name {
        "lab" => lab_sim(),
        _ => TIES_SIM
            .get_or_init(|| {
                let path = tmp().join("ties.toml");
                std::fs::create_dir_all(tmp()).unwrap();
                std::fs::write(&path, TIES).unwrap();
                format!("sim:{}", path.display())
            })
            .clone(),
    }
}

/// `orch plan --json` of `case` with the policy at `wasm`, from a job file of `language`'s test
/// (each test writes its own).
fn plan(language: &str, case: &Case, wasm: &std::path::Path, limits: &str, n: usize) -> Output {
    let name = wasm.file_stem().unwrap().to_string_lossy().into_owned();
    let job = tmp().join(format!("{language}-{name}-{n}.toml"));
    std::fs::create_dir_all(tmp()).unwrap();
    std::fs::write(
        &job,
        format!(
            "[job]\nname = \"t\"\n[resources]\n{}\n[policy]\nplugin = \"{}\"\n{limits}[command]\nargv = [\"true\"]\n",
            case.resources,
            wasm.display()
        ),
    )
    .unwrap();
    let sim = sim(case.sim);
    let cache = cache_dir();
    let mut env = vec![("ORCH_DEVICES", sim.as_str()), ("ORCH_CACHE_DIR", &cache)];
    if let Some(visible) = case.visible {
        env.push(("CUDA_VISIBLE_DEVICES", visible));
    }
    orch(&["plan", &job.display().to_string(), "--json"], &env)
}

/// What a plan says, with the plugin's file name made neutral: exit status, stdout, stderr.
fn answer(out: &Output, wasm: &std::path::Path) -> (Option<i32>, String, String) {
    let file = wasm.file_name().unwrap().to_string_lossy().into_owned();
    let neutral = |s: String| s.replace(&file, "POLICY.wasm");
    (
        out.status.code(),
        neutral(stdout(out)),
        neutral(stderr(out)),
    )
}

fn chosen(json: &str) -> Vec<u64> {
    let plan: Value = serde_json::from_str(json).expect("JSON");
    plan["devices"]
        .as_array()
        .expect("devices")
        .iter()
        .map(|d| d["index"].as_u64().expect("index"))
        .collect()
}

/// Every case through the Rust `coolest` and through `wasm`: the same exit status, the same
/// devices in the same order, the same reason and the same refusal.
fn chooses_what_rust_chooses(language: &str, wasm: &std::path::Path) {
    let out = orch(
        &["plugin", "inspect", &wasm.display().to_string(), "--json"],
        &[("ORCH_CACHE_DIR", &cache_dir())],
    );
    assert!(out.status.success(), "{language}: {}", stderr(&out));
    let inspected: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(inspected["world"], "orch:plugin/policy@0.5.0", "{language}");

    let rust = rust_coolest();
    for (n, case) in CASES.iter().enumerate() {
        let theirs = answer(&plan(language, case, rust, "", n), rust);
        let ours = answer(&plan(language, case, wasm, LIMITS, n), wasm);
        let what = format!(
            "{language}, {} on {}",
            case.resources.replace('\n', ", "),
            case.sim
        );
        match case.rust {
            Some(devices) => {
                assert_eq!(theirs.0, Some(0), "rust, {what}: {}", theirs.2);
                assert_eq!(chosen(&theirs.1), devices, "rust, {what}");
            }
            None => {
                assert_eq!(theirs.0, Some(1), "rust refuses, {what}: {}", theirs.1);
                assert!(
                    theirs.2.contains("found no fit: ") && theirs.2.contains("fit the request"),
                    "rust, {what}: {}",
                    theirs.2
                );
            }
        }
        assert_eq!(ours.0, theirs.0, "{what}: exit status; stderr {}", ours.2);
        assert_eq!(ours.1, theirs.1, "{what}: the plan");
        assert_eq!(ours.2, theirs.2, "{what}: the message");
    }
}

#[test]
fn coolest_in_python_chooses_what_the_rust_coolest_chooses() {
    let _heavy = heavy();
    let test = "coolest_in_python";
    let Some(tool) = componentize_py(test) else {
        return;
    };
    let wasm = build_example(
        "examples/policies/coolest-py",
        "COMPONENTIZE_PY",
        &tool,
        "coolest-py.wasm",
    );
    chooses_what_rust_chooses("python", &wasm);
}

/// examples/policies/coolest-js built with componentize-js, once per test run for every test
/// that needs it; `None` (after saying why) without the toolchain.
pub fn coolest_js(test: &str) -> Option<PathBuf> {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    let tool = componentize_js(test)?;
    Some(
        BUILT
            .get_or_init(|| {
                build_example(
                    "examples/policies/coolest-js",
                    "COMPONENTIZE_JS",
                    &tool,
                    "coolest-js.wasm",
                )
            })
            .clone(),
    )
}

#[test]
fn coolest_in_javascript_chooses_what_the_rust_coolest_chooses() {
    let _heavy = heavy();
    let Some(wasm) = coolest_js("coolest_in_javascript") else {
        return;
    };
    chooses_what_rust_chooses("javascript", &wasm);
}

/// examples/trainers/linear-py, softmax regression in Python, trains on the bundled digits
/// through `orch run`, on one simulated GPU and on two (data parallel), and learns them; the two
/// runs see the same global batches and average the replicas' gradients, so their losses agree.
#[test]
fn a_trainer_in_python_learns_the_digits() {
    let _heavy = heavy();
    let test = "a_trainer_in_python";
    let Some(tool) = componentize_py(test) else {
        return;
    };
    let wasm = build_example(
        "examples/trainers/linear-py",
        "COMPONENTIZE_PY",
        &tool,
        "linear-py.wasm",
    );
    let digits = root().join("examples/digits/data/digits.csv.gz");
    let mut losses: Vec<Vec<(f64, f64)>> = Vec::new();
    for gpus in [1, 2] {
        let dir = tmp().join(format!("linear-py-{gpus}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let job = dir.join("job.toml");
        std::fs::write(
            &job,
            format!(
                "[job]\nname = \"linear-py\"\n[resources]\ngpus = {gpus}\nmemory_limit = \"256MiB\"\n\
                 [train]\nplugin = \"{}\"\nepochs = 3\nbatch_size = 64\nseed = 3\n\
                 [train.data]\nformat = \"csv\"\ntrain = \"{d}\"\ntest = \"{d}\"\nscale = 16\n",
                wasm.display(),
                d = digits.display()
            ),
        )
        .unwrap();
        let sim = lab_sim();
        let state = dir.join("state").display().to_string();
        let cache = cache_dir();
        let started = std::time::Instant::now();
        let out = orch(
            &["run", &job.display().to_string()],
            &[
                ("ORCH_DEVICES", &sim),
                ("ORCH_STATE_DIR", &state),
                ("ORCH_CACHE_DIR", &cache),
            ],
        );
        let text = stdout(&out);
        assert!(
            out.status.success(),
            "{gpus} GPU(s): {text}{}",
            stderr(&out)
        );
        eprintln!(
            "linear-py on {gpus} GPU(s): {:.1} s\n{text}",
            started.elapsed().as_secs_f64()
        );
        assert!(
            text.contains(&format!("{gpus} replica(s) on sim:")),
            "{text}"
        );
        // "epoch 3/3: train loss …, test loss …, test accuracy 96.05% (…)"
        let last = text
            .lines()
            .find(|l| l.starts_with("epoch 3/3:"))
            .unwrap_or_else(|| panic!("no third epoch: {text}"));
        let accuracy: f64 = last
            .split("test accuracy ")
            .nth(1)
            .and_then(|rest| rest.split('%').next())
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("no accuracy in {last}"));
        assert!(accuracy > 90.0, "{gpus} GPU(s): {last}");
        losses.push(epoch_losses(&dir.join("runs/linear-py/metrics.jsonl")));
    }
    let (one, two) = (&losses[0], &losses[1]);
    assert_eq!(one.len(), 3, "three epoch records: {one:?}");
    assert_eq!(one.len(), two.len(), "{one:?} against {two:?}");
    for (epoch, (a, b)) in one.iter().zip(two).enumerate() {
        let close = |x: f64, y: f64| (x - y).abs() <= 1e-4 * x.abs().max(1e-3);
        assert!(
            close(a.0, b.0) && close(a.1, b.1),
            "epoch {}: 1 replica (train, eval loss) {a:?}, 2 replicas {b:?}",
            epoch + 1
        );
    }
}

/// `(train_loss, eval_loss)` of each epoch record of a run's metrics.jsonl.
fn epoch_losses(metrics: &std::path::Path) -> Vec<(f64, f64)> {
    let text =
        std::fs::read_to_string(metrics).unwrap_or_else(|e| panic!("{}: {e}", metrics.display()));
    text.lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|r| r["kind"] == "epoch")
        .map(|r| {
            let loss = |key: &str| r[key].as_f64().unwrap_or_else(|| panic!("no {key} in {r}"));
            (loss("train_loss"), loss("eval_loss"))
        })
        .collect()
}
