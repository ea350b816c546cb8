//! The built-in policies through the host: choices, typed refusals, leases, warm reuse.

use crate::common::{builtin, host, lab, request};
use orch_host::types::Lease;
use orch_host::{BUILTINS, PluginError};

#[test]
fn every_builtin_answers_on_the_lab() {
    let mut host = host();
    let expected = [
        ("least-loaded", vec![1, 4]),
        ("most-free-memory", vec![1, 4]),
        ("pack", vec![6, 2]),
        ("spread", vec![1, 4]),
        ("first-fit", vec![1, 2]),
    ];
    for (name, devices) in expected {
        let id = host.load(&builtin(name)).unwrap();
        let decision = host.decide(id, &request(2), &lab(), &[]).unwrap();
        assert_eq!(decision.devices, devices, "{name}: {}", decision.reason);
        assert!(!decision.reason.is_empty());
        // Warm again: the same answer from the reused instance.
        assert_eq!(
            host.decide(id, &request(2), &lab(), &[]).unwrap().devices,
            devices
        );
    }
    assert_eq!(BUILTINS.len(), 7);
}

#[test]
fn refusals_are_typed() {
    let mut host = host();
    let id = host.load(&builtin("least-loaded")).unwrap();
    let err = host.decide(id, &request(7), &lab(), &[]).unwrap_err();
    assert!(matches!(err, PluginError::NoFit { .. }), "{err:?}");
    assert!(!err.is_bad_input());
    assert!(
        err.to_string()
            .contains("7 device(s) needed, 6 of 8 candidate(s) fit"),
        "{err}"
    );
    // A refusal keeps the instance: the next decision is served.
    assert!(host.decide(id, &request(1), &lab(), &[]).is_ok());

    let explicit = host.load(&builtin("explicit")).unwrap();
    let err = host.decide(explicit, &request(1), &lab(), &[]).unwrap_err();
    assert!(matches!(err, PluginError::BadConfig { .. }), "{err:?}");
    assert!(err.is_bad_input());
    let mut req = request(1);
    req.config.push(("devices".into(), "zero".into()));
    let err = host.decide(explicit, &req, &lab(), &[]).unwrap_err();
    assert!(
        err.to_string()
            .contains("neither a CUDA index nor a GPU-/MIG- uuid"),
        "{err}"
    );
}

#[test]
fn policies_respect_leases_they_are_shown() {
    let mut host = host();
    let candidates = lab();
    let leases = vec![Lease {
        device: 1,
        job_name: "other".into(),
        exclusive: false,
        memory_reserved: 0,
    }];
    let mut req = request(2);
    let id = host.load(&builtin("least-loaded")).unwrap();
    // Exclusive request: the shared GPU 1 is out.
    assert_eq!(
        host.decide(id, &req, &candidates, &leases).unwrap().devices,
        vec![4, 7]
    );
    req.exclusive = false;
    assert_eq!(
        host.decide(id, &req, &candidates, &leases).unwrap().devices,
        vec![1, 4]
    );
    // Spread counts the lease as a job on the device.
    let spread = host.load(&builtin("spread")).unwrap();
    assert_eq!(
        host.decide(spread, &req, &candidates, &leases)
            .unwrap()
            .devices,
        vec![4, 7]
    );
}

#[test]
fn unknown_builtins_list_the_real_ones() {
    let err = host().load(&builtin("fastest")).unwrap_err();
    assert!(err.is_bad_input());
    assert!(
        err.to_string()
            .contains("least-loaded, most-free-memory, pack, spread, first-fit, explicit, env"),
        "{err}"
    );
}
