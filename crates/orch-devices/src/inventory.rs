//! Choosing and loading an inventory: `auto`, `nvml`, `cpu` or `sim:PATH`.

use crate::{Backend, Device, DeviceError, cpu, nvml, sim};
use std::path::PathBuf;
use std::str::FromStr;

/// Which inventory to read, as given by `--devices` or `ORCH_DEVICES`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum InventorySpec {
    /// NVML when it initialises and finds at least one GPU, else the CPU.
    #[default]
    Auto,
    Nvml,
    Cpu,
    Sim(PathBuf),
}

impl FromStr for InventorySpec {
    type Err = DeviceError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "" | "auto" => Ok(InventorySpec::Auto),
            "nvml" => Ok(InventorySpec::Nvml),
            "cpu" => Ok(InventorySpec::Cpu),
            other => match other.strip_prefix("sim:") {
                Some(path) if !path.is_empty() => Ok(InventorySpec::Sim(PathBuf::from(path))),
                _ => Err(DeviceError::BadSpec(s.to_string())),
            },
        }
    }
}

impl InventorySpec {
    /// Whether it may read the machine's real GPUs (NVML): `auto` and `nvml`, not `cpu` or a
    /// simulation.
    pub fn may_be_real(&self) -> bool {
        matches!(self, InventorySpec::Auto | InventorySpec::Nvml)
    }
}

/// The devices of one machine, from one backend.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Inventory {
    pub backend: Backend,
    pub devices: Vec<Device>,
    /// Why `auto` did not pick NVML, when it did not (shown to the user as a note).
    pub fallback_reason: Option<String>,
}

impl Inventory {
    /// Reads the inventory `spec` names.
    pub fn load(spec: &InventorySpec) -> Result<Inventory, DeviceError> {
        match spec {
            InventorySpec::Nvml => Ok(Inventory::from(Backend::Nvml, nvml::read()?)),
            InventorySpec::Cpu => Ok(Inventory::from(Backend::Cpu, vec![cpu::read()?])),
            InventorySpec::Sim(path) => Ok(Inventory::from(Backend::Sim, sim::read(path)?)),
            InventorySpec::Auto => match nvml::read() {
                Ok(devices) => {
                    tracing::info!("devices: NVML, {} GPU(s)", devices.len());
                    Ok(Inventory::from(Backend::Nvml, devices))
                }
                Err(err) => {
                    tracing::info!("note: no NVIDIA GPU in use ({err}); using the CPU device");
                    let mut inventory = Inventory::from(Backend::Cpu, vec![cpu::read()?]);
                    inventory.fallback_reason = Some(err.to_string());
                    Ok(inventory)
                }
            },
        }
    }

    fn from(backend: Backend, devices: Vec<Device>) -> Inventory {
        Inventory {
            backend,
            devices,
            fallback_reason: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_specs() {
        assert_eq!(
            "auto".parse::<InventorySpec>().unwrap(),
            InventorySpec::Auto
        );
        assert_eq!(
            "nvml".parse::<InventorySpec>().unwrap(),
            InventorySpec::Nvml
        );
        assert_eq!("cpu".parse::<InventorySpec>().unwrap(), InventorySpec::Cpu);
        assert_eq!(
            "sim:a/b.toml".parse::<InventorySpec>().unwrap(),
            InventorySpec::Sim("a/b.toml".into())
        );
        for bad in ["gpu", "sim:", "SIM:x", "nvml0"] {
            let err = bad.parse::<InventorySpec>().unwrap_err();
            assert!(err.is_bad_input());
            assert!(
                err.to_string().contains("auto, nvml, cpu or sim:PATH"),
                "{err}"
            );
        }
    }
}
