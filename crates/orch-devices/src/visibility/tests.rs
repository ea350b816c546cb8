//! One row per rule of the module documentation; each row names the rule it checks.

use super::*;
use crate::{Backend, MigDevice};

fn gpu(index: u32, uuid: &str, cc: &str, gib: u64) -> Device {
    Device {
        index,
        uuid: uuid.to_string(),
        name: format!("gpu{index}"),
        backend: Backend::Sim,
        memory_total_bytes: Some(gib << 30),
        memory_used_bytes: Some(0),
        memory_free_bytes: Some(gib << 30),
        utilization_gpu_percent: Some(0),
        utilization_memory_percent: None,
        temperature_c: None,
        power_draw_w: None,
        compute_capability: Some(cc.to_string()),
        pci_bus_id: None,
        processes: Some(Vec::new()),
        mig_devices: Vec::new(),
        minor_number: None,
        numa_node: None,
        cpus: None,
        links: Vec::new(),
        health: Default::default(),
        mig_mode: false,
        mig_slots: None,
    }
}

/// Four identical GPUs; GPU 3 has two MIG instances.
fn same() -> Vec<Device> {
    let mut devices = vec![
        gpu(0, "GPU-aaaa1111-0000-0000-0000-000000000000", "9.0", 80),
        gpu(1, "GPU-aaaa2222-0000-0000-0000-000000000000", "9.0", 80),
        gpu(2, "GPU-bbbb3333-0000-0000-0000-000000000000", "9.0", 80),
        gpu(3, "GPU-cccc4444-0000-0000-0000-000000000000", "9.0", 80),
    ];
    devices[3].mig_devices = vec![
        MigDevice {
            uuid: "MIG-dddd0001-0000-0000-0000-000000000000".into(),
            name: None,
            memory_total_bytes: None,
            ..Default::default()
        },
        MigDevice {
            uuid: "MIG-dddd0002-0000-0000-0000-000000000000".into(),
            name: None,
            memory_total_bytes: None,
            ..Default::default()
        },
    ];
    devices
}

/// Mixed generations: physical 1 and 3 are newer, 3 has more memory.
fn mixed() -> Vec<Device> {
    vec![
        gpu(0, "GPU-00000000-a", "8.0", 40),
        gpu(1, "GPU-11111111-a", "9.0", 80),
        gpu(2, "GPU-22222222-a", "8.0", 40),
        gpu(3, "GPU-33333333-a", "9.0", 141),
    ]
}

struct Row {
    rule: &'static str,
    devices: fn() -> Vec<Device>,
    cvd: Option<&'static str>,
    order: Option<&'static str>,
    step: Option<&'static str>,
    job: Option<&'static str>,
    /// Expected physical indices in CUDA order; a MIG instance as `index/uuid-prefix`.
    expect: &'static [&'static str],
}

const fn row(
    rule: &'static str,
    cvd: Option<&'static str>,
    expect: &'static [&'static str],
) -> Row {
    Row {
        rule,
        devices: same,
        cvd,
        order: None,
        step: None,
        job: None,
        expect,
    }
}

