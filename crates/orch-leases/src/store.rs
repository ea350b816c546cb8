//! The SQLite-backed store. See the crate documentation for why SQLite and how claims stay atomic.

use crate::Holder;
use crate::sql::{exec, query_row};
use orch_core::DeviceLease;
use orch_core::time::now_ms;
use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

const SCHEMA_VERSION: i64 = 1;
/// How long a writer waits for another process's transaction before giving up.
const BUSY_TIMEOUT: Duration = Duration::from_secs(60);

/// A placement: one job holding devices.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Lease {
    pub id: String,
    pub job_name: String,
    /// Device uuids, in the order the policy ranked them.
    pub devices: Vec<String>,
    pub exclusive: bool,
    pub memory_reserved_bytes: u64,
    pub holders: Vec<Holder>,
    /// Milliseconds since the Unix epoch.
    pub created_at_ms: u64,
}

impl Lease {
    /// One [`DeviceLease`] per device, as placement sees them.
    pub fn device_leases(&self) -> impl Iterator<Item = DeviceLease> + '_ {
        self.devices.iter().map(|uuid| DeviceLease {
            job_id: self.id.clone(),
            job_name: self.job_name.clone(),
            device_uuid: uuid.clone(),
            exclusive: self.exclusive,
            memory_reserved_bytes: self.memory_reserved_bytes,
        })
    }

    fn is_alive(&self) -> bool {
        self.holders.iter().any(Holder::is_alive)
    }

    /// Process `pid` belongs to this lease's job: it or one of its ancestors is a holder, or it
    /// runs in a holder's process group or cgroup. Only such a process may claim inside it.
    pub fn contains_process(&self, pid: u32) -> bool {
        let own_cgroup = orch_core::process::cgroup_v2_of(pid);
        if let Some(own) = own_cgroup.filter(|c| c != "/")
            && self
                .holders
                .iter()
                .filter_map(|h| h.cgroup.as_deref())
                .any(|c| c.to_string_lossy().ends_with(own.as_str()))
        {
            return true;
        }
        // The process itself holding the lease proves nothing (the daemon holds every lease it
        // claimed for others): only its ancestors and its process group count.
        let Some(own) = orch_core::process::stat(pid) else {
            return false;
        };
        if self.holders.iter().any(|h| h.pgid == Some(own.pgrp)) {
            return true;
        }
        let mut next = Some(own.ppid);
        let mut steps = 0;
        while let Some(p) = next.filter(|&p| p > 1 && steps < 64) {
            let Some(stat) = orch_core::process::stat(p) else {
                break;
            };
            if self
                .holders
                .iter()
                .any(|h| h.pid == p || h.pgid == Some(stat.pgrp))
            {
                return true;
            }
            next = Some(stat.ppid);
            steps += 1;
        }
        false
    }
}

/// What a claim asks for; the devices come from the chooser.
#[derive(Debug, Clone)]
pub struct ClaimRequest {
    pub job_name: String,
    pub exclusive: bool,
    pub memory_reserved_bytes: u64,
    pub holder: Holder,
    /// The lease this claim is made inside of (a job that runs `orch run` on the devices it
    /// holds, as `srun` inside an allocation): that lease's devices are not a conflict.
    pub inside: Option<String>,
}

/// The store itself failed.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    #[error(
        "cannot open the lease store in {path}: {reason} (set ORCH_STATE_DIR to a writable folder)"
    )]
    Open { path: PathBuf, reason: String },
    #[error("the lease store failed while {op}: {reason}")]
    Db { op: &'static str, reason: String },
    #[error("no lease with id \"{0}\" (orch leases lists them)")]
    NotFound(String),
}

