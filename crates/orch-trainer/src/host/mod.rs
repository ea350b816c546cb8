//! The trainer world's imports, implemented on one replica's store.
//!
//! A replica's store data is a [`ReplicaState`]: the sandbox (deny-all WASI, memory limiter,
//! guest log) shared with the policy host, a `ResourceTable` holding this replica's tensors and
//! optimizers, and a handle on what all replicas of the job share ([`Shared`]: device pools,
//! data, the gradient exchange). Handles are entries of this store's table, so one replica (or
//! job) can never name another's tensors, and a count of live handles enforces the cap.
//!
//! Failures the plugin causes come back as `tensor-error` values; a bad handle (a plugin bug,
//! as the WIT says), a job being stopped (another replica failed) or a panic in orch itself
//! (named with the host function it happened in) turns into a trap.
//!
//! Host memory the device quotas do not see is bounded per replica too: tensor handles by
//! `max_tensors`, autograd graph nodes by `max_graph_nodes` (an [`GraphBudget`] every host
//! function runs under), both refused with `too-many-tensors`.

mod convert;
mod graph;
mod io;
mod ops;
mod optim;
mod tensors;

use crate::collective::Collective;
use crate::data::Data;
use crate::error::TrainError;
use crate::job::GrantedDevice;
pub(crate) use convert::Fail;
use orch_host::{HasPluginState, PluginState, printable};
use orch_tensor::optim::{Adam, Optimizer, Sgd};
use orch_tensor::{Device, GraphBudget, MemoryPool, Tensor, with_deadline, with_graph_budget};
use orch_wit::trainer::orch::plugin::metrics::Level;
use orch_wit::trainer::orch::plugin::tensors::{Tensor as WitTensor, TensorError as WitError};
use std::sync::Arc;
use std::time::{Duration, Instant};
use wasmtime::component::{Resource, ResourceTable};
use wasmtime_wasi::{WasiCtxView, WasiView};

/// One device of the job, as every replica sees it.
#[derive(Debug)]
pub(crate) struct DeviceSlot {
    /// The job's pool on the device (its quota inside the device's own cap).
    pub pool: Arc<MemoryPool>,
    /// `cpu`, `sim:N`, `cuda:N`.
    pub kind: String,
    pub name: String,
    pub memory_free: Option<u64>,
    pub quota: Option<u64>,
}

impl DeviceSlot {
    /// The job's pool on each device: the job's quota inside the device's own cap (a simulated
    /// GPU's memory, a real one's free memory, the host's available memory for the CPU).
    pub(crate) fn of_devices(
        devices: &[GrantedDevice],
        quota: Option<u64>,
    ) -> Result<Vec<DeviceSlot>, TrainError> {
        devices
            .iter()
            .map(|d| {
                let device_pool = match &d.pool {
                    Some(pool) => Arc::clone(pool),
                    None => {
                        let cap = d.memory_free.or(d.memory_total).or_else(|| match d.device {
                            Device::Cpu => host_available_memory(),
                            _ => None,
                        });
                        MemoryPool::new(d.device, cap).map_err(|e| TrainError::Device {
                            device: d.device.to_string(),
                            reason: e.to_string(),
                        })?
                    }
                };
                Ok(DeviceSlot {
                    pool: MemoryPool::with_parent(&device_pool, quota),
                    kind: d.device.to_string(),
                    name: d.name.clone(),
                    memory_free: d.memory_free,
                    quota,
                })
            })
            .collect()
    }
}

/// The host's available memory, bytes (the one reader of `/proc/meminfo`, in orch-devices).
fn host_available_memory() -> Option<u64> {
    orch_devices::cpu::host_memory()
        .ok()
        .map(|(_, available)| available)
}

/// Parameter values by name, as broadcast from replica 0 or read from a checkpoint.
pub(crate) type NamedValues = Vec<(String, Vec<usize>, Vec<f32>)>;

/// One replica's share of an all-reduce: its weight (share of the global batch), the gradient
/// of each parameter of one optimizer (`None`: no gradient) and, from replica 0 only, the
/// values of every buffer (which every replica then takes, as DDP broadcasts buffers).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct GradShare {
    pub weight: f32,
    pub grads: Vec<Option<Vec<f32>>>,
    pub buffers: Option<Vec<Vec<f32>>>,
}

