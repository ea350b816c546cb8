//! The trainer world's imports, implemented on one replica's store.
//!
//! A replica's store data is a [`ReplicaState`]: the sandbox (deny-all WASI, memory limiter,
//! guest log) shared with the policy host, a `ResourceTable` holding this replica's tensors and
//! optimizers, and a handle on what all replicas of the job share ([`Shared`]: device pools,
//! data, the gradient exchange). Handles are entries of this store's table, so one replica (or
//! job) can never name another's tensors, and a count of live handles enforces the cap.
//!
//! Failures the plugin causes come back as `tensor-error` values; only a broken host invariant
//! or a job being stopped (another replica failed) turns into a trap.

mod convert;
mod graph;
mod io;
mod optim;
mod tensors;

use crate::collective::Collective;
use crate::data::Data;
pub(crate) use convert::Fail;
use orch_host::{HasPluginState, PluginState};
use orch_tensor::optim::{Adam, Optimizer, Sgd};
use orch_tensor::{MemoryPool, Tensor};
use orch_wit::trainer::orch::plugin::metrics::Level;
use orch_wit::trainer::orch::plugin::tensors::{Tensor as WitTensor, TensorError as WitError};
use std::sync::Arc;
use std::time::Duration;
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

/// Parameter values by name, as broadcast from replica 0 or read from a checkpoint.
pub(crate) type NamedValues = Vec<(String, Vec<usize>, Vec<f32>)>;

/// One replica's share of an all-reduce: its weight (share of the global batch) and the
/// gradient of each parameter of one optimizer (`None`: no gradient).
pub(crate) type GradShare = (f32, Vec<Option<Vec<f32>>>);

/// What the replicas of one job share.
#[derive(Debug)]
pub(crate) struct Shared {
    pub devices: Vec<DeviceSlot>,
    pub data: Data,
    pub replicas: usize,
    pub max_tensors: u32,
    /// How long a replica waits for the others at an exchange.
    pub exchange_timeout: Duration,
    pub grads: Collective<GradShare, optim::Reduced>,
    pub broadcast: Collective<Option<NamedValues>, Option<NamedValues>>,
}

impl Shared {
    /// Wakes every replica waiting at an exchange with `why` (a replica failed).
    pub fn stop(&self, why: &str) {
        self.grads.poison(why);
        self.broadcast.poison(why);
    }
}

/// A batch the host has chosen for the current call: sample indices into the data set, and the
/// tensors once made.
#[derive(Debug, Default)]
pub(crate) struct BatchSlot {
    pub indices: Vec<u32>,
    /// Rows of the global batch (all replicas together).
    pub global_rows: usize,
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

/// An optimizer and the names of the parameters it updates.
#[derive(Debug)]
pub(crate) struct Opt {
    pub kind: OptKind,
    pub names: Vec<String>,
}

#[derive(Debug)]
pub(crate) enum OptKind {
    Sgd(Sgd),
    Adam(Adam),
}

impl Opt {
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
    /// Optimizers by creation order (`None` once the plugin dropped one).
    pub optimizers: Vec<Option<Opt>>,
    pub phase: Phase,
    /// `metrics.scalar` values of the current call.
    pub scalars: Vec<(String, f64)>,
    /// `metrics.log` lines of the current call.
    pub logs: Vec<(Level, String)>,
    /// Set when the host stopped the plugin (a trap it raised on purpose), with why.
    pub abort: Option<String>,
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

/// Most `metrics.log` lines and `metrics.scalar` values kept per call, and the longest line.
const MAX_LOGS_PER_CALL: usize = 64;
const MAX_SCALARS_PER_CALL: usize = 64;
const MAX_LOG_CHARS: usize = 1000;

impl ReplicaState {
    pub fn new(sandbox: PluginState, shared: Arc<Shared>, rank: usize) -> ReplicaState {
        let current = rank.min(shared.devices.len().saturating_sub(1));
        ReplicaState {
            sandbox,
            table: ResourceTable::new(),
            live_tensors: 0,
            shared,
            rank,
            current,
            params: Vec::new(),
            optimizers: Vec::new(),
            phase: Phase::Idle,
            scalars: Vec::new(),
            logs: Vec::new(),
            abort: None,
        }
    }

    /// The tensor behind a handle the plugin passed.
    fn tensor(&self, handle: &Resource<WitTensor>) -> Result<Tensor, Fail> {
        let key = Resource::<TensorEntry>::new_borrow(handle.rep());
        self.table
            .get(&key)
            .map(|entry| entry.0.clone())
            .map_err(|e| Fail::Wit(WitError::BadHandle(format!("tensor handle: {e}"))))
    }

    /// A new handle on `tensor`, within the cap.
    fn give(&mut self, tensor: Tensor) -> Result<Resource<WitTensor>, Fail> {
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

    fn drop_tensor(&mut self, handle: Resource<WitTensor>) -> wasmtime::Result<()> {
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
            .map_err(|e| Fail::Wit(WitError::BadHandle(format!("optimizer handle: {e}"))))
    }

    /// The pool of logical device `device` (the current one when `None`).
    fn pool(&self, device: Option<u32>) -> Result<Arc<MemoryPool>, Fail> {
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

    /// Runs one host function: a plugin-caused failure becomes a `tensor-error` value, a host
    /// abort a trap.
    fn run<T>(
        &mut self,
        f: impl FnOnce(&mut Self) -> Result<T, Fail>,
    ) -> wasmtime::Result<Result<T, WitError>> {
        if let Some(why) = &self.abort {
            return Err(wasmtime::format_err!("{why}"));
        }
        match f(self) {
            Ok(value) => Ok(Ok(value)),
            Err(Fail::Wit(e)) => Ok(Err(e)),
            Err(Fail::Tensor(e)) => Ok(Err(self.convert(e))),
            Err(Fail::Abort(why)) => {
                self.abort = Some(why.clone());
                Err(wasmtime::format_err!("{why}"))
            }
        }
    }

    fn push_log(&mut self, level: Level, message: &str) {
        if self.logs.len() < MAX_LOGS_PER_CALL {
            let text: String = printable(message).chars().take(MAX_LOG_CHARS).collect();
            self.logs.push((level, text));
        }
    }

    fn push_scalar(&mut self, name: &str, value: f64) {
        if let Some(entry) = self.scalars.iter_mut().find(|(n, _)| n == name) {
            entry.1 = value;
        } else if self.scalars.len() < MAX_SCALARS_PER_CALL {
            let name: String = printable(name).chars().take(64).collect();
            self.scalars.push((name, value));
        }
    }
}

/// `text` with control characters (terminal escapes included) replaced by spaces.
pub(crate) fn printable(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect::<String>()
        .trim_end()
        .to_string()
}
