//! Per-job accounting: what each job used, recorded once when it ends (`orch history`, the
//! `accounting` object of a job on the API, the per-job counters of `/metrics`).
//!
//! Where each figure comes from:
//! - devices, GPU-seconds (devices x the run's wall time, over all its runs), wall time, queue
//!   wait, exit code and reason: the job's row when its end is reconciled;
//! - CPU seconds, peak RSS and the signal that ended it: `usage.json` in the run's folder, written
//!   by its supervisor before `exit.json` (from the job's cgroup where orch made one, else the
//!   rusage of the processes it waited for);
//! - peak GPU memory and mean GPU utilization: the engine's looks at the device watcher's
//!   readings while the job ran ([`GpuWatch`]).
//!
//! A record lives in the `accounting` table, keyed by job id and kept for `accounting_retention`,
//! after `retention` has removed the job's row and folder. It holds no job text.

use crate::core::db::{DbError, State};
use orch_leases::sql::exec;
use rusqlite::{Connection, params};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// What a job's processes used, as its supervisor saw them end (`usage.json`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct ProcessUse {
    /// User + system CPU time of every process of the job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_seconds: Option<f64>,
    /// The most memory the job's processes held at once (the cgroup's `memory.peak`), or the
    /// largest resident set of one of them (rusage) where no cgroup counted it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_rss_bytes: Option<u64>,
    /// The signal that ended the job's (first) process, when one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
}

/// Writes `usage.json` in a run's folder (atomically, as `exit.json`).
pub fn write_use(dir: &Path, used: &ProcessUse) -> std::io::Result<()> {
    let text = serde_json::to_string(used).map_err(std::io::Error::other)?;
    orch_core::fsutil::write_atomic(&dir.join("usage.json"), text.as_bytes())
}

/// A run's `usage.json`; the empty record when there is none (a supervisor of an older orch, a
/// held lease, a job whose supervisor vanished) or it cannot be read.
pub fn read_use(dir: &Path) -> ProcessUse {
    std::fs::read_to_string(dir.join("usage.json"))
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or_default()
}

/// CPU seconds and peak resident set of the children this process waited for
/// (`getrusage(RUSAGE_CHILDREN)`): the job's processes, as a supervisor sees them after its wait.
pub fn children_use() -> ProcessUse {
    // SAFETY: getrusage writes into the struct it is given, zeroed here, and reads nothing else.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage) } != 0 {
        return ProcessUse::default();
    }
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    ProcessUse {
        cpu_seconds: Some(seconds(usage.ru_utime) + seconds(usage.ru_stime)),
        // Linux counts ru_maxrss in KiB.
        peak_rss_bytes: u64::try_from(usage.ru_maxrss).ok().map(|kib| kib * 1024),
        signal: None,
    }
}

/// The engine's looks at a running job's devices: how busy they were and how much memory the
/// job's own processes held on them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GpuWatch {
    utilization_sum: f64,
    looks: u32,
    /// The most memory the job's processes held on any one of its devices.
    peak_memory: Option<u64>,
}

impl GpuWatch {
    /// One look: each device's utilization (percent, `None` where it cannot be read) and the
    /// memory the job's processes hold on each device whose processes can be listed.
    pub fn look(&mut self, utilization: &[Option<u32>], memory: &[u64]) {
        let read: Vec<f64> = utilization
            .iter()
            .flatten()
            .map(|&u| f64::from(u))
            .collect();
        if !read.is_empty() {
            self.utilization_sum += read.iter().sum::<f64>() / read.len() as f64;
            self.looks += 1;
        }
        if let Some(&most) = memory.iter().max() {
            self.peak_memory = Some(self.peak_memory.map_or(most, |p| p.max(most)));
        }
    }

    /// The mean of the looks' utilization (percent), when any could be read.
    pub fn mean_utilization(&self) -> Option<f64> {
        (self.looks > 0).then(|| self.utilization_sum / f64::from(self.looks))
    }

