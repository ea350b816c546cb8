//! The native half of the Python package `orch` (`orch._native`): the inventory, dry-run plans
//! and leases, through the same library (`orch-runner`) that `orch plan` and `orch run` use, so
//! a lease taken from Python and one taken by `orch run` never share an exclusive device.
//!
//! Design decisions:
//! - The lease's holder is the Python process itself (pid and start time): it is reclaimed like
//!   any other when the process dies, and a notebook kernel holds it until it is restarted or the
//!   lease released. A forked child (a DataLoader worker) never releases its parent's lease.
//! - Data crosses into Python as plain dicts and lists (and requests come in as one), which the
//!   pure-Python layer (`orch/__init__.py`) turns into dataclasses: one small, stable surface
//!   instead of a class per record, and no `json` import on the way.
//! - Waiting (`wait=True`) is a loop in Python around one attempt here, so Ctrl-C interrupts it
//!   and other threads run; each attempt releases the GIL.
//! - The daemon path (`orch serve`) is the Python layer's: HTTP over the daemon's socket. This
//!   module only writes the request as a job file's text for it.

mod request;

use orch_devices::{Inventory, InventorySpec, Visibility, VisibilityEnv};
use orch_host::PolicyHost;
use orch_leases::{Lease, LeaseStore};
use orch_runner::{LeaseGuard, PlaceError, Placement, Plan, PlanError, PlanInput};
use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use request::Request;
use std::sync::Mutex;

create_exception!(
    orch,
    OrchError,
    PyException,
    "Every error orch raises: one sentence saying what was wrong and what to do."
);
create_exception!(
    orch,
    NoFit,
    OrchError,
    "No device fits the request now (the policy's reason), or waiting for one gave up."
);
create_exception!(
    orch,
    BadRequest,
    OrchError,
    "The request cannot be met as asked: a bad keyword, more GPUs than exist, an unknown policy or inventory."
);
create_exception!(
    orch,
    PluginError,
    OrchError,
    "The placement policy failed (a trap, a deadline, a wrong answer)."
);

/// Why a call failed, by the exception it becomes.
#[derive(Debug)]
enum Failure {
    BadRequest(String),
    NoFit(String),
    Plugin(String),
    Other(String),
}

impl From<Failure> for PyErr {
    fn from(f: Failure) -> PyErr {
        match f {
            Failure::BadRequest(m) => BadRequest::new_err(m),
            Failure::NoFit(m) => NoFit::new_err(m),
            Failure::Plugin(m) => PluginError::new_err(m),
            Failure::Other(m) => OrchError::new_err(m),
        }
    }
}

impl From<PlaceError> for Failure {
    fn from(e: PlaceError) -> Failure {
        match e {
            PlaceError::BadInput(e) => Failure::BadRequest(e.to_string()),
            PlaceError::NoFit(reason) => Failure::NoFit(reason),
            PlaceError::Policy(e) => Failure::Plugin(e.to_string()),
            e @ PlaceError::GaveUp { .. } => Failure::NoFit(e.to_string()),
            PlaceError::Store(e) => Failure::Other(e.to_string()),
        }
    }
}

fn plan_failure(e: PlanError) -> Failure {
    if e.is_bad_input() {
        return Failure::BadRequest(e.to_string());
    }
    let no_fit = matches!(&e, PlanError::Policy(p)
        if p.refusal().is_some_and(|(kind, _)| kind == orch_host::RefusalKind::NoFit));
    if no_fit {
        Failure::NoFit(e.to_string())
    } else {
        Failure::Plugin(e.to_string())
    }
}

/// The inventory `spec` names (`auto`, `nvml`, `cpu`, `sim:PATH`), as `--devices` reads it.
fn inventory(spec: &str) -> Result<Inventory, Failure> {
    load(&inventory_spec(spec)?)
}

fn load(spec: &InventorySpec) -> Result<Inventory, Failure> {
    Inventory::load(spec).map_err(|e| Failure::BadRequest(e.to_string()))
}

fn inventory_spec(spec: &str) -> Result<InventorySpec, Failure> {
    spec.parse::<InventorySpec>()
        .map_err(|e| Failure::BadRequest(format!("devices= / ORCH_DEVICES: {e}")))
}

fn visibility(inventory: &Inventory) -> Visibility {
    Visibility::resolve(&inventory.devices, &VisibilityEnv::from_process())
}

