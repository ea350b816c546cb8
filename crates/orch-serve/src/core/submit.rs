//! Submission: a job file taken into the queue (one job, or a `[sweep]`'s tasks as one job
//! array), or a lease held by a process (`orch.lease()`, `orch alloc`), which is queued as a job
//! that nothing is started for. The HTTP layer parses the request and knows the caller (peer
//! credentials); everything from there to the job's id is here, in this order, the first refusal
//! winning:
//!
//! 1. the state folder takes writes: a job the daemon could not record is not accepted;
//! 2. the job file ([`admit`]): it parses, asks for nothing the inventory cannot enforce, a
//!    `[sweep]` fits the database, and each job (each task) could be started by `execve`;
//! 3. the rules of the machine and the tenant (a [`Ticket`]): no more devices than the daemon
//!    places on; then the tenant the job counts against (one the caller is in), one machine, a
//!    lease not a `[sweep]`; and the tenant's `max_priority`;
//! 4. a file policy's bytes kept and its compile asked for within the tenant's budget;
//! 5. one database transaction ([`enqueue`]): a key seen before answers the job it was accepted
//!    as; the tenant's `max_queued` (for one job, or for an array's tasks together); the jobs it
//!    waits on (each one the caller may see); the job, or every task of the array, inserted with
//!    what it waits on. A refusal inside it writes nothing.
//!
//! Each refusal is an [`admission::Refusal`] with its one sentence; the HTTP layer maps its kind
//! to a status code. `orch simulate` takes a trace line through the same [`Ticket`].

use crate::core::admission::{self, Asked, Refusal};
use crate::core::caller::Caller;
use crate::core::config::{Config, Tenant};
use crate::core::db::{self, Alloc, DbError, JobRow, Submission};
use crate::core::kick::Kick;
use crate::core::state::Shared;
use orch_core::job::Dependencies;
use orch_core::time::now_ms;

/// A submission as the HTTP layer hands it over (`POST /v1/jobs`, `POST /v1/leases`): the job
/// file's text and where it was, the client's working folder and environment, and its options.
#[derive(Debug, Clone, Default)]
pub struct Request {
    pub job_text: String,
    pub job_path: String,
    pub cwd: String,
    pub env: Vec<(String, String)>,
    /// The client's key for this submission: sent again, it answers the job already accepted.
    /// An empty key, or one over 128 bytes, is no key.
    pub key: Option<String>,
    /// A file policy's bytes (base64), as the submitting user read them.
    pub policy_wasm: Option<String>,
    /// A file policy's digest (`sha256:HEX`), uploaded before.
    pub policy_digest: Option<String>,
    /// Dependencies given beside the job file: they add to its `[job]` lists.
    pub depends: Dependencies,
    /// For a lease held by the client's own process: that process (nothing is started).
    pub holder: Option<orch_leases::Holder>,
    /// That lease is an interactive allocation (`orch alloc`).
    pub alloc: Option<Alloc>,
}

/// Why a submission was not taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// A rule refused it: the sentence says what to do.
    Refused(Refusal),
    /// The daemon failed while taking it (a database error that is no full or read-only disk):
    /// not the submitter's doing.
    Failed(String),
}

impl From<Refusal> for Error {
    fn from(refusal: Refusal) -> Error {
        Error::Refused(refusal)
    }
}

/// A submission taken into the queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Accepted {
    /// The job's id; a job array's (its first task's).
    pub id: i64,
    /// Every job queued, in task order; the one job already accepted for a key sent again.
    pub ids: Vec<i64>,
}

/// What the daemon takes jobs on, as admission reads it: its tenants, the devices it places on,
/// the inventory it reads.
#[derive(Debug, Clone, Copy)]
pub struct Terms<'a> {
    pub config: &'a Config,
    /// Devices orch may place on.
    pub placeable: usize,
    pub backend: orch_devices::Backend,
    /// The machine's devices as last read, for a job of MIG slices (the slices of its profile).
    pub devices: &'a [orch_devices::Device],
}