/// What the replicas of one job share.
#[derive(Debug)]
pub(crate) struct Shared {
    pub devices: Vec<DeviceSlot>,
    pub data: Data,
    pub replicas: usize,
    /// The job's seed (dropout masks are drawn from it).
    pub seed: u64,
    pub max_tensors: u32,
    /// Autograd graph nodes one replica may keep alive.
    pub max_graph_nodes: usize,
    /// How long a replica waits for the others at an exchange.
    pub exchange_timeout: Duration,
    pub grads: Collective<GradShare, optim::Reduced>,
    pub broadcast: Collective<Option<NamedValues>, Option<NamedValues>>,
    /// Where replicas wait for replica 0 to write a checkpoint.
    pub checkpoints: Collective<(), ()>,
    /// Where replicas agree, at the end of each step, whether any saw a stop request
    /// ([`crate::RunOptions::stop_when`]), so all stop at the same step.
    pub stops: Collective<bool, bool>,
}

impl Shared {
    /// Wakes every replica waiting at an exchange with `why` (a replica failed).
    pub fn stop(&self, why: &str) {
        self.grads.poison(why);
        self.broadcast.poison(why);
        self.checkpoints.poison(why);
        self.stops.poison(why);
    }
}

/// A batch the host has chosen for the current call: sample indices into the data set, and the
/// tensors once made.
#[derive(Debug, Default)]
pub(crate) struct BatchSlot {
    pub indices: Vec<u32>,
    /// Rows of the global batch (all replicas together).
    pub global_rows: usize,
    /// Where this replica's shard starts in the global batch: the global index of its first
    /// row, which dropout masks are drawn by.
    pub offset: usize,
    /// Training steps done before this call.
    pub step: u64,
    /// `tensors.dropout` calls made in this call so far (the next one's site).
    pub dropout_sites: u64,
    pub tensors: Option<(Tensor, Tensor)>,
}

/// What the replica is doing, which decides what `data` hands out.
#[derive(Debug, Default)]
pub(crate) enum Phase {
    #[default]
    Idle,
    Init,
    Train(BatchSlot),
    Eval(BatchSlot),
}

/// An optimizer: its parameter groups, each an orch-tensor optimizer with its own learning rate
/// and weight decay (one group when made by `optimizer.create`).
#[derive(Debug)]
pub(crate) struct Opt {
    pub groups: Vec<Group>,
}

/// One parameter group and the names of the parameters it updates.
#[derive(Debug)]
pub(crate) struct Group {
    pub kind: OptKind,
    pub names: Vec<String>,
}

#[derive(Debug)]
pub(crate) enum OptKind {
    Sgd(Sgd),
    Adam(Adam),
}

impl Group {
    pub fn inner(&mut self) -> &mut dyn Optimizer {
        match &mut self.kind {
            OptKind::Sgd(o) => o,
            OptKind::Adam(o) => o,
        }
    }

    pub fn params(&self) -> &[Tensor] {
        match &self.kind {
            OptKind::Sgd(o) => o.params(),
            OptKind::Adam(o) => o.params(),
        }
    }
}

impl Opt {
    /// Every parameter of every group, group by group.
    pub fn params(&self) -> Vec<Tensor> {
        self.groups
            .iter()
            .flat_map(|g| g.params().iter().cloned())
            .collect()
    }
}

/// Table entries.
struct TensorEntry(Tensor);
struct OptimizerEntry(usize);

/// The store data of one replica.
pub(crate) struct ReplicaState {
    pub sandbox: PluginState,
    table: ResourceTable,
    live_tensors: u32,
    pub shared: Arc<Shared>,
    pub rank: usize,
    current: usize,
    pub params: Vec<(String, Tensor)>,
    /// Registered buffers (`params.register-buffer`), in registration order.
    pub buffers: Vec<(String, Tensor)>,
    /// Optimizers by creation order (`None` once the plugin dropped one).
    pub optimizers: Vec<Option<Opt>>,
    pub phase: Phase,
    /// `metrics.scalar` values of the current call.
    pub scalars: Vec<(String, f64)>,
    /// `metrics.log` lines of the current call.
    pub logs: Vec<(Level, String)>,
    /// What the current call's `metrics` calls had cut, said at the call's end.
    cut: Cut,
    /// Set when the host stopped the plugin (a trap it raised on purpose), with why.
    pub abort: Option<String>,
    /// Set when orch itself panicked inside a host function: the function and the message.
    pub host_panic: Option<(&'static str, String)>,
    /// The replica's bound on live autograd graph nodes.
    pub graph: Arc<GraphBudget>,
    /// When the plugin's current call must end ([`arm_deadline`]): every host function runs
    /// its tensor ops under it, since the epoch deadline stops Wasm code, not host code.
    pub deadline: Option<Instant>,
}

impl std::fmt::Debug for ReplicaState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplicaState")
            .field("rank", &self.rank)
            .field("live_tensors", &self.live_tensors)
            .field("params", &self.params.len())
            .finish_non_exhaustive()
    }
}

