//! What a refused argument costs the host, and names the checkpoint format reserves: a value a
//! plugin passes (a name, a shape, a list of axes) is checked before anything of it is widened,
//! copied or quoted, so refusing it costs the host a few bytes however large it is, and the
//! sentence quotes a short prefix.

use super::tests::{Handle, borrow, error, full, state, value};
use super::*;
use orch_wit::trainer::orch::plugin::metrics::Host as Metrics;
use orch_wit::trainer::orch::plugin::optim::{
    HostOptimizer, OptimizerConfig, ParamGroup, SgdConfig,
};
use orch_wit::trainer::orch::plugin::params::Host as _;
use orch_wit::trainer::orch::plugin::tensors::{Host as Tensors, ReduceOp};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// Counts the bytes each thread allocates (for [`allocated_by`]); forwards everything to
/// `System` unchanged.
struct Counting;

thread_local! {
    static ALLOCATED: Cell<usize> = const { Cell::new(0) };
}

fn count(bytes: usize) {
    // `try_with`: never a panic inside the allocator, also while a thread ends.
    let _ = ALLOCATED.try_with(|a| a.set(a.get().saturating_add(bytes)));
}

// SAFETY: every method forwards to `System` with the caller's arguments unchanged; the count
// is bookkeeping only.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        // SAFETY: the caller's contract for `GlobalAlloc::alloc` is passed on as it is.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        // SAFETY: as for `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by `System` (through this allocator) with `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(new_size.saturating_sub(layout.size()));
        // SAFETY: as for `dealloc`, and `new_size` is the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// What `f` returned, and the bytes this thread allocated while it ran.
fn allocated_by<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let before = ALLOCATED.with(Cell::get);
    let out = f();
    (out, ALLOCATED.with(Cell::get) - before)
}

/// Most bytes a refusal may cost the host: the sentence and its bookkeeping, nothing the size
/// of the argument.
const REFUSAL_BYTES: usize = 64 << 10;

/// The sentence of a `bad-argument` (or `not-now`) value.
fn sentence(e: &WitError) -> &str {
    match e {
        WitError::BadArgument(m) | WitError::NotNow(m) => m,
        other => panic!("expected bad-argument or not-now, got {other:?}"),
    }
}

/// Finding: a 120 MiB name took the host to 857 MiB (the name quoted whole, then copied again).
#[test]
fn a_huge_name_is_refused_with_a_short_quote_and_no_copy() {
    let mut s = state();
    let init = full(&mut s, &[1], 0.0);
    let huge = "w".repeat(64 << 20);
    for init_phase in [true, false] {
        for buffer in [false, true] {
            s.phase = if init_phase { Phase::Init } else { Phase::Idle };
            let name = huge.clone();
            let (answer, bytes) = allocated_by(|| {
                if buffer {
                    s.register_buffer(name, borrow(&init))
                } else {
                    s.register(name, borrow(&init))
                }
            });
            let e = error(answer);
            let text = sentence(&e);
            assert!(text.len() < 400, "{} bytes: {}", text.len(), &text[..400]);
            assert!(text.contains(&format!("{} bytes", 64 << 20)), "{text}");
            assert!(bytes < REFUSAL_BYTES, "the refusal allocated {bytes} bytes");
        }
    }
    s.phase = Phase::Idle;

    // A group naming a parameter nobody registered, by a huge name.
    let _w = value({
        s.phase = Phase::Init;
        s.register("w".into(), borrow(&init))
    });
    let group = ParamGroup {
        params: vec![huge.clone()],
        lr: 0.1,
        weight_decay: 0.0,
    };
    let sgd = OptimizerConfig::Sgd(SgdConfig {
        lr: 0.1,
        momentum: 0.0,
        weight_decay: 0.0,
        nesterov: false,
    });
    let (answer, bytes) = allocated_by(|| s.create_grouped(sgd, vec![group]));
    let e = error(answer);
    assert!(sentence(&e).len() < 400, "{}", sentence(&e).len());
    assert!(
        bytes < REFUSAL_BYTES,
        "create-grouped allocated {bytes} bytes"
    );
    s.phase = Phase::Idle;

    // A huge log line and scalar name are cut without being copied whole.
    let line = huge.clone();
    let ((), bytes) = allocated_by(|| Metrics::log(&mut s, Level::Info, line).unwrap());
    assert!(bytes < REFUSAL_BYTES, "metrics.log allocated {bytes} bytes");
    let name = huge;
    let ((), bytes) = allocated_by(|| Metrics::scalar(&mut s, name, 1.0).unwrap());
    assert!(
        bytes < REFUSAL_BYTES,
        "metrics.scalar allocated {bytes} bytes"
    );
    let (_, warning) = s.take_cut_notice().expect("a notice");
    assert!(warning.contains("cut at 1000 characters"), "{warning}");
}

