//! The plan over the 8-GPU lab sim: leases, visibility and impossible requests.

use orch_core::{DeviceLease, JobSpec, job};
use orch_devices::{Device, Visibility, VisibilityEnv, sim};
use orch_host::{Limits, PolicyHost};
use orch_runner::{PlanError, PlanInput, plan};
use std::path::{Path, PathBuf};

fn lab() -> Vec<Device> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/sim/lab-8gpu.toml");
    sim::read(&path).expect("lab sim")
}

fn host() -> PolicyHost {
    let cache = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("orch-cache");
    PolicyHost::with_cache_dir(Limits::default(), Some(cache)).expect("host")
}

fn job(text: &str) -> JobSpec {
    job::parse(Path::new("plan/job.toml"), text).expect("valid job")
}

fn lease(devices: &[Device], index: usize, exclusive: bool, reserved_gib: u64) -> DeviceLease {
    DeviceLease {
        job_id: format!("j{index}"),
        job_name: format!("other{index}"),
        device_uuid: devices[index].uuid.clone(),
        exclusive,
        memory_reserved_bytes: reserved_gib << 30,
    }
}

fn visibility(devices: &[Device], cuda_visible: Option<&str>) -> Visibility {
    let env = VisibilityEnv {
        cuda_visible_devices: cuda_visible.map(str::to_string),
        ..VisibilityEnv::default()
    };
    Visibility::resolve(devices, &env)
}

const TWO: &str = "[job]\nname = \"two\"\n[resources]\ngpus = 2\nmin_free_memory = \"10GiB\"\n[command]\nargv = [\"true\"]\n";

#[test]
fn leases_exclude_and_reserve() {
    let devices = lab();
    let vis = visibility(&devices, None);
    let job = job(TWO);
    let no_env = |_: &str| None;
    let free = plan(
        PlanInput {
            job: &job,
            devices: &devices,
            visibility: &vis,
            leases: &[],
        },
        &mut host(),
        &no_env,
    )
    .unwrap();
    let chosen: Vec<u32> = free.chosen.iter().map(|d| d.index).collect();
    assert_eq!(chosen, vec![1, 4]);

    // GPU 1 held exclusively, GPU 4 shared by a job reserving 75 GiB: 4.5 GiB left.
    let leases = [lease(&devices, 1, true, 0), lease(&devices, 4, false, 75)];
    let shared_job = self::job(&TWO.replace("gpus = 2", "gpus = 2\nexclusive = false"));
    let p = plan(
        PlanInput {
            job: &shared_job,
            devices: &devices,
            visibility: &vis,
            leases: &leases,
        },
        &mut host(),
        &no_env,
    )
    .unwrap();
    let chosen: Vec<u32> = p.chosen.iter().map(|d| d.index).collect();
    assert_eq!(chosen, vec![7, 5], "{p:?}");
    let why = |i: u32| {
        p.rejected
            .iter()
            .find(|r| r.index == i)
            .unwrap()
            .why
            .clone()
    };
    assert_eq!(why(1), "held exclusively by job other1");
    assert_eq!(why(4), "4.5 GiB free < 10.0 GiB requested");
    assert_eq!(why(3), "2.1 GiB free < 10.0 GiB requested");
    assert_eq!(why(2), "fits, not chosen by least-loaded");

    // An exclusive request does not share: the shared lease keeps GPU 4 out too.
    let p = plan(
        PlanInput {
            job: &job,
            devices: &devices,
            visibility: &vis,
            leases: &leases,
        },
        &mut host(),
        &no_env,
    )
    .unwrap();
    let why = |i: u32| {
        p.rejected
            .iter()
            .find(|r| r.index == i)
            .unwrap()
            .why
            .clone()
    };
    assert!(why(4).contains("shared with job other4"), "{}", why(4));
}

#[test]
fn logical_indices_follow_cuda_visible_devices() {
    let devices = lab();
    let vis = visibility(&devices, Some("6,2,7"));
    let job = job(TWO);
    let p = plan(
        PlanInput {
            job: &job,
            devices: &devices,
            visibility: &vis,
            leases: &[],
        },
        &mut host(),
        &|_| None,
    )
    .unwrap();
    // Visible: CUDA 0 = GPU 6 (60%), CUDA 1 = GPU 2 (45%), CUDA 2 = GPU 7 (3%).
    let chosen: Vec<(u32, u32)> = p
        .chosen
        .iter()
        .map(|d| (d.index, d.physical_index))
        .collect();
    assert_eq!(chosen, vec![(2, 7), (1, 2)]);
    assert_eq!(p.rejected.len(), 1);
    assert_eq!(p.hidden, 5);
}

