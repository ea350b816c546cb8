//! `orch devices [--json | --topo] [--watch SECS]`.

use super::load_inventory;
use crate::cli::DevicesArgs;
use crate::failure::{CmdResult, Failure};
use crate::table;
use orch_core::ByteSize;
use orch_devices::{Backend, Device, Inventory, InventorySpec, Visibility, VisibilityEnv, cuda};
use serde::Serialize;
use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::time::Duration;

/// One device in `--json` output: exactly these fields, null where the backend cannot read one.
#[derive(Debug, Serialize)]
struct DeviceRow<'a> {
    index: u32,
    visible_index: Option<usize>,
    uuid: &'a str,
    name: &'a str,
    backend: &'static str,
    memory_total_bytes: Option<u64>,
    memory_used_bytes: Option<u64>,
    memory_free_bytes: Option<u64>,
    utilization_gpu_percent: Option<u32>,
    utilization_memory_percent: Option<u32>,
    temperature_c: Option<u32>,
    power_draw_w: Option<f64>,
    compute_capability: Option<&'a str>,
    pci_bus_id: Option<&'a str>,
    processes: Option<&'a [orch_devices::GpuProcess]>,
    /// Its processes that no lease on it covers (nobody scheduled them through orch).
    foreign_processes: &'a [orch_devices::GpuProcess],
    numa_node: Option<u32>,
    /// A Linux CPU list (`0-47,96-143`).
    cpus: Option<&'a orch_core::CpuList>,
    /// How it reaches each other device the inventory knows a path to.
    links: Vec<LinkRow>,
    /// `ok`, `drained` or `unhealthy`.
    state: &'static str,
    /// Its state, why and since when, then its readings (Xid errors, ECC, remapped rows, lost),
    /// why it is unhealthy, its drains.
    health: orch_devices::HealthView<'a>,
    /// MIG mode is on: the GPU is leased only by its slices.
    mig_mode: bool,
    /// Its MIG slices, each naming this GPU as its parent.
    mig_devices: Vec<SliceRow<'a>>,
}

/// One MIG slice in `--json`, under its GPU.
#[derive(Debug, Serialize)]
struct SliceRow<'a> {
    uuid: &'a str,
    /// The profile (`1g.10gb`), as the inventory names it.
    name: Option<&'a str>,
    memory_total_bytes: Option<u64>,
    memory_used_bytes: Option<u64>,
    memory_free_bytes: Option<u64>,
    gpu_instance_id: Option<u32>,
    compute_instance_id: Option<u32>,
    gpu_instance_cap_minor: Option<u32>,
    compute_instance_cap_minor: Option<u32>,
    /// Its share of the GPU's compute (`3g` of a 7-slot GPU: 3/7), as fair share counts it.
    compute_fraction: f64,
    parent_index: u32,
    parent_uuid: &'a str,
    /// `ok`, `drained` or `unhealthy` (a GPU's health and drains reach its slices).
    state: &'static str,
    /// Its state, why and since when.
    health: orch_devices::Service,
}

/// One pair's link in `--json`: the label `--topo` prints, and what it is made of.
#[derive(Debug, Serialize)]
struct LinkRow {
    peer: u32,
    link: String,
    nvlinks: u32,
    pcie: Option<&'static str>,
}

type Foreign = BTreeMap<String, Vec<orch_devices::GpuProcess>>;

/// The processes no lease covers, against this machine's lease store (none when it cannot be
/// read: a reader without a state folder sees no leases, so nothing is called foreign wrongly).
fn foreign(inventory: &Inventory) -> Foreign {
    // Listing devices creates no state folder: with no lease store there are no leases.
    let dir = orch_leases::default_state_dir();
    if !dir.join("leases.sqlite3").is_file() {
        return orch_runner::foreign_processes(inventory, &[]);
    }
    match orch_leases::LeaseStore::open(&dir).and_then(|mut s| s.active()) {
        Ok(leases) => orch_runner::foreign_processes(inventory, &leases),
        Err(e) => {
            tracing::debug!("no lease store to tell foreign processes by: {e}");
            Foreign::new()
        }
    }
}

