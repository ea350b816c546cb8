//! `orch serve`: one daemon per GPU machine that owns its devices for many people. Users submit
//! jobs over a Unix socket (peer credentials say who they are); the daemon keeps every accepted
//! job in SQLite, places queued jobs with their own placement policy and the same lease store
//! `orch run` uses, and starts each through a supervisor process as its submitting user.
//!
//! Design decision: the daemon never is the parent that a job's exit status depends on. Each job
//! has a supervisor (`orch __supervise DIR`) that waits for it and writes its exit record to the
//! job's folder, as slurmstepd and containerd's shims do; a fence file decides, once and for all,
//! whether a job was started. So the daemon can be killed at any moment: on restart it adopts what
//! runs, finishes what ended, and queues again what never started, and no job runs twice.
//!
//! Inside, three layers with one direction: [`core`] (the domain: state, database, job folders,
//! admission, engine, scheduler; no HTTP), [`http`] (the API for callers: wire types, handlers,
//! the status of each refusal) and [`web`] (the browser's sessions and page). web uses http and
//! core, http uses core, and [`server`] composes them on the daemon's listeners. The per-job
//! [`supervisor`] and `orch simulate` ([`simulate`]) use core alone.

pub mod core;
pub mod http;
pub mod server;
pub mod simulate;
pub mod supervisor;
pub mod web;

pub use crate::core::config::Config;
pub use crate::core::db::{JobRow, State};
pub use http::wire::{
    Accounting, ArraySummary, ErrorBody, HistoryJob, HistorySummary, Job, SubmitRequest,
    SubmitResponse, TenantRow,
};
pub use server::{ServeError, ServeOptions, default_socket, serve};
pub use supervisor::supervise;
