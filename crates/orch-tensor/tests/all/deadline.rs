//! Host ops under a deadline (`with_deadline`, as the trainer host runs a plugin's calls): one
//! test per op family. A crafted call (an expanded view's huge shape, a window as large as
//! its input, attention over a million positions) ends within the deadline plus one second
//! with an error value, refused before it runs or stopped part-way; ordinary calls under the
//! same deadline still give their values. Each crafted call's time is printed
//! (`cargo test -p orch-tensor --test all deadline -- --nocapture`).

use orch_tensor::{Device, MemoryPool, Tensor, TensorError, with_deadline};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The deadline each crafted call runs under.
const DEADLINE: Duration = Duration::from_secs(1);

/// A simulated GPU with a quota of 1 GiB (CPU kernels, as a trainer's host devices run them).
fn pool() -> Arc<MemoryPool> {
    MemoryPool::new(Device::Sim(0), Some(1 << 30)).expect("a sim pool")
}

/// One element expanded to `shape`: a view that holds 4 bytes whatever it shows.
fn expanded(shape: &[usize], pool: &Arc<MemoryPool>) -> Tensor {
    let one = Tensor::ones(&vec![1; shape.len()], pool).expect("one element");
    let shape: Vec<isize> = shape.iter().map(|&d| d as isize).collect();
    one.expand(&shape).expect("an expanded view")
}

/// Runs `call` under [`DEADLINE`]: it must end by the deadline plus one second with an error
/// (a deadline error when `deadline_error`; any error value otherwise, such as the quota
/// refusing the output an expanded view would need). Returns how long it ran.
#[track_caller]
fn crafted(what: &str, deadline_error: bool, call: impl FnOnce() -> orch_tensor::Result<Tensor>) {
    let started = Instant::now();
    let outcome = with_deadline(Some(started + DEADLINE), call);
    let took = started.elapsed();
    println!("crafted {what}: {took:?}");
    let e = match outcome {
        Ok(t) => panic!(
            "{what}: gave a tensor of {:?} instead of an error",
            t.shape()
        ),
        Err(e) => e,
    };
    assert!(
        took <= DEADLINE + Duration::from_secs(1),
        "{what} ran {took:?}, past the deadline of {DEADLINE:?} plus one second"
    );
    if deadline_error {
        assert!(
            matches!(e, TensorError::Deadline { .. }),
            "{what}: {e} is not the deadline's error"
        );
        let text = e.to_string();
        assert!(
            text.contains("deadline") && !text.contains('\n'),
            "{what}: {text}"
        );
    }
}

/// `call` under the same deadline gives its value.
fn honest<T>(call: impl FnOnce() -> orch_tensor::Result<T>) -> T {
    with_deadline(Some(Instant::now() + DEADLINE), call).expect("an ordinary op under a deadline")
}

#[test]
fn matmul_of_expanded_views_is_bounded_by_the_deadline() {
    let pool = pool();
    let big = (1usize << 31) - 1;
    // 256 * 256 * (2^31 - 1) multiply-adds over views of 4 bytes each: refused before it runs.
    let (a, b) = (expanded(&[256, big], &pool), expanded(&[big, 256], &pool));
    crafted(
        "matmul [256, 2^31-1] @ [2^31-1, 256] of expanded views",
        true,
        || a.matmul(&b),
    );
    // 2^37 multiply-adds: within what a fast host is assumed to do in a second, so run in
    // chunks that look at the clock (refused up front where the host has few threads).
    let (a, b) = (expanded(&[1, big], &pool), expanded(&[big, 64], &pool));
    crafted(
        "matmul [1, 2^31-1] @ [2^31-1, 64] of expanded views",
        true,
        || a.matmul(&b),
    );
    // Batched through a broadcast batch dimension: the batch counts too.
    let (a, b) = (
        expanded(&[1 << 20, 64, 64], &pool),
        Tensor::ones(&[64, 64], &pool).unwrap(),
    );
    crafted("matmul [2^20, 64, 64] (expanded) @ [64, 64]", false, || {
        a.matmul(&b)
    });
    let x = Tensor::from_slice(&[1.0, 2.0, 3.0, 4.0], &[2, 2], &pool).unwrap();
    assert_eq!(
        honest(|| x.matmul(&x)?.to_vec()),
        vec![7.0, 10.0, 15.0, 22.0]
    );
}

/// A product large enough to run in chunks of rows and of the inner dimension under a
/// deadline gives the same values as one call.
#[test]
fn a_chunked_matmul_gives_the_values_of_one_call() {
    let pool = pool();
    let (m, k, n) = (2usize, 1 << 17, 4096);
    // Sums of 0s and 1s below 2^24: exact in f32 whatever the order.
    let a: Vec<f32> = (0..m * k).map(|i| ((i / 3) % 2) as f32).collect();
    let a = Tensor::from_slice(&a, &[m, k], &pool).unwrap();
    let row: Vec<f32> = (0..n).map(|j| (j % 7) as f32).collect();
    let b = Tensor::from_slice(&row, &[1, n], &pool).unwrap();
    let b = b.expand(&[k as isize, n as isize]).unwrap();
    let far = Some(Instant::now() + Duration::from_secs(600));
    let chunked = with_deadline(far, || a.matmul(&b)?.to_vec()).unwrap();
    let whole = a.matmul(&b).unwrap().to_vec().unwrap();
    assert_eq!(chunked, whole);
    let ones_per_row: Vec<f32> = a.sum(&[1], false).unwrap().to_vec().unwrap();
    for (idx, v) in chunked.iter().enumerate() {
        assert_eq!(*v, ones_per_row[idx / n] * (idx % n % 7) as f32, "at {idx}");
    }
}

