//! orch-tensor's test suite, one binary. Every op and gradient test runs on every backend
//! present through `test_device!` (common/mod.rs): cpu, sim, and cuda (skipped without a GPU,
//! failing instead under `ORCH_REQUIRE_GPU=1`).

mod common;
mod deadline;
mod degenerate;
mod errors;
mod grads;
mod grads_more;
mod layers;
mod matmul_speed;
mod new_ops;
mod nn_kernels;
mod ops;
mod optim;
mod quota;
mod torch_agreement;