pub fn run(spec: &InventorySpec, args: &DevicesArgs) -> CmdResult {
    if args.check_cuda {
        return check_cuda();
    }
    let Some(secs) = args.watch else {
        let inventory = marked(load_inventory(spec)?);
        print!("{}", render(&inventory, args));
        return Ok(());
    };
    if !(secs.is_finite() && secs > 0.0) {
        return Err(Failure::bad_input_msg(format!(
            "--watch takes a positive number of seconds, found {secs}"
        )));
    }
    let terminal = std::io::stdout().is_terminal();
    loop {
        let inventory = marked(load_inventory(spec)?);
        let text = render(&inventory, args);
        let mut out = std::io::stdout().lock();
        let written = if terminal {
            // Home the cursor and clear the screen: refresh in place.
            write!(out, "\x1b[H\x1b[2J{text}")
        } else {
            writeln!(out, "{text}")
        };
        if written.and_then(|()| out.flush()).is_err() {
            return Ok(()); // the reader went away (a closed pipe): stop quietly
        }
        drop(out);
        std::thread::sleep(Duration::from_secs_f64(secs));
    }
}

fn render(inventory: &Inventory, args: &DevicesArgs) -> String {
    if args.topo {
        return topo_matrix(inventory);
    }
    let json = args.json;
    let visibility = Visibility::resolve(&inventory.devices, &VisibilityEnv::from_process());
    for note in &visibility.notes {
        tracing::warn!("{note}");
    }
    let foreign = foreign(inventory);
    if json {
        let rows: Vec<DeviceRow<'_>> = inventory
            .devices
            .iter()
            .map(|d| json_row(d, visibility.visible_index(d.index), &foreign))
            .collect();
        // Serialising plain data cannot fail.
        let mut text = serde_json::to_string_pretty(&rows).unwrap_or_default();
        text.push('\n');
        return text;
    }
    let mut text = human_table(inventory, &visibility, &foreign, args.verbose);
    text.push_str(&slice_lines(inventory));
    if inventory.backend != Backend::Sim {
        text.push_str(&cuda_line());
    }
    text
}

fn json_row<'a>(
    d: &'a Device,
    visible_index: Option<usize>,
    foreign: &'a Foreign,
) -> DeviceRow<'a> {
    DeviceRow {
        index: d.index,
        visible_index,
        uuid: &d.uuid,
        name: &d.name,
        backend: d.backend.as_str(),
        memory_total_bytes: d.memory_total_bytes,
        memory_used_bytes: d.memory_used_bytes,
        memory_free_bytes: d.memory_free_bytes,
        utilization_gpu_percent: d.utilization_gpu_percent,
        utilization_memory_percent: d.utilization_memory_percent,
        temperature_c: d.temperature_c,
        power_draw_w: d.power_draw_w,
        compute_capability: d.compute_capability.as_deref(),
        pci_bus_id: d.pci_bus_id.as_deref(),
        processes: d.processes.as_deref(),
        foreign_processes: foreign.get(&d.uuid).map_or(&[], Vec::as_slice),
        numa_node: d.numa_node,
        cpus: d.cpus.as_ref(),
        links: d
            .links
            .iter()
            .map(|l| LinkRow {
                peer: l.peer,
                link: l.label(),
                nvlinks: l.nvlinks,
                pcie: l.pcie.map(orch_devices::PcieLevel::as_str),
            })
            .collect(),
        state: d.service_state(&d.uuid).as_str(),
        health: d.health_view(),
        mig_mode: d.mig_mode,
        mig_devices: d
            .mig_devices
            .iter()
            .map(|m| SliceRow {
                uuid: &m.uuid,
                name: m.name.as_deref(),
                memory_total_bytes: m.memory_total_bytes,
                memory_used_bytes: m.memory_used_bytes,
                memory_free_bytes: m.memory_free_bytes(),
                gpu_instance_id: m.gpu_instance_id,
                compute_instance_id: m.compute_instance_id,
                gpu_instance_cap_minor: m.gpu_instance_cap_minor,
                compute_instance_cap_minor: m.compute_instance_cap_minor,
                compute_fraction: orch_devices::mig::compute_fraction(d, m),
                parent_index: d.index,
                parent_uuid: &d.uuid,
                state: d.service_state(&m.uuid).as_str(),
                health: d.service(&m.uuid),
            })
            .collect(),
    }
}

