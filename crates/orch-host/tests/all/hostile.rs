//! Every hostile fixture is stopped with an error naming it, within its deadline, and the same
//! host then serves the next decision with a good plugin.

use crate::common::{builtin, fixture, host, lab, request};
use orch_host::{Limits, PluginError, PolicyHost};
use std::time::{Duration, Instant};

/// Runs `name` once, expects an error saying `words`, then checks a good plugin still answers.
fn contained(host: &mut PolicyHost, name: &str, words: &[&str]) -> PluginError {
    let id = host.load(&fixture(name)).expect("fixture loads");
    let started = Instant::now();
    let err = host
        .decide(id, &request(2), &lab(), &[])
        .expect_err("a hostile plugin must not succeed");
    let elapsed = started.elapsed();
    let text = err.to_string();
    assert!(
        text.contains(&format!("{name}.wasm")),
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
    let good = host.load(&builtin("least-loaded")).expect("built-in loads");
    let decision = host
        .decide(good, &request(2), &lab(), &[])
        .expect("good plugin answers");
    assert_eq!(decision.devices, vec![1, 4]);
    // The hostile plugin again: a fresh instance, the same containment.
    let again = host
        .decide(id, &request(2), &lab(), &[])
        .expect_err("still hostile");
    assert_eq!(std::mem::discriminant(&again), std::mem::discriminant(&err));
    err
}

#[test]
fn an_infinite_loop_is_stopped_at_the_deadline() {
    let mut host = host();
    let started = Instant::now();
    let err = contained(&mut host, "hostile_spin", &["deadline of 100 ms"]);
    assert!(matches!(err, PluginError::Timeout { .. }), "{err:?}");
    assert!(
        started.elapsed() >= Duration::from_millis(190),
        "two timeouts take 2 x 100 ms"
    );
    assert!(!err.is_bad_input());
}

#[test]
fn the_deadline_is_configurable() {
    // Longer than the 100 ms default: the spin must run at least this long before it is stopped.
    // (A lower bound holds on a loaded machine; an upper bound on a short deadline would not.)
    let limits = Limits {
        deadline: Duration::from_millis(250),
        ..Limits::default()
    };
    let mut host = PolicyHost::with_cache_dir(limits, Some(crate::common::cache_dir())).unwrap();
    let id = host.load(&fixture("hostile_spin")).unwrap();
    let started = Instant::now();
    let err = host.decide(id, &request(1), &lab(), &[]).unwrap_err();
    assert!(err.to_string().contains("deadline of 250 ms"), "{err}");
    assert!(
        started.elapsed() >= Duration::from_millis(245),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn a_memory_bomb_hits_the_memory_limit() {
    // Filling 64 MiB can take longer than the default 100 ms on a loaded machine; a longer
    // deadline makes sure it is the memory cap, not the clock, that stops the bomb.
    let limits = Limits {
        deadline: Duration::from_secs(5),
        ..Limits::default()
    };
    let mut host = PolicyHost::with_cache_dir(limits, Some(crate::common::cache_dir())).unwrap();
    let err = contained(
        &mut host,
        "hostile_memory_bomb",
        &["memory limit of 64 MiB"],
    );
    assert!(matches!(err, PluginError::MemoryLimit { .. }), "{err:?}");
}

#[test]
fn deep_recursion_crashes_cleanly() {
    let err = contained(&mut host(), "hostile_recursion", &["crashed", "stack"]);
    assert!(matches!(err, PluginError::Crashed { .. }), "{err:?}");
}

#[test]
fn a_panic_is_reported_with_its_message() {
    let err = contained(
        &mut host(),
        "hostile_panic",
        &["crashed", "policy bug: 8 candidates and no idea what to do"],
    );
    assert!(matches!(err, PluginError::Crashed { .. }), "{err:?}");
}

#[test]
fn wrong_answers_are_rejected() {
    let mut host = host();
    let cases = [
        ("hostile_out_of_range", "device 99, which was not offered"),
        ("hostile_duplicate", "twice"),
        ("hostile_wrong_count", "3 device(s) for a request of 2"),
        (
            "hostile_ignores_bounds",
            "does not meet the request: 9.0 GiB free < 10.0 GiB requested",
        ),
    ];
    for (name, words) in cases {
        let err = contained(&mut host, name, &["wrong answer", words]);
        assert!(matches!(err, PluginError::WrongAnswer { .. }), "{err:?}");
    }
}

#[test]
fn files_environment_and_clock_are_not_granted() {
    let mut host = host();
    let err = contained(
        &mut host,
        "hostile_read_file",
        &["crashed", "reading /etc/passwd"],
    );
    assert!(!err.to_string().contains("root:"), "{err}");
    contained(
        &mut host,
        "hostile_read_env",
        &["crashed", "reading HOME", "NotPresent"],
    );
    let err = contained(
        &mut host,
        "hostile_read_clock",
        &["tried to read the clock"],
    );
    assert!(matches!(err, PluginError::Denied { .. }), "{err:?}");
}

#[test]
fn a_component_of_another_world_is_refused_at_load() {
    let mut host = host();
    let err = host.load(&fixture("hostile-other-world")).unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, PluginError::WrongWorld { .. }), "{err:?}");
    assert!(
        text.contains("`hostile-other-world.wasm` is not a policy orch can load: it exports `wasi:cli/run@0.2.0` (an instance), and orch expected orch:plugin/policy@0.5.0"),
        "{text}"
    );
    assert!(text.contains("wasi:cli/run"), "{text}");
    assert!(err.is_bad_input());
    let good = host.load(&builtin("first-fit")).unwrap();
    assert!(host.decide(good, &request(1), &lab(), &[]).is_ok());
}

#[test]
fn what_is_not_a_component_is_refused() {
    let mut host = host();
    let cases: [(&[u8], &str); 3] = [
        (b"hello", "not a WebAssembly file"),
        (
            b"\0asm\x01\0\0\0",
            "a core WebAssembly module, not a component",
        ),
        (b"\0asm\x0d\0\x01\0garbage", "does not validate"),
    ];
    for (bytes, words) in cases {
        let err = host.load_bytes("odd.wasm", bytes).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("`odd.wasm` is not a WebAssembly component"),
            "{text}"
        );
        assert!(text.contains(words), "{text}");
    }
}

/// Random numbers are the sandbox's, from a fixed seed: two fresh instances given the same
/// arguments answer the same, whatever the host's own randomness.
#[test]
fn random_numbers_repeat_from_instance_to_instance() {
    let answer = || {
        let mut host = host();
        let id = host.load(&fixture("hostile_random")).unwrap();
        host.decide(id, &request(1), &lab(), &[]).unwrap()
    };
    let (a, b) = (answer(), answer());
    assert!(a.reason.starts_with("drew "), "{}", a.reason);
    assert_eq!(a.reason, b.reason);
    assert_eq!(a.devices, b.devices);
    let mut host = host();
    let id = host.load(&fixture("hostile_random")).unwrap();
    let first = host.decide(id, &request(1), &lab(), &[]).unwrap();
    host.discard_instance(id);
    let again = host.decide(id, &request(1), &lab(), &[]).unwrap();
    assert_eq!(
        first.reason, again.reason,
        "a fresh instance starts the sequence again"
    );
}
