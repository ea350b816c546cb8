//! The daemon's durable state: one SQLite file (WAL) with a row per job. Every state change is
//! committed (and fsynced, `synchronous = FULL`) before the daemon answers or acts on it.
//!
//! Design decision: one writer thread owns the write connection and commits whatever writes are
//! waiting in one transaction (group commit): 32 clients submitting at once cost one fsync, not
//! 32, so durability does not cap throughput. Reads use a connection of their own; WAL lets them
//! run beside the writer.

use orch_core::time::now_ms;
use orch_leases::sql::{exec, query_row};
use rusqlite::{Connection, OptionalExtension, params};
use serde::{Deserialize, Serialize};
use std::path::Path;
use std::sync::{Mutex, mpsc};

/// A job's state (docs/SERVE.md: `queued -> running -> succeeded | failed | cancelled`, and `lost`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    Queued,
    Running,
    Succeeded,
    Failed,
    Cancelled,
    Lost,
}

impl State {
    /// Every state, in the order a job can pass through them.
    pub const ALL: [State; 6] = [
        State::Queued,
        State::Running,
        State::Succeeded,
        State::Failed,
        State::Cancelled,
        State::Lost,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            State::Queued => "queued",
            State::Running => "running",
            State::Succeeded => "succeeded",
            State::Failed => "failed",
            State::Cancelled => "cancelled",
            State::Lost => "lost",
        }
    }

    /// A state as the database stores it; any other word is an error (a database written by a
    /// newer orch, or damaged), never taken for one of these.
    pub fn parse(text: &str) -> Result<State, UnknownState> {
        Ok(match text {
            "queued" => State::Queued,
            "running" => State::Running,
            "succeeded" => State::Succeeded,
            "failed" => State::Failed,
            "cancelled" => State::Cancelled,
            "lost" => State::Lost,
            _ => return Err(UnknownState(text.to_string())),
        })
    }

    pub fn is_final(self) -> bool {
        !matches!(self, State::Queued | State::Running)
    }
}

/// A state column that names no [`State`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the job database has a job in state \"{0}\", which this orch does not know")]
pub struct UnknownState(pub String);

/// Column `column` of a row read as a [`State`].
fn state_at(r: &rusqlite::Row<'_>, column: usize) -> rusqlite::Result<State> {
    State::parse(&r.get::<_, String>(column)?).map_err(|e| {
        rusqlite::Error::FromSqlConversionFailure(column, rusqlite::types::Type::Text, Box::new(e))
    })
}

/// What a client sent: everything needed to start the job later, as the client would have.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Submission {
    pub job_text: String,
    pub job_path: String,
    pub cwd: String,
    pub env: Vec<(String, String)>,
    pub identity: crate::core::users::Identity,
    /// The hash of the job's file policy as submitted (`STATE/plugins/HASH.wasm`).
    #[serde(default)]
    pub policy_file: Option<String>,
    /// For a lease held by the client's own process (`POST /v1/leases`): that process. Nothing
    /// is started for such a job; it runs while the process lives or until it releases the lease.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<orch_leases::Holder>,
    /// For a held lease taken by `orch alloc`: an interactive allocation, with its limits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alloc: Option<Alloc>,
    /// A task of a job array: the index of the `[sweep]` combination this job runs
    /// ([`orch_core::JobSpec::sweep_task`] of `job_text`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sweep_task: Option<u32>,
}

impl Submission {
    /// The job this submission runs: its file's text parsed, and for an array's task, that
    /// task's combination of the `[sweep]`.
    pub fn spec(&self) -> Result<orch_core::JobSpec, String> {
        let spec = orch_core::job::parse(Path::new(&self.job_path), &self.job_text)
            .map_err(|e| e.to_string())?;
        match self.sweep_task {
            None => Ok(spec),
            Some(task) => {
                let tasks = spec.sweep.len();
                spec.sweep_task(task as usize).ok_or_else(|| {
                    format!(
                        "{}: task {task} of a sweep of {tasks} task(s) (the job file's text changed?)",
                        self.job_path
                    )
                })
            }
        }
    }
}

/// What the daemon knows of an interactive allocation (`orch alloc`) besides its job file (whose
/// `max_runtime` is its `--time`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Alloc {
    /// `--idle`: it is released once all its GPUs have stayed idle this long.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_ms: Option<u64>,
}

/// A job's row in the database (the API shows it as [`crate::http::wire::Job`]).
#[derive(Debug, Clone, PartialEq)]
pub struct JobRow {
    pub id: i64,
    pub name: String,
    pub tenant: String,
    pub user: String,
    pub uid: u32,
    pub state: State,
    pub gpus: u32,
    pub priority: i64,
    pub requeue: bool,
    pub submitted_at_ms: u64,
    pub started_at_ms: Option<u64>,
    pub ended_at_ms: Option<u64>,
    pub exit_code: Option<i32>,
    /// Why it is in its state: waiting for what, how it ended.
    pub reason: Option<String>,
    pub lease_id: Option<String>,
    /// Device uuids, while running and after.
    pub devices: Vec<String>,
    /// 1 for the first run, more after requeues.
    pub attempt: u32,
    /// A cancel was asked for and committed; the job is being stopped.
    pub cancel_requested: bool,
    /// Device-seconds it used, over all its runs (recorded every sampling period while it runs).
    pub gpu_seconds: f64,
    /// Its use is counted in its tenant's usage up to here (while it runs).
    pub charged_ms: Option<u64>,
    /// A lease held by a process of its user (`orch run` or `import orch` through the daemon):
    /// the work runs in that process, not under a supervisor of the daemon's.
    pub interactive: bool,
    /// An interactive allocation (`orch alloc`): a held lease whose process is a user's shell or
    /// command, released at its idle limit or time limit.
    pub alloc: bool,
    /// An allocation's idle limit (`--idle`).
    pub idle_limit_ms: Option<u64>,
    /// A task of a job array (`[sweep]`): the array, task and bound it belongs to.
    pub array: Option<ArrayTask>,
}

/// Where a job stands in its job array: the array's id (its first task's job id), the task's
/// index (from 0), and `[sweep] max_parallel`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArrayTask {
    pub id: i64,
    pub task: u32,
    pub max_parallel: Option<u32>,
}

impl JobRow {
    /// A job just submitted at `submitted_at_ms`, before the insert gives it an id: queued, on
    /// its first attempt, nothing run or charged. Callers fill in who and what with
    /// `JobRow { name, tenant, .., ..JobRow::queued(at) }`.
    pub fn queued(submitted_at_ms: u64) -> JobRow {
        JobRow {
            id: 0,
            name: String::new(),
            tenant: String::new(),
            user: String::new(),
            uid: 0,
            state: State::Queued,
            gpus: 0,
            priority: 0,
            requeue: false,
            submitted_at_ms,
            started_at_ms: None,
            ended_at_ms: None,
            exit_code: None,
            reason: None,
            lease_id: None,
            devices: Vec::new(),
            attempt: 0,
            cancel_requested: false,
            gpu_seconds: 0.0,
            charged_ms: None,
            interactive: false,
            alloc: false,
            idle_limit_ms: None,
            array: None,
        }
    }
}

/// Something that happened to a job: queued, started, adopted after a restart, an idle warning,
/// preempted, a stop asked for, finished.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    pub at_ms: u64,
    /// `queued`, `started`, `adopted`, `idle`, `preempted`, `stopping`, `finished`, `lost`.
    pub kind: String,
    pub message: String,
}

impl Event {
    pub fn now(kind: &str, message: impl Into<String>) -> Event {
        Event {
            at_ms: now_ms(),
            kind: kind.to_string(),
            message: message.into(),
        }
    }
}