/// `inventory` with the drains and recorded health laid over it: the lease store's, and, when a
/// daemon answers, the daemon's (whose lease store a user's own orch may not read: the machine's
/// is root's). Listing devices creates no state folder.
fn marked(inventory: Inventory) -> Inventory {
    let marks = orch_runner::service::read_marks(&orch_leases::default_state_dir());
    let mut devices = orch_runner::service::with_marks(&inventory.devices, &marks).into_owned();
    for (uuid, health) in daemon_health() {
        let Some(device) = devices.iter_mut().find(|d| d.uuid == uuid) else {
            continue;
        };
        device.health.drains = health.drains;
        for problem in health.problems {
            match device.health.problems.iter_mut().find(|p| p.same(&problem)) {
                // The daemon has watched longer than this reading: its first sight counts.
                Some(seen) if problem.since_ms > 0 && problem.since_ms < seen.since_ms => {
                    seen.since_ms = problem.since_ms;
                }
                Some(_) => {}
                None => device.health.problems.push(problem),
            }
        }
    }
    Inventory {
        devices,
        ..inventory
    }
}

/// Each device's health as the daemon a client talks to sees it (`/v1/devices`); none when no
/// daemon answers or its answer cannot be read.
fn daemon_health() -> Vec<(String, orch_devices::Health)> {
    let found = orch_leases::find_daemon();
    if !orch_leases::answers(&found.path) {
        return Vec::new();
    }
    let answer = crate::client::Client::at(found.path)
        .and_then(|c| c.call(hyper::Method::GET, "/v1/devices", None));
    let Ok((hyper::StatusCode::OK, body)) = answer else {
        return Vec::new();
    };
    let Ok(devices) = serde_json::from_slice::<Vec<serde_json::Value>>(&body) else {
        return Vec::new();
    };
    devices
        .into_iter()
        .filter_map(|mut d| {
            let uuid = d.get("uuid")?.as_str()?.to_string();
            let health = serde_json::from_value(d.get_mut("health")?.take()).ok()?;
            Some((uuid, health))
        })
        .collect()
}

/// The STATE column: `ok`, `drained`, `unhealthy`; with `-v`, why.
fn state_cell(d: &Device, verbose: bool) -> String {
    match (d.out_of_service(&d.uuid), verbose) {
        (Some(why), true) => {
            let prefix = format!("GPU {} is ", d.index);
            let why = why.strip_prefix(&prefix).unwrap_or(&why).to_string();
            match why.strip_prefix("unhealthy (") {
                Some(rest) => format!("unhealthy: {}", rest.strip_suffix(')').unwrap_or(rest)),
                None => why,
            }
        }
        _ => d.service_state(&d.uuid).as_str().to_string(),
    }
}

/// The GPUs in MIG mode and their slices, as `nvidia-smi -L` lists them: the GPU's line, then
/// one indented line per slice (`MIG 1g.10gb  Device  0: (UUID: MIG-…)`); empty when no GPU is
/// in MIG mode.
fn slice_lines(inventory: &Inventory) -> String {
    let mut text = String::new();
    for d in inventory.devices.iter().filter(|d| d.mig_mode) {
        text.push_str(&format!("GPU {}: {} (UUID: {})\n", d.index, d.name, d.uuid));
        if d.mig_devices.is_empty() {
            text.push_str("  (MIG mode, no slices)\n");
        }
        for (slot, m) in d.mig_devices.iter().enumerate() {
            let profile = orch_devices::mig::short_profile(m.name.as_deref().unwrap_or("?"));
            // A slice out of service says so after the line `nvidia-smi -L` would print.
            let state = match d.service_state(&m.uuid) {
                orch_devices::ServiceState::Ok => String::new(),
                other => format!("  [{}]", other.as_str()),
            };
            text.push_str(&format!(
                "  MIG {profile:<11} Device {slot:>2}: (UUID: {}){state}\n",
                m.uuid
            ));
        }
    }
    if !text.is_empty() {
        text.insert(0, '\n');
    }
    text
}

/// What each label of the matrix means (`nvidia-smi topo -m`'s legend, plus `?`).
const TOPO_LEGEND: &str = "Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)
  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node
  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)
  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)
  PIX  = Connection traversing at most a single PCIe bridge
  NV#  = Connection traversing a bonded set of # NVLinks
  ?    = Not known: the inventory does not say how the two are connected
";

