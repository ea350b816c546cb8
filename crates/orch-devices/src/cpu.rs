//! The host CPU as one compute device: memory from `/proc/meminfo`, cores from the scheduler.

use crate::{Backend, Device, DeviceError};

/// The CPU device. Utilization, temperature and power are not read (null).
pub fn read() -> Result<Device, DeviceError> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").map_err(|e| DeviceError::Host {
        what: "/proc/meminfo",
        reason: e.to_string(),
    })?;
    let (total, available) = parse_meminfo(&meminfo).ok_or_else(|| DeviceError::Host {
        what: "/proc/meminfo",
        reason: "MemTotal or MemAvailable is missing".into(),
    })?;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|text| cpu_model(&text))
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
    })
}

/// `(MemTotal, MemAvailable)` in bytes.
fn parse_meminfo(text: &str) -> Option<(u64, u64)> {
    let field = |name: &str| {
        text.lines().find_map(|line| {
            let rest = line.strip_prefix(name)?.strip_prefix(':')?;
            let kib: u64 = rest.trim().trim_end_matches("kB").trim().parse().ok()?;
            Some(kib * 1024)
        })
    };
    Some((field("MemTotal")?, field("MemAvailable")?))
}

fn cpu_model(cpuinfo: &str) -> Option<String> {
    cpuinfo.lines().find_map(|line| {
        let (key, value) = line.split_once(':')?;
        (key.trim() == "model name").then(|| value.trim().to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_meminfo_fields() {
        let text = "MemTotal:       24000000 kB\nMemFree:  100 kB\nMemAvailable:   20000000 kB\n";
        assert_eq!(
            parse_meminfo(text),
            Some((24_000_000 * 1024, 20_000_000 * 1024))
        );
        assert_eq!(parse_meminfo("MemTotal: 1 kB\n"), None);
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
