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

pub mod admission;
pub mod api;
pub mod compile;
pub mod config;
pub mod conns;
pub mod db;
pub mod engine;
pub mod health;
pub mod leases;
mod logs;
pub mod metrics;
pub mod queue_policy;
pub mod sched;
pub mod server;
pub mod simulate;
pub mod supervisor;
pub mod users;
pub mod view;
pub mod web;

pub use api::{ErrorBody, SubmitRequest, SubmitResponse, TenantRow};
pub use config::Config;
pub use db::{JobRow, State};
pub use server::{ServeError, ServeOptions, default_socket, serve};
pub use supervisor::supervise;