fn rows() -> Vec<Row> {
    vec![
        row("unset: every device", None, &["0", "1", "2", "3"]),
        row("empty: no device", Some(""), &[]),
        row("empty: only spaces is empty", Some("  "), &[]),
        row("renumbering in list order", Some("3,1"), &["3", "1"]),
        row("integers: a single index", Some("2"), &["2"]),
        row(
            "integers: spaces around entries are ignored",
            Some(" 1 , 2 "),
            &["1", "2"],
        ),
        row(
            "integers: read like strtoul, leading digits count",
            Some("1gpu2,2ampere"),
            &["1", "2"],
        ),
        row(
            "truncation: -1 ends the list",
            Some("0,2,-1,1"),
            &["0", "2"],
        ),
        row(
            "truncation: a non-numeric entry ends the list",
            Some("1,x,2"),
            &["1"],
        ),
        row(
            "truncation: an index past the last device ends the list",
            Some("1,7,2"),
            &["1"],
        ),
        row(
            "truncation: an invalid first entry hides everything",
            Some("-1"),
            &[],
        ),
        row(
            "repetition: a repeated index empties the list",
            Some("0,1,0"),
            &[],
        ),
        row(
            "uuids: full UUIDs",
            Some(
                "GPU-bbbb3333-0000-0000-0000-000000000000,GPU-aaaa1111-0000-0000-0000-000000000000",
            ),
            &["2", "0"],
        ),
        row(
            "uuids: unique prefixes",
            Some("GPU-cccc,GPU-aaaa2"),
            &["3", "1"],
        ),
        row(
            "uuids: prefixes match case-insensitively",
            Some("GPU-CCCC4444"),
            &["3"],
        ),
        row(
            "uuids: an ambiguous prefix ends the list",
            Some("GPU-bbbb,GPU-aaaa,GPU-cccc"),
            &["2"],
        ),
        row(
            "uuids: an unknown uuid ends the list",
            Some("GPU-aaaa1,GPU-ffff,GPU-cccc"),
            &["0"],
        ),
        row(
            "uuids: an index after a uuid ends the list",
            Some("GPU-cccc,1"),
            &["3"],
        ),
        row(
            "repetition: the same GPU by two prefixes empties the list",
            Some("GPU-cccc,GPU-cccc4444"),
            &[],
        ),
        row(
            "mig: MIG instances by uuid prefix",
            Some("MIG-dddd0002,MIG-dddd0001"),
            &["3/MIG-dddd0002", "3/MIG-dddd0001"],
        ),
        row(
            "mig: an unknown MIG uuid ends the list",
            Some("MIG-dddd0001,MIG-eeee"),
            &["3/MIG-dddd0001"],
        ),
        row(
            "mig: the older MIG-GPU-uuid/gi/ci form",
            Some("MIG-GPU-cccc4444-0000-0000-0000-000000000000/1/0"),
            &["3/MIG-GPU-cccc4444"],
        ),
        Row {
            rule: "order: FASTEST_FIRST (default) puts newer, bigger GPUs first",
            devices: mixed,
            cvd: None,
            order: None,
            step: None,
            job: None,
            expect: &["3", "1", "0", "2"],
        },
        Row {
            rule: "order: PCI_BUS_ID is the physical order",
            devices: mixed,
            cvd: None,
            order: Some("PCI_BUS_ID"),
            step: None,
            job: None,
            expect: &["0", "1", "2", "3"],
        },
        Row {
            rule: "order: indices count in FASTEST_FIRST order",
            devices: mixed,
            cvd: Some("0,1"),
            order: None,
            step: None,
            job: None,
            expect: &["3", "1"],
        },
        Row {
            rule: "order: indices count in PCI_BUS_ID order",
            devices: mixed,
            cvd: Some("0,1"),
            order: Some("PCI_BUS_ID"),
            step: None,
            job: None,
            expect: &["0", "1"],
        },
        Row {
            rule: "order: an unknown order is FASTEST_FIRST",
            devices: mixed,
            cvd: Some("0"),
            order: Some("SLOWEST"),
            step: None,
            job: None,
            expect: &["3"],
        },
        Row {
            rule: "slurm: the job's grant is the visible set",
            devices: same,
            cvd: None,
            order: None,
            step: None,
            job: Some("1,3"),
            expect: &["1", "3"],
        },
        Row {
            rule: "slurm: the step's grant wins over the job's",
            devices: same,
            cvd: None,
            order: None,
            step: Some("2"),
            job: Some("1,3"),
            expect: &["2"],
        },
        Row {
            rule: "slurm: CUDA_VISIBLE_DEVICES set by Slurm agrees with the grant",
            devices: same,
            cvd: Some("1,3"),
            order: None,
            step: None,
            job: Some("1,3"),
            expect: &["1", "3"],
        },
        Row {
            rule: "slurm: devices outside the grant stay hidden",
            devices: same,
            cvd: Some("0,1,2"),
            order: None,
            step: None,
            job: Some("1-2"),
            expect: &["1", "2"],
        },
        Row {
            rule: "slurm: an empty step grant hides every device",
            devices: same,
            cvd: None,
            order: None,
            step: Some(""),
            job: Some("1"),
            expect: &[],
        },
        Row {
            rule: "slurm: a grant naming absent indices means a confined node",
            devices: same,
            cvd: None,
            order: None,
            step: None,
            job: Some("4,5,6,7"),
            expect: &["0", "1", "2", "3"],
        },
    ]
}

fn render(v: &VisibleDevice) -> String {
    match &v.mig_uuid {
        None => v.physical.to_string(),
        Some(mig) => format!("{}/{mig}", v.physical),
    }
}

#[test]
fn every_rule() {
    for row in rows() {
        let env = VisibilityEnv {
            cuda_visible_devices: row.cvd.map(String::from),
            cuda_device_order: row.order.map(String::from),
            slurm_step_gpus: row.step.map(String::from),
            slurm_job_gpus: row.job.map(String::from),
        };
        let visibility = Visibility::resolve(&(row.devices)(), &env);
        let got: Vec<String> = visibility.devices.iter().map(render).collect();
        let matches = got.len() == row.expect.len()
            && got.iter().zip(row.expect).all(|(g, e)| g.starts_with(e));
        assert!(
            matches,
            "rule \"{}\": expected {:?}, got {got:?} (notes: {:?})",
            row.rule, row.expect, visibility.notes
        );
    }
}

