//! Marks on devices, kept beside the leases: an admin's drain, and the health the daemon's
//! device watcher recorded (a GPU made unhealthy by an Xid event, which no later reading shows
//! again). Every claim reads them in its transaction ([`LeaseStore::claim_marked`]), so
//! `orch run` without a daemon honours the same drains and health as the daemon does, and a
//! drain outlives a daemon's restart.
//!
//! A mark names one device by uuid: a GPU's `GPU-…` or a MIG slice's `MIG-…`. What the uuid
//! means, and what the detail holds, is for the device model (orch-devices) to say; the store
//! keeps text.

use super::{LeaseError, LeaseStore, db};
use crate::sql::exec;
use orch_core::time::now_ms;
use rusqlite::params;
use serde::{Deserialize, Serialize};

/// What a mark says of its device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MarkKind {
    /// No new job goes there (`orch drain`).
    Drain,
    /// The daemon saw it become unhealthy; the detail is its problems as JSON.
    Unhealthy,
}

impl MarkKind {
    pub fn as_str(self) -> &'static str {
        match self {
            MarkKind::Drain => "drain",
            MarkKind::Unhealthy => "unhealthy",
        }
    }

    fn parse(text: &str) -> Option<MarkKind> {
        match text {
            "drain" => Some(MarkKind::Drain),
            "unhealthy" => Some(MarkKind::Unhealthy),
            _ => None,
        }
    }
}

/// One mark on one device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceMark {
    pub uuid: String,
    pub kind: MarkKind,
    /// A drain's reason; an unhealthy mark's problems (JSON).
    pub detail: Option<String>,
    /// Who made it (a user name), when known.
    pub by: Option<String>,
    /// Milliseconds since the Unix epoch.
    pub since_ms: u64,
}

/// The marks' table, made when missing. It is an addition to schema 1, not a new version:
/// an orch that predates it opens the store as before and never reads the table.
pub(super) fn create(tx: &rusqlite::Transaction<'_>) -> Result<(), LeaseError> {
    tx.execute_batch(
        "CREATE TABLE IF NOT EXISTS device_marks (
            device_uuid TEXT NOT NULL,
            kind TEXT NOT NULL,
            detail TEXT,
            made_by TEXT,
            since_ms INTEGER NOT NULL,
            PRIMARY KEY (device_uuid, kind)
         );",
    )
    .map_err(db("creating the schema"))
}

/// Whether the store has the marks' table (a read: most opens find it and take no write lock).
pub(super) fn exists(conn: &rusqlite::Connection) -> Result<bool, LeaseError> {
    conn.query_row(
        "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'device_marks'",
        [],
        |row| row.get::<_, i64>(0),
    )
    .map(|n| n > 0)
    .map_err(db("reading the schema"))
}

pub(super) fn read(tx: &rusqlite::Transaction<'_>) -> Result<Vec<DeviceMark>, LeaseError> {
    let mut stmt = tx
        .prepare_cached(
            "SELECT device_uuid, kind, detail, made_by, since_ms FROM device_marks
             ORDER BY since_ms, device_uuid",
        )
        .map_err(db("reading device marks"))?;
    let rows = stmt
        .query_map([], |row| {
            Ok((
                row.get::<_, String>(0)?,
                row.get::<_, String>(1)?,
                row.get::<_, Option<String>>(2)?,
                row.get::<_, Option<String>>(3)?,
                row.get::<_, i64>(4)?,
            ))
        })
        .map_err(db("reading device marks"))?;
    let mut marks = Vec::new();
    for row in rows {
        let (uuid, kind, detail, by, since) = row.map_err(db("reading device marks"))?;
        // A kind this orch does not know (written by a newer one) is left alone.
        let Some(kind) = MarkKind::parse(&kind) else {
            continue;
        };
        marks.push(DeviceMark {
            uuid,
            kind,
            detail,
            by,
            since_ms: u64::try_from(since).unwrap_or(0),
        });
    }
    Ok(marks)
}

impl LeaseStore {
    /// Every mark, oldest first.
    pub fn marks(&mut self) -> Result<Vec<DeviceMark>, LeaseError> {
        let tx = self
            .conn
            .transaction()
            .map_err(db("reading device marks"))?;
        let marks = read(&tx)?;
        tx.commit().map_err(db("reading device marks"))?;
        Ok(marks)
    }

    /// Sets a mark of `kind` on device `uuid`, replacing one of that kind; a mark already there
    /// with the same detail keeps its time. Returns the mark as stored.
    pub fn set_mark(
        &mut self,
        uuid: &str,
        kind: MarkKind,
        detail: Option<&str>,
        by: Option<&str>,
    ) -> Result<DeviceMark, LeaseError> {
        let tx = self
            .conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(db("marking a device"))?;
        let old = read(&tx)?
            .into_iter()
            .find(|m| m.uuid == uuid && m.kind == kind);
        let since_ms = match &old {
            Some(old) if old.detail.as_deref() == detail => old.since_ms,
            _ => now_ms(),
        };
        exec(
            &tx,
            "INSERT OR REPLACE INTO device_marks (device_uuid, kind, detail, made_by, since_ms)
             VALUES (?1, ?2, ?3, ?4, ?5)",
            params![
                uuid,
                kind.as_str(),
                detail,
                by,
                i64::try_from(since_ms).unwrap_or(i64::MAX)
            ],
        )
        .map_err(db("marking a device"))?;
        tx.commit().map_err(db("marking a device"))?;
        Ok(DeviceMark {
            uuid: uuid.to_string(),
            kind,
            detail: detail.map(str::to_string),
            by: by.map(str::to_string),
            since_ms,
        })
    }

