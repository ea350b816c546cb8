//! What wakes the engine thread: the API, the supervisors' waits, the compiles and the policy
//! workers send it a
//! [`Kick`].

/// What wakes the engine.
#[derive(Debug)]
pub enum Kick {
    /// A job was committed to the queue.
    Submitted(i64),
    /// A running job is to be stopped (its row says so already for a queued one).
    Cancel(i64),
    /// A queued job was cancelled in the database: forget it.
    Dequeued(i64),
    /// A supervisor process ended.
    SupervisorExited,
    /// The process holding lease job `id` released it (`POST /v1/leases/ID/release`).
    Release(i64),
    /// A policy component (its digest, hex) compiled, or failed to.
    PolicyCompiled(String),
    /// A tenant's policy worker answered for a job (crate::core::policy_worker).
    PolicyAnswered,
    /// The daemon stops: the engine thread ends (its jobs run on under their supervisors).
    Stop,
    /// A device's health or drain changed: the jobs running on the GPUs listed are told (an
    /// empty list: a drain or undrain), and a pass runs (crate::core::engine::device_health).
    DeviceHealth(Vec<crate::core::engine::device_health::BecameUnhealthy>),
}
