//! `orch plan JOB.toml [--json]`: what the job's policy picks now, why, and why not the others.

use super::load_inventory;
use crate::cli::PlanArgs;
use crate::failure::{CmdResult, Failure};
use crate::table;
use orch_core::ByteSize;
use orch_core::job::{self, JobError};
use orch_devices::{InventorySpec, Visibility, VisibilityEnv};
use orch_host::{Limits, PolicyHost};
use orch_runner::{Plan, PlanError, PlanInput};
use serde::Serialize;

#[derive(Debug, Serialize)]
struct PlanJson<'a> {
    job: &'a str,
    policy: &'a str,
    devices: Vec<DeviceJson<'a>>,
    reason: &'a str,
    rejected: Vec<RejectedJson<'a>>,
    /// Each process's CPU binding (one, or one per rank), or why it is not bound; absent when
    /// the job is not bound (`cpu_bind = "none"`, the CPU device).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    cpu_binding: Vec<BindingJson>,
}

#[derive(Debug, Serialize)]
struct BindingJson {
    /// The CPUs, as a Linux CPU list; absent when not bound.
    #[serde(skip_serializing_if = "Option::is_none")]
    cpus: Option<String>,
    /// The NUMA nodes memory is preferred from.
    #[serde(skip_serializing_if = "Option::is_none")]
    mems: Option<String>,
    /// Why it is not bound.
    #[serde(skip_serializing_if = "Option::is_none")]
    unbound: Option<String>,
}

#[derive(Debug, Serialize)]
struct DeviceJson<'a> {
    index: u32,
    uuid: &'a str,
}

#[derive(Debug, Serialize)]
struct RejectedJson<'a> {
    index: u32,
    why: &'a str,
}

pub fn run(spec: &InventorySpec, args: &PlanArgs) -> CmdResult {
    let job = job::read(&args.job).map_err(|e| match e {
        JobError::Read { .. } | JobError::Invalid(_) => Failure::bad_input(e),
    })?;
    let inventory = load_inventory(spec)?;
    let visibility = Visibility::resolve(&inventory.devices, &VisibilityEnv::from_process());
    for note in &visibility.notes {
        tracing::warn!("{note}");
    }
    let mut host = policy_host()?;
    let leases = super::leases::open_store()?
        .active_device_leases()
        .map_err(Failure::failed)?;
    // Drains and recorded health, as a claim would see them.
    let marks = orch_runner::service::read_marks(&orch_leases::default_state_dir());
    let devices = orch_runner::service::with_marks(&inventory.devices, &marks);
    let input = PlanInput {
        job: &job,
        devices: &devices,
        visibility: &visibility,
        leases: &leases,
    };
    let plan = orch_runner::plan(input, &mut host, &|name| std::env::var(name).ok()).map_err(
        |e| match e {
            e @ PlanError::Input(_) => Failure::bad_input(e),
            e if e.is_bad_input() => Failure::bad_input(e),
            e => Failure::failed_msg(e),
        },
    )?;
    let launch = match &job.work {
        orch_core::job::Work::Command(command) => command.launch,
        orch_core::job::Work::Train(_) => orch_core::job::Launch::Single,
    };
    // A trainer is bound as one process, when the daemon runs it; `orch run` trains in its own
    // process, which is not bound (said below the binding).
    let train = matches!(job.work, orch_core::job::Work::Train(_));
    let bindings = orch_runner::bind::bindings(
        &job,
        launch,
        &plan,
        &inventory,
        &orch_exec::HostCpus::read(),
    );
    // GPUs whose place nobody knows are not bound by default, and not worth a line then.
    let unknown = |b: &Result<_, _>| matches!(b, Err(orch_runner::bind::Unbound::Unknown(_)));
    let bindings = if bindings.iter().all(unknown)
        && job.resources.cpu_bind != Some(orch_core::job::CpuBind::Numa)
    {
        Vec::new()
    } else {
        bindings
    };
    if args.json {
        println!("{}", json(&plan, &bindings));
    } else {
        print!("{}", human(&plan));
        print!("{}", binding_lines(&bindings));
        if train && !bindings.is_empty() {
            println!(
                "  (a [train] job is bound so when the daemon runs it; `orch run` trains in its own process, unbound)"
            );
        }
    }
    Ok(())
}

