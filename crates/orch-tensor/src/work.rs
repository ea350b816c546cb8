//! Host ops bounded by a deadline: work known from shapes before an op runs, and kernels that
//! stop between chunks once the deadline has passed.
//!
//! A caller that must answer by a deadline (the trainer host: a plugin's call has a step
//! deadline, and Wasm's epoch interruption stops Wasm code, not the host code a call runs) runs
//! its ops under [`with_deadline`]. Then, on this thread:
//!
//! - **Before an op runs** its work is computed from the shapes, with saturating arithmetic:
//!   multiply-adds for products (matmul, conv2d, attention), elements visited for everything
//!   else (pooling windows, norms, elementwise ops, reductions). An expanded (stride-0) view
//!   counts as the elements it shows, not the bytes it holds: a `[256, 2^31-1] @ [2^31-1, 256]`
//!   product of two expanded views is 1.4e14 multiply-adds, whatever its memory. An op whose
//!   work cannot be done in the time left at the device's rate ([`Rate::of`]: deliberately above
//!   what such a device sustains, so an honest op is never refused) is refused with
//!   [`TensorError::Deadline`] before anything is allocated.
//! - **While a CPU kernel runs** (`cpu` and `sim` devices) its outer loops (matmul blocks,
//!   pooling and conv output rows or samples, attention query blocks) add up the work done and
//!   look at the clock every [`CHECK_EVERY`] units; past the deadline the kernel stops and the
//!   op fails with [`TensorError::Deadline`]. Only fresh outputs were written, and they are
//!   dropped: no tensor the caller holds is changed.
//!
//! CUDA kernels run asynchronously and cannot be stopped part-way, so on a GPU the check before
//! the op is the bound. Without [`with_deadline`] (tests, benches, `orch predict`'s own use of
//! the library outside a call) nothing is checked.

use crate::device::Device;
use crate::error::{Result, TensorError};
use std::cell::Cell;
use std::time::{Duration, Instant};

/// Work between two looks at the clock inside a CPU kernel: about a millisecond of one core.
pub(crate) const CHECK_EVERY: u64 = 1 << 22;

/// What one unit of an op's work is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A multiply-add of a product (matmul, conv2d, attention).
    MultiplyAdds,
    /// An element read or written (pooling windows, norms, elementwise ops, reductions).
    Visits,
}

/// Work a device is assumed to do per second, by kind: its peak, above what it sustains, so
/// that only an op that surely cannot finish in time is refused up front (on the CPU the
/// kernels' own checks stop the rest).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    pub multiply_adds: u64,
    pub visits: u64,
}

impl Rate {
    /// One thread of a host device (`cpu`, `sim`): 10^11 of either per second, an AVX-512
    /// core's peak (two 16-lane FMA units at 3.5 GHz); a host device's rate is this times the
    /// threads of the rayon pool the op runs in.
    pub const HOST_THREAD: Rate = Rate {
        multiply_adds: 100_000_000_000,
        visits: 100_000_000_000,
    };

    /// CUDA devices: 4 * 10^14 multiply-adds (above an H100's dense TF32 peak) and 4 * 10^13
    /// visits per second (about ten times its memory bandwidth in f32 elements).
    pub const CUDA: Rate = Rate {
        multiply_adds: 400_000_000_000_000,
        visits: 40_000_000_000_000,
    };

    /// The rate assumed for ops on `device` run from this thread.
    pub fn of(device: Device) -> Rate {
        match device {
            Device::Cuda(_) => Rate::CUDA,
            Device::Cpu | Device::Sim(_) => {
                let threads = rayon::current_num_threads().max(1) as u64;
                Rate {
                    multiply_adds: Rate::HOST_THREAD.multiply_adds.saturating_mul(threads),
                    visits: Rate::HOST_THREAD.visits.saturating_mul(threads),
                }
            }
        }
    }

    fn per_second(self, kind: Kind) -> u64 {
        match kind {
            Kind::MultiplyAdds => self.multiply_adds,
            Kind::Visits => self.visits,
        }
    }
}

thread_local! {
    static DEADLINE: Cell<Option<Instant>> = const { Cell::new(None) };
}

/// Runs `f` with every op it runs on this thread bounded by `deadline` (none: unbounded); the
/// previous deadline is restored afterwards, also on a panic.
pub fn with_deadline<T>(deadline: Option<Instant>, f: impl FnOnce() -> T) -> T {
    struct Restore(Option<Instant>);
    impl Drop for Restore {
        fn drop(&mut self) {
            DEADLINE.with(|d| d.set(self.0));
        }
    }
    let _restore = Restore(DEADLINE.with(|d| d.replace(deadline)));
    f()
}

/// The deadline ops on this thread run under, if any.
pub fn current_deadline() -> Option<Instant> {
    DEADLINE.with(Cell::get)
}

/// `a * b * ...` saturating at `u64::MAX` (work is compared, never allocated).
pub(crate) fn product(dims: &[usize]) -> u64 {
    dims.iter()
        .fold(1u64, |acc, &d| acc.saturating_mul(d as u64))
}

/// A duration as people read it (`1.5 s`, `20 ms`).
fn show(d: Duration) -> String {
    if d >= Duration::from_secs(1) {
        format!("{:.1} s", d.as_secs_f64())
    } else {
        format!("{} ms", d.as_millis())
    }
}

