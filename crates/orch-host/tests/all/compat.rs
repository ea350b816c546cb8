//! Contract versions and per-plugin limits: plugins built for contracts 0.1.0, 0.2.0, 0.3.0
//! and 0.4.0 keep loading and answering beside 0.5.0 ones; what is not a plugin orch loads is refused in one sentence that
//! names what was found and what orch expected; a job's deadline and memory cap apply to its
//! plugin alone.

use crate::common::{builtin, cache_dir, fixture, host, lab, request};
use orch_host::{Limits, PluginError, QueueHost, Version};
use orch_queue::{Job, Machine, Tenant};
use std::path::PathBuf;
use std::time::Duration;

fn wasm(name: &str) -> Vec<u8> {
    std::fs::read(PathBuf::from(orch_host::PLUGIN_WASM_DIR).join(format!("{name}.wasm"))).unwrap()
}

#[test]
fn a_policy_built_for_0_1_0_loads_and_decides_like_its_0_5_0_twin() {
    let mut host = host();
    let old = host.load(&fixture("compat_policy")).unwrap();
    let new = host.load(&builtin("first-fit")).unwrap();
    assert_eq!(host.version(old), Version::V0_1);
    assert_eq!(host.version(new), Version::V0_5);
    for count in 1..=4 {
        let a = host.decide(old, &request(count), &lab(), &[]).unwrap();
        let b = host.decide(new, &request(count), &lab(), &[]).unwrap();
        assert_eq!(a.devices, b.devices, "{count} device(s)");
    }
    assert_eq!(
        host.decide(old, &request(8), &lab(), &[])
            .unwrap_err()
            .to_string(),
        "policy `compat_policy.wasm` found no fit: 8 device(s) needed, 6 fit"
    );
    // Inspection names the version, and says the plugin is of an older one.
    let found =
        orch_host::inspect(&mut host, "compat_policy.wasm", &wasm("compat_policy")).unwrap();
    assert_eq!(found.world, "orch:plugin/policy@0.1.0");
    assert_eq!(found.version, Version::V0_1);
    let note = found.version_note().unwrap();
    assert!(note.contains("built for contract 0.1.0"), "{note}");
    assert!(note.contains("orch still loads and runs it"), "{note}");
}

#[test]
fn a_policy_built_for_0_2_0_loads_and_decides_like_its_0_5_0_twin() {
    let mut host = host();
    let old = host.load(&fixture("compat_policy_0_2")).unwrap();
    let new = host.load(&builtin("first-fit")).unwrap();
    assert_eq!(host.version(old), Version::V0_2);
    for count in 1..=4 {
        let a = host.decide(old, &request(count), &lab(), &[]).unwrap();
        let b = host.decide(new, &request(count), &lab(), &[]).unwrap();
        assert_eq!(a.devices, b.devices, "{count} device(s)");
    }
    let found = orch_host::inspect(
        &mut host,
        "compat_policy_0_2.wasm",
        &wasm("compat_policy_0_2"),
    )
    .unwrap();
    assert_eq!(found.world, "orch:plugin/policy@0.2.0");
    let note = found.version_note().unwrap();
    assert!(note.contains("built for contract 0.2.0"), "{note}");
}

/// A policy built for 0.3.0 (no topology argument) loads and places beside the 0.5.0
/// built-ins, on a machine whose topology the host passes to 0.4.0 and later plugins only.
#[test]
fn a_policy_built_for_0_3_0_loads_and_decides_like_its_0_5_0_twin() {
    let mut host = host();
    let old = host.load(&fixture("compat_policy_0_3")).unwrap();
    let new = host.load(&builtin("first-fit")).unwrap();
    assert_eq!(host.version(old), Version::V0_3);
    assert_eq!(host.version(new), Version::V0_5);
    for count in 1..=4 {
        let a = host.decide(old, &request(count), &lab(), &[]).unwrap();
        let b = host.decide(new, &request(count), &lab(), &[]).unwrap();
        assert_eq!(a.devices, b.devices, "{count} device(s)");
        // With a topology: the 0.3.0 plugin is asked without it, and answers as before.
        let c = host
            .decide_on(
                old,
                &request(count),
                &lab(),
                &[],
                &crate::topology::two_sockets(8),
            )
            .unwrap();
        assert_eq!(c.devices, a.devices, "{count} device(s)");
        assert_eq!(c.reason, "first fit (a 0.3.0 plugin)");
    }
    let found = orch_host::inspect(
        &mut host,
        "compat_policy_0_3.wasm",
        &wasm("compat_policy_0_3"),
    )
    .unwrap();
    assert_eq!(found.world, "orch:plugin/policy@0.3.0");
    let note = found.version_note().unwrap();
    assert!(note.contains("built for contract 0.3.0"), "{note}");
}

