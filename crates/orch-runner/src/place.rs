//! Plan and claim in one lease transaction, and the guard that releases the lease.

use crate::plan::{Plan, PlanError, PlanInput};
use orch_core::{ByteSize, JobSpec};
use orch_devices::{Inventory, Visibility};
use orch_host::PolicyHost;
use orch_leases::{ClaimError, ClaimRequest, Holder, Lease, LeaseError, LeaseStore};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Why a job holds no lease.
#[derive(Debug, thiserror::Error)]
pub enum PlaceError {
    /// The job file asks for the impossible or names an unusable policy (exit 2).
    #[error(transparent)]
    BadInput(PlanError),
    /// Nothing fits now: the policy's refusal, or a conflict with a lease taken meanwhile.
    #[error("{0}")]
    NoFit(String),
    /// The policy failed (a trap, a wrong answer).
    #[error(transparent)]
    Policy(PlanError),
    #[error(transparent)]
    Store(#[from] LeaseError),
    #[error("gave up waiting after {waited:?}: {reason}")]
    GaveUp { waited: Duration, reason: String },
}

/// What placement needs of the machine.
pub struct Machine<'a> {
    pub inventory: &'a Inventory,
    pub visibility: &'a Visibility,
    /// Reads the environment variables a policy's config names (`var`).
    pub env: &'a dyn Fn(&str) -> Option<String>,
    /// Claims may be made inside the lease of the job this process runs in (`orch run` inside a
    /// job). False for the daemon, which claims for others: their environment is theirs.
    pub nested: bool,
}

impl std::fmt::Debug for Machine<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Machine")
            .field("devices", &self.inventory.devices.len())
            .finish_non_exhaustive()
    }
}

/// A lease, released when dropped (or by [`LeaseGuard::release`]): no path leaves it held.
#[derive(Debug)]
pub struct LeaseGuard {
    state_dir: PathBuf,
    lease: Lease,
    released: bool,
    /// One connection to the store for the guard's life (opened on first use).
    store: std::sync::Mutex<Option<LeaseStore>>,
    /// False for a lease held by the daemon that granted it (see [`LeaseGuard::granted`]).
    managed: bool,
    /// How a lease granted by a daemon is given back.
    give_back: std::sync::Mutex<Option<GiveBack>>,
}

/// Gives a daemon's lease back (`POST /v1/leases/ID/release`); called once.
pub struct GiveBack(pub Box<dyn FnOnce(&Lease) + Send>);

impl std::fmt::Debug for GiveBack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("GiveBack")
    }
}

impl LeaseGuard {
    pub fn new(state_dir: PathBuf, lease: Lease) -> LeaseGuard {
        LeaseGuard {
            state_dir,
            lease,
            released: false,
            store: std::sync::Mutex::new(None),
            managed: true,
            give_back: std::sync::Mutex::new(None),
        }
    }

    /// A lease a daemon granted: the daemon knows its holder (this process) and watches it;
    /// `give_back` returns it when the job ends. No local store is touched.
    pub fn granted(lease: Lease, give_back: GiveBack) -> LeaseGuard {
        LeaseGuard {
            state_dir: PathBuf::new(),
            lease,
            released: false,
            store: std::sync::Mutex::new(None),
            managed: false,
            give_back: std::sync::Mutex::new(Some(give_back)),
        }
    }

    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    fn with_store(
        &self,
        f: impl FnOnce(&mut LeaseStore) -> Result<(), LeaseError>,
    ) -> Result<(), LeaseError> {
        if !self.managed {
            return Ok(());
        }
        let mut slot = orch_core::sync::lock(&self.store);
        if slot.is_none() {
            *slot = Some(LeaseStore::open(&self.state_dir)?);
        }
        match slot.as_mut() {
            Some(store) => f(store),
            None => Err(LeaseError::NotFound(self.lease.id.clone())),
        }
    }