/// A claim failed: the chooser refused, the choice conflicts with a lease, or the store failed.
#[derive(Debug, thiserror::Error)]
pub enum ClaimError<E> {
    #[error(transparent)]
    Choose(E),
    #[error("device {device} is already held by job {job_id} ({job_name}){}", if *.exclusive { " exclusively" } else { "" })]
    Conflict {
        device: String,
        job_id: String,
        job_name: String,
        exclusive: bool,
    },
    #[error(transparent)]
    Store(#[from] LeaseError),
}

/// The state folder: `ORCH_STATE_DIR`; else, for root, `/var/lib/orch` (the machine's, shared
/// with a root `orch serve`); else `$XDG_STATE_HOME/orch` or `~/.local/state/orch`, unless that
/// folder lies on a network file system, where it becomes `/var/tmp/orch-UID`.
///
/// Why: leases describe one machine's devices, and SQLite's locking (WAL in particular) does not
/// work over NFS and its kin; a home folder shared by many machines would also mix their leases.
pub fn default_state_dir() -> PathBuf {
    let env = |name| {
        std::env::var_os(name)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    if let Some(dir) = env("ORCH_STATE_DIR") {
        return dir;
    }
    // SAFETY: getuid cannot fail.
    let uid = unsafe { libc::getuid() };
    if uid == 0 {
        return PathBuf::from("/var/lib/orch");
    }
    let home_state = env("XDG_STATE_HOME")
        .map(|d| d.join("orch"))
        .or_else(|| env("HOME").map(|h| h.join(".local/state/orch")));
    match home_state {
        Some(dir) if !on_network_fs(&dir) => dir,
        _ => fallback_state_dir(uid),
    }
}

/// Where `orch serve` listens by default: `$ORCH_STATE_DIR/orch.sock` when set;
/// `/run/orch/orch.sock` for root (the machine's daemon); `$XDG_RUNTIME_DIR/orch.sock` for a user
/// (else the state folder's). Clients look here after the machine's daemon
/// ([`crate::find_daemon`]).
pub fn default_socket() -> PathBuf {
    if let Some(dir) = std::env::var_os("ORCH_STATE_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir).join("orch.sock");
    }
    // SAFETY: getuid cannot fail.
    if unsafe { libc::getuid() } == 0 {
        return PathBuf::from("/run/orch/orch.sock");
    }
    match std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        Some(dir) => PathBuf::from(dir).join("orch.sock"),
        None => default_state_dir().join("orch.sock"),
    }
}

/// The machine-local folder used when the home folder is on a network file system.
fn fallback_state_dir(uid: u32) -> PathBuf {
    PathBuf::from(format!("/var/tmp/orch-{uid}"))
}

/// A folder in a place every user may write (`/var/tmp`) is only trusted when it is a real
/// folder of this user's that nobody else may write or read: else another user could have made
/// it first and planted leases, or a daemon's database.
fn ensure_private(dir: &Path) -> Result<(), String> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    let _ = std::fs::DirBuilder::new().mode(0o700).create(dir);
    let meta = std::fs::symlink_metadata(dir).map_err(|e| e.to_string())?;
    // SAFETY: getuid cannot fail.
    let uid = unsafe { libc::getuid() };
    if !meta.is_dir() || meta.uid() != uid || meta.mode() & 0o077 != 0 {
        return Err(format!(
            "it is not a private folder of uid {uid} (a link, another user's, or open to others); remove it, or set ORCH_STATE_DIR"
        ));
    }
    Ok(())
}

