//! The queue host: the built-ins answer exactly as `orch_queue` does natively, hostile queue
//! policies are contained, components of the wrong world are refused, files load by path, and
//! the example `examples/queue/deadline-first` builds with cargo and orders a queue.

use crate::common::{cache_dir, fixture};
use orch_host::{
    Limits, PluginError, PluginKind, PluginRef, PolicyHost, QUEUE_BUILTINS, QueueHost,
    QueuePluginId,
};
use orch_queue::{Job, Machine, Ranked, Tenant, TenantInput};
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::test_runner::{Config as ProptestConfig, TestRunner};
use std::cell::RefCell;
use std::path::PathBuf;
use std::time::{Duration, Instant};

fn host() -> QueueHost {
    QueueHost::with_cache_dir(Limits::queue_default(), Some(cache_dir())).expect("queue host")
}

/// A host whose deadline is long enough that only the memory cap or the work can stop a call.
fn patient_host() -> QueueHost {
    let limits = Limits {
        deadline: Duration::from_secs(20),
        ..Limits::queue_default()
    };
    QueueHost::with_cache_dir(limits, Some(cache_dir())).expect("queue host")
}

fn builtin(name: &str) -> PluginRef {
    PluginRef::Builtin(name.into())
}

fn job(id: u64, tenant: u32, priority: i64, age_s: f64) -> Job {
    Job {
        id,
        tenant,
        name: format!("job-{id}"),
        tags: vec![],
        gpus: 1,
        priority,
        age_s,
        runtime_s: None,
        preemptible: false,
    }
}

fn tenants(usage: &[(&str, f64, f64)]) -> Vec<Tenant> {
    let inputs: Vec<TenantInput> = usage
        .iter()
        .map(|&(name, share, usage_gpu_s)| TenantInput {
            name: name.into(),
            share,
            usage_gpu_s,
            gpus_held: 0,
            max_gpus: None,
            queued: 0,
            running: 0,
        })
        .collect();
    Tenant::all(&inputs)
}

const MACHINE: Machine = Machine {
    free_gpus: 4,
    total_gpus: 8,
};

/// A small queue: vision over its share, nlp under it.
fn small_queue() -> (Vec<Job>, Vec<Tenant>) {
    let tenants = tenants(&[("vision", 1.0, 62.0), ("nlp", 1.0, 38.0)]);
    let jobs = vec![
        job(1, 0, 5, 100.0),
        job(2, 1, 0, 10.0),
        job(3, 1, 1, 5.0),
        job(4, 1, 1, 50.0),
    ];
    (jobs, tenants)
}

fn ids(ranked: &[Ranked]) -> Vec<u64> {
    ranked.iter().map(|r| r.job).collect()
}

/// A tenant of a random queue: shares of 0 included, some with no usage.
fn tenant_input() -> impl Strategy<Value = TenantInput> {
    (
        0u32..4,
        prop_oneof![Just(0.0), 0.0..100_000.0f64],
        0u32..8,
        proptest::option::of(0u32..8),
        0u32..50,
        0u32..8,
    )
        .prop_map(
            |(share, usage_gpu_s, gpus_held, max_gpus, queued, running)| TenantInput {
                name: format!("tenant-{share}-{gpus_held}"),
                share: f64::from(share),
                usage_gpu_s,
                gpus_held,
                max_gpus,
                queued,
                running,
            },
        )
}

/// A job of a random queue, but for its id: (id step, tenant seed, tags, gpus, priority, age,
/// runtime, preemptible). Ages and priorities come from small sets, so ties are common.
type JobParts = (u64, usize, usize, u32, i64, u32, Option<u32>, bool);

fn job_parts() -> impl Strategy<Value = JobParts> {
    (
        1u64..4,
        0usize..64,
        0usize..3,
        1u32..5,
        -2i64..3,
        0u32..20,
        proptest::option::of(0u32..86_400),
        any::<bool>(),
    )
}

/// A queue of up to 40 jobs over 1-6 tenants, and a machine.
fn random_queue() -> impl Strategy<Value = (Vec<Job>, Vec<Tenant>, Machine)> {
    (
        vec(tenant_input(), 1..=6),
        vec(job_parts(), 0..=40),
        0u64..1000,
        1u32..9,
        0u32..9,
    )
        .prop_map(|(inputs, parts, first_id, total_gpus, free)| {
            let tenants = Tenant::all(&inputs);
            let mut id = first_id;
            let jobs = parts
                .into_iter()
                .map(
                    |(step, tenant, tags, gpus, priority, age, runtime, preemptible)| {
                        id += step;
                        Job {
                            id,
                            tenant: (tenant % tenants.len()) as u32,
                            name: format!("run-{id}"),
                            tags: (0..tags).map(|t| format!("tag{t}")).collect(),
                            gpus,
                            priority,
                            age_s: f64::from(age) * 30.0,
                            runtime_s: runtime.map(f64::from),
                            preemptible,
                        }
                    },
                )
                .collect();
            let machine = Machine {
                free_gpus: free.min(total_gpus),
                total_gpus,
            };
            (jobs, tenants, machine)
        })
}

