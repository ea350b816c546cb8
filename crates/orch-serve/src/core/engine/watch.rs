//! The device watch: a thread that reads the machine again every [`INVENTORY_MAX_AGE`] (the
//! devices, the live leases, the processes no lease covers) into the shared machine view, and
//! the engine's idle reclaim, which acts on those readings.

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
                loop {
                    if !std::mem::take(&mut first) {
                        std::thread::sleep(INVENTORY_MAX_AGE);
                    }
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
                    *lock(&shared.machine) = MachineView {
                        inventory,
                        leases,
                        foreign,
                        lease_memory,
                        stale,
                    };
                }
            });
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
