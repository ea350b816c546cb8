//! `orch drain DEVICE [--reason TEXT]` and `orch undrain DEVICE`: take a GPU (by index or uuid)
//! or a MIG slice (by uuid) out of service for new jobs, or put it back. Through the machine's
//! daemon when one answers (admins only); else straight into the lease store the caller's
//! `orch run` reads: root's is the machine's; any other user must name the store with
//! `ORCH_STATE_DIR`, since their own store is read by no one else.

use super::load_inventory;
use crate::cli::{DrainArgs, UndrainArgs};
use crate::client::{Client, answer_failure};
use crate::failure::{CmdResult, Failure};
use crate::table;
use hyper::{Method, StatusCode};
use orch_devices::InventorySpec;
use orch_leases::{LeaseStore, MarkKind};

pub fn drain(spec: &InventorySpec, args: &DrainArgs) -> CmdResult {
    let reason = orch_devices::health::drain_reason(args.reason.as_deref())
        .map_err(|e| Failure::bad_input_msg(format!("--reason: {e}; give it as one short line")))?;
    if let Some(client) = daemon()? {
        let body = serde_json::json!({ "reason": reason });
        let answer = ask(&client, "drain", &args.device, Some(body.to_string()))?;
        println!("drained {}{}", named(&answer), said_reason(args));
        return Ok(());
    }
    local_store_is_meant("drain")?;
    let (uuid, index) = find(spec, &args.device)?;
    let by = Some(me().name);
    open_store()?
        .set_mark(&uuid, MarkKind::Drain, reason.as_deref(), by.as_deref())
        .map_err(Failure::failed)?;
    println!("drained GPU {index} ({uuid}){}", said_reason(args));
    Ok(())
}

pub fn undrain(spec: &InventorySpec, args: &UndrainArgs) -> CmdResult {
    if let Some(client) = daemon()? {
        let answer = ask(&client, "undrain", &args.device, None)?;
        println!("undrained {}: it takes new jobs", named(&answer));
        return Ok(());
    }
    local_store_is_meant("undrain")?;
    let (uuid, index) = find(spec, &args.device)?;
    let mut store = open_store()?;
    store
        .clear_mark(&uuid, MarkKind::Drain)
        .and_then(|_| store.clear_mark(&uuid, MarkKind::Unhealthy))
        .map_err(Failure::failed)?;
    println!("undrained GPU {index} ({uuid}): it takes new jobs");
    Ok(())
}

/// The daemon a client talks to (`ORCH_SERVER`, the state folder's, the machine's, the user's own), when one answers: it keeps the drain in its lease store and acts on it at once.
fn daemon() -> Result<Option<Client>, Failure> {
    let found = orch_leases::find_daemon();
    if orch_leases::answers(&found.path) {
        return Client::at(found.path).map(Some);
    }
    Ok(None)
}

fn ask(
    client: &Client,
    action: &str,
    device: &str,
    body: Option<String>,
) -> Result<serde_json::Value, Failure> {
    let path = format!("/v1/devices/{}/{action}", encode(device));
    let (status, answer) = client.call(Method::POST, &path, body.map(String::into_bytes))?;
    if status != StatusCode::OK {
        return Err(answer_failure(status, &answer));
    }
    serde_json::from_slice(&answer).map_err(Failure::failed)
}

/// `GPU 1 (GPU-…)` from the daemon's answer.
fn named(answer: &serde_json::Value) -> String {
    format!(
        "GPU {} ({})",
        answer["index"],
        table::escape(answer["uuid"].as_str().unwrap_or("?"))
    )
}

fn said_reason(args: &DrainArgs) -> String {
    let reason = args
        .reason
        .as_deref()
        .map_or(String::new(), |r| format!(" ({})", table::escape(r)));
    format!("{reason}: running jobs finish; no new job is placed there until orch undrain")
}

fn find(spec: &InventorySpec, device: &str) -> Result<(String, u32), Failure> {
    let inventory = load_inventory(spec)?;
    orch_devices::health::find_device(&inventory.devices, device).map_err(Failure::bad_input_msg)
}

/// Without a daemon the marks go to the lease store this process opens: root's is the
/// machine's (`/var/lib/orch`), which a root daemon and root's `orch run` read; another user's is
/// that user's own, which no one else reads. A user who is not root must name the store
/// (`ORCH_STATE_DIR`) to show it is the one meant.
fn local_store_is_meant(action: &str) -> Result<(), Failure> {
    let me = me();
    let named = std::env::var_os("ORCH_STATE_DIR").is_some_and(|d| !d.is_empty());
    if me.uid == 0 || named {
        return Ok(());
    }
    let user = me.name;
    Err(Failure::failed_msg(format!(
        "no daemon answers, and orch {action} as {user} would only mark {user}'s own lease store ({}), which no other user's jobs read: run it as root (the machine's store), through the machine's daemon, or set ORCH_STATE_DIR to the store you mean",
        orch_leases::default_state_dir().display()
    )))
}

/// Who runs this `orch` (by uid: `$USER` may be another's under sudo).
fn me() -> orch_serve::core::users::Identity {
    // SAFETY: getgid cannot fail.
    let gid = unsafe { libc::getgid() };
    orch_serve::core::users::Identity::of_uid(orch_serve::core::users::current_uid(), gid)
}

fn open_store() -> Result<LeaseStore, Failure> {
    LeaseStore::open_default().map_err(Failure::failed)
}

/// A device name in a URL path: uuids and indices are letters, digits and dashes; anything
/// else is percent-encoded.
fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}