#[test]
fn truncation_is_explained() {
    let env = VisibilityEnv {
        cuda_visible_devices: Some("0,2,-1,1".into()),
        ..Default::default()
    };
    let visibility = Visibility::resolve(&same(), &env);
    assert_eq!(visibility.visible_index(2), Some(1));
    assert_eq!(visibility.visible_index(1), None);
    assert_eq!(visibility.notes.len(), 1);
    assert!(
        visibility.notes[0].contains("entry 3 (\"-1\")"),
        "{:?}",
        visibility.notes
    );
}

mod properties {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Whatever the list, the visible devices are distinct devices of the inventory.
        #[test]
        fn visible_devices_are_distinct_and_real(list in "[0-9GPU\\-abcdMI, ]{0,24}") {
            let env = VisibilityEnv { cuda_visible_devices: Some(list), ..Default::default() };
            let visibility = Visibility::resolve(&same(), &env);
            let mut seen = HashSet::new();
            for v in &visibility.devices {
                prop_assert!(v.physical < 4);
                prop_assert!(seen.insert((v.physical, v.mig_uuid.clone())));
            }
        }

        /// A permutation of indices is shown in exactly that order.
        #[test]
        fn index_lists_are_renumbered_in_order(perm in Just(vec![0u32, 1, 2, 3]).prop_shuffle(), n in 0usize..=4) {
            let list: Vec<String> = perm[..n].iter().map(u32::to_string).collect();
            let env = VisibilityEnv { cuda_visible_devices: Some(list.join(",")), ..Default::default() };
            let visibility = Visibility::resolve(&same(), &env);
            let got: Vec<u32> = visibility.devices.iter().map(|v| v.physical).collect();
            prop_assert_eq!(got, perm[..n].to_vec());
        }
    }
}

/// Found by the visibility fuzz target (crates/orch-fuzz). A sim uuid may hold non-ASCII
/// characters, and a prefix could end inside one: slicing there panicked.
#[test]
fn uuid_prefixes_ending_inside_a_character_match_nothing() {
    let devices = vec![
        gpu(0, "GPU-ééééééé", "9.0", 80),
        gpu(1, "GPU-😀😀", "9.0", 80),
    ];
    for list in ["GPU-a", "GPU-xx", "GPU-ab,0", "MIG-GPU-a/1/0"] {
        let env = VisibilityEnv {
            cuda_visible_devices: Some(list.to_string()),
            ..Default::default()
        };
        let visibility = Visibility::resolve(&devices, &env);
        assert!(visibility.devices.is_empty(), "{list}: {visibility:?}");
    }
    let env = VisibilityEnv {
        cuda_visible_devices: Some("GPU-é".to_string()),
        ..Default::default()
    };
    assert_eq!(Visibility::resolve(&devices, &env).devices.len(), 1);
}

/// Found by the visibility fuzz target: a Slurm range was expanded before it was checked, so
/// `SLURM_STEP_GPUS=11-2147483648` built a set of two billion indices (over 10 GB).
#[test]
fn huge_slurm_ranges_cost_no_more_than_the_inventory() {
    for grant in ["11-2147483648", "0-4294967295", "0-3,4294967295"] {
        let env = VisibilityEnv {
            slurm_step_gpus: Some(grant.to_string()),
            ..Default::default()
        };
        let visibility = Visibility::resolve(&same(), &env);
        assert_eq!(visibility.devices.len(), 4, "{grant}: the node confines");
        assert!(
            visibility.notes[0].contains("does not have"),
            "{:?}",
            visibility.notes
        );
    }
    let env = VisibilityEnv {
        slurm_job_gpus: Some("1-2".to_string()),
        ..Default::default()
    };
    let physical: Vec<u32> = Visibility::resolve(&same(), &env)
        .devices
        .iter()
        .map(|v| v.physical)
        .collect();
    assert_eq!(physical, [1, 2]);
}

/// Found by the visibility fuzz target: notes quoted the variables' values as they were, so a
/// line break in one made the note two lines.
#[test]
fn notes_quote_values_on_one_line() {
    let env = VisibilityEnv {
        cuda_visible_devices: Some("0,x\ny".to_string()),
        cuda_device_order: Some("a\nb".to_string()),
        slurm_step_gpus: Some("0,\r".to_string()),
        slurm_job_gpus: None,
    };
    let visibility = Visibility::resolve(&same(), &env);
    assert_eq!(visibility.notes.len(), 2, "{:?}", visibility.notes);
    for note in &visibility.notes {
        assert!(!note.contains(['\n', '\r']), "{note:?}");
    }
    assert!(visibility.notes[0].contains(r#"CUDA_DEVICE_ORDER="a\nb""#));
    assert!(visibility.notes[1].contains(r#"("x\ny")"#));
}
