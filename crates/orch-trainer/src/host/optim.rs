//! `orch:plugin/optim`: SGD and Adam over the registered parameters (in parameter groups, each
//! with its own learning rate and weight decay), gradient clipping by global norm, and the
//! gradient all-reduce that makes data-parallel replicas apply the same update.

use super::convert::{Fail, bad};
use super::{GradShare, Group, Opt, OptKind, OptimizerEntry, Phase, ReplicaState};
use orch_tensor::optim::{Adam, AdamConfig, Sgd, SgdConfig};
use orch_tensor::{Tensor, TensorError, no_grad};
use orch_wit::trainer::orch::plugin::optim::{
    HostOptimizer, Optimizer, OptimizerConfig, ParamGroup,
};
use orch_wit::trainer::orch::plugin::tensors::TensorError as WitError;
use wasmtime::component::Resource;

/// Most optimizers one replica may create, and most groups one optimizer may have.
const MAX_OPTIMIZERS: usize = 16;
const MAX_GROUPS: usize = 64;

/// What `clip_grad_norm_` adds to the norm before dividing (PyTorch's constant).
const CLIP_EPS: f64 = 1e-6;

/// An orch-tensor optimizer of `config`'s kind over `params`, with `lr` and `weight_decay`
/// when a group gives them.
fn build(
    config: &OptimizerConfig,
    params: Vec<Tensor>,
    group: Option<(f32, f32)>,
) -> Result<OptKind, Fail> {
    Ok(match config {
        OptimizerConfig::Sgd(c) => {
            let (lr, weight_decay) = group.unwrap_or((c.lr, c.weight_decay));
            OptKind::Sgd(Sgd::new(
                params,
                SgdConfig {
                    lr,
                    momentum: c.momentum,
                    nesterov: c.nesterov,
                    weight_decay,
                },
            )?)
        }
        OptimizerConfig::Adam(c) => {
            let (lr, weight_decay) = group.unwrap_or((c.lr, c.weight_decay));
            OptKind::Adam(Adam::new(
                params,
                AdamConfig {
                    lr,
                    beta1: c.beta1,
                    beta2: c.beta2,
                    eps: c.eps,
                    weight_decay,
                    decoupled: c.decoupled,
                },
            )?)
        }
    })
}

/// `sqrt` of the sum of squares of every gradient of `params` (those without one count as
/// zero), accumulated in f64.
fn global_norm(params: &[Tensor]) -> Result<f64, Fail> {
    let mut squares = 0.0f64;
    for p in params {
        if let Some(g) = p.grad() {
            let sum = no_grad(|| g.sqr()?.sum_all())?.to_scalar()?;
            squares += f64::from(sum);
        }
    }
    Ok(squares.sqrt())
}

/// Scales every gradient of `params` by `factor`, in place of the old ones: every scaled
/// gradient is computed before any is set, so an error (a deadline's refusal) leaves them all
/// as they were.
fn scale_grads(params: &[Tensor], factor: f32) -> Result<(), Fail> {
    let mut scaled = Vec::with_capacity(params.len());
    for p in params {
        if let Some(g) = p.grad() {
            scaled.push((p, no_grad(|| g.mul_scalar(factor))?));
        }
    }
    for (p, g) in scaled {
        p.set_grad(Some(g))?;
    }
    Ok(())
}

/// The all-reduce's result: per parameter, the weighted sum of the replicas' gradients; and
/// replica 0's buffers.
pub(crate) type Reduced = Result<(Vec<Option<Vec<f32>>>, Option<Vec<Vec<f32>>>), String>;