/// One policy host per process: the engine is made once, and compiled policies come from the
/// on-disk cache (`~/.cache/orch`) after the first use on this machine.
static HOST: Mutex<Option<PolicyHost>> = Mutex::new(None);

fn with_host<T>(f: impl FnOnce(&mut PolicyHost) -> Result<T, Failure>) -> Result<T, Failure> {
    let mut slot = orch_core::sync::lock(&HOST);
    if slot.is_none() {
        // The default limits, as `orch` uses them; a job's own bounds apply per plan.
        *slot = Some(
            PolicyHost::new(orch_host::Limits::default())
                .map_err(|e| Failure::Other(e.to_string()))?,
        );
    }
    match slot.as_mut() {
        Some(host) => f(host),
        None => Err(Failure::Other("the policy host could not be made".into())),
    }
}

fn parse_request(request: &Bound<'_, PyAny>) -> Result<Request, Failure> {
    serde_json::from_value(from_py(request)?)
        .map_err(|e| Failure::BadRequest(format!("bad request: {e}")))
}

/// JSON data as Python objects (dicts, lists, str, int, float, bool, None): no `json` module to
/// import on the Python side, which keeps `import orch` cheap.
fn to_py<'py>(py: Python<'py>, value: &serde_json::Value) -> PyResult<Bound<'py, PyAny>> {
    use pyo3::types::{PyDict, PyList};
    Ok(match value {
        serde_json::Value::Null => py.None().into_bound(py),
        serde_json::Value::Bool(b) => pyo3::types::PyBool::new(py, *b).to_owned().into_any(),
        serde_json::Value::Number(n) => match (n.as_u64(), n.as_i64(), n.as_f64()) {
            (Some(u), _, _) => u.into_pyobject(py)?.into_any(),
            (None, Some(i), _) => i.into_pyobject(py)?.into_any(),
            (None, None, f) => f.unwrap_or(f64::NAN).into_pyobject(py)?.into_any(),
        },
        serde_json::Value::String(t) => t.into_pyobject(py)?.into_any(),
        serde_json::Value::Array(items) => {
            let list = PyList::empty(py);
            for item in items {
                list.append(to_py(py, item)?)?;
            }
            list.into_any()
        }
        serde_json::Value::Object(map) => {
            let dict = PyDict::new(py);
            for (k, v) in map {
                dict.set_item(k, to_py(py, v)?)?;
            }
            dict.into_any()
        }
    })
}

/// A request as the Python layer builds it (a dict of plain values) as JSON data.
fn from_py(value: &Bound<'_, PyAny>) -> Result<serde_json::Value, Failure> {
    use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};
    if value.is_none() {
        return Ok(serde_json::Value::Null);
    }
    if let Ok(b) = value.cast::<PyBool>() {
        return Ok(b.is_true().into());
    }
    if value.is_instance_of::<PyInt>() {
        return match value.extract::<i64>() {
            Ok(i) => Ok(i.into()),
            Err(_) => value
                .extract::<u64>()
                .map(Into::into)
                .map_err(|_| Failure::BadRequest(format!("{value} is far too large"))),
        };
    }
    if let Ok(f) = value.cast::<PyFloat>() {
        return Ok(f.value().into());
    }
    if let Ok(t) = value.cast::<PyString>() {
        return Ok(t.to_string_lossy().into_owned().into());
    }
    if let Ok(d) = value.cast::<PyDict>() {
        let mut map = serde_json::Map::new();
        for (k, v) in d.iter() {
            map.insert(
                k.str()
                    .map_err(|e| Failure::BadRequest(e.to_string()))?
                    .to_string_lossy()
                    .into_owned(),
                from_py(&v)?,
            );
        }
        return Ok(map.into());
    }
    let items: Option<Vec<Bound<'_, PyAny>>> = if let Ok(l) = value.cast::<PyList>() {
        Some(l.iter().collect())
    } else {
        value.cast::<PyTuple>().ok().map(|t| t.iter().collect())
    };
    match items {
        Some(items) => Ok(items
            .iter()
            .map(from_py)
            .collect::<Result<Vec<_>, _>>()?
            .into()),
        None => Err(Failure::BadRequest(format!(
            "{value} cannot be sent to orch"
        ))),
    }
}

