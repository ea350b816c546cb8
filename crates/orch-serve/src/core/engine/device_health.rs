//! Device health in the daemon: each reading of the device watcher keeps the time every problem
//! was first seen and lays the lease store's marks (drains, recorded Xid events) over the
//! devices; NVML's Xid events are waited for on a thread of their own and recorded in the lease
//! store, where `orch run` without the daemon finds them too. A device that becomes unhealthy
//! wakes the engine ([`Kick::DeviceHealth`]), which tells the jobs running there (an event and
//! their reason; they keep running) and runs a pass; so does a drain or an undrain.

use super::*;
use orch_devices::{Device, Problem, ProblemKind};
use orch_leases::{DeviceMark, MarkKind};

/// A GPU that became unhealthy: its uuid and its slices' (what jobs hold), and the sentence the
/// jobs running there are told.
#[derive(Debug, Clone)]
pub struct BecameUnhealthy {
    pub uuids: Vec<String>,
    pub message: String,
}

/// Lays what the daemon knows over a fresh `inventory`: each problem keeps the time it was first
/// seen in `previous`; the `marks` (drains, recorded Xid events) are applied. Returns the GPUs
/// that have a problem `previous` did not.
pub(super) fn settle(
    inventory: &mut Inventory,
    previous: &Inventory,
    marks: &[DeviceMark],
) -> Vec<BecameUnhealthy> {
    for device in &mut inventory.devices {
        let on_it: Vec<&DeviceMark> = marks
            .iter()
            .filter(|m| {
                m.uuid == device.uuid || device.mig_devices.iter().any(|s| s.uuid == m.uuid)
            })
            .collect();
        for mark in on_it {
            orch_runner::service::apply(device, mark);
        }
        let Some(before) = previous.devices.iter().find(|d| d.uuid == device.uuid) else {
            continue;
        };
        for problem in &mut device.health.problems {
            if let Some(old) = before.health.problems.iter().find(|p| p.same(problem)) {
                problem.since_ms = old.since_ms;
            }
        }
    }
    inventory
        .devices
        .iter()
        .filter_map(|device| {
            let before = previous.devices.iter().find(|d| d.uuid == device.uuid);
            let new: Vec<&Problem> = device
                .health
                .problems
                .iter()
                .filter(|p| before.is_none_or(|b| !b.health.problems.iter().any(|o| o.same(p))))
                .collect();
            (!new.is_empty()).then(|| became_unhealthy(device, &new))
        })
        .collect()
}

fn became_unhealthy(device: &Device, new: &[&Problem]) -> BecameUnhealthy {
    let words: Vec<&str> = new.iter().map(|p| p.message.as_str()).collect();
    let mut uuids = vec![device.uuid.clone()];
    uuids.extend(device.mig_devices.iter().map(|m| m.uuid.clone()));
    BecameUnhealthy {
        uuids,
        message: format!(
            "GPU {} ({}) became unhealthy: {}; the job keeps running (orch cancel stops it), and no new job is placed there",
            device.index,
            device.short_uuid(),
            words.join("; ")
        ),
    }
}

/// Waits for NVML's Xid events on a thread of its own (a daemon of NVML devices only), records
/// each critical one as an unhealthy mark in the lease store, shows it in the machine view at
/// once and wakes the engine. The wait registers again by itself when the GPUs change. NVML that
/// cannot be waited on is tried again ten seconds later, a wait that failed after a second (the
/// other GPUs' events are not missed for long); each new kind of failure is said in the log.
pub(super) fn watch_xid_events(shared: Arc<Shared>) {
    use orch_devices::nvml_health::WatchError;
    let started = std::thread::Builder::new()
        .name("orch-xid-events".into())
        .spawn(move || {
            let mut store = LeaseStore::open(&shared.state_dir).ok();
            let mut said: Option<WatchError> = None;
            loop {
                let began = Instant::now();
                let result = orch_devices::nvml_health::watch_xids(
                    |event| {
                        if store.is_none() {
                            store = LeaseStore::open(&shared.state_dir).ok();
                        }
                        record_xid(&shared, store.as_mut(), &event);
                    },
                    || true,
                );
                let Err(e) = result else { continue };
                // A wait that worked a while makes the next failure news, whatever it is.
                if began.elapsed() >= Duration::from_secs(30) {
                    said = None;
                }
                if said.as_ref() != Some(&e) {
                    tracing::warn!("the daemon cannot wait for Xid events: {e}");
                }
                let pause = match &e {
                    WatchError::Unavailable(_) => Duration::from_secs(10),
                    WatchError::Interrupted(_) => Duration::from_secs(1),
                };
                said = Some(e);
                std::thread::sleep(pause);
            }
        });
    if let Err(e) = started {
        tracing::error!(
            "the daemon could not start its Xid event thread ({e}): Xid events are not seen"
        );
    }
}

