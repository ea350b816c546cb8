//! A simulated NVML library: `liborch_nvml_sim.so` exports the NVML C functions orch calls through
//! nvml-wrapper and answers them for the machine a sim file describes (`ORCH_NVML_SIM=FILE`, the
//! format of `sim:FILE`, parsed by [`orch_devices::sim::read`]: one truth for the format).
//!
//! `ORCH_NVML_LIBRARY=target/debug/liborch_nvml_sim.so orch --devices nvml devices` then runs
//! orch's real NVML code (`crates/orch-devices/src/nvml.rs`) on a machine without a GPU, which is
//! how CI tests it.
//!
//! What it answers, as NVML documents per function:
//! - a field the file leaves out (`power_draw_w`, `temperature`, `minor_number`, `numa_node`,
//!   `cpus`, `compute_capability`) is `NVML_ERROR_NOT_SUPPORTED`, as on a board without it;
//!   `numa_node` is the memory affinity's node, and `nvmlDeviceGetNumaNodeId` is
//!   `NVML_ERROR_NOT_SUPPORTED` for every GPU, as on an x86 PCIe box;
//! - a MIG device handle answers its uuid, name, memory and parent; telemetry, topology and
//!   processes are `NVML_ERROR_NOT_SUPPORTED` (the file has no per-instance readings), and the MIG
//!   hierarchy functions that take a GPU are `NVML_ERROR_INVALID_ARGUMENT`;
//! - a null pointer, a handle this library did not hand out, an index out of range is
//!   `NVML_ERROR_INVALID_ARGUMENT`; a buffer too small is `NVML_ERROR_INSUFFICIENT_SIZE` (with
//!   the needed count for the process list);
//! - any call before `nvmlInit` (or after the last `nvmlShutdown`) is `NVML_ERROR_UNINITIALIZED`.
//! - health (`events.rs`): a new `xid_errors` entry is an Xid event delivered to a waiting
//!   `nvmlEventSetWait_v2`; `ecc_uncorrected`, the row remapper and `lost` are served as readings
//!   (a lost GPU answers `NVML_ERROR_GPU_IS_LOST` to its handle by index, uuid and name too).
//!
//! The file is read again when it changes (size, time or inode; looked at no more often than every
//! 10 ms), as the `sim:` backend does, so a test or demo changes telemetry by writing the file; a file that fails to parse leaves the last
//! good reading (and says so once on stderr). A GPU whose handle outlives a shorter file is
//! `NVML_ERROR_GPU_IS_LOST`.
//!
//! NVLinks: a GPU whose links fit NVML's 18 gets one link per NVLink, its remote PCI id the peer
//! GPU's. A group of GPUs joined by more (an NVSwitch box: NV18 between every pair of 8) reaches
//! its peers through one simulated NVSwitch: each GPU's links lead to the switch's PCI id, as on
//! an HGX board, and orch counts the links two GPUs have into the switches they share.
//!
//! Handles are pointers this library owns; they stay valid until the last `nvmlShutdown`. No
//! panic crosses the C ABI: every exported function runs inside `catch_unwind` and answers
//! `NVML_ERROR_UNKNOWN` if anything panics.
//!
//! # Safety
//!
//! Every exported function is `unsafe` with NVML's own contract (nvml.h): output pointers are null
//! or valid for writes (and reads, where NVML reads them: a version field, a count) of the
//! documented type and length, string inputs are null or NUL-terminated. Null is checked.
#![allow(non_snake_case, clippy::missing_safety_doc)]

use nvml_wrapper_sys::bindings as sys;
use orch_devices::{Device, PcieLevel};
use std::collections::BTreeMap;
use std::ffi::{CStr, c_char, c_int, c_uint, c_ulong};
use std::os::unix::fs::MetadataExt;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime};

/// The environment variable naming the sim file the library serves.
pub const SIM_ENV: &str = "ORCH_NVML_SIM";

/// What `nvmlSystemGetDriverVersion` answers: this crate's version, marked as the simulation.
pub const DRIVER_VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), "-orch-nvml-sim");

type Ret = sys::nvmlReturn_t;
const SUCCESS: Ret = sys::nvmlReturn_enum_NVML_SUCCESS;
const UNINITIALIZED: Ret = sys::nvmlReturn_enum_NVML_ERROR_UNINITIALIZED;
const INVALID_ARGUMENT: Ret = sys::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT;
const NOT_SUPPORTED: Ret = sys::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED;
const NOT_FOUND: Ret = sys::nvmlReturn_enum_NVML_ERROR_NOT_FOUND;
const INSUFFICIENT_SIZE: Ret = sys::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE;
const DRIVER_NOT_LOADED: Ret = sys::nvmlReturn_enum_NVML_ERROR_DRIVER_NOT_LOADED;
const GPU_IS_LOST: Ret = sys::nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST;
const ARGUMENT_VERSION_MISMATCH: Ret = sys::nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
const UNKNOWN: Ret = sys::nvmlReturn_enum_NVML_ERROR_UNKNOWN;

/// NVLinks per GPU NVML reports (`NVML_NVLINK_MAX_LINKS`).
pub const MAX_LINKS: usize = sys::NVML_NVLINK_MAX_LINKS as usize;
/// `NVML_VALUE_NOT_AVAILABLE` for an unsigned long long.
const VALUE_NOT_AVAILABLE: u64 = u64::MAX;
/// The GPU/compute instance id of a process on a GPU without MIG (NVML's `0xFFFFFFFF`).
const NO_INSTANCE: c_uint = c_uint::MAX;
/// How often, at most, the file is looked at again (one NVML reading of a box is hundreds of
/// calls: one look serves them all).
pub const RECHECK: Duration = Duration::from_millis(10);
/// `nvmlMemory_v2` as `NVML_STRUCT_VERSION(Memory, 2)` spells it.
const MEMORY_V2: c_uint = (std::mem::size_of::<sys::nvmlMemory_v2_t>() | (2 << 24)) as c_uint;

