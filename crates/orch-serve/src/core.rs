//! The daemon's domain, which knows no HTTP: its state ([`state`]), the job database ([`db`]),
//! per-job accounting ([`accounting`]), the job folders and their files ([`folders`]), admission ([`admission`]) and submission ([`submit`]), the engine that
//! places and watches jobs ([`engine`]) with the scheduler ([`sched`]) and the queue policy
//! ([`queue_policy`]), the compiles of tenants' policies ([`compile`]) and the workers that ask them
//! ([`policy_worker`]), the config, the users,
//! the read model the API shows ([`view`]), the metrics registry ([`metrics`]) and the last hours
//! of devices and queue the page charts ([`timeline`]).
//!
//! Nothing here imports axum or hyper: [`crate::http`] and [`crate::web`] call into this layer,
//! never the other way round.

pub mod accounting;
pub mod admission;
pub mod caller;
pub mod compile;
pub mod config;
pub mod db;
pub mod engine;
pub mod folders;
pub mod health;
pub mod holders;
pub mod kick;
pub mod metrics;
pub mod policy_worker;
pub mod queue_policy;
pub mod sched;
pub mod slices;
pub mod state;
pub mod submit;
pub mod timeline;
pub mod users;
pub mod view;
