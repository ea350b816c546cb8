//! Host ops under a deadline (`with_deadline`, as the trainer host runs a plugin's calls): one
//! test per op family. A crafted call (an expanded view's huge shape, a window as large as
//! its input, attention over a million positions, an output that fits the quota but not the
//! time left) ends with the deadline's error, refused before it runs or stopped part-way, within
//! the deadline plus three seconds; ordinary calls under the same deadline still give their
//! values. Every call runs in a pool of two threads (the deadline's rate is per thread), and
//! the tests one at a time. Each crafted call's time is printed
//! (`cargo test -p orch-tensor --test all deadline -- --nocapture`).

use orch_tensor::{Device, MemoryPool, Tensor, TensorError, with_deadline};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The deadline each crafted call runs under.
const DEADLINE: Duration = Duration::from_secs(1);

/// The deadline of calls whose outputs fit the quota but whose work does not fit the time: a
/// millisecond, 2 x 10^8 element visits or multiply-adds at the rate of [`THREADS`].
const SHORT: Duration = Duration::from_millis(1);

/// A simulated GPU with a quota of 4 GiB (CPU kernels, as a trainer's host devices run them).
fn pool() -> Arc<MemoryPool> {
    MemoryPool::new(Device::Sim(0), Some(4 << 30)).expect("a sim pool")
}

/// One element expanded to `shape`: a view that holds 4 bytes whatever it shows.
fn expanded(shape: &[usize], pool: &Arc<MemoryPool>) -> Tensor {
    let one = Tensor::ones(&vec![1; shape.len()], pool).expect("one element");
    let shape: Vec<isize> = shape.iter().map(|&d| d as isize).collect();
    one.expand(&shape).expect("an expanded view")
}

/// Threads of the pool every call here runs in: the rate the deadline admits at is per thread,
/// so what is refused up front must not depend on the machine.
const THREADS: usize = 2;

/// Runs `f` in a pool of [`THREADS`] threads.
fn pinned<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    rayon::ThreadPoolBuilder::new()
        .num_threads(THREADS)
        .build()
        .expect("a thread pool")
        .install(f)
}

/// The tests here time their calls and the chunked products load every core: one at a time.
fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs `call` under `deadline` in a pool of [`THREADS`]: it must end with the deadline's
/// error, and by the deadline plus three seconds (a loaded two-core machine). Returns the
/// error.
#[track_caller]
fn crafted_within(
    what: &str,
    deadline: Duration,
    call: impl FnOnce() -> orch_tensor::Result<Tensor> + Send,
) -> TensorError {
    let started = Instant::now();
    let outcome = pinned(|| with_deadline(Some(started + deadline), call));
    let took = started.elapsed();
    let e = match outcome {
        Ok(t) => panic!(
            "{what}: gave a tensor of {:?} instead of an error",
            t.shape()
        ),
        Err(e) => e,
    };
    println!("crafted {what}: {took:?}: {e}");
    assert!(
        matches!(e, TensorError::Deadline { .. }),
        "{what}: {e} is not the deadline's error"
    );
    let text = e.to_string();
    assert!(
        text.contains("deadline") && !text.contains('\n'),
        "{what}: {text}"
    );
    assert!(
        took <= deadline + Duration::from_secs(3),
        "{what} ran {took:?}, past the deadline of {deadline:?} plus three seconds"
    );
    e
}

/// [`crafted_within`] under [`DEADLINE`].
#[track_caller]
fn crafted(what: &str, call: impl FnOnce() -> orch_tensor::Result<Tensor> + Send) -> TensorError {
    crafted_within(what, DEADLINE, call)
}

/// `call` under the same deadline gives its value.
fn honest<T: Send>(call: impl FnOnce() -> orch_tensor::Result<T> + Send) -> T {
    pinned(|| with_deadline(Some(Instant::now() + DEADLINE), call))
        .expect("an ordinary op under a deadline")
}