/// Where an NVLink leads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LinkEnd {
    /// Another GPU, by position.
    Gpu(usize),
    /// A simulated NVSwitch, by number.
    Switch(usize),
}

/// One reading of the sim file, in the form the NVML functions answer from.
#[derive(Debug)]
struct Machine {
    devices: Vec<Device>,
    /// Each GPU's PCI bus id, NVML's spelling.
    bus_ids: Vec<String>,
    /// Each GPU's active NVLinks, link 0 first.
    nvlinks: Vec<Vec<LinkEnd>>,
}

/// The PCI bus id of simulated NVSwitch `n` (domain `5131`, beside the sim's derived GPU ids).
fn switch_bus_id(n: usize) -> String {
    format!("5131{:04X}:00:00.0", n & 0xffff)
}

impl Machine {
    fn read(path: &Path) -> Result<Machine, String> {
        let devices = orch_devices::sim::read(path).map_err(|e| e.to_string())?;
        let bus_ids = devices
            .iter()
            .map(|d| {
                d.pci_bus_id
                    .as_deref()
                    .and_then(orch_devices::sim::normalize_pci_bus_id)
                    .ok_or_else(|| format!("GPU {} has no PCI bus id", d.index))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let nvlinks = nvlinks(&devices)?;
        Ok(Machine {
            devices,
            bus_ids,
            nvlinks,
        })
    }
}

/// Lays the file's NVLink counts out as NVML's per-GPU links. Within a group of GPUs joined by
/// NVLinks, direct links when every GPU's fit in [`MAX_LINKS`]; else the group must be one
/// NVSwitch fabric (every pair the same count, at most [`MAX_LINKS`]), whose GPUs each get that
/// many links to one simulated switch.
fn nvlinks(devices: &[Device]) -> Result<Vec<Vec<LinkEnd>>, String> {
    let n = devices.len();
    let count = |a: usize, b: usize| {
        devices[a]
            .link_to(b as u32)
            .map_or(0, |l| l.nvlinks as usize)
    };
    // Groups: connected components of the NVLink graph, found by a walk from each GPU.
    let mut group = vec![usize::MAX; n];
    let mut groups: Vec<Vec<usize>> = Vec::new();
    for start in 0..n {
        if group[start] != usize::MAX {
            continue;
        }
        let id = groups.len();
        let mut members = vec![start];
        group[start] = id;
        let mut next = 0;
        while next < members.len() {
            let a = members[next];
            next += 1;
            let joined: Vec<usize> = (0..n)
                .filter(|&b| b != a && group[b] == usize::MAX && count(a, b) > 0)
                .collect();
            for b in joined {
                group[b] = id;
                members.push(b);
            }
        }
        groups.push(members);
    }
    let mut links = vec![Vec::new(); n];
    let mut switches = 0;
    for members in &groups {
        let total = |a: usize| members.iter().map(|&b| count(a, b)).sum::<usize>();
        if members.iter().all(|&a| total(a) <= MAX_LINKS) {
            for &a in members {
                for &b in members {
                    links[a].extend(std::iter::repeat_n(LinkEnd::Gpu(b), count(a, b)));
                }
            }
            continue;
        }
        let first = count(members[0], members[1]);
        let uniform = members
            .iter()
            .all(|&a| members.iter().all(|&b| a == b || count(a, b) == first));
        if !uniform || first > MAX_LINKS {
            let a = members
                .iter()
                .copied()
                .find(|&a| total(a) > MAX_LINKS)
                .unwrap_or(members[0]);
            return Err(format!(
                "GPU {a} has {} NVLinks, more than the {MAX_LINKS} NVML reports for a GPU, and its peers are not one NVSwitch group (the same count between every pair of them, at most {MAX_LINKS}): NVML could not report this box",
                total(a)
            ));
        }
        for &a in members {
            links[a] = vec![LinkEnd::Switch(switches); first];
        }
        switches += 1;
    }
    Ok(links)
}

/// The file's identity: a change of any part means it was written again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    modified: Option<SystemTime>,
    len: u64,
    inode: u64,
}

fn stamp(path: &Path) -> Option<Stamp> {
    let meta = std::fs::metadata(path).ok()?;
    Some(Stamp {
        modified: meta.modified().ok(),
        len: meta.len(),
        inode: meta.ino(),
    })
}

/// What a handle names: a GPU, or a MIG instance of one (by position).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Target {
    gpu: usize,
    mig: Option<usize>,
}

/// The library's state between `nvmlInit` and the last `nvmlShutdown`.
#[derive(Debug)]
struct Library {
    inits: u32,
    path: PathBuf,
    stamp: Option<Stamp>,
    /// When the file was last looked at.
    checked: Instant,
    machine: Arc<Machine>,
    /// Handles handed out, by address; each a leaked `Box<Target>` freed at the last shutdown.
    handles: BTreeMap<usize, Target>,
    by_target: BTreeMap<Target, usize>,
    /// The event sets handed out and the Xid events queued on them (`events.rs`).
    events: events::Events,
}

