//! Tensors for orch's trainers: f32 tensors on the CPU, CUDA devices and simulated GPUs, with
//! autograd, fused optimizers and per-job memory quotas. Knows nothing of wasmtime; the trainer
//! host wraps this API as Wasm resources (a handle per [`Tensor`]).
//!
//! Main design decision: **one tensor type over a storage enum** (candle's design). A [`Tensor`]
//! is a shared handle on a `Storage { Cpu(Vec<f32>), Cuda(CudaSlice<f32>) }` plus a layout
//! (shape, strides, offset), so views cost nothing and backends differ only below one dispatch
//! point (`storage.rs`); backend code lives in `cpu/` and `cuda/`. Every allocation first
//! reserves its bytes in the job's [`MemoryPool`] for that device, so a quota is enforced
//! before memory is touched and freed when the last handle drops. CUDA is always compiled in and
//! loaded at run time; its absence is an error value ([`TensorError::CudaUnavailable`]), never a
//! panic. A simulated GPU ([`Device::Sim`]) runs the CPU kernels against its own quota.
//!
//! Autograd is define-by-run: a tensor computed from inputs that require grad records the op
//! that made it, and [`Tensor::backward`] walks that graph (see [`autograd`]).
//!
//! ```
//! use orch_tensor::{MemoryPool, Tensor, optim::{Optimizer, Sgd, SgdConfig}};
//! let pool = MemoryPool::cpu();
//! let w = Tensor::randn(&[3, 2], 0, &pool)?.with_requires_grad();
//! let x = Tensor::ones(&[4, 3], &pool)?;
//! let loss = x.matmul(&w)?.relu()?.mean_all()?;
//! loss.backward()?;
//! let mut sgd = Sgd::new(vec![w.clone()], SgdConfig { momentum: 0.9, ..SgdConfig::new(0.1) })?;
//! sgd.step()?;
//! sgd.zero_grad();
//! # Ok::<(), orch_tensor::TensorError>(())
//! ```

pub mod autograd;
mod cpu;
pub mod cuda;
mod device;
mod error;
mod layers;
mod layout;
mod memory;
pub mod nn_kernels;
mod ops;
pub mod optim;
mod rng;
mod storage;
mod tensor;
mod work;

pub use autograd::{GraphBudget, is_grad_enabled, no_grad, with_graph_budget};
pub use device::Device;
pub use error::{Result, TensorError};
pub use layout::{MAX_NUMEL, MAX_RANK};
pub use memory::{MemoryPool, MemoryStats, Reservation};
pub use tensor::{Dropout, Tensor};
pub use work::{Rate, current_deadline, with_deadline};