/// Records an event of job `id`.
pub fn add_event(tx: &rusqlite::Transaction<'_>, id: i64, event: &Event) -> Result<i64, DbError> {
    exec(
        tx,
        "INSERT INTO events (job_id, at_ms, kind, message) VALUES (?1, ?2, ?3, ?4)",
        params![id, event.at_ms as i64, event.kind, event.message],
    )
    .map_err(db("recording an event"))?;
    Ok(0)
}

#[derive(Debug, thiserror::Error)]
#[error("the job database failed while {op}: {reason}")]
pub struct DbError {
    pub op: &'static str,
    pub reason: String,
    /// SQLite's error code, when SQLite failed (a full or read-only disk is told from it).
    pub code: Option<rusqlite::ErrorCode>,
}

impl DbError {
    /// The state folder's fault behind this error (a full or read-only disk), if it is one.
    pub fn fault(&self) -> Option<crate::core::health::Fault> {
        crate::core::health::fault_of_sqlite(self.code)
    }
}

fn writer_gone() -> DbError {
    DbError {
        op: "writing",
        reason: "the writer thread is gone".into(),
        code: None,
    }
}

fn db(op: &'static str) -> impl FnOnce(rusqlite::Error) -> DbError {
    move |e| DbError {
        op,
        code: e.sqlite_error_code(),
        reason: e.to_string(),
    }
}

type WriteFn = Box<dyn FnOnce(&rusqlite::Transaction<'_>) -> Result<i64, DbError> + Send>;

struct WriteRequest {
    op: WriteFn,
    reply: tokio::sync::oneshot::Sender<Result<i64, DbError>>,
}

/// What the writer thread is asked.
enum Request {
    Write(WriteRequest),
    /// The last request ([`Db::stop`]): checkpoint, answer `(busy, log pages)`, end.
    Stop(mpsc::Sender<Result<(i64, i64), DbError>>),
}

/// The job database.
pub struct Db {
    writer: mpsc::Sender<Request>,
    reader: Mutex<Connection>,
}

impl std::fmt::Debug for Db {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Db").finish_non_exhaustive()
    }
}

const COLUMNS: &str =
    "id, name, tenant, user, uid, state, gpus, priority, requeue, submitted_at_ms,
    started_at_ms, ended_at_ms, exit_code, reason, lease_id, devices, attempt, cancel_requested,
    gpu_seconds, charged_ms, json_extract(submission, '$.holder') IS NOT NULL,
    json_extract(submission, '$.alloc') IS NOT NULL, json_extract(submission, '$.alloc.idle_ms'),
    array_id, array_task, array_max_parallel";

