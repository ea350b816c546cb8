//! The API's wire types: what requests carry and answers say, as the CLI (`orch`) and the
//! Python package read them. Apart from the database's rows: a change of the schema never
//! changes an answer by accident.

use crate::core::db::{Event, JobRow, State};
use serde::{Deserialize, Serialize};

pub use crate::core::compile::{POLICY_LIMIT, UPLOAD_LIMIT};

/// The body of `POST /v1/jobs`: the job file's text and where it was, the client's working
/// folder and environment (as `sbatch` passes them by default).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SubmitRequest {
    pub job_text: String,
    /// The job file's absolute path (relative paths in it resolve against its folder); for a
    /// quick-form job, a file name in the working folder.
    pub job_path: String,
    pub cwd: String,
    #[serde(default)]
    pub env: Vec<(String, String)>,
    /// A key unique to this submission, chosen by the client: sent again (after a daemon
    /// restart lost the answer), it returns the job already accepted instead of a second one.
    #[serde(default)]
    pub key: Option<String>,
    /// When the job's `[policy] plugin` is a file: its bytes (base64), as the submitting user
    /// read them. The daemon never opens a user's path itself: it could name a file only root may
    /// read, or a FIFO that never ends.
    #[serde(default)]
    pub policy_wasm: Option<String>,
    /// When the job's `[policy] plugin` is a file: its digest (`sha256:HEX`), uploaded before
    /// with `PUT /v1/plugins/sha256:HEX`, instead of `policy_wasm`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy_digest: Option<String>,
    /// Dependencies given beside the job file (`orch submit --after-ok 12`): they add to its
    /// `[job]` lists. Not taken by `POST /v1/leases`.
    #[serde(
        default,
        skip_serializing_if = "orch_core::job::Dependencies::is_empty"
    )]
    pub depends: orch_core::job::Dependencies,
}

/// The fields of a `POST /v1/jobs` body, all of [`SubmitRequest`]'s.
pub const SUBMIT_FIELDS: &[&str] = &[
    "job_text",
    "job_path",
    "cwd",
    "env",
    "key",
    "policy_wasm",
    "policy_digest",
    "depends",
];

/// The fields of a `POST /v1/leases` body: a submission's and `wait`.
pub const LEASE_FIELDS: &[&str] = &[
    "job_text",
    "job_path",
    "cwd",
    "env",
    "key",
    "policy_wasm",
    "policy_digest",
    "wait",
    "alloc",
];

/// A request body as `T` (`what` names it in the sentence: "a job submission"): JSON whose
/// object has only the `fields` given; a field it does not know is refused by name, not ignored
/// (a misspelt `wiat` would otherwise quietly mean its default).
pub fn parse_body<T: serde::de::DeserializeOwned>(
    body: &[u8],
    what: &str,
    fields: &[&str],
) -> Result<T, String> {
    let not = |e: serde_json::Error| format!("the request body is not {what}: {e}");
    let value: serde_json::Value = serde_json::from_slice(body).map_err(not)?;
    if let Some(unknown) = value
        .as_object()
        .and_then(|o| o.keys().find(|k| !fields.contains(&k.as_str())))
    {
        let mut name: String = unknown.chars().take(60).collect();
        if name.len() < unknown.len() {
            name.push_str("...");
        }
        return Err(format!(
            "the request body has the unknown field \"{}\": {what} takes {}",
            name.escape_debug(),
            fields.join(", ")
        ));
    }
    serde_json::from_value(value).map_err(not)
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SubmitResponse {
    pub id: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: String,
}

/// A tenant as `GET /v1/tenants` (and `orch usage`) shows it: the columns of Slurm's `sshare`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TenantRow {
    pub name: String,
    /// The configured weight.
    pub share: f64,
    /// Its fraction of every tenant's shares: what fair share aims at.
    #[serde(default)]
    pub normalized_share: f64,
    /// Decayed usage, GPU-seconds (half-life `usage_half_life`).
    #[serde(default)]
    pub usage_gpu_seconds: f64,
    /// Its fraction of every tenant's decayed usage.
    #[serde(default)]
    pub normalized_usage: f64,
    /// `2^(-normalized_usage / normalized_share)`: 1 unused, 0.5 at its share, towards 0 beyond.
    #[serde(default)]
    pub fair_share: f64,
    pub max_gpus: Option<u32>,
    pub max_queued: Option<u32>,
    #[serde(default)]
    pub max_priority: Option<i64>,
    #[serde(default)]
    pub max_runtime_s: Option<f64>,
    pub gpus_held: u32,
    pub jobs_queued: u32,
    pub jobs_running: u32,
}