/// Finding: a 50-million-entry shape list took the host to 1.6 GB (widened to `usize`, then
/// formatted whole into the error).
#[test]
fn a_shape_of_millions_of_dimensions_is_refused_before_it_is_widened() {
    let mut s = state();
    let x = full(&mut s, &[2, 2], 1.0);
    const ENTRIES: usize = 10_000_000;
    type Answer = wasmtime::Result<Result<Handle, WitError>>;
    type Call = Box<dyn FnOnce(&mut ReplicaState, &Handle) -> Answer>;
    // The lists are the plugin's, made before the count starts (as wasmtime makes them).
    let dims = || vec![1u32; ENTRIES];
    let axes = || vec![0i32; ENTRIES];
    let calls: Vec<(&str, Call)> = vec![
        ("full", {
            let d = dims();
            Box::new(move |s, _| s.full(d, 0.0, None))
        }),
        ("from-list", {
            let d = dims();
            Box::new(move |s, _| s.from_list(vec![1.0], d, None))
        }),
        ("randn", {
            let d = dims();
            Box::new(move |s, _| s.randn(d, 1.0, 1, None))
        }),
        ("uniform", {
            let d = dims();
            Box::new(move |s, _| s.uniform(d, 0.0, 1.0, 1, None))
        }),
        ("reshape", {
            let d = dims();
            Box::new(move |s, x| s.reshape(borrow(x), d))
        }),
        ("permute", {
            let d = dims();
            Box::new(move |s, x| s.permute(borrow(x), d))
        }),
        ("expand", {
            let a = axes();
            Box::new(move |s, x| s.expand(borrow(x), a))
        }),
        ("reduce", {
            let a = axes();
            Box::new(move |s, x| s.reduce(ReduceOp::Sum, borrow(x), a, false))
        }),
        ("pad", {
            let p = vec![(0, 0); ENTRIES];
            Box::new(move |s, x| s.pad(borrow(x), p, 0.0))
        }),
    ];
    for (op, call) in calls {
        let (answer, bytes) = allocated_by(|| call(&mut s, &x));
        let e = error(answer);
        let text = sentence(&e);
        assert!(
            text.len() < 200 && text.contains("10000000") && text.contains("at most 32"),
            "{op}: {text}"
        );
        assert!(
            bytes < REFUSAL_BYTES,
            "{op}: the host allocated {bytes} bytes"
        );
    }
}

/// Finding: a parameter or buffer named `__metadata__` was accepted, and its checkpoint could
/// not be read back ("duplicate field `__metadata__`").
#[test]
fn names_the_checkpoint_format_reserves_are_refused_at_registration() {
    let mut s = state();
    let init = full(&mut s, &[1], 0.0);
    s.phase = Phase::Init;
    for name in crate::host::graph::RESERVED_NAMES {
        for e in [
            error(s.register((*name).into(), borrow(&init))),
            error(s.register_buffer((*name).into(), borrow(&init))),
        ] {
            let text = sentence(&e);
            assert!(
                text.contains(name) && text.contains("reserved by the checkpoint format"),
                "{text}"
            );
        }
    }
    // Names around it are fine.
    value(s.register("__metadata".into(), borrow(&init)));
    value(s.register_buffer("metadata__".into(), borrow(&init)));
    assert_eq!(s.params.len(), 1);
    assert_eq!(s.buffers.len(), 1);
}
