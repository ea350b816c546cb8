//! `orch leases [--json]` and `orch leases release ID`.

use crate::cli::{LeasesAction, LeasesArgs};
use crate::failure::{CmdResult, Failure};
use crate::table;
use orch_core::ByteSize;
use orch_leases::{Lease, LeaseStore};
use serde::Serialize;

/// One lease in `--json` output.
#[derive(Debug, Serialize)]
struct LeaseRow<'a> {
    id: &'a str,
    job: &'a str,
    devices: &'a [String],
    exclusive: bool,
    memory_reserved_bytes: u64,
    holder_pids: Vec<u32>,
    created_at_ms: u64,
}

pub fn run(args: &LeasesArgs) -> CmdResult {
    // On a machine with a daemon (the machine's, or one ORCH_SERVER names) the leases are the
    // daemon's: it lists them; each ends with its job.
    let daemon = orch_leases::find_daemon();
    if daemon.found.is_authority() && orch_leases::answers(&daemon.path) {
        if let Some(LeasesAction::Release { id }) = &args.action {
            return Err(Failure::bad_input_msg(format!(
                "the leases of this machine are the orch daemon's at {}: end lease {id} with `orch cancel JOB` (orch jobs names the job), or leave it to end with its process",
                daemon.path.display()
            )));
        }
        let client = crate::client::Client::at(daemon.path)?;
        let (status, body) = client.call(hyper::Method::GET, "/v1/leases", None)?;
        if status != hyper::StatusCode::OK {
            return Err(crate::client::answer_failure(status, &body));
        }
        let leases: Vec<Lease> = serde_json::from_slice(&body).map_err(Failure::failed)?;
        return print(args, &leases);
    }
    let mut store = open_store()?;
    if let Some(LeasesAction::Release { id }) = &args.action {
        return match store.release(id) {
            Ok(true) => {
                println!("released lease {}", table::escape(id));
                Ok(())
            }
            Ok(false) => Err(Failure::bad_input_msg(format!(
                "no lease with id \"{id}\" (orch leases lists them)"
            ))),
            Err(e) => Err(Failure::failed(e)),
        };
    }
    let leases = store.active().map_err(Failure::failed)?;
    print(args, &leases)
}

fn print(args: &LeasesArgs, leases: &[Lease]) -> CmdResult {
    if args.json {
        let rows: Vec<LeaseRow<'_>> = leases.iter().map(row).collect();
        println!(
            "{}",
            serde_json::to_string_pretty(&rows).unwrap_or_default()
        );
        return Ok(());
    }
    if leases.is_empty() {
        println!("no leases");
        return Ok(());
    }
    let rows: Vec<Vec<String>> = leases
        .iter()
        .map(|l| {
            vec![
                l.id.clone(),
                l.devices
                    .iter()
                    .map(|d| short(d))
                    .collect::<Vec<_>>()
                    .join(","),
                if l.exclusive { "exclusive" } else { "shared" }.to_string(),
                if l.memory_reserved_bytes == 0 {
                    "-".to_string()
                } else {
                    ByteSize(l.memory_reserved_bytes).to_string()
                },
                l.holders
                    .iter()
                    .map(|h| h.pid.to_string())
                    .collect::<Vec<_>>()
                    .join(","),
                age(l.created_at_ms),
            ]
        })
        .collect();
    print!(
        "{}",
        table::render(
            &["LEASE", "DEVICES", "MODE", "RESERVED", "PIDS", "AGE"],
            &rows
        )
    );
    Ok(())
}

pub fn open_store() -> Result<LeaseStore, Failure> {
    LeaseStore::open_default().map_err(Failure::failed)
}

fn row(l: &Lease) -> LeaseRow<'_> {
    LeaseRow {
        id: &l.id,
        job: &l.job_name,
        devices: &l.devices,
        exclusive: l.exclusive,
        memory_reserved_bytes: l.memory_reserved_bytes,
        holder_pids: l.holders.iter().map(|h| h.pid).collect(),
        created_at_ms: l.created_at_ms,
    }
}

fn short(uuid: &str) -> &str {
    uuid.char_indices()
        .nth(12)
        .map_or(uuid, |(i, _)| &uuid[..i])
}

fn age(created_at_ms: u64) -> String {
    let now = orch_core::time::now_ms();
    let secs = now.saturating_sub(created_at_ms) / 1000;
    match secs {
        0..=119 => format!("{secs}s"),
        120..=7199 => format!("{}m", secs / 60),
        _ => format!("{}h", secs / 3600),
    }
}