    pub fn peak_memory(&self) -> Option<u64> {
        self.peak_memory
    }
}

/// One finished job's accounting record, as stored and as `orch history` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    pub job_id: i64,
    pub name: String,
    pub tenant: String,
    pub user: String,
    pub state: State,
    pub submitted_at_ms: u64,
    pub started_at_ms: Option<u64>,
    pub ended_at_ms: u64,
    /// Its runs (more than 1 after preemptions or requeues).
    pub attempt: u32,
    /// The devices of its last run (uuids).
    pub devices: Vec<String>,
    /// Device-seconds over all its runs.
    pub gpu_seconds: f64,
    /// Its last run's wall time (0 when it never started).
    pub wall_s: f64,
    /// From submission to its last start (to its end when it never started).
    pub queue_wait_s: f64,
    pub cpu_seconds: Option<f64>,
    pub peak_rss_bytes: Option<u64>,
    pub peak_gpu_memory_bytes: Option<u64>,
    /// Percent, 0-100.
    pub mean_gpu_utilization: Option<f64>,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub reason: Option<String>,
}

/// What the engine measured of a run besides the job's row.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Measured {
    pub process: ProcessUse,
    pub gpu: GpuWatch,
}

impl Record {
    /// The record of a job that ended: its row as it stands before its end is written, how it
    /// ended, and what was measured.
    pub fn of(
        row: &crate::core::db::JobRow,
        state: State,
        ended_at_ms: u64,
        exit_code: Option<i32>,
        reason: Option<String>,
        measured: &Measured,
    ) -> Record {
        let s = |from: u64, to: u64| to.saturating_sub(from) as f64 / 1000.0;
        let (wall_s, queue_wait_s) = match row.started_at_ms {
            Some(start) if row.state == State::Running => {
                (s(start, ended_at_ms), s(row.submitted_at_ms, start))
            }
            Some(start) => (0.0, s(row.submitted_at_ms, start)),
            None => (0.0, s(row.submitted_at_ms, ended_at_ms)),
        };
        Record {
            job_id: row.id,
            name: row.name.clone(),
            tenant: row.tenant.clone(),
            user: row.user.clone(),
            state,
            submitted_at_ms: row.submitted_at_ms,
            started_at_ms: row.started_at_ms,
            ended_at_ms,
            attempt: row.attempt,
            devices: row.devices.clone(),
            gpu_seconds: row.gpu_seconds,
            wall_s,
            queue_wait_s,
            cpu_seconds: measured.process.cpu_seconds,
            peak_rss_bytes: measured.process.peak_rss_bytes,
            peak_gpu_memory_bytes: measured.gpu.peak_memory(),
            mean_gpu_utilization: measured.gpu.mean_utilization(),
            exit_code,
            signal: measured.process.signal,
            reason,
        }
    }
}

fn db(op: &'static str) -> impl FnOnce(rusqlite::Error) -> DbError {
    move |e| DbError {
        op,
        code: e.sqlite_error_code(),
        reason: e.to_string(),
    }
}

/// The `accounting` table and its indexes (the schema's version 5).
pub const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS accounting (
        job_id INTEGER PRIMARY KEY, name TEXT NOT NULL, tenant TEXT NOT NULL,
        user TEXT NOT NULL, state TEXT NOT NULL, submitted_at_ms INTEGER NOT NULL,
        started_at_ms INTEGER, ended_at_ms INTEGER NOT NULL, attempt INTEGER NOT NULL,
        devices TEXT NOT NULL, gpus INTEGER NOT NULL, gpu_seconds REAL NOT NULL,
        wall_s REAL NOT NULL, queue_wait_s REAL NOT NULL, cpu_seconds REAL,
        peak_rss_bytes INTEGER, peak_gpu_memory_bytes INTEGER, mean_gpu_utilization REAL,
        exit_code INTEGER, signal INTEGER, reason TEXT
     );
     CREATE INDEX IF NOT EXISTS accounting_by_end ON accounting(ended_at_ms);
     CREATE INDEX IF NOT EXISTS accounting_by_tenant ON accounting(tenant, ended_at_ms);";

