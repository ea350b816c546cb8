//! The host CPU as one compute device: memory and model from `/proc` (through `procfs`), cores
//! from the scheduler.

use crate::{Backend, Device, DeviceError};
use procfs::Current;

/// The CPU device. Utilization, temperature and power are not read (null).
pub fn read() -> Result<Device, DeviceError> {
    let (total, available) = host_memory()?;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let model = procfs::CpuInfo::current()
        .ok()
        .and_then(|info| info.model_name(0).map(str::to_string))
        .unwrap_or_else(|| "CPU".to_string());
    Ok(Device {
        index: 0,
        uuid: "CPU-0".to_string(),
        name: format!("{model} ({cores} cores)"),
        backend: Backend::Cpu,
        memory_total_bytes: Some(total),
        memory_used_bytes: Some(total.saturating_sub(available)),
        memory_free_bytes: Some(available),
        utilization_gpu_percent: None,
        utilization_memory_percent: None,
        temperature_c: None,
        power_draw_w: None,
        compute_capability: None,
        pci_bus_id: None,
        processes: None,
        mig_devices: Vec::new(),
        minor_number: None,
        numa_node: None,
        cpus: None,
        links: Vec::new(),
        health: Default::default(),
        mig_mode: false,
        mig_slots: None,
    })
}

/// The host's `(MemTotal, MemAvailable)` in bytes, from `/proc/meminfo`.
pub fn host_memory() -> Result<(u64, u64), DeviceError> {
    let info = procfs::Meminfo::current().map_err(|e| DeviceError::Host {
        what: "/proc/meminfo",
        reason: e.to_string(),
    })?;
    let available = info.mem_available.ok_or_else(|| DeviceError::Host {
        what: "/proc/meminfo",
        reason: "MemAvailable is missing (Linux 3.14 or later has it)".into(),
    })?;
    Ok((info.mem_total, available))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_memory_is_read() {
        let (total, available) = host_memory().unwrap();
        assert!(total > 0 && available <= total);
    }

    #[test]
    fn the_host_device_has_real_memory() {
        let device = read().expect("the CPU device is always readable on Linux");
        assert_eq!(device.backend, Backend::Cpu);
        let total = device.memory_total_bytes.unwrap();
        assert!(total > 0);
        assert!(device.memory_free_bytes.unwrap() <= total);
        assert!(device.utilization_gpu_percent.is_none(), "never invented");
    }
}
