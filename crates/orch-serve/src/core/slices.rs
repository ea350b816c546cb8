//! Jobs of MIG slices in the daemon: what one counts for in fair share and accounting.
//!
//! A slice is a share of its GPU's compute: its profile's compute slices over the GPU's
//! (`3g.40gb` of an H100's 7 is 3/7; orch-devices' `mig::compute_fraction`). A job of `gpus`
//! slices of one profile is charged `gpus` times that, in whole GPUs, for every second it runs.

use orch_core::JobSpec;
use orch_devices::{Device, mig};

/// The whole GPUs of compute a job of MIG slices holds, when it asks for slices (`mig`) and the
/// machine has one of its profile to measure; `None` for a job of whole GPUs.
pub fn gpu_equivalent(spec: &JobSpec, devices: &[Device]) -> Option<f64> {
    let profile = spec.resources.mig.as_deref()?;
    let fraction = devices.iter().find_map(|d| {
        d.mig_devices
            .iter()
            .find(|m| mig::is_profile(m, profile))
            .map(|m| mig::compute_fraction(d, m))
    })?;
    Some(f64::from(spec.resources.gpus) * fraction)
}

/// The profile of the MIG slices a job asks for to itself (an exclusive job of slices): the
/// scheduler's starvation bound holds that profile's free slices for it.
pub fn takes_slices(spec: &JobSpec) -> Option<&str> {
    spec.resources
        .mig
        .as_deref()
        .filter(|_| spec.resources.exclusive)
}

/// The free MIG slices among the `visible` devices, by profile (`1g.10gb`): in service and not
/// in `leased` (the uuids any lease holds). A visible entry with a slice's uuid (a
/// `CUDA_VISIBLE_DEVICES` that names slices) is that slice alone; a GPU in MIG mode is all its
/// slices; each slice counts once.
pub fn free_by_profile(
    visible: &[(&Device, Option<&str>)],
    leased: &std::collections::HashSet<&str>,
) -> std::collections::HashMap<String, u32> {
    let mut seen = std::collections::HashSet::new();
    let mut free = std::collections::HashMap::new();
    for &(d, named) in visible.iter().filter(|(d, _)| d.mig_mode) {
        for m in d
            .mig_devices
            .iter()
            .filter(|m| named.is_none_or(|uuid| uuid == m.uuid))
        {
            if seen.insert(m.uuid.as_str())
                && !leased.contains(m.uuid.as_str())
                && d.out_of_service(&m.uuid).is_none()
            {
                *free
                    .entry(mig::short_profile(mig::profile(m)).to_string())
                    .or_insert(0) += 1;
            }
        }
    }
    free
}

/// Whether the job's devices count against the scheduler's free whole GPUs: an exclusive job of
/// whole GPUs. Slices are found (or not) by placement itself.
pub fn takes_whole_gpus(spec: &JobSpec) -> bool {
    spec.resources.exclusive && spec.resources.mig.is_none()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slice_counts_as_its_share_of_the_gpu() {
        let devices = orch_devices::sim::parse(
            std::path::Path::new("box.toml"),
            "[[gpu]]\nname = \"H100\"\nmemory_total = \"80GiB\"\n[[gpu.mig]]\nuuid = \"MIG-aaaaaaaa-1\"\nname = \"3g.40gb\"\n[[gpu.mig]]\nuuid = \"MIG-aaaaaaaa-2\"\nname = \"1g.10gb\"\n",
        )
        .unwrap();
        let job = |resources: &str| {
            orch_core::job::parse(
                std::path::Path::new("job.toml"),
                &format!("[job]\nname = \"j\"\n[resources]\n{resources}[command]\nargv = [\"true\"]\nlaunch = \"per-device\"\n"),
            )
            .unwrap()
        };
        let three = gpu_equivalent(&job("mig = \"3g.40gb\"\n"), &devices).unwrap();
        assert!((three - 3.0 / 7.0).abs() < 1e-12, "{three}");
        let two_small = gpu_equivalent(&job("gpus = 2\nmig = \"1g.10gb\"\n"), &devices).unwrap();
        assert!((two_small - 2.0 / 7.0).abs() < 1e-12, "{two_small}");
        assert_eq!(gpu_equivalent(&job("gpus = 2\n"), &devices), None);
        assert!(!takes_whole_gpus(&job("mig = \"1g.10gb\"\n")));
        assert!(takes_whole_gpus(&job("gpus = 2\n")));
        assert_eq!(takes_slices(&job("mig = \"1g.10gb\"\n")), Some("1g.10gb"));
        assert_eq!(takes_slices(&job("gpus = 2\n")), None);
    }

    #[test]
    fn free_slices_are_counted_by_profile_once_each_and_only_where_visible() {
        let devices = orch_devices::sim::parse(
            std::path::Path::new("box.toml"),
            "[[gpu]]\nname = \"H100\"\nmemory_total = \"80GiB\"\n[[gpu.mig]]\nuuid = \"MIG-a\"\nname = \"1g.10gb\"\n[[gpu.mig]]\nuuid = \"MIG-b\"\nname = \"1g.10gb\"\n[[gpu.mig]]\nuuid = \"MIG-c\"\nname = \"NVIDIA H100 80GB HBM3 MIG 3g.40gb\"\n[[gpu]]\nname = \"H100\"\nmemory_total = \"80GiB\"\n",
        )
        .unwrap();
        let (gpu, whole) = (&devices[0], &devices[1]);
        let none = std::collections::HashSet::new();
        // The whole GPU has no slices; the MIG GPU's are counted by their profile's last word.
        let all = free_by_profile(&[(gpu, None), (whole, None)], &none);
        assert_eq!(
            all,
            std::collections::HashMap::from([
                ("1g.10gb".to_string(), 2),
                ("3g.40gb".to_string(), 1)
            ])
        );
        // A leased slice is not free.
        let leased = std::collections::HashSet::from(["MIG-a"]);
        assert_eq!(free_by_profile(&[(gpu, None)], &leased)["1g.10gb"], 1);
        // Slices named one by one count once each, and only those named.
        let named = free_by_profile(&[(gpu, Some("MIG-b")), (gpu, Some("MIG-b"))], &none);
        assert_eq!(
            named,
            std::collections::HashMap::from([("1g.10gb".to_string(), 1)])
        );
    }
}
