//! A global allocator that counts the bytes alive and bounds what one fuzz case may hold.
//!
//! Around each case the runner calls [`start_case`] and [`end_case`]; between the two the peak of
//! live bytes (over every thread, so rayon's workers count too) is measured against the case's
//! start. A case that would pass its hard bound gets a failed allocation, which aborts the
//! process with a line naming the seed to replay: Rust cannot unwind out of an allocator, and
//! letting the allocation through would take the machine's memory with it (an unbounded request
//! is exactly what is being looked for). Below the hard bound, the runner compares the peak with
//! the case's own bound and fails the case normally, so proptest can shrink it.
//!
//! A fuzz test binary holds one test, so nothing else allocates in parallel with a case.

use std::alloc::{GlobalAlloc, Layout, System};
use std::io::Write;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// The allocator (installed by this crate for every binary that links it).
#[derive(Debug)]
pub struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);
/// Live bytes past which an allocation fails (no bound outside a case).
static HARD_LIMIT: AtomicUsize = AtomicUsize::new(usize::MAX);
/// The seed of the running batch, for the abort message.
static SEED: AtomicU64 = AtomicU64::new(0);

// SAFETY: every method forwards to `System` with the caller's arguments unchanged; the counters
// are bookkeeping only and never change what is allocated or freed.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if !reserve(layout.size()) {
            return std::ptr::null_mut();
        }
        // SAFETY: the caller's contract for `GlobalAlloc::alloc` is passed on as it is.
        let p = unsafe { System.alloc(layout) };
        if p.is_null() {
            release(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if !reserve(layout.size()) {
            return std::ptr::null_mut();
        }
        // SAFETY: as for `alloc`.
        let p = unsafe { System.alloc_zeroed(layout) };
        if p.is_null() {
            release(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by `System` (through this allocator) with `layout`.
        unsafe { System.dealloc(ptr, layout) };
        release(layout.size());
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let old = layout.size();
        if new_size > old && !reserve(new_size - old) {
            return std::ptr::null_mut();
        }
        // SAFETY: as for `dealloc`, and `new_size` is the caller's.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        match (p.is_null(), new_size > old) {
            (true, true) => release(new_size - old),
            (false, false) => release(old - new_size),
            _ => {}
        }
        p
    }
}

fn reserve(bytes: usize) -> bool {
    let live = LIVE
        .fetch_add(bytes, Ordering::Relaxed)
        .saturating_add(bytes);
    if live > HARD_LIMIT.load(Ordering::Relaxed) {
        LIVE.fetch_sub(bytes, Ordering::Relaxed);
        say_over_limit(bytes);
        return false;
    }
    PEAK.fetch_max(live, Ordering::Relaxed);
    true
}

fn release(bytes: usize) {
    LIVE.fetch_sub(bytes, Ordering::Relaxed);
}

/// Writes why the process is about to abort, without allocating (a fixed buffer on the stack).
fn say_over_limit(bytes: usize) {
    struct Line {
        buf: [u8; 256],
        len: usize,
    }
    impl std::fmt::Write for Line {
        fn write_str(&mut self, s: &str) -> std::fmt::Result {
            let n = s.len().min(self.buf.len() - self.len);
            self.buf[self.len..self.len + n].copy_from_slice(&s.as_bytes()[..n]);
            self.len += n;
            Ok(())
        }
    }
    let mut line = Line {
        buf: [0; 256],
        len: 0,
    };
    let seed = SEED.load(Ordering::Relaxed);
    let _ = std::fmt::Write::write_fmt(
        &mut line,
        format_args!(
            "fuzz: a case asked for {bytes} bytes more, past its hard bound; replay with ORCH_FUZZ_SEED={seed} ORCH_FUZZ_TRACE=1\n"
        ),
    );
    let _ = std::io::stderr().write_all(&line.buf[..line.len]);
}

/// Starts measuring a case: returns the live bytes now, the base its peak is measured from.
/// An allocation that would take the live bytes past `base + hard_bound` fails.
pub fn start_case(seed: u64, hard_bound: usize) -> usize {
    SEED.store(seed, Ordering::Relaxed);
    let base = LIVE.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    HARD_LIMIT.store(base.saturating_add(hard_bound), Ordering::Relaxed);
    base
}

/// Ends the case started at `base`: the most bytes it held at once beyond `base`.
pub fn end_case(base: usize) -> usize {
    HARD_LIMIT.store(usize::MAX, Ordering::Relaxed);
    PEAK.load(Ordering::Relaxed).saturating_sub(base)
}

/// Bytes alive now.
pub fn live() -> usize {
    LIVE.load(Ordering::Relaxed)
}
