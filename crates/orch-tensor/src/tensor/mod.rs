//! The tensor handle: a shared storage, a layout over it, and (when it takes part in autograd)
//! the op that produced it.

mod dropout;
mod elementwise;
mod lookup;
mod loss;
mod matmul;
mod reduce;
mod shape;
mod view;

pub use dropout::Dropout;
pub(crate) use elementwise::same_device;

use crate::autograd::{self, NodeToken, Op, Recorded};
use crate::device::Device;
use crate::error::{Result, TensorError};
use crate::layout::{self, Layout};
use crate::memory::MemoryPool;
use crate::rng::Rng;
use crate::storage::{self, Buffer};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// An f32 tensor. Cloning is cheap (a reference count); views share storage. `Send + Sync`.
#[derive(Clone)]
pub struct Tensor(Arc<Inner>);

struct Inner {
    id: u64,
    buffer: Arc<Buffer>,
    layout: Layout,
    requires_grad: bool,
    op: Option<Op>,
    /// The graph budget's count of this node (given back when the node goes).
    _node: Option<NodeToken>,
    grad: Mutex<Option<Tensor>>,
}

/// Dropping a graph would otherwise recurse once per op (each output owns its inputs) and a
/// long graph would overflow the stack; instead the inputs whose last handle this is are
/// taken apart here, in a loop.
impl Drop for Inner {
    fn drop(&mut self) {
        let Some(op) = self.op.take() else { return };
        let mut pending = op.into_tensors();
        while let Some(t) = pending.pop() {
            if let Some(mut inner) = Arc::into_inner(t.0)
                && let Some(op) = inner.op.take()
            {
                pending.extend(op.into_tensors());
            }
        }
    }
}

fn next_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Tensor(id {}, shape {:?}, {}",
            self.id(),
            self.shape(),
            self.device()
        )?;
        if self.requires_grad() {
            f.write_str(", requires grad")?;
        }
        f.write_str(")")
    }
}

impl Tensor {
    pub(crate) fn from_parts(buffer: Arc<Buffer>, layout: Layout, op: Option<Recorded>) -> Tensor {
        let (op, node) = match op {
            Some(Recorded { op, node }) => (Some(op), node),
            None => (None, None),
        };
        Tensor(Arc::new(Inner {
            id: next_id(),
            buffer,
            layout,
            requires_grad: op.is_some(),
            op,
            _node: node,
            grad: Mutex::new(None),
        }))
    }

    /// A dense tensor from a fresh buffer, recording `op` when autograd wants it.
    pub(crate) fn dense(buffer: Arc<Buffer>, shape: &[usize], op: Option<Recorded>) -> Tensor {
        Tensor::from_parts(buffer, Layout::contiguous(shape), op)
    }

    /// A view of this tensor's storage under another layout.
    pub(crate) fn view(&self, layout: Layout, op: Option<Recorded>) -> Tensor {
        Tensor::from_parts(Arc::clone(&self.0.buffer), layout, op)
    }

    // ---- creation ------------------------------------------------------------------------

    /// Copies `data` (row-major, `shape`'s element count) into a new tensor in `pool`.
    pub fn from_slice(data: &[f32], shape: &[usize], pool: &Arc<MemoryPool>) -> Result<Tensor> {
        let n = layout::checked_numel("from_slice", shape)?;
        if data.len() != n {
            return Err(TensorError::InvalidShape {
                op: "from_slice",
                shape: shape.to_vec(),
                reason: format!("{} values given for {n} elements", data.len()),
            });
        }
        let buffer = storage::alloc(pool, "from_slice", shape, || {
            storage::from_host(pool, data.to_vec())
        })?;
        Ok(Tensor::dense(buffer, shape, None))
    }

    /// As [`Tensor::from_slice`], taking the vector.
    pub fn from_vec(data: Vec<f32>, shape: &[usize], pool: &Arc<MemoryPool>) -> Result<Tensor> {
        let n = layout::checked_numel("from_vec", shape)?;
        if data.len() != n {
            return Err(TensorError::InvalidShape {
                op: "from_vec",
                shape: shape.to_vec(),
                reason: format!("{} values given for {n} elements", data.len()),
            });
        }
        let buffer = storage::alloc(pool, "from_vec", shape, || storage::from_host(pool, data))?;
        Ok(Tensor::dense(buffer, shape, None))
    }