/// Every device with both numberings, telemetry and processes, as `orch devices --json` shows
/// them (plus `cuda_index`, the index under this process's `CUDA_VISIBLE_DEVICES`).
#[pyfunction]
fn devices(py: Python<'_>, spec: String) -> PyResult<Bound<'_, PyAny>> {
    let rows = py.detach(move || -> Result<serde_json::Value, Failure> {
        let inventory = inventory(&spec)?;
        let visibility = visibility(&inventory);
        let leases = live_leases_if_any();
        let foreign = orch_runner::foreign_processes(&inventory, &leases);
        let rows: Vec<serde_json::Value> = inventory
            .devices
            .iter()
            .map(|d| {
                let mut row = serde_json::to_value(d).unwrap_or_default();
                if let Some(map) = row.as_object_mut() {
                    map.remove("mig_devices");
                    map.insert(
                        "cuda_index".into(),
                        visibility.visible_index(d.index).into(),
                    );
                    map.insert(
                        "foreign_processes".into(),
                        serde_json::to_value(foreign.get(&d.uuid).cloned().unwrap_or_default())
                            .unwrap_or_default(),
                    );
                    map.insert(
                        "held_by".into(),
                        leases
                            .iter()
                            .find(|l| l.devices.iter().any(|u| d.covers(u)))
                            .map(|l| l.id.clone())
                            .into(),
                    );
                }
                row
            })
            .collect();
        Ok(serde_json::Value::from(rows))
    })?;
    to_py(py, &rows)
}

/// The live leases, without creating a state folder where none is (listing devices writes
/// nothing); none when the store cannot be read.
fn live_leases_if_any() -> Vec<Lease> {
    let dir = orch_leases::default_state_dir();
    if !dir.join("leases.sqlite3").is_file() {
        return Vec::new();
    }
    LeaseStore::open(&dir)
        .and_then(|mut s| s.active())
        .unwrap_or_default()
}

fn plan_json(plan: &Plan, inventory: &Inventory) -> serde_json::Value {
    let chosen: Vec<serde_json::Value> = plan
        .chosen
        .iter()
        .map(|d| {
            let device = d.in_inventory(inventory);
            serde_json::json!({
                "index": d.index,
                "physical_index": d.physical_index,
                "uuid": d.uuid,
                "name": d.name,
                "memory_total_bytes": device.and_then(|d| d.memory_total_bytes),
                "memory_free_bytes": d.memory_free,
                "utilization_gpu_percent": d.utilization_gpu,
            })
        })
        .collect();
    serde_json::json!({
        "job": plan.job,
        "policy": plan.policy,
        "devices": chosen,
        "reason": plan.reason,
        "rejected": plan.rejected,
        "hidden": plan.hidden,
        "backend": inventory.backend.as_str(),
    })
}

/// A dry run: what the policy picks now, why, and why not each other visible device.
#[pyfunction]
fn plan<'py>(
    py: Python<'py>,
    spec: String,
    request: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    let request = parse_request(request)?;
    let out = py.detach(move || -> Result<serde_json::Value, Failure> {
        let job = request.job().map_err(Failure::BadRequest)?;
        let inventory = inventory(&spec)?;
        let visibility = visibility(&inventory);
        let leases = LeaseStore::open_default()
            .and_then(|mut s| s.active_device_leases())
            .map_err(|e| Failure::Other(e.to_string()))?;
        let input = PlanInput {
            job: &job,
            devices: &inventory.devices,
            visibility: &visibility,
            leases: &leases,
        };
        let env = |name: &str| std::env::var(name).ok();
        let plan = with_host(|host| orch_runner::plan(input, host, &env).map_err(plan_failure))?;
        Ok(plan_json(&plan, &inventory))
    })?;
    to_py(py, &out)
}

/// A lease held by this process, released by [`NativeLease::release`], or when the process ends
/// (the next reader of the store reclaims it).
#[pyclass(module = "orch._native")]
struct NativeLease {
    guard: Mutex<Option<LeaseGuard>>,
    /// The process that claimed it: a forked child neither releases it nor lets it go on drop.
    owner: u32,
    info: serde_json::Value,
}

#[pymethods]
impl NativeLease {
    /// The lease: id, devices, the plan's reason and rejections, the environment.
    #[getter]
    fn info<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        to_py(py, &self.info)
    }

    /// Releases the lease now; false when it was released already (or this is a forked child,
    /// which never releases its parent's lease).
    fn release(&self, py: Python<'_>) -> bool {
        if std::process::id() != self.owner {
            return false;
        }
        let guard = orch_core::sync::lock(&self.guard).take();
        match guard {
            Some(guard) => {
                py.detach(move || guard.release());
                true
            }
            None => false,
        }
    }

    #[getter]
    fn released(&self) -> bool {
        orch_core::sync::lock(&self.guard).is_none()
    }
}