/// Records a job's accounting (a job recorded before keeps its first record: an end is
/// reconciled once).
pub fn insert(tx: &Connection, r: &Record) -> Result<(), DbError> {
    let devices = serde_json::to_string(&r.devices).unwrap_or_else(|_| "[]".into());
    exec(
        tx,
        "INSERT OR IGNORE INTO accounting (job_id, name, tenant, user, state, submitted_at_ms,
            started_at_ms, ended_at_ms, attempt, devices, gpus, gpu_seconds, wall_s, queue_wait_s,
            cpu_seconds, peak_rss_bytes, peak_gpu_memory_bytes, mean_gpu_utilization, exit_code,
            signal, reason)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18,
            ?19, ?20, ?21)",
        params![
            r.job_id,
            r.name,
            r.tenant,
            r.user,
            r.state.as_str(),
            r.submitted_at_ms as i64,
            r.started_at_ms.map(|v| v as i64),
            r.ended_at_ms as i64,
            r.attempt,
            devices,
            r.devices.len() as i64,
            r.gpu_seconds,
            r.wall_s,
            r.queue_wait_s,
            r.cpu_seconds,
            r.peak_rss_bytes.map(|v| v.min(i64::MAX as u64) as i64),
            r.peak_gpu_memory_bytes
                .map(|v| v.min(i64::MAX as u64) as i64),
            r.mean_gpu_utilization,
            r.exit_code,
            r.signal,
            r.reason,
        ],
    )
    .map_err(db("recording a job's accounting"))?;
    Ok(())
}

/// Deletes at most `limit` records of jobs that ended before `before_ms`; returns how many.
pub fn purge(tx: &Connection, before_ms: u64, limit: u32) -> Result<i64, DbError> {
    exec(
        tx,
        "DELETE FROM accounting WHERE job_id IN
            (SELECT job_id FROM accounting WHERE ended_at_ms < ?1 LIMIT ?2)",
        params![before_ms.min(i64::MAX as u64) as i64, limit],
    )
    .map(|n| n as i64)
    .map_err(db("purging old accounting"))
}

/// Which records a history asks for. `tenants`: the tenants the caller may see (`None`: all,
/// for an admin).
#[derive(Debug, Clone, Default)]
pub struct Filter {
    pub since_ms: Option<u64>,
    pub until_ms: Option<u64>,
    pub user: Option<String>,
    pub tenant: Option<String>,
    pub states: Vec<State>,
    pub tenants: Option<Vec<String>>,
}

impl Filter {
    /// The `WHERE` clause and its values.
    fn clause(&self) -> (String, Vec<rusqlite::types::Value>) {
        use rusqlite::types::Value;
        let mut terms = Vec::new();
        let mut values: Vec<Value> = Vec::new();
        let mut add = |term: &str, value: Value| {
            values.push(value);
            terms.push(term.replace('?', &format!("?{}", values.len())));
        };
        if let Some(since) = self.since_ms {
            add(
                "ended_at_ms >= ?",
                Value::Integer(since.min(i64::MAX as u64) as i64),
            );
        }
        if let Some(until) = self.until_ms {
            add(
                "ended_at_ms < ?",
                Value::Integer(until.min(i64::MAX as u64) as i64),
            );
        }
        if let Some(user) = &self.user {
            add("user = ?", Value::Text(user.clone()));
        }
        if let Some(tenant) = &self.tenant {
            add("tenant = ?", Value::Text(tenant.clone()));
        }
        if !self.states.is_empty() {
            let list: Vec<String> = self
                .states
                .iter()
                .map(|s| format!("'{}'", s.as_str()))
                .collect();
            terms.push(format!("state IN ({})", list.join(",")));
        }
        if let Some(tenants) = &self.tenants {
            let mut marks = Vec::new();
            for t in tenants {
                values.push(Value::Text(t.clone()));
                marks.push(format!("?{}", values.len()));
            }
            terms.push(format!("tenant IN ({})", marks.join(",")));
        }
        let clause = if terms.is_empty() {
            String::new()
        } else {
            format!("WHERE {}", terms.join(" AND "))
        };
        (clause, values)
    }
}