    pub fn full(shape: &[usize], value: f32, pool: &Arc<MemoryPool>) -> Result<Tensor> {
        let n = layout::checked_numel("full", shape)?;
        let buffer = storage::alloc(pool, "full", shape, || storage::fill(pool, n, value))?;
        Ok(Tensor::dense(buffer, shape, None))
    }

    pub fn zeros(shape: &[usize], pool: &Arc<MemoryPool>) -> Result<Tensor> {
        Tensor::full(shape, 0.0, pool)
    }

    pub fn ones(shape: &[usize], pool: &Arc<MemoryPool>) -> Result<Tensor> {
        Tensor::full(shape, 1.0, pool)
    }

    /// A scalar (rank 0).
    pub fn scalar(value: f32, pool: &Arc<MemoryPool>) -> Result<Tensor> {
        Tensor::full(&[], value, pool)
    }

    /// Standard normal values from `seed`; the same seed gives the same values on every device.
    pub fn randn(shape: &[usize], seed: u64, pool: &Arc<MemoryPool>) -> Result<Tensor> {
        let n = layout::checked_numel("randn", shape)?;
        // Generated inside `alloc`, after the quota has accepted the bytes.
        let buffer = storage::alloc(pool, "randn", shape, || {
            let mut data = vec![0.0; n];
            Rng::new(seed).fill_normal(&mut data);
            storage::from_host(pool, data)
        })?;
        Ok(Tensor::dense(buffer, shape, None))
    }

    /// Uniform values in `[low, high)` from `seed`.
    pub fn uniform(
        shape: &[usize],
        low: f32,
        high: f32,
        seed: u64,
        pool: &Arc<MemoryPool>,
    ) -> Result<Tensor> {
        let n = layout::checked_numel("uniform", shape)?;
        let buffer = storage::alloc(pool, "uniform", shape, || {
            let mut rng = Rng::new(seed);
            storage::from_host(pool, (0..n).map(|_| rng.uniform(low, high)).collect())
        })?;
        Ok(Tensor::dense(buffer, shape, None))
    }

    pub fn zeros_like(&self) -> Result<Tensor> {
        Tensor::zeros(self.shape(), self.pool())
    }

    pub fn ones_like(&self) -> Result<Tensor> {
        Tensor::ones(self.shape(), self.pool())
    }

    // ---- inspection ----------------------------------------------------------------------

    /// Unique per handle (views get their own id).
    pub fn id(&self) -> u64 {
        self.0.id
    }

    pub fn shape(&self) -> &[usize] {
        self.0.layout.shape()
    }

    pub fn strides(&self) -> &[usize] {
        self.0.layout.strides()
    }

    pub fn rank(&self) -> usize {
        self.0.layout.rank()
    }

    pub fn numel(&self) -> usize {
        self.0.layout.numel()
    }

    pub fn is_contiguous(&self) -> bool {
        self.0.layout.is_contiguous()
    }

    pub fn device(&self) -> Device {
        self.pool().device()
    }

    /// The pool (job and device) this tensor's memory is counted in.
    pub fn pool(&self) -> &Arc<MemoryPool> {
        self.0.buffer.pool()
    }

    pub(crate) fn layout(&self) -> &Layout {
        &self.0.layout
    }

    pub(crate) fn buffer(&self) -> &Arc<Buffer> {
        &self.0.buffer
    }

    pub(crate) fn op(&self) -> Option<&Op> {
        self.0.op.as_ref()
    }

    /// True when two handles view the same storage.
    pub fn shares_storage(&self, other: &Tensor) -> bool {
        Arc::ptr_eq(&self.0.buffer, &other.0.buffer)
    }

    /// The elements in row-major order, copied to the host (waits for the device).
    pub fn to_vec(&self) -> Result<Vec<f32>> {
        let guard = self.0.buffer.read();
        storage::to_host(self.pool(), &guard, self.layout())
    }

    /// The value of a one-element tensor.
    pub fn to_scalar(&self) -> Result<f32> {
        if self.numel() != 1 {
            return Err(TensorError::InvalidShape {
                op: "to_scalar",
                shape: self.shape().to_vec(),
                reason: "only a one-element tensor has a scalar value".into(),
            });
        }
        Ok(self.to_vec()?[0])
    }