/// Largest request body accepted (a job file, an environment and a policy component in base64).
pub const BODY_LIMIT: usize = POLICY_LIMIT / 3 * 4 + (4 << 20);

/// What `GET`, `HEAD` and `PUT /v1/plugins/sha256:HEX` answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PluginAnswer {
    pub digest: String,
    pub bytes: u64,
    /// `stored`, `queued`, `compiling`, `compiled` or `failed`.
    pub state: String,
    /// Why it is not compiling, when a budget stopped it (the submission naming it says so too).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// The body of `POST /v1/leases`: a submission (the lease's request as a job file's text) and
/// whether to wait in the queue when nothing fits now.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LeaseRequest {
    #[serde(flatten)]
    pub submission: SubmitRequest,
    #[serde(default)]
    pub wait: bool,
    /// An interactive allocation (`orch alloc`): shown as one, and released at its limits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alloc: Option<AllocRequest>,
}

/// What `orch alloc` adds to a lease request (its `--time` is the job text's `max_runtime`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AllocRequest {
    /// `--idle`, seconds: the lease is released once all its GPUs have stayed idle this long.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_s: Option<f64>,
}

/// A held lease as the API shows it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LeaseView {
    pub job_id: String,
    pub state: State,
    pub lease_id: Option<String>,
    /// The leased devices with both numberings, best first (empty until it runs).
    pub devices: Vec<serde_json::Value>,
    pub policy: Option<String>,
    /// The policy's reason once it runs; why it waits while queued; how it ended after.
    pub reason: Option<String>,
    pub rejected: Vec<serde_json::Value>,
    /// The device variables the process sets for itself (what `orch run` gives a job).
    pub env: std::collections::BTreeMap<String, String>,
    pub exclusive: bool,
    /// The daemon's inventory, as `--devices` names it (`auto`, `cpu`, `sim:/abs/path`): a
    /// client that runs the job itself (`orch run`) reads the same devices.
    #[serde(default)]
    pub inventory: String,
    /// While queued: its place among the waiting jobs in the order the daemon tries them (1 is
    /// next) and how many wait, from the latest scheduling pass.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub place: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting: Option<usize>,
}

/// A job as the API shows it (`GET /v1/jobs`, `GET /v1/jobs/ID`). Its id is a number inside
/// the daemon and a string of digits on the wire, as clients have always read it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Job {
    #[serde(with = "id_text")]
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
    /// The signal that ended its process, when one did (from its accounting record; absent
    /// while it runs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    /// Why it is in its state: waiting for what, how it ended.
    pub reason: Option<String>,
    pub lease_id: Option<String>,
    /// Device uuids, while running and after.
    pub devices: Vec<String>,
    /// 1 for the first run, more after requeues.
    pub attempt: u32,
    /// A cancel was asked for and committed; the job is being stopped.
    #[serde(default)]
    pub cancel_requested: bool,
    /// Device-seconds it used, over all its runs (recorded every sampling period while it runs).
    #[serde(default)]
    pub gpu_seconds: f64,
    /// Its use is counted in its tenant's usage up to here (while it runs).
    #[serde(default)]
    pub charged_ms: Option<u64>,
    /// A lease held by a process of its user (`orch run`, `import orch`), which runs the work
    /// itself: an interactive job.
    #[serde(default)]
    pub interactive: bool,
    /// An interactive allocation (`orch alloc`), a kind of interactive job.
    #[serde(default)]
    pub alloc: bool,
    /// An allocation's idle limit (`--idle`), seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_limit_s: Option<f64>,
    /// What happened to it, oldest first (`GET /v1/jobs/ID` only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub events: Vec<Event>,
    /// A task of a job array (a `[sweep]`): the array's id, its first task's job id (a string of
    /// digits, as `id`).
    #[serde(default, with = "opt_id_text", skip_serializing_if = "Option::is_none")]
    pub array_id: Option<i64>,
    /// A task of a job array: its index, from 0 (`ORCH_SWEEP_TASK`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub array_task: Option<u32>,
    /// `GET /v1/jobs/ARRAY` of an array's id: the whole array, task by task.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub array: Option<ArraySummary>,
    /// What it used, once it has ended (absent before, and for a job that ended before this
    /// daemon kept accounting).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accounting: Option<Accounting>,
}