/// Sums the replicas' gradients, each scaled by its weight, in rank order. A parameter without
/// a gradient on some replica counts as zero there. Replica 0's buffers pass through.
pub(crate) fn reduce(mut shares: Vec<GradShare>) -> Reduced {
    let count = shares.first().map_or(0, |s| s.grads.len());
    if shares.iter().any(|s| s.grads.len() != count) {
        return Err("replicas stepped optimizers over different parameters".into());
    }
    let buffers = shares.first_mut().and_then(|s| s.buffers.take());
    let mut sums: Vec<Option<Vec<f32>>> = vec![None; count];
    for GradShare { weight, grads, .. } in &shares {
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
    Ok((sums, buffers))
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
        let params: Vec<Tensor> = self.optimizer(index)?.params();
        let grads = params
            .iter()
            .map(|p| p.grad().map(|g| g.to_vec()).transpose())
            .collect::<Result<Vec<_>, _>>()?;
        let buffers = if self.rank == 0 && !self.buffers.is_empty() {
            let values = self.buffers.iter().map(|(_, b)| b.to_vec());
            Some(values.collect::<Result<Vec<_>, _>>()?)
        } else {
            None
        };
        let share = GradShare {
            weight,
            grads,
            buffers,
        };
        let timeout = self.shared.exchange_timeout;
        let reduced = self
            .shared
            .grads
            .exchange(self.rank, share, timeout, reduce)
            .map_err(|why| Fail::Abort(format!("stopped at the gradient exchange: {why}")))?;
        let (sums, buffers) = reduced
            .as_ref()
            .as_ref()
            .map_err(|why| Fail::Abort(format!("gradient exchange: {why}")))?;
        if let (Some(values), true) = (buffers, self.rank != 0) {
            if values.len() != self.buffers.len() {
                return Err(Fail::Abort(
                    "replicas registered different buffers than replica 0".into(),
                ));
            }
            for ((_, b), v) in self.buffers.iter().zip(values) {
                b.assign(&Tensor::from_slice(v, b.shape(), b.pool())?)?;
            }
        }
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

    /// One update of optimizer `index`: the replicas' average, clipping to `max_norm` when
    /// given, then every group's step. Returns the gradients' global norm before clipping when
    /// clipping.
    ///
    /// The groups' steps update parameters one after another: the deadline stopping one
    /// part-way would leave the model half-updated, so it ends the replica (a trap, as the
    /// deadline's interruption of Wasm code does) instead of giving the plugin a value.
    fn step_optimizer(&mut self, index: usize, max_norm: Option<f32>) -> Result<f32, Fail> {
        self.step_optimizer_once(index, max_norm)
            .map_err(|e| match e {
                Fail::Tensor(e @ TensorError::Deadline { .. }) => Fail::Abort(format!(
                    "the optimizer's step was stopped part-way by the step's deadline, its parameters partly updated: {e}"
                )),
                other => other,
            })
    }

    /// [`Self::step_optimizer`] without the deadline's mapping.
    fn step_optimizer_once(&mut self, index: usize, max_norm: Option<f32>) -> Result<f32, Fail> {
        if self.shared.replicas > 1 {
            self.average_gradients(index)?;
        }
        let mut norm = 0.0f64;
        if let Some(max_norm) = max_norm {
            let params = self.optimizer(index)?.params();
            norm = global_norm(&params)?;
            let coef = f64::from(max_norm) / (norm + CLIP_EPS);
            if coef < 1.0 {
                scale_grads(&params, coef as f32)?;
            }
        }
        for group in &mut self.optimizer(index)?.groups {
            group.inner().step()?;
        }
        Ok(norm as f32)
    }

    /// A new optimizer in the table: groups of `(names, lr and weight decay)`, or every
    /// parameter when `groups` is `None`.
    fn create_optimizer(
        &mut self,
        config: &OptimizerConfig,
        groups: Option<Vec<ParamGroup>>,
    ) -> Result<Resource<Optimizer>, Fail> {
        if !matches!(self.phase, Phase::Init) {
            // Checkpoints hold the optimizers `init` made, and a resume re-creates those.
            return Err(Fail::Wit(WitError::NotNow(
                "optimizer.create is for init: an optimizer made later could not be restored from a checkpoint".into(),
            )));
        }
        if self.params.is_empty() {
            return Err(bad(
                "register parameters (params.register) before creating an optimizer",
            ));
        }
        // Dropped optimizers leave their slot free: only live ones count.
        let slot = self.optimizers.iter().position(Option::is_none);
        let live = self.optimizers.iter().flatten().count();
        if live >= MAX_OPTIMIZERS {
            return Err(bad(format!(
                "{live} optimizers are alive, the most one replica may hold; drop one first"
            )));
        }
        let groups = match groups {
            None => {
                let params: Vec<Tensor> = self.params.iter().map(|(_, p)| p.clone()).collect();
                let names = self.params.iter().map(|(n, _)| n.clone()).collect();
                vec![Group {
                    kind: build(config, params, None)?,
                    names,
                }]
            }
            Some(groups) => self.grouped(config, groups)?,
        };
        let index = slot.unwrap_or(self.optimizers.len());
        let entry = self
            .table
            .push(OptimizerEntry(index))
            .map_err(|e| Fail::Wit(WitError::Failed(format!("optimizer table: {e}"))))?;
        let opt = Some(Opt { groups });
        match self.optimizers.get_mut(index) {
            Some(free) => *free = opt,
            None => self.optimizers.push(opt),
        }
        Ok(Resource::new_own(entry.rep()))
    }

    /// The groups of `create-grouped`, checked: 1 to [`MAX_GROUPS`], none empty, every name a
    /// registered parameter, none in two groups.
    fn grouped(
        &self,
        config: &OptimizerConfig,
        groups: Vec<ParamGroup>,
    ) -> Result<Vec<Group>, Fail> {
        if groups.is_empty() || groups.len() > MAX_GROUPS {
            return Err(bad(format!(
                "optimizer.create-grouped: {} groups; give 1 to {MAX_GROUPS}",
                groups.len()
            )));
        }
        let mut seen = std::collections::HashSet::new();
        let mut out = Vec::with_capacity(groups.len());
        for (i, group) in groups.into_iter().enumerate() {
            if group.params.is_empty() {
                return Err(bad(format!(
                    "optimizer.create-grouped: group {i} names no parameter"
                )));
            }
            let mut params = Vec::with_capacity(group.params.len());
            for name in &group.params {
                let Some((_, p)) = self.params.iter().find(|(n, _)| n == name) else {
                    return Err(bad(format!(
                        "optimizer.create-grouped: group {i} names `{}`, which is not a registered parameter",
                        crate::error::quoted(name)
                    )));
                };
                if !seen.insert(name.clone()) {
                    return Err(bad(format!(
                        "optimizer.create-grouped: `{name}` is in two groups"
                    )));
                }
                params.push(p.clone());
            }
            out.push(Group {
                kind: build(config, params, Some((group.lr, group.weight_decay)))?,
                names: group.params,
            });
        }
        Ok(out)
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
        self.run("optimizer.create", |s| s.create_optimizer(&config, None))
    }

    fn create_grouped(
        &mut self,
        config: OptimizerConfig,
        groups: Vec<ParamGroup>,
    ) -> wasmtime::Result<Result<Resource<Optimizer>, WitError>> {
        self.run("optimizer.create-grouped", |s| {
            s.create_optimizer(&config, Some(groups))
        })
    }

    fn step(&mut self, this: Resource<Optimizer>) -> wasmtime::Result<Result<(), WitError>> {
        self.run("optimizer.step", |s| {
            let index = s.optimizer_index(&this)?;
            s.step_optimizer(index, None).map(|_| ())
        })
    }

    fn step_clipped(
        &mut self,
        this: Resource<Optimizer>,
        max_norm: f32,
    ) -> wasmtime::Result<Result<f32, WitError>> {
        self.run("optimizer.step-clipped", |s| {
            if !(max_norm.is_finite() && max_norm > 0.0) {
                return Err(bad(format!(
                    "step-clipped: max-norm = {max_norm}; give a finite number > 0"
                )));
            }
            let index = s.optimizer_index(&this)?;
            s.step_optimizer(index, Some(max_norm))
        })
    }

    fn zero_grad(&mut self, this: Resource<Optimizer>) -> wasmtime::Result<()> {
        for group in &mut self.known_optimizer("optimizer.zero-grad", &this)?.groups {
            group.inner().zero_grad();
        }
        Ok(())
    }

    fn lr(&mut self, this: Resource<Optimizer>) -> wasmtime::Result<f32> {
        let opt = self.known_optimizer("optimizer.lr", &this)?;
        Ok(opt.groups.first_mut().map_or(0.0, |g| g.inner().lr()))
    }

    fn set_lr(
        &mut self,
        this: Resource<Optimizer>,
        lr: f32,
    ) -> wasmtime::Result<Result<(), WitError>> {
        self.run("optimizer.set-lr", |s| {
            check_lr(lr)?;
            let index = s.optimizer_index(&this)?;
            for group in &mut s.optimizer(index)?.groups {
                group.inner().set_lr(lr);
            }
            Ok(())
        })
    }

    fn groups(&mut self, this: Resource<Optimizer>) -> wasmtime::Result<u32> {
        let opt = self.known_optimizer("optimizer.groups", &this)?;
        Ok(u32::try_from(opt.groups.len()).unwrap_or(u32::MAX))
    }

    fn group_lr(
        &mut self,
        this: Resource<Optimizer>,
        group: u32,
    ) -> wasmtime::Result<Result<f32, WitError>> {
        self.run("optimizer.group-lr", |s| {
            let index = s.optimizer_index(&this)?;
            Ok(s.group(index, group)?.inner().lr())
        })
    }

    fn set_group_lr(
        &mut self,
        this: Resource<Optimizer>,
        group: u32,
        lr: f32,
    ) -> wasmtime::Result<Result<(), WitError>> {
        self.run("optimizer.set-group-lr", |s| {
            check_lr(lr)?;
            let index = s.optimizer_index(&this)?;
            s.group(index, group)?.inner().set_lr(lr);
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

impl ReplicaState {
    /// Group `group` of optimizer `index`; a group it does not have is a bad argument.
    fn group(&mut self, index: usize, group: u32) -> Result<&mut Group, Fail> {
        let opt = self.optimizer(index)?;
        let count = opt.groups.len();
        opt.groups
            .get_mut(group as usize)
            .ok_or_else(|| bad(format!("group {group}: the optimizer has {count} groups")))
    }
}

fn check_lr(lr: f32) -> Result<(), Fail> {
    if lr.is_finite() && lr >= 0.0 {
        Ok(())
    } else {
        Err(bad(format!(
            "learning rate {lr}: give a finite number >= 0"
        )))
    }
}

impl orch_wit::trainer::orch::plugin::optim::Host for ReplicaState {}

#[cfg(test)]
mod tests {
    use super::*;
    use orch_tensor::{Device, MemoryPool, with_deadline};
    use std::time::{Duration, Instant};

    /// A deadline refusing the second gradient's scaling leaves the first as it was too.
    #[test]
    fn a_refused_clipping_scales_no_gradient() {
        let pool = MemoryPool::new(Device::Cpu, None).unwrap();
        let small = Tensor::zeros(&[4], &pool).unwrap().with_requires_grad();
        small
            .set_grad(Some(Tensor::ones(&[4], &pool).unwrap()))
            .unwrap();
        // 2^23 element visits: past what one thread is assumed to do in 50 us (5 x 10^6); the
        // first gradient's 4 fit.
        let large = Tensor::zeros(&[1 << 23], &pool)
            .unwrap()
            .with_requires_grad();
        large
            .set_grad(Some(Tensor::ones(&[1 << 23], &pool).unwrap()))
            .unwrap();
        let params = [small.clone(), large.clone()];
        let one = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap();
        let outcome = one.install(|| {
            let soon = Some(Instant::now() + Duration::from_micros(50));
            with_deadline(soon, || scale_grads(&params, 0.5))
        });
        assert!(
            matches!(outcome, Err(Fail::Tensor(TensorError::Deadline { .. }))),
            "{outcome:?}"
        );
        let first = small.grad().unwrap().to_vec().unwrap();
        assert_eq!(first, vec![1.0; 4], "the first gradient was scaled");
    }

    #[test]
    fn reduce_weights_in_rank_order_and_treats_missing_as_zero() {
        let share = |weight, grads, buffers| GradShare {
            weight,
            grads,
            buffers,
        };
        let shares = vec![
            share(0.5, vec![Some(vec![1.0, 2.0]), None], Some(vec![vec![7.0]])),
            share(0.25, vec![Some(vec![4.0, 4.0]), Some(vec![8.0])], None),
            share(0.25, vec![Some(vec![0.0, 4.0]), None], None),
        ];
        assert_eq!(
            reduce(shares),
            Ok((
                vec![Some(vec![1.5, 3.0]), Some(vec![2.0])],
                Some(vec![vec![7.0]])
            ))
        );
        assert!(reduce(vec![share(1.0, vec![None], None), share(1.0, vec![], None)]).is_err());
        assert!(
            reduce(vec![
                share(1.0, vec![Some(vec![1.0])], None),
                share(1.0, vec![Some(vec![1.0, 2.0])], None)
            ])
            .is_err()
        );
    }
}