#[test]
fn matmul_of_expanded_views_is_bounded_by_the_deadline() {
    let _serial = serial();
    let pool = pool();
    let big = (1usize << 31) - 1;
    // 256 * 256 * (2^31 - 1) multiply-adds over views of 4 bytes each: refused before it runs.
    let (a, b) = (expanded(&[256, big], &pool), expanded(&[big, 256], &pool));
    crafted(
        "matmul [256, 2^31-1] @ [2^31-1, 256] of expanded views",
        || a.matmul(&b),
    );
    // 2^37 multiply-adds: within what a fast host is assumed to do in a second, so run in
    // chunks that look at the clock (refused up front where the host has few threads).
    let (a, b) = (expanded(&[1, big], &pool), expanded(&[big, 64], &pool));
    crafted(
        "matmul [1, 2^31-1] @ [2^31-1, 64] of expanded views",
        || a.matmul(&b),
    );
    // Batched through a broadcast batch dimension: the batch counts too. The output (256 MiB)
    // fits the quota; 2^32 multiply-adds do not fit a millisecond.
    let (a, b) = (
        expanded(&[1 << 14, 64, 64], &pool),
        Tensor::ones(&[64, 64], &pool).unwrap(),
    );
    crafted_within("matmul [2^14, 64, 64] (expanded) @ [64, 64]", SHORT, || {
        a.matmul(&b)
    });
    let x = Tensor::from_slice(&[1.0, 2.0, 3.0, 4.0], &[2, 2], &pool).unwrap();
    assert_eq!(
        honest(|| x.matmul(&x)?.to_vec()),
        vec![7.0, 10.0, 15.0, 22.0]
    );
}

/// `a @ b` under a far deadline (so in chunks, in a pool of `threads`) against one call: equal up
/// to float rounding, the error bound growing with the inner dimension `k`.
#[track_caller]
fn chunked_equals_one_call(what: &str, a: &Tensor, b: &Tensor, k: usize) {
    let whole = a.matmul(b).unwrap().to_vec().unwrap();
    for threads in [1, 2] {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        let far = Some(Instant::now() + Duration::from_secs(600));
        let chunked = pool.install(|| with_deadline(far, || a.matmul(b)?.to_vec()).unwrap());
        assert_eq!(chunked.len(), whole.len(), "{what}");
        let tolerance = 1e-6 * k as f32 + 1e-4;
        for (idx, (c, w)) in chunked.iter().zip(&whole).enumerate() {
            assert!(
                (c - w).abs() <= tolerance,
                "{what}, {threads} threads, at {idx}: {c} chunked, {w} in one call"
            );
        }
    }
}

/// Products large enough to run in chunks under a deadline (over 2^31 multiply-adds per thread)
/// give the values of one call, up to float rounding, on random values: blocks of rows, blocks
/// of columns of a transposed operand, the inner dimension cut of a broadcast operand, groups
/// of a batch (the second starting past the first product) over a broadcast batch dimension,
/// and blocks of rows of each product of a batch.
#[test]
fn a_chunked_matmul_gives_the_values_of_one_call() {
    let _serial = serial();
    let pool = MemoryPool::new(Device::Cpu, None).unwrap();
    let randn = |shape: &[usize], seed| Tensor::randn(shape, seed, &pool).unwrap();

    let (a, b) = (randn(&[6000, 1024], 1), randn(&[1024, 1000], 2));
    chunked_equals_one_call("rows [6000, 1024] @ [1024, 1000]", &a, &b, 1024);

    let (a, b) = (randn(&[4096, 300], 3).t().unwrap(), randn(&[4096, 4000], 4));
    chunked_equals_one_call("columns [4096, 300]^T @ [4096, 4000]", &a, &b, 4096);

    let k = (1 << 21) + 4096;
    let a = randn(&[8, k], 5);
    let b = randn(&[1, 256], 6).expand(&[k as isize, 256]).unwrap();
    chunked_equals_one_call("inner [8, 2^21+4096] @ [1, 256] expanded", &a, &b, k);

    let (a, b) = (randn(&[80, 256, 512], 7), randn(&[512, 512], 8));
    chunked_equals_one_call("batch groups [80, 256, 512] @ [512, 512]", &a, &b, 512);

    let (a, b) = (randn(&[2, 2100, 2048], 9), randn(&[2048, 1024], 10));
    chunked_equals_one_call("batch rows [2, 2100, 2048] @ [2048, 1024]", &a, &b, 2048);
}

