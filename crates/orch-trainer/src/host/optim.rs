//! `orch:plugin/optim`: SGD and Adam over the registered parameters, and the gradient
//! all-reduce that makes data-parallel replicas apply the same update.

use super::convert::{Fail, bad};
use super::{GradShare, Opt, OptKind, OptimizerEntry, Phase, ReplicaState};
use orch_tensor::Tensor;
use orch_tensor::optim::{Adam, AdamConfig, Sgd, SgdConfig};
use orch_wit::trainer::orch::plugin::optim::{HostOptimizer, Optimizer, OptimizerConfig};
use orch_wit::trainer::orch::plugin::tensors::TensorError as WitError;
use wasmtime::component::Resource;

/// Most optimizers one replica may create.
const MAX_OPTIMIZERS: usize = 16;

/// The all-reduce's result: per parameter, the weighted sum of the replicas' gradients.
pub(crate) type Reduced = Result<Vec<Option<Vec<f32>>>, String>;

/// Sums the replicas' gradients, each scaled by its weight, in rank order. A parameter without
/// a gradient on some replica counts as zero there.
pub(crate) fn reduce(shares: Vec<GradShare>) -> Reduced {
    let count = shares.first().map_or(0, |(_, g)| g.len());
    if shares.iter().any(|(_, g)| g.len() != count) {
        return Err("replicas stepped optimizers over different parameters".into());
    }
    let mut sums: Vec<Option<Vec<f32>>> = vec![None; count];
    for (weight, grads) in &shares {
        for (sum, grad) in sums.iter_mut().zip(grads) {
            let Some(grad) = grad else { continue };
            let sum = sum.get_or_insert_with(|| vec![0.0; grad.len()]);
            if sum.len() != grad.len() {
                return Err("replicas hold gradients of different sizes".into());
            }
            for (s, g) in sum.iter_mut().zip(grad) {
                *s += weight * g;
            }
        }
    }
    Ok(sums)
}

impl ReplicaState {
    /// Replaces the gradients of optimizer `index`'s parameters by their average over the
    /// replicas, weighted by each replica's share of the global batch.
    fn average_gradients(&mut self, index: usize) -> Result<(), Fail> {
        let weight = match &self.phase {
            Phase::Train(slot) if slot.global_rows > 0 => {
                slot.indices.len() as f32 / slot.global_rows as f32
            }
            _ => {
                return Err(Fail::Wit(WitError::NotNow(
                    "with several replicas, optimizer steps happen in train-step".into(),
                )));
            }
        };
        let params: Vec<Tensor> = self.optimizer(index)?.params().to_vec();
        let grads = params
            .iter()
            .map(|p| p.grad().map(|g| g.to_vec()).transpose())
            .collect::<Result<Vec<_>, _>>()?;
        let timeout = self.shared.exchange_timeout;
        let reduced = self
            .shared
            .grads
            .exchange(self.rank, (weight, grads), timeout, reduce)
            .map_err(|why| Fail::Abort(format!("stopped at the gradient exchange: {why}")))?;
        let sums = reduced
            .as_ref()
            .as_ref()
            .map_err(|why| Fail::Abort(format!("gradient exchange: {why}")))?;
        for (p, sum) in params.iter().zip(sums) {
            match sum {
                Some(values) => {
                    p.set_grad(Some(Tensor::from_vec(values.clone(), p.shape(), p.pool())?))?
                }
                None => p.zero_grad(),
            }
        }
        Ok(())
    }

    /// The optimizer behind `handle` for a host function without an error value: a handle the
    /// host does not know stops the plugin.
    fn known_optimizer(
        &mut self,
        call: &str,
        handle: &Resource<Optimizer>,
    ) -> wasmtime::Result<&mut Opt> {
        let found = self.optimizer_index(handle).and_then(|i| self.optimizer(i));
        match found {
            Ok(opt) => Ok(opt),
            Err(Fail::BadHandle(why)) => Err(wasmtime::format_err!("{call}: {why}")),
            Err(other) => Err(wasmtime::format_err!("{call}: {other:?}")),
        }
    }

    fn optimizer(&mut self, index: usize) -> Result<&mut Opt, Fail> {
        self.optimizers
            .get_mut(index)
            .and_then(Option::as_mut)
            .ok_or_else(|| Fail::BadHandle(format!("optimizer {index} was dropped")))
    }
}

