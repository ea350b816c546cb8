use super::*;

fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "orch-leases-{tag}-{}-{}",
        std::process::id(),
        now_ms()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn request(name: &str, exclusive: bool) -> ClaimRequest {
    ClaimRequest {
        job_name: name.into(),
        exclusive,
        memory_reserved_bytes: 1 << 30,
        holder: Holder::current(),
        inside: None,
    }
}

fn take(devices: &[&str]) -> impl FnOnce(&[DeviceLease]) -> Result<Vec<String>, String> {
    let devices: Vec<String> = devices.iter().map(|d| d.to_string()).collect();
    move |_| Ok(devices)
}

#[test]
fn claim_list_release() {
    let mut store = LeaseStore::open(&temp_dir("basic")).unwrap();
    let lease = store
        .claim(&request("train", true), take(&["GPU-b", "GPU-a"]))
        .unwrap();
    assert_eq!(lease.devices, vec!["GPU-b", "GPU-a"], "rank order kept");
    let active = store.active().unwrap();
    assert_eq!(active, vec![lease.clone()]);
    assert!(store.release(&lease.id).unwrap());
    assert!(!store.release(&lease.id).unwrap());
    assert!(store.active().unwrap().is_empty());
}

#[test]
fn the_chooser_sees_current_leases_and_conflicts_are_refused() {
    let mut store = LeaseStore::open(&temp_dir("conflict")).unwrap();
    store.claim(&request("a", true), take(&["GPU-a"])).unwrap();
    store.claim(&request("b", false), take(&["GPU-b"])).unwrap();
    let seen = store
        .claim(
            &request("c", false),
            |leases: &[DeviceLease]| -> Result<Vec<String>, String> {
                Ok(vec![format!("GPU-seen-{}", leases.len())])
            },
        )
        .unwrap();
    assert_eq!(seen.devices, vec!["GPU-seen-2"]);
    // Exclusive on a device with a shared lease, and shared on an exclusive one, both conflict.
    for (exclusive, device) in [(true, "GPU-b"), (false, "GPU-a")] {
        let err = store
            .claim(&request("d", exclusive), take(&[device]))
            .unwrap_err();
        assert!(matches!(err, ClaimError::Conflict { .. }), "{err}");
    }
    // Two shared leases may share a device.
    store.claim(&request("e", false), take(&["GPU-b"])).unwrap();
}

#[test]
fn a_refusal_writes_nothing() {
    let mut store = LeaseStore::open(&temp_dir("refuse")).unwrap();
    let err = store
        .claim(&request("a", true), |_: &[DeviceLease]| {
            Err::<Vec<String>, _>("no fit".to_string())
        })
        .unwrap_err();
    assert!(matches!(err, ClaimError::Choose(ref why) if why == "no fit"));
    assert!(store.active().unwrap().is_empty());
}

#[test]
fn dead_holders_lose_their_lease_and_live_children_keep_it() {
    let mut store = LeaseStore::open(&temp_dir("dead")).unwrap();
    let mut dead = std::process::Command::new("true").spawn().unwrap();
    let dead_holder = Holder::of_pid(dead.id()).unwrap();
    dead.wait().unwrap();
    let gone = ClaimRequest {
        holder: dead_holder.clone(),
        ..request("gone", true)
    };
    store.claim(&gone, take(&["GPU-a"])).unwrap();

    let mut child = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    let orphan = ClaimRequest {
        holder: dead_holder,
        ..request("orphan", true)
    };
    let kept = store.claim(&orphan, take(&["GPU-b"])).unwrap();
    store
        .add_holder(&kept.id, Holder::of_pid(child.id()).unwrap())
        .unwrap();

    let active = store.active().unwrap();
    assert_eq!(
        active
            .iter()
            .map(|l| l.job_name.as_str())
            .collect::<Vec<_>>(),
        vec!["orphan"]
    );
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        store.active().unwrap().is_empty(),
        "reclaimed once the child is gone too"
    );
}

#[test]
fn concurrent_claims_never_share_an_exclusive_device() {
    let dir = temp_dir("race");
    LeaseStore::open(&dir).unwrap();
    let devices: Vec<String> = (0..4).map(|i| format!("GPU-{i}")).collect();
    let threads: Vec<_> = (0..16)
        .map(|t| {
            let dir = dir.clone();
            let devices = devices.clone();
            std::thread::spawn(move || {
                let mut store = LeaseStore::open(&dir).unwrap();
                store.claim(
                    &request(&format!("t{t}"), true),
                    |leases: &[DeviceLease]| {
                        let free = devices
                            .iter()
                            .find(|d| leases.iter().all(|l| &l.device_uuid != *d));
                        free.map(|d| vec![d.clone()])
                            .ok_or_else(|| "no fit".to_string())
                    },
                )
            })
        })
        .collect();
    let results: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    let won: Vec<&Lease> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
    assert_eq!(won.len(), 4, "exactly one winner per device");
    let mut taken: Vec<&str> = won.iter().map(|l| l.devices[0].as_str()).collect();
    taken.sort_unstable();
    taken.dedup();
    assert_eq!(taken.len(), 4);
    assert!(
        results
            .iter()
            .filter(|r| r.is_err())
            .all(|r| matches!(r, Err(ClaimError::Choose(_))))
    );
}