/// A policy built for 0.4.0 (a topology without MIG slices) loads and places beside the 0.5.0
/// built-ins: it is asked with the NUMA nodes and links, the slices left out.
#[test]
fn a_policy_built_for_0_4_0_loads_and_decides_like_its_0_5_0_twin() {
    let mut host = host();
    let old = host.load(&fixture("compat_policy_0_4")).unwrap();
    let new = host.load(&builtin("first-fit")).unwrap();
    assert_eq!(host.version(old), Version::V0_4);
    assert_eq!(host.version(new), Version::V0_5);
    let mut topology = crate::topology::two_sockets(8);
    topology.slices = vec![None; 8];
    for count in 1..=4 {
        let a = host
            .decide_on(old, &request(count), &lab(), &[], &topology)
            .unwrap();
        let b = host.decide(new, &request(count), &lab(), &[]).unwrap();
        assert_eq!(a.devices, b.devices, "{count} device(s)");
        assert_eq!(a.reason, "first fit (a 0.4.0 plugin; 8 NUMA node(s) known)");
    }
    assert_eq!(
        host.decide(old, &request(8), &lab(), &[])
            .unwrap_err()
            .to_string(),
        "policy `compat_policy_0_4.wasm` found no fit: 8 device(s) needed, 6 fit"
    );
    let found = orch_host::inspect(
        &mut host,
        "compat_policy_0_4.wasm",
        &wasm("compat_policy_0_4"),
    )
    .unwrap();
    assert_eq!(found.world, "orch:plugin/policy@0.4.0");
    let note = found.version_note().unwrap();
    assert!(note.contains("built for contract 0.4.0"), "{note}");
}

/// `orch plugin inspect` names the contract a trainer implements, and notes an older one.
#[test]
fn inspection_names_each_trainer_s_contract() {
    let mut host = host();
    for (file, world, version) in [
        ("trainer_mlp", "orch:plugin/trainer@0.5.0", Version::V0_5),
        (
            "compat_trainer_mlp_0_4",
            "orch:plugin/trainer@0.4.0",
            Version::V0_4,
        ),
        (
            "compat_trainer_mlp_0_3",
            "orch:plugin/trainer@0.3.0",
            Version::V0_3,
        ),
        (
            "compat_trainer_mlp_0_2",
            "orch:plugin/trainer@0.2.0",
            Version::V0_2,
        ),
        (
            "compat_trainer_mlp",
            "orch:plugin/trainer@0.1.0",
            Version::V0_1,
        ),
    ] {
        let found = orch_host::inspect(&mut host, file, &wasm(file)).unwrap();
        assert_eq!((found.world.as_str(), found.version), (world, version));
        assert_eq!(found.version_note().is_some(), version != Version::V0_5);
    }
    let mlp = orch_host::inspect(&mut host, "mlp", &wasm("trainer_mlp")).unwrap();
    assert!(
        mlp.exports
            .contains(&"instance orch:plugin/inference@0.5.0".to_string()),
        "{:?}",
        mlp.exports
    );
}

#[test]
fn a_queue_policy_built_for_0_1_0_still_orders() {
    let mut host = QueueHost::with_cache_dir(Limits::queue_default(), Some(cache_dir())).unwrap();
    let id = host.load(&fixture("compat_queue")).unwrap();
    assert_eq!(host.version(id), Version::V0_1);
    let tenant = Tenant {
        name: "a".into(),
        share: 1.0,
        normalized_share: 1.0,
        usage_gpu_s: 0.0,
        normalized_usage: 0.0,
        fair_share: 1.0,
        gpus_held: 0,
        max_gpus: None,
        queued: 3,
        running: 0,
    };
    let jobs: Vec<Job> = (1..=3)
        .map(|id| Job {
            id,
            tenant: 0,
            name: format!("j{id}"),
            tags: vec![],
            gpus: 1,
            priority: 0,
            age_s: 10.0,
            runtime_s: None,
            preemptible: false,
        })
        .collect();
    let machine = Machine {
        free_gpus: 8,
        total_gpus: 8,
    };
    let order = host.order(id, &jobs, &[tenant], &machine).unwrap();
    let ids: Vec<u64> = order.iter().map(|r| r.job).collect();
    assert_eq!(ids, vec![3, 2, 1], "newest first, as the plugin says");
}