impl HostOptimizer for ReplicaState {
    fn create(
        &mut self,
        config: OptimizerConfig,
    ) -> wasmtime::Result<Result<Resource<Optimizer>, WitError>> {
        self.run("optimizer.create", |s| {
            if !matches!(s.phase, Phase::Init) {
                // Checkpoints hold the optimizers `init` made, and a resume re-creates those.
                return Err(Fail::Wit(WitError::NotNow(
                    "optimizer.create is for init: an optimizer made later could not be restored from a checkpoint".into(),
                )));
            }
            if s.params.is_empty() {
                return Err(bad(
                    "register parameters (params.register) before creating an optimizer",
                ));
            }
            // Dropped optimizers leave their slot free: only live ones count.
            let slot = s.optimizers.iter().position(Option::is_none);
            let live = s.optimizers.iter().flatten().count();
            if live >= MAX_OPTIMIZERS {
                return Err(bad(format!(
                    "{live} optimizers are alive, the most one replica may hold; drop one first"
                )));
            }
            let params: Vec<Tensor> = s.params.iter().map(|(_, p)| p.clone()).collect();
            let names = s.params.iter().map(|(n, _)| n.clone()).collect();
            let kind = match config {
                OptimizerConfig::Sgd(c) => OptKind::Sgd(Sgd::new(
                    params,
                    SgdConfig {
                        lr: c.lr,
                        momentum: c.momentum,
                        nesterov: c.nesterov,
                        weight_decay: c.weight_decay,
                    },
                )?),
                OptimizerConfig::Adam(c) => OptKind::Adam(Adam::new(
                    params,
                    AdamConfig {
                        lr: c.lr,
                        beta1: c.beta1,
                        beta2: c.beta2,
                        eps: c.eps,
                        weight_decay: c.weight_decay,
                        decoupled: c.decoupled,
                    },
                )?),
            };
            let index = slot.unwrap_or(s.optimizers.len());
            let entry = s
                .table
                .push(OptimizerEntry(index))
                .map_err(|e| Fail::Wit(WitError::Failed(format!("optimizer table: {e}"))))?;
            let opt = Some(Opt { kind, names });
            match s.optimizers.get_mut(index) {
                Some(free) => *free = opt,
                None => s.optimizers.push(opt),
            }
            Ok(Resource::new_own(entry.rep()))
        })
    }

    fn step(&mut self, this: Resource<Optimizer>) -> wasmtime::Result<Result<(), WitError>> {
        self.run("optimizer.step", |s| {
            let index = s.optimizer_index(&this)?;
            if s.shared.replicas > 1 {
                s.average_gradients(index)?;
            }
            Ok(s.optimizer(index)?.inner().step()?)
        })
    }

    fn zero_grad(&mut self, this: Resource<Optimizer>) -> wasmtime::Result<()> {
        self.known_optimizer("optimizer.zero-grad", &this)?
            .inner()
            .zero_grad();
        Ok(())
    }

    fn lr(&mut self, this: Resource<Optimizer>) -> wasmtime::Result<f32> {
        Ok(self.known_optimizer("optimizer.lr", &this)?.inner().lr())
    }

    fn set_lr(
        &mut self,
        this: Resource<Optimizer>,
        lr: f32,
    ) -> wasmtime::Result<Result<(), WitError>> {
        self.run("optimizer.set-lr", |s| {
            if !(lr.is_finite() && lr >= 0.0) {
                return Err(bad(format!(
                    "learning rate {lr}: give a finite number >= 0"
                )));
            }
            let index = s.optimizer_index(&this)?;
            s.optimizer(index)?.inner().set_lr(lr);
            Ok(())
        })
    }

    fn drop(&mut self, this: Resource<Optimizer>) -> wasmtime::Result<()> {
        let entry = self
            .table
            .delete(Resource::<OptimizerEntry>::new_own(this.rep()))?;
        if let Some(slot) = self.optimizers.get_mut(entry.0) {
            *slot = None;
        }
        Ok(())
    }
}

impl orch_wit::trainer::orch::plugin::optim::Host for ReplicaState {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reduce_weights_in_rank_order_and_treats_missing_as_zero() {
        let shares = vec![
            (0.5, vec![Some(vec![1.0, 2.0]), None]),
            (0.25, vec![Some(vec![4.0, 4.0]), Some(vec![8.0])]),
            (0.25, vec![Some(vec![0.0, 4.0]), None]),
        ];
        assert_eq!(
            reduce(shares),
            Ok(vec![Some(vec![1.5, 3.0]), Some(vec![2.0])])
        );
        assert!(reduce(vec![(1.0, vec![None]), (1.0, vec![])]).is_err());
        assert!(
            reduce(vec![
                (1.0, vec![Some(vec![1.0])]),
                (1.0, vec![Some(vec![1.0, 2.0])])
            ])
            .is_err()
        );
    }
}
