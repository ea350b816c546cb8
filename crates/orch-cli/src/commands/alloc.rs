//! `orch alloc`: an interactive allocation, as Slurm's `salloc` gives one. The devices come the
//! way `orch run` takes them (from the machine's daemon, where the lease is a job of the queue
//! marked as an allocation, else from the local lease store); the shell (or CMD) runs with the
//! environment `orch run` gives a job, in the foreground of this terminal, and the lease goes
//! back when it ends.
//!
//! Its limits: through the daemon, the daemon applies `--time` (with its tenant's `max_runtime`)
//! and `--idle` (on the readings of its idle reclaim) and asks this process to end (SIGTERM);
//! this process then says why on the terminal and ends the shell. Without a daemon, this process
//! watches `--time` itself; `--idle` needs the daemon.

use super::{granted, load_inventory, quick, run};
use crate::cli::AllocArgs;
use crate::client::Client;
use crate::failure::{CmdResult, Failure};
use hyper::{Method, StatusCode};
use orch_core::JobSpec;
use orch_devices::{Backend, Inventory, InventorySpec};
use orch_runner::{Outcome, Placement, Plan};
use orch_serve::http::wire::{AllocRequest, Job};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant, SystemTime};

pub fn run(spec: &InventorySpec, args: &AllocArgs) -> CmdResult {
    let flag = |name: &str, text: &Option<String>| {
        text.as_deref()
            .map(|t| run::flag_duration(name, t))
            .transpose()
    };
    let time = flag("--time", &args.time)?;
    let idle = flag("--idle", &args.idle)?;
    let timeout = flag("--timeout", &args.timeout)?;
    if args.quick.per_device {
        return Err(Failure::bad_input_msg(
            "--per-device: an allocation runs one shell or command on all its devices; start one process per device inside it, or use `orch run --per-device`",
        ));
    }
    let argv = if args.command.is_empty() {
        vec![shell()]
    } else {
        args.command.clone()
    };
    let mut job = quick::job("alloc", &args.quick, &argv)?;
    job.max_runtime = time;
    let deadline = args
        .wait
        .then(|| Instant::now() + timeout.unwrap_or(Duration::MAX / 4));
    // As `orch run`: the machine's daemon (or the one ORCH_SERVER names) grants the lease;
    // inside an orch job, the claim is among the job's own devices.
    let nested = std::env::var_os("ORCH_JOB_ID").is_some();
    let authority = (!nested)
        .then(orch_leases::find_daemon)
        .filter(|d| d.found.is_authority());
    let limits = Limits { time, idle };
    let Some(daemon) = authority else {
        if idle.is_some() {
            return Err(Failure::bad_input_msg(
                "--idle needs the machine's orch daemon, which reads the GPUs' utilization: none runs here (give --time for a limit without it)",
            ));
        }
        if !nested {
            orch_leases::refuse_local_claim(spec.may_be_real()).map_err(Failure::failed_msg)?;
        }
        let inventory = load_inventory(spec)?;
        orch_runner::check_enforcement(&job, inventory.backend).map_err(Failure::bad_input_msg)?;
        let placement = run::place_here(&job, &inventory, deadline)?;
        let who = format!("lease {}", placement.lease.lease().id);
        return session(&job, placement, &inventory, &who, limits, None);
    };
    let client = Client::at(daemon.path.clone())?;
    let request = AllocRequest {
        idle_s: idle.map(|d| d.as_secs_f64()),
    };
    let granted = granted::lease(
        client,
        &job,
        quick::job_text(&job),
        &job.path,
        args.wait,
        deadline,
        Some(request),
    )?;
    orch_runner::check_enforcement(&job, granted.inventory.backend)
        .map_err(Failure::bad_input_msg)?;
    let who = format!("job {}", granted.job_id);
    let asked = Asked {
        socket: daemon.path,
        job_id: granted.job_id,
    };
    session(
        &job,
        granted.placement,
        &granted.inventory,
        &who,
        limits,
        Some(asked),
    )
}

/// What the user asked to end the allocation at.
#[derive(Debug, Clone, Copy)]
struct Limits {
    time: Option<Duration>,
    idle: Option<Duration>,
}

/// The daemon that granted the allocation, asked why it ends it.
struct Asked {
    socket: PathBuf,
    job_id: String,
}

/// The user's shell: `$SHELL`, else `/bin/sh`.
fn shell() -> String {
    std::env::var("SHELL")
        .ok()
        .filter(|s| !s.trim().is_empty())
        .unwrap_or_else(|| "/bin/sh".into())
}

