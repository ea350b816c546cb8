//! How a job flows through orch: [`plan`] asks the job's policy which devices it gets (and why
//! the others not); [`place::claim`] makes that choice a lease in one atomic transaction;
//! [`prepare`] and [`start`] run the job on exactly its devices; [`RunningJob::wait`] waits for
//! it (or [`orch_exec::Stopper`] stops it) and releases the lease through a guard, so no path
//! leaves it held. [`run_placed`] is that run as one call, command or trainer, for every caller
//! that holds a placement: `orch run` and the daemon's supervisor, which runs a `[train]` job's
//! trainer itself on the daemon's placement. [`local`] is the claim a process makes for itself
//! (`orch run`, the Python package) and the quick job both describe.
//!
//! Design decision: the plan is a pure function of its inputs (the job spec, the inventory,
//! the visibility rules' result, the current leases, the environment the job's config names)
//! plus the policy host, and the lifecycle is a library, so `orch plan`, `orch run` and the
//! daemon (`orch serve` and its per-job supervisors) share one path and the CLI only parses and
//! prints.

pub mod bind;
pub mod command;
mod error;
pub mod foreign;
pub mod local;
pub mod place;
pub mod plan;
mod run_placed;
mod runner;
pub mod service;
mod slices;
mod stop;
mod train;

pub use command::{
    GRACE, ProcessOptions, check_enforcement, device_rule, lease_env, lease_env_named, placed_line,
};
pub use error::RunError;
pub use foreign::{Holdings, foreign_processes, holdings};
pub use local::{Claimed, QuickJob, claim_here, may_claim_here};
pub use place::{GiveBack, LeaseGuard, Machine, PlaceError, claim, claim_proposed, claim_until};
pub use plan::{Plan, PlanError, PlanInput, PlannedDevice, Rejection, plan, recheck};
pub use run_placed::{Control, Ended, ProgressLines, Ready, run_placed, trainer_env};
pub use runner::{Outcome, Placement, Prepared, RunningJob, prepare, start};
pub use stop::{JobStopper, Overdue, StopCause, TrainStopper, stopped_sentence};
