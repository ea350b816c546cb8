//! `orch run JOB.toml` and the quick form `orch run --gpus N … -- CMD ARGS…`: plan and claim in
//! one atomic lease transaction, run the command on exactly its devices, release.

use super::{leases::open_store, load_inventory, plan::policy_host};
use crate::cli::RunArgs;
use crate::failure::{CmdResult, Failure};
use orch_core::job::{self, CommandSpec, JobSpec, Launch, PluginRef, PolicySpec, Resources, Work};
use orch_core::{ByteSize, Location};
use orch_devices::{Backend, Device, Inventory, InventorySpec, Visibility, VisibilityEnv};
use orch_exec::{AssignedDevice, JobEnv, LaunchSpec, MemoryWatch, Monitor, ProcessMemory, Verdict};
use orch_host::PolicyHost;
use orch_leases::{ClaimError, ClaimRequest, Holder, Lease, LeaseStore};
use orch_runner::{Plan, PlanError, PlanInput};
use std::time::{Duration, Instant};

/// Between SIGTERM and SIGKILL for the other processes of a failed per-device job.
const GRACE: Duration = Duration::from_secs(10);
const DEFAULT_POLICY: &str = "least-loaded";

pub fn run(spec: &InventorySpec, args: &RunArgs) -> CmdResult {
    let job = match &args.job {
        Some(path) => job::read(path).map_err(Failure::bad_input)?,
        None => quick_job(args)?,
    };
    let timeout = args.timeout.as_deref().map(parse_duration).transpose()?;
    if args.resume && matches!(job.work, Work::Command(_)) {
        return Err(Failure::bad_input_msg(format!(
            "{}: --resume is for [train] jobs",
            job.path.display()
        )));
    }
    let inventory = load_inventory(spec)?;
    // A [train] job's plugin and data are read before the lease: bad input fails at once.
    let work = match &job.work {
        Work::Train(_) => Ready::Train(Box::new(super::train::prepare(&job, args.resume)?)),
        Work::Command(command) => Ready::Command(command.clone()),
    };
    let visibility = Visibility::resolve(&inventory.devices, &VisibilityEnv::from_process());
    let mut host = policy_host()?;
    // Compile (or load from the disk cache) the policy before the lease transaction, so the
    // store's write lock is held for the decision only. An error here resurfaces, with its
    // location in the job file, from the plan inside the claim.
    let _ = host.load(&job.policy.plugin);
    let mut store = open_store()?;
    let wait = args
        .wait
        .then(|| Instant::now() + timeout.unwrap_or(Duration::MAX / 4));
    let (lease, plan) = claim_until(&mut store, &mut host, &job, &inventory, &visibility, wait)?;
    tracing::info!("{}", placed_line(&job, &lease, &plan));
    let command = match work {
        Ready::Command(command) => command,
        Ready::Train(prepared) => {
            // The Wasm trainer's replicas run in this process, on the leased devices.
            let result = super::train::run(*prepared, &job, &plan, &inventory);
            if let Err(e) = store.release(&lease.id) {
                tracing::warn!(
                    "could not release lease {}: {e} (the next orch reclaims it)",
                    lease.id
                );
            }
            return result;
        }
    };

    let launch = LaunchSpec {
        argv: command.argv.clone(),
        // A job file's command runs in the job's folder, where its relative paths resolve.
        cwd: Some(job.dir.clone()),
        job: job_env(&job, &command, &lease, &plan, &inventory.devices),
        per_device: command.launch == Launch::PerDevice,
        grace: GRACE,
    };
    let monitor = memory_monitor(&job, &plan, inventory.backend);
    let result = orch_exec::launch(
        &launch,
        |pid| {
            if let Some(holder) = Holder::of_pid(pid)
                && let Err(e) = store.add_holder(&lease.id, holder)
            {
                tracing::warn!(
                    "could not record pid {pid} as a holder of lease {}: {e}",
                    lease.id
                );
            }
        },
        monitor,
    );
    if let Err(e) = store.release(&lease.id) {
        tracing::warn!(
            "could not release lease {}: {e} (the next orch reclaims it)",
            lease.id
        );
    }
    let outcome = result.map_err(Failure::failed)?;
    if outcome.success() {
        return Ok(());
    }
    Err(Failure {
        code: outcome.code(),
        error: anyhow::anyhow!("job {} ended with {outcome}", job.name),
    })
}