    /// Adds a holder to the lease, which must still exist: a process that takes over a lease
    /// claimed by another (the daemon's supervisor) joins it before it starts anything, and finds
    /// out here if the lease was reclaimed meanwhile.
    pub fn join(&self, holder: Holder) -> Result<(), LeaseError> {
        self.with_store(|store| store.add_holder(&self.lease.id, holder))
    }

    /// Adds a holder (a process of the job) to the lease.
    pub fn add_holder(&self, holder: Holder) {
        let pid = holder.pid;
        if let Err(e) = self.with_store(|store| store.add_holder(&self.lease.id, holder)) {
            tracing::warn!(
                "could not record pid {pid} as a holder of lease {}: {e}",
                self.lease.id
            );
        }
    }

    /// Releases the lease now.
    pub fn release(mut self) {
        self.release_once();
    }

    /// Keeps the lease held past this guard (a supervisor that releases it takes over).
    pub fn keep(mut self) -> Lease {
        self.released = true;
        self.lease.clone()
    }

    fn release_once(&mut self) {
        if std::mem::replace(&mut self.released, true) {
            return;
        }
        if let Some(give_back) = orch_core::sync::lock(&self.give_back).take() {
            (give_back.0)(&self.lease);
            return;
        }
        // The claimer(s) and this process give up their hold; a process of the job that is still
        // alive (stuck in the driver past SIGKILL) keeps the lease until it ends.
        let mut watchers = self.lease.holders.clone();
        watchers.push(Holder::current());
        let result = self.with_store(|store| {
            if !store.release_unless_held(&self.lease.id, &watchers)? {
                tracing::warn!(
                    "lease {} stays held: a process of the job still runs; its devices are free once it ends",
                    self.lease.id
                );
            }
            Ok(())
        });
        if let Err(e) = result {
            tracing::warn!(
                "could not release lease {}: {e} (the next orch reclaims it once the job's processes are gone)",
                self.lease.id
            );
        }
    }
}

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        self.release_once();
    }
}

/// One attempt: plan and claim in one transaction of `store`.
pub fn claim(
    store: &mut LeaseStore,
    host: &mut PolicyHost,
    job: &JobSpec,
    machine: &Machine<'_>,
    holder: Holder,
) -> Result<(Lease, Plan), PlaceError> {
    claim_planned(
        store,
        job,
        machine,
        holder,
        |input| crate::plan(input, host, machine.env),
        |e: PlanError| {
            if e.is_bad_input() {
                PlaceError::BadInput(e)
            } else if is_no_fit(&e) {
                PlaceError::NoFit(e.to_string())
            } else {
                PlaceError::Policy(e)
            }
        },
    )
}

/// Claims the devices of `proposal`, a plan the job's policy made earlier on a snapshot of the
/// machine (the daemon asks a tenant's policy away from the pass that places everyone), in one
/// transaction of `store`: inside it the plan is checked against the leases held now
/// ([`crate::plan::recheck`]) and written, so one device still goes to one job. The policy is
/// not run. `Err(PlaceError::NoFit)`: the snapshot went stale (a device it chose was taken
/// meanwhile, or no longer fits): ask the policy again.
pub fn claim_proposed(
    store: &mut LeaseStore,
    job: &JobSpec,
    machine: &Machine<'_>,
    holder: Holder,
    proposal: &Plan,
) -> Result<(Lease, Plan), PlaceError> {
    claim_planned(
        store,
        job,
        machine,
        holder,
        |input| crate::plan::recheck(input, proposal, machine.env),
        PlaceError::NoFit,
    )
}