/// The nearest existing folder of `path` is on NFS, CIFS/SMB, Lustre, GPFS, CephFS, BeeGFS or
/// another file system shared between machines.
pub fn on_network_fs(path: &Path) -> bool {
    const NETWORK: [i64; 9] = [
        0x6969,      // NFS
        0xFF53_4D42, // CIFS
        0xFE53_4D42, // SMB2
        0x517B,      // SMB
        0x0BD0_0BD0, // Lustre
        0x4750_4653, // GPFS
        0x00C3_6400, // CephFS
        0x1983_0326, // BeeGFS
        0x0102_1997, // 9p
    ];
    let Some(existing) = path.ancestors().find(|p| p.exists()) else {
        return false;
    };
    let Ok(c_path) = std::ffi::CString::new(existing.as_os_str().as_encoded_bytes()) else {
        return false;
    };
    // SAFETY: statfs is plain old data, for which all zeroes is a valid value.
    let mut stat: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated path and a zeroed statfs buffer of the right type.
    if unsafe { libc::statfs(c_path.as_ptr(), &mut stat) } != 0 {
        return false;
    }
    #[allow(clippy::unnecessary_cast)]
    let kind = stat.f_type as i64;
    NETWORK.contains(&kind)
}

/// The lease store of one machine (or one user, by the state folder).
#[derive(Debug)]
pub struct LeaseStore {
    conn: Connection,
}

fn db(op: &'static str) -> impl FnOnce(rusqlite::Error) -> LeaseError {
    move |e| LeaseError::Db {
        op,
        reason: e.to_string(),
    }
}

impl LeaseStore {
    /// Opens (creating if needed) the store in [`default_state_dir`].
    pub fn open_default() -> Result<LeaseStore, LeaseError> {
        LeaseStore::open(&default_state_dir())
    }

    /// Opens (creating if needed) the store in `dir`.
    pub fn open(dir: &Path) -> Result<LeaseStore, LeaseError> {
        let open_err = |reason: String| LeaseError::Open {
            path: dir.to_path_buf(),
            reason,
        };
        // SAFETY: getuid cannot fail.
        if dir == fallback_state_dir(unsafe { libc::getuid() }) {
            ensure_private(dir).map_err(open_err)?;
        }
        std::fs::create_dir_all(dir).map_err(|e| open_err(e.to_string()))?;
        let conn =
            Connection::open(dir.join("leases.sqlite3")).map_err(|e| open_err(e.to_string()))?;
        conn.busy_timeout(BUSY_TIMEOUT)
            .map_err(|e| open_err(e.to_string()))?;
        crate::sql::use_wal(&conn, BUSY_TIMEOUT).map_err(|e| open_err(e.to_string()))?;
        conn.pragma_update(None, "synchronous", "NORMAL")
            .map_err(|e| open_err(e.to_string()))?;
        // Closing leaves the write-ahead log as it is instead of checkpointing it: that costs two
        // fsyncs, and the next writer a third to restart the log, in every short-lived process
        // (`orch run`, `import orch`: one claim, one release). SQLite's automatic checkpoint
        // (every 1000 pages, by a committing writer) keeps the log bounded; durability is the
        // log's, as before.
        conn.set_db_config(
            rusqlite::config::DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE,
            true,
        )
        .map_err(|e| open_err(e.to_string()))?;
        let mut store = LeaseStore { conn };
        store.migrate().map_err(|e| open_err(e.to_string()))?;
        Ok(store)
    }