impl Db {
    pub fn open(dir: &Path) -> Result<Db, DbError> {
        let path = dir.join("jobs.sqlite3");
        let open = |_: ()| -> Result<Connection, DbError> {
            let conn = Connection::open(&path).map_err(db("opening"))?;
            let patience = std::time::Duration::from_secs(30);
            conn.busy_timeout(patience).map_err(db("opening"))?;
            orch_leases::sql::use_wal(&conn, patience).map_err(db("opening"))?;
            conn.pragma_update(None, "synchronous", "FULL")
                .map_err(db("opening"))?;
            // Room for every statement the writer and the readers repeat (see `exec`).
            conn.set_prepared_statement_cache_capacity(64);
            Ok(conn)
        };
        let writer_conn = open(())?;
        // A new database gives pages back in steps (`accounting::vacuum_in_steps`); this only
        // takes on a file with no tables yet (an older one is rewritten by `incremental_vacuum`).
        writer_conn
            .pragma_update(None, "auto_vacuum", "INCREMENTAL")
            .map_err(db("opening"))?;
        writer_conn
            .execute_batch(
                "CREATE TABLE IF NOT EXISTS jobs (
                    id INTEGER PRIMARY KEY AUTOINCREMENT,
                    name TEXT NOT NULL, tenant TEXT NOT NULL, user TEXT NOT NULL,
                    uid INTEGER NOT NULL, state TEXT NOT NULL, gpus INTEGER NOT NULL,
                    priority INTEGER NOT NULL, requeue INTEGER NOT NULL,
                    submitted_at_ms INTEGER NOT NULL, started_at_ms INTEGER,
                    ended_at_ms INTEGER, exit_code INTEGER, reason TEXT, lease_id TEXT,
                    devices TEXT NOT NULL DEFAULT '[]', attempt INTEGER NOT NULL DEFAULT 0,
                    supervisor TEXT, submission TEXT NOT NULL, submit_key TEXT,
                    cancel_requested INTEGER NOT NULL DEFAULT 0
                 );
                 CREATE INDEX IF NOT EXISTS jobs_by_state ON jobs(state);
                 CREATE INDEX IF NOT EXISTS jobs_by_tenant_state ON jobs(tenant, state);
                 CREATE UNIQUE INDEX IF NOT EXISTS jobs_by_key ON jobs(submit_key)
                    WHERE submit_key IS NOT NULL;",
            )
            .map_err(db("creating the schema"))?;
        migrate(&writer_conn)?;
        let reader = open(())?;
        let (writer, requests) = mpsc::channel::<Request>();
        std::thread::Builder::new()
            .name("orch-db-writer".into())
            .spawn(move || write_loop(writer_conn, requests))
            .map_err(|e| DbError {
                op: "starting the writer",
                reason: e.to_string(),
                code: None,
            })?;
        Ok(Db {
            writer,
            reader: Mutex::new(reader),
        })
    }

    /// Makes the next job's id higher than `highest` (the highest id among the job folders), if
    /// it is not already: a database restored from a backup, or one that lost its `-wal`, never
    /// hands out an id whose folder (logs, exit record, fence) belongs to an earlier job. Returns
    /// the highest id the database knew of when it was behind.
    pub fn number_above(&self, highest: i64) -> Result<Option<i64>, DbError> {
        let behind = self.write_blocking(move |tx| {
            let known: i64 = query_row(
                tx,
                "SELECT MAX(COALESCE((SELECT seq FROM sqlite_sequence WHERE name = 'jobs'), 0),
                            COALESCE((SELECT MAX(id) FROM jobs), 0))",
                [],
                |r| r.get(0),
            )
            .map_err(db("numbering jobs"))?;
            if known >= highest {
                return Ok(-1);
            }
            // `jobs` is AUTOINCREMENT: its next id is one above its row in sqlite_sequence,
            // which exists once a job was ever inserted.
            let updated = exec(
                tx,
                "UPDATE sqlite_sequence SET seq = ?1 WHERE name = 'jobs'",
                [highest],
            )
            .map_err(db("numbering jobs"))?;
            if updated == 0 {
                exec(
                    tx,
                    "INSERT INTO sqlite_sequence (name, seq) VALUES ('jobs', ?1)",
                    [highest],
                )
                .map_err(db("numbering jobs"))?;
            }
            Ok(known)
        })?;
        Ok((behind >= 0).then_some(behind))
    }

    /// The clean stop's last write: the writer thread commits what was queued before this, moves
    /// everything the write-ahead log holds into `jobs.sqlite3`, empties the log
    /// (`wal_checkpoint(TRUNCATE)`) and ends, so that the file alone holds every job. A write
    /// asked for later fails ("the writer thread is gone") and changes nothing. The result is
    /// logged; a checkpoint that cannot finish (a reader in the way for 30 s) says so.
    pub fn stop(&self) {
        let (reply, answer) = mpsc::channel();
        let done = self
            .writer
            .send(Request::Stop(reply))
            .map_err(|_| writer_gone())
            .and_then(|()| answer.recv().map_err(|_| writer_gone())?);
        match done {
            Ok((0, pages)) => tracing::info!(
                "the job database's write-ahead log went into jobs.sqlite3 ({pages} page(s)); jobs.sqlite3 alone holds every job"
            ),
            Ok((_, pages)) => tracing::warn!(
                "the job database's write-ahead log could not be emptied at stop ({pages} page(s) left in jobs.sqlite3-wal): copy it with jobs.sqlite3"
            ),
            Err(e) => tracing::warn!("{e}"),
        }
    }

    /// Runs `op` in a committed transaction (batched with other writes waiting at the time).
    pub async fn write(
        &self,
        op: impl FnOnce(&rusqlite::Transaction<'_>) -> Result<i64, DbError> + Send + 'static,
    ) -> Result<i64, DbError> {
        self.queue(Box::new(op))?.await.map_err(|_| writer_gone())?
    }

    /// [`Db::write`] of an `op` that answers more than a count: its value once committed.
    pub async fn write_value<T: Send + 'static>(
        &self,
        op: impl FnOnce(&rusqlite::Transaction<'_>) -> Result<T, DbError> + Send + 'static,
    ) -> Result<T, DbError> {
        let (value, answer) = tokio::sync::oneshot::channel();
        self.write(move |tx| {
            // Its receiver waits below, unless the caller went away: then nobody needs it.
            let _ = value.send(op(tx)?);
            Ok(0)
        })
        .await?;
        answer.await.map_err(|_| writer_gone())
    }

    /// The same, from a thread outside the async runtime.
    pub fn write_blocking(
        &self,
        op: impl FnOnce(&rusqlite::Transaction<'_>) -> Result<i64, DbError> + Send + 'static,
    ) -> Result<i64, DbError> {
        self.queue(Box::new(op))?
            .blocking_recv()
            .map_err(|_| writer_gone())?
    }

    /// Hands `op` to the writer thread; the answer comes on the returned channel.
    fn queue(
        &self,
        op: WriteFn,
    ) -> Result<tokio::sync::oneshot::Receiver<Result<i64, DbError>>, DbError> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        self.writer
            .send(Request::Write(WriteRequest { op, reply }))
            .map_err(|_| writer_gone())?;
        Ok(answer)
    }

    fn read<T>(&self, f: impl FnOnce(&Connection) -> Result<T, DbError>) -> Result<T, DbError> {
        let conn = orch_core::sync::lock(&self.reader);
        f(&conn)
    }

    pub fn job(&self, id: i64) -> Result<Option<JobRow>, DbError> {
        self.read(|c| {
            query_row(
                c,
                &format!("SELECT {COLUMNS} FROM jobs WHERE id = ?1"),
                [id],
                row_to_job,
            )
            .optional()
            .map_err(db("reading a job"))
        })
    }

    /// Jobs in the given states (all when empty), oldest first, at most `limit` of the newest.
    pub fn jobs(&self, states: &[State], limit: u32) -> Result<Vec<JobRow>, DbError> {
        self.read(|c| {
            let filter = if states.is_empty() {
                String::new()
            } else {
                let list: Vec<String> =
                    states.iter().map(|s| format!("'{}'", s.as_str())).collect();
                format!("WHERE state IN ({})", list.join(","))
            };
            let mut stmt = c
                .prepare_cached(&format!(
                    "SELECT * FROM (SELECT {COLUMNS} FROM jobs {filter} ORDER BY id DESC LIMIT ?1) ORDER BY id"
                ))
                .map_err(db("listing jobs"))?;
            let rows = stmt
                .query_map([limit], row_to_job)
                .map_err(db("listing jobs"))?;
            rows.collect::<Result<Vec<_>, _>>().map_err(db("listing jobs"))
        })
    }

    /// What job `id` waits for, as recorded at its submission.
    pub fn dependencies(&self, id: i64) -> Result<orch_core::job::Dependencies, DbError> {
        self.read(|c| {
            let mut stmt = c
                .prepare_cached(
                    "SELECT kind, on_id FROM dependencies WHERE job_id = ?1 ORDER BY rowid",
                )
                .map_err(db("reading a job's dependencies"))?;
            let rows = stmt
                .query_map([id], |r| {
                    Ok((r.get::<_, String>(0)?, r.get::<_, Option<i64>>(1)?))
                })
                .map_err(db("reading a job's dependencies"))?;
            let mut depends = orch_core::job::Dependencies::default();
            for row in rows {
                let (kind, on) = row.map_err(db("reading a job's dependencies"))?;
                match (kind.as_str(), on) {
                    ("after_ok", Some(on)) => depends.after_ok.push(on),
                    ("after_any", Some(on)) => depends.after_any.push(on),
                    ("after_failed", Some(on)) => depends.after_failed.push(on),
                    ("singleton", _) => depends.singleton = true,
                    _ => {
                        return Err(DbError {
                            op: "reading a job's dependencies",
                            reason: format!("job {id} has a dependency of unknown kind \"{kind}\""),
                            code: None,
                        });
                    }
                }
            }
            Ok(depends)
        })
    }

    /// A job's events, oldest first.
    pub fn events(&self, id: i64) -> Result<Vec<Event>, DbError> {
        self.read(|c| {
            let mut stmt = c
                .prepare_cached(
                    "SELECT at_ms, kind, message FROM events WHERE job_id = ?1 ORDER BY rowid",
                )
                .map_err(db("reading events"))?;
            let rows = stmt
                .query_map([id], |r| {
                    Ok(Event {
                        at_ms: u64::try_from(r.get::<_, i64>(0)?).unwrap_or(0),
                        kind: r.get(1)?,
                        message: r.get(2)?,
                    })
                })
                .map_err(db("reading events"))?;
            rows.collect::<Result<Vec<_>, _>>()
                .map_err(db("reading events"))
        })
    }

    /// Jobs per (state, tenant), for the metrics.
    pub fn counts(&self) -> Result<Vec<(State, String, u64)>, DbError> {
        self.read(|c| {
            let mut stmt = c
                .prepare_cached("SELECT state, tenant, COUNT(*) FROM jobs GROUP BY state, tenant")
                .map_err(db("counting jobs"))?;
            let rows = stmt
                .query_map([], |r| {
                    Ok((
                        state_at(r, 0)?,
                        r.get::<_, String>(1)?,
                        u64::try_from(r.get::<_, i64>(2)?).unwrap_or(0),
                    ))
                })
                .map_err(db("counting jobs"))?;
            rows.collect::<Result<Vec<_>, _>>()
                .map_err(db("counting jobs"))
        })
    }

    /// Running jobs held by a process of their user (`orch run`, `import orch`), per tenant.
    pub fn interactive_counts(&self) -> Result<Vec<(String, u64)>, DbError> {
        self.running_with("$.holder", "counting interactive jobs")
    }

    /// Running interactive allocations (`orch alloc`), per tenant.
    pub fn alloc_counts(&self) -> Result<Vec<(String, u64)>, DbError> {
        self.running_with("$.alloc", "counting allocations")
    }

    /// Running jobs whose submission has `key` (a JSON path), per tenant.
    fn running_with(&self, key: &str, op: &'static str) -> Result<Vec<(String, u64)>, DbError> {
        self.read(|c| {
            let mut stmt = c
                .prepare_cached(
                    "SELECT tenant, COUNT(*) FROM jobs WHERE state = 'running'
                     AND json_extract(submission, ?1) IS NOT NULL GROUP BY tenant",
                )
                .map_err(db(op))?;
            let rows = stmt
                .query_map([key], |r| {
                    Ok((
                        r.get::<_, String>(0)?,
                        u64::try_from(r.get::<_, i64>(1)?).unwrap_or(0),
                    ))
                })
                .map_err(db(op))?;
            rows.collect::<Result<Vec<_>, _>>().map_err(db(op))
        })
    }

    /// The tasks of job array `array` (its first task's id), by task index.
    pub fn array_tasks(&self, array: i64) -> Result<Vec<JobRow>, DbError> {
        self.read(|c| {
            let mut stmt = c
                .prepare_cached(&format!(
                    "SELECT {COLUMNS} FROM jobs WHERE array_id = ?1 ORDER BY array_task"
                ))
                .map_err(db("reading a job array"))?;
            let rows = stmt
                .query_map([array], row_to_job)
                .map_err(db("reading a job array"))?;
            rows.collect::<Result<Vec<_>, _>>()
                .map_err(db("reading a job array"))
        })
    }

    /// Task `task` of job array `array`, if there is one.
    pub fn array_task(&self, array: i64, task: u32) -> Result<Option<JobRow>, DbError> {
        self.read(|c| {
            query_row(
                c,
                &format!("SELECT {COLUMNS} FROM jobs WHERE array_id = ?1 AND array_task = ?2"),
                params![array, task],
                row_to_job,
            )
            .optional()
            .map_err(db("reading a job"))
        })
    }

    /// Every tenant's recorded usage.
    pub fn usage(&self) -> Result<Vec<UsageRow>, DbError> {
        self.read(|c| {
            let mut stmt = c
                .prepare_cached("SELECT tenant, gpu_seconds, as_of_ms FROM usage")
                .map_err(db("reading usage"))?;
            let rows = stmt
                .query_map([], |r| {
                    Ok(UsageRow {
                        tenant: r.get(0)?,
                        gpu_seconds: r.get(1)?,
                        as_of_ms: u64::try_from(r.get::<_, i64>(2)?).unwrap_or(0),
                    })
                })
                .map_err(db("reading usage"))?;
            rows.collect::<Result<Vec<_>, _>>()
                .map_err(db("reading usage"))
        })
    }

    /// A job's submission and recorded supervisor.
    pub fn submission(&self, id: i64) -> Result<Option<(Submission, Option<String>)>, DbError> {
        self.read(|c| {
            let row: Option<(String, Option<String>)> = query_row(
                c,
                "SELECT submission, supervisor FROM jobs WHERE id = ?1",
                [id],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()
            .map_err(db("reading a submission"))?;
            row.map(|(text, sup)| {
                serde_json::from_str(&text)
                    .map(|s| (s, sup))
                    .map_err(|e| DbError {
                        op: "reading a submission",
                        reason: e.to_string(),
                        code: None,
                    })
            })
            .transpose()
        })
    }
}

fn write_loop(mut conn: Connection, requests: mpsc::Receiver<Request>) {
    let mut stop = None;
    while stop.is_none() {
        let Ok(first) = requests.recv() else {
            return;
        };
        let mut batch = Vec::new();
        let mut next = Some(first);
        while let Some(request) = next.take() {
            match request {
                Request::Write(write) => batch.push(write),
                Request::Stop(reply) => {
                    stop = Some(reply);
                    break;
                }
            }
            if batch.len() < 512 {
                next = requests.try_recv().ok();
            }
        }
        if !batch.is_empty() {
            commit(&mut conn, batch);
        }
    }
    let checkpointed = query_row(&conn, "PRAGMA wal_checkpoint(TRUNCATE)", [], |r| {
        Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?))
    })
    .map_err(db("checkpointing"));
    if let Some(reply) = stop {
        let _ = reply.send(checkpointed);
    }
    // `requests` goes here: every write asked for from now on fails.
}