/// Refuses `op` on `device` when `work` units of `kind` cannot be done before this thread's
/// deadline at the device's [`Rate`]. Nothing is refused without a deadline, nor an op with no
/// work.
pub(crate) fn admit(op: &'static str, device: Device, kind: Kind, work: u64) -> Result<()> {
    admit_at(
        op,
        &device.to_string(),
        Rate::of(device).per_second(kind),
        kind,
        work,
    )
}

/// [`admit`] of a host kernel that will run on `threads` threads only (fewer than the pool's:
/// a conv2d with few batches of samples), at the rate of those threads.
pub(crate) fn admit_threads(op: &'static str, kind: Kind, work: u64, threads: usize) -> Result<()> {
    let rate = Rate::HOST_THREAD
        .per_second(kind)
        .saturating_mul(threads.max(1) as u64);
    admit_at(
        op,
        &format!("{} host threads", threads.max(1)),
        rate,
        kind,
        work,
    )
}

/// [`admit`] at `rate` units per second, on `device` (for the error's text).
fn admit_at(op: &'static str, device: &str, rate: u64, kind: Kind, work: u64) -> Result<()> {
    let Some(deadline) = current_deadline() else {
        return Ok(());
    };
    if work == 0 {
        return Ok(());
    }
    let left = deadline.saturating_duration_since(Instant::now());
    // u128: `rate * left` in nanoseconds cannot overflow.
    let limit = (u128::from(rate) * left.as_nanos() / 1_000_000_000).min(u128::from(u64::MAX));
    let limit = limit as u64;
    if work <= limit {
        return Ok(());
    }
    let what = match kind {
        Kind::MultiplyAdds => "multiply-adds",
        Kind::Visits => "element visits",
    };
    Err(TensorError::Deadline {
        op,
        reason: format!(
            "{work} {what} cannot finish in the {} left of this call's deadline: at most {limit} fit on {device} (at {} per second); split it into smaller ops (expanded views count as the elements they show), or raise `deadline` in [train] of the job file",
            show(left),
            rate
        ),
    })
}

/// A kernel's view of the deadline: captured on the caller's thread before the kernel's
/// threads start, checked between chunks.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Deadline(Option<Instant>);

impl Deadline {
    /// The calling thread's deadline.
    pub(crate) fn current() -> Deadline {
        Deadline(current_deadline())
    }

    /// Whether there is a deadline to keep.
    pub(crate) fn is_set(self) -> bool {
        self.0.is_some()
    }

    /// A counter of work done for one task of a kernel.
    pub(crate) fn meter(self, op: &'static str) -> Meter {
        Meter {
            deadline: self.0,
            op,
            since: 0,
        }
    }
}

/// Work done by one task since it last looked at the clock.
#[derive(Debug)]
pub(crate) struct Meter {
    deadline: Option<Instant>,
    op: &'static str,
    since: u64,
}

impl Meter {
    /// Counts `work` more units; every [`CHECK_EVERY`] units, an error once the deadline has
    /// passed.
    pub(crate) fn add(&mut self, work: u64) -> Result<()> {
        let Some(deadline) = self.deadline else {
            return Ok(());
        };
        self.since = self.since.saturating_add(work);
        if self.since < CHECK_EVERY {
            return Ok(());
        }
        self.since = 0;
        if Instant::now() < deadline {
            return Ok(());
        }
        Err(stopped(self.op))
    }
}

/// The error of a kernel stopped at the deadline.
pub(crate) fn stopped(op: &'static str) -> TensorError {
    TensorError::Deadline {
        op,
        reason: "stopped part-way at this call's deadline (its outputs were dropped); split it into smaller ops, or raise `deadline` in [train] of the job file".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_past_the_time_left_is_refused_and_nothing_without_a_deadline() {
        assert!(admit("matmul", Device::Cpu, Kind::MultiplyAdds, u64::MAX).is_ok());
        let soon = Some(Instant::now() + Duration::from_secs(1));
        with_deadline(soon, || {
            assert!(admit("matmul", Device::Cpu, Kind::MultiplyAdds, 1 << 30).is_ok());
            let e = admit("matmul", Device::Sim(0), Kind::MultiplyAdds, u64::MAX).unwrap_err();
            let text = e.to_string();
            assert!(
                text.starts_with("matmul: 18446744073709551615 multiply-adds"),
                "{text}"
            );
            assert!(text.contains("raise `deadline`"), "{text}");
            // A GPU is given more.
            let gpu = 2 * Rate::of(Device::Cpu).multiply_adds;
            assert!(admit("matmul", Device::Cuda(0), Kind::MultiplyAdds, gpu).is_ok());
            assert!(admit("matmul", Device::Cpu, Kind::MultiplyAdds, gpu).is_err());
        });
        // Restored.
        assert_eq!(current_deadline(), None);
    }

    #[test]
    fn a_meter_stops_once_the_deadline_has_passed() {
        let past = Deadline(Some(Instant::now()));
        let mut m = past.meter("op");
        assert!(m.add(CHECK_EVERY - 1).is_ok());
        assert!(m.add(1).is_err());
        let mut none = Deadline(None).meter("op");
        assert!(none.add(u64::MAX).is_ok());
        assert!(none.add(u64::MAX).is_ok());
    }
}