    fn migrate(&mut self) -> Result<(), LeaseError> {
        // Most opens find the schema current: one read, no write lock (every `orch run` and every
        // job's supervisor opens the store). Versions only grow, so a current one stays current.
        let version: i64 = self
            .conn
            .pragma_query_value(None, "user_version", |row| row.get(0))
            .map_err(db("reading the schema version"))?;
        if version == SCHEMA_VERSION && marks::exists(&self.conn)? {
            return Ok(());
        }
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(db("creating the schema"))?;
        let version: i64 = tx
            .pragma_query_value(None, "user_version", |row| row.get(0))
            .map_err(db("reading the schema version"))?;
        if version > SCHEMA_VERSION {
            return Err(LeaseError::Db {
                op: "opening the store",
                reason: format!(
                    "it was written by a newer orch (schema {version}, this orch knows {SCHEMA_VERSION})"
                ),
            });
        }
        if version < SCHEMA_VERSION {
            tx.execute_batch(
                "CREATE TABLE IF NOT EXISTS leases (
                    id TEXT PRIMARY KEY,
                    job_name TEXT NOT NULL,
                    exclusive INTEGER NOT NULL,
                    memory_reserved INTEGER NOT NULL,
                    holders TEXT NOT NULL,
                    created_at_ms INTEGER NOT NULL
                 );
                 CREATE TABLE IF NOT EXISTS lease_devices (
                    lease_id TEXT NOT NULL REFERENCES leases(id) ON DELETE CASCADE,
                    rank INTEGER NOT NULL,
                    device_uuid TEXT NOT NULL,
                    PRIMARY KEY (lease_id, device_uuid)
                 );
                 CREATE INDEX IF NOT EXISTS lease_devices_by_device ON lease_devices(device_uuid);
                 PRAGMA user_version = 1;",
            )
            .map_err(db("creating the schema"))?;
        }
        // Additive: a store of schema 1 gains the marks' table and stays schema 1, so an older
        // orch, which never reads it, keeps opening the store.
        marks::create(&tx)?;
        tx.commit().map_err(db("creating the schema"))
    }

    /// The live leases, oldest first. Leases whose holders all died are deleted on the way.
    pub fn active(&mut self) -> Result<Vec<Lease>, LeaseError> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(db("reading leases"))?;
        let leases = live_leases(&tx)?;
        tx.commit().map_err(db("reading leases"))?;
        Ok(leases)
    }

    /// The live leases as placement sees them: one entry per leased device.
    pub fn active_device_leases(&mut self) -> Result<Vec<DeviceLease>, LeaseError> {
        Ok(self
            .active()?
            .iter()
            .flat_map(Lease::device_leases)
            .collect())
    }

    /// Claims devices atomically. `choose` sees every live lease (as device leases) and returns
    /// the device uuids to take, ranked; it runs inside the store's write transaction, so no other
    /// process can claim in between. The choice is checked against the leases once more before it
    /// is written: an exclusive request needs devices nobody holds, a shared one devices nobody
    /// holds exclusively.
    pub fn claim<E>(
        &mut self,
        request: &ClaimRequest,
        choose: impl FnOnce(&[DeviceLease]) -> Result<Vec<String>, E>,
    ) -> Result<Lease, ClaimError<E>> {
        self.claim_marked(request, |leases, _| choose(leases))
    }

    /// [`LeaseStore::claim`], with the devices' marks (drains, recorded health) read in the
    /// same transaction and shown to `choose` beside the leases: a drain committed before the
    /// claim is always seen by it.
    pub fn claim_marked<E>(
        &mut self,
        request: &ClaimRequest,
        choose: impl FnOnce(&[DeviceLease], &[DeviceMark]) -> Result<Vec<String>, E>,
    ) -> Result<Lease, ClaimError<E>> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(db("starting a claim"))?;
        let existing = live_leases(&tx)?;
        let device_leases: Vec<DeviceLease> = existing
            .iter()
            .filter(|l| request.inside.as_deref() != Some(l.id.as_str()))
            .flat_map(Lease::device_leases)
            .collect();
        let marks = marks::read(&tx)?;
        let devices = choose(&device_leases, &marks).map_err(ClaimError::Choose)?;
        for device in &devices {
            if let Some(other) = device_leases
                .iter()
                .find(|l| &l.device_uuid == device && (l.exclusive || request.exclusive))
            {
                return Err(ClaimError::Conflict {
                    device: device.clone(),
                    job_id: other.job_id.clone(),
                    job_name: other.job_name.clone(),
                    exclusive: other.exclusive,
                });
            }
        }
        let lease = Lease {
            id: new_id(&request.job_name),
            job_name: request.job_name.clone(),
            devices,
            exclusive: request.exclusive,
            memory_reserved_bytes: request.memory_reserved_bytes,
            holders: vec![request.holder.clone()],
            created_at_ms: now_ms(),
        };
        insert(&tx, &lease)?;
        tx.commit().map_err(db("writing the lease"))?;
        Ok(lease)
    }

    /// Adds a holder (a process the job started) to a lease: the lease lives while any holder does.
    pub fn add_holder(&mut self, id: &str, holder: Holder) -> Result<(), LeaseError> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(db("adding a holder"))?;
        let text = holders_text(&tx, id).map_err(db("adding a holder"))?;
        let mut holders =
            parse_holders(&text.ok_or_else(|| LeaseError::NotFound(id.to_string()))?)?;
        holders.push(holder);
        set_holders(&tx, id, &holders).map_err(db("adding a holder"))?;
        tx.commit().map_err(db("adding a holder"))
    }

    /// The lease with this id, live or not (its holders are not checked).
    pub fn get(&mut self, id: &str) -> Result<Option<Lease>, LeaseError> {
        let tx = self.conn.transaction().map_err(db("reading a lease"))?;
        let lease = read_all(&tx)?.into_iter().find(|l| l.id == id);
        tx.commit().map_err(db("reading a lease"))?;
        Ok(lease)
    }

    /// Gives up the hold of `watchers` (the processes that claimed and watched the job) on a
    /// lease: the lease is deleted unless another of its holders still lives (a process of the
    /// job that outlived its end). Returns true when the lease is gone.
    pub fn release_unless_held(
        &mut self,
        id: &str,
        watchers: &[Holder],
    ) -> Result<bool, LeaseError> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(db("releasing a lease"))?;
        let text = holders_text(&tx, id).map_err(db("releasing a lease"))?;
        let Some(text) = text else {
            return Ok(true);
        };
        let others: Vec<Holder> = parse_holders(&text)?
            .into_iter()
            .filter(|h| !watchers.iter().any(|w| w.same_process(h)))
            .collect();
        let gone = if others.iter().any(Holder::is_alive) {
            set_holders(&tx, id, &others).map_err(db("releasing a lease"))?;
            false
        } else {
            delete(&tx, id)?;
            true
        };
        tx.commit().map_err(db("releasing a lease"))?;
        Ok(gone)
    }

    /// Releases a lease. Returns false when it was already gone.
    pub fn release(&mut self, id: &str) -> Result<bool, LeaseError> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(db("releasing a lease"))?;
        let removed = delete(&tx, id)?;
        tx.commit().map_err(db("releasing a lease"))?;
        Ok(removed)
    }
}