/// The matrix `orch devices --topo` prints: a row and a column per device, the link of every
/// pair, then each device's CPU and NUMA affinity (`N/A` where unknown), then the legend.
fn topo_matrix(inventory: &Inventory) -> String {
    let prefix = if inventory.backend == Backend::Cpu {
        "CPU"
    } else {
        "GPU"
    };
    let names: Vec<String> = inventory
        .devices
        .iter()
        .map(|d| format!("{prefix}{}", d.index))
        .collect();
    let mut header: Vec<&str> = vec![""];
    header.extend(names.iter().map(String::as_str));
    header.extend(["CPU Affinity", "NUMA Affinity"]);
    let rows: Vec<Vec<String>> = inventory
        .devices
        .iter()
        .zip(&names)
        .map(|(d, name)| {
            let mut row = vec![name.clone()];
            row.extend(inventory.devices.iter().map(|peer| {
                if peer.index == d.index {
                    "X".to_string()
                } else {
                    d.link_to(peer.index)
                        .map_or_else(|| "?".to_string(), orch_devices::PeerLink::label)
                }
            }));
            row.push(
                d.cpus
                    .as_ref()
                    .map_or_else(|| "N/A".into(), ToString::to_string),
            );
            row.push(d.numa_node.map_or_else(|| "N/A".into(), |n| n.to_string()));
            row
        })
        .collect();
    let mut text = table::render(&header, &rows);
    text.push('\n');
    text.push_str(TOPO_LEGEND);
    text
}

fn human_table(
    inventory: &Inventory,
    visibility: &Visibility,
    foreign: &Foreign,
    verbose: bool,
) -> String {
    let dash = || "-".to_string();
    let rows: Vec<Vec<String>> = inventory
        .devices
        .iter()
        .map(|d| {
            let memory = match (d.memory_used_bytes, d.memory_total_bytes) {
                (Some(used), Some(total)) => format!("{} / {}", gib(used), gib(total)),
                (None, Some(total)) => format!("? / {}", gib(total)),
                _ => dash(),
            };
            vec![
                d.index.to_string(),
                visibility
                    .visible_index(d.index)
                    .map_or_else(dash, |i| i.to_string()),
                d.short_uuid().to_string(),
                d.name.clone(),
                memory,
                d.utilization_gpu_percent
                    .map_or_else(dash, |u| format!("{u}%")),
                d.temperature_c.map_or_else(dash, |t| format!("{t}C")),
                d.power_draw_w.map_or_else(dash, |p| format!("{p:.0}W")),
                d.processes
                    .as_ref()
                    .map_or_else(dash, |p| p.len().to_string()),
                foreign.get(&d.uuid).map_or_else(String::new, |p| {
                    p.iter()
                        .map(|p| format!("pid {}", p.pid))
                        .collect::<Vec<_>>()
                        .join(", ")
                }),
                state_cell(d, verbose),
            ]
        })
        .collect();
    table::render(
        &[
            "GPU",
            "CUDA",
            "UUID",
            "NAME",
            "MEMORY USED/TOTAL",
            "UTIL",
            "TEMP",
            "POWER",
            "PROCS",
            "FOREIGN",
            "STATE",
        ],
        &rows,
    )
}

fn gib(bytes: u64) -> String {
    ByteSize(bytes).to_string()
}

fn cuda_line() -> String {
    match cuda::probe() {
        Ok(info) => format!(
            "CUDA: driver {}, {} device(s); NVRTC {}, cuBLAS {}\n",
            info.driver_version_string(),
            info.device_count,
            if info.nvrtc_present {
                "present"
            } else {
                "missing"
            },
            if info.cublas_present {
                "present"
            } else {
                "missing"
            },
        ),
        Err(reason) => format!("CUDA: not available ({reason})\n"),
    }
}

/// Creates a context on every device CUDA enumerates (after `CUDA_VISIBLE_DEVICES`).
fn check_cuda() -> CmdResult {
    let info =
        cuda::probe().map_err(|e| Failure::failed_msg(format!("CUDA: not available ({e})")))?;
    println!(
        "CUDA: driver {}, {} device(s)",
        info.driver_version_string(),
        info.device_count
    );
    if info.device_count == 0 {
        return Err(Failure::failed_msg("CUDA enumerates no device"));
    }
    let mut failures = 0;
    for ordinal in 0..info.device_count {
        match cuda::check_context(ordinal) {
            Ok(name) => println!("cuda:{ordinal}  context ok  {name}"),
            Err(e) => {
                failures += 1;
                println!("cuda:{ordinal}  FAILED  {e}");
            }
        }
    }
    if failures > 0 {
        return Err(Failure::failed_msg(format!(
            "{failures} of {} CUDA device(s) failed the context check",
            info.device_count
        )));
    }
    Ok(())
}