/// Plans and claims in one lease transaction; with `wait`, retries (backing off) until a fit
/// appears or the deadline passes.
fn claim_until(
    store: &mut LeaseStore,
    host: &mut PolicyHost,
    job: &JobSpec,
    inventory: &Inventory,
    visibility: &Visibility,
    wait: Option<Instant>,
) -> Result<(Lease, Plan), Failure> {
    let request = ClaimRequest {
        job_name: job.name.clone(),
        exclusive: job.resources.exclusive,
        memory_reserved_bytes: job.resources.memory_limit.map_or(0, ByteSize::bytes),
        holder: Holder::current(),
    };
    let mut delay = Duration::from_millis(50);
    let mut last_reason = String::new();
    loop {
        let mut planned: Option<Plan> = None;
        let claimed = store.claim(&request, |leases| {
            let input = PlanInput {
                job,
                devices: &inventory.devices,
                visibility,
                leases,
            };
            let plan = orch_runner::plan(input, host, &|name| std::env::var(name).ok())?;
            let uuids = plan.chosen.iter().map(|d| d.uuid.clone()).collect();
            planned = Some(plan);
            Ok::<_, PlanError>(uuids)
        });
        let error = match claimed {
            Ok(lease) => {
                let plan = planned.ok_or_else(|| Failure::failed_msg("the plan was lost"))?;
                return Ok((lease, plan));
            }
            Err(ClaimError::Choose(e)) if e.is_bad_input() => return Err(Failure::bad_input(e)),
            Err(ClaimError::Choose(e)) if !is_no_fit(&e) => return Err(Failure::failed(e)),
            Err(ClaimError::Store(e)) => return Err(Failure::failed(e)),
            Err(e) => e.to_string(),
        };
        let Some(deadline) = wait else {
            return Err(Failure::failed_msg(format!(
                "{error} (add --wait to wait for a fit)"
            )));
        };
        if Instant::now() + delay > deadline {
            return Err(Failure::failed_msg(format!("gave up waiting: {error}")));
        }
        if error != last_reason {
            tracing::info!("waiting: {error}");
            last_reason = error;
        }
        std::thread::sleep(delay + jitter());
        delay = (delay * 3 / 2).min(Duration::from_secs(2));
    }
}

/// What a job runs once it holds its lease, made ready before the lease is taken.
enum Ready<'a> {
    Command(CommandSpec),
    Train(Box<orch_trainer::Prepared<'a>>),
}

/// On real GPUs with a `memory_limit`, watches the job's processes' memory (NVML's per-process
/// readings) every two seconds: an excess is reported, and with `enforce_memory_limit` the job is
/// stopped. Simulated and CPU devices have no per-process readings to watch.
fn memory_monitor(job: &JobSpec, plan: &Plan, backend: Backend) -> Option<Monitor> {
    let limit = job.resources.memory_limit?.bytes();
    if backend != Backend::Nvml {
        return None;
    }
    let devices = plan.chosen.iter().map(|d| d.uuid.clone()).collect();
    let mut watch = MemoryWatch::new(devices, limit, job.resources.enforce_memory_limit);
    Some(Monitor {
        interval: Duration::from_secs(2),
        check: Box::new(move |pids| {
            let Ok(devices) = orch_devices::nvml::read() else {
                return Verdict::Continue;
            };
            let readings: Vec<ProcessMemory> = devices
                .iter()
                .flat_map(|d| {
                    d.processes.iter().flatten().filter_map(|p| {
                        Some(ProcessMemory {
                            device_uuid: d.uuid.clone(),
                            pid: p.pid,
                            used_bytes: p.used_memory_bytes?,
                        })
                    })
                })
                .collect();
            watch.check(pids, &readings)
        }),
    })
}

fn is_no_fit(e: &PlanError) -> bool {
    matches!(e, PlanError::Policy(p) if p.refusal().is_some_and(|(kind, _)| kind == orch_host::RefusalKind::NoFit))
}

/// Up to 50 ms, different in every process, so waiters do not retry in lockstep.
fn jitter() -> Duration {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    Duration::from_millis(u64::from((nanos ^ std::process::id()) % 50))
}