/// Commits one batch of writes, each in a savepoint of its own, and answers each.
fn commit(conn: &mut Connection, batch: Vec<WriteRequest>) {
    let tx = match conn.transaction() {
        Ok(tx) => tx,
        Err(e) => {
            let code = e.sqlite_error_code();
            for request in batch {
                let _ = request.reply.send(Err(DbError {
                    op: "starting a write",
                    reason: e.to_string(),
                    code,
                }));
            }
            return;
        }
    };
    let mut results = Vec::with_capacity(batch.len());
    let mut replies = Vec::with_capacity(batch.len());
    // A savepoint that could not be ended leaves the transaction in a state nobody can vouch
    // for (a failed write's changes may still be in it): the whole batch is rolled back and
    // every request of it fails.
    let mut broken: Option<DbError> = None;
    for request in batch {
        replies.push(request.reply);
        if broken.is_some() {
            continue;
        }
        // Each write in a savepoint of its own: one failing write does not undo the others.
        // A savepoint that cannot be made fails its request, never silently.
        // One name serves all: each savepoint is released before the next is made.
        if let Err(e) = exec(&tx, "SAVEPOINT w", []) {
            results.push(Err(db("starting a write")(e)));
            continue;
        }
        let result = (request.op)(&tx);
        let ended = if result.is_ok() {
            exec(&tx, "RELEASE w", [])
        } else {
            exec(&tx, "ROLLBACK TO w", []).and_then(|_| exec(&tx, "RELEASE w", []))
        };
        if let Err(e) = ended {
            broken = Some(db("ending a write")(e));
        }
        results.push(result);
    }
    let committed = match broken {
        Some(e) => {
            drop(tx);
            Err(e)
        }
        None => tx.commit().map_err(db("committing")),
    };
    for (reply, result) in replies.into_iter().zip(
        results
            .into_iter()
            .map(Some)
            .chain(std::iter::repeat_with(|| None)),
    ) {
        let _ = reply.send(match &committed {
            Ok(()) => result.unwrap_or_else(|| Err(writer_gone())),
            Err(e) => Err(DbError {
                op: e.op,
                reason: e.reason.clone(),
                code: e.code,
            }),
        });
    }
}

fn row_to_job(r: &rusqlite::Row<'_>) -> rusqlite::Result<JobRow> {
    let opt_u64 = |v: Option<i64>| v.map(|v| u64::try_from(v).unwrap_or(0));
    Ok(JobRow {
        id: r.get(0)?,
        name: r.get(1)?,
        tenant: r.get(2)?,
        user: r.get(3)?,
        uid: r.get(4)?,
        state: state_at(r, 5)?,
        gpus: r.get(6)?,
        priority: r.get(7)?,
        requeue: r.get(8)?,
        submitted_at_ms: u64::try_from(r.get::<_, i64>(9)?).unwrap_or(0),
        started_at_ms: opt_u64(r.get(10)?),
        ended_at_ms: opt_u64(r.get(11)?),
        exit_code: r.get(12)?,
        reason: r.get(13)?,
        lease_id: r.get(14)?,
        devices: serde_json::from_str(&r.get::<_, String>(15)?).unwrap_or_default(),
        attempt: r.get(16)?,
        cancel_requested: r.get(17)?,
        gpu_seconds: r.get(18)?,
        charged_ms: opt_u64(r.get(19)?),
        interactive: r.get(20)?,
        alloc: r.get(21)?,
        idle_limit_ms: opt_u64(r.get(22)?),
        array: match (r.get::<_, Option<i64>>(23)?, r.get::<_, Option<u32>>(24)?) {
            (Some(id), Some(task)) => Some(ArrayTask {
                id,
                task,
                max_parallel: r.get(25)?,
            }),
            _ => None,
        },
    })
}

/// Whether the schema has what `exists` (a `SELECT COUNT(*) > 0 ...`) looks for.
fn schema_has(conn: &Connection, exists: &str) -> Result<bool, DbError> {
    query_row(conn, exists, [], |r| r.get(0)).map_err(db("reading the schema"))
}

