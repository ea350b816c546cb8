//! The lease store: which job holds which devices, claimed atomically across processes.
//!
//! Design decision: SQLite (bundled, so nothing to install) in WAL mode, one file under the state
//! folder. A claim reads the current leases, lets the caller choose devices (the policy runs here)
//! and writes the new lease inside one `BEGIN IMMEDIATE` transaction: SQLite's reserved lock is
//! held from the read to the write, so two `orch` processes started at the same moment can never
//! both see a device free and both take it. The journal makes a claim survive a crash of the
//! writer, readers never block, and the multi-tenant daemon reuses the same engine. An
//! `flock`-guarded JSON file would give the same exclusion but a hand-rolled rewrite-and-rename for
//! durability and no queries.
//!
//! Liveness: a lease names its holders (the `orch` process and the processes it started), each
//! as pid plus process start time. When none of them is alive any more (pid gone, or reused by a
//! process with another start time), the next reader deletes the lease. A holder whose `/proc`
//! entry cannot be read for another reason (no file descriptor left, say) is neither: its
//! liveness is unknown, and an unknown holder is never reclaimed.

mod authority;
mod holder;
pub mod sql;
mod store;

pub use authority::{
    DaemonSocket, Found, MACHINE_SOCKET, OWNER_FILE, Owner, answers, find_daemon, find_daemon_with,
    refuse_local_claim, refuse_local_claim_at,
};
pub use holder::{Holder, Liveness, this_boot, this_machine};
pub use store::{
    ClaimError, ClaimRequest, DeviceMark, Lease, LeaseError, LeaseStore, MarkKind, default_socket,
    default_state_dir,
};
