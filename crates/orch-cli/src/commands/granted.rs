//! `orch run` on a machine with a daemon: the lease comes from the daemon (`POST /v1/leases`,
//! held by this process, queued under the tenant's fair share and limits with `--wait`), and
//! the job runs here, in the user's terminal, as the user. The daemon is to `orch run` what
//! `slurmctld` is to `srun`: it decides, this process runs.

use crate::client::{Client, answer_failure};
use crate::failure::Failure;
use hyper::{Method, StatusCode};
use orch_core::JobSpec;
use orch_runner::{GiveBack, LeaseGuard, Placement, Plan, PlannedDevice, Rejection};
use orch_serve::http::wire::{AllocRequest, LeaseRequest, LeaseView};
use orch_serve::{State, SubmitRequest};
use std::path::Path;
use std::time::{Duration, Instant};

/// A lease the daemon granted, and the devices it runs on.
pub struct Granted {
    pub placement: Placement,
    pub inventory: orch_devices::Inventory,
    /// The daemon's job for the lease.
    pub job_id: String,
}

/// Asks the daemon at `client` for the job's lease. Without `wait`, no fit is exit 1 with the
/// daemon's reason; with it, the job waits in the daemon's queue (its place said on stderr as
/// it changes) until it is placed or `deadline` passes. `alloc`: the lease is an interactive
/// allocation (`orch alloc`).
pub fn lease(
    client: Client,
    job: &JobSpec,
    job_text: String,
    job_path: &Path,
    wait: bool,
    deadline: Option<Instant>,
    alloc: Option<AllocRequest>,
) -> Result<Granted, Failure> {
    let cwd = std::env::current_dir().map_err(Failure::failed)?;
    let utf8 = |p: &Path, what: &str| {
        p.to_str().map(str::to_string).ok_or_else(|| {
            Failure::bad_input_msg(format!(
                "the {what} {} is not UTF-8: the daemon cannot be told it exactly; run from a folder whose path is UTF-8",
                p.display()
            ))
        })
    };
    let (policy_wasm, policy_digest) = super::jobs::send_policy(&client, job_path, &job_text)?;
    let request = LeaseRequest {
        submission: SubmitRequest {
            policy_wasm,
            policy_digest,
            job_text,
            job_path: utf8(job_path, "job file's path")?,
            cwd: utf8(&cwd, "working folder")?,
            env: super::jobs::utf8_env(),
            // Sent again after a daemon restart lost the answer, the request finds the job it
            // made, instead of queueing a second lease for this process.
            key: Some(super::jobs::submission_key()),
            depends: Default::default(),
        },
        wait,
        alloc,
    };
    let body = serde_json::to_vec(&request).map_err(Failure::failed)?;
    let (status, answer) = client.call(Method::POST, "/v1/leases", Some(body))?;
    let mut view: LeaseView = match status {
        StatusCode::CREATED | StatusCode::ACCEPTED => {
            serde_json::from_slice(&answer).map_err(Failure::failed)?
        }
        // No fit, or (503) its placement policy still held back by its tenant's budget.
        StatusCode::CONFLICT | StatusCode::SERVICE_UNAVAILABLE => {
            let message = answer_failure(status, &answer).error.to_string();
            let reason = message.strip_suffix(" (pass wait=True to wait for a fit)");
            if status == StatusCode::SERVICE_UNAVAILABLE && reason.is_none() {
                return Err(answer_failure(status, &answer));
            }
            return Err(Failure::failed_msg(format!(
                "{} (add --wait to wait for a fit)",
                reason.unwrap_or(&message)
            )));
        }
        _ => return Err(answer_failure(status, &answer)),
    };
    let client = std::sync::Arc::new(client);
    // From here the daemon holds a job for this process: every way out gives it back.
    let give_back = {
        let client = std::sync::Arc::clone(&client);
        let id = view.job_id.clone();
        move || release(&client, &id)
    };
    // What was said last: the reason, and the place among the waiting jobs.
    let mut said = (String::new(), None);
    let mut delay = Duration::from_millis(20);
    while view.state == State::Queued {
        let now = (
            view.reason.clone().unwrap_or_else(|| "queued".into()),
            view.place.zip(view.waiting),
        );
        if now != said {
            let standing = now.1.map_or(String::new(), |(place, waiting)| {
                format!(" ({} of {waiting} waiting)", ordinal(place))
            });
            eprintln!(
                "orch: job {} waits in the daemon's queue{standing}: {}",
                view.job_id, now.0
            );
            said = now;
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            give_back();
            return Err(Failure::failed_msg(format!(
                "gave up waiting (--timeout): {}",
                said.0
            )));
        }
        std::thread::sleep(delay);
        delay = (delay * 2).min(Duration::from_millis(250));
        let (status, answer) =
            client.call(Method::GET, &format!("/v1/leases/{}", view.job_id), None)?;
        if status != StatusCode::OK {
            give_back();
            return Err(answer_failure(status, &answer));
        }
        view = serde_json::from_slice(&answer).map_err(Failure::failed)?;
    }
    if view.state != State::Running {
        return Err(Failure::failed_msg(format!(
            "job {} {} before it was placed: {}",
            view.job_id,
            view.state.as_str(),
            view.reason.as_deref().unwrap_or("no reason given")
        )));
    }
    let granted = grant(job, &view);
    if granted.is_err() {
        give_back();
    }
    let (inventory, lease, plan) = granted?;
    let job_id = view.job_id.clone();
    let guard = LeaseGuard::granted(lease, GiveBack(Box::new(move |_| give_back())));
    // The daemon names the devices as the job's processes will see them (it confined this
    // process, so only it knows the CUDA indices that hold).
    let granted_names = view
        .env
        .get("CUDA_VISIBLE_DEVICES")
        .filter(|v| !v.is_empty())
        .map(|v| v.split(',').map(str::to_string).collect());
    Ok(Granted {
        placement: Placement {
            lease: guard,
            plan,
            granted_names,
        },
        inventory,
        job_id,
    })
}