    /// Removes the mark of `kind` on `uuid`; false when there was none.
    pub fn clear_mark(&mut self, uuid: &str, kind: MarkKind) -> Result<bool, LeaseError> {
        let n = exec(
            &self.conn,
            "DELETE FROM device_marks WHERE device_uuid = ?1 AND kind = ?2",
            params![uuid, kind.as_str()],
        )
        .map_err(db("clearing a device mark"))?;
        Ok(n > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_dir(tag: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "orch-marks-{tag}-{}-{}",
            std::process::id(),
            now_ms()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn marks_persist_across_opens_and_keep_their_time_when_unchanged() {
        let dir = temp_dir("persist");
        let mut store = LeaseStore::open(&dir).unwrap();
        let first = store
            .set_mark("GPU-a", MarkKind::Drain, Some("maintenance"), Some("root"))
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(5));
        let again = store
            .set_mark("GPU-a", MarkKind::Drain, Some("maintenance"), Some("root"))
            .unwrap();
        assert_eq!(first.since_ms, again.since_ms);
        store
            .set_mark("MIG-b", MarkKind::Unhealthy, Some("[]"), None)
            .unwrap();
        drop(store);
        let mut store = LeaseStore::open(&dir).unwrap();
        let marks = store.marks().unwrap();
        assert_eq!(marks.len(), 2, "{marks:?}");
        assert_eq!(marks[0].detail.as_deref(), Some("maintenance"));
        assert!(store.clear_mark("GPU-a", MarkKind::Drain).unwrap());
        assert!(!store.clear_mark("GPU-a", MarkKind::Drain).unwrap());
        assert_eq!(store.marks().unwrap().len(), 1);
    }

    fn user_version(dir: &std::path::Path) -> i64 {
        let conn = rusqlite::Connection::open(dir.join("leases.sqlite3")).unwrap();
        conn.pragma_query_value(None, "user_version", |row| row.get(0))
            .unwrap()
    }

    #[test]
    fn the_marks_table_is_added_to_a_schema_1_store_without_raising_its_version() {
        let dir = temp_dir("schema");
        // A store as an orch before marks made it: schema 1, no marks' table.
        {
            let conn = rusqlite::Connection::open(dir.join("leases.sqlite3")).unwrap();
            conn.execute_batch(
                "CREATE TABLE leases (id TEXT PRIMARY KEY, job_name TEXT NOT NULL,
                    exclusive INTEGER NOT NULL, memory_reserved INTEGER NOT NULL,
                    holders TEXT NOT NULL, created_at_ms INTEGER NOT NULL);
                 CREATE TABLE lease_devices (lease_id TEXT NOT NULL, rank INTEGER NOT NULL,
                    device_uuid TEXT NOT NULL, PRIMARY KEY (lease_id, device_uuid));
                 PRAGMA user_version = 1;",
            )
            .unwrap();
        }
        let mut store = LeaseStore::open(&dir).unwrap();
        store
            .set_mark("GPU-a", MarkKind::Drain, None, None)
            .unwrap();
        drop(store);
        // An older orch checks for schema 1 and opens it still.
        assert_eq!(user_version(&dir), 1);
        assert_eq!(LeaseStore::open(&dir).unwrap().marks().unwrap().len(), 1);
        // A store a genuinely newer orch wrote is refused, as before.
        rusqlite::Connection::open(dir.join("leases.sqlite3"))
            .unwrap()
            .execute_batch("PRAGMA user_version = 2;")
            .unwrap();
        let err = LeaseStore::open(&dir).err().unwrap().to_string();
        assert!(
            err.contains("written by a newer orch (schema 2, this orch knows 1)"),
            "{err}"
        );
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn a_claim_sees_the_marks_in_its_transaction() {
        let dir = temp_dir("claim");
        let mut store = LeaseStore::open(&dir).unwrap();
        store
            .set_mark("GPU-a", MarkKind::Drain, None, None)
            .unwrap();
        let request = crate::ClaimRequest {
            job_name: "j".into(),
            exclusive: true,
            memory_reserved_bytes: 0,
            holder: crate::Holder::current(),
            inside: None,
        };
        let lease = store
            .claim_marked(&request, |_, marks| {
                let drained: Vec<&str> = marks.iter().map(|m| m.uuid.as_str()).collect();
                assert_eq!(drained, ["GPU-a"]);
                Ok::<_, String>(vec!["GPU-b".to_string()])
            })
            .unwrap();
        assert_eq!(lease.devices, ["GPU-b"]);
    }
}