#[test]
fn pooling_with_windows_as_large_as_the_input_is_bounded_by_the_deadline() {
    let _serial = serial();
    let pool = pool();
    let x = Tensor::randn(&[1, 1, 1024, 1024], 1, &pool).unwrap();
    // 1025 x 1025 windows of 1024 x 1024: about 10^12 element visits.
    crafted("max_pool2d, 1024x1024 windows over 1024x1024", || {
        x.max_pool2d([1024, 1024], [1, 1], [512, 512])
    });
    // About 7 * 10^10: may pass the check before it runs, and is stopped part-way.
    crafted("avg_pool2d, 256x256 windows over 1024x1024", || {
        x.avg_pool2d([256, 256], [1, 1], [128, 128])
    });
    crafted("max_pool2d, 256x256 windows over 1024x1024", || {
        x.max_pool2d([256, 256], [1, 1], [128, 128])
    });
    let small = Tensor::randn(&[2, 3, 8, 8], 2, &pool).unwrap();
    assert_eq!(
        honest(|| small.max_pool2d([2, 2], [2, 2], [0, 0])).shape(),
        &[2, 3, 4, 4]
    );
}

#[test]
fn conv2d_over_expanded_inputs_is_bounded_by_the_deadline() {
    let _serial = serial();
    let pool = pool();
    // 2^34 input elements shown by 4 bytes, 256 filters of 3x3: refused before anything is
    // made dense.
    let x = expanded(&[64, 256, 1024, 1024], &pool);
    let w = Tensor::ones(&[256, 256, 3, 3], &pool).unwrap();
    crafted("conv2d of an expanded [64, 256, 1024, 1024]", || {
        x.conv2d(&w, None, [1, 1], [1, 1], [1, 1], 1)
    });
    // A real input with a kernel as large as its plane.
    let x = Tensor::randn(&[1, 1, 512, 512], 1, &pool).unwrap();
    let w = Tensor::ones(&[256, 1, 512, 512], &pool).unwrap();
    crafted(
        "conv2d [1, 1, 512, 512] by 256 kernels of 512x512, padding 256",
        || x.conv2d(&w, None, [1, 1], [256, 256], [1, 1], 1),
    );
    let x = Tensor::randn(&[2, 3, 8, 8], 1, &pool).unwrap();
    let w = Tensor::randn(&[4, 3, 3, 3], 2, &pool).unwrap();
    let y = honest(|| x.conv2d(&w, None, [1, 1], [1, 1], [1, 1], 1));
    assert_eq!(y.shape(), &[2, 4, 8, 8]);
    // Two samples, each one single-threaded product (2.7 x 10^11 multiply-adds in all): the op
    // uses two threads of a pool of eight, so it is refused at two threads' rate, not run for
    // seconds until the clock is looked at between samples.
    let x = Tensor::randn(&[2, 64, 96, 96], 2, &pool).unwrap();
    let w = Tensor::zeros(&[4096, 64, 8, 8], &pool).unwrap();
    let wide = rayon::ThreadPoolBuilder::new()
        .num_threads(8)
        .build()
        .unwrap();
    let started = Instant::now();
    let far = Some(started + DEADLINE);
    let e = wide
        .install(|| with_deadline(far, || x.conv2d(&w, None, [1, 1], [0, 0], [1, 1], 1)))
        .unwrap_err();
    println!(
        "conv2d of two samples on 8 threads: {:?}: {e}",
        started.elapsed()
    );
    assert!(
        matches!(e, TensorError::Deadline { .. }) && e.to_string().contains("cannot finish"),
        "{e}"
    );
    // One sample, one product of 1.8 x 10^11 multiply-adds: admitted (it fits the second at
    // the assumed peak rate of two threads), then stopped between blocks of its output
    // channels once the deadline passes.
    let x = Tensor::randn(&[1, 64, 71, 135], 3, &pool).unwrap();
    let w = Tensor::zeros(&[5376, 64, 8, 8], &pool).unwrap();
    let e = crafted("conv2d of one sample, 1.8 x 10^11 multiply-adds", || {
        x.conv2d(&w, None, [1, 1], [0, 0], [1, 1], 1)
    });
    assert!(e.to_string().contains("stopped part-way"), "{e}");
}

