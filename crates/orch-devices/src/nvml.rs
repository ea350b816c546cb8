//! Real NVIDIA GPUs through NVML (nvml-wrapper, loaded at run time).
//!
//! A missing library or driver is [`DeviceError::NvmlUnavailable`]; a telemetry field the GPU does
//! not support (power on some boards, temperature in some VMs) is `None`, never a made-up value.

use crate::{Backend, Device, DeviceError, GpuProcess, MigDevice};
use nvml_wrapper::Nvml;
use nvml_wrapper::enum_wrappers::device::TemperatureSensor;
use nvml_wrapper::enums::device::UsedGpuMemory;

/// Every GPU NVML reports, in NVML order (PCI bus order).
pub fn read() -> Result<Vec<Device>, DeviceError> {
    let nvml = Nvml::init().map_err(|e| DeviceError::NvmlUnavailable(describe_init_error(&e)))?;
    let count = nvml
        .device_count()
        .map_err(|e| DeviceError::NvmlUnavailable(e.to_string()))?;
    if count == 0 {
        return Err(DeviceError::NoGpu);
    }
    (0..count).map(|index| read_device(&nvml, index)).collect()
}

/// The driver version NVML reports, when NVML loads.
pub fn driver_version() -> Option<String> {
    Nvml::init().ok()?.sys_driver_version().ok()
}

fn describe_init_error(err: &nvml_wrapper::error::NvmlError) -> String {
    use nvml_wrapper::error::NvmlError;
    match err {
        NvmlError::LibloadingError(e) => {
            format!("no NVIDIA driver found ({e})")
        }
        NvmlError::DriverNotLoaded => "the NVIDIA kernel driver is not loaded".to_string(),
        NvmlError::NoPermission => "no permission to talk to the NVIDIA driver".to_string(),
        other => other.to_string(),
    }
}

fn read_device(nvml: &Nvml, index: u32) -> Result<Device, DeviceError> {
    let failed = |what: &'static str| {
        move |e: nvml_wrapper::error::NvmlError| DeviceError::NvmlRead {
            index,
            what,
            reason: e.to_string(),
        }
    };
    let device = nvml.device_by_index(index).map_err(failed("the handle"))?;
    let uuid = device.uuid().map_err(failed("the uuid"))?;
    let name = device.name().map_err(failed("the name"))?;
    let memory = device.memory_info().ok();
    let utilization = device.utilization_rates().ok();
    let processes = device.running_compute_processes().ok().map(|list| {
        list.into_iter()
            .map(|p| GpuProcess {
                pid: p.pid,
                used_memory_bytes: match p.used_gpu_memory {
                    UsedGpuMemory::Used(bytes) => Some(bytes),
                    UsedGpuMemory::Unavailable => None,
                },
            })
            .collect()
    });
    Ok(Device {
        index,
        uuid,
        name,
        backend: Backend::Nvml,
        memory_total_bytes: memory.as_ref().map(|m| m.total),
        memory_used_bytes: memory.as_ref().map(|m| m.used),
        memory_free_bytes: memory.as_ref().map(|m| m.free),
        utilization_gpu_percent: utilization.as_ref().map(|u| u.gpu),
        utilization_memory_percent: utilization.as_ref().map(|u| u.memory),
        temperature_c: device.temperature(TemperatureSensor::Gpu).ok(),
        power_draw_w: device.power_usage().ok().map(|mw| f64::from(mw) / 1000.0),
        compute_capability: device
            .cuda_compute_capability()
            .ok()
            .map(|cc| format!("{}.{}", cc.major, cc.minor)),
        pci_bus_id: device.pci_info().ok().map(|p| p.bus_id),
        processes,
        mig_devices: read_mig_devices(&device),
        // The N of /dev/nvidiaN (Linux only); unknown when the driver does not say.
        minor_number: device.minor_number().ok(),
        numa_node: None,
        cpus: None,
        links: Vec::new(),
    })
}

/// MIG instances, when MIG mode is on. Slots without an instance are skipped.
fn read_mig_devices(device: &nvml_wrapper::Device<'_>) -> Vec<MigDevice> {
    let enabled = device.mig_mode().is_ok_and(|mode| mode.current == 1);
    if !enabled {
        return Vec::new();
    }
    let slots = device.mig_device_count().unwrap_or(0);
    (0..slots)
        .filter_map(|slot| device.mig_device_by_index(slot).ok())
        .filter_map(|mig| {
            Some(MigDevice {
                uuid: mig.uuid().ok()?,
                name: mig.name().ok(),
                memory_total_bytes: mig.memory_info().ok().map(|m| m.total),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn absence_is_an_error_value_not_a_panic() {
        // On a machine without the NVIDIA driver this is the reason users read; with one it lists GPUs.
        match super::read() {
            Ok(devices) => assert!(!devices.is_empty()),
            Err(err) => assert!(!err.to_string().is_empty()),
        }
    }
}