    /// A copy in `pool` (another device, or another job's pool on the same device). Returns this
    /// tensor itself when `pool` is already its pool. Differentiable.
    pub fn to(&self, pool: &Arc<MemoryPool>) -> Result<Tensor> {
        if Arc::ptr_eq(self.pool(), pool) {
            return Ok(self.clone());
        }
        let (from, to) = (self.device(), pool.device());
        let shape = self.shape();
        let buffer = if from == to || (from.is_host() && to.is_host()) {
            // Same memory space (host, or one CUDA device): a direct copy, no staging.
            storage::alloc(pool, "to", shape, || {
                storage::gather(pool, &self.buffer().read(), self.layout())
            })?
        } else {
            let data = self.to_vec()?;
            storage::alloc(pool, "to", shape, || storage::from_host(pool, data))?
        };
        let op = autograd::record(&[self], || Op::ToDevice(self.clone()))?;
        Ok(Tensor::dense(buffer, self.shape(), op))
    }

    /// Overwrites this tensor's elements, in place, with `src`'s (same shape, any device). Not
    /// recorded by autograd: how parameters are broadcast from replica 0 or loaded from a
    /// checkpoint. Every handle sharing this storage sees the new values.
    pub fn assign(&self, src: &Tensor) -> Result<()> {
        if src.shape() != self.shape() {
            return Err(TensorError::ShapeMismatch {
                op: "assign",
                lhs: self.shape().to_vec(),
                rhs: src.shape().to_vec(),
            });
        }
        let pool = self.pool();
        // A dense copy in this tensor's pool; a fresh buffer, so the locks below never alias.
        let dense = if src.device() == self.device() {
            autograd::no_grad(|| src.affine(1.0, 0.0))?
        } else {
            let data = src.to_vec()?;
            let buffer = storage::alloc(pool, "assign", src.shape(), || {
                storage::from_host(pool, data)
            })?;
            Tensor::dense(buffer, src.shape(), None)
        };
        let mut dst = self.0.buffer.write();
        storage::scatter(
            pool,
            &mut dst,
            self.layout(),
            (&dense.buffer().read(), dense.layout()),
        )
    }

    // ---- autograd handles ----------------------------------------------------------------

    /// Whether gradients flow to (or through) this tensor.
    pub fn requires_grad(&self) -> bool {
        self.0.requires_grad
    }

    /// A leaf handle on the same storage that collects gradients in [`Tensor::grad`]: how a
    /// parameter is made.
    pub fn with_requires_grad(&self) -> Tensor {
        let inner = Inner {
            id: next_id(),
            buffer: Arc::clone(&self.0.buffer),
            layout: self.0.layout.clone(),
            requires_grad: true,
            op: None,
            _node: None,
            grad: Mutex::new(None),
        };
        Tensor(Arc::new(inner))
    }

    /// A handle on the same storage cut off from autograd.
    pub fn detach(&self) -> Tensor {
        self.view(self.0.layout.clone(), None)
    }

    /// The gradient accumulated by [`Tensor::backward`] calls, for leaves that require grad.
    pub fn grad(&self) -> Option<Tensor> {
        self.0
            .grad
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Replaces the gradient (data-parallel averaging writes the mean back this way).
    pub fn set_grad(&self, grad: Option<Tensor>) -> Result<()> {
        if let Some(g) = &grad {
            if g.shape() != self.shape() {
                return Err(TensorError::ShapeMismatch {
                    op: "set_grad",
                    lhs: self.shape().to_vec(),
                    rhs: g.shape().to_vec(),
                });
            }
            if g.device() != self.device() {
                return Err(TensorError::DeviceMismatch {
                    op: "set_grad",
                    lhs: self.device(),
                    rhs: g.device(),
                });
            }
        }
        *self.0.grad.lock().unwrap_or_else(|e| e.into_inner()) = grad.map(|g| g.detach());
        Ok(())
    }

    /// Drops the accumulated gradient (its memory goes back to the pool).
    pub fn zero_grad(&self) {
        *self.0.grad.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// The accumulated gradient plus `g` (already this tensor's shape), not yet stored.
    pub(crate) fn grad_plus(&self, g: &Tensor) -> Result<Tensor> {
        match self.grad() {
            Some(old) => old.add(g),
            None => g.contiguous(),
        }
    }

    pub(crate) fn store_grad(&self, g: Tensor) {
        *self.0.grad.lock().unwrap_or_else(|e| e.into_inner()) = Some(g.detach());
    }

    /// Computes gradients of this one-element tensor with respect to every leaf that requires
    /// grad and adds them to those leaves' [`Tensor::grad`].
    pub fn backward(&self) -> Result<()> {
        autograd::backward(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn tensors_are_send_and_sync() {
        assert_send_sync::<Tensor>();
        assert_send_sync::<MemoryPool>();
    }
}
