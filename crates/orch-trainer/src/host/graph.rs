//! `orch:plugin/autograd` and `orch:plugin/params`.

use super::convert::{Fail, bad};
use super::{Phase, ReplicaState};
use crate::error::quoted;
use orch_tensor::no_grad;
use orch_wit::trainer::orch::plugin::autograd::Host as Autograd;
use orch_wit::trainer::orch::plugin::params::Host as Params;
use orch_wit::trainer::orch::plugin::tensors::{Tensor as WitTensor, TensorError as WitError};
use wasmtime::component::Resource;

/// Most parameters (and, apart, buffers) one replica may register, and the longest name.
const MAX_PARAMS: usize = 4096;
const MAX_NAME: usize = 256;

/// Names the checkpoint's files reserve: `__metadata__` is the key of a safetensors header's
/// own metadata, so a tensor of that name would make `model.safetensors` unreadable.
pub(crate) const RESERVED_NAMES: &[&str] = &["__metadata__"];

impl Autograd for ReplicaState {
    fn backward(&mut self, loss: Resource<WitTensor>) -> wasmtime::Result<Result<(), WitError>> {
        self.run("autograd.backward", |s| Ok(s.tensor(&loss)?.backward()?))
    }

    fn grad(
        &mut self,
        param: Resource<WitTensor>,
    ) -> wasmtime::Result<Result<Option<Resource<WitTensor>>, WitError>> {
        self.run("autograd.grad", |s| match s.tensor(&param)?.grad() {
            Some(g) => s.give(g).map(Some),
            None => Ok(None),
        })
    }

    fn zero_grad(&mut self) -> wasmtime::Result<()> {
        for (_, p) in &self.params {
            p.zero_grad();
        }
        Ok(())
    }
}

impl Params for ReplicaState {
    fn register(
        &mut self,
        name: String,
        init: Resource<WitTensor>,
    ) -> wasmtime::Result<Result<Resource<WitTensor>, WitError>> {
        self.run("params.register", |s| {
            s.check_new_name("params.register", &name)?;
            let init = s.tensor(&init)?;
            // A dense copy of its own, cut off from any graph: the leaf that collects gradients.
            let param = no_grad(|| init.detach().affine(1.0, 0.0))?.with_requires_grad();
            let handle = s.give(param.clone())?;
            s.params.push((name, param));
            Ok(handle)
        })
    }

    fn register_buffer(
        &mut self,
        name: String,
        init: Resource<WitTensor>,
    ) -> wasmtime::Result<Result<Resource<WitTensor>, WitError>> {
        self.run("params.register-buffer", |s| {
            s.check_new_name("params.register-buffer", &name)?;
            let init = s.tensor(&init)?;
            // A dense copy outside autograd: no gradient, no optimizer, updated by `assign`.
            let buffer = no_grad(|| init.detach().affine(1.0, 0.0))?;
            let handle = s.give(buffer.clone())?;
            s.buffers.push((name, buffer));
            Ok(handle)
        })
    }

    fn buffer_names(&mut self) -> wasmtime::Result<Vec<String>> {
        Ok(self.buffers.iter().map(|(n, _)| n.clone()).collect())
    }

    fn names(&mut self) -> wasmtime::Result<Vec<String>> {
        Ok(self.params.iter().map(|(n, _)| n.clone()).collect())
    }
}

impl ReplicaState {
    /// Whether `call` may register `name` now: in `init-replica`, a printable name no parameter
    /// or buffer has, within the count.
    fn check_new_name(&self, call: &str, name: &str) -> Result<(), Fail> {
        // The name is quoted shortened: it is the plugin's, of any length its memory holds.
        if !matches!(self.phase, Phase::Init) {
            // A checkpoint holds what `init` registered, and a resumed run re-creates exactly
            // that: a tensor registered later could not be restored.
            return Err(Fail::Wit(WitError::NotNow(format!(
                "{call}(`{}`) is for init: a tensor registered later could not be restored from a checkpoint",
                quoted(name)
            ))));
        }
        if name.is_empty() || name.len() > MAX_NAME || name.chars().any(char::is_control) {
            let shown = if name.len() > MAX_NAME {
                format!("of {} bytes", name.len())
            } else {
                format!("{name:?}")
            };
            return Err(bad(format!(
                "{call}: name {shown}: give 1 to {MAX_NAME} printable characters"
            )));
        }
        if RESERVED_NAMES.contains(&name) {
            return Err(bad(format!(
                "{call}: the name `{name}` is reserved by the checkpoint format (safetensors keeps its metadata under it): choose another name"
            )));
        }
        let taken = |list: &[(String, orch_tensor::Tensor)]| list.iter().any(|(n, _)| n == name);
        if taken(&self.params) || taken(&self.buffers) {
            return Err(bad(format!(
                "{call}: a parameter or buffer named `{name}` is registered already"
            )));
        }
        if self.params.len() >= MAX_PARAMS || self.buffers.len() >= MAX_PARAMS {
            return Err(bad(format!(
                "{call}: more than {MAX_PARAMS} parameters or buffers"
            )));
        }
        Ok(())
    }
}