#[test]
fn more_gpus_than_visible_is_bad_input_at_gpus() {
    let devices = lab();
    let job = job(&TWO.replace("gpus = 2", "gpus = 9"));
    let err = plan(
        PlanInput {
            job: &job,
            devices: &devices,
            visibility: &visibility(&devices, None),
            leases: &[],
        },
        &mut host(),
        &|_| None,
    )
    .unwrap_err();
    assert!(err.is_bad_input());
    assert_eq!(
        err.to_string(),
        "plan/job.toml:4:8: gpus = 9, but this machine has 8 device(s) (ask for at most 8)"
    );
    let job = self::job(&TWO.replace("gpus = 2", "gpus = 3"));
    let err = plan(
        PlanInput {
            job: &job,
            devices: &devices,
            visibility: &visibility(&devices, Some("0,1")),
            leases: &[],
        },
        &mut host(),
        &|_| None,
    )
    .unwrap_err();
    assert!(
        err.to_string()
            .contains("only 2 of the 8 device(s) here are visible"),
        "{err}"
    );
}

#[test]
fn unknown_policies_point_at_the_plugin_key() {
    let devices = lab();
    let job = job(&TWO.replace(
        "[command]",
        "[policy]\nplugin = \"least-laoded\"\n[command]",
    ));
    let err = plan(
        PlanInput {
            job: &job,
            devices: &devices,
            visibility: &visibility(&devices, None),
            leases: &[],
        },
        &mut host(),
        &|_| None,
    )
    .unwrap_err();
    assert!(matches!(err, PlanError::Input(_)));
    let text = err.to_string();
    assert!(
        text.starts_with("plan/job.toml:7:10: unknown built-in policy `least-laoded`"),
        "{text}"
    );
}

#[test]
fn the_env_policy_gets_only_the_variable_its_config_names() {
    let devices = lab();
    let job = job(&TWO.replace("[command]", "[policy]\nplugin = \"env\"\n[command]"));
    let env = |name: &str| (name == "CLOUD_GPU_ID").then(|| "5,GPU-d4e5f6a7".to_string());
    let p = plan(
        PlanInput {
            job: &job,
            devices: &devices,
            visibility: &visibility(&devices, None),
            leases: &[],
        },
        &mut host(),
        &env,
    )
    .unwrap();
    let chosen: Vec<u32> = p.chosen.iter().map(|d| d.index).collect();
    assert_eq!(chosen, vec![5, 7]);
    let unset = plan(
        PlanInput {
            job: &job,
            devices: &devices,
            visibility: &visibility(&devices, None),
            leases: &[],
        },
        &mut host(),
        &|_| None,
    )
    .unwrap_err();
    assert!(unset.is_bad_input());
    assert!(
        unset.to_string().contains("CLOUD_GPU_ID is not set"),
        "{unset}"
    );
}

#[test]
fn a_plan_made_on_a_snapshot_is_checked_against_the_leases_held_now() {
    let devices = lab();
    let vis = visibility(&devices, None);
    let job = job(TWO);
    let no_env = |_: &str| None;
    let input = |leases: &'static [DeviceLease]| PlanInput {
        job: &job,
        devices: &devices,
        visibility: &vis,
        leases,
    };
    let made = plan(input(&[]), &mut host(), &no_env).unwrap();
    let chosen: Vec<u32> = made.chosen.iter().map(|d| d.index).collect();
    assert_eq!(chosen, vec![1, 4]);
    // Nothing changed: the plan holds, with the reason its policy gave.
    let again = orch_runner::recheck(input(&[]), &made, &no_env).unwrap();
    assert_eq!(again.chosen, made.chosen);
    assert_eq!(again.reason, made.reason);
    // A device it chose was taken meanwhile: it no longer holds, and says why.
    let taken: &'static [DeviceLease] = Box::leak(Box::new([lease(&devices, 4, true, 0)]));
    let stale = orch_runner::recheck(input(taken), &made, &no_env).unwrap_err();
    assert!(
        stale.contains("device 4 is now held exclusively by job other4"),
        "{stale}"
    );
    // A device it chose is no longer visible to the daemon.
    let fewer = visibility(&devices, Some("0,1,2"));
    let hidden = orch_runner::recheck(
        PlanInput {
            visibility: &fewer,
            ..input(&[])
        },
        &made,
        &no_env,
    )
    .unwrap_err();
    assert!(
        hidden.contains("no longer one it may be placed on"),
        "{hidden}"
    );
    // A plan that names one device twice, for a two-device request, is refused.
    let mut twice = made.clone();
    twice.chosen[1] = twice.chosen[0].clone();
    let doubled = orch_runner::recheck(input(&[]), &twice, &no_env).unwrap_err();
    assert!(doubled.contains("more than once"), "{doubled}");
}