const RECORD_COLUMNS: &str = "job_id, name, tenant, user, state, submitted_at_ms, started_at_ms,
    ended_at_ms, attempt, devices, gpu_seconds, wall_s, queue_wait_s, cpu_seconds, peak_rss_bytes,
    peak_gpu_memory_bytes, mean_gpu_utilization, exit_code, signal, reason";

fn row_to_record(r: &rusqlite::Row<'_>) -> rusqlite::Result<Record> {
    let u = |v: i64| u64::try_from(v).unwrap_or(0);
    let state: String = r.get(4)?;
    Ok(Record {
        job_id: r.get(0)?,
        name: r.get(1)?,
        tenant: r.get(2)?,
        user: r.get(3)?,
        state: State::parse(&state).map_err(|e| {
            rusqlite::Error::FromSqlConversionFailure(4, rusqlite::types::Type::Text, Box::new(e))
        })?,
        submitted_at_ms: u(r.get(5)?),
        started_at_ms: r.get::<_, Option<i64>>(6)?.map(u),
        ended_at_ms: u(r.get(7)?),
        attempt: r.get(8)?,
        devices: serde_json::from_str(&r.get::<_, String>(9)?).unwrap_or_default(),
        gpu_seconds: r.get(10)?,
        wall_s: r.get(11)?,
        queue_wait_s: r.get(12)?,
        cpu_seconds: r.get(13)?,
        peak_rss_bytes: r.get::<_, Option<i64>>(14)?.map(u),
        peak_gpu_memory_bytes: r.get::<_, Option<i64>>(15)?.map(u),
        mean_gpu_utilization: r.get(16)?,
        exit_code: r.get(17)?,
        signal: r.get(18)?,
        reason: r.get(19)?,
    })
}

/// The records `filter` selects, oldest end first, at most `limit` of the newest.
pub fn records(c: &Connection, filter: &Filter, limit: u32) -> Result<Vec<Record>, DbError> {
    let (clause, values) = filter.clause();
    let mut stmt = c
        .prepare(&format!(
            "SELECT * FROM (SELECT {RECORD_COLUMNS} FROM accounting {clause}
             ORDER BY ended_at_ms DESC, job_id DESC LIMIT {limit})
             ORDER BY ended_at_ms, job_id"
        ))
        .map_err(db("reading the history"))?;
    let rows = stmt
        .query_map(rusqlite::params_from_iter(values), row_to_record)
        .map_err(db("reading the history"))?;
    rows.collect::<Result<Vec<_>, _>>()
        .map_err(db("reading the history"))
}

/// How many ids one query of [`records_of`] binds.
const IDS_PER_QUERY: usize = 500;

/// The records of the jobs numbered `ids` (for a listing of jobs): those ids alone, looked up
/// by their primary key, in queries of at most [`IDS_PER_QUERY`] ids.
pub fn records_of(c: &Connection, ids: &[i64]) -> Result<Vec<Record>, DbError> {
    let mut records = Vec::new();
    for chunk in ids.chunks(IDS_PER_QUERY) {
        let marks: Vec<String> = (1..=chunk.len()).map(|i| format!("?{i}")).collect();
        let mut stmt = c
            .prepare(&format!(
                "SELECT {RECORD_COLUMNS} FROM accounting WHERE job_id IN ({})",
                marks.join(",")
            ))
            .map_err(db("reading accounting"))?;
        let rows = stmt
            .query_map(rusqlite::params_from_iter(chunk), row_to_record)
            .map_err(db("reading accounting"))?;
        for row in rows {
            records.push(row.map_err(db("reading accounting"))?);
        }
    }
    Ok(records)
}