/// Brings a database of an earlier orch up to this one's schema (`PRAGMA user_version`).
fn migrate(conn: &Connection) -> Result<(), DbError> {
    let version: i64 = conn
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .map_err(db("reading the schema version"))?;
    if version < 1 {
        // Usage accounting: device-seconds per job, decayed usage per tenant.
        conn.execute_batch(
            "BEGIN;
             ALTER TABLE jobs ADD COLUMN gpu_seconds REAL NOT NULL DEFAULT 0;
             ALTER TABLE jobs ADD COLUMN charged_ms INTEGER;
             CREATE TABLE IF NOT EXISTS usage (
                tenant TEXT PRIMARY KEY, gpu_seconds REAL NOT NULL, as_of_ms INTEGER NOT NULL
             );
             PRAGMA user_version = 1;
             COMMIT;",
        )
        .map_err(db("upgrading the schema"))?;
    }
    if version < 2 {
        // Job events.
        conn.execute_batch(
            "BEGIN;
             CREATE TABLE IF NOT EXISTS events (
                job_id INTEGER NOT NULL, at_ms INTEGER NOT NULL, kind TEXT NOT NULL,
                message TEXT NOT NULL
             );
             CREATE INDEX IF NOT EXISTS events_by_job ON events(job_id);
             PRAGMA user_version = 2;
             COMMIT;",
        )
        .map_err(db("upgrading the schema"))?;
    }
    let has_dependencies = schema_has(
        conn,
        "SELECT COUNT(*) > 0 FROM sqlite_master WHERE type = 'table' AND name = 'dependencies'",
    )?;
    if version < 3 || !has_dependencies {
        // Job dependencies: `kind` is after_ok, after_any or after_failed with the job `on_id`
        // waited on, or singleton (no `on_id`). Made whatever version another block set.
        conn.execute_batch(&format!(
            "BEGIN;
             CREATE TABLE IF NOT EXISTS dependencies (
                job_id INTEGER NOT NULL, kind TEXT NOT NULL, on_id INTEGER
             );
             CREATE INDEX IF NOT EXISTS dependencies_by_job ON dependencies(job_id);
             PRAGMA user_version = {};
             COMMIT;",
            version.max(3)
        ))
        .map_err(db("upgrading the schema"))?;
    }
    // Job arrays: each task's array (its first task's id), index and `max_parallel`. Looked for
    // by column as well as by version, so that the order the other blocks came in never skips it.
    let has_array = schema_has(
        conn,
        "SELECT COUNT(*) > 0 FROM pragma_table_info('jobs') WHERE name = 'array_id'",
    )?;
    if version < 4 || !has_array {
        let add = if has_array {
            ""
        } else {
            "ALTER TABLE jobs ADD COLUMN array_id INTEGER;
             ALTER TABLE jobs ADD COLUMN array_task INTEGER;
             ALTER TABLE jobs ADD COLUMN array_max_parallel INTEGER;"
        };
        conn.execute_batch(&format!(
            "BEGIN;
             {add}
             CREATE INDEX IF NOT EXISTS jobs_by_array ON jobs(array_id)
                WHERE array_id IS NOT NULL;
             PRAGMA user_version = {};
             COMMIT;",
            version.max(4)
        ))
        .map_err(db("upgrading the schema"))?;
    }
    let has_accounting = schema_has(
        conn,
        "SELECT COUNT(*) > 0 FROM sqlite_master WHERE type = 'table' AND name = 'accounting'",
    )?;
    if version < 5 || !has_accounting {
        // Per-job accounting, kept after the job's row (`accounting_retention`).
        conn.execute_batch(&format!(
            "BEGIN;
             {}
             PRAGMA user_version = {};
             COMMIT;",
            crate::core::accounting::SCHEMA,
            version.max(5)
        ))
        .map_err(db("upgrading the schema"))?;
    }
    incremental_vacuum(conn)
}

/// Pages are given back in the background after a purge (`accounting::vacuum_in_steps`), which a
/// file without incremental vacuum (of an earlier orch, or whose conversion was cut short) is
/// rewritten once for (VACUUM, outside any transaction). Checked on every open, apart from the
/// schema's version: a conversion that fails (a full disk) is logged and tried again at the next
/// start, and the database opens as it is.
fn incremental_vacuum(conn: &Connection) -> Result<(), DbError> {
    if auto_vacuum(conn)? == 2 {
        return Ok(());
    }
    tracing::info!(
        "rewriting the job database once to turn incremental vacuum on (VACUUM): a moment on a large database"
    );
    if let Err(e) = conn.execute_batch("PRAGMA auto_vacuum = INCREMENTAL; VACUUM;") {
        tracing::warn!(
            "could not turn incremental vacuum on ({e}): purged jobs' pages stay in the file until the next start tries again"
        );
    }
    Ok(())
}

/// The database's `auto_vacuum` mode: 0 none, 1 full, 2 incremental.
fn auto_vacuum(conn: &Connection) -> Result<i64, DbError> {
    conn.pragma_query_value(None, "auto_vacuum", |r| r.get(0))
        .map_err(db("reading auto_vacuum"))
}

/// Records what job `id` waits for (`[job] after_ok` ..., `singleton`, and the submission's
/// flags), with the job.
pub fn insert_dependencies(
    tx: &rusqlite::Transaction<'_>,
    id: i64,
    depends: &orch_core::job::Dependencies,
) -> Result<(), DbError> {
    for (kind, on) in depends.pairs() {
        exec(
            tx,
            "INSERT INTO dependencies (job_id, kind, on_id) VALUES (?1, ?2, ?3)",
            params![id, kind, on],
        )
        .map_err(db("writing a job's dependencies"))?;
    }
    if depends.singleton {
        exec(
            tx,
            "INSERT INTO dependencies (job_id, kind, on_id) VALUES (?1, 'singleton', NULL)",
            [id],
        )
        .map_err(db("writing a job's dependencies"))?;
    }
    Ok(())
}

/// Job `id`'s row, inside a write transaction (or on any connection).
/// The job ids of job array `array`'s tasks, by task index.
pub fn array_task_ids(conn: &Connection, array: i64) -> Result<Vec<i64>, DbError> {
    let mut stmt = conn
        .prepare_cached("SELECT id FROM jobs WHERE array_id = ?1 ORDER BY array_task")
        .map_err(db("reading a job array"))?;
    let ids = stmt
        .query_map([array], |r| r.get(0))
        .map_err(db("reading a job array"))?;
    ids.collect::<Result<Vec<i64>, _>>()
        .map_err(db("reading a job array"))
}

pub fn job_in(conn: &Connection, id: i64) -> Result<Option<JobRow>, DbError> {
    query_row(
        conn,
        &format!("SELECT {COLUMNS} FROM jobs WHERE id = ?1"),
        [id],
        row_to_job,
    )
    .optional()
    .map_err(db("reading a job"))
}

/// A tenant's decayed usage as recorded: GPU-seconds as of a moment.
#[derive(Debug, Clone, PartialEq)]
pub struct UsageRow {
    pub tenant: String,
    pub gpu_seconds: f64,
    pub as_of_ms: u64,
}

/// One job's use so far, recorded with its tenant's usage.
#[derive(Debug, Clone, PartialEq)]
pub struct JobUse {
    pub id: i64,
    pub gpu_seconds: f64,
    pub charged_ms: u64,
}

/// Records the tenants' usage and the jobs' use in one transaction.
pub fn save_usage(
    tx: &rusqlite::Transaction<'_>,
    tenants: &[UsageRow],
    jobs: &[JobUse],
) -> Result<i64, DbError> {
    for t in tenants {
        exec(
            tx,
            "INSERT INTO usage (tenant, gpu_seconds, as_of_ms) VALUES (?1, ?2, ?3)
             ON CONFLICT(tenant) DO UPDATE SET gpu_seconds = ?2, as_of_ms = ?3",
            params![t.tenant, t.gpu_seconds, t.as_of_ms as i64],
        )
        .map_err(db("recording usage"))?;
    }
    for j in jobs {
        exec(
            tx,
            "UPDATE jobs SET gpu_seconds = ?2, charged_ms = ?3 WHERE id = ?1",
            params![j.id, j.gpu_seconds, j.charged_ms as i64],
        )
        .map_err(db("recording usage"))?;
    }
    Ok(0)
}

