//! Foreign processes: compute processes on a device that no lease on it covers. NVML's process
//! list for each device is set against the process trees of the holders of the leases on that
//! device (a process of the holder's cgroup, of its process group, or below its pid). What
//! nobody scheduled shows up here: a notebook started by hand, a zombie holding memory.

use orch_core::process::{self, ProcStat};
use orch_devices::{GpuProcess, Inventory};
use orch_leases::{Holder, Lease};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

/// What the devices' process lists say of the leases, from one reading of `/proc`.
#[derive(Debug, Clone, Default)]
pub struct Holdings {
    /// Per device uuid, its processes that no lease on it covers (devices with none are left
    /// out).
    pub foreign: BTreeMap<String, Vec<GpuProcess>>,
    /// Per lease id, per device of that lease whose processes can be listed, the memory its
    /// holders' processes hold there (0 when none of them is on it). Devices that list no
    /// processes (`None`: the backend cannot tell) are left out.
    pub lease_memory: HashMap<String, BTreeMap<String, u64>>,
}

/// Sets each device's processes against the process trees of the holders of the leases on it.
pub fn holdings(inventory: &Inventory, leases: &[Lease]) -> Holdings {
    let mut out = Holdings::default();
    let any = inventory
        .devices
        .iter()
        .any(|d| d.processes.as_ref().is_some_and(|p| !p.is_empty()));
    let (procs, mount) = if any {
        (
            process::all()
                .into_iter()
                .collect::<HashMap<u32, ProcStat>>(),
            process::cgroup_v2_mount(),
        )
    } else {
        (HashMap::new(), None)
    };
    let covered = |h: &Holder, pid: u32| covers(h, pid, &procs, mount.as_deref());
    for device in &inventory.devices {
        let Some(list) = &device.processes else {
            continue;
        };
        let foreign: Vec<GpuProcess> = list
            .iter()
            .filter(|p| {
                !leases
                    .iter()
                    .filter(|l| l.devices.iter().any(|u| device.covers(u)))
                    .flat_map(|l| l.holders.iter())
                    .any(|h| covered(h, p.pid))
            })
            .cloned()
            .collect();
        if !foreign.is_empty() {
            out.foreign.insert(device.uuid.clone(), foreign);
        }
    }
    for lease in leases {
        let mut devices = BTreeMap::new();
        for uuid in &lease.devices {
            let Some(list) = inventory
                .devices
                .iter()
                .find(|d| d.covers(uuid))
                .and_then(|d| d.processes.as_ref())
            else {
                continue;
            };
            let held: u64 = list
                .iter()
                .filter(|p| lease.holders.iter().any(|h| covered(h, p.pid)))
                .filter_map(|p| p.used_memory_bytes)
                .sum();
            devices.insert(uuid.clone(), held);
        }
        out.lease_memory.insert(lease.id.clone(), devices);
    }
    out
}

/// Per device uuid, its processes that no lease on it covers (devices with none are left out).
pub fn foreign_processes(
    inventory: &Inventory,
    leases: &[Lease],
) -> BTreeMap<String, Vec<GpuProcess>> {
    holdings(inventory, leases).foreign
}

/// Whether process `pid` belongs to `holder`'s job: in its cgroup, its process group, or below
/// its pid. A pid this machine does not know (another PID namespace, a simulated one) is not.
fn covers(holder: &Holder, pid: u32, procs: &HashMap<u32, ProcStat>, mount: Option<&Path>) -> bool {
    let Some(stat) = procs.get(&pid) else {
        return false;
    };
    if holder.pgid.is_some_and(|g| g > 1 && g == stat.pgrp) {
        return true;
    }
    if let (Some(dir), Some(mount)) = (&holder.cgroup, mount)
        && let Some(cgroup) = process::cgroup_v2_of(pid)
        && mount.join(cgroup.trim_start_matches('/')) == *dir
    {
        return true;
    }
    // Below the holder's pid (a bounded walk: pid chains end at 1, and a loop cannot last).
    let mut at = pid;
    for _ in 0..64 {
        if at == holder.pid {
            return true;
        }
        match procs.get(&at) {
            Some(s) if s.ppid > 1 && s.ppid != at => at = s.ppid,
            _ => return false,
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_covered_by_a_lease_held_by_it_and_a_stranger_is_not() {
        let me = Holder::current();
        let mut procs: HashMap<u32, ProcStat> = process::all().into_iter().collect();
        let pid = std::process::id();
        assert!(covers(&me, pid, &procs, None));
        // A child of ours is covered by our pid.
        let child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        procs = process::all().into_iter().collect();
        assert!(covers(&me, child.id(), &procs, None));
        // A pid nobody has, and init, are not.
        assert!(!covers(&me, u32::MAX - 7, &procs, None));
        assert!(!covers(&me, 1, &procs, None));
        let mut child = child;
        let _ = child.kill();
        let _ = child.wait();
    }

    #[test]
    fn a_leases_gpu_memory_is_its_own_processes_on_each_listed_device() {
        let me = std::process::id();
        let text = format!(
            "[[gpu]]\nname = \"a\"\nmemory_total = \"80GiB\"\nuuid = \"GPU-aaaaaaaa\"\n[[gpu.process]]\npid = {me}\nused_memory = \"3GiB\"\n[[gpu.process]]\npid = {}\nused_memory = \"9GiB\"\n[[gpu]]\nname = \"b\"\nmemory_total = \"80GiB\"\nuuid = \"GPU-bbbbbbbb\"\n",
            u32::MAX - 7
        );
        let inventory = Inventory {
            backend: orch_devices::Backend::Sim,
            devices: orch_devices::sim::parse(Path::new("t.toml"), &text).unwrap(),
            fallback_reason: None,
        };
        let lease = Lease {
            id: "L1".into(),
            job_name: "j".into(),
            devices: vec!["GPU-aaaaaaaa".into(), "GPU-bbbbbbbb".into()],
            exclusive: true,
            memory_reserved_bytes: 0,
            holders: vec![Holder::current()],
            created_at_ms: 0,
        };
        let memory = holdings(&inventory, std::slice::from_ref(&lease)).lease_memory;
        let want: BTreeMap<String, u64> = [
            ("GPU-aaaaaaaa".to_string(), 3 << 30),
            ("GPU-bbbbbbbb".to_string(), 0),
        ]
        .into_iter()
        .collect();
        assert_eq!(memory["L1"], want);
    }
}
