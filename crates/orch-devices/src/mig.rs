//! MIG slices as devices of their own: their profile and share of the GPU's compute, the
//! capability nodes (`/dev/nvidia-caps/nvidia-cap<N>`) a slice's process opens, and where the
//! driver says which minor number each capability has.
//!
//! A process on a MIG slice opens its GPU's node (`/dev/nvidiaN`) and the `access` capability
//! nodes of the slice's GPU instance and compute instance. The driver lists their minor numbers
//! in `/proc/driver/nvidia-caps/mig-minors` (`gpu0/gi1/access 12`, `gpu0/gi1/ci0/access 13`), as
//! Slurm's NVML plugin reads them; the nodes are character devices of the `nvidia-caps` major
//! (`/proc/devices`).

use crate::{Device, MigDevice};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Where the driver lists the MIG capabilities' minor numbers.
pub const MIG_MINORS: &str = "/proc/driver/nvidia-caps/mig-minors";
/// Reads another file than [`MIG_MINORS`] (tests, a chroot).
pub const MIG_MINORS_ENV: &str = "ORCH_MIG_MINORS";
/// Reads another file than `/proc/devices` for the `nvidia-caps` major (tests).
pub const PROC_DEVICES_ENV: &str = "ORCH_PROC_DEVICES";
/// The compute slices of a GPU in MIG mode when the inventory does not say (A100, H100, H200).
pub const DEFAULT_SLOTS: u32 = 7;

/// The slice's profile as written (`1g.10gb`); `""` when the inventory has no name for it.
pub fn profile(slice: &MigDevice) -> &str {
    slice.name.as_deref().unwrap_or("")
}

/// Whether a slice's name is the profile `wanted`. NVML names a slice `NVIDIA H100 80GB HBM3
/// MIG 1g.10gb`; a sim file names it by the profile alone. Both match `1g.10gb`.
pub fn is_profile(slice: &MigDevice, wanted: &str) -> bool {
    let name = profile(slice);
    name == wanted || name.rsplit(' ').next() == Some(wanted)
}

/// The compute slices of a profile name: `3` for `3g.40gb`, `1` for `1c.3g.40gb` (a compute
/// instance of one slice in a 3-slice GPU instance), read from the name's last word. `None`
/// when the name says none.
pub fn compute_slices(name: &str) -> Option<u32> {
    let word = name.rsplit(' ').next()?;
    let first = word.split('.').next()?;
    let digits = first
        .strip_suffix('g')
        .or_else(|| first.strip_suffix('c'))?;
    digits.parse().ok().filter(|n| *n > 0)
}

/// The share of its GPU's compute a slice of `parent` is: its profile's compute slices over the
/// GPU's ([`Device::mig_slots`], else [`DEFAULT_SLOTS`]), at most 1. A name that says no count is
/// counted as the whole GPU.
pub fn compute_fraction(parent: &Device, slice: &MigDevice) -> f64 {
    let slots = parent.mig_slots.unwrap_or(DEFAULT_SLOTS).max(1);
    match compute_slices(profile(slice)) {
        Some(n) => (f64::from(n) / f64::from(slots)).min(1.0),
        None => 1.0,
    }
}

/// The slice of uuid `uuid` and its GPU.
pub fn find<'a>(devices: &'a [Device], uuid: &str) -> Option<(&'a Device, &'a MigDevice)> {
    devices.iter().find_map(|d| {
        d.mig_devices
            .iter()
            .find(|m| m.uuid == uuid)
            .map(|m| (d, m))
    })
}

/// The profiles of every slice of `devices`, sorted, each once (for messages).
pub fn profiles(devices: &[Device]) -> Vec<String> {
    let mut names: Vec<String> = devices
        .iter()
        .flat_map(|d| d.mig_devices.iter())
        .map(|m| short_profile(profile(m)).to_string())
        .filter(|n| !n.is_empty())
        .collect();
    names.sort();
    names.dedup();
    names
}

/// The profile part of a slice's name (its last word).
pub fn short_profile(name: &str) -> &str {
    name.rsplit(' ').next().unwrap_or(name)
}

/// Both capability minors of a slice that the inventory knows.
pub fn cap_minors(slice: &MigDevice) -> impl Iterator<Item = u32> {
    slice
        .gpu_instance_cap_minor
        .into_iter()
        .chain(slice.compute_instance_cap_minor)
}

/// The minor numbers `mig-minors` lists, by capability path (`gpu0/gi1/access`).
pub fn parse_mig_minors(text: &str) -> HashMap<String, u32> {
    text.lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            let path = words.next()?;
            let minor = words.next()?.parse().ok()?;
            Some((path.to_string(), minor))
        })
        .collect()
}