/// The job a submission `key` was accepted as before, if any.
pub fn job_with_key(
    tx: &rusqlite::Transaction<'_>,
    key: Option<&str>,
) -> Result<Option<i64>, DbError> {
    let Some(key) = key else {
        return Ok(None);
    };
    query_row(
        tx,
        "SELECT id FROM jobs WHERE submit_key = ?1",
        [key],
        |r| r.get(0),
    )
    .optional()
    .map_err(db("writing a job"))
}

/// How many jobs `tenant` has queued, inside a write transaction.
pub fn queued_in(tx: &rusqlite::Transaction<'_>, tenant: &str) -> Result<u64, DbError> {
    query_row(
        tx,
        "SELECT COUNT(*) FROM jobs WHERE state = 'queued' AND tenant = ?1",
        [tenant],
        |r| r.get::<_, i64>(0),
    )
    .map(|n| n as u64)
    .map_err(db("counting queued jobs"))
}

/// Inserts a new queued job; returns its id. A `key` seen before returns that job's id instead.
pub fn insert_job(
    tx: &rusqlite::Transaction<'_>,
    row: &JobRow,
    submission: &Submission,
    key: Option<&str>,
) -> Result<i64, DbError> {
    if let Some(id) = job_with_key(tx, key)? {
        return Ok(id);
    }
    let text = serde_json::to_string(submission).map_err(|e| DbError {
        op: "writing a job",
        reason: e.to_string(),
        code: None,
    })?;
    exec(
        tx,
        "INSERT INTO jobs (name, tenant, user, uid, state, gpus, priority, requeue,
            submitted_at_ms, submission, submit_key)
         VALUES (?1, ?2, ?3, ?4, 'queued', ?5, ?6, ?7, ?8, ?9, ?10)",
        params![
            row.name,
            row.tenant,
            row.user,
            row.uid,
            row.gpus,
            row.priority,
            row.requeue,
            row.submitted_at_ms as i64,
            text,
            key
        ],
    )
    .map_err(db("writing a job"))?;
    let id = tx.last_insert_rowid();
    add_event(
        tx,
        id,
        &Event {
            at_ms: row.submitted_at_ms,
            kind: "queued".into(),
            message: format!("submitted by {} to tenant {}", row.user, row.tenant),
        },
    )?;
    Ok(id)
}

/// Inserts the tasks of a job array, `tasks[i]` as task `i`, in the caller's transaction (with
/// its checks: all or nothing); returns the tasks' job ids, the first of which is the array's id.
/// A `key` seen before returns that array's id alone instead.
pub fn insert_array(
    tx: &rusqlite::Transaction<'_>,
    row: &JobRow,
    tasks: &[Submission],
    max_parallel: Option<u32>,
    key: Option<&str>,
) -> Result<Vec<i64>, DbError> {
    if let Some(id) = job_with_key(tx, key)? {
        return Ok(vec![id]);
    }
    let mut ids = Vec::with_capacity(tasks.len());
    for (task, submission) in tasks.iter().enumerate() {
        let id = insert_job(tx, row, submission, if task == 0 { key } else { None })?;
        let array_id = *ids.first().unwrap_or(&id);
        exec(
            tx,
            "UPDATE jobs SET array_id = ?2, array_task = ?3, array_max_parallel = ?4 WHERE id = ?1",
            params![id, array_id, task as i64, max_parallel],
        )
        .map_err(db("writing a job"))?;
        ids.push(id);
    }
    Ok(ids)
}

/// What a [`Change`] does to a column that may be empty: leaves it, sets it, or empties it.
#[derive(Debug, Clone, Default, PartialEq)]
pub enum Update<T> {
    #[default]
    Keep,
    Set(T),
    Clear,
}

impl<T> Update<T> {
    /// Set to `value` when there is one, else left as it is.
    pub fn set_if(value: Option<T>) -> Update<T> {
        value.map_or(Update::Keep, Update::Set)
    }

    /// Set to `value` when there is one, else emptied.
    pub fn set_or_clear(value: Option<T>) -> Update<T> {
        value.map_or(Update::Clear, Update::Set)
    }
}

/// Sets a job's state and the fields that go with it.
#[derive(Debug, Clone, Default)]
pub struct Change {
    pub state: Option<State>,
    pub started_at_ms: Option<u64>,
    pub ended_at_ms: Option<u64>,
    pub exit_code: Option<i32>,
    /// Why the job is in its state.
    pub reason: Update<String>,
    pub lease_id: Option<String>,
    pub devices: Option<Vec<String>>,
    pub attempt: Option<u32>,
    pub supervisor: Option<String>,
    pub cancel_requested: Option<bool>,
    /// Only when the job is in this state (a cancel racing an end must not overwrite it).
    pub only_if: Option<State>,
    /// Recorded with the change (when it applies).
    pub event: Option<Event>,
    /// Its use is counted up to here (set when a run starts).
    pub charged_ms: Option<u64>,
    /// The job's accounting, recorded with the change (when it applies): set on its end.
    pub accounting: Option<Box<crate::core::accounting::Record>>,
}

pub fn apply(tx: &rusqlite::Transaction<'_>, id: i64, c: &Change) -> Result<i64, DbError> {
    let devices = c
        .devices
        .as_ref()
        .map(|d| serde_json::to_string(d).unwrap_or_else(|_| "[]".into()));
    let (touch_reason, reason) = match &c.reason {
        Update::Keep => (false, None),
        Update::Set(reason) => (true, Some(reason.as_str())),
        Update::Clear => (true, None),
    };
    let n = exec(
        tx,
        "UPDATE jobs SET
                state = COALESCE(?2, state),
                started_at_ms = COALESCE(?3, started_at_ms),
                ended_at_ms = COALESCE(?4, ended_at_ms),
                exit_code = COALESCE(?5, exit_code),
                reason = CASE WHEN ?14 THEN ?6 ELSE reason END,
                lease_id = COALESCE(?7, lease_id),
                devices = COALESCE(?8, devices),
                attempt = COALESCE(?9, attempt),
                supervisor = COALESCE(?10, supervisor),
                cancel_requested = COALESCE(?12, cancel_requested),
                charged_ms = COALESCE(?13, charged_ms)
             WHERE id = ?1 AND (?11 IS NULL OR state = ?11)",
        params![
            id,
            c.state.map(State::as_str),
            c.started_at_ms.map(|v| v as i64),
            c.ended_at_ms.map(|v| v as i64),
            c.exit_code,
            reason,
            c.lease_id,
            devices,
            c.attempt,
            c.supervisor,
            c.only_if.map(State::as_str),
            c.cancel_requested,
            c.charged_ms.map(|v| v as i64),
            touch_reason,
        ],
    )
    .map_err(db("changing a job"))?;
    if n > 0
        && let Some(event) = &c.event
    {
        add_event(tx, id, event)?;
    }
    if n > 0
        && let Some(record) = &c.accounting
    {
        crate::core::accounting::insert(tx, record)?;
    }
    Ok(n as i64)
}

/// Ends job `id` while it is queued, as `change` says (its `state`, `ended_at_ms` and `reason`;
/// `only_if` is set to queued here), with its accounting record built from its row as this
/// transaction reads it; the record when the change applied (count it in the metrics then),
/// `None` when the job was no longer queued.
pub fn end_queued(
    tx: &rusqlite::Transaction<'_>,
    id: i64,
    mut change: Change,
    measured: &crate::core::accounting::Measured,
) -> Result<Option<crate::core::accounting::Record>, DbError> {
    let row = query_row(
        tx,
        &format!("SELECT {COLUMNS} FROM jobs WHERE id = ?1"),
        [id],
        row_to_job,
    )
    .optional()
    .map_err(db("reading a job"))?;
    let Some(row) = row.filter(|row| row.state == State::Queued) else {
        return Ok(None);
    };
    let state = change.state.unwrap_or(State::Cancelled);
    let ended_at_ms = change.ended_at_ms.unwrap_or_else(now_ms);
    let reason = match &change.reason {
        Update::Set(reason) => Some(reason.clone()),
        Update::Keep | Update::Clear => None,
    };
    let record = crate::core::accounting::Record::of(
        &row,
        state,
        ended_at_ms,
        change.exit_code,
        reason,
        measured,
    );
    change.state = Some(state);
    change.ended_at_ms = Some(ended_at_ms);
    change.only_if = Some(State::Queued);
    change.accounting = Some(Box::new(record.clone()));
    Ok((apply(tx, id, &change)? > 0).then_some(record))
}