/// What an ended job used (`accounting` of a job; every row of `GET /v1/history`). A figure
/// that could not be read is `null`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Accounting {
    /// The devices of its last run (uuids); their count is its GPUs.
    pub devices: Vec<String>,
    /// Devices x wall time, over all its runs.
    pub gpu_seconds: f64,
    /// Its last run's wall time, seconds (0 when it never started).
    pub wall_s: f64,
    /// From its submission to its last start, seconds (to its end when it never started).
    pub queue_wait_s: f64,
    /// CPU time (user + system) of its processes.
    #[serde(default)]
    pub cpu_seconds: Option<f64>,
    /// The most memory its processes held (its cgroup's peak, else the largest process's).
    #[serde(default)]
    pub peak_rss_bytes: Option<u64>,
    /// The most GPU memory its processes held on any one of its devices.
    #[serde(default)]
    pub peak_gpu_memory_bytes: Option<u64>,
    /// Its devices' mean utilization while it ran, percent (0-100).
    #[serde(default)]
    pub mean_gpu_utilization: Option<f64>,
}

impl From<&crate::core::accounting::Record> for Accounting {
    fn from(r: &crate::core::accounting::Record) -> Accounting {
        Accounting {
            devices: r.devices.clone(),
            gpu_seconds: r.gpu_seconds,
            wall_s: r.wall_s,
            queue_wait_s: r.queue_wait_s,
            cpu_seconds: r.cpu_seconds,
            peak_rss_bytes: r.peak_rss_bytes,
            peak_gpu_memory_bytes: r.peak_gpu_memory_bytes,
            mean_gpu_utilization: r.mean_gpu_utilization,
        }
    }
}

/// A finished job as `GET /v1/history` (`orch history`) shows it: who, when, how it ended, and
/// its [`Accounting`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HistoryJob {
    #[serde(with = "id_text")]
    pub id: i64,
    pub name: String,
    pub tenant: String,
    pub user: String,
    pub state: State,
    pub submitted_at_ms: u64,
    pub started_at_ms: Option<u64>,
    pub ended_at_ms: u64,
    /// Its runs (more than 1 after preemptions or requeues).
    pub attempt: u32,
    pub gpus: u32,
    pub exit_code: Option<i32>,
    /// The signal that ended its process, when one did.
    pub signal: Option<i32>,
    pub reason: Option<String>,
    #[serde(flatten)]
    pub accounting: Accounting,
}

impl From<&crate::core::accounting::Record> for HistoryJob {
    fn from(r: &crate::core::accounting::Record) -> HistoryJob {
        HistoryJob {
            id: r.job_id,
            name: r.name.clone(),
            tenant: r.tenant.clone(),
            user: r.user.clone(),
            state: r.state,
            submitted_at_ms: r.submitted_at_ms,
            started_at_ms: r.started_at_ms,
            ended_at_ms: r.ended_at_ms,
            attempt: r.attempt,
            gpus: r.devices.len() as u32,
            exit_code: r.exit_code,
            signal: r.signal,
            reason: r.reason.clone(),
            accounting: Accounting::from(r),
        }
    }
}

/// A group of `GET /v1/history?by=tenant` (or `by=user`).
pub use crate::core::accounting::Summary as HistorySummary;

/// A job array as `GET /v1/jobs/ARRAY` shows it beside its first task: its size, its bound, and
/// how many of its tasks are in each state.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArraySummary {
    pub tasks: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_parallel: Option<u32>,
    pub queued: u32,
    pub running: u32,
    pub succeeded: u32,
    pub failed: u32,
    pub cancelled: u32,
    pub lost: u32,
    /// The indexes of the tasks that failed, were cancelled or lost.
    #[serde(default)]
    pub unsuccessful: Vec<u32>,
}

impl ArraySummary {
    /// The summary of an array's tasks (`JobRow`s of one array).
    pub fn of(tasks: &[JobRow]) -> ArraySummary {
        let mut s = ArraySummary {
            tasks: tasks.len() as u32,
            max_parallel: tasks
                .first()
                .and_then(|t| t.array)
                .and_then(|a| a.max_parallel),
            ..ArraySummary::default()
        };
        for t in tasks {
            let n = match t.state {
                State::Queued => &mut s.queued,
                State::Running => &mut s.running,
                State::Succeeded => &mut s.succeeded,
                State::Failed => &mut s.failed,
                State::Cancelled => &mut s.cancelled,
                State::Lost => &mut s.lost,
            };
            *n += 1;
            if matches!(t.state, State::Failed | State::Cancelled | State::Lost) {
                s.unsuccessful.extend(t.array.map(|a| a.task));
            }
        }
        s
    }

