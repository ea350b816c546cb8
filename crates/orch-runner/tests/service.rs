//! Drains and recorded health laid over the inventory (orch-runner's `service`).

use orch_devices::ServiceState;
use orch_devices::{Device, Problem};
use orch_leases::{DeviceMark, MarkKind};
use orch_runner::service::with_marks;
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