impl Drop for NativeLease {
    fn drop(&mut self) {
        let guard = self
            .guard
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(guard) = guard
            && std::process::id() != self.owner
        {
            // A forked child's copy: the parent holds the lease.
            let _ = guard.keep();
        }
        // In the owner, dropping the guard releases the lease.
    }
}

/// One attempt to claim devices for this process: the plan runs inside the lease store's
/// transaction, so no other process (`orch run`, another notebook) can take them meanwhile.
#[pyfunction]
fn claim(py: Python<'_>, spec: String, request: &Bound<'_, PyAny>) -> PyResult<NativeLease> {
    let request = parse_request(request)?;
    let lease = py.detach(move || -> Result<NativeLease, Failure> {
        let job = request.job().map_err(Failure::BadRequest)?;
        // Inside an orch job the claim is among the job's own devices; elsewhere, real GPUs
        // that the machine's daemon owns are its to lease (said before NVML is even read).
        let spec = inventory_spec(&spec)?;
        orch_runner::may_claim_here(&spec).map_err(Failure::Other)?;
        let inventory = load(&spec)?;
        orch_runner::check_enforcement(&job, inventory.backend).map_err(Failure::BadRequest)?;
        let claimed = with_host(|host| {
            orch_runner::claim_here(host, &job, &inventory, None).map_err(Failure::from)
        })?;
        for note in &claimed.notes {
            eprintln!("orch: {note}");
        }
        let Placement {
            lease: guard, plan, ..
        } = claimed.placement;
        let lease = guard.lease();
        let vars = orch_runner::lease_env(&job, lease, &plan, &inventory);
        let mut info = plan_json(&plan, &inventory);
        if let Some(map) = info.as_object_mut() {
            map.insert("id".into(), lease.id.clone().into());
            map.insert("exclusive".into(), lease.exclusive.into());
            map.insert("created_at_ms".into(), lease.created_at_ms.into());
            map.insert(
                "env".into(),
                serde_json::to_value(&vars).unwrap_or_default(),
            );
        }
        Ok(NativeLease {
            guard: Mutex::new(Some(guard)),
            owner: std::process::id(),
            info,
        })
    })?;
    Ok(lease)
}

/// The request as a job file's text, for `POST /v1/leases` of the daemon.
#[pyfunction]
fn job_text(request: &Bound<'_, PyAny>) -> PyResult<String> {
    let request = parse_request(request)?;
    Ok(request.job_text().map_err(Failure::BadRequest)?)
}

/// Where the daemon listens by default (when `ORCH_SERVER` is not set).
#[pyfunction]
fn default_socket() -> String {
    orch_leases::default_socket().to_string_lossy().into_owned()
}

/// The daemon to ask, as every orch client looks for it: `(socket, how)`, where `how` is
/// `named` (ORCH_SERVER), `state_dir` (ORCH_STATE_DIR's), `machine` or `own`.
#[pyfunction]
fn find_daemon() -> (String, &'static str) {
    let found = orch_leases::find_daemon();
    let how = match found.found {
        orch_leases::Found::Named => "named",
        orch_leases::Found::StateDir => "state_dir",
        orch_leases::Found::Machine => "machine",
        orch_leases::Found::Own => "own",
    };
    (found.path.to_string_lossy().into_owned(), how)
}

/// The lease store's folder (`ORCH_STATE_DIR`, else the user's state folder).
#[pyfunction]
fn state_dir() -> String {
    orch_leases::default_state_dir()
        .to_string_lossy()
        .into_owned()
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("OrchError", py.get_type::<OrchError>())?;
    m.add("NoFit", py.get_type::<NoFit>())?;
    m.add("BadRequest", py.get_type::<BadRequest>())?;
    m.add("PluginError", py.get_type::<PluginError>())?;
    m.add_class::<NativeLease>()?;
    m.add_function(wrap_pyfunction!(devices, m)?)?;
    m.add_function(wrap_pyfunction!(plan, m)?)?;
    m.add_function(wrap_pyfunction!(claim, m)?)?;
    m.add_function(wrap_pyfunction!(job_text, m)?)?;
    m.add_function(wrap_pyfunction!(default_socket, m)?)?;
    m.add_function(wrap_pyfunction!(find_daemon, m)?)?;
    m.add_function(wrap_pyfunction!(state_dir, m)?)?;
    Ok(())
}
