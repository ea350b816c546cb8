//! How a job flows through orch: [`plan`] asks the job's policy which devices it gets (and why
//! the others not); leasing, running and releasing follow in later issues.
//!
//! Design decision: the plan is a pure function of its inputs (the job spec, the inventory,
//! the visibility rules' result, the current leases, the environment the job's config names)
//! plus the policy host, so `orch plan`, `orch run` and the daemon share it, and tests drive it
//! with a simulated inventory and hand-made leases.

pub mod plan;

pub use plan::{Plan, PlanError, PlanInput, PlannedDevice, Rejection, plan};
