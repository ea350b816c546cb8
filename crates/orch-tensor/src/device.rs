//! Where a tensor lives: the host CPU, a CUDA device, or a simulated GPU.

use std::fmt;
use std::str::FromStr;

/// A compute device. `Sim(n)` computes on the CPU backend but is a distinct device with its own
/// memory accounting, so code written for GPUs (quotas, moves, device mismatches) runs without one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Device {
    Cpu,
    Cuda(usize),
    Sim(usize),
}

impl Device {
    /// True for devices whose data lives in host memory (`Cpu` and `Sim`).
    pub fn is_host(self) -> bool {
        matches!(self, Device::Cpu | Device::Sim(_))
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(n) => write!(f, "cuda:{n}"),
            Device::Sim(n) => write!(f, "sim:{n}"),
        }
    }
}

/// `cpu`, `cuda:N` or `sim:N` (`cuda` and `sim` alone mean index 0).
impl FromStr for Device {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (kind, index) = match s.split_once(':') {
            Some((kind, index)) => {
                let n = index.parse::<usize>().map_err(|_| {
                    format!(
                        "device `{s}`: `{index}` is not a device index (expected cuda:N or sim:N)"
                    )
                })?;
                (kind, n)
            }
            None => (s, 0),
        };
        match (kind, s.contains(':')) {
            ("cpu", false) => Ok(Device::Cpu),
            ("cuda", _) => Ok(Device::Cuda(index)),
            ("sim", _) => Ok(Device::Sim(index)),
            _ => Err(format!("device `{s}` is not one of cpu, cuda:N, sim:N")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_through_text() {
        for d in [Device::Cpu, Device::Cuda(3), Device::Sim(1)] {
            assert_eq!(d.to_string().parse::<Device>(), Ok(d));
        }
        assert_eq!("cuda".parse::<Device>(), Ok(Device::Cuda(0)));
        assert!("cpu:1".parse::<Device>().is_err());
        assert!("tpu:0".parse::<Device>().is_err());
        assert!("cuda:x".parse::<Device>().is_err());
    }
}