fn live_leases(tx: &rusqlite::Transaction<'_>) -> Result<Vec<Lease>, LeaseError> {
    let all = read_all(tx)?;
    let mut live = Vec::with_capacity(all.len());
    for lease in all {
        if lease.is_alive() {
            live.push(lease);
        } else {
            tracing::info!(
                "reclaimed lease {} of job {} on {} device(s): its holders are gone",
                lease.id,
                lease.job_name,
                lease.devices.len()
            );
            delete(tx, &lease.id)?;
            // The job's empty cgroups go with it (removal fails, harmlessly, if not empty).
            for cgroup in lease.holders.iter().filter_map(|h| h.cgroup.as_deref()) {
                let _ = std::fs::remove_dir(cgroup);
            }
        }
    }
    Ok(live)
}

fn read_all(tx: &rusqlite::Transaction<'_>) -> Result<Vec<Lease>, LeaseError> {
    let mut stmt = tx
        .prepare_cached(
            "SELECT l.id, l.job_name, l.exclusive, l.memory_reserved, l.holders, l.created_at_ms,
                    (SELECT group_concat(device_uuid, ',') FROM
                        (SELECT device_uuid FROM lease_devices d WHERE d.lease_id = l.id ORDER BY rank))
             FROM leases l ORDER BY l.created_at_ms, l.id",
        )
        .map_err(db("reading leases"))?;
    let rows = stmt
        .query_map([], |row| {
            Ok((
                row.get::<_, String>(0)?,
                row.get::<_, String>(1)?,
                row.get::<_, bool>(2)?,
                row.get::<_, i64>(3)?,
                row.get::<_, String>(4)?,
                row.get::<_, i64>(5)?,
                row.get::<_, Option<String>>(6)?,
            ))
        })
        .map_err(db("reading leases"))?;
    let mut leases = Vec::new();
    for row in rows {
        let (id, job_name, exclusive, memory, holders, created, devices) =
            row.map_err(db("reading leases"))?;
        leases.push(Lease {
            id,
            job_name,
            devices: devices
                .map(|d| d.split(',').map(String::from).collect())
                .unwrap_or_default(),
            exclusive,
            memory_reserved_bytes: u64::try_from(memory).unwrap_or(0),
            holders: parse_holders(&holders)?,
            created_at_ms: u64::try_from(created).unwrap_or(0),
        });
    }
    Ok(leases)
}