/// The property: on any queue, each built-in answers exactly what its native order does (its
/// reasons cleaned as the host cleans them).
#[test]
fn the_builtins_give_the_native_order_on_random_queues() {
    let host = RefCell::new(host());
    assert_eq!(QUEUE_BUILTINS.len(), 3);
    let builtins: Vec<(QueuePluginId, orch_queue::Order)> = QUEUE_BUILTINS
        .iter()
        .map(|&(name, _)| {
            let id = host
                .borrow_mut()
                .load(&builtin(name))
                .expect("built-in loads");
            assert_eq!(host.borrow().name(id), name);
            (id, orch_queue::builtin(name).expect("a native order"))
        })
        .collect();
    let mut runner = TestRunner::new(ProptestConfig::with_cases(300));
    let outcome = runner.run(&random_queue(), |(jobs, tenants, machine)| {
        for &(id, native) in &builtins {
            let expected: Vec<Ranked> = native(&jobs, &tenants, &machine)
                .into_iter()
                .map(|r| Ranked {
                    job: r.job,
                    reason: orch_queue::clean_reason(&r.reason),
                })
                .collect();
            let answer = host.borrow_mut().order(id, &jobs, &tenants, &machine);
            let name = host.borrow().name(id).to_string();
            prop_assert_eq!(answer.map_err(|e| e.to_string()), Ok(expected), "{}", name);
        }
        Ok(())
    });
    if let Err(failure) = outcome {
        panic!("{failure}");
    }
}

#[test]
fn fair_share_explains_itself() {
    let mut host = host();
    let id = host.load(&builtin("fair-share")).unwrap();
    let (jobs, tenants) = small_queue();
    let ranked = host.order(id, &jobs, &tenants, &MACHINE).unwrap();
    assert_eq!(ids(&ranked), vec![4, 3, 2, 1]);
    assert!(
        ranked[3]
            .reason
            .starts_with("tenant vision is over its share: 62% used of 50%"),
        "{}",
        ranked[3].reason
    );
    // Loading again gives the same plugin; an empty queue is an empty order.
    assert_eq!(host.load(&builtin("fair-share")).unwrap(), id);
    assert!(host.order(id, &[], &tenants, &MACHINE).unwrap().is_empty());
}

#[test]
fn a_queue_of_ten_thousand_jobs_fits_in_the_limits() {
    // The memory cap and the work, not the clock of a debug build: the bench times it.
    let mut host = patient_host();
    let id = host.load(&builtin("fair-share")).unwrap();
    let names: Vec<String> = (0..50).map(|i| format!("lab-{i}")).collect();
    let usage: Vec<(&str, f64, f64)> = names
        .iter()
        .enumerate()
        .map(|(i, n)| (n.as_str(), 1.0 + (i % 3) as f64, (i * 3600) as f64))
        .collect();
    let tenants = tenants(&usage);
    let jobs: Vec<Job> = (0..10_000)
        .map(|i| {
            let mut j = job(i, (i % 50) as u32, (i % 7) as i64, (10_000 - i) as f64);
            j.tags = vec!["sweep".into(), format!("seed-{}", i % 10)];
            j
        })
        .collect();
    let ranked = host.order(id, &jobs, &tenants, &MACHINE).unwrap();
    assert_eq!(ranked.len(), jobs.len());
    let native = orch_queue::fair_share(&jobs, &tenants, &MACHINE);
    assert_eq!(ids(&ranked), ids(&native));
}

/// Runs fixture `name` once, expects an error naming it and saying `words`, then checks that a
/// good plugin still answers and that the fixture, called again on a fresh instance, fails the
/// same way.
fn contained(host: &mut QueueHost, name: &str, words: &[&str]) -> PluginError {
    let (jobs, tenants) = small_queue();
    let id = host.load(&fixture(name)).expect("fixture loads");
    let started = Instant::now();
    let err = host
        .order(id, &jobs, &tenants, &MACHINE)
        .expect_err("a hostile queue policy must not succeed");
    let elapsed = started.elapsed();
    let text = err.to_string();
    assert!(
        text.starts_with(&format!("queue policy `{name}.wasm`")),
        "{text} should name the plugin"
    );
    for w in words {
        assert!(text.contains(w), "{text} should say {w}");
    }
    // The deadline counts the plugin's CPU time, so on a loaded machine the call may take
    // longer in wall time than the deadline, up to the wall-clock backstop.
    assert!(
        elapsed < orch_host::wall_backstop(host.limits().deadline) + Duration::from_secs(1),
        "{name} took {elapsed:?}"
    );
    assert!(!err.is_bad_input());
    let good = host.load(&builtin("fifo")).expect("built-in loads");
    let order = host
        .order(good, &jobs, &tenants, &MACHINE)
        .expect("a good plugin answers");
    assert_eq!(ids(&order), vec![1, 2, 3, 4]);
    let again = host
        .order(id, &jobs, &tenants, &MACHINE)
        .expect_err("still hostile");
    assert_eq!(std::mem::discriminant(&again), std::mem::discriminant(&err));
    err
}

