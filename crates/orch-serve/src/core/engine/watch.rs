//! The device watch: a thread that reads the machine again every [`INVENTORY_MAX_AGE`], sooner
//! when the sim file it reads changes (the devices, the live leases, the processes no lease
//! covers; health and drains laid over them by `device_health`) into the shared machine view,
//! and the engine's idle reclaim, which acts on those readings.

use super::*;

impl Engine {
    /// Starts the thread that reads the machine again every [`INVENTORY_MAX_AGE`]: the devices,
    /// the live leases, and the processes no lease covers.
    pub fn watch_devices(&self) {
        let shared = Arc::clone(&self.shared);
        let started = std::thread::Builder::new()
            .name("orch-devices".into())
            .spawn(move || {
                let mut store = LeaseStore::open(&shared.state_dir);
                let mut first = true;
                // Whether a reading was published: the first one tells no job of old problems.
                let mut published = false;
                let mut sim_stamp = None;
                loop {
                    if !std::mem::take(&mut first) {
                        next_reading(&shared.devices, sim_stamp);
                    }
                    // Taken before the reading: a write during it is seen by the next wait.
                    sim_stamp = sim_file_stamp(&shared.devices);
                    let (inventory, stale) = match shared
                        .devices
                        .parse::<InventorySpec>()
                        .and_then(|s| Inventory::load(&s))
                    {
                        Ok(inventory) => (Arc::new(inventory), None),
                        Err(e) => {
                            tracing::warn!(
                                "could not read the devices again, using the last reading: {e}"
                            );
                            let last = Arc::clone(&lock(&shared.machine).inventory);
                            (last, Some(format!("the daemon could not read the devices again ({e}): this is its last reading")))
                        }
                    };
                    let leases = match store.as_mut().map(LeaseStore::active) {
                        Ok(Ok(leases)) => Arc::new(leases),
                        _ => {
                            store = LeaseStore::open(&shared.state_dir);
                            Arc::clone(&lock(&shared.machine).leases)
                        }
                    };
                    let held = orch_runner::holdings(&inventory, &leases);
                    let (foreign, lease_memory) =
                        (Arc::new(held.foreign), Arc::new(held.lease_memory));
                    if stale.is_none() { shared.timeline.note_devices(now_ms(), &inventory.devices); }
                    let mut machine = lock(&shared.machine);
                    // The marks are read under the view's lock: a drain or undrain shows itself
                    // (`show_mark`, `show_cleared`) under it after writing the store, so this
                    // reading can neither miss it nor bring back what it took away. A read of
                    // the store in WAL mode waits for no writer.
                    let marks = device_health::marks(store.as_mut().ok());
                    let mut inventory = Arc::unwrap_or_clone(inventory);
                    let became = device_health::settle(&mut inventory, &machine.inventory, &marks);
                    *machine = MachineView {
                        inventory: Arc::new(inventory),
                        leases,
                        foreign,
                        lease_memory,
                        stale,
                    };
                    drop(machine);
                    if std::mem::replace(&mut published, true) && !became.is_empty() {
                        shared.kick(Kick::DeviceHealth(became));
                    }
                }
            });
        if self.shared.backend == orch_devices::Backend::Nvml {
            device_health::watch_xid_events(Arc::clone(&self.shared));
        }
        if let Err(e) = started {
            let why = format!(
                "the daemon could not start its device watcher ({e}): this is the reading from its start, and foreign processes are not looked for"
            );
            tracing::error!("{why}");
            lock(&self.shared.machine).stale = Some(why);
        }
    }

    /// Idle reclaim: a running job of a tenant with `idle_timeout` whose devices all stay under
    /// `idle_utilization` that long gets an event and a line in its stderr log; after
    /// `idle_grace` more, it is stopped (failed, "idle for 2h; GPUs reclaimed").
    pub(super) fn check_idle(&mut self) {
        if self.last_idle_check.elapsed() < INVENTORY_MAX_AGE {
            return;
        }
        self.last_idle_check = Instant::now();
        self.jobs.refresh_inventory();
        let now = Instant::now();
        let mut notes: Vec<(i64, &'static str, String)> = Vec::new();
        let inventory = &self.jobs.inventory;
        // The memory each job's processes hold on its devices, for its accounting: the device
        // watcher's reading, made with the foreign processes' (no second look at /proc here).
        let memory = Arc::clone(&lock(&self.shared.machine).lease_memory);
        for (id, job) in &mut self.jobs.running {
            let Some(tenant) = self.shared.config.tenant(&job.tenant) else {
                continue;
            };
            let utilization: Vec<Option<u32>> = job
                .devices
                .iter()
                .map(|u| {
                    inventory
                        .devices
                        .iter()
                        .find(|d| &d.uuid == u)
                        .and_then(|d| d.utilization_gpu_percent)
                })
                .collect();
            let held: Vec<u64> = memory
                .get(&job.lease_id)
                .map(|devices| devices.values().copied().collect())
                .unwrap_or_default();
            job.gpu.look(&utilization, &held);
            for note in job.look_idle(tenant, &utilization, now) {
                notes.push((*id, note.kind, note.message));
            }
        }
        for (id, kind, message) in notes {
            tracing::info!("job {id}: {message}");
            // The warning goes where the job's owner looks: its stderr log.
            let attempt = self.jobs.running.get(&id).map_or(0, |r| r.attempt);
            let log = self.shared.job_dir(id, attempt).join("stderr");
            if let Ok(mut file) = std::fs::OpenOptions::new().append(true).open(&log) {
                use std::io::Write as _;
                let _ = writeln!(file, "orch: {message}");
            }
            self.jobs.write(
                id,
                Change {
                    event: Some(Event::now(kind, message)),
                    ..Change::default()
                },
            );
        }
    }
}

/// A sim file's identity: a change of any part means it was written again.
type Stamp = (Option<std::time::SystemTime>, u64, u64);

/// Waits until the next reading is due: [`INVENTORY_MAX_AGE`], or sooner when the daemon reads
/// a sim file and it changes from `last` (looked at every 25 ms: a test or demo that writes
/// `xid_errors` sees the GPU unhealthy at once).
fn next_reading(devices: &str, last: Option<Stamp>) {
    let deadline = Instant::now() + INVENTORY_MAX_AGE;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || (last.is_some() && sim_file_stamp(devices) != last) {
            return;
        }
        std::thread::sleep(left.min(Duration::from_millis(25)));
    }
}

/// The identity of the sim file the daemon reads; `None` for other inventories.
fn sim_file_stamp(devices: &str) -> Option<Stamp> {
    use std::os::unix::fs::MetadataExt;
    let Ok(InventorySpec::Sim(path)) = devices.parse::<InventorySpec>() else {
        return None;
    };
    std::fs::metadata(&path)
        .ok()
        .map(|m| (m.modified().ok(), m.len(), m.ino()))
}