/// The file [`MIG_MINORS_ENV`] names, else [`MIG_MINORS`].
pub fn mig_minors_path() -> PathBuf {
    std::env::var_os(MIG_MINORS_ENV)
        .filter(|p| !p.is_empty())
        .map_or_else(|| PathBuf::from(MIG_MINORS), PathBuf::from)
}

/// The capability minors of the slice `gi`/`ci` of the GPU of minor number `gpu_minor`, from
/// the listing `minors`: (GPU instance's, compute instance's).
pub fn lookup_cap_minors(
    minors: &HashMap<String, u32>,
    gpu_minor: u32,
    gi: u32,
    ci: u32,
) -> (Option<u32>, Option<u32>) {
    (
        minors
            .get(&format!("gpu{gpu_minor}/gi{gi}/access"))
            .copied(),
        minors
            .get(&format!("gpu{gpu_minor}/gi{gi}/ci{ci}/access"))
            .copied(),
    )
}

/// Reads [`mig_minors_path`]; empty when it cannot be read (no MIG driver support).
pub fn read_mig_minors() -> HashMap<String, u32> {
    std::fs::read_to_string(mig_minors_path())
        .map(|text| parse_mig_minors(&text))
        .unwrap_or_default()
}

/// The character major of `name` in a `/proc/devices` listing.
pub fn char_major(proc_devices: &str, name: &str) -> Option<u32> {
    proc_devices
        .lines()
        .skip_while(|l| l.trim() != "Character devices:")
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .find_map(|l| {
            let mut words = l.split_whitespace();
            let major = words.next()?.parse().ok()?;
            (words.next()? == name).then_some(major)
        })
}

/// The major of the `nvidia-caps` nodes on this machine (`/proc/devices`, or the file
/// [`PROC_DEVICES_ENV`] names); `None` without the driver's MIG support.
pub fn caps_major() -> Option<u32> {
    let path = std::env::var_os(PROC_DEVICES_ENV)
        .filter(|p| !p.is_empty())
        .map_or_else(|| PathBuf::from("/proc/devices"), PathBuf::from);
    caps_major_in(&path)
}

fn caps_major_in(path: &Path) -> Option<u32> {
    char_major(&std::fs::read_to_string(path).ok()?, "nvidia-caps")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profiles_and_their_share_of_the_gpu() {
        assert_eq!(compute_slices("1g.10gb"), Some(1));
        assert_eq!(compute_slices("3g.40gb"), Some(3));
        assert_eq!(compute_slices("NVIDIA H100 80GB HBM3 MIG 2g.20gb"), Some(2));
        assert_eq!(compute_slices("1c.3g.40gb"), Some(1));
        assert_eq!(compute_slices("1g.10gb+me"), Some(1));
        assert_eq!(compute_slices("whole"), None);
        let slice = |name: &str| MigDevice {
            uuid: "MIG-x".into(),
            name: Some(name.into()),
            memory_total_bytes: None,
            memory_used_bytes: None,
            gpu_instance_id: None,
            compute_instance_id: None,
            gpu_instance_cap_minor: None,
            compute_instance_cap_minor: None,
        };
        assert!(is_profile(&slice("NVIDIA H100 MIG 1g.10gb"), "1g.10gb"));
        assert!(is_profile(&slice("1g.10gb"), "1g.10gb"));
        assert!(!is_profile(&slice("1g.20gb"), "1g.10gb"));
        let mut gpu = crate::sim::parse(
            Path::new("t.toml"),
            "[[gpu]]\nname = \"a\"\nmemory_total = 1\n",
        )
        .unwrap()
        .remove(0);
        assert!((compute_fraction(&gpu, &slice("3g.40gb")) - 3.0 / 7.0).abs() < 1e-12);
        gpu.mig_slots = Some(4);
        assert!((compute_fraction(&gpu, &slice("2g.12gb")) - 0.5).abs() < 1e-12);
        assert_eq!(compute_fraction(&gpu, &slice("odd")), 1.0);
    }

    #[test]
    fn reads_the_drivers_listings() {
        let minors = parse_mig_minors(
            "config 1\nmonitor 2\ngpu0/gi1/access 12\ngpu0/gi1/ci0/access 13\ngpu1/gi2/access 30\n",
        );
        assert_eq!(lookup_cap_minors(&minors, 0, 1, 0), (Some(12), Some(13)));
        assert_eq!(lookup_cap_minors(&minors, 1, 2, 0), (Some(30), None));
        assert_eq!(lookup_cap_minors(&minors, 2, 0, 0), (None, None));
        let devices = "Character devices:\n  1 mem\n195 nvidia\n234 nvidia-caps\n\nBlock devices:\n  7 loop\n";
        assert_eq!(char_major(devices, "nvidia-caps"), Some(234));
        assert_eq!(char_major(devices, "nvidia"), Some(195));
        assert_eq!(char_major(devices, "loop"), None, "a block device");
        assert_eq!(char_major("", "nvidia-caps"), None);
    }
}
