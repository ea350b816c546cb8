//! Fuzz target: `Visibility::resolve`, CUDA's and Slurm's rules, over arbitrary inventories
//! (up to 12 GPUs with MIG instances, uuids sharing prefixes, non-ASCII, malformed compute
//! capabilities) and arbitrary `CUDA_VISIBLE_DEVICES`, `CUDA_DEVICE_ORDER`, `SLURM_STEP_GPUS`
//! and `SLURM_JOB_GPUS` built from the entries those rules tell apart. Invariant: the visible
//! devices exist, none twice, inside the Slurm grant when one applies, and every note is one
//! sentence; never a panic, a hang or an unbounded allocation.

use orch_devices::{Backend, Device, MigDevice, Visibility, VisibilityEnv};
use orch_fuzz::{Bounds, fuzz, sentence};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use std::collections::HashSet;
use std::time::Duration;

/// Uuids that share prefixes (in any case), and some that are not ASCII.
const GPU_UUIDS: &[&str] = &[
    "GPU-8932f937-d72c-4106-c12f-20bd9faed9f6",
    "GPU-8932f937-d72c-4106-c12f-20bd9faed9f7",
    "GPU-8932F937-0000-0000-0000-000000000000",
    "GPU-1c7b4a55-0f0e-4d5c-9b37-6a2e0e1d4c21",
    "GPU-ééééééé",
    "GPU-😀😀😀",
    "GPU-",
];
const MIG_UUIDS: &[&str] = &[
    "MIG-aaaa0000-1111-2222-3333-444455556666",
    "MIG-aaaa0000-1111-2222-3333-444455556667",
    "MIG-bbbb0000-1111-2222-3333-444455556666",
    "MIG-ééééé",
];
const CAPABILITIES: &[&str] = &[
    "9.0",
    "8.0",
    "8.6",
    "10.10",
    "99999999999.0",
    "9",
    ".",
    "x.y",
];

fn device() -> impl Strategy<Value = (String, Option<String>, Option<u64>, Vec<String>)> {
    (
        prop::sample::select(GPU_UUIDS).prop_map(str::to_string),
        prop::option::of(prop::sample::select(CAPABILITIES).prop_map(str::to_string)),
        prop::option::of(prop_oneof![Just(0u64), Just(80 << 30), any::<u64>()]),
        prop::collection::vec(
            prop::sample::select(MIG_UUIDS).prop_map(str::to_string),
            0..3,
        ),
    )
}

/// Devices in physical order (`index` is the position, as every inventory makes it).
fn inventory() -> impl Strategy<Value = Vec<Device>> {
    prop::collection::vec(device(), 0..12).prop_map(|parts| {
        parts
            .into_iter()
            .enumerate()
            .map(|(i, (uuid, cc, memory, migs))| Device {
                index: i as u32,
                uuid,
                name: format!("gpu {i}"),
                backend: Backend::Sim,
                memory_total_bytes: memory,
                memory_used_bytes: None,
                memory_free_bytes: None,
                utilization_gpu_percent: None,
                utilization_memory_percent: None,
                temperature_c: None,
                power_draw_w: None,
                compute_capability: cc,
                pci_bus_id: None,
                processes: None,
                mig_devices: migs
                    .into_iter()
                    .map(|uuid| MigDevice {
                        uuid,
                        name: None,
                        memory_total_bytes: None,
                        ..Default::default()
                    })
                    .collect(),
                minor_number: None,
                numa_node: None,
                cpus: None,
                links: Vec::new(),
                health: Default::default(),
                mig_mode: false,
                mig_slots: None,
            })
            .collect()
    })
}

/// A prefix of `s`, `n` chars long (a uuid prefix as people quote it).
fn prefix(s: &str, n: usize) -> String {
    s.chars().take(n).collect()
}

/// One entry of `CUDA_VISIBLE_DEVICES`.
fn cuda_entry() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => (0..14u32).prop_map(|i| i.to_string()),
        1 => prop::sample::select(
            &["", " ", "-1", " 1 ", "1gpu", "0x1", "+1", "99999999999999999999999", "GPU-", "MIG-"][..]
        )
        .prop_map(str::to_string),
        3 => (prop::sample::select(GPU_UUIDS), 0..44usize).prop_map(|(u, n)| prefix(u, n)),
        1 => (prop::sample::select(GPU_UUIDS), 4..12usize)
            .prop_map(|(u, n)| prefix(u, n).to_uppercase()),
        2 => (prop::sample::select(MIG_UUIDS), 0..44usize).prop_map(|(u, n)| prefix(u, n)),
        1 => (prop::sample::select(GPU_UUIDS), 0..4u32)
            .prop_map(|(u, gi)| format!("MIG-{u}/{gi}/0")),
        1 => any::<String>().prop_map(|s| s.chars().take(12).collect()),
    ]
}

fn list<S: Strategy<Value = String>>(entry: S, most: usize) -> impl Strategy<Value = String> {
    (
        prop::collection::vec(entry, 0..most),
        prop::sample::select(&[",", ", ", ",,"][..]),
    )
        .prop_map(|(entries, sep)| entries.join(sep))
}

/// One part of a Slurm grant: an index or a range, some of them huge or reversed.
fn slurm_part() -> impl Strategy<Value = String> {
    let index = prop_oneof![
        4 => 0..14u32,
        1 => prop::sample::select(&[u32::MAX - 1, u32::MAX, 1 << 31][..]),
    ];
    prop_oneof![
        3 => index.clone().prop_map(|i| i.to_string()),
        3 => (index.clone(), index).prop_map(|(a, b)| format!("{a}-{b}")),
        1 => prop::sample::select(&["", "-", "0-", "-3", "a", "1-2-3", "4294967296", " 1 "][..])
            .prop_map(str::to_string),
    ]
}

fn env() -> impl Strategy<Value = VisibilityEnv> {
    let order = prop::sample::select(
        &[
            "PCI_BUS_ID",
            "FASTEST_FIRST",
            "",
            " PCI_BUS_ID ",
            "pci_bus_id",
            "a\nb",
        ][..],
    )
    .prop_map(str::to_string);
    (
        prop::option::of(list(cuda_entry(), 6)),
        prop::option::of(order),
        prop::option::of(list(slurm_part(), 4)),
        prop::option::of(list(slurm_part(), 4)),
    )
        .prop_map(|(cuda, order, step, job)| VisibilityEnv {
            cuda_visible_devices: cuda,
            cuda_device_order: order,
            slurm_step_gpus: step,
            slurm_job_gpus: job,
        })
}

fn check((devices, env): (Vec<Device>, VisibilityEnv)) -> Result<(), TestCaseError> {
    let visibility = Visibility::resolve(&devices, &env);
    let mut seen = HashSet::new();
    for v in &visibility.devices {
        prop_assert!(
            (v.physical as usize) < devices.len(),
            "{v:?} is not a device"
        );
        prop_assert!(seen.insert((v.physical, v.mig_uuid.clone())), "{v:?} twice");
        prop_assert_eq!(visibility.visible_index(v.physical).is_some(), true);
    }
    if env.cuda_visible_devices.is_none()
        && env.slurm_step_gpus.is_none()
        && env.slurm_job_gpus.is_none()
    {
        prop_assert_eq!(visibility.devices.len(), devices.len());
    }
    for note in &visibility.notes {
        sentence::check(note)?;
    }
    Ok(())
}

#[test]
fn fuzz_visibility_rules() {
    let bounds = Bounds {
        case_time: Duration::from_secs(2),
        case_bytes: 16 << 20,
    };
    fuzz("visibility", bounds, (inventory(), env()), check);
}