impl Library {
    /// The machine, read again first when the file changed since the last reading (looked at
    /// no more often than every [`RECHECK`]).
    fn refresh(&mut self) -> Arc<Machine> {
        if self.checked.elapsed() < RECHECK {
            return Arc::clone(&self.machine);
        }
        self.checked = Instant::now();
        let now = stamp(&self.path);
        if now.is_some() && now != self.stamp {
            self.stamp = now;
            match Machine::read(&self.path) {
                Ok(machine) => {
                    let machine = Arc::new(machine);
                    self.events.on_reading(&self.machine, &machine);
                    self.machine = machine;
                }
                Err(e) => eprintln!(
                    "orch-nvml-sim: keeping the last reading of {}: {e}",
                    self.path.display()
                ),
            }
        }
        Arc::clone(&self.machine)
    }

    fn handle(&mut self, target: Target) -> sys::nvmlDevice_t {
        if let Some(&address) = self.by_target.get(&target) {
            return address as sys::nvmlDevice_t;
        }
        let address = Box::into_raw(Box::new(target)) as usize;
        self.handles.insert(address, target);
        self.by_target.insert(target, address);
        address as sys::nvmlDevice_t
    }

    fn free_handles(&mut self) {
        for (&address, _) in std::mem::take(&mut self.handles).iter() {
            // SAFETY: every address in `handles` came from `Box::into_raw` of a `Target` and is
            // freed once, here, as the map is emptied.
            drop(unsafe { Box::from_raw(address as *mut Target) });
        }
        self.by_target.clear();
    }
}

static LIBRARY: Mutex<Option<Library>> = Mutex::new(None);

fn library() -> MutexGuard<'static, Option<Library>> {
    LIBRARY.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Runs an NVML function's body: its error as the return code, a panic as `NVML_ERROR_UNKNOWN`.
fn guard(body: impl FnOnce() -> Result<(), Ret>) -> Ret {
    match std::panic::catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => SUCCESS,
        Ok(Err(code)) => code,
        Err(_) => UNKNOWN,
    }
}

/// The current machine, after `nvmlInit`.
fn machine() -> Result<Arc<Machine>, Ret> {
    let mut library = library();
    let library = library.as_mut().ok_or(UNINITIALIZED)?;
    Ok(library.refresh())
}

/// The machine and what `device` names, checked against the current reading.
/// One id of the MIG device `device` as `read` takes it from its slice: `NVML_ERROR_NOT_SUPPORTED`
/// when the file gives none, `NVML_ERROR_INVALID_ARGUMENT` for a GPU handle.
fn slice_id(
    device: sys::nvmlDevice_t,
    read: impl Fn(&orch_devices::MigDevice) -> Option<u32>,
) -> Result<u32, Ret> {
    let (machine, target) = resolve(device)?;
    let mig = target.mig.ok_or(INVALID_ARGUMENT)?;
    read(&machine.devices[target.gpu].mig_devices[mig]).ok_or(NOT_SUPPORTED)
}

fn resolve(device: sys::nvmlDevice_t) -> Result<(Arc<Machine>, Target), Ret> {
    let mut library = library();
    let library = library.as_mut().ok_or(UNINITIALIZED)?;
    let target = *library
        .handles
        .get(&(device as usize))
        .ok_or(INVALID_ARGUMENT)?;
    let machine = library.refresh();
    let gpu = machine.devices.get(target.gpu).ok_or(GPU_IS_LOST)?;
    if let Some(mig) = target.mig
        && mig >= gpu.mig_devices.len()
    {
        return Err(GPU_IS_LOST);
    }
    Ok((machine, target))
}

/// A GPU handle's device; a MIG handle is `NVML_ERROR_NOT_SUPPORTED` (what the file cannot say
/// of an instance).
fn gpu(device: sys::nvmlDevice_t) -> Result<(Arc<Machine>, usize), Ret> {
    let (machine, target) = resolve(device)?;
    match target.mig {
        None => Ok((machine, target.gpu)),
        Some(_) => Err(NOT_SUPPORTED),
    }
}

/// A GPU handle's device, for the functions whose argument must be a GPU (not a MIG instance).
fn parent_gpu(device: sys::nvmlDevice_t) -> Result<(Arc<Machine>, usize), Ret> {
    let (machine, target) = resolve(device)?;
    match target.mig {
        None => Ok((machine, target.gpu)),
        Some(_) => Err(INVALID_ARGUMENT),
    }
}

fn new_handle(target: Target) -> Result<sys::nvmlDevice_t, Ret> {
    let mut library = library();
    let library = library.as_mut().ok_or(UNINITIALIZED)?;
    Ok(library.handle(target))
}

/// Writes `value` through `out`; null is `NVML_ERROR_INVALID_ARGUMENT`.
///
/// Safety (here and in the helpers below): the pointers are null or valid as nvml.h says.
unsafe fn put<T>(out: *mut T, value: T) -> Result<(), Ret> {
    if out.is_null() {
        return Err(INVALID_ARGUMENT);
    }
    // SAFETY: not null; NVML's contract makes it valid for a write of `T`.
    unsafe { out.write(value) };
    Ok(())
}

/// Checks an output pointer before the work that fills it.
fn non_null<T>(out: *const T) -> Result<(), Ret> {
    if out.is_null() {
        Err(INVALID_ARGUMENT)
    } else {
        Ok(())
    }
}