#[test]
fn an_infinite_loop_is_stopped_at_the_deadline() {
    let mut host = host();
    let deadline = host.limits().deadline;
    let started = Instant::now();
    let err = contained(
        &mut host,
        "hostile_queue_spin",
        &[&format!("deadline of {} ms", deadline.as_millis())],
    );
    assert!(matches!(err, PluginError::Timeout { .. }), "{err:?}");
    assert!(started.elapsed() >= deadline * 2, "two timeouts");
}

#[test]
fn a_memory_bomb_hits_the_memory_limit() {
    // The memory cap, not the clock, must stop the bomb on a loaded machine.
    let mut host = patient_host();
    let cap = format!("memory limit of {} MiB", host.limits().memory_bytes >> 20);
    let err = contained(&mut host, "hostile_queue_memory_bomb", &[&cap]);
    assert!(matches!(err, PluginError::MemoryLimit { .. }), "{err:?}");
}

#[test]
fn a_panic_is_reported_with_its_message() {
    let err = contained(
        &mut host(),
        "hostile_queue_trap",
        &["crashed", "queue policy bug: 4 jobs and no idea what to do"],
    );
    assert!(matches!(err, PluginError::Crashed { .. }), "{err:?}");
}

#[test]
fn wrong_answers_are_rejected() {
    let mut host = host();
    let cases = [
        (
            "hostile_queue_wrong_ids",
            "it named job 1004, which is not in the queue it was given",
        ),
        ("hostile_queue_duplicates", "it named job 1 twice"),
    ];
    for (name, words) in cases {
        let err = contained(&mut host, name, &["gave a wrong answer", words]);
        assert!(
            matches!(
                err,
                PluginError::WrongAnswer {
                    kind: PluginKind::Queue,
                    ..
                }
            ),
            "{err:?}"
        );
    }
}

#[test]
fn an_error_value_is_passed_on_cleaned_and_the_instance_kept() {
    let mut host = host();
    let (jobs, tenants) = small_queue();
    let id = host.load(&fixture("hostile_queue_refuses")).unwrap();
    for _ in 0..2 {
        let err = host.order(id, &jobs, &tenants, &MACHINE).unwrap_err();
        assert!(matches!(err, PluginError::QueueRefused { .. }), "{err:?}");
        assert_eq!(
            err.to_string(),
            "queue policy `hostile_queue_refuses.wasm` could not order the queue: \
             cannot order 4 jobs: [31m the moon is in the wrong phase"
        );
        assert!(!err.is_bad_input());
    }
}

#[test]
fn a_placement_policy_is_refused_as_a_queue_policy_and_back() {
    let mut host = host();
    let err = host.load(&fixture("least_loaded")).unwrap_err();
    assert!(matches!(err, PluginError::WrongWorld { .. }), "{err:?}");
    assert!(err.is_bad_input());
    assert_eq!(
        err.to_string(),
        "`least_loaded.wasm` is not a queue policy orch can load: it implements \
         orch:plugin/policy@0.5.0, and orch expected orch:plugin/queue@0.5.0 (or 0.4.0, 0.3.0, 0.2.0, 0.1.0)"
    );
    // The host carries on.
    let (jobs, tenants) = small_queue();
    let fifo = host.load(&builtin("fifo")).unwrap();
    assert!(host.order(fifo, &jobs, &tenants, &MACHINE).is_ok());

    let mut policies = PolicyHost::with_cache_dir(Limits::default(), Some(cache_dir())).unwrap();
    let err = policies.load(&fixture("queue_fifo")).unwrap_err();
    assert_eq!(
        err.to_string(),
        "`queue_fifo.wasm` is not a policy orch can load: it implements \
         orch:plugin/queue@0.5.0, and orch expected orch:plugin/policy@0.5.0 (or 0.4.0, 0.3.0, 0.2.0, 0.1.0)"
    );
    let err = host.load(&fixture("hostile-other-world")).unwrap_err();
    assert!(
        err.to_string()
            .contains("which exports the instance `orch:plugin/queue-order@0.5.0` (0.1.0: the function `order`)"),
        "{err}"
    );
}