#[test]
fn ids_are_unique_and_readable() {
    let ids: std::collections::HashSet<String> = (0..1000).map(|_| new_id("my job/1")).collect();
    assert_eq!(ids.len(), 1000);
    assert!(ids.iter().all(|id| id.starts_with("my-job-1-")));
}

#[test]
fn a_lease_outlives_its_watcher_while_a_process_of_the_job_lives() {
    let mut store = LeaseStore::open(&temp_dir("unless-held")).unwrap();
    let lease = store
        .claim(&request("job", true), take(&["GPU-a"]))
        .unwrap();
    let mut child = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    store
        .add_holder(&lease.id, Holder::of_pid(child.id()).unwrap())
        .unwrap();
    assert!(
        !store
            .release_unless_held(&lease.id, &[Holder::current()])
            .unwrap()
    );
    assert_eq!(
        store.active().unwrap().len(),
        1,
        "the job's process still holds it"
    );
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(
        store.active().unwrap().len(),
        0,
        "reclaimed once the process is gone"
    );
    assert!(
        store
            .release_unless_held(&lease.id, &[Holder::current()])
            .unwrap()
    );
}

#[test]
fn a_claim_inside_a_lease_may_take_its_devices_and_no_others() {
    let mut store = LeaseStore::open(&temp_dir("inside")).unwrap();
    let outer = store
        .claim(&request("outer", true), take(&["GPU-a", "GPU-b"]))
        .unwrap();
    let other = store
        .claim(&request("other", true), take(&["GPU-c"]))
        .unwrap();
    assert!(
        !outer.contains_process(std::process::id()),
        "holding a lease is not being inside it"
    );
    let mut child = std::process::Command::new("sleep")
        .arg("5")
        .spawn()
        .unwrap();
    let inside = outer.contains_process(child.id());
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(inside, "a child of a holder is inside");
    let inner = ClaimRequest {
        inside: Some(outer.id.clone()),
        ..request("inner", true)
    };
    store.claim(&inner, take(&["GPU-a"])).unwrap();
    let err = store.claim(&inner, take(&["GPU-c"])).unwrap_err();
    assert!(err.to_string().contains(&other.id), "{err}");
    // Without `inside`, the outer lease's devices conflict as always.
    assert!(
        store
            .claim(&request("plain", true), take(&["GPU-b"]))
            .is_err()
    );
}

#[test]
fn a_shared_fallback_folder_is_used_only_when_it_is_privately_ours() {
    use std::os::unix::fs::PermissionsExt;
    let base = temp_dir("private");
    let fresh = base.join("fresh");
    assert_eq!(super::ensure_private(&fresh), Ok(()));
    let open = base.join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    assert!(
        super::ensure_private(&open)
            .unwrap_err()
            .contains("not a private folder")
    );
    let link = base.join("link");
    std::os::unix::fs::symlink(&fresh, &link).unwrap();
    assert!(
        super::ensure_private(&link).is_err(),
        "a link is never trusted"
    );
}

/// The child's part of `processes_opening_a_new_store_together_all_get_it`: wait for the agreed
/// instant, open the store named in the environment, exit 0 or print why and exit 1.
#[test]
fn open_in_a_child_process() {
    let (Ok(dir), Ok(at)) = (
        std::env::var("ORCH_TEST_OPEN_DIR"),
        std::env::var("ORCH_TEST_OPEN_AT_MS"),
    ) else {
        return; // Run as an ordinary test: nothing to do.
    };
    let at: u64 = at.parse().unwrap();
    // Asleep until just before the instant, then spinning to it.
    std::thread::sleep(Duration::from_millis(at.saturating_sub(now_ms() + 5)));
    while now_ms() < at {
        std::hint::spin_loop();
    }
    match LeaseStore::open(Path::new(&dir)) {
        Ok(_) => {
            println!("opened the store");
            std::process::exit(0)
        }
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1)
        }
    }
}

#[test]
fn processes_opening_a_new_store_together_all_get_it() {
    // Each round starts many processes that open one new store at the same instant (as the
    // ranks of a Slurm job or a burst of `orch run`s do); every one must get it. Switching a new
    // file to WAL used to answer "database is locked" to some of them at once.
    let exe = std::env::current_exe().unwrap();
    for round in 0..6 {
        let dir = temp_dir(&format!("together-{round}"));
        let at = now_ms() + 400;
        let children: Vec<_> = (0..24)
            .map(|_| {
                std::process::Command::new(&exe)
                    .args([
                        "--exact",
                        "store::tests::open_in_a_child_process",
                        "--nocapture",
                        "--test-threads=1",
                    ])
                    .env("ORCH_TEST_OPEN_DIR", &dir)
                    .env("ORCH_TEST_OPEN_AT_MS", at.to_string())
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        for child in children {
            let out = child.wait_with_output().unwrap();
            assert!(
                out.status.success(),
                "round {round}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            // The child ran the open (a renamed child test would match nothing and pass).
            assert!(
                String::from_utf8_lossy(&out.stdout).contains("opened the store"),
                "round {round}: the child did not open the store"
            );
        }
        std::fs::remove_dir_all(&dir).ok();
    }
}