/// Copies `text` and its NUL into `buf` of `length` bytes; too small is
/// `NVML_ERROR_INSUFFICIENT_SIZE`.
unsafe fn put_str(buf: *mut c_char, length: c_uint, text: &str) -> Result<(), Ret> {
    non_null(buf)?;
    let bytes = text.as_bytes();
    if bytes.len() >= length as usize {
        return Err(INSUFFICIENT_SIZE);
    }
    // SAFETY: `buf` holds `length` bytes (NVML's contract), more than `bytes.len()`.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr().cast::<c_char>(), buf, bytes.len());
        buf.add(bytes.len()).write(0);
    }
    Ok(())
}

/// A fixed-size C string field filled with `text` (cut to fit, NUL-terminated).
fn c_field<const N: usize>(text: &str) -> [c_char; N] {
    let mut field = [0 as c_char; N];
    for (slot, byte) in field.iter_mut().zip(text.bytes().take(N.saturating_sub(1))) {
        *slot = byte as c_char;
    }
    field
}

/// A C string argument; null or not UTF-8 is `NVML_ERROR_INVALID_ARGUMENT`.
unsafe fn get_str<'a>(text: *const c_char) -> Result<&'a str, Ret> {
    non_null(text)?;
    // SAFETY: not null; NVML's contract makes it NUL-terminated.
    unsafe { CStr::from_ptr(text) }
        .to_str()
        .map_err(|_| INVALID_ARGUMENT)
}

/// Fills an NVML bit mask of `words` words with `bits` (bit `i` of word `w` is `64 * w + i`);
/// bits past the mask are left out, as NVML cuts a mask to the size asked.
unsafe fn put_mask(
    out: *mut c_ulong,
    words: c_uint,
    bits: impl Iterator<Item = u32>,
) -> Result<(), Ret> {
    non_null(out)?;
    if words == 0 {
        return Err(INVALID_ARGUMENT);
    }
    let width = c_ulong::BITS;
    let mut mask = vec![0 as c_ulong; words as usize];
    for bit in bits {
        if let Some(word) = mask.get_mut((bit / width) as usize) {
            *word |= 1 << (bit % width);
        }
    }
    // SAFETY: `out` holds `words` words (NVML's contract).
    unsafe { std::ptr::copy_nonoverlapping(mask.as_ptr(), out, mask.len()) };
    Ok(())
}

fn pci_info(bus_id: &str) -> sys::nvmlPciInfo_t {
    let mut parts = bus_id.split([':', '.']);
    let mut next = || {
        parts
            .next()
            .and_then(|p| u32::from_str_radix(p, 16).ok())
            .unwrap_or(0)
    };
    let (domain, bus, device) = (next(), next(), next());
    let legacy = format!(
        "{:04X}{}",
        domain & 0xffff,
        bus_id.get(8..).unwrap_or_default()
    );
    sys::nvmlPciInfo_t {
        busIdLegacy: c_field(&legacy),
        domain,
        bus,
        device,
        pciDeviceId: 0,
        pciSubSystemId: 0,
        busId: c_field(bus_id),
    }
}

// ---- initialisation ----------------------------------------------------------------------------

/// `nvmlInit` with the sim file `path` (the tests' way in; the C functions read `ORCH_NVML_SIM`).
pub fn init_from(path: Option<PathBuf>) -> Ret {
    guard(|| {
        let mut library = library();
        if let Some(library) = library.as_mut() {
            library.inits = library.inits.saturating_add(1);
            return Ok(());
        }
        let Some(path) = path else {
            eprintln!(
                "orch-nvml-sim: {SIM_ENV} is not set: set it to the sim file this library serves (docs/DEVICES.md)"
            );
            return Err(DRIVER_NOT_LOADED);
        };
        let before = stamp(&path);
        let machine = Machine::read(&path).map_err(|e| {
            eprintln!("orch-nvml-sim: {e}");
            DRIVER_NOT_LOADED
        })?;
        *library = Some(Library {
            inits: 1,
            path,
            stamp: before,
            checked: Instant::now(),
            machine: Arc::new(machine),
            handles: BTreeMap::new(),
            by_target: BTreeMap::new(),
            events: events::Events::default(),
        });
        Ok(())
    })
}