fn job_env(
    job: &JobSpec,
    command: &CommandSpec,
    lease: &Lease,
    plan: &Plan,
    devices: &[Device],
) -> JobEnv {
    let assigned = plan
        .chosen
        .iter()
        .map(|chosen| {
            let device = devices.iter().find(|d| d.index == chosen.physical_index);
            let is_gpu = chosen.uuid.starts_with("GPU-") || chosen.uuid.starts_with("MIG-");
            AssignedDevice {
                cuda_id: if is_gpu {
                    chosen.uuid.clone()
                } else {
                    String::new()
                },
                memory_total_bytes: device.and_then(|d| d.memory_total_bytes),
            }
        })
        .collect();
    JobEnv {
        job_id: lease.id.clone(),
        devices: assigned,
        memory_limit_bytes: job.resources.memory_limit.map(ByteSize::bytes),
        exclusive: job.resources.exclusive,
        extra: command.env.clone(),
    }
}

fn placed_line(job: &JobSpec, lease: &Lease, plan: &Plan) -> String {
    let devices: Vec<String> = plan
        .chosen
        .iter()
        .map(|d| {
            let kind = if d.uuid.starts_with("CPU") {
                "device"
            } else {
                "GPU"
            };
            format!(
                "{kind} {} ({})",
                d.physical_index,
                d.uuid.chars().take(12).collect::<String>()
            )
        })
        .collect();
    format!(
        "job {}: lease {} on {} by {}: {}",
        job.name,
        lease.id,
        devices.join(", "),
        plan.policy,
        plan.reason
    )
}

/// The job the quick form describes.
fn quick_job(args: &RunArgs) -> Result<JobSpec, Failure> {
    let Some(program) = args.command.first() else {
        return Err(Failure::bad_input_msg(
            "orch run needs a job file or a command: orch run JOB.toml, or orch run --gpus N -- CMD ARGS",
        ));
    };
    let here = std::env::current_dir().map_err(Failure::failed)?;
    let at = Location {
        file: "command line".into(),
        line: 0,
        column: 0,
    };
    let size = |flag: &str, text: &Option<String>| -> Result<Option<ByteSize>, Failure> {
        text.as_deref()
            .map(|t| {
                t.parse::<ByteSize>()
                    .map_err(|e| Failure::bad_input_msg(format!("{flag}: {e}")))
            })
            .transpose()
    };
    if let Some(u) = args.max_utilization.filter(|u| *u > 100) {
        return Err(Failure::bad_input_msg(format!(
            "--max-utilization is a percent from 0 to 100, found {u}"
        )));
    }
    let gpus = args.gpus.unwrap_or(1);
    if gpus == 0 {
        return Err(Failure::bad_input_msg("--gpus must be at least 1"));
    }
    let name = std::path::Path::new(program)
        .file_name()
        .map_or_else(|| program.clone(), |n| n.to_string_lossy().into_owned());
    Ok(JobSpec {
        path: "command line".into(),
        dir: here.clone(),
        name,
        tenant: None,
        priority: 0,
        resources: Resources {
            gpus,
            gpus_at: at.clone(),
            min_free_memory: size("--min-free-memory", &args.min_free_memory)?,
            max_utilization: args.max_utilization,
            memory_limit: size("--memory-limit", &args.memory_limit)?,
            exclusive: !args.shared,
            enforce_memory_limit: false,
        },
        policy: PolicySpec {
            plugin: PluginRef::parse(args.policy.as_deref().unwrap_or(DEFAULT_POLICY), &here),
            plugin_at: at,
            config: Vec::new(),
        },
        work: Work::Command(CommandSpec {
            argv: args.command.clone(),
            env: Default::default(),
            launch: if args.per_device {
                Launch::PerDevice
            } else {
                Launch::Single
            },
        }),
    })
}

/// `90s`, `15m`, `2h`, `500ms`, or plain seconds.
fn parse_duration(text: &str) -> Result<Duration, Failure> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let value: f64 = number.parse().map_err(|_| bad_duration(text))?;
    let secs = match unit {
        "" | "s" => value,
        "ms" => value / 1000.0,
        "m" => value * 60.0,
        "h" => value * 3600.0,
        _ => return Err(bad_duration(text)),
    };
    Duration::try_from_secs_f64(secs).map_err(|_| bad_duration(text))
}

fn bad_duration(text: &str) -> Failure {
    Failure::bad_input_msg(format!(
        "--timeout: expected a duration such as 90s, 15m or 2h, found \"{text}\""
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("90s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("15m").unwrap(), Duration::from_secs(900));
        assert_eq!(parse_duration("1.5h").unwrap(), Duration::from_secs(5400));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("3").unwrap(), Duration::from_secs(3));
        for bad in ["", "s", "10 days", "-1s"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }
}