#[test]
fn inspect_names_the_queue_world() {
    let mut policies = PolicyHost::with_cache_dir(Limits::default(), Some(cache_dir())).unwrap();
    let file = PathBuf::from(orch_host::PLUGIN_WASM_DIR).join("queue_fair_share.wasm");
    let wasm = std::fs::read(&file).unwrap();
    let found = orch_host::inspect(&mut policies, "queue_fair_share.wasm", &wasm).unwrap();
    assert_eq!(found.world, "orch:plugin/queue@0.5.0");
    assert_eq!(found.version_note(), None);
    assert!(
        found
            .exports
            .contains(&"instance orch:plugin/queue-order@0.5.0".to_string()),
        "{found:?}"
    );
}

#[test]
fn unknown_builtins_and_missing_files_are_one_sentence() {
    let mut host = host();
    let err = host.load(&builtin("shortest-first")).unwrap_err();
    assert!(err.is_bad_input());
    assert_eq!(
        err.to_string(),
        "unknown built-in queue policy `shortest-first`: the built-ins are fair-share, fifo, \
         priority; or give a path to a .wasm component"
    );
    let err = host
        .load(&PluginRef::Path("/nonexistent/order.wasm".into()))
        .unwrap_err();
    assert!(err.is_bad_input());
    assert!(
        err.to_string()
            .starts_with("cannot read queue policy /nonexistent/order.wasm: "),
        "{err}"
    );
    let err = host.load_bytes("odd.wasm", b"\0asm\x01\0\0\0").unwrap_err();
    assert_eq!(
        err.to_string(),
        "`odd.wasm` is not a WebAssembly component (a core WebAssembly module, not a \
         component); orch loads components of world orch:plugin/queue@0.5.0: build a queue \
         policy with `cargo build --target wasm32-wasip2` (Rust), `componentize-py` (Python) \
         or `jco componentize` (JavaScript) against orch's wit/, as docs/PLUGINS.md shows"
    );
}

#[test]
fn a_wasm_file_loads_by_path_and_by_bytes() {
    let mut host = host();
    let file = PathBuf::from(orch_host::PLUGIN_WASM_DIR).join("queue_priority.wasm");
    let by_path = host.load(&PluginRef::Path(file.clone())).unwrap();
    assert_eq!(host.name(by_path), "queue_priority.wasm");
    let by_bytes = host
        .load_bytes("mine", &std::fs::read(&file).unwrap())
        .unwrap();
    assert_eq!(host.name(by_bytes), "mine");
    let (jobs, tenants) = small_queue();
    for id in [by_path, by_bytes] {
        let ranked = host.order(id, &jobs, &tenants, &MACHINE).unwrap();
        assert_eq!(ids(&ranked), vec![1, 4, 3, 2]);
        assert_eq!(ranked[0].reason, "priority 5");
        // A fresh instance answers the same.
        host.discard_instance(id);
        assert_eq!(host.order(id, &jobs, &tenants, &MACHINE).unwrap(), ranked);
    }
}

/// Builds examples/queue/deadline-first with cargo alone, as a user would, and orders a queue
/// with it by path.
#[test]
fn the_example_builds_with_cargo_and_puts_deadlines_first() {
    let example =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/queue/deadline-first");
    let target = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("deadline-first-target");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
    let built = std::process::Command::new(cargo)
        .args([
            "build",
            "--release",
            "--target",
            "wasm32-wasip2",
            "--target-dir",
        ])
        .arg(&target)
        .current_dir(&example)
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .output()
        .expect("cargo runs");
    assert!(
        built.status.success(),
        "{}",
        String::from_utf8_lossy(&built.stderr)
    );
    let wasm = target.join("wasm32-wasip2/release/deadline_first.wasm");
    let mut host = host();
    let id: QueuePluginId = host.load(&PluginRef::Path(wasm)).unwrap();
    assert_eq!(host.name(id), "deadline_first.wasm");

    let (mut jobs, tenants) = small_queue();
    // Two deadline jobs, one per tenant: the older first, whatever the tenants' shares.
    jobs.push(Job {
        tags: vec!["paper-deadline".into()],
        ..job(5, 0, 0, 20.0)
    });
    jobs.push(Job {
        tags: vec!["ablation".into(), "paper-deadline".into()],
        ..job(6, 1, 9, 3.0)
    });
    let ranked = host.order(id, &jobs, &tenants, &MACHINE).unwrap();
    // Then fair share: nlp (under its share) before vision, priority, then age.
    assert_eq!(ids(&ranked), vec![5, 6, 4, 3, 2, 1]);
    assert!(ranked[0].reason.contains("paper-deadline"), "{ranked:?}");
    assert!(ranked[5].reason.contains("vision"), "{ranked:?}");
}
