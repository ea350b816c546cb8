//! Drains and recorded health laid over the inventory (orch-runner's `service`).

use orch_devices::ServiceState;
use orch_devices::{Device, Problem};
use orch_leases::{DeviceMark, MarkKind};
use orch_runner::service::{for_claim_inside, with_marks};
use std::borrow::Cow;

fn gpu(index: u32) -> Device {
    let mut device: Device = serde_json::from_value(serde_json::json!({
        "index": index, "uuid": format!("GPU-0000000{index}"), "name": "sim",
        "backend": "sim", "memory_total_bytes": null, "memory_used_bytes": null,
        "memory_free_bytes": null, "utilization_gpu_percent": null,
        "utilization_memory_percent": null, "temperature_c": null, "power_draw_w": null,
        "compute_capability": null, "pci_bus_id": null, "processes": null,
        "mig_devices": [{"uuid": format!("MIG-{index}"), "name": "1g.10gb", "memory_total_bytes": null}],
    }))
    .unwrap();
    device.index = index;
    device
}

fn mark(uuid: &str, kind: MarkKind, detail: Option<&str>) -> DeviceMark {
    DeviceMark {
        uuid: uuid.into(),
        kind,
        detail: detail.map(str::to_string),
        by: None,
        since_ms: 7,
    }
}

#[test]
fn drains_and_recorded_problems_take_devices_out_of_service() {
    let devices = vec![gpu(0), gpu(1), gpu(2)];
    assert!(matches!(with_marks(&devices, &[]), Cow::Borrowed(_)));
    let problems = serde_json::to_string(&[Problem {
        kind: orch_devices::ProblemKind::Xid,
        xid: Some(79),
        message: "Xid 79: the GPU has fallen off the bus".into(),
        since_ms: 3,
    }])
    .unwrap();
    let marks = [
        mark("GPU-00000000", MarkKind::Drain, Some("maintenance")),
        mark("MIG-1", MarkKind::Drain, None),
        mark("GPU-00000002", MarkKind::Unhealthy, Some(&problems)),
    ];
    let marked = with_marks(&devices, &marks);
    assert_eq!(
        marked[0].out_of_service("GPU-00000000").as_deref(),
        Some("GPU 0 is drained (maintenance)")
    );
    // A drained GPU drains its slices; a drained slice leaves its GPU in service.
    assert_eq!(marked[0].service_state("MIG-0"), ServiceState::Drained);
    assert_eq!(marked[1].service_state("GPU-00000001"), ServiceState::Ok);
    assert_eq!(marked[1].service_state("MIG-1"), ServiceState::Drained);
    // An unhealthy GPU makes its slices unhealthy.
    assert_eq!(marked[2].service_state("MIG-2"), ServiceState::Unhealthy);
    assert!(
        marked[2]
            .out_of_service("GPU-00000002")
            .unwrap()
            .contains("Xid 79"),
    );
}

#[test]
fn inside_a_lease_its_own_devices_drains_do_not_apply_and_health_does() {
    let devices = vec![gpu(0), gpu(1), gpu(2)];
    let problems = serde_json::to_string(&[Problem {
        kind: orch_devices::ProblemKind::Xid,
        xid: Some(48),
        message: "Xid 48: double-bit ECC error".into(),
        since_ms: 3,
    }])
    .unwrap();
    let marks = [
        mark("GPU-00000000", MarkKind::Drain, None),
        mark("GPU-00000001", MarkKind::Drain, None),
        mark("GPU-00000002", MarkKind::Drain, None),
        mark("GPU-00000000", MarkKind::Unhealthy, Some(&problems)),
    ];
    // The lease holds GPU 0 and a slice of GPU 2.
    let own = ["GPU-00000000".to_string(), "MIG-2".to_string()];
    let kept = for_claim_inside(&marks, &own, &devices);
    let marked = with_marks(&devices, &kept);
    // GPU 0's drain is the enclosing job's to finish under; its health still counts.
    assert_eq!(
        marked[0].service_state("GPU-00000000"),
        ServiceState::Unhealthy
    );
    assert!(marked[0].health.drains.is_empty());
    assert_eq!(
        marked[1].service_state("GPU-00000001"),
        ServiceState::Drained
    );
    assert_eq!(marked[2].service_state("MIG-2"), ServiceState::Ok);
    // Outside a lease every mark applies, unchanged.
    assert!(matches!(
        for_claim_inside(&marks, &[], &devices),
        Cow::Borrowed(_)
    ));
}
