//! What `/v1/devices` and `/metrics` show of the machine: the latest device reading, who holds
//! each device, and the processes nobody scheduled. Both read what the device thread published
//! (refreshed every second) and the job table; neither touches NVML or the lease store itself.

use crate::core::caller::Caller;
use crate::core::db::{DbError, JobRow, State};
use crate::core::metrics::{DeviceSample, Snapshot, TenantSample};
use crate::core::state::Shared;
use orch_core::sync::lock;
use std::collections::HashMap;

/// What a non-admin sees of a device holder outside its tenants.
pub const HIDDEN: &str = "(another tenant's job)";

/// The devices with `held_by` and `foreign_processes`, as `caller` may see them: the names of
/// its own jobs, others' as [`HIDDEN`] unless it is an admin.
pub fn devices(shared: &Shared, caller: &Caller) -> Result<Vec<serde_json::Value>, DbError> {
    let running = shared.db.jobs(&[State::Running], u32::MAX)?;
    let machine = lock(&shared.machine).clone();
    let by_lease: HashMap<&str, &JobRow> = running
        .iter()
        .filter_map(|j| j.lease_id.as_deref().map(|l| (l, j)))
        .collect();
    let mut out = Vec::with_capacity(machine.inventory.devices.len());
    for device in &machine.inventory.devices {
        let mut value = serde_json::to_value(device).unwrap_or_default();
        let held: Vec<serde_json::Value> = machine
            .leases
            .iter()
            // A GPU in MIG mode is held by the leases on its slices.
            .filter(|l| l.devices.iter().any(|u| device.covers(u)))
            .map(|lease| match by_lease.get(lease.id.as_str()) {
                Some(job) if caller.admin || caller.tenants.contains(&job.tenant) => {
                    serde_json::json!({
                        "job_id": job.id.to_string(), "name": job.name, "tenant": job.tenant,
                        "user": job.user,
                        "since_ms": job.started_at_ms.unwrap_or(lease.created_at_ms),
                    })
                }
                None if caller.admin => serde_json::json!({
                    "job_id": null, "name": format!("{} (orch run)", lease.job_name),
                    "tenant": null, "since_ms": lease.created_at_ms,
                }),
                _ => serde_json::json!({
                    "job_id": null, "name": HIDDEN, "tenant": null,
                    "since_ms": lease.created_at_ms,
                }),
            })
            .collect();
        let foreign = machine
            .foreign
            .get(&device.uuid)
            .cloned()
            .unwrap_or_default();
        if let Some(object) = value.as_object_mut() {
            if let Some(why) = &machine.stale {
                object.insert("reading_error".into(), why.clone().into());
            }
            object.insert("held_by".into(), serde_json::Value::Array(held));
            object.insert(
                "state".into(),
                device.service_state(&device.uuid).as_str().into(),
            );
            object.insert(
                "health".into(),
                serde_json::to_value(device.health_view()).unwrap_or_default(),
            );
            // Each slice's state and health (its GPU's health and drains reach it).
            if let Some(slices) = object
                .get_mut("mig_devices")
                .and_then(serde_json::Value::as_array_mut)
            {
                for (slice, m) in slices.iter_mut().zip(&device.mig_devices) {
                    if let Some(slice) = slice.as_object_mut() {
                        slice.insert(
                            "state".into(),
                            device.service_state(&m.uuid).as_str().into(),
                        );
                        slice.insert(
                            "health".into(),
                            serde_json::to_value(device.service(&m.uuid)).unwrap_or_default(),
                        );
                    }
                }
            }
            object.insert(
                "foreign_processes".into(),
                serde_json::to_value(foreign).unwrap_or_default(),
            );
        }
        out.push(value);
    }
    Ok(out)
}

/// Everything one scrape shows, read at once.
pub fn metrics_snapshot(shared: &Shared) -> Result<Snapshot, DbError> {
    let (running, counts) = (
        shared.db.jobs(&[State::Running], u32::MAX)?,
        shared.db.counts()?,
    );
    let machine = lock(&shared.machine).clone();
    let standing = lock(&shared.standing).clone();
    let by_lease: HashMap<&str, &JobRow> = running
        .iter()
        .filter_map(|j| j.lease_id.as_deref().map(|l| (l, j)))
        .collect();
    let devices = machine
        .inventory
        .devices
        .iter()
        .map(|d| {
            let leases: Vec<_> = machine
                .leases
                .iter()
                .filter(|l| l.devices.iter().any(|u| d.covers(u)))
                .collect();
            DeviceSample {
                uuid: d.uuid.clone(),
                index: d.index,
                name: d.name.clone(),
                utilization: d.utilization_gpu_percent.map(|u| f64::from(u) / 100.0),
                memory_used_bytes: d.memory_used_bytes,
                memory_total_bytes: d.memory_total_bytes,
                temperature_c: d.temperature_c,
                power_w: d.power_draw_w,
                held_by: leases.iter().find_map(|l| {
                    by_lease
                        .get(l.id.as_str())
                        .map(|j| (j.id.to_string(), j.tenant.clone()))
                }),
                leased: !leases.is_empty(),
                foreign_processes: machine.foreign.get(&d.uuid).map_or(0, Vec::len),
                healthy: d.health.is_healthy(),
                drained: d.health.drain_of(&d.uuid, &d.uuid).is_some(),
            }
        })
        .collect();
    let mut jobs: Vec<(String, String, u64)> = counts
        .into_iter()
        .map(|(state, tenant, n)| (state.as_str().to_string(), tenant, n))
        .collect();
    // Every state of every tenant, zeros included: a series that vanishes is harder to graph.
    for t in &shared.config.tenants {
        for state in State::ALL {
            if !jobs
                .iter()
                .any(|(s, n, _)| s == state.as_str() && *n == t.name)
            {
                jobs.push((state.as_str().to_string(), t.name.clone(), 0));
            }
        }
    }
    jobs.sort();
    let tenants = shared
        .config
        .tenants
        .iter()
        .map(|t| {
            let fair = standing.iter().find(|s| s.name == t.name);
            TenantSample {
                name: t.name.clone(),
                share: fair.map_or(0.0, |f| f.normalized_share),
                usage_gpu_seconds: fair.map_or(0.0, |f| f.usage_gpu_s),
                fair_share: fair.map_or(1.0, |f| f.fair_share),
                gpus_held: fair.map_or(0, |f| f.gpus_held),
                policy_cpu_seconds: shared.policies.cpu_spent(&t.name).as_secs_f64(),
            }
        })
        .collect();
    let per_tenant = |counts: Vec<(String, u64)>| -> Vec<(String, u64)> {
        shared
            .config
            .tenants
            .iter()
            .map(|t| {
                let n = counts
                    .iter()
                    .find(|(name, _)| *name == t.name)
                    .map_or(0, |x| x.1);
                (t.name.clone(), n)
            })
            .collect()
    };
    let interactive = per_tenant(shared.db.interactive_counts()?);
    let alloc = per_tenant(shared.db.alloc_counts()?);
    Ok(Snapshot {
        devices,
        jobs,
        tenants,
        leases: machine.leases.len(),
        interactive,
        alloc,
        state_space: orch_core::fsutil::space(&shared.state_dir),
    })
}