/// A job as the rules of the machine and the tenant weigh it, whoever submits it: [`submit`]
/// takes these steps in this order (with its own checks of the job file between them), and
/// `orch simulate` takes a trace line through them alike, so the two refuse the same jobs.
#[derive(Debug, Clone, Copy)]
pub struct Ticket<'a> {
    pub asked: Asked<'a>,
    /// A job array's task count; `None` for one job.
    pub tasks: Option<u64>,
}

impl Ticket<'_> {
    /// First: at most the devices the daemon places on.
    pub fn fits_machine(&self, placeable: usize) -> Result<(), Refusal> {
        admission::devices(&self.asked, placeable)
    }

    /// Once its tenant is known: at most the tenant's `max_priority` (a tenant the config does
    /// not list has no limits).
    pub fn within_tenant(&self, limits: Option<&Tenant>) -> Result<(), Refusal> {
        match limits {
            Some(limits) => admission::priority(limits, &self.asked),
            None => Ok(()),
        }
    }

    /// Last, against the queue as it stands (inside the transaction that inserts): room under
    /// the tenant's `max_queued` for the job, or for every task of the array together.
    pub fn fits_queue(&self, limits: Option<&Tenant>, queued: u64) -> Result<(), Refusal> {
        fits_queue(limits, queued, self.tasks)
    }

    /// The three in order, for a submission with nothing to check between them: a trace line of
    /// `orch simulate`, whose tenant and dependencies are known good.
    pub fn admit(&self, limits: &Tenant, placeable: usize, queued: u64) -> Result<(), Refusal> {
        self.fits_machine(placeable)?;
        self.within_tenant(Some(limits))?;
        self.fits_queue(Some(limits), queued)
    }
}

/// [`Ticket::fits_queue`] without the rest of the ticket (the transaction holds no borrow).
fn fits_queue(limits: Option<&Tenant>, queued: u64, tasks: Option<u64>) -> Result<(), Refusal> {
    match (limits, tasks) {
        (None, _) => Ok(()),
        (Some(limits), None) => admission::queue(limits, queued),
        (Some(limits), Some(tasks)) => admission::array_queue(limits, queued, tasks),
    }
}

/// A submission that passed every rule but the queue's: what the transaction inserts.
#[derive(Debug, Clone)]
pub struct Admitted {
    /// The job as parsed (an array's whole `[sweep]`).
    pub spec: orch_core::JobSpec,
    /// The row each job gets (tenant, user, name, devices, priority).
    pub row: JobRow,
    /// What starting it needs; its `policy_file` is set once the file policy is kept.
    pub submission: Submission,
    /// A job array's task count (`[sweep]`); `None` for one job.
    pub tasks: Option<u32>,
    /// The tenant's limits, when the config lists it.
    pub limits: Option<Tenant>,
    /// What it waits on: the job file's `[job]` lists with the request's.
    pub depends: Dependencies,
    /// The client's key, when usable.
    pub key: Option<String>,
}

impl Admitted {
    /// The jobs to insert: the one submission, or one per task, each naming its combination of
    /// the `[sweep]`.
    pub fn submissions(&self) -> Vec<Submission> {
        match self.tasks {
            None => vec![self.submission.clone()],
            Some(tasks) => (0..tasks)
                .map(|task| Submission {
                    sweep_task: Some(task),
                    ..self.submission.clone()
                })
                .collect(),
        }
    }
}