#[test]
fn pooling_with_windows_as_large_as_the_input_is_bounded_by_the_deadline() {
    let pool = pool();
    let x = Tensor::randn(&[1, 1, 1024, 1024], 1, &pool).unwrap();
    // 1025 x 1025 windows of 1024 x 1024: about 10^12 element visits.
    crafted("max_pool2d, 1024x1024 windows over 1024x1024", true, || {
        x.max_pool2d([1024, 1024], [1, 1], [512, 512])
    });
    // About 7 * 10^10: may pass the check before it runs, and is stopped part-way.
    crafted("avg_pool2d, 256x256 windows over 1024x1024", true, || {
        x.avg_pool2d([256, 256], [1, 1], [128, 128])
    });
    crafted("max_pool2d, 256x256 windows over 1024x1024", true, || {
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
    let pool = pool();
    // 2^34 input elements shown by 4 bytes, 256 filters of 3x3: refused before anything is
    // made dense.
    let x = expanded(&[64, 256, 1024, 1024], &pool);
    let w = Tensor::ones(&[256, 256, 3, 3], &pool).unwrap();
    crafted("conv2d of an expanded [64, 256, 1024, 1024]", true, || {
        x.conv2d(&w, None, [1, 1], [1, 1], [1, 1], 1)
    });
    // A real input with a kernel as large as its plane.
    let x = Tensor::randn(&[1, 1, 512, 512], 1, &pool).unwrap();
    let w = Tensor::ones(&[256, 1, 512, 512], &pool).unwrap();
    crafted(
        "conv2d [1, 1, 512, 512] by 256 kernels of 512x512, padding 256",
        false,
        || x.conv2d(&w, None, [1, 1], [256, 256], [1, 1], 1),
    );
    let x = Tensor::randn(&[2, 3, 8, 8], 1, &pool).unwrap();
    let w = Tensor::randn(&[4, 3, 3, 3], 2, &pool).unwrap();
    let y = honest(|| x.conv2d(&w, None, [1, 1], [1, 1], [1, 1], 1));
    assert_eq!(y.shape(), &[2, 4, 8, 8]);
}

#[test]
fn causal_attention_over_a_million_positions_is_bounded_by_the_deadline() {
    let pool = pool();
    let t = 1usize << 20;
    // q, k and v of 2^20 positions and one dimension: 4 MiB each.
    let q = Tensor::randn(&[1, 1, t, 1], 1, &pool).unwrap();
    crafted("causal attention over 2^20 positions", true, || {
        Tensor::scaled_dot_product_attention(&q, &q, &q, true, None, None)
    });
    // Expanded over 2^20 heads: refused before anything is made dense.
    let q = expanded(&[1 << 10, 1 << 10, 1024, 64], &pool);
    crafted("attention over 2^20 expanded heads", true, || {
        Tensor::scaled_dot_product_attention(&q, &q, &q, false, None, None)
    });
    let q = Tensor::randn(&[1, 2, 5, 4], 1, &pool).unwrap();
    let y = honest(|| Tensor::scaled_dot_product_attention(&q, &q, &q, true, None, None));
    assert_eq!(y.shape(), &[1, 2, 5, 4]);
}

#[test]
fn norms_over_expanded_inputs_are_bounded_by_the_deadline() {
    let pool = pool();
    let x = expanded(&[1 << 16, 1 << 16, 1 << 8], &pool);
    crafted(
        "layer_norm over an expanded [2^16, 2^16, 2^8]",
        true,
        || x.layer_norm(1, None, None, 1e-5),
    );
    let x = expanded(&[1 << 16, 1 << 8, 1 << 16], &pool);
    let (mean, var) = (
        Tensor::zeros(&[1 << 8], &pool).unwrap(),
        Tensor::ones(&[1 << 8], &pool).unwrap(),
    );
    crafted(
        "batch_norm over an expanded [2^16, 2^8, 2^16]",
        true,
        || x.batch_norm(&mean, &var, None, None, true, 0.1, 1e-5),
    );
    let x = Tensor::randn(&[4, 6], 1, &pool).unwrap();
    assert_eq!(
        honest(|| x.layer_norm(1, None, None, 1e-5)).shape(),
        &[4, 6]
    );
}

#[test]
fn elementwise_ops_over_expanded_views_are_bounded_by_the_deadline() {
    let pool = pool();
    // Each output element must exist: the quota or the deadline refuses it before it runs.
    let (a, b) = (
        expanded(&[1 << 20, 1 << 20], &pool),
        expanded(&[1 << 20, 1 << 20], &pool),
    );
    crafted("add of two expanded [2^20, 2^20]", false, || a.add(&b));
    crafted("gelu of an expanded [2^20, 2^20]", false, || a.gelu());
    let x = Tensor::from_slice(&[1.0, -2.0], &[2], &pool).unwrap();
    assert_eq!(honest(|| x.add(&x)?.to_vec()), vec![2.0, -4.0]);
}

#[test]
fn reductions_over_expanded_views_are_bounded_by_the_deadline() {
    let pool = pool();
    let x = expanded(&[1 << 20, 1 << 20], &pool);
    crafted("sum of an expanded [2^20, 2^20]", false, || {
        x.sum(&[1], false)
    });
    crafted("max of an expanded [2^20, 2^20]", false, || {
        x.max(&[0], false)
    });
    crafted("softmax of an expanded [2^20, 2^20]", false, || {
        x.softmax(-1)
    });
    let x = Tensor::from_slice(&[1.0, 2.0, 3.0, 4.0], &[2, 2], &pool).unwrap();
    assert_eq!(honest(|| x.sum(&[1], false)?.to_vec()), vec![3.0, 7.0]);
}

/// A deadline already past refuses every op with work, and ops with none still run.
#[test]
fn a_passed_deadline_refuses_work_and_leaves_nothing_behind() {
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