/// Runs the allocation's shell (or command) on its placement until it ends or is ended, then
/// gives the lease back; exits with its status.
fn session(
    job: &JobSpec,
    placement: Placement,
    inventory: &Inventory,
    who: &str,
    limits: Limits,
    daemon: Option<Asked>,
) -> CmdResult {
    // SIGTERM (the daemon's, at a limit or a cancel, or anyone's) ends the allocation; orch's
    // forwarding passes it to the shell as well. Watched from before the shell starts: one that
    // comes while it starts is kept for the watcher.
    let mut signals = signal_hook::iterator::Signals::new([libc::SIGTERM])
        .map_err(|e| Failure::failed_msg(format!("cannot watch for SIGTERM: {e}")))?;
    eprintln!(
        "orch: granted {who}: {}",
        grant_line(&placement.plan, inventory, limits, SystemTime::now())
    );
    let prepared = orch_runner::prepare(job, false, None).map_err(run::run_failure)?;
    let running = run::start_job(job, prepared, placement, inventory, None)?;
    let Some(stopper) = running.stopper() else {
        return run::conclude(job, running.wait());
    };
    let groups = running.process_groups();
    let who_ended = who.to_string();
    let who = who.to_string();
    // Says why on the terminal, then ends the shell: SIGHUP first (an interactive shell
    // ignores SIGTERM, and ends on a hang-up as when its terminal closes), then the stop every
    // job gets (SIGTERM, SIGKILL after the grace period).
    let stopped = Arc::new(AtomicBool::new(false));
    let stopping = Arc::clone(&stopped);
    let end: Arc<dyn Fn(String) + Send + Sync> = Arc::new(move |why: String| {
        stopping.store(true, Ordering::SeqCst);
        eprintln!("orch: {who} {why}");
        for &group in &groups {
            // SAFETY: kill(2) on a process group this process started; one already gone is
            // ESRCH.
            unsafe {
                libc::kill(-(group as i32), libc::SIGHUP);
            }
        }
        stopper.stop(why);
    });
    let handle = signals.handle();
    // Without a daemon, the time limit is this process's to keep.
    let local = daemon.is_none();
    let on_term = Arc::clone(&end);
    let watcher = std::thread::spawn(move || {
        if signals.forever().next().is_some() {
            let why = match &daemon {
                Some(asked) => daemon_reason(asked),
                None => "ends: orch alloc received SIGTERM".to_string(),
            };
            on_term(why);
        }
    });
    let (done, finished) = mpsc::channel::<()>();
    let timer = match limits.time {
        Some(limit) if local => {
            let end = Arc::clone(&end);
            Some(std::thread::spawn(move || {
                if finished.recv_timeout(limit) == Err(mpsc::RecvTimeoutError::Timeout) {
                    end(format!(
                        "released at its time limit ({})",
                        humantime::format_duration(limit)
                    ));
                }
            }))
        }
        _ => None,
    };
    let ended = running.wait();
    drop(done);
    handle.close();
    let _ = watcher.join();
    if let Some(timer) = timer {
        let _ = timer.join();
    }
    match ended {
        // Why was said when it was stopped; its command may have died of the signal first.
        Ok(Outcome::Command(outcome)) if stopped.load(Ordering::SeqCst) => Err(Failure {
            code: outcome.code().max(1),
            error: anyhow::anyhow!("{who_ended} ended"),
        }),
        ended => run::conclude(job, ended),
    }
}

/// Why the daemon ends allocation job `asked.job_id`: the reason of its stop (its idle or time
/// limit), or its cancel. The daemon records that before it signals; a SIGTERM from elsewhere
/// finds neither.
fn daemon_reason(asked: &Asked) -> String {
    let Ok(client) = Client::at(asked.socket.clone()) else {
        return "ends: orch alloc received SIGTERM".into();
    };
    let path = format!("/v1/jobs/{}", asked.job_id);
    for _ in 0..5 {
        if let Ok((StatusCode::OK, body)) = client.call(Method::GET, &path, None)
            && let Ok(job) = serde_json::from_slice::<Job>(&body)
        {
            let stop = job.events.iter().rev().find(|e| e.kind == "stopping");
            match (job.cancel_requested, stop) {
                // "cancel asked by alice"
                (true, Some(stop)) => return format!("cancelled: {}", stop.message),
                (true, None) => return "cancelled".into(),
                (false, Some(stop)) => return stop.message.clone(),
                (false, None) => {}
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    "ends: orch alloc received SIGTERM".into()
}

/// What was granted, as `salloc` says it: `GPU 0, 1 (NVIDIA H100) until 14:32; idle limit 30m`.
fn grant_line(plan: &Plan, inventory: &Inventory, limits: Limits, now: SystemTime) -> String {
    let kind = if inventory.backend == Backend::Cpu {
        "device"
    } else {
        "GPU"
    };
    let indices: Vec<String> = plan
        .chosen
        .iter()
        .map(|d| d.physical_index.to_string())
        .collect();
    let mut names: Vec<&str> = Vec::new();
    for d in &plan.chosen {
        if !names.contains(&d.name.as_str()) {
            names.push(&d.name);
        }
    }
    let mut line = format!("{kind} {} ({})", indices.join(", "), names.join(", "));
    if let Some(limit) = limits.time {
        line.push_str(&format!(" until {}", clock(now + limit, limit)));
    }
    if let Some(idle) = limits.idle {
        line.push_str(&format!(
            "; idle limit {}",
            humantime::format_duration(idle)
        ));
    }
    line
}

/// A moment in local time: `14:32`, with its date when it is a day or more away.
fn clock(at: SystemTime, away: Duration) -> String {
    let secs = at
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let Ok(t) = libc::time_t::try_from(secs) else {
        return humantime::format_rfc3339_seconds(at).to_string();
    };
    // SAFETY: an all-zero `tm` is a valid value to be overwritten; localtime_r writes only into
    // it and returns null on failure.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    if unsafe { libc::localtime_r(&t, &mut tm) }.is_null() {
        return humantime::format_rfc3339_seconds(at).to_string();
    }
    let time = format!("{:02}:{:02}", tm.tm_hour, tm.tm_min);
    if away >= Duration::from_secs(20 * 3600) {
        format!(
            "{}-{:02}-{:02} {time}",
            tm.tm_year + 1900,
            tm.tm_mon + 1,
            tm.tm_mday
        )
    } else {
        time
    }
}