/// The lease transaction [`claim`] and [`claim_proposed`] share: inside it `make` plans on the
/// leases held now and the plan's devices are written; `choose_failed` says what `make`'s
/// error means.
fn claim_planned<E: std::fmt::Display>(
    store: &mut LeaseStore,
    job: &JobSpec,
    machine: &Machine<'_>,
    holder: Holder,
    make: impl FnOnce(PlanInput<'_>) -> Result<Plan, E>,
    choose_failed: impl FnOnce(E) -> PlaceError,
) -> Result<(Lease, Plan), PlaceError> {
    let enclosing = enclosing_lease(store, machine);
    let request = ClaimRequest {
        job_name: job.name.clone(),
        exclusive: job.resources.exclusive,
        memory_reserved_bytes: job.resources.memory_limit.map_or(0, ByteSize::bytes),
        holder,
        inside: enclosing.as_ref().map(|l| l.id.clone()),
    };
    // The enclosing job's own devices: its drains do not stop it (running jobs finish).
    let own: &[String] = enclosing.as_ref().map_or(&[], |l| l.devices.as_slice());
    let mut planned: Option<Plan> = None;
    // Drains and recorded health are read in the claim's transaction, with the leases.
    let claimed = store.claim_marked(&request, |leases, marks| {
        let marks = crate::service::for_claim_inside(marks, own, &machine.inventory.devices);
        let devices = crate::service::with_marks(&machine.inventory.devices, &marks);
        let input = PlanInput {
            job,
            devices: &devices,
            visibility: machine.visibility,
            leases,
        };
        let plan = make(input)?;
        let uuids = plan.chosen.iter().map(|d| d.uuid.clone()).collect();
        planned = Some(plan);
        Ok::<_, E>(uuids)
    });
    match claimed {
        Ok(lease) => match planned {
            Some(plan) => Ok((lease, plan)),
            None => Err(PlaceError::NoFit("the plan was lost".into())),
        },
        Err(ClaimError::Choose(e)) => Err(choose_failed(e)),
        Err(ClaimError::Store(e)) => Err(PlaceError::Store(e)),
        Err(conflict @ ClaimError::Conflict { .. }) => Err(PlaceError::NoFit(conflict.to_string())),
    }
}

/// Claims, and with `wait` retries (backing off, saying why once per new reason) until a fit
/// appears or the deadline passes.
pub fn claim_until(
    store: &mut LeaseStore,
    host: &mut PolicyHost,
    job: &JobSpec,
    machine: &Machine<'_>,
    wait: Option<Instant>,
) -> Result<(Lease, Plan), PlaceError> {
    let started = Instant::now();
    let mut delay = Duration::from_millis(50);
    let mut last_reason = String::new();
    loop {
        let reason = match claim(store, host, job, machine, Holder::current()) {
            Err(PlaceError::NoFit(reason)) => reason,
            other => return other,
        };
        let Some(deadline) = wait else {
            return Err(PlaceError::NoFit(reason));
        };
        if Instant::now() + delay > deadline {
            return Err(PlaceError::GaveUp {
                waited: started.elapsed(),
                reason,
            });
        }
        if reason != last_reason {
            tracing::info!("waiting: {reason}");
            last_reason = reason;
        }
        std::thread::sleep(delay + jitter());
        delay = (delay * 3 / 2).min(Duration::from_secs(2));
    }
}

/// The lease of the job this process runs in (`ORCH_JOB_ID`, as orch sets it for every job),
/// when that lease is live in this store and this process really is part of its job: then a claim
/// is made inside it, on its devices (an `orch run` inside an `orch submit` job). A variable
/// naming someone else's lease is ignored.
fn enclosing_lease(store: &mut LeaseStore, machine: &Machine<'_>) -> Option<Lease> {
    if !machine.nested {
        return None;
    }
    let id = (machine.env)("ORCH_JOB_ID").filter(|id| !id.is_empty())?;
    let leases = store.active().ok()?;
    let lease = leases.into_iter().find(|l| l.id == id)?;
    lease.contains_process(std::process::id()).then_some(lease)
}

fn is_no_fit(e: &PlanError) -> bool {
    matches!(e, PlanError::Policy(p) if p.refusal().is_some_and(|(kind, _)| kind == orch_host::RefusalKind::NoFit))
}

/// Up to 50 ms, different in every process, so waiters do not retry in lockstep.
fn jitter() -> Duration {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    Duration::from_millis(u64::from((nanos ^ std::process::id()) % 50))
}