    /// Every task has ended.
    pub fn ended(&self) -> bool {
        self.queued == 0 && self.running == 0
    }
}

impl From<JobRow> for Job {
    fn from(row: JobRow) -> Job {
        Job {
            id: row.id,
            name: row.name,
            tenant: row.tenant,
            user: row.user,
            uid: row.uid,
            state: row.state,
            gpus: row.gpus,
            priority: row.priority,
            requeue: row.requeue,
            submitted_at_ms: row.submitted_at_ms,
            started_at_ms: row.started_at_ms,
            ended_at_ms: row.ended_at_ms,
            exit_code: row.exit_code,
            signal: None,
            reason: row.reason,
            lease_id: row.lease_id,
            devices: row.devices,
            attempt: row.attempt,
            cancel_requested: row.cancel_requested,
            gpu_seconds: row.gpu_seconds,
            charged_ms: row.charged_ms,
            interactive: row.interactive,
            alloc: row.alloc,
            idle_limit_s: row.idle_limit_ms.map(|ms| ms as f64 / 1000.0),
            events: Vec::new(),
            array_id: row.array.map(|a| a.id),
            array_task: row.array.map(|a| a.task),
            array: None,
            accounting: None,
        }
    }
}

/// An optional job id on the wire, as [`id_text`].
mod opt_id_text {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(id: &Option<i64>, s: S) -> Result<S::Ok, S::Error> {
        match id {
            Some(id) => super::id_text::serialize(id, s),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<i64>, D::Error> {
        #[derive(Deserialize)]
        struct Id(#[serde(with = "super::id_text")] i64);
        Ok(Option::<Id>::deserialize(d)?.map(|Id(id)| id))
    }
}

/// A job id on the wire: a string of digits (`"12"`); a number is read too.
mod id_text {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(id: &i64, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(id)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Id {
            Text(String),
            Number(i64),
        }
        match Id::deserialize(d)? {
            Id::Number(n) => Ok(n),
            Id::Text(text) => text.parse().map_err(|_| {
                serde::de::Error::custom(format!("job id \"{text}\" is not a number"))
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_field_lists_are_the_requests_own_and_unknown_fields_are_named() {
        let submit = SubmitRequest {
            job_text: String::new(),
            job_path: String::new(),
            cwd: String::new(),
            env: Vec::new(),
            key: Some(String::new()),
            policy_wasm: Some(String::new()),
            policy_digest: Some(String::new()),
            depends: orch_core::job::Dependencies {
                singleton: true,
                ..Default::default()
            },
        };
        let keys = |v: serde_json::Value| -> Vec<String> {
            let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
            k.sort();
            k
        };
        let sorted = |f: &[&str]| {
            let mut f: Vec<String> = f.iter().map(|s| s.to_string()).collect();
            f.sort();
            f
        };
        assert_eq!(
            keys(serde_json::to_value(&submit).unwrap()),
            sorted(SUBMIT_FIELDS)
        );
        let lease = LeaseRequest {
            submission: SubmitRequest {
                depends: Default::default(),
                ..submit
            },
            wait: true,
            alloc: Some(AllocRequest { idle_s: Some(60.0) }),
        };
        assert_eq!(
            keys(serde_json::to_value(&lease).unwrap()),
            sorted(LEASE_FIELDS)
        );
        let body = br#"{"job_text": "", "job_path": "/j.toml", "cwd": "/", "wiat": true}"#;
        let why = parse_body::<LeaseRequest>(body, "a lease request", LEASE_FIELDS).unwrap_err();
        assert!(
            why.starts_with(
                "the request body has the unknown field \"wiat\": a lease request takes job_text, "
            ),
            "{why}"
        );
        let ok: LeaseRequest =
            parse_body(&body[..], "x", &["job_text", "job_path", "cwd", "wiat"]).unwrap();
        assert!(!ok.wait);
    }

    #[test]
    fn a_job_id_is_a_string_on_the_wire_and_reads_back() {
        let row = JobRow {
            id: 12,
            name: "j".into(),
            tenant: "t".into(),
            user: "u".into(),
            uid: 1,
            gpus: 1,
            ..JobRow::queued(5)
        };
        let text = serde_json::to_value(Job::from(row)).unwrap();
        assert_eq!(text["id"], "12");
        let back: Job = serde_json::from_value(text).unwrap();
        assert_eq!(back.id, 12);
        let mut number = serde_json::to_value(&back).unwrap();
        number["id"] = 13.into();
        assert_eq!(serde_json::from_value::<Job>(number).unwrap().id, 13);
    }
}
