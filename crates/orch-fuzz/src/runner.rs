//! The run loop: batches of proptest cases from a chain of seeds, until the time or the count
//! is spent, each case measured for time and memory.
//!
//! Environment (all optional):
//! - `ORCH_FUZZ_SECONDS`: how long each target runs (default 2, what `cargo test` spends).
//! - `ORCH_FUZZ_CASES`: the most cases each target runs (default 20000).
//! - `ORCH_FUZZ_SEED`: the first batch's seed (default: from the clock, printed); a failure
//!   names the seed of its batch, and that seed replays it first.
//! - `ORCH_FUZZ_TRACE=1`: print every case before running it (to find a case that aborts).

use crate::alloc;
use proptest::strategy::Strategy;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestError, TestRng, TestRunner};
use std::cell::Cell;
use std::fmt::Debug;
use std::panic::AssertUnwindSafe;
use std::time::{Duration, Instant};

/// What one case may cost before it counts as a finding.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    /// Longest one case may run (a hang shows as a case past this).
    pub case_time: Duration,
    /// Most bytes one case may hold at once; four times this aborts the run (see [`alloc`]).
    pub case_bytes: usize,
}

/// Cases per proptest batch: small, so the time budget is checked often.
const BATCH: u64 = 64;

/// Runs `check` on inputs from `strategy` until the budget is spent, and prints how many
/// executions that was. Panics (failing the test) with the shrunk input and the seed to replay
/// when `check` fails, panics, or a case passes its `bounds`.
pub fn fuzz<S>(
    target: &str,
    bounds: Bounds,
    strategy: S,
    check: impl Fn(S::Value) -> Result<(), TestCaseError>,
) where
    S: Strategy,
    S::Value: Debug,
{
    let budget = Budget::from_env();
    let started = Instant::now();
    let trace = std::env::var_os("ORCH_FUZZ_TRACE").is_some_and(|v| v == "1");
    let executions = Cell::new(0u64);
    let largest = Cell::new(0usize);
    let slowest = Cell::new(Duration::ZERO);
    let mut seed = budget.seed;
    let mut cases = 0u64;
    while cases < budget.cases && started.elapsed() < budget.time {
        let batch = (budget.cases - cases).min(BATCH);
        let config = Config {
            cases: batch as u32,
            failure_persistence: None,
            // Shrinking a failure is worth a while, but not forever.
            max_shrink_time: 60_000,
            ..Config::default()
        };
        let rng = TestRng::from_seed(RngAlgorithm::ChaCha, &seed_bytes(seed));
        let mut runner = TestRunner::new_with_rng(config, rng);
        let result = runner.run(&strategy, |input| {
            if trace {
                eprintln!("fuzz {target} (seed {seed}): {input:?}");
            }
            executions.set(executions.get() + 1);
            let base = alloc::start_case(seed, bounds.case_bytes.saturating_mul(4));
            let clock = Instant::now();
            // Caught here so the bound is lifted before proptest handles the panic.
            let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| check(input)));
            let took = clock.elapsed();
            let held = alloc::end_case(base);
            let outcome = outcome.unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            largest.set(largest.get().max(held));
            slowest.set(slowest.get().max(took));
            outcome?;
            if took > bounds.case_time {
                return Err(TestCaseError::fail(format!(
                    "one case took {took:?}, past {:?}",
                    bounds.case_time
                )));
            }
            if held > bounds.case_bytes {
                return Err(TestCaseError::fail(format!(
                    "one case held {held} bytes at once, past {}",
                    bounds.case_bytes
                )));
            }
            Ok(())
        });
        match result {
            Ok(()) => {}
            Err(TestError::Fail(why, input)) => panic!(
                "fuzz {target}: {why}\nshrunk input: {input:#?}\nreplay: ORCH_FUZZ_SEED={seed}"
            ),
            Err(TestError::Abort(why)) => {
                panic!("fuzz {target}: proptest gave up: {why} (seed {seed})")
            }
        }
        cases += batch;
        seed = next_seed(seed);
    }
    println!(
        "fuzz {target}: {} executions in {:.1} s (first seed {}; slowest case {:?}, largest case {} KiB)",
        executions.get(),
        started.elapsed().as_secs_f64(),
        budget.seed,
        slowest.get(),
        largest.get() / 1024,
    );
}

struct Budget {
    time: Duration,
    cases: u64,
    seed: u64,
}

impl Budget {
    fn from_env() -> Budget {
        fn var<T: std::str::FromStr>(name: &str) -> Option<T> {
            let text = std::env::var(name).ok()?;
            match text.trim().parse() {
                Ok(v) => Some(v),
                Err(_) => panic!("{name}={text:?} is not a number"),
            }
        }
        let seconds: f64 = var("ORCH_FUZZ_SECONDS").unwrap_or(2.0);
        Budget {
            time: Duration::try_from_secs_f64(seconds)
                .unwrap_or_else(|_| panic!("ORCH_FUZZ_SECONDS={seconds} is not a duration")),
            cases: var("ORCH_FUZZ_CASES").unwrap_or(20_000),
            seed: var("ORCH_FUZZ_SEED").unwrap_or_else(clock_seed),
        }
    }
}

fn clock_seed() -> u64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    next_seed(now.as_nanos() as u64 ^ u64::from(std::process::id()))
}

/// splitmix64: the next seed in a run's chain.
fn next_seed(seed: u64) -> u64 {
    let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// ChaCha's 32-byte seed from a 64-bit one.
fn seed_bytes(seed: u64) -> [u8; 32] {
    let mut bytes = [0u8; 32];
    let mut s = seed;
    for chunk in bytes.chunks_mut(8) {
        chunk.copy_from_slice(&s.to_le_bytes());
        s = next_seed(s);
    }
    bytes
}