fn init_from_env() -> Ret {
    init_from(
        std::env::var_os(SIM_ENV)
            .filter(|p| !p.is_empty())
            .map(PathBuf::from),
    )
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlInit_v2() -> Ret {
    init_from_env()
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlInit() -> Ret {
    init_from_env()
}

/// Flags change nothing here (no GPU to attach).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> Ret {
    init_from_env()
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlShutdown() -> Ret {
    guard(|| {
        let mut slot = library();
        let library = slot.as_mut().ok_or(UNINITIALIZED)?;
        library.inits -= 1;
        if library.inits == 0 {
            library.free_handles();
            *slot = None;
        }
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlErrorString(result: Ret) -> *const c_char {
    let text: &'static CStr = match result {
        sys::nvmlReturn_enum_NVML_SUCCESS => c"Success",
        sys::nvmlReturn_enum_NVML_ERROR_UNINITIALIZED => c"Uninitialized",
        sys::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT => c"Invalid Argument",
        sys::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED => c"Not Supported",
        sys::nvmlReturn_enum_NVML_ERROR_NOT_FOUND => c"Not Found",
        sys::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE => c"Insufficient Size",
        sys::nvmlReturn_enum_NVML_ERROR_DRIVER_NOT_LOADED => c"Driver Not Loaded",
        sys::nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST => c"GPU is lost",
        sys::nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH => c"Argument version mismatch",
        _ => c"Unknown Error",
    };
    text.as_ptr()
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(version: *mut c_char, length: c_uint) -> Ret {
    guard(|| unsafe {
        machine()?;
        put_str(version, length, DRIVER_VERSION)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetNVMLVersion(version: *mut c_char, length: c_uint) -> Ret {
    unsafe { nvmlSystemGetDriverVersion(version, length) }
}

// ---- finding devices ---------------------------------------------------------------------------

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(device_count: *mut c_uint) -> Ret {
    guard(|| unsafe {
        non_null(device_count)?;
        put(device_count, machine()?.devices.len() as c_uint)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCount(device_count: *mut c_uint) -> Ret {
    unsafe { nvmlDeviceGetCount_v2(device_count) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(
    index: c_uint,
    device: *mut sys::nvmlDevice_t,
) -> Ret {
    guard(|| unsafe {
        non_null(device)?;
        let machine = machine()?;
        let gpu = machine
            .devices
            .get(index as usize)
            .ok_or(INVALID_ARGUMENT)?;
        // As the driver answers for a GPU that has fallen off the bus (nvidia-smi: "Unable to
        // determine the device handle for GPU …: GPU is lost").
        if gpu.health.lost {
            return Err(GPU_IS_LOST);
        }
        put(
            device,
            new_handle(Target {
                gpu: index as usize,
                mig: None,
            })?,
        )
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex(
    index: c_uint,
    device: *mut sys::nvmlDevice_t,
) -> Ret {
    unsafe { nvmlDeviceGetHandleByIndex_v2(index, device) }
}

/// A GPU's or a MIG instance's uuid; unknown is `NVML_ERROR_NOT_FOUND`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByUUID(
    uuid: *const c_char,
    device: *mut sys::nvmlDevice_t,
) -> Ret {
    guard(|| unsafe {
        let uuid = get_str(uuid)?;
        non_null(device)?;
        let machine = machine()?;
        let target = machine
            .devices
            .iter()
            .enumerate()
            .find_map(|(gpu, d)| {
                if d.uuid == uuid {
                    return Some(Target { gpu, mig: None });
                }
                let mig = d.mig_devices.iter().position(|m| m.uuid == uuid)?;
                Some(Target {
                    gpu,
                    mig: Some(mig),
                })
            })
            .ok_or(NOT_FOUND)?;
        put(device, new_handle(target)?)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByPciBusId_v2(
    pci_bus_id: *const c_char,
    device: *mut sys::nvmlDevice_t,
) -> Ret {
    guard(|| unsafe {
        let wanted = orch_devices::sim::normalize_pci_bus_id(get_str(pci_bus_id)?)
            .ok_or(INVALID_ARGUMENT)?;
        non_null(device)?;
        let gpu = machine()?
            .bus_ids
            .iter()
            .position(|id| *id == wanted)
            .ok_or(NOT_FOUND)?;
        put(device, new_handle(Target { gpu, mig: None })?)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetIndex(device: sys::nvmlDevice_t, index: *mut c_uint) -> Ret {
    guard(|| unsafe {
        non_null(index)?;
        let (_, gpu) = parent_gpu(device)?;
        put(index, gpu as c_uint)
    })
}

// ---- what a device is --------------------------------------------------------------------------

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUUID(
    device: sys::nvmlDevice_t,
    uuid: *mut c_char,
    length: c_uint,
) -> Ret {
    guard(|| unsafe {
        non_null(uuid)?;
        let (machine, target) = resolve(device)?;
        let gpu = &machine.devices[target.gpu];
        if gpu.health.lost {
            return Err(GPU_IS_LOST);
        }
        let text = match target.mig {
            None => &gpu.uuid,
            Some(mig) => &gpu.mig_devices[mig].uuid,
        };
        put_str(uuid, length, text)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetName(
    device: sys::nvmlDevice_t,
    name: *mut c_char,
    length: c_uint,
) -> Ret {
    guard(|| unsafe {
        non_null(name)?;
        let (machine, target) = resolve(device)?;
        let gpu = &machine.devices[target.gpu];
        if gpu.health.lost {
            return Err(GPU_IS_LOST);
        }
        let text = match target.mig {
            None => &gpu.name,
            Some(mig) => gpu.mig_devices[mig].name.as_ref().ok_or(NOT_SUPPORTED)?,
        };
        put_str(name, length, text)
    })
}

/// Total, used and free memory of a GPU or a MIG instance.
fn memory(device: sys::nvmlDevice_t) -> Result<(u64, u64, u64), Ret> {
    let (machine, target) = resolve(device)?;
    let gpu = &machine.devices[target.gpu];
    if gpu.health.lost {
        return Err(GPU_IS_LOST);
    }
    match target.mig {
        None => match (
            gpu.memory_total_bytes,
            gpu.memory_used_bytes,
            gpu.memory_free_bytes,
        ) {
            (Some(total), Some(used), Some(free)) => Ok((total, used, free)),
            _ => Err(NOT_SUPPORTED),
        },
        Some(mig) => {
            let slice = &gpu.mig_devices[mig];
            let total = slice.memory_total_bytes.ok_or(NOT_SUPPORTED)?;
            let used = slice.memory_used_bytes.unwrap_or(0).min(total);
            Ok((total, used, total - used))
        }
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(
    device: sys::nvmlDevice_t,
    memory_out: *mut sys::nvmlMemory_t,
) -> Ret {
    guard(|| unsafe {
        non_null(memory_out)?;
        let (total, used, free) = memory(device)?;
        put(memory_out, sys::nvmlMemory_t { total, free, used })
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: sys::nvmlDevice_t,
    memory_out: *mut sys::nvmlMemory_v2_t,
) -> Ret {
    guard(|| unsafe {
        non_null(memory_out)?;
        // SAFETY: not null; NVML's contract makes it a readable nvmlMemory_v2_t.
        if (*memory_out).version != MEMORY_V2 {
            return Err(ARGUMENT_VERSION_MISMATCH);
        }
        let (total, used, free) = memory(device)?;
        put(
            memory_out,
            sys::nvmlMemory_v2_t {
                version: MEMORY_V2,
                total,
                reserved: 0,
                free,
                used,
            },
        )
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCudaComputeCapability(
    device: sys::nvmlDevice_t,
    major: *mut c_int,
    minor: *mut c_int,
) -> Ret {
    guard(|| unsafe {
        non_null(major)?;
        non_null(minor)?;
        let (machine, gpu) = gpu(device)?;
        let (a, b) = machine.devices[gpu]
            .compute_capability_pair()
            .ok_or(NOT_SUPPORTED)?;
        put(major, a as c_int)?;
        put(minor, b as c_int)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v3(
    device: sys::nvmlDevice_t,
    pci: *mut sys::nvmlPciInfo_t,
) -> Ret {
    guard(|| unsafe {
        non_null(pci)?;
        let (machine, gpu) = gpu(device)?;
        put(pci, pci_info(&machine.bus_ids[gpu]))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMinorNumber(
    device: sys::nvmlDevice_t,
    minor_number: *mut c_uint,
) -> Ret {
    guard(|| unsafe {
        non_null(minor_number)?;
        let (machine, gpu) = gpu(device)?;
        put(
            minor_number,
            machine.devices[gpu].minor_number.ok_or(NOT_SUPPORTED)?,
        )
    })
}

// ---- telemetry ---------------------------------------------------------------------------------

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUtilizationRates(
    device: sys::nvmlDevice_t,
    utilization: *mut sys::nvmlUtilization_t,
) -> Ret {
    guard(|| unsafe {
        non_null(utilization)?;
        let (machine, gpu) = events::live_gpu(device)?;
        let d = &machine.devices[gpu];
        match (d.utilization_gpu_percent, d.utilization_memory_percent) {
            (Some(gpu), Some(memory)) => put(utilization, sys::nvmlUtilization_t { gpu, memory }),
            _ => Err(NOT_SUPPORTED),
        }
    })
}

/// Only the GPU sensor exists (`NVML_TEMPERATURE_GPU`); another is `NVML_ERROR_INVALID_ARGUMENT`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTemperature(
    device: sys::nvmlDevice_t,
    sensor: sys::nvmlTemperatureSensors_t,
    temp: *mut c_uint,
) -> Ret {
    guard(|| unsafe {
        non_null(temp)?;
        if sensor != sys::nvmlTemperatureSensors_enum_NVML_TEMPERATURE_GPU {
            return Err(INVALID_ARGUMENT);
        }
        let (machine, gpu) = events::live_gpu(device)?;
        put(
            temp,
            machine.devices[gpu].temperature_c.ok_or(NOT_SUPPORTED)?,
        )
    })
}

/// Milliwatts; a board without power readings (no `power_draw_w`) is `NVML_ERROR_NOT_SUPPORTED`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPowerUsage(
    device: sys::nvmlDevice_t,
    power: *mut c_uint,
) -> Ret {
    guard(|| unsafe {
        non_null(power)?;
        let (machine, gpu) = events::live_gpu(device)?;
        let watts = machine.devices[gpu].power_draw_w.ok_or(NOT_SUPPORTED)?;
        let milliwatts = (watts * 1000.0).round();
        if !(0.0..=f64::from(c_uint::MAX)).contains(&milliwatts) {
            return Err(NOT_SUPPORTED);
        }
        put(power, milliwatts as c_uint)
    })
}

/// The file's processes. With `*info_count` too small (or `infos` null), the count needed goes
/// into `*info_count` and the answer is `NVML_ERROR_INSUFFICIENT_SIZE`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(
    device: sys::nvmlDevice_t,
    info_count: *mut c_uint,
    infos: *mut sys::nvmlProcessInfo_t,
) -> Ret {
    guard(|| unsafe {
        non_null(info_count)?;
        let (machine, gpu) = events::live_gpu(device)?;
        let processes = machine.devices[gpu].processes.as_deref().unwrap_or(&[]);
        // SAFETY: not null; NVML's contract makes it readable.
        let room = *info_count as usize;
        let needed = processes.len();
        put(info_count, needed as c_uint)?;
        if needed == 0 {
            return Ok(());
        }
        if infos.is_null() || room < needed {
            return Err(INSUFFICIENT_SIZE);
        }
        for (i, p) in processes.iter().enumerate() {
            // SAFETY: `infos` holds `room` >= `needed` entries (NVML's contract).
            put(
                infos.add(i),
                sys::nvmlProcessInfo_t {
                    pid: p.pid,
                    usedGpuMemory: p.used_memory_bytes.unwrap_or(VALUE_NOT_AVAILABLE),
                    gpuInstanceId: NO_INSTANCE,
                    computeInstanceId: NO_INSTANCE,
                },
            )?;
        }
        Ok(())
    })
}

// ---- MIG ---------------------------------------------------------------------------------------

/// Enabled (current and pending 1) on a GPU in MIG mode (the file's `mig_mode`, implied by
/// `[[gpu.mig]]` tables); another GPU is `NVML_ERROR_NOT_SUPPORTED` (the file does not say
/// whether it could have them).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMigMode(
    device: sys::nvmlDevice_t,
    current_mode: *mut c_uint,
    pending_mode: *mut c_uint,
) -> Ret {
    guard(|| unsafe {
        non_null(current_mode)?;
        non_null(pending_mode)?;
        let (machine, gpu) = parent_gpu(device)?;
        if !machine.devices[gpu].mig_mode {
            return Err(NOT_SUPPORTED);
        }
        put(current_mode, 1)?;
        put(pending_mode, 1)
    })
}

/// The GPU's MIG slots (the file's `mig_slots`, 7 unless it says), as a real GPU's maximum is
/// its hardware's; the file's slices fill the first ones.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMaxMigDeviceCount(
    device: sys::nvmlDevice_t,
    count: *mut c_uint,
) -> Ret {
    guard(|| unsafe {
        non_null(count)?;
        let (machine, gpu) = parent_gpu(device)?;
        put(count, mig_slots(&machine.devices[gpu])?)
    })
}

/// The MIG slots of a GPU in MIG mode: at least as many as the file has slices.
fn mig_slots(gpu: &orch_devices::Device) -> Result<c_uint, Ret> {
    if !gpu.mig_mode {
        return Err(NOT_SUPPORTED);
    }
    let slots = gpu
        .mig_slots
        .unwrap_or(orch_devices::mig::DEFAULT_SLOTS)
        .max(gpu.mig_devices.len() as u32);
    Ok(slots as c_uint)
}

/// The slice in slot `index`; a slot past the file's slices holds none (`NVML_ERROR_NOT_FOUND`,
/// as NVML says of an empty slot), one past the GPU's slots is `NVML_ERROR_INVALID_ARGUMENT`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMigDeviceHandleByIndex(
    device: sys::nvmlDevice_t,
    index: c_uint,
    mig_device: *mut sys::nvmlDevice_t,
) -> Ret {
    guard(|| unsafe {
        non_null(mig_device)?;
        let (machine, gpu) = parent_gpu(device)?;
        let slots = mig_slots(&machine.devices[gpu])?;
        if index >= slots {
            return Err(INVALID_ARGUMENT);
        }
        if index as usize >= machine.devices[gpu].mig_devices.len() {
            return Err(NOT_FOUND);
        }
        put(
            mig_device,
            new_handle(Target {
                gpu,
                mig: Some(index as usize),
            })?,
        )
    })
}

/// A MIG device's GPU instance id (the file's `gpu_instance_id`; `NVML_ERROR_NOT_SUPPORTED`
/// when it gives none); a GPU handle is `NVML_ERROR_INVALID_ARGUMENT`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceId(
    device: sys::nvmlDevice_t,
    id: *mut c_uint,
) -> Ret {
    guard(|| unsafe {
        non_null(id)?;
        put(id, slice_id(device, |slice| slice.gpu_instance_id)?)
    })
}

/// A MIG device's compute instance id (the file's `compute_instance_id`), as
/// [`nvmlDeviceGetGpuInstanceId`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeInstanceId(
    device: sys::nvmlDevice_t,
    id: *mut c_uint,
) -> Ret {
    guard(|| unsafe {
        non_null(id)?;
        put(id, slice_id(device, |slice| slice.compute_instance_id)?)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceIsMigDeviceHandle(
    device: sys::nvmlDevice_t,
    is_mig_device: *mut c_uint,
) -> Ret {
    guard(|| unsafe {
        non_null(is_mig_device)?;
        let (_, target) = resolve(device)?;
        put(is_mig_device, c_uint::from(target.mig.is_some()))
    })
}

/// A MIG handle's GPU; a GPU handle is `NVML_ERROR_INVALID_ARGUMENT`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetDeviceHandleFromMigDeviceHandle(
    mig_device: sys::nvmlDevice_t,
    device: *mut sys::nvmlDevice_t,
) -> Ret {
    guard(|| unsafe {
        non_null(device)?;
        let (_, target) = resolve(mig_device)?;
        if target.mig.is_none() {
            return Err(INVALID_ARGUMENT);
        }
        put(
            device,
            new_handle(Target {
                gpu: target.gpu,
                mig: None,
            })?,
        )
    })
}

// ---- topology ----------------------------------------------------------------------------------

/// `NVML_ERROR_NOT_SUPPORTED` for every GPU, as on an x86 PCIe box: the id is the GPU's own
/// memory as a NUMA node, which only coherent platforms (GH200, GB200) have. The node a GPU hangs
/// off (the file's `numa_node`) is its memory affinity.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNumaNodeId(
    device: sys::nvmlDevice_t,
    node: *mut c_uint,
) -> Ret {
    guard(|| {
        non_null(node)?;
        gpu(device)?;
        Err(NOT_SUPPORTED)
    })
}

/// The GPU's NUMA node by node scope; socket scope is `NVML_ERROR_NOT_SUPPORTED` (the file
/// does not say which sockets hold which nodes).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryAffinity(
    device: sys::nvmlDevice_t,
    node_set_size: c_uint,
    node_set: *mut c_ulong,
    scope: sys::nvmlAffinityScope_t,
) -> Ret {
    guard(|| unsafe {
        non_null(node_set)?;
        if node_set_size == 0 || scope > sys::NVML_AFFINITY_SCOPE_SOCKET {
            return Err(INVALID_ARGUMENT);
        }
        let (machine, gpu) = gpu(device)?;
        if scope != sys::NVML_AFFINITY_SCOPE_NODE {
            return Err(NOT_SUPPORTED);
        }
        let node = machine.devices[gpu].numa_node.ok_or(NOT_SUPPORTED)?;
        put_mask(node_set, node_set_size, std::iter::once(node))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCpuAffinity(
    device: sys::nvmlDevice_t,
    cpu_set_size: c_uint,
    cpu_set: *mut c_ulong,
) -> Ret {
    guard(|| unsafe {
        non_null(cpu_set)?;
        if cpu_set_size == 0 {
            return Err(INVALID_ARGUMENT);
        }
        let (machine, gpu) = gpu(device)?;
        let cpus = machine.devices[gpu].cpus.as_ref().ok_or(NOT_SUPPORTED)?;
        put_mask(cpu_set, cpu_set_size, cpus.iter())
    })
}

/// By node scope the GPU's CPUs; socket scope is `NVML_ERROR_NOT_SUPPORTED`, as for memory.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCpuAffinityWithinScope(
    device: sys::nvmlDevice_t,
    cpu_set_size: c_uint,
    cpu_set: *mut c_ulong,
    scope: sys::nvmlAffinityScope_t,
) -> Ret {
    if scope > sys::NVML_AFFINITY_SCOPE_SOCKET {
        return INVALID_ARGUMENT;
    }
    if scope != sys::NVML_AFFINITY_SCOPE_NODE {
        return guard(|| gpu(device).and(Err(NOT_SUPPORTED)));
    }
    unsafe { nvmlDeviceGetCpuAffinity(device, cpu_set_size, cpu_set) }
}

/// The PCIe level the file's `pcie_switch` and `numa_node` give the pair; a pair the file says
/// nothing of is `NVML_ERROR_NOT_SUPPORTED`; a GPU with itself `NVML_TOPOLOGY_INTERNAL`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTopologyCommonAncestor(
    device1: sys::nvmlDevice_t,
    device2: sys::nvmlDevice_t,
    path_info: *mut sys::nvmlGpuTopologyLevel_t,
) -> Ret {
    guard(|| unsafe {
        non_null(path_info)?;
        let (machine, a) = gpu(device1)?;
        let (_, b) = gpu(device2)?;
        if a == b {
            return put(path_info, sys::nvmlGpuLevel_enum_NVML_TOPOLOGY_INTERNAL);
        }
        let level = machine.devices[a]
            .link_to(b as u32)
            .and_then(|l| l.pcie)
            .ok_or(NOT_SUPPORTED)?;
        put(
            path_info,
            match level {
                PcieLevel::Pix => sys::nvmlGpuLevel_enum_NVML_TOPOLOGY_SINGLE,
                PcieLevel::Pxb => sys::nvmlGpuLevel_enum_NVML_TOPOLOGY_MULTIPLE,
                PcieLevel::Phb => sys::nvmlGpuLevel_enum_NVML_TOPOLOGY_HOSTBRIDGE,
                PcieLevel::Node => sys::nvmlGpuLevel_enum_NVML_TOPOLOGY_NODE,
                PcieLevel::Sys => sys::nvmlGpuLevel_enum_NVML_TOPOLOGY_SYSTEM,
            },
        )
    })
}

/// The far end of one link of a GPU. A GPU without NVLinks is `NVML_ERROR_NOT_SUPPORTED`; a link
/// number past [`MAX_LINKS`] `NVML_ERROR_INVALID_ARGUMENT`; `None` for a link that is down.
fn link_end(
    device: sys::nvmlDevice_t,
    link: c_uint,
) -> Result<(Arc<Machine>, Option<LinkEnd>), Ret> {
    let (machine, gpu) = gpu(device)?;
    if link as usize >= MAX_LINKS {
        return Err(INVALID_ARGUMENT);
    }
    let links = &machine.nvlinks[gpu];
    if links.is_empty() {
        return Err(NOT_SUPPORTED);
    }
    let end = links.get(link as usize).copied();
    Ok((machine, end))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkState(
    device: sys::nvmlDevice_t,
    link: c_uint,
    is_active: *mut sys::nvmlEnableState_t,
) -> Ret {
    guard(|| unsafe {
        non_null(is_active)?;
        let (_, end) = link_end(device, link)?;
        put(
            is_active,
            if end.is_some() {
                sys::nvmlEnableState_enum_NVML_FEATURE_ENABLED
            } else {
                sys::nvmlEnableState_enum_NVML_FEATURE_DISABLED
            },
        )
    })
}

/// The PCI id at the far end of an active link (the peer GPU's, or the simulated NVSwitch's); a
/// link that is down is `NVML_ERROR_INVALID_ARGUMENT`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkRemotePciInfo_v2(
    device: sys::nvmlDevice_t,
    link: c_uint,
    pci: *mut sys::nvmlPciInfo_t,
) -> Ret {
    guard(|| unsafe {
        non_null(pci)?;
        let (machine, end) = link_end(device, link)?;
        let bus_id = match end.ok_or(INVALID_ARGUMENT)? {
            LinkEnd::Gpu(peer) => machine.bus_ids[peer].clone(),
            LinkEnd::Switch(n) => switch_bus_id(n),
        };
        put(pci, pci_info(&bus_id))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkRemoteDeviceType(
    device: sys::nvmlDevice_t,
    link: c_uint,
    device_type: *mut sys::nvmlIntNvLinkDeviceType_t,
) -> Ret {
    guard(|| unsafe {
        non_null(device_type)?;
        let (_, end) = link_end(device, link)?;
        put(
            device_type,
            match end.ok_or(INVALID_ARGUMENT)? {
                LinkEnd::Gpu(_) => sys::nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_GPU,
                LinkEnd::Switch(_) => {
                    sys::nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_SWITCH
                }
            },
        )
    })
}

mod events;

#[cfg(test)]
mod tests;
