//! The built-in policies on machines whose topology the host knows: every ranking built-in
//! chooses a multi-GPU set by the shared rule (one NUMA node where it fits, most NVLinks,
//! closest PCIe path, then its own order) and says which part decided; lists and single
//! devices are as before.

use crate::common::{builtin, host, lab, request};
use orch_host::types::{Link, PcieLevel, Topology};

/// GPUs 0-3 on NUMA node 0, 4-7 on node 1 (of `n`); pairs (0,1), (2,3), (4,5), (6,7) NVLinked
/// (NV4), the others over PCIe (`NODE` within a node, `SYS` across).
pub fn two_sockets(n: u32) -> Topology {
    let node = |i: u32| i / 4;
    let mut links = Vec::new();
    for a in 0..n {
        for b in a + 1..n {
            let paired = a / 2 == b / 2;
            links.push(Link {
                a,
                b,
                nvlinks: if paired { 4 } else { 0 },
                pcie: Some(if node(a) == node(b) {
                    PcieLevel::Node
                } else {
                    PcieLevel::Sys
                }),
            });
        }
    }
    Topology {
        numa_nodes: (0..n).map(|i| Some(node(i))).collect(),
        links,
        slices: Vec::new(),
    }
}

/// An HGX box: 0-3 on node 0, 4-7 on node 1, every pair NV18.
fn hgx() -> Topology {
    let mut links = Vec::new();
    for a in 0..8 {
        for b in a + 1..8 {
            links.push(Link {
                a,
                b,
                nvlinks: 18,
                pcie: Some(PcieLevel::Sys),
            });
        }
    }
    Topology {
        numa_nodes: (0..8).map(|i| Some(i / 4)).collect(),
        links,
        slices: Vec::new(),
    }
}

#[test]
fn every_ranking_builtin_keeps_a_pair_on_one_node_and_nvlinked() {
    let mut host = host();
    // On the lab, GPUs 0 and 3 lack memory; without topology least-loaded takes 1 and 4
    // (across the sockets) and first-fit 1 and 2 (one node, no NVLink).
    let expected = [
        ("least-loaded", vec![4, 5], "the NUMA node decided"),
        ("most-free-memory", vec![4, 5], "the NUMA node decided"),
        ("pack", vec![6, 7], "the NUMA node decided"),
        ("spread", vec![4, 5], "the NUMA node decided"),
        ("first-fit", vec![4, 5], "the most NVLinks decided"),
    ];
    for (name, devices, decided) in expected {
        let id = host.load(&builtin(name)).unwrap();
        let decision = host
            .decide_on(id, &request(2), &lab(), &[], &two_sockets(8))
            .unwrap();
        assert_eq!(decision.devices, devices, "{name}: {}", decision.reason);
        let lead = format!(
            "GPUs {},{}: one NUMA node (1), NV4 ({decided}); ",
            devices[0], devices[1]
        );
        assert!(
            decision.reason.starts_with(&lead),
            "{name}: {}",
            decision.reason
        );
        // The same machine without topology: the old answer, the old words.
        let flat = host.decide(id, &request(2), &lab(), &[]).unwrap();
        assert!(!flat.reason.contains("NUMA"), "{name}: {}", flat.reason);
    }
}

#[test]
fn on_an_hgx_box_the_policy_s_own_order_decides_within_a_socket() {
    let mut host = host();
    let id = host.load(&builtin("least-loaded")).unwrap();
    // Every pair is NV18: the socket decides, then least-loaded's order (4 at 0%, 7 at 3%).
    let decision = host
        .decide_on(id, &request(2), &lab(), &[], &hgx())
        .unwrap();
    assert_eq!(decision.devices, vec![4, 7], "{}", decision.reason);
    assert!(
        decision
            .reason
            .starts_with("GPUs 4,7: one NUMA node (1), NV18 (the NUMA node decided); least loaded"),
        "{}",
        decision.reason
    );
    // Five GPUs fit on no socket (four fitting on node 1, two on node 0): two nodes, and the
    // words say so.
    let five = host
        .decide_on(id, &request(5), &lab(), &[], &hgx())
        .unwrap();
    assert_eq!(five.devices.len(), 5);
    assert!(
        five.reason
            .contains("no NUMA node fits 5 GPUs; NUMA nodes 0,1, NV18 between every pair"),
        "{}",
        five.reason
    );
}

#[test]
fn one_device_and_listed_devices_ignore_topology() {
    let mut host = host();
    let least = host.load(&builtin("least-loaded")).unwrap();
    let one = host
        .decide_on(least, &request(1), &lab(), &[], &two_sockets(8))
        .unwrap();
    assert_eq!(one.devices, vec![1]);
    assert!(!one.reason.contains("NUMA"), "{}", one.reason);
    let explicit = host.load(&builtin("explicit")).unwrap();
    let mut req = request(2);
    req.config.push(("devices".into(), "1,4".into()));
    let listed = host
        .decide_on(explicit, &req, &lab(), &[], &two_sockets(8))
        .unwrap();
    assert_eq!(listed.devices, vec![1, 4]);
}