/// What a summary groups by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum By {
    Tenant,
    User,
}

/// One group of a summary (`orch history --by tenant`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// The tenant or user.
    pub key: String,
    pub jobs: u64,
    pub gpu_seconds: f64,
    pub gpu_hours: f64,
    /// Mean GPU utilization (percent) weighted by GPU-seconds, over the jobs whose utilization
    /// was read.
    pub mean_gpu_utilization: Option<f64>,
}

/// The records `filter` selects, summed per tenant or user.
pub fn summary(c: &Connection, filter: &Filter, by: By) -> Result<Vec<Summary>, DbError> {
    let (clause, values) = filter.clause();
    let key = match by {
        By::Tenant => "tenant",
        By::User => "user",
    };
    let mut stmt = c
        .prepare(&format!(
            "SELECT {key}, COUNT(*), TOTAL(gpu_seconds),
                TOTAL(gpu_seconds * mean_gpu_utilization),
                TOTAL(CASE WHEN mean_gpu_utilization IS NOT NULL THEN gpu_seconds END),
                COUNT(mean_gpu_utilization)
             FROM accounting {clause} GROUP BY {key} ORDER BY {key}"
        ))
        .map_err(db("summing the history"))?;
    let rows = stmt
        .query_map(rusqlite::params_from_iter(values), |r| {
            let gpu_seconds: f64 = r.get(2)?;
            let weighted: f64 = r.get(3)?;
            let weight: f64 = r.get(4)?;
            let read: i64 = r.get(5)?;
            Ok(Summary {
                key: r.get(0)?,
                jobs: u64::try_from(r.get::<_, i64>(1)?).unwrap_or(0),
                gpu_seconds,
                gpu_hours: gpu_seconds / 3600.0,
                mean_gpu_utilization: match (read, weight > 0.0) {
                    (0, _) => None,
                    (_, true) => Some(weighted / weight),
                    // Jobs read but no GPU time: nothing to weigh by.
                    (_, false) => None,
                },
            })
        })
        .map_err(db("summing the history"))?;
    rows.collect::<Result<Vec<_>, _>>()
        .map_err(db("summing the history"))
}

/// Pages one step of the background vacuum gives back to the file system: small enough that a
/// write waiting behind it waits about a millisecond.
pub const VACUUM_STEP_PAGES: u32 = 64;

/// Gives the free pages of the job database back in steps of [`VACUUM_STEP_PAGES`], each a
/// write of its own, with a pause between them so that the engine's writes go first. Returns the
/// pages freed. Bounded: at most the free pages counted at the start, plus one step. Nothing
/// (0) on a database without incremental vacuum, whose steps would free nothing.
pub fn vacuum_in_steps(
    jobs: &crate::core::db::Db,
    pause: std::time::Duration,
) -> Result<u64, DbError> {
    if !jobs.incremental_vacuum()? {
        tracing::info!(
            "the job database has no incremental vacuum (the next start turns it on): its free pages stay in the file"
        );
        return Ok(0);
    }
    let free = jobs.free_pages()?;
    let steps = free / u64::from(VACUUM_STEP_PAGES) + 1;
    let mut freed = 0;
    for _ in 0..steps {
        let before = jobs.free_pages()?;
        if before == 0 {
            break;
        }
        jobs.write_blocking(|tx| {
            // The pragma frees one page per row it steps through.
            let vacuum = || -> rusqlite::Result<()> {
                let mut stmt =
                    tx.prepare_cached(&format!("PRAGMA incremental_vacuum({VACUUM_STEP_PAGES})"))?;
                let mut rows = stmt.query([])?;
                while rows.next()?.is_some() {}
                Ok(())
            };
            vacuum().map_err(db("vacuuming the job database"))?;
            Ok(0)
        })?;
        freed += before.saturating_sub(jobs.free_pages()?);
        std::thread::sleep(pause);
    }
    Ok(freed)
}

#[cfg(test)]
mod tests;