#[test]
fn a_component_importing_what_orch_does_not_provide_is_refused_naming_both() {
    let mut host = host();
    let err = host.load(&fixture("hostile_foreign_import")).unwrap_err();
    assert!(matches!(err, PluginError::Load { .. }), "{err:?}");
    assert!(err.is_bad_input());
    let text = err.to_string();
    assert!(
        text.starts_with("policy plugin `hostile_foreign_import.wasm` cannot be loaded: it implements orch:plugin/policy@0.5.0 but imports what orch does not provide"),
        "{text}"
    );
    assert!(text.contains("fixture:spy/network"), "{text}");
}

#[test]
fn a_future_contract_and_a_core_module_are_refused_in_one_sentence() {
    let mut host = host();
    let err = host
        .load_bytes("core.wasm", b"\0asm\x01\0\0\0")
        .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("a core WebAssembly module, not a component"),
        "{text}"
    );
    assert!(text.contains("orch:plugin/policy@0.5.0"), "{text}");
    assert!(text.contains("componentize-py"), "{text}");
    assert!(!text.contains('\n'));
}

#[test]
fn a_jobs_deadline_and_memory_apply_to_its_plugin_alone() {
    let mut host = host();
    let tight = Limits {
        deadline: Duration::from_millis(30),
        ..Limits::default()
    };
    let spin_tight = host
        .load_with_limits(&fixture("hostile_spin"), &tight)
        .unwrap();
    let spin_default = host.load(&fixture("hostile_spin")).unwrap();
    assert_ne!(spin_tight, spin_default, "other limits, another instance");
    assert_eq!(
        host.plugin_limits(spin_tight).deadline,
        Duration::from_millis(30)
    );
    // The message names the plugin's own 30 ms, not the host's 100 ms.
    let err = host
        .decide(spin_tight, &request(1), &lab(), &[])
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "policy plugin `hostile_spin.wasm` did not answer within its deadline of 30 ms and was \
         stopped; if it needs longer, set `deadline` in [policy] of the job file"
    );

    let small = Limits {
        memory_bytes: 24 << 20,
        deadline: Duration::from_secs(5),
        ..Limits::default()
    };
    let bomb = host
        .load_with_limits(&fixture("hostile_memory_bomb"), &small)
        .unwrap();
    let err = host.decide(bomb, &request(1), &lab(), &[]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "policy plugin `hostile_memory_bomb.wasm` went over its memory limit of 24 MiB (all its \
         memories together) and was stopped; if it needs more, set `memory` in [policy] of the \
         job file"
    );
    // A plugin with more room than the host's default gets it: the pool holds any wasm32
    // memory, each store caps its own.
    let roomy = Limits {
        memory_bytes: 256 << 20,
        deadline: Duration::from_secs(10),
        ..Limits::default()
    };
    let bomb = host
        .load_with_limits(&fixture("hostile_memory_bomb"), &roomy)
        .unwrap();
    let err = host.decide(bomb, &request(1), &lab(), &[]).unwrap_err();
    assert!(err.to_string().contains("memory limit of 256 MiB"), "{err}");
    // The host carries on.
    let good = host.load(&builtin("first-fit")).unwrap();
    assert!(host.decide(good, &request(1), &lab(), &[]).is_ok());
}

/// A daemon whose jobs give one plugin many different limits keeps a bounded number of warm
/// instances: the pool (64 instances) never runs out.
#[test]
fn many_different_limits_do_not_exhaust_the_instance_pool() {
    let mut host = host();
    // Deadlines of a second and more: what is checked is the pool, not how fast a loaded
    // machine instantiates (a 100 ms deadline missed its first call with the suite in parallel).
    for ms in 0..80u64 {
        let limits = Limits {
            deadline: Duration::from_millis(1000 + ms),
            ..Limits::default()
        };
        let id = host
            .load_with_limits(&builtin("first-fit"), &limits)
            .unwrap();
        let decision = host.decide(id, &request(1), &lab(), &[]);
        assert!(decision.is_ok(), "limits #{ms}: {decision:?}");
    }
}
