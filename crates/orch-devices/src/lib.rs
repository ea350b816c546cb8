//! The device model of orch and where devices come from.
//!
//! Three inventories fill one model ([`Device`]): `nvml` (real NVIDIA GPUs through NVML),
//! `sim:PATH` (GPUs described in a TOML file, for tests, demos and capacity planning) and `cpu`
//! (the host as one compute device). [`visibility`] applies `CUDA_VISIBLE_DEVICES`,
//! `CUDA_DEVICE_ORDER` and Slurm's grant exactly as CUDA and Slurm do, and [`cuda`] reports whether
//! the CUDA driver can be used at all.
//!
//! Design decision: NVML and the CUDA driver are loaded at run time and their absence is an
//! ordinary [`DeviceError`], never a panic, so the default build and start-up work on machines
//! without a GPU. This crate knows nothing of wasmtime.

pub mod cpu;
pub mod cuda;
mod error;
pub mod health;
mod inventory;
pub mod mig;
mod model;
pub mod nvml;
pub mod nvml_health;
pub mod sim;
pub mod visibility;

pub use error::DeviceError;
pub use health::{Drain, Health, HealthView, Problem, ProblemKind, Service, ServiceState};
pub use inventory::{Inventory, InventorySpec};
pub use model::{Backend, Device, GpuProcess, MigDevice, PcieLevel, PeerLink};
pub use orch_core::process::{MAX_GPU_MINOR, NVIDIA_MAJOR};
pub use visibility::{Visibility, VisibilityEnv, VisibleDevice};