impl WasiView for ReplicaState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        self.sandbox.ctx()
    }
}

impl HasPluginState for ReplicaState {
    fn plugin_state(&mut self) -> &mut PluginState {
        &mut self.sandbox
    }
}

impl orch_wit::types::Host for ReplicaState {}

/// Most `metrics.log` lines and `metrics.scalar` values kept per call, the longest line and
/// the longest scalar name.
const MAX_LOGS_PER_CALL: usize = 64;
const MAX_SCALARS_PER_CALL: usize = 64;
const MAX_LOG_CHARS: usize = 1000;
const MAX_SCALAR_NAME: usize = 64;

/// What `metrics` calls of one plugin call had cut or dropped.
#[derive(Debug, Default)]
struct Cut {
    /// Log lines past the per-call limit.
    logs: usize,
    /// Log lines shortened to `MAX_LOG_CHARS`.
    long_lines: usize,
    /// Scalars past the per-call limit.
    scalars: usize,
    /// Scalars whose name was empty, too long or held control characters (kept, such names
    /// could merge with others).
    bad_names: usize,
}

impl ReplicaState {
    pub fn new(sandbox: PluginState, shared: Arc<Shared>, rank: usize) -> ReplicaState {
        let current = rank.min(shared.devices.len().saturating_sub(1));
        let graph = GraphBudget::new(shared.max_graph_nodes);
        ReplicaState {
            sandbox,
            table: ResourceTable::new(),
            live_tensors: 0,
            shared,
            rank,
            current,
            params: Vec::new(),
            buffers: Vec::new(),
            optimizers: Vec::new(),
            phase: Phase::Idle,
            scalars: Vec::new(),
            logs: Vec::new(),
            cut: Cut::default(),
            abort: None,
            host_panic: None,
            graph,
            deadline: None,
        }
    }

    /// The tensor behind a handle the plugin passed. A handle the host does not know stops the
    /// plugin (a trap, as the WIT says): it is a bug in the plugin, not a value to handle.
    pub(crate) fn tensor(&self, handle: &Resource<WitTensor>) -> Result<Tensor, Fail> {
        let key = Resource::<TensorEntry>::new_borrow(handle.rep());
        self.table
            .get(&key)
            .map(|entry| entry.0.clone())
            .map_err(|e| bad_handle("tensor", handle.rep(), e))
    }

    /// A new handle on `tensor`, within the cap.
    pub(crate) fn give(&mut self, tensor: Tensor) -> Result<Resource<WitTensor>, Fail> {
        if self.live_tensors >= self.shared.max_tensors {
            return Err(Fail::Wit(WitError::TooManyTensors(self.shared.max_tensors)));
        }
        let entry = self
            .table
            .push(TensorEntry(tensor))
            .map_err(|e| Fail::Wit(WitError::Failed(format!("tensor table: {e}"))))?;
        self.live_tensors += 1;
        Ok(Resource::new_own(entry.rep()))
    }

    pub(crate) fn drop_tensor(&mut self, handle: Resource<WitTensor>) -> wasmtime::Result<()> {
        let key = Resource::<TensorEntry>::new_own(handle.rep());
        self.table.delete(key)?;
        self.live_tensors = self.live_tensors.saturating_sub(1);
        Ok(())
    }

    fn optimizer_index(&self, handle: &Resource<impl Sized + 'static>) -> Result<usize, Fail> {
        let key = Resource::<OptimizerEntry>::new_borrow(handle.rep());
        self.table
            .get(&key)
            .map(|entry| entry.0)
            .map_err(|e| bad_handle("optimizer", handle.rep(), e))
    }

    /// The pool of logical device `device` (the current one when `None`).
    pub(crate) fn pool(&self, device: Option<u32>) -> Result<Arc<MemoryPool>, Fail> {
        let index = match device {
            None => self.current,
            Some(d) => d as usize,
        };
        self.shared
            .devices
            .get(index)
            .map(|slot| Arc::clone(&slot.pool))
            .ok_or(Fail::Wit(WitError::NoSuchDevice(device.unwrap_or(0))))
    }

    /// The logical index of the job's device `device`.
    fn logical(&self, device: orch_tensor::Device) -> u32 {
        self.shared
            .devices
            .iter()
            .position(|slot| slot.pool.device() == device)
            .map_or(u32::MAX, |i| u32::try_from(i).unwrap_or(u32::MAX))
    }

