//! Fuzz targets for everything a user or a plugin hands orch: job files, sim inventory files,
//! `CUDA_VISIBLE_DEVICES` with `CUDA_DEVICE_ORDER` and Slurm's grants, the tensor op
//! arguments of the trainer host (shapes, axes, lists) and the layer ops' arguments over
//! degenerate shapes ([`layers`], shared with a property test). The targets are the test files under
//! `tests/` (one target, one test binary); this library is what they share: the run loop with its
//! time and count budget ([`fuzz`]), an allocator that measures each case ([`alloc`]), the
//! one-sentence check of refusals ([`sentence`]), and mutations of valid TOML files ([`text`],
//! [`tree`]).
//!
//! Design decision: **proptest as the engine, on stable Rust.** Inputs are generated from seeds
//! by strategies that know the formats (valid files mutated key by key and byte by byte, not
//! random bytes alone), a failure is shrunk to a small input, and a seed replays a run exactly.
//! There is no coverage feedback (libFuzzer needs a nightly toolchain for `cargo fuzz`); the
//! strategies carry the knowledge coverage would otherwise find. docs/TESTING.md says how to run
//! the targets and how a finding becomes a regression test.
//!
//! The invariant every target checks: no input makes orch panic, take longer than a bound, or
//! allocate past a bound, and every refusal is one sentence.

pub mod alloc;
pub mod layers;
pub mod sentence;
pub mod text;
pub mod tree;

mod runner;

pub use runner::{Bounds, fuzz};

/// Every test binary that links this crate measures its allocations (see [`alloc`]).
#[global_allocator]
static ALLOCATOR: alloc::Counting = alloc::Counting;