#[test]
fn causal_attention_over_a_million_positions_is_bounded_by_the_deadline() {
    let _serial = serial();
    let pool = pool();
    let t = 1usize << 20;
    // q, k and v of 2^20 positions and one dimension: 4 MiB each.
    let q = Tensor::randn(&[1, 1, t, 1], 1, &pool).unwrap();
    crafted("causal attention over 2^20 positions", || {
        Tensor::scaled_dot_product_attention(&q, &q, &q, true, None, None)
    });
    // Expanded over 2^20 heads: refused before anything is made dense.
    let q = expanded(&[1 << 10, 1 << 10, 1024, 64], &pool);
    crafted("attention over 2^20 expanded heads", || {
        Tensor::scaled_dot_product_attention(&q, &q, &q, false, None, None)
    });
    let q = Tensor::randn(&[1, 2, 5, 4], 1, &pool).unwrap();
    let y = honest(|| Tensor::scaled_dot_product_attention(&q, &q, &q, true, None, None));
    assert_eq!(y.shape(), &[1, 2, 5, 4]);
}

#[test]
fn norms_over_expanded_inputs_are_bounded_by_the_deadline() {
    let _serial = serial();
    let pool = pool();
    let x = expanded(&[1 << 16, 1 << 16, 1 << 8], &pool);
    crafted("layer_norm over an expanded [2^16, 2^16, 2^8]", || {
        x.layer_norm(1, None, None, 1e-5)
    });
    let x = expanded(&[1 << 16, 1 << 8, 1 << 16], &pool);
    let (mean, var) = (
        Tensor::zeros(&[1 << 8], &pool).unwrap(),
        Tensor::ones(&[1 << 8], &pool).unwrap(),
    );
    crafted("batch_norm over an expanded [2^16, 2^8, 2^16]", || {
        x.batch_norm(&mean, &var, None, None, true, 0.1, 1e-5)
    });
    let x = Tensor::randn(&[4, 6], 1, &pool).unwrap();
    assert_eq!(
        honest(|| x.layer_norm(1, None, None, 1e-5)).shape(),
        &[4, 6]
    );
}

#[test]
fn elementwise_ops_over_expanded_views_are_bounded_by_the_deadline() {
    let _serial = serial();
    let pool = pool();
    // Outputs (and dense copies) that fit the quota, but not the millisecond left: 2^28
    // elements, each visited.
    let (a, b) = (
        expanded(&[1 << 14, 1 << 14], &pool),
        expanded(&[1 << 14, 1 << 14], &pool),
    );
    crafted_within("add of two expanded [2^14, 2^14]", SHORT, || a.add(&b));
    crafted_within("gelu of an expanded [2^14, 2^14]", SHORT, || a.gelu());
    let x = Tensor::from_slice(&[1.0, -2.0], &[2], &pool).unwrap();
    assert_eq!(honest(|| x.add(&x)?.to_vec()), vec![2.0, -4.0]);
}

#[test]
fn reductions_over_expanded_views_are_bounded_by_the_deadline() {
    let _serial = serial();
    let pool = pool();
    // The dense copy of the view fits the quota; 2^28 element visits do not fit a millisecond.
    let x = expanded(&[1 << 14, 1 << 14], &pool);
    crafted_within("sum of an expanded [2^14, 2^14]", SHORT, || {
        x.sum(&[1], false)
    });
    crafted_within("max of an expanded [2^14, 2^14]", SHORT, || {
        x.max(&[0], false)
    });
    crafted_within("softmax of an expanded [2^14, 2^14]", SHORT, || {
        x.softmax(-1)
    });
    let x = Tensor::from_slice(&[1.0, 2.0, 3.0, 4.0], &[2, 2], &pool).unwrap();
    assert_eq!(honest(|| x.sum(&[1], false)?.to_vec()), vec![3.0, 7.0]);
}

/// A deadline already past refuses every op with work, and ops with none still run.
#[test]
fn a_passed_deadline_refuses_work_and_leaves_nothing_behind() {
    let _serial = serial();
    let pool = pool();
    let x = Tensor::randn(&[64, 64], 1, &pool).unwrap();
    let before = pool.in_use();
    let e = with_deadline(Some(Instant::now()), || x.matmul(&x)).unwrap_err();
    assert!(matches!(e, TensorError::Deadline { .. }), "{e}");
    assert_eq!(pool.in_use(), before, "a refused op holds no memory");
    let empty = Tensor::zeros(&[0, 64], &pool).unwrap();
    let y = with_deadline(Some(Instant::now()), || empty.matmul(&x)).unwrap();
    assert_eq!(y.shape(), &[0, 64]);
}
