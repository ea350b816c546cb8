//! The C functions called as nvml-wrapper calls them, return codes included. The library has one
//! global state (as NVML has), so the tests take turns.

use super::*;
use std::ptr;

static TURN: Mutex<()> = Mutex::new(());

/// Holds the turn and an initialised library over `text`; shuts it down when dropped.
struct Session {
    _turn: MutexGuard<'static, ()>,
    path: PathBuf,
}

impl Session {
    fn new(tag: &str, text: &str) -> Session {
        let turn = TURN.lock().unwrap_or_else(PoisonError::into_inner);
        // A failed test may have left the library initialised.
        while library().is_some() {
            unsafe { nvmlShutdown() };
        }
        let dir = std::env::temp_dir().join(format!("orch-nvml-sim-{}-{tag}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("box.toml");
        std::fs::write(&path, text).unwrap();
        assert_eq!(init_from(Some(path.clone())), SUCCESS);
        Session { _turn: turn, path }
    }

    fn rewrite(&self, text: &str) {
        let next = self.path.with_extension("new");
        std::fs::write(&next, text).unwrap();
        std::fs::rename(&next, &self.path).unwrap();
        // The library looks at the file again after RECHECK.
        std::thread::sleep(RECHECK * 2);
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        while library().is_some() {
            unsafe { nvmlShutdown() };
        }
        let _ = std::fs::remove_dir_all(self.path.parent().unwrap());
    }
}

fn handle(index: u32) -> sys::nvmlDevice_t {
    let mut device = ptr::null_mut();
    assert_eq!(
        unsafe { nvmlDeviceGetHandleByIndex_v2(index, &mut device) },
        SUCCESS
    );
    device
}

const TWO: &str = r#"
[[gpu]]
name = "NVIDIA H100 80GB HBM3"
memory_total = "80GiB"
utilization = 40
memory_utilization = 10
temperature = 50
power_draw_w = 300.25
minor_number = 3
compute_capability = "9.0"
pci_bus_id = "0000:18:00.0"
numa_node = 1
cpus = "2-3,65"
[[gpu.process]]
pid = 100
used_memory = "1GiB"
[[gpu.process]]
pid = 101
used_memory = "2GiB"
[[gpu.nvlink]]
peer = 1
links = 4
[[gpu.mig]]
uuid = "MIG-aaaaaaaa-0000-0000-0000-000000000000"
name = "1g.10gb"
memory_total = "10GiB"
gpu_instance_id = 2
compute_instance_id = 0

[[gpu]]
name = "a board without sensors"
memory_total = "16GiB"
numa_node = 1
"#;

#[test]
fn calls_before_init_and_after_shutdown_are_uninitialized() {
    unsafe {
        let session = Session::new("uninit", TWO);
        let device = handle(0);
        assert_eq!(nvmlShutdown(), SUCCESS);
        let mut count = 0;
        assert_eq!(nvmlDeviceGetCount_v2(&mut count), UNINITIALIZED);
        let mut node = 0;
        assert_eq!(nvmlDeviceGetNumaNodeId(device, &mut node), UNINITIALIZED);
        assert_eq!(nvmlShutdown(), UNINITIALIZED);
        drop(session);
    }
}

#[test]
fn init_without_a_file_fails_with_a_code_not_a_panic() {
    unsafe {
        let _turn = TURN.lock().unwrap_or_else(PoisonError::into_inner);
        while library().is_some() {
            nvmlShutdown();
        }
        assert_eq!(init_from(None), DRIVER_NOT_LOADED);
        assert_eq!(
            init_from(Some(PathBuf::from("/nonexistent/box.toml"))),
            DRIVER_NOT_LOADED
        );
        let mut count = 0;
        assert_eq!(nvmlDeviceGetCount_v2(&mut count), UNINITIALIZED);
    }
}

#[test]
fn telemetry_and_what_a_board_lacks() {
    unsafe {
        let _session = Session::new("telemetry", TWO);
        let (full, bare) = (handle(0), handle(1));
        let mut value = 0;
        assert_eq!(nvmlDeviceGetPowerUsage(full, &mut value), SUCCESS);
        assert_eq!(value, 300_250, "milliwatts");
        assert_eq!(nvmlDeviceGetPowerUsage(bare, &mut value), NOT_SUPPORTED);
        assert_eq!(
            nvmlDeviceGetTemperature(
                full,
                sys::nvmlTemperatureSensors_enum_NVML_TEMPERATURE_GPU,
                &mut value
            ),
            SUCCESS
        );
        assert_eq!(value, 50);
        assert_eq!(
            nvmlDeviceGetTemperature(full, 7, &mut value),
            INVALID_ARGUMENT
        );
        assert_eq!(
            nvmlDeviceGetTemperature(
                bare,
                sys::nvmlTemperatureSensors_enum_NVML_TEMPERATURE_GPU,
                &mut value
            ),
            NOT_SUPPORTED
        );
        assert_eq!(nvmlDeviceGetMinorNumber(full, &mut value), SUCCESS);
        assert_eq!(value, 3);
        assert_eq!(nvmlDeviceGetMinorNumber(bare, &mut value), NOT_SUPPORTED);
        let (mut major, mut minor) = (0, 0);
        assert_eq!(
            nvmlDeviceGetCudaComputeCapability(full, &mut major, &mut minor),
            SUCCESS
        );
        assert_eq!((major, minor), (9, 0));
        assert_eq!(
            nvmlDeviceGetCudaComputeCapability(bare, &mut major, &mut minor),
            NOT_SUPPORTED
        );

        let mut memory = sys::nvmlMemory_v2_t {
            version: MEMORY_V2,
            total: 0,
            reserved: 0,
            free: 0,
            used: 0,
        };
        assert_eq!(nvmlDeviceGetMemoryInfo_v2(full, &mut memory), SUCCESS);
        assert_eq!((memory.total, memory.used), (80 << 30, 3 << 30));
        memory.version = 1;
        assert_eq!(
            nvmlDeviceGetMemoryInfo_v2(full, &mut memory),
            ARGUMENT_VERSION_MISMATCH
        );

        let mut pci: sys::nvmlPciInfo_t = std::mem::zeroed();
        assert_eq!(nvmlDeviceGetPciInfo_v3(full, &mut pci), SUCCESS);
        let bus_id = CStr::from_ptr(pci.busId.as_ptr());
        assert_eq!(bus_id.to_str().unwrap(), "00000000:18:00.0");
        assert_eq!((pci.domain, pci.bus, pci.device), (0, 0x18, 0));
        let legacy = CStr::from_ptr(pci.busIdLegacy.as_ptr());
        assert_eq!(legacy.to_str().unwrap(), "0000:18:00.0");
    }
}

#[test]
fn bad_arguments_are_invalid_argument() {
    unsafe {
        let _session = Session::new("args", TWO);
        let mut device = ptr::null_mut();
        assert_eq!(
            nvmlDeviceGetHandleByIndex_v2(2, &mut device),
            INVALID_ARGUMENT
        );
        assert_eq!(
            nvmlDeviceGetHandleByIndex_v2(0, ptr::null_mut()),
            INVALID_ARGUMENT
        );
        assert_eq!(nvmlDeviceGetCount_v2(ptr::null_mut()), INVALID_ARGUMENT);
        let mut value = 0;
        // A pointer this library never handed out.
        let mut stranger = 0u64;
        let forged = (&mut stranger as *mut u64).cast::<sys::nvmlDevice_st>();
        assert_eq!(
            nvmlDeviceGetMinorNumber(forged, &mut value),
            INVALID_ARGUMENT
        );
        assert_eq!(
            nvmlDeviceGetMinorNumber(ptr::null_mut(), &mut value),
            INVALID_ARGUMENT
        );
        assert_eq!(
            nvmlDeviceGetMinorNumber(handle(0), ptr::null_mut()),
            INVALID_ARGUMENT
        );
        let mut name = [0 as c_char; 8];
        assert_eq!(
            nvmlDeviceGetName(handle(0), name.as_mut_ptr(), 8),
            INSUFFICIENT_SIZE
        );
        let mut state = 0;
        assert_eq!(
            nvmlDeviceGetNvLinkState(handle(0), 18, &mut state),
            INVALID_ARGUMENT
        );
        assert_eq!(
            nvmlDeviceGetHandleByUUID(c"GPU-nope".as_ptr(), &mut device),
            NOT_FOUND
        );
    }
}

#[test]
fn process_list_reports_the_count_it_needs() {
    unsafe {
        let _session = Session::new("procs", TWO);
        let device = handle(0);
        let mut count = 0;
        assert_eq!(
            nvmlDeviceGetComputeRunningProcesses_v3(device, &mut count, ptr::null_mut()),
            INSUFFICIENT_SIZE
        );
        assert_eq!(count, 2);
        let mut infos: [sys::nvmlProcessInfo_t; 1] = std::mem::zeroed();
        count = 1;
        assert_eq!(
            nvmlDeviceGetComputeRunningProcesses_v3(device, &mut count, infos.as_mut_ptr()),
            INSUFFICIENT_SIZE
        );
        assert_eq!(count, 2);
        let mut infos: [sys::nvmlProcessInfo_t; 4] = std::mem::zeroed();
        count = 4;
        assert_eq!(
            nvmlDeviceGetComputeRunningProcesses_v3(device, &mut count, infos.as_mut_ptr()),
            SUCCESS
        );
        assert_eq!(count, 2);
        assert_eq!((infos[1].pid, infos[1].usedGpuMemory), (101, 2 << 30));
        count = 0;
        assert_eq!(
            nvmlDeviceGetComputeRunningProcesses_v3(handle(1), &mut count, ptr::null_mut()),
            SUCCESS,
            "no processes: nothing to make room for"
        );
        assert_eq!(count, 0);
    }
}

#[test]
fn mig_handles_answer_what_an_instance_has() {
    unsafe {
        let _session = Session::new("mig", TWO);
        let gpu = handle(0);
        let (mut current, mut pending, mut count) = (0, 0, 0);
        assert_eq!(
            nvmlDeviceGetMigMode(gpu, &mut current, &mut pending),
            SUCCESS
        );
        assert_eq!(current, 1);
        assert_eq!(
            nvmlDeviceGetMigMode(handle(1), &mut current, &mut pending),
            NOT_SUPPORTED
        );
        assert_eq!(nvmlDeviceGetMaxMigDeviceCount(gpu, &mut count), SUCCESS);
        assert_eq!(
            count, 7,
            "an H100's slots; the file's slice fills the first"
        );
        let mut mig = ptr::null_mut();
        assert_eq!(
            nvmlDeviceGetMigDeviceHandleByIndex(gpu, 1, &mut mig),
            NOT_FOUND,
            "an empty slot"
        );
        assert_eq!(
            nvmlDeviceGetMigDeviceHandleByIndex(gpu, 7, &mut mig),
            INVALID_ARGUMENT
        );
        assert_eq!(
            nvmlDeviceGetMigDeviceHandleByIndex(gpu, 0, &mut mig),
            SUCCESS
        );
        let mut is_mig = 0;
        assert_eq!(nvmlDeviceIsMigDeviceHandle(mig, &mut is_mig), SUCCESS);
        assert_eq!(is_mig, 1);
        assert_eq!(nvmlDeviceIsMigDeviceHandle(gpu, &mut is_mig), SUCCESS);
        assert_eq!(is_mig, 0);
        let mut uuid = [0 as c_char; 96];
        assert_eq!(nvmlDeviceGetUUID(mig, uuid.as_mut_ptr(), 96), SUCCESS);
        let uuid = CStr::from_ptr(uuid.as_ptr());
        assert!(uuid.to_str().unwrap().starts_with("MIG-aaaaaaaa"));
        let mut value = 0;
        assert_eq!(nvmlDeviceGetPowerUsage(mig, &mut value), NOT_SUPPORTED);
        assert_eq!(
            nvmlDeviceGetMaxMigDeviceCount(mig, &mut value),
            INVALID_ARGUMENT
        );
        let mut id = 0;
        assert_eq!(nvmlDeviceGetGpuInstanceId(mig, &mut id), SUCCESS);
        assert_eq!(id, 2);
        assert_eq!(nvmlDeviceGetComputeInstanceId(mig, &mut id), SUCCESS);
        assert_eq!(id, 0);
        assert_eq!(nvmlDeviceGetGpuInstanceId(gpu, &mut id), INVALID_ARGUMENT);
        let mut parent = ptr::null_mut();
        assert_eq!(
            nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig, &mut parent),
            SUCCESS
        );
        assert_eq!(parent, gpu);
        assert_eq!(
            nvmlDeviceGetDeviceHandleFromMigDeviceHandle(gpu, &mut parent),
            INVALID_ARGUMENT
        );
    }
}

#[test]
fn topology_is_served_from_the_file() {
    unsafe {
        let _session = Session::new("topo", TWO);
        let (a, b) = (handle(0), handle(1));
        let mut node = 9;
        assert_eq!(
            nvmlDeviceGetNumaNodeId(a, &mut node),
            NOT_SUPPORTED,
            "as on an x86 box: the node is the memory affinity's"
        );
        let mut nodes = [0 as c_ulong; 2];
        assert_eq!(
            nvmlDeviceGetMemoryAffinity(a, 2, nodes.as_mut_ptr(), sys::NVML_AFFINITY_SCOPE_NODE),
            SUCCESS
        );
        assert_eq!(nodes, [0b10, 0]);
        let mut cpus = [0 as c_ulong; 2];
        assert_eq!(nvmlDeviceGetCpuAffinity(a, 2, cpus.as_mut_ptr()), SUCCESS);
        assert_eq!(cpus, [0b1100, 0b10], "CPUs 2, 3 and 65");
        assert_eq!(
            nvmlDeviceGetCpuAffinity(b, 2, cpus.as_mut_ptr()),
            NOT_SUPPORTED
        );
        let mut level = 0;
        assert_eq!(
            nvmlDeviceGetTopologyCommonAncestor(a, b, &mut level),
            SUCCESS
        );
        assert_eq!(level, sys::nvmlGpuLevel_enum_NVML_TOPOLOGY_NODE);
        let mut state = 0;
        for link in 0..4 {
            assert_eq!(nvmlDeviceGetNvLinkState(a, link, &mut state), SUCCESS);
            assert_eq!(state, sys::nvmlEnableState_enum_NVML_FEATURE_ENABLED);
            let mut pci: sys::nvmlPciInfo_t = std::mem::zeroed();
            assert_eq!(
                nvmlDeviceGetNvLinkRemotePciInfo_v2(a, link, &mut pci),
                SUCCESS
            );
            let remote = CStr::from_ptr(pci.busId.as_ptr());
            assert_eq!(
                remote.to_str().unwrap(),
                "51300000:01:00.0",
                "GPU 1's derived id"
            );
            let mut kind = sys::nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_UNKNOWN;
            assert_eq!(
                nvmlDeviceGetNvLinkRemoteDeviceType(a, link, &mut kind),
                SUCCESS
            );
            assert_eq!(
                kind,
                sys::nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_GPU
            );
        }
        let mut kind = 0;
        assert_eq!(
            nvmlDeviceGetNvLinkRemoteDeviceType(a, 4, &mut kind),
            INVALID_ARGUMENT,
            "a link that is down has no far end"
        );
        assert_eq!(nvmlDeviceGetNvLinkState(a, 4, &mut state), SUCCESS);
        assert_eq!(state, sys::nvmlEnableState_enum_NVML_FEATURE_DISABLED);
    }
}

#[test]
fn an_nvswitch_box_reaches_its_peers_through_a_switch() {
    unsafe {
        let mut text = String::new();
        for gpu in 0..8 {
            text.push_str("[[gpu]]\nname = \"H100\"\nmemory_total = \"80GiB\"\n");
            for peer in gpu + 1..8 {
                text.push_str(&format!("[[gpu.nvlink]]\npeer = {peer}\nlinks = 18\n"));
            }
        }
        let _session = Session::new("nvswitch", &text);
        let mut pci: sys::nvmlPciInfo_t = std::mem::zeroed();
        let mut kind = 0;
        for gpu in 0..8 {
            for link in 0..18 {
                assert_eq!(
                    nvmlDeviceGetNvLinkRemotePciInfo_v2(handle(gpu), link, &mut pci),
                    SUCCESS
                );
                assert_eq!(
                    nvmlDeviceGetNvLinkRemoteDeviceType(handle(gpu), link, &mut kind),
                    SUCCESS
                );
                assert_eq!(
                    kind,
                    sys::nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_SWITCH
                );
            }
        }
    }
}

#[test]
fn a_box_nvml_could_not_report_is_refused_at_init() {
    unsafe {
        let _turn = TURN.lock().unwrap_or_else(PoisonError::into_inner);
        while library().is_some() {
            nvmlShutdown();
        }
        let dir = std::env::temp_dir().join(format!("orch-nvml-sim-{}-refuse", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("box.toml");
        // GPU 0 has 20 + 4 links, and its peers are not one NVSwitch group.
        std::fs::write(
        &path,
        "[[gpu]]\nname = \"a\"\nmemory_total = 1\n[[gpu.nvlink]]\npeer = 1\nlinks = 20\n[[gpu.nvlink]]\npeer = 2\nlinks = 4\n[[gpu]]\nname = \"b\"\nmemory_total = 1\n[[gpu]]\nname = \"c\"\nmemory_total = 1\n",
    )
    .unwrap();
        let err = Machine::read(&path).unwrap_err();
        assert!(err.contains("GPU 0 has 24 NVLinks"), "{err}");
        assert_eq!(init_from(Some(path)), DRIVER_NOT_LOADED);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[test]
fn a_changed_file_is_read_again_and_a_broken_one_keeps_the_last_reading() {
    unsafe {
        let session = Session::new("reread", TWO);
        let device = handle(0);
        let second = handle(1);
        let mut util = sys::nvmlUtilization_t { gpu: 0, memory: 0 };
        assert_eq!(nvmlDeviceGetUtilizationRates(device, &mut util), SUCCESS);
        assert_eq!(util.gpu, 40);
        session.rewrite(&TWO.replace("utilization = 40", "utilization = 93"));
        assert_eq!(nvmlDeviceGetUtilizationRates(device, &mut util), SUCCESS);
        assert_eq!(util.gpu, 93, "the same handle sees the new reading");
        session.rewrite("this is not toml [");
        assert_eq!(nvmlDeviceGetUtilizationRates(device, &mut util), SUCCESS);
        assert_eq!(util.gpu, 93, "the last good reading stays");
        // One GPU left: a handle of the second is lost.
        session.rewrite("[[gpu]]\nname = \"a\"\nmemory_total = 1\n");
        let mut count = 0;
        assert_eq!(nvmlDeviceGetCount_v2(&mut count), SUCCESS);
        assert_eq!(count, 1);
        let mut node = 0;
        assert_eq!(nvmlDeviceGetNumaNodeId(second, &mut node), GPU_IS_LOST);
        let mut nodes = [0 as c_ulong; 1];
        assert_eq!(
            nvmlDeviceGetMemoryAffinity(
                device,
                1,
                nodes.as_mut_ptr(),
                sys::NVML_AFFINITY_SCOPE_NODE
            ),
            NOT_SUPPORTED,
            "the new reading has no numa_node"
        );
    }
}

#[test]
fn handles_stay_valid_across_inits_until_the_last_shutdown() {
    unsafe {
        let _session = Session::new("refcount", TWO);
        let first = handle(1);
        assert_eq!(
            init_from(None),
            SUCCESS,
            "a second init counts, whatever the env says"
        );
        assert_eq!(nvmlShutdown(), SUCCESS);
        let mut nodes = [0 as c_ulong; 1];
        assert_eq!(
            nvmlDeviceGetMemoryAffinity(
                first,
                1,
                nodes.as_mut_ptr(),
                sys::NVML_AFFINITY_SCOPE_NODE
            ),
            SUCCESS
        );
        assert_eq!(nodes, [0b10]);
        assert_eq!(handle(1), first, "one handle per GPU");
    }
}

const ONE: &str = "[[gpu]]\nname = \"NVIDIA H100 80GB HBM3\"\nmemory_total = \"80GiB\"\n";

#[test]
fn a_new_xid_in_the_file_wakes_a_waiting_event_set() {
    let session = Session::new("xid-events", &format!("{ONE}xid_errors = [31]\n"));
    let device = handle(0);
    let mut set = ptr::null_mut();
    assert_eq!(unsafe { events::nvmlEventSetCreate(&mut set) }, SUCCESS);
    let xid = sys::nvmlEventTypeXidCriticalError as u64;
    assert_eq!(
        unsafe { events::nvmlDeviceRegisterEvents(device, xid | 1, set) },
        NOT_SUPPORTED
    );
    assert_eq!(
        unsafe { events::nvmlDeviceRegisterEvents(device, xid, set) },
        SUCCESS
    );
    let mut data: sys::nvmlEventData_t = unsafe { std::mem::zeroed() };
    // What the file listed before the registration is no event.
    assert_eq!(
        unsafe { events::nvmlEventSetWait_v2(set, &mut data, 50) },
        sys::nvmlReturn_enum_NVML_ERROR_TIMEOUT
    );
    let path = session.path.clone();
    let writer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        let next = path.with_extension("new");
        std::fs::write(&next, format!("{ONE}xid_errors = [31, 79, 48]\n")).unwrap();
        std::fs::rename(&next, &path).unwrap();
    });
    let started = Instant::now();
    assert_eq!(
        unsafe { events::nvmlEventSetWait_v2(set, &mut data, 5_000) },
        SUCCESS
    );
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    writer.join().unwrap();
    assert_eq!(
        (data.device, data.eventType, data.eventData),
        (device, xid, 79)
    );
    assert_eq!(
        unsafe { events::nvmlEventSetWait_v2(set, &mut data, 0) },
        SUCCESS
    );
    assert_eq!(data.eventData, 48);
    assert_eq!(unsafe { events::nvmlEventSetFree(set) }, SUCCESS);
    assert_eq!(
        unsafe { events::nvmlEventSetWait_v2(set, &mut data, 0) },
        INVALID_ARGUMENT
    );
}

#[test]
fn ecc_remapped_rows_and_a_lost_gpu_are_served_from_the_file() {
    let session = Session::new("ecc", ONE);
    let device = handle(0);
    let mut count = 0u64;
    let uncorrected = sys::nvmlMemoryErrorType_enum_NVML_MEMORY_ERROR_TYPE_UNCORRECTED;
    let volatile = sys::nvmlEccCounterType_enum_NVML_VOLATILE_ECC;
    let (mut corrected, mut unc, mut pending, mut failure) = (0, 0, 0, 0);
    // Left out of the file: not supported, as on a board without them.
    assert_eq!(
        unsafe { events::nvmlDeviceGetTotalEccErrors(device, uncorrected, volatile, &mut count) },
        NOT_SUPPORTED
    );
    let mut retired = sys::nvmlEnableState_enum_NVML_FEATURE_ENABLED;
    assert_eq!(
        unsafe { events::nvmlDeviceGetRetiredPagesPendingStatus(device, &mut retired) },
        NOT_SUPPORTED
    );
    session.rewrite(&format!(
        "{ONE}ecc_uncorrected = 3\nrow_remap_pending = true\nretired_pages_pending = true\n"
    ));
    assert_eq!(
        unsafe { events::nvmlDeviceGetRetiredPagesPendingStatus(device, &mut retired) },
        SUCCESS
    );
    assert_eq!(retired, sys::nvmlEnableState_enum_NVML_FEATURE_ENABLED);
    assert_eq!(
        unsafe { events::nvmlDeviceGetTotalEccErrors(device, uncorrected, volatile, &mut count) },
        SUCCESS
    );
    assert_eq!(count, 3);
    assert_eq!(
        unsafe {
            events::nvmlDeviceGetRemappedRows(
                device,
                &mut corrected,
                &mut unc,
                &mut pending,
                &mut failure,
            )
        },
        SUCCESS
    );
    assert_eq!((pending, failure), (1, 0));
    session.rewrite(&format!("{ONE}lost = true\n"));
    let mut memory: sys::nvmlMemory_t = unsafe { std::mem::zeroed() };
    assert_eq!(
        unsafe { nvmlDeviceGetMemoryInfo(device, &mut memory) },
        GPU_IS_LOST
    );
    assert_eq!(
        unsafe { events::nvmlDeviceGetTotalEccErrors(device, uncorrected, volatile, &mut count) },
        GPU_IS_LOST
    );
    // What names it is lost too, as the driver answers: its uuid, its name, a new handle.
    let mut name = [0 as c_char; 96];
    assert_eq!(
        unsafe { nvmlDeviceGetName(device, name.as_mut_ptr(), 96) },
        GPU_IS_LOST
    );
    assert_eq!(
        unsafe { nvmlDeviceGetUUID(device, name.as_mut_ptr(), 96) },
        GPU_IS_LOST
    );
    let mut again = ptr::null_mut();
    assert_eq!(
        unsafe { nvmlDeviceGetHandleByIndex_v2(0, &mut again) },
        GPU_IS_LOST
    );
    // The handle taken before keeps its PCI identity.
    let mut pci: sys::nvmlPciInfo_t = unsafe { std::mem::zeroed() };
    assert_eq!(
        unsafe { nvmlDeviceGetPciInfo_v3(device, &mut pci) },
        SUCCESS
    );
}
