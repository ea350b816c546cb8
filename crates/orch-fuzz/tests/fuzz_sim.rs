//! Fuzz target: the sim inventory file (`orch_devices::sim::parse`), from valid files mutated
//! GPU by GPU (every key of `[[gpu]]`, `[[gpu.process]]` and `[[gpu.mig]]` set to edge values,
//! removed, entries duplicated) and then byte by byte. Invariant: devices that keep the model's
//! promises, or a refusal of one sentence; never a panic, a hang or an unbounded allocation.

use orch_devices::sim;
use orch_fuzz::{Bounds, fuzz, sentence, text, tree};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use std::collections::HashSet;
use std::path::Path;
use std::time::Duration;

const SEEDS: &[&str] = &[
    include_str!("../../../examples/sim/lab-8gpu.toml"),
    EVERY_KEY,
    "[[gpu]]\nname = \"small\"\nmemory_total = 1024\n",
];

const EVERY_KEY: &str = r#"
[[gpu]]
name = "NVIDIA A100-SXM4-80GB"
memory_total = "80GiB"
memory_used = "3GiB"
utilization = 35
memory_utilization = 10
uuid = "GPU-8a1b0000-1111-2222-3333-444455556666"
pci_bus_id = "00000000:18:00.0"
compute_capability = "8.0"
temperature = 41
power_draw_w = 210.5
[[gpu.process]]
pid = 4242
used_memory = "2GiB"
[[gpu.process]]
pid = 4243
used_memory = "1GiB"
[[gpu.mig]]
uuid = "MIG-aaaa0000-1111-2222-3333-444455556666"
name = "1g.10gb"
memory_total = "10GiB"
[[gpu.mig]]
uuid = "MIG-bbbb0000-1111-2222-3333-444455556666"

[[gpu]]
name = "second"
memory_total = "40GB"
[[gpu.process]]
pid = 1
used_memory = 1000
"#;

const GPU_KEYS: &[&str] = &[
    "name",
    "memory_total",
    "memory_used",
    "utilization",
    "memory_utilization",
    "uuid",
    "pci_bus_id",
    "compute_capability",
    "temperature",
    "power_draw_w",
    "process",
    "mig",
];
const PROCESS_KEYS: &[&str] = &["pid", "used_memory"];
const MIG_KEYS: &[&str] = &["uuid", "name", "memory_total"];

const VALUES: &[&str] = &[
    "GPU-8a1b0000-1111-2222-3333-444455556666",
    "GPU-8a1b0000",
    "GPU-ééééééé",
    "GPU-😀😀😀😀😀😀😀😀",
    "gpu-8a1b0000-1111",
    "MIG-aaaa0000-1111-2222-3333-444455556666",
    "MIG-GPU-8a1b0000-1111-2222-3333-444455556666/1/0",
    "MIG-",
    "9.0",
    "10.10",
    "99999999999.0",
    "1.2.3",
    "٣.٠",
    "8GiB",
    "16384TiB",
    "8589934592GiB",
    "18446744073709551615",
];

/// Keys whose values are byte sizes: set to sizes at the edges more often.
const SIZE_KEYS: &[&str] = &["memory_total", "memory_used", "used_memory"];

fn key(keys: &'static [&'static str]) -> BoxedStrategy<tree::Seg> {
    tree::key(keys).boxed()
}

fn action(path: &[tree::Seg]) -> BoxedStrategy<tree::Action> {
    let sized = matches!(path.last(), Some(tree::Seg::Key(k)) if SIZE_KEYS.contains(&k.as_str()));
    if sized {
        prop_oneof![
            1 => tree::action(VALUES),
            2 => tree::size_value().prop_map(tree::Action::Set),
        ]
        .boxed()
    } else {
        tree::action(VALUES).boxed()
    }
}

fn gpu(rest: Vec<tree::Seg>) -> Vec<tree::Seg> {
    let mut path = vec![tree::Seg::Key("gpu".to_string())];
    path.extend(rest);
    path
}

/// A key of a GPU, of one of its processes or MIG instances, or a whole entry.
fn edit() -> impl Strategy<Value = tree::Edit> {
    let path = prop_oneof![
        6 => (tree::at(), key(GPU_KEYS)).prop_map(|(i, k)| gpu(vec![i, k])),
        2 => (tree::at(), tree::at(), key(PROCESS_KEYS)).prop_map(|(i, j, k)| {
            gpu(vec![i, tree::Seg::Key("process".into()), j, k])
        }),
        2 => (tree::at(), tree::at(), key(MIG_KEYS)).prop_map(|(i, j, k)| {
            gpu(vec![i, tree::Seg::Key("mig".into()), j, k])
        }),
        1 => tree::at().prop_map(|i| gpu(vec![i])),
        1 => Just(gpu(vec![])),
    ];
    path.prop_flat_map(|path| {
        let action = action(&path);
        (Just(path), action)
    })
    .prop_map(|(path, action)| tree::Edit { path, action })
}

fn sim_text() -> impl Strategy<Value = String> {
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
    match sim::parse(Path::new("lab.toml"), &text) {
        Ok(devices) => {
            prop_assert!(!devices.is_empty());
            let mut uuids = HashSet::new();
            for (position, d) in devices.iter().enumerate() {
                prop_assert_eq!(d.index as usize, position);
                let (total, used, free) = (
                    d.memory_total_bytes.unwrap_or(0),
                    d.memory_used_bytes.unwrap_or(0),
                    d.memory_free_bytes.unwrap_or(0),
                );
                prop_assert!(used <= total && used + free == total, "{d:?}");
                prop_assert!(d.utilization_gpu_percent.is_none_or(|u| u <= 100));
                prop_assert!(d.utilization_memory_percent.is_none_or(|u| u <= 100));
                for uuid in std::iter::once(&d.uuid).chain(d.mig_devices.iter().map(|m| &m.uuid)) {
                    prop_assert!(uuids.insert(uuid.clone()), "uuid {uuid} twice");
                }
                // What `orch devices` prints of every device must not panic either.
                let _ = (d.short_uuid(), d.compute_capability_pair());
            }
        }
        Err(error) => sentence::check(&error.to_string())?,
    }
    Ok(())
}

#[test]
fn fuzz_sim_inventory_file() {
    let bounds = Bounds {
        case_time: Duration::from_secs(3),
        case_bytes: 64 << 20,
    };
    fuzz("sim", bounds, sim_text(), check);
}