/// Checks a submission (the job file, the tenant and its limits), commits it to the queue and
/// wakes the engine: steps 1 to 5 of this module, then the submission counted in `/metrics`.
pub async fn submit(
    shared: &Shared,
    caller: &Caller,
    mut request: Request,
) -> Result<Accepted, Error> {
    // A job the daemon cannot record is not accepted: 503 with the sentence, never a 201 for
    // a job that would then be lost.
    if let Some(refusal) = shared.health.refusal() {
        return Err(Refusal::Unavailable(refusal).into());
    }
    let inventory = orch_core::sync::lock(&shared.machine).inventory.clone();
    let terms = Terms {
        config: &shared.config,
        placeable: shared.visible_devices,
        devices: &inventory.devices,
        backend: shared.backend,
    };
    // The policy's bytes (up to 16 MiB) are kept as a file, not in the job's row.
    let (wasm, digest) = (request.policy_wasm.take(), request.policy_digest.take());
    let mut admitted = admit(&terms, caller, request)?;
    admitted.submission.policy_file = policy_file(
        shared,
        &admitted.row.tenant,
        &admitted.spec,
        wasm,
        digest.as_deref(),
    )
    .await?;
    let tenant = admitted.row.tenant.clone();
    let asker = caller.clone();
    // An array's copies (up to 64 MiB of text and environment) are made here, not on the
    // database's writer thread, which every write of the daemon waits behind.
    let tasks = match admitted.tasks {
        Some(_) => admitted.submissions(),
        None => Vec::new(),
    };
    let ids = shared
        .db
        .write_value(move |tx| enqueue(tx, &admitted, &tasks, &asker))
        .await
        .map_err(|e| match e.fault() {
            Some(fault) => {
                shared.health.report(fault, e.to_string());
                let refusal = shared.health.refusal().unwrap_or_else(|| e.to_string());
                Error::Refused(Refusal::Unavailable(refusal))
            }
            None => Error::Failed(e.to_string()),
        })??;
    let Some(&id) = ids.first() else {
        return Err(Error::Failed(
            "the job database answered a submission with no job id".into(),
        ));
    };
    for &id in &ids {
        shared.metrics.submitted(&tenant);
        shared.kick(Kick::Submitted(id));
    }
    Ok(Accepted { id, ids })
}

/// Steps 2 and 3: the job file, the machine and the tenant, none of which needs the queue.
pub fn admit(terms: &Terms<'_>, caller: &Caller, request: Request) -> Result<Admitted, Refusal> {
    let spec = orch_core::job::parse(std::path::Path::new(&request.job_path), &request.job_text)
        .map_err(|e| Refusal::Invalid(e.to_string()))?;
    orch_runner::check_enforcement(&spec, terms.backend).map_err(Refusal::Invalid)?;
    if !spec.sweep.is_empty() {
        let each = request.job_text.len()
            + request.job_path.len()
            + request.cwd.len()
            + request
                .env
                .iter()
                .map(|(k, v)| k.len() + v.len() + 8)
                .sum::<usize>();
        admission::array_size(&request.job_path, spec.sweep.len() as u64, each as u64)?;
    }
    // A `[sweep]` is a job array: one job per combination, each checked as it will run.
    let tasks: Vec<orch_core::JobSpec> = if spec.sweep.is_empty() {
        vec![spec.clone()]
    } else {
        (0..spec.sweep.len())
            .map_while(|task| spec.sweep_task(task))
            .collect()
    };
    for one in &tasks {
        exec_parts(&request, one)?;
    }
    let array = (!spec.sweep.is_empty()).then_some(tasks.len() as u32);
    let gpus_at = spec.resources.gpus_at.to_string();
    let ticket = Ticket {
        asked: Asked {
            place: &request.job_path,
            gpus_at: &gpus_at,
            gpus: spec.resources.gpus,
            priority: spec.priority,
        },
        tasks: array.map(u64::from),
    };
    match spec.resources.mig.as_deref() {
        Some(profile) => admission::slices(&ticket.asked, profile, terms.devices)?,
        None => ticket
            .fits_machine(terms.placeable)
            .map_err(|refusal| admission::with_slices_hint(refusal, terms.devices))?,
    }
    let tenant = caller.tenant_for(
        terms.config,
        spec.tenant.as_deref(),
        Some(&request.job_path),
    )?;
    if spec.resources.nodes > 1 {
        return Err(Refusal::Invalid(format!(
            "{}: nodes = {} is for Slurm: this daemon serves one machine; submit it with `orch submit --slurm`",
            request.job_path, spec.resources.nodes
        )));
    }
    if !spec.sweep.is_empty() && request.holder.is_some() {
        return Err(Refusal::Invalid(format!(
            "{}: a lease is one job, not a [sweep]: leave out [sweep], or submit the sweep with `orch submit`",
            request.job_path
        )));
    }
    let limits = terms.config.tenant(&tenant).cloned();
    ticket.within_tenant(limits.as_ref())?;
    let row = JobRow {
        name: spec.name.clone(),
        tenant,
        user: caller.identity.name.clone(),
        uid: caller.identity.uid,
        gpus: spec.resources.gpus,
        priority: spec.priority,
        requeue: spec.requeue,
        ..JobRow::queued(now_ms())
    };
    let depends = spec.depends.merged(&request.depends);
    let key = request.key.filter(|k| !k.is_empty() && k.len() <= 128);
    let submission = Submission {
        job_text: request.job_text,
        job_path: request.job_path,
        cwd: request.cwd,
        env: request.env,
        identity: caller.identity.clone(),
        policy_file: None,
        holder: request.holder,
        alloc: request.alloc,
        sweep_task: None,
    };
    Ok(Admitted {
        spec,
        row,
        submission,
        tasks: array,
        limits,
        depends,
        key,
    })
}