type Bindings = [Result<orch_exec::CpuBinding, orch_runner::bind::Unbound>];

/// `cpu binding: CPUs 0-23, memory preferred on NUMA node 0`, one line per rank when there are several.
fn binding_lines(bindings: &Bindings) -> String {
    let line = |b: &Result<orch_exec::CpuBinding, orch_runner::bind::Unbound>| match b {
        Ok(b) => b.to_string(),
        Err(why) => format!("not bound ({why})"),
    };
    match bindings {
        [] => String::new(),
        [one] => format!("cpu binding: {}\n", line(one)),
        ranks => ranks
            .iter()
            .enumerate()
            .map(|(rank, b)| format!("cpu binding of rank {rank}: {}\n", line(b)))
            .collect(),
    }
}

/// The policy host `orch` uses: the default limits, which a job's `[policy] deadline` and
/// `memory` replace for its plugin (within the machine's maxima).
pub fn policy_host() -> Result<PolicyHost, Failure> {
    PolicyHost::new(Limits::default()).map_err(Failure::failed_msg)
}

fn json(plan: &Plan, bindings: &Bindings) -> String {
    let value = PlanJson {
        job: &plan.job,
        policy: &plan.policy,
        devices: plan
            .chosen
            .iter()
            .map(|d| DeviceJson {
                index: d.index,
                uuid: &d.uuid,
            })
            .collect(),
        reason: &plan.reason,
        rejected: plan
            .rejected
            .iter()
            .map(|r| RejectedJson {
                index: r.index,
                why: &r.why,
            })
            .collect(),
        cpu_binding: bindings
            .iter()
            .map(|b| match b {
                Ok(b) => BindingJson {
                    cpus: Some(b.cpus.to_string()),
                    mems: Some(b.mems.to_string()),
                    unbound: None,
                },
                Err(why) => BindingJson {
                    cpus: None,
                    mems: None,
                    unbound: Some(why.to_string()),
                },
            })
            .collect(),
    };
    // Serialising plain data cannot fail.
    serde_json::to_string_pretty(&value).unwrap_or_default()
}

/// `GPU 3`, with the CUDA index when it differs.
fn label(index: u32, physical: u32) -> String {
    if index == physical {
        format!("GPU {physical}")
    } else {
        format!("GPU {physical} (CUDA {index})")
    }
}

fn human(plan: &Plan) -> String {
    let dash = || "-".to_string();
    let rows: Vec<Vec<String>> = plan
        .chosen
        .iter()
        .enumerate()
        .map(|(rank, d)| {
            vec![
                (rank + 1).to_string(),
                d.physical_index.to_string(),
                d.index.to_string(),
                d.uuid.chars().take(12).collect(),
                d.name.clone(),
                d.memory_free.map_or_else(dash, |f| ByteSize(f).to_string()),
                d.utilization_gpu.map_or_else(dash, |u| format!("{u}%")),
            ]
        })
        .collect();
    let mut out = format!(
        "job {}: policy {} chose {} device(s)\n",
        plan.job,
        plan.policy,
        plan.chosen.len()
    );
    out.push_str(&table::render(
        &["RANK", "GPU", "CUDA", "UUID", "NAME", "FREE", "UTIL"],
        &rows,
    ));
    out.push_str(&format!("reason: {}\n", plan.reason));
    if !plan.rejected.is_empty() {
        out.push_str("not chosen:\n");
        for r in &plan.rejected {
            out.push_str(&format!(
                "  {}: {}\n",
                label(r.index, r.physical_index),
                r.why
            ));
        }
    }
    if plan.hidden > 0 {
        out.push_str(&format!(
            "{} device(s) not visible here (CUDA_VISIBLE_DEVICES / Slurm) were not considered\n",
            plan.hidden
        ));
    }
    out
}
