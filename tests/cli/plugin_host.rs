//! One plugin host for every world: `orch plugin inspect NAME` knows each built-in by its name,
//! the trainers' (`mlp`, `cnn`, `gpt`: the names the example jobs use) as the policies' and the
//! queue policies', because all of them are in one built-in table on one host.

use crate::*;
use serde_json::Value;
use std::path::PathBuf;

/// A compile cache of these tests' own (never the user's `~/.cache`).
fn cache_dir() -> String {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("orch-cache-plugin-host")
        .display()
        .to_string()
}

/// `orch plugin inspect NAME --json`, which must succeed.
fn inspect_json(name: &str) -> Value {
    let cache = cache_dir();
    let out = orch(
        &["plugin", "inspect", name, "--json"],
        &[("ORCH_CACHE_DIR", cache.as_str())],
    );
    assert!(out.status.success(), "inspect {name}: {}", stderr(&out));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn exports(v: &Value) -> Vec<String> {
    v["exports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_str().unwrap().to_string())
        .collect()
}

/// The `[train] plugin` of an example job, as a user would copy it.
fn example_trainer(example: &str) -> String {
    let text =
        std::fs::read_to_string(root().join("examples").join(example).join("job.toml")).unwrap();
    let job: toml::Value = toml::from_str(&text).unwrap();
    job["train"]["plugin"].as_str().unwrap().to_string()
}

#[test]
fn inspect_knows_the_built_in_trainers_by_the_names_jobs_use() {
    for (example, name) in [("gpt", "gpt"), ("mnist", "mlp"), ("cnn", "cnn")] {
        assert_eq!(
            example_trainer(example),
            name,
            "examples/{example}/job.toml"
        );
        let v = inspect_json(name);
        assert_eq!(v["file"], name);
        assert_eq!(v["world"], "orch:plugin/trainer@0.5.0", "{name}: {v}");
        assert_eq!(v["contract"], "0.5.0", "{name}");
        assert_eq!(
            v["note"],
            Value::Null,
            "{name}: built for the current contract"
        );
        assert!(
            exports(&v).contains(&"instance orch:plugin/training@0.5.0".to_string()),
            "{name}: {v}"
        );
        let imports = v["imports"].as_array().unwrap();
        assert!(
            imports
                .iter()
                .any(|i| i.as_str().unwrap() == "instance orch:plugin/tensors@0.5.0"),
            "{name} imports the host's tensors: {v}"
        );
        assert!(v["size_bytes"].as_u64().unwrap() > 10_000, "{name}");
    }
    // The text model also predicts (world `predicting-trainer`).
    assert!(
        exports(&inspect_json("gpt")).contains(&"instance orch:plugin/inference@0.5.0".to_string())
    );

    let cache = cache_dir();
    let out = orch(
        &["plugin", "inspect", "gpt"],
        &[("ORCH_CACHE_DIR", cache.as_str())],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).starts_with("gpt: a component of world orch:plugin/trainer@0.5.0, "),
        "{}",
        stdout(&out)
    );
}

#[test]
fn inspect_knows_the_built_in_policies_and_queue_policies_alike() {
    let v = inspect_json("spread");
    assert_eq!(v["world"], "orch:plugin/policy@0.5.0");
    assert_eq!(
        exports(&v),
        vec!["instance orch:plugin/placement@0.5.0".to_string()]
    );
    let v = inspect_json("fifo");
    assert_eq!(v["world"], "orch:plugin/queue@0.5.0");
    assert_eq!(
        exports(&v),
        vec!["instance orch:plugin/queue-order@0.5.0".to_string()]
    );
}

#[test]
fn a_name_that_is_no_built_in_and_no_file_says_what_inspect_takes() {
    let cache = cache_dir();
    let out = orch(
        &["plugin", "inspect", "transformer"],
        &[("ORCH_CACHE_DIR", cache.as_str())],
    );
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("cannot read transformer")
            && err.contains("or the name of a built-in policy, queue policy or trainer"),
        "{err}"
    );
}
