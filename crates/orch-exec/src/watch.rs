//! Watching a running job: which processes belong to it, and whether they stay within the job's
//! per-device memory limit (as NVML reports per-process GPU memory).

use std::collections::{BTreeMap, BTreeSet, HashMap};

/// What a monitor decides after a look at the job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Continue,
    /// Stop the job (SIGTERM, then SIGKILL after the grace period); the job fails with this reason.
    Stop(String),
}

/// One process's memory on one device, as NVML reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessMemory {
    pub device_uuid: String,
    pub pid: u32,
    pub used_bytes: u64,
}

/// Compares the job's processes' memory on each of its devices with `limit_bytes`. Reports an
/// excess once per device (a warning); with `enforce`, stops the job.
#[derive(Debug)]
pub struct MemoryWatch {
    pub devices: Vec<String>,
    pub limit_bytes: u64,
    pub enforce: bool,
    reported: BTreeSet<String>,
}

impl MemoryWatch {
    pub fn new(devices: Vec<String>, limit_bytes: u64, enforce: bool) -> MemoryWatch {
        MemoryWatch {
            devices,
            limit_bytes,
            enforce,
            reported: BTreeSet::new(),
        }
    }

    /// Looks at one reading; `job_pids` are every process of the job (see [`descendants`]).
    pub fn check(&mut self, job_pids: &BTreeSet<u32>, readings: &[ProcessMemory]) -> Verdict {
        let mut per_device: BTreeMap<&str, u64> = BTreeMap::new();
        for r in readings.iter().filter(|r| job_pids.contains(&r.pid)) {
            if self.devices.iter().any(|d| d == &r.device_uuid) {
                *per_device.entry(r.device_uuid.as_str()).or_default() += r.used_bytes;
            }
        }
        for (device, used) in per_device {
            if used <= self.limit_bytes {
                continue;
            }
            let message = format!(
                "the job uses {used} bytes on {device}, over its memory_limit of {} bytes",
                self.limit_bytes
            );
            if self.enforce {
                return Verdict::Stop(format!("{message}; stopped (enforce_memory_limit = true)"));
            }
            if self.reported.insert(device.to_string()) {
                tracing::warn!("{message} (set enforce_memory_limit = true to stop such a job)");
            }
        }
        Verdict::Continue
    }
}

/// `roots` and every process descended from them, from `/proc`.
pub fn descendants(roots: &[u32]) -> BTreeSet<u32> {
    let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
    for (pid, stat) in orch_core::process::all() {
        children.entry(stat.ppid).or_default().push(pid);
    }
    let mut all: BTreeSet<u32> = roots.iter().copied().collect();
    let mut stack: Vec<u32> = roots.to_vec();
    while let Some(pid) = stack.pop() {
        for &child in children.get(&pid).into_iter().flatten() {
            if all.insert(child) {
                stack.push(child);
            }
        }
    }
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(device: &str, pid: u32, gib: u64) -> ProcessMemory {
        ProcessMemory {
            device_uuid: device.into(),
            pid,
            used_bytes: gib << 30,
        }
    }

    #[test]
    fn only_the_jobs_processes_on_its_devices_count() {
        let mut watch = MemoryWatch::new(vec!["GPU-a".into()], 10 << 30, true);
        let pids = BTreeSet::from([100, 101]);
        let fine = [
            reading("GPU-a", 100, 6),
            reading("GPU-a", 999, 50),
            reading("GPU-b", 101, 50),
        ];
        assert_eq!(watch.check(&pids, &fine), Verdict::Continue);
        let over = [reading("GPU-a", 100, 6), reading("GPU-a", 101, 5)];
        assert!(matches!(watch.check(&pids, &over), Verdict::Stop(why) if why.contains("GPU-a")));
    }

    #[test]
    fn without_enforcement_an_excess_is_only_reported() {
        let mut watch = MemoryWatch::new(vec!["GPU-a".into()], 1 << 30, false);
        let pids = BTreeSet::from([7]);
        assert_eq!(
            watch.check(&pids, &[reading("GPU-a", 7, 2)]),
            Verdict::Continue
        );
        assert!(watch.reported.contains("GPU-a"));
    }

    #[test]
    fn descendants_include_grandchildren() {
        let mut child = std::process::Command::new("sh")
            .args(["-c", "sleep 5 & sleep 5; wait"])
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(200));
        let tree = descendants(&[child.id()]);
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(tree.len() >= 3, "sh and its two sleeps: {tree:?}");
    }
}