/// Checks the program, arguments and environment one job (or one task of an array) will be
/// started with against what `execve` takes.
fn exec_parts(request: &Request, spec: &orch_core::JobSpec) -> Result<(), Refusal> {
    let no_env = std::collections::BTreeMap::new();
    // A [train] job's trainer runs in its supervisor, or in a process of its own started with
    // the submitting environment (see supervisor.rs): only that environment is checked.
    let (argv, job_env): (&[String], _) = match &spec.work {
        orch_core::job::Work::Command(c) => (&c.argv, &c.env),
        orch_core::job::Work::Train(_) => (&[], &no_env),
    };
    admission::exec_parts(&admission::ExecParts {
        place: &request.job_path,
        argv,
        job_env,
        client_env: &request.env,
        cwd: &request.cwd,
    })
}

/// Step 4: a job's file policy, its digest (`digest`, uploaded before) or its bytes (`wasm`,
/// base64, within the old limit), kept; then compiled for `tenant` within its budget. Returns
/// the digest (hex), or `None` for a built-in policy.
async fn policy_file(
    shared: &Shared,
    tenant: &str,
    spec: &orch_core::JobSpec,
    wasm: Option<String>,
    digest: Option<&str>,
) -> Result<Option<String>, Error> {
    let orch_core::PluginRef::Path(plugin) = &spec.policy.plugin else {
        return Ok(None);
    };
    let at = spec.policy.plugin_at.to_string();
    let invalid = |why: String| Error::Refused(Refusal::Invalid(why));
    let hex = match (digest, wasm) {
        (Some(digest), _) => {
            let hex = crate::core::compile::parse_digest(digest)
                .map_err(|e| invalid(format!("{at}: policy_digest {e}")))?;
            if tokio::fs::metadata(shared.compiler.source(&hex))
                .await
                .is_err()
            {
                return Err(invalid(format!(
                    "{at}: {}",
                    crate::core::compile::no_such(&hex)
                )));
            }
            hex
        }
        (None, Some(text)) => {
            let state_dir = shared.state_dir.clone();
            tokio::task::spawn_blocking(move || {
                crate::core::compile::store_policy(&state_dir, &text)
            })
            .await
            .map_err(|e| Error::Failed(e.to_string()))?
            .map_err(|e| invalid(format!("{at}: {e}")))?
        }
        (None, None) => {
            return Err(invalid(format!(
                "{at}: the policy {} came without its bytes; submit with `orch submit` (which sends them)",
                plugin.display()
            )));
        }
    };
    let bytes = tokio::fs::metadata(shared.compiler.source(&hex))
        .await
        .map_or(0, |m| m.len());
    let budget = shared
        .config
        .tenant(tenant)
        .map(|t| t.compile)
        .unwrap_or_default();
    shared
        .compiler
        .request(&hex, tenant, Some(&budget), bytes)
        .map_err(|e| Error::Refused(Refusal::OverLimit(e)))?;
    Ok(Some(hex))
}