    /// Runs host function `call` (its WIT name, such as `tensors.matmul`) under the replica's
    /// graph budget: a plugin-caused failure becomes a `tensor-error` value; a bad handle or a
    /// host abort a trap; a panic in orch a trap that names `call`.
    fn run<T>(
        &mut self,
        call: &'static str,
        f: impl FnOnce(&mut Self) -> Result<T, Fail>,
    ) -> wasmtime::Result<Result<T, WitError>> {
        if let Some(why) = &self.abort {
            return Err(wasmtime::format_err!("{why}"));
        }
        let graph = Arc::clone(&self.graph);
        let deadline = self.deadline;
        // The replica is stopped after a panic, so no half-updated state is used again.
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            with_deadline(deadline, || with_graph_budget(&graph, || f(self)))
        }));
        match outcome {
            Ok(Ok(value)) => Ok(Ok(value)),
            Ok(Err(Fail::Wit(e))) => Ok(Err(e)),
            Ok(Err(Fail::Tensor(e))) => Ok(Err(self.convert(e))),
            Ok(Err(Fail::Abort(why))) => {
                self.abort = Some(why.clone());
                Err(wasmtime::format_err!("{why}"))
            }
            Ok(Err(Fail::BadHandle(why))) => Err(wasmtime::format_err!("{call}: {why}")),
            Err(panic) => {
                let message = panic_message(panic.as_ref());
                let why = format!("orch failed inside `{call}`: {message}");
                self.host_panic = Some((call, message));
                self.abort = Some(why.clone());
                Err(wasmtime::format_err!("{why}"))
            }
        }
    }

    fn push_log(&mut self, level: Level, message: &str) {
        if self.logs.len() >= MAX_LOGS_PER_CALL {
            self.cut.logs += 1;
            return;
        }
        // Only the part kept is read and copied: a line may be as large as the plugin's memory.
        let end = message
            .char_indices()
            .nth(MAX_LOG_CHARS)
            .map_or(message.len(), |(at, _)| at);
        let mut text = printable(&message[..end]);
        if end < message.len() {
            self.cut.long_lines += 1;
            text.push_str(" [cut]");
        }
        self.logs.push((level, text));
    }

    fn push_scalar(&mut self, name: &str, value: f64) {
        // Bytes first: a name of any length is refused without walking it.
        let valid = name.len() <= 4 * MAX_SCALAR_NAME
            && (1..=MAX_SCALAR_NAME).contains(&name.chars().count())
            && !name.chars().any(char::is_control);
        if !valid {
            self.cut.bad_names += 1;
        } else if let Some(entry) = self.scalars.iter_mut().find(|(n, _)| n == name) {
            entry.1 = value;
        } else if self.scalars.len() < MAX_SCALARS_PER_CALL {
            self.scalars.push((name.to_string(), value));
        } else {
            self.cut.scalars += 1;
        }
    }

    /// A warning saying what this call's `metrics` calls had cut, if anything (and a fresh
    /// count for the next call).
    pub fn take_cut_notice(&mut self) -> Option<(Level, String)> {
        let cut = std::mem::take(&mut self.cut);
        let mut parts = Vec::new();
        if cut.logs > 0 {
            parts.push(format!(
                "{} log lines past the first {MAX_LOGS_PER_CALL} were dropped",
                cut.logs
            ));
        }
        if cut.long_lines > 0 {
            parts.push(format!(
                "{} log lines were cut at {MAX_LOG_CHARS} characters",
                cut.long_lines
            ));
        }
        if cut.scalars > 0 {
            parts.push(format!(
                "{} scalars past the first {MAX_SCALARS_PER_CALL} names were dropped",
                cut.scalars
            ));
        }
        if cut.bad_names > 0 {
            parts.push(format!(
                "{} scalars were dropped for their names (give 1 to {MAX_SCALAR_NAME} printable characters)",
                cut.bad_names
            ));
        }
        (!parts.is_empty()).then(|| {
            (
                Level::Warn,
                format!("orch: in this call, {}", parts.join("; ")),
            )
        })
    }
}

/// Starts a call of the plugin that must end within `deadline`: the epoch deadline that stops
/// its Wasm code, and the same instant for the host's tensor ops (orch-tensor's
/// `with_deadline`: an op too large for the time left is refused, CPU kernels stop at it).
pub(crate) fn arm_deadline(store: &mut wasmtime::Store<ReplicaState>, deadline: Duration) {
    store.set_epoch_deadline(orch_host::deadline_ticks(deadline));
    store.data_mut().deadline = Instant::now().checked_add(deadline);
}

/// A handle the host does not know, as the failure that stops the plugin.
fn bad_handle(kind: &str, rep: u32, e: impl std::fmt::Display) -> Fail {
    Fail::BadHandle(format!(
        "{kind} handle {rep} is not one this plugin holds ({e})"
    ))
}

/// The message a panic carried, when it is text.
pub(crate) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "no message".to_string())
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod trust_tests;
