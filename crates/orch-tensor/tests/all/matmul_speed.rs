//! Timing of the products of a GPT training step (width 768, 8192 tokens) with and without a
//! step deadline: a deadline must not make an honest product slower. Ignored by default; run
//! `cargo test --release -p orch-tensor --test all _speed_ -- --ignored --nocapture`.

use orch_tensor::{Device, MemoryPool, Tensor, with_deadline};
use std::time::{Duration, Instant};

/// Best of `rounds` runs of `f`, in milliseconds.
fn best(rounds: usize, f: impl Fn()) -> f64 {
    (0..rounds)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64() * 1e3
        })
        .fold(f64::INFINITY, f64::min)
}

#[test]
#[ignore = "a timing, run by hand in release mode"]
fn matmul_speed_of_a_gpt_step_with_and_without_a_deadline() {
    let pool = MemoryPool::new(Device::Cpu, None).unwrap();
    let x = Tensor::randn(&[8192, 768], 1, &pool).unwrap();
    let w = Tensor::randn(&[768, 3072], 2, &pool).unwrap();
    let g = Tensor::randn(&[8192, 3072], 3, &pool).unwrap();
    let w2 = Tensor::randn(&[3072, 768], 4, &pool).unwrap();
    let xt = x.t().unwrap();
    let cases: [(&str, &Tensor, &Tensor); 3] = [
        ("forward [8192,768]x[768,3072]", &x, &w),
        ("weight grad [768,8192]^T x[8192,3072]", &xt, &g),
        ("forward [8192,3072]x[3072,768]", &g, &w2),
    ];
    println!("threads: {}", rayon::current_num_threads());
    for (name, a, b) in cases {
        let plain = best(5, || {
            a.matmul(b).unwrap();
        });
        let under = best(5, || {
            let far = Some(Instant::now() + Duration::from_secs(600));
            with_deadline(far, || a.matmul(b)).unwrap();
        });
        println!("{name}: {plain:.1} ms without a deadline, {under:.1} ms under one");
    }
}

/// A CNN step's convolution (a batch of 128, 64 to 128 channels, 3x3 over 32x32) with and
/// without a deadline: `cargo test --release -p orch-tensor --test all conv_speed -- --ignored
/// --nocapture`.
#[test]
#[ignore = "a timing, run by hand in release mode"]
fn conv_speed_of_a_cnn_step_with_and_without_a_deadline() {
    let pool = MemoryPool::new(Device::Cpu, None).unwrap();
    let x = Tensor::randn(&[128, 64, 32, 32], 1, &pool).unwrap();
    let w = Tensor::randn(&[128, 64, 3, 3], 2, &pool).unwrap();
    let conv = || x.conv2d(&w, None, [1, 1], [1, 1], [1, 1], 1);
    let plain = best(5, || {
        conv().unwrap();
    });
    let under = best(5, || {
        let far = Some(Instant::now() + Duration::from_secs(600));
        with_deadline(far, conv).unwrap();
    });
    println!(
        "conv2d [128, 64, 32, 32] by [128, 64, 3, 3]: {plain:.1} ms without a deadline, {under:.1} ms under one"
    );
}