/// Step 5, inside the write transaction `tx`: the job, or every task of the array, inserted with
/// what it waits on, or a refusal and nothing written. The limit is checked in the same
/// transaction as the insert, so concurrent submissions cannot overshoot it. `caller`: who
/// submits (which jobs it may wait on); `submissions`: an array's tasks
/// ([`Admitted::submissions`]), made before the transaction, empty for one job.
pub fn enqueue(
    tx: &rusqlite::Transaction<'_>,
    admitted: &Admitted,
    submissions: &[Submission],
    caller: &Caller,
) -> Result<Result<Vec<i64>, Refusal>, DbError> {
    let key = admitted.key.as_deref();
    // A submission sent again (its answer lost in a restart) is the job already taken.
    if let Some(id) = db::job_with_key(tx, key)? {
        return Ok(Ok(vec![id]));
    }
    let row = &admitted.row;
    let queued = match &admitted.limits {
        Some(_) => db::queued_in(tx, &row.tenant)?,
        None => 0,
    };
    let tasks = admitted.tasks.map(u64::from);
    if let Err(refusal) = fits_queue(admitted.limits.as_ref(), queued, tasks) {
        return Ok(Err(refusal));
    }
    let waits = match waits(tx, admitted, caller)? {
        Ok(waits) => waits,
        Err(refusal) => return Ok(Err(refusal)),
    };
    // An array's tasks each wait for what the array waits for.
    let ids = match admitted.tasks {
        None => vec![db::insert_job(tx, row, &admitted.submission, key)?],
        Some(_) => db::insert_array(tx, row, submissions, admitted.spec.sweep.max_parallel, key)?,
    };
    for &id in &ids {
        db::insert_dependencies(tx, id, &waits)?;
    }
    Ok(Ok(ids))
}

/// What a new job waits for, as the database keeps it: every job it names exists now (so its
/// id is below this job's) and is the caller's to see; another tenant's is refused as an unknown
/// one is. A job array's id stands for every task of it, as with Slurm's `afterok:ARRAY`.
fn waits(
    tx: &rusqlite::Transaction<'_>,
    admitted: &Admitted,
    caller: &Caller,
) -> Result<Result<Dependencies, Refusal>, DbError> {
    let place = &admitted.submission.job_path;
    let depends = &admitted.depends;
    let mut waits = Dependencies {
        singleton: depends.singleton,
        ..Default::default()
    };
    for (kind, on) in depends.pairs() {
        let known = db::job_in(tx, on)?;
        let Some(known) = known.filter(|r| caller.sees(r)) else {
            return Ok(Err(Refusal::NotFound(format!(
                "{place}: {kind} names job {on}, and there is no job {on} you may see (orch jobs --all lists yours)"
            ))));
        };
        let tasks = match known.array {
            Some(a) if a.id == on => db::array_task_ids(tx, on)?,
            _ => vec![on],
        };
        if kind == "after_failed" && tasks.len() > 1 {
            return Ok(Err(Refusal::Invalid(format!(
                "{place}: after_failed names job array {on}, whose tasks may end some one way and some the other; name the task to wait for ({on}[N] is shown with its job id by orch status), or use after_any"
            ))));
        }
        let list = match kind {
            "after_ok" => &mut waits.after_ok,
            "after_any" => &mut waits.after_any,
            _ => &mut waits.after_failed,
        };
        for id in tasks {
            if !list.contains(&id) {
                list.push(id);
            }
        }
    }
    Ok(Ok(waits))
}

#[cfg(test)]
mod tests;