/// `1st`, `2nd`, `3rd`, `4th`, ..., `11th`, `12th`, `13th`, `21st`, ...
fn ordinal(n: usize) -> String {
    let suffix = match (n % 10, n % 100) {
        (_, 11..=13) => "th",
        (1, _) => "st",
        (2, _) => "nd",
        (3, _) => "rd",
        _ => "th",
    };
    format!("{n}{suffix}")
}

/// The lease and plan the daemon's answer describes, on the daemon's own inventory.
fn grant(
    job: &JobSpec,
    view: &LeaseView,
) -> Result<(orch_devices::Inventory, orch_leases::Lease, Plan), Failure> {
    let spec: orch_devices::InventorySpec = view.inventory.parse().map_err(|e| {
        Failure::failed_msg(format!(
            "the daemon names its devices \"{}\", which this orch cannot read: {e}",
            view.inventory
        ))
    })?;
    let inventory = orch_devices::Inventory::load(&spec).map_err(|e| {
        Failure::failed_msg(format!(
            "cannot read the daemon's devices ({}): {e}",
            view.inventory
        ))
    })?;
    let chosen: Vec<PlannedDevice> = view
        .devices
        .iter()
        .map(|d| {
            serde_json::from_value::<PlannedDevice>(serde_json::json!({
                "index": d["index"],
                "physical_index": d["physical_index"],
                "uuid": d["uuid"],
                "name": d["name"],
                "memory_free": d["memory_free_bytes"],
                "utilization_gpu": d["utilization_gpu_percent"],
            }))
        })
        .collect::<Result<_, _>>()
        .map_err(|e| Failure::failed_msg(format!("the daemon's lease is not understood: {e}")))?;
    let rejected: Vec<Rejection> = view
        .rejected
        .iter()
        .filter_map(|r| serde_json::from_value(r.clone()).ok())
        .collect();
    let lease = orch_leases::Lease {
        id: view.lease_id.clone().unwrap_or_else(|| view.job_id.clone()),
        job_name: job.name.clone(),
        devices: chosen.iter().map(|d| d.uuid.clone()).collect(),
        exclusive: view.exclusive,
        memory_reserved_bytes: job
            .resources
            .memory_limit
            .map_or(0, orch_core::ByteSize::bytes),
        holders: vec![orch_leases::Holder::current()],
        created_at_ms: orch_core::time::now_ms(),
    };
    let plan = Plan {
        job: job.name.clone(),
        policy: view.policy.clone().unwrap_or_default(),
        chosen,
        reason: view.reason.clone().unwrap_or_default(),
        rejected,
        hidden: 0,
    };
    Ok((inventory, lease, plan))
}

/// Gives the lease back; a failure is said, and the daemon ends the lease anyway once this
/// process and the job are gone.
fn release(client: &Client, job_id: &str) {
    match client.call(Method::POST, &format!("/v1/leases/{job_id}/release"), None) {
        Ok((status, _)) if status.is_success() => {}
        Ok((status, answer)) => tracing::warn!(
            "the daemon did not take lease job {job_id} back: {}",
            answer_failure(status, &answer).error
        ),
        Err(e) => tracing::warn!(
            "the daemon did not take lease job {job_id} back: {}",
            e.error
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::ordinal;

    #[test]
    fn ordinals_read_as_english() {
        let got: Vec<String> = [1, 2, 3, 4, 11, 12, 13, 21, 22, 23, 101, 111, 112]
            .into_iter()
            .map(ordinal)
            .collect();
        assert_eq!(
            got,
            [
                "1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "23rd",
                "101st", "111th", "112th"
            ]
        );
    }
}