/// Deletes the finished jobs among `ids` with their events and dependencies; returns how many.
pub fn purge_jobs(tx: &rusqlite::Transaction<'_>, ids: &[i64]) -> Result<i64, DbError> {
    let mut n = 0;
    for id in ids {
        let gone = exec(
            tx,
            "DELETE FROM jobs WHERE id = ?1 AND state NOT IN ('queued', 'running')",
            [id],
        )
        .map_err(db("purging old jobs"))?;
        if gone == 0 {
            continue;
        }
        n += gone as i64;
        exec(tx, "DELETE FROM events WHERE job_id = ?1", [id]).map_err(db("purging old jobs"))?;
        exec(tx, "DELETE FROM dependencies WHERE job_id = ?1", [id])
            .map_err(db("purging old jobs"))?;
    }
    Ok(n)
}

impl Db {
    /// Pages of the database file that hold nothing (`PRAGMA freelist_count`).
    /// Whether the database gives free pages back in steps (`auto_vacuum` is incremental).
    pub fn incremental_vacuum(&self) -> Result<bool, DbError> {
        self.read(|c| auto_vacuum(c).map(|mode| mode == 2))
    }

    pub fn free_pages(&self) -> Result<u64, DbError> {
        self.read(|c| {
            query_row(c, "PRAGMA freelist_count", [], |r| r.get::<_, i64>(0))
                .map(|n| u64::try_from(n).unwrap_or(0))
                .map_err(db("counting free pages"))
        })
    }

    /// Finished jobs' accounting records (`orch history`).
    pub fn history(
        &self,
        filter: &crate::core::accounting::Filter,
        limit: u32,
    ) -> Result<Vec<crate::core::accounting::Record>, DbError> {
        self.read(|c| crate::core::accounting::records(c, filter, limit))
    }

    /// Finished jobs' accounting summed per tenant or user (`orch history --by tenant`).
    pub fn history_summary(
        &self,
        filter: &crate::core::accounting::Filter,
        by: crate::core::accounting::By,
    ) -> Result<Vec<crate::core::accounting::Summary>, DbError> {
        self.read(|c| crate::core::accounting::summary(c, filter, by))
    }

    /// The accounting records of the jobs numbered `ids` (those that have one).
    pub fn accounting_of(
        &self,
        ids: &[i64],
    ) -> Result<Vec<crate::core::accounting::Record>, DbError> {
        self.read(|c| crate::core::accounting::records_of(c, ids))
    }