fn insert(tx: &rusqlite::Transaction<'_>, lease: &Lease) -> Result<(), LeaseError> {
    exec(
        tx,
        "INSERT INTO leases (id, job_name, exclusive, memory_reserved, holders, created_at_ms)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        params![
            lease.id,
            lease.job_name,
            lease.exclusive,
            i64::try_from(lease.memory_reserved_bytes).unwrap_or(i64::MAX),
            holders_json(&lease.holders),
            i64::try_from(lease.created_at_ms).unwrap_or(i64::MAX),
        ],
    )
    .map_err(db("writing the lease"))?;
    for (rank, device) in lease.devices.iter().enumerate() {
        exec(
            tx,
            "INSERT INTO lease_devices (lease_id, rank, device_uuid) VALUES (?1, ?2, ?3)",
            params![lease.id, rank as i64, device],
        )
        .map_err(db("writing the lease"))?;
    }
    Ok(())
}

fn delete(tx: &rusqlite::Transaction<'_>, id: &str) -> Result<bool, LeaseError> {
    exec(tx, "DELETE FROM lease_devices WHERE lease_id = ?1", [id])
        .map_err(db("deleting a lease"))?;
    let n = exec(tx, "DELETE FROM leases WHERE id = ?1", [id]).map_err(db("deleting a lease"))?;
    Ok(n > 0)
}

/// The holders column of lease `id` (`None`: no such lease).
fn holders_text(tx: &rusqlite::Transaction<'_>, id: &str) -> rusqlite::Result<Option<String>> {
    query_row(
        tx,
        "SELECT holders FROM leases WHERE id = ?1",
        [id],
        |row| row.get(0),
    )
    .optional()
}

fn set_holders(
    tx: &rusqlite::Transaction<'_>,
    id: &str,
    holders: &[Holder],
) -> rusqlite::Result<usize> {
    exec(
        tx,
        "UPDATE leases SET holders = ?1 WHERE id = ?2",
        params![holders_json(holders), id],
    )
}

fn holders_json(holders: &[Holder]) -> String {
    serde_json::to_string(holders).unwrap_or_else(|_| "[]".to_string())
}

fn parse_holders(text: &str) -> Result<Vec<Holder>, LeaseError> {
    serde_json::from_str(text).map_err(|e| LeaseError::Db {
        op: "reading lease holders",
        reason: e.to_string(),
    })
}

/// `NAME-XXXXXXXX`: the job name (sanitised) and a short id unique across processes.
fn new_id(job_name: &str) -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let name: String = job_name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '-'
            }
        })
        .take(40)
        .collect();
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let mix = (nanos as u64)
        ^ (u64::from(std::process::id()) << 40)
        ^ u64::from(COUNTER.fetch_add(1, Ordering::Relaxed)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let short = (mix ^ (mix >> 29)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    format!("{name}-{:08x}", short >> 32)
}

mod marks;
pub use marks::{DeviceMark, MarkKind};

#[cfg(test)]
mod tests;
