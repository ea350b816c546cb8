//! Fuzz target: `job.toml` (`orch_core::job::parse`), from valid job files mutated key by key
//! (every key of the schema, set to edge values, removed, or misplaced) and then byte by byte.
//! Invariant: a result or an [`InputError`] of one sentence that points inside the file; never a
//! panic, a hang or an unbounded allocation.

use orch_core::job;
use orch_fuzz::{Bounds, fuzz, sentence, text, tree};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use std::path::Path;
use std::time::Duration;

/// Valid job files to start from: the examples, and one with every key.
const SEEDS: &[&str] = &[
    include_str!("../../../examples/mnist/job.toml"),
    include_str!("../../../examples/mnist/job-4-sim.toml"),
    include_str!("../../../examples/run/multi-gpu.toml"),
    include_str!("../../../examples/run/one-task-per-gpu.toml"),
    include_str!("../../../examples/run/cloud-gpu-id.toml"),
    include_str!("../../../examples/plan/explicit.toml"),
    include_str!("../../../examples/plan/env.toml"),
    EVERY_KEY,
];

const EVERY_KEY: &str = r#"
[job]
name = "every-key"
tenant = "alice"
priority = -3
max_runtime = "12h"
requeue = true
preemptible = true
signal = "USR1@5m"
grace = "60s"

[resources]
gpus = 2
min_free_memory = "10GiB"
max_utilization = 20
memory_limit = "16GiB"
exclusive = false
enforce_memory_limit = true

[policy]
plugin = "least-loaded"
[policy.config]
prefer = "memory"
weight = 3.5

[train]
plugin = "trainers/t.wasm"
epochs = 2
batch_size = 64
seed = 7
step_timeout = 90
checkpoint_every = 100
replicas = 2
out = "runs/x"
[train.data]
format = "csv"
train = "data/train.csv"
test = "data/test.csv"
label_column = -1
header = true
scale = 255.0
normalize = false
[train.config]
hidden = "64,32"
"#;

/// Every table of the schema with its keys (docs/JOBS.md).
const SCHEMA: &[(&[&str], &[&str])] = &[
    (&[], &["job", "resources", "policy", "command", "train"]),
    (
        &["job"],
        &[
            "name",
            "tenant",
            "priority",
            "max_runtime",
            "requeue",
            "preemptible",
            "signal",
            "grace",
        ],
    ),
    (
        &["resources"],
        &[
            "gpus",
            "min_free_memory",
            "max_utilization",
            "memory_limit",
            "exclusive",
            "enforce_memory_limit",
        ],
    ),
    (&["policy"], &["plugin", "config"]),
    (&["policy", "config"], &["prefer", "weight", "gpus"]),
    (&["command"], &["argv", "env", "launch"]),
    (&["command", "env"], &["PATH", "CUDA_VISIBLE_DEVICES"]),
    (
        &["train"],
        &[
            "plugin",
            "epochs",
            "batch_size",
            "seed",
            "data",
            "config",
            "step_timeout",
            "checkpoint_every",
            "replicas",
            "out",
        ],
    ),
    (
        &["train", "data"],
        &[
            "format",
            "train",
            "test",
            "label_column",
            "header",
            "scale",
            "normalize",
        ],
    ),
    (&["train", "config"], &["hidden", "lr"]),
];

const VALUES: &[&str] = &[
    "python",
    "train.py",
    "data",
    "spread",
    "pack",
    "runs/../x",
    ".",
];

/// A key of the schema in its own table (mostly), or in any table.
fn edit() -> impl Strategy<Value = tree::Edit> {
    let own =
        prop::sample::select(SCHEMA).prop_flat_map(|(table, keys)| (Just(table), tree::key(keys)));
    let anywhere = (
        prop::sample::select(SCHEMA).prop_map(|(table, _)| table),
        prop::sample::select(SCHEMA).prop_flat_map(|(_, keys)| tree::key(keys)),
    );
    let place = prop_oneof![4 => own, 1 => anywhere];
    (place, tree::action(VALUES)).prop_map(|((table, key), action)| {
        let mut path: Vec<tree::Seg> = table
            .iter()
            .map(|k| tree::Seg::Key(k.to_string()))
            .collect();
        path.push(key);
        tree::Edit { path, action }
    })
}

/// A job file's text: a seed, edited as TOML, then (half the time) as text.
fn job_text() -> impl Strategy<Value = String> {
    let text_edits = prop_oneof![Just(Vec::new()), prop::collection::vec(text::edit(), 1..4),];
    (
        prop::sample::select(SEEDS),
        prop::collection::vec(edit(), 0..6),
        text_edits,
    )
        .prop_map(|(seed, tree_edits, text_edits)| {
            let toml = tree::apply(seed, &tree_edits).unwrap_or_else(|| seed.to_string());
            text::apply(&toml, &text_edits)
        })
}

fn check(text: String) -> Result<(), TestCaseError> {
    let path = Path::new("jobs/j.toml");
    match job::parse(path, &text) {
        Ok(spec) => {
            let r = &spec.resources;
            prop_assert!((1..=4096).contains(&r.gpus), "gpus {}", r.gpus);
            prop_assert!(r.max_utilization.is_none_or(|u| u <= 100));
            prop_assert!(r.memory_limit.is_none_or(|m| m.bytes() > 0));
            prop_assert!(!r.enforce_memory_limit || r.memory_limit.is_some());
            prop_assert!(!spec.name.trim().is_empty());
        }
        Err(error) => {
            sentence::check(&error.to_string())?;
            let lines = text.split('\n').count();
            let at = &error.location;
            prop_assert!(
                at.line >= 1 && at.line <= lines && at.column >= 1,
                "{error} points outside the file ({lines} lines)"
            );
        }
    }
    Ok(())
}

#[test]
fn fuzz_job_file() {
    let bounds = Bounds {
        case_time: Duration::from_secs(3),
        case_bytes: 64 << 20,
    };
    fuzz("job", bounds, job_text(), check);
}