    /// `(id, attempt)` of the finished jobs that ended before `before_ms`.
    pub fn finished_before(&self, before_ms: u64) -> Result<Vec<(i64, u32)>, DbError> {
        self.read(|c| {
            let mut stmt = c
                .prepare_cached(
                    "SELECT id, attempt FROM jobs
                     WHERE state NOT IN ('queued', 'running') AND ended_at_ms < ?1",
                )
                .map_err(db("finding old jobs"))?;
            let rows = stmt
                .query_map([before_ms as i64], |r| Ok((r.get(0)?, r.get(1)?)))
                .map_err(db("finding old jobs"))?;
            rows.collect::<Result<Vec<_>, _>>()
                .map_err(db("finding old jobs"))
        })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A submission of user `u`'s job.toml, task `sweep_task` of an array when given.
    pub(crate) fn test_submission(sweep_task: Option<u32>) -> Submission {
        Submission {
            job_text: String::new(),
            job_path: "job.toml".into(),
            cwd: "/".into(),
            env: Vec::new(),
            identity: crate::core::users::Identity {
                uid: 0,
                gid: 0,
                name: "u".into(),
                groups: Vec::new(),
            },
            policy_file: None,
            holder: None,
            alloc: None,
            sweep_task,
        }
    }

    #[test]
    fn every_state_reads_back_and_an_unknown_one_is_an_error() {
        for state in State::ALL {
            assert_eq!(State::parse(state.as_str()), Ok(state));
        }
        assert_eq!(State::parse("paused"), Err(UnknownState("paused".into())));
    }

    #[test]
    fn a_row_in_an_unknown_state_fails_to_read() {
        let dir = std::env::temp_dir().join(format!("orch-db-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let db = Db::open(&dir).unwrap();
        let conn = Connection::open(dir.join("jobs.sqlite3")).unwrap();
        conn.execute(
            "INSERT INTO jobs (name, tenant, user, uid, state, gpus, priority, requeue,
                submitted_at_ms, submission) VALUES ('j', 't', 'u', 0, 'paused', 0, 0, 0, 0, '{}')",
            [],
        )
        .unwrap();
        let e = db.job(1).unwrap_err();
        assert!(e.to_string().contains("\"paused\""), "{e}");
        drop(db);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn new_jobs_are_numbered_above_a_given_id_and_never_below_what_was_used() {
        let dir = std::env::temp_dir().join(format!("orch-db-number-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let db = Db::open(&dir).unwrap();
        let insert = |store: &Db| {
            store
                .write_blocking(|tx| {
                exec(
                    tx,
                    "INSERT INTO jobs (name, tenant, user, uid, state, gpus, priority, requeue,
                        submitted_at_ms, submission) VALUES ('j', 't', 'u', 0, 'queued', 0, 0, 0, 0, '{}')",
                    [],
                )
                .map_err(super::db("test"))?;
                Ok(tx.last_insert_rowid())
            })
            .unwrap()
        };
        // An empty database (no row in sqlite_sequence yet) and one with jobs alike.
        assert_eq!(db.number_above(7).unwrap(), Some(0));
        assert_eq!(insert(&db), 8);
        assert_eq!(db.number_above(5).unwrap(), None);
        assert_eq!(insert(&db), 9);
        assert_eq!(db.number_above(20).unwrap(), Some(9));
        assert_eq!(insert(&db), 21);
        db.stop();
        assert_eq!(
            std::fs::metadata(dir.join("jobs.sqlite3-wal")).map_or(0, |m| m.len()),
            0
        );
        drop(db);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_stop_leaves_every_write_in_the_file_alone_and_takes_none_after() {
        let dir = std::env::temp_dir().join(format!("orch-db-stop-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let db = std::sync::Arc::new(Db::open(&dir).unwrap());
        // Writers still at work while the stop comes (bounded: 2,000 writes each at most).
        let writers: Vec<_> = (0..2)
            .map(|w| {
                let db = std::sync::Arc::clone(&db);
                std::thread::spawn(move || {
                    let mut committed = 0u32;
                    for i in 0..2000 {
                        let done = db.write_blocking(move |tx| {
                            exec(
                                tx,
                                "INSERT INTO usage (tenant, gpu_seconds, as_of_ms) VALUES (?1, 1, 1)",
                                [format!("t{w}-{i}")],
                            )
                            .map_err(super::db("test"))?;
                            Ok(0)
                        });
                        match done {
                            Ok(_) => committed += 1,
                            Err(e) => {
                                assert!(e.to_string().contains("writer thread is gone"), "{e}");
                                break;
                            }
                        }
                    }
                    committed
                })
            })
            .collect();
        std::thread::sleep(std::time::Duration::from_millis(50));
        db.stop();
        let committed: u32 = writers.into_iter().map(|w| w.join().unwrap()).sum();
        assert!(committed > 0);
        let wal = dir.join("jobs.sqlite3-wal");
        assert_eq!(std::fs::metadata(&wal).map_or(0, |m| m.len()), 0);
        // jobs.sqlite3 copied alone holds every committed write.
        let copy = dir.join("copy");
        std::fs::create_dir_all(&copy).unwrap();
        std::fs::copy(dir.join("jobs.sqlite3"), copy.join("jobs.sqlite3")).unwrap();
        let conn = Connection::open(copy.join("jobs.sqlite3")).unwrap();
        let rows: u32 = conn
            .query_row("SELECT COUNT(*) FROM usage", [], |r| r.get(0))
            .unwrap();
        assert_eq!(rows, committed);
        drop(db);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_change_sets_keeps_or_clears_the_reason() {
        let dir = std::env::temp_dir().join(format!("orch-db-reason-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let db = Db::open(&dir).unwrap();
        let row = JobRow {
            name: "j".into(),
            tenant: "t".into(),
            user: "u".into(),
            ..JobRow::queued(0)
        };
        let submission = test_submission(None);
        let id = db
            .write_blocking(move |tx| insert_job(tx, &row, &submission, None))
            .unwrap();
        let change = |reason: Update<String>| {
            let change = Change {
                reason,
                ..Change::default()
            };
            db.write_blocking(move |tx| apply(tx, id, &change)).unwrap();
            db.job(id).unwrap().unwrap().reason
        };
        assert_eq!(change(Update::Set("waits".into())), Some("waits".into()));
        assert_eq!(change(Update::Keep), Some("waits".into()));
        assert_eq!(change(Update::Clear), None);
        drop(db);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_array_is_inserted_whole_and_its_columns_come_whatever_the_schema_version_says() {
        let dir = std::env::temp_dir().join(format!("orch-db-array-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        // A database marked past this block's version by another block, without its columns.
        {
            let conn = Connection::open(dir.join("jobs.sqlite3")).unwrap();
            conn.execute_batch(
                "CREATE TABLE jobs (
                    id INTEGER PRIMARY KEY AUTOINCREMENT,
                    name TEXT NOT NULL, tenant TEXT NOT NULL, user TEXT NOT NULL,
                    uid INTEGER NOT NULL, state TEXT NOT NULL, gpus INTEGER NOT NULL,
                    priority INTEGER NOT NULL, requeue INTEGER NOT NULL,
                    submitted_at_ms INTEGER NOT NULL, started_at_ms INTEGER,
                    ended_at_ms INTEGER, exit_code INTEGER, reason TEXT, lease_id TEXT,
                    devices TEXT NOT NULL DEFAULT '[]', attempt INTEGER NOT NULL DEFAULT 0,
                    supervisor TEXT, submission TEXT NOT NULL, submit_key TEXT,
                    cancel_requested INTEGER NOT NULL DEFAULT 0,
                    gpu_seconds REAL NOT NULL DEFAULT 0, charged_ms INTEGER
                 );
                 CREATE TABLE usage (tenant TEXT PRIMARY KEY, gpu_seconds REAL NOT NULL,
                    as_of_ms INTEGER NOT NULL);
                 CREATE TABLE events (job_id INTEGER NOT NULL, at_ms INTEGER NOT NULL,
                    kind TEXT NOT NULL, message TEXT NOT NULL);
                 PRAGMA user_version = 5;",
            )
            .unwrap();
        }
        let db = Db::open(&dir).unwrap();
        let row = JobRow {
            name: "sw".into(),
            tenant: "t".into(),
            user: "u".into(),
            ..JobRow::queued(0)
        };
        let submission = |task| test_submission(Some(task));
        let tasks: Vec<Submission> = (0..3).map(submission).collect();
        let again = tasks.clone();
        let r = row.clone();
        let insert = |rows: Vec<Submission>, row: JobRow| {
            let (sent, ids) = mpsc::channel();
            db.write_blocking(move |tx| {
                let _ = sent.send(insert_array(tx, &row, &rows, Some(2), Some("k"))?);
                Ok(0)
            })
            .unwrap();
            ids.recv().unwrap()
        };
        let ids = insert(tasks, r);
        assert_eq!(ids.len(), 3);
        let read = db.array_tasks(ids[0]).unwrap();
        let places: Vec<(i64, Option<ArrayTask>)> = read.iter().map(|r| (r.id, r.array)).collect();
        let want: Vec<(i64, Option<ArrayTask>)> = ids
            .iter()
            .enumerate()
            .map(|(task, &id)| {
                (
                    id,
                    Some(ArrayTask {
                        id: ids[0],
                        task: task as u32,
                        max_parallel: Some(2),
                    }),
                )
            })
            .collect();
        assert_eq!(places, want);
        assert_eq!(db.array_task(ids[0], 2).unwrap().unwrap().id, ids[2]);
        assert!(db.array_task(ids[0], 3).unwrap().is_none());
        assert_eq!(
            db.submission(ids[1]).unwrap().unwrap().0.sweep_task,
            Some(1)
        );
        // Sent again with its key: the array already taken, nothing more.
        assert_eq!(insert(again, row), vec![ids[0]]);
        assert_eq!(db.jobs(&[], 100).unwrap().len(), 3);
        drop(db);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn dependencies_are_kept_with_their_job_across_a_reopen_and_go_with_it() {
        let dir = std::env::temp_dir().join(format!("orch-db-deps-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let db = Db::open(&dir).unwrap();
        let submission = test_submission(None);
        let depends = orch_core::job::Dependencies {
            after_ok: vec![3, 4],
            after_any: vec![5],
            after_failed: vec![6],
            singleton: true,
        };
        let (want, sub) = (depends.clone(), submission.clone());
        let id = db
            .write_blocking(move |tx| {
                let row = JobRow {
                    name: "j".into(),
                    tenant: "t".into(),
                    user: "u".into(),
                    ..JobRow::queued(0)
                };
                let id = insert_job(tx, &row, &sub, None)?;
                insert_dependencies(tx, id, &depends)?;
                Ok(id)
            })
            .unwrap();
        let plain = db
            .write_blocking(move |tx| {
                let row = JobRow {
                    name: "k".into(),
                    ..JobRow::queued(0)
                };
                insert_job(tx, &row, &submission, None)
            })
            .unwrap();
        db.stop();
        drop(db);
        let db = Db::open(&dir).unwrap();
        assert_eq!(db.dependencies(id).unwrap(), want);
        assert!(db.dependencies(plain).unwrap().is_empty());
        // A purged job's dependencies go with it.
        let change = Change {
            state: Some(State::Succeeded),
            ended_at_ms: Some(1),
            ..Change::default()
        };
        db.write_blocking(move |tx| apply(tx, id, &change)).unwrap();
        db.write_blocking(move |tx| purge_jobs(tx, &[id])).unwrap();
        assert!(db.dependencies(id).unwrap().is_empty());
        drop(db);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_savepoint_that_cannot_be_ended_fails_the_batch_and_commits_nothing() {
        let dir = std::env::temp_dir().join(format!("orch-db-savepoint-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let jobs = Db::open(&dir).unwrap();
        // A write that ends its own savepoint: the writer's RELEASE of it then fails.
        let e = jobs
            .write_blocking(|tx| {
                tx.execute_batch(
                    "INSERT INTO usage (tenant, gpu_seconds, as_of_ms) VALUES ('t', 1, 1);
                     RELEASE w;",
                )
                .map_err(db("testing"))?;
                Ok(0)
            })
            .unwrap_err();
        assert_eq!(e.op, "ending a write", "{e}");
        assert!(
            jobs.usage().unwrap().is_empty(),
            "the failed batch was committed"
        );
        // The writer goes on.
        jobs.write_blocking(|tx| save_usage(tx, &[], &[])).unwrap();
        drop(jobs);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