/// One Xid event: a critical one becomes (or joins) the GPU's unhealthy mark and shows at once.
fn record_xid(
    shared: &Shared,
    store: Option<&mut LeaseStore>,
    event: &orch_devices::nvml_health::XidEvent,
) {
    let meaning = orch_devices::health::xid_meaning(event.xid);
    if !orch_devices::health::is_critical_xid(event.xid) {
        tracing::info!(
            "GPU {}: Xid {}: {meaning}; the GPU stays in service",
            event.uuid,
            event.xid
        );
        return;
    }
    tracing::warn!("GPU {}: Xid {}: {meaning}", event.uuid, event.xid);
    let problem = Problem {
        kind: ProblemKind::Xid,
        xid: Some(event.xid),
        message: format!("Xid {}: {meaning}", event.xid),
        since_ms: now_ms(),
    };
    let mut mark = None;
    if let Some(store) = store {
        let mut problems: Vec<Problem> = store
            .marks()
            .unwrap_or_default()
            .into_iter()
            .find(|m| m.uuid == event.uuid && m.kind == MarkKind::Unhealthy)
            .and_then(|m| serde_json::from_str(m.detail.as_deref()?).ok())
            .unwrap_or_default();
        if !problems.iter().any(|p| p.same(&problem)) {
            problems.push(problem.clone());
        }
        let detail = serde_json::to_string(&problems).unwrap_or_else(|_| "[]".into());
        match store.set_mark(&event.uuid, MarkKind::Unhealthy, Some(&detail), None) {
            Ok(stored) => mark = Some(stored),
            Err(e) => tracing::warn!("could not record Xid {} of {}: {e}", event.xid, event.uuid),
        }
    }
    let mark = mark.unwrap_or_else(|| DeviceMark {
        uuid: event.uuid.clone(),
        kind: MarkKind::Unhealthy,
        detail: serde_json::to_string(&[&problem]).ok(),
        by: None,
        since_ms: problem.since_ms,
    });
    show_mark(shared, &mark);
}

/// Shows `mark` in the machine view now (the next reading shows it too, from the store) and, for
/// a device that became unhealthy, or any drain, wakes the engine.
pub fn show_mark(shared: &Shared, mark: &DeviceMark) {
    let became = {
        let mut machine = lock(&shared.machine);
        let previous = Arc::clone(&machine.inventory);
        let mut inventory = (*previous).clone();
        let became = settle(&mut inventory, &previous, std::slice::from_ref(mark));
        machine.inventory = Arc::new(inventory);
        became
    };
    shared.kick(Kick::DeviceHealth(became));
}

/// Takes the drain (and a recorded unhealthy mark) of `uuid` out of the machine view now.
pub fn show_cleared(shared: &Shared, uuid: &str) {
    {
        let mut machine = lock(&shared.machine);
        let mut inventory = (*machine.inventory).clone();
        for device in &mut inventory.devices {
            device.health.drains.retain(|d| d.uuid != uuid);
            if device.uuid == uuid {
                let mut readings = device.health.clone();
                readings.problems.clear();
                readings.assess(now_ms());
                // The readings' problems stay, with their first-seen times.
                let kept: Vec<Problem> = device
                    .health
                    .problems
                    .iter()
                    .filter(|p| readings.problems.iter().any(|r| r.same(p)))
                    .cloned()
                    .collect();
                device.health.problems = kept;
            }
        }
        machine.inventory = Arc::new(inventory);
    }
    shared.kick(Kick::DeviceHealth(Vec::new()));
}

impl Engine {
    /// Tells every running job on a GPU that became unhealthy: an event (`device-unhealthy`)
    /// and its reason. The job keeps running; its owner or an admin may cancel it.
    pub(super) fn devices_unhealthy(&mut self, became: Vec<BecameUnhealthy>) {
        let mut notes: Vec<(i64, String)> = Vec::new();
        for gpu in &became {
            for (id, job) in &self.jobs.running {
                if job.devices.iter().any(|d| gpu.uuids.contains(d)) {
                    notes.push((*id, gpu.message.clone()));
                }
            }
        }
        for (id, message) in notes {
            tracing::warn!("job {id}: {message}");
            self.jobs.write(
                id,
                Change {
                    event: Some(Event::now("device-unhealthy", message.clone())),
                    reason: Update::Set(message),
                    only_if: Some(State::Running),
                    ..Change::default()
                },
            );
        }
    }
}

/// The marks of the daemon's lease store, for a reading (none when it cannot be read).
pub(super) fn marks(store: Option<&mut LeaseStore>) -> Vec<DeviceMark> {
    store.and_then(|s| s.marks().ok()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inventory(xids: &[&[u32]]) -> Inventory {
        let text: String = xids
            .iter()
            .map(|list| {
                let list: Vec<String> = list.iter().map(u32::to_string).collect();
                format!(
                    "[[gpu]]\nname = \"H100\"\nmemory_total = \"80GiB\"\nxid_errors = [{}]\n",
                    list.join(", ")
                )
            })
            .collect();
        let devices = orch_devices::sim::parse(std::path::Path::new("t.toml"), &text).unwrap();
        Inventory {
            backend: orch_devices::Backend::Sim,
            devices,
            fallback_reason: None,
        }
    }

    #[test]
    fn a_reading_keeps_first_seen_times_lays_marks_and_reports_each_new_problem_once() {
        let mut first = inventory(&[&[], &[79]]);
        first.devices[1].health.problems[0].since_ms = 5;
        let drain = DeviceMark {
            uuid: first.devices[0].uuid.clone(),
            kind: MarkKind::Drain,
            detail: Some("maintenance".into()),
            by: Some("root".into()),
            since_ms: 9,
        };
        // GPU 0 gets an Xid 48 and is drained; GPU 1's Xid 79 was there before.
        let mut next = inventory(&[&[48], &[79]]);
        let became = settle(&mut next, &first, std::slice::from_ref(&drain));
        assert_eq!(next.devices[1].health.problems[0].since_ms, 5);
        assert_eq!(
            next.devices[0].health.drains[0].reason.as_deref(),
            Some("maintenance")
        );
        assert_eq!(became.len(), 1, "{became:?}");
        assert_eq!(became[0].uuids, [next.devices[0].uuid.clone()]);
        assert!(
            became[0]
                .message
                .starts_with("GPU 0 (GPU-51300000) became unhealthy: Xid 48"),
            "{}",
            became[0].message
        );
        // Read again: nothing new to tell.
        let mut again = inventory(&[&[48], &[79]]);
        assert!(settle(&mut again, &next, &[drain]).is_empty());
    }
}
