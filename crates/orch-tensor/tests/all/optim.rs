//! Optimizers against updates computed by hand (in f64), and a small end-to-end training run.

use crate::common::{TestResult, assert_close};
use crate::test_device;
use orch_tensor::optim::{Adam, AdamConfig, Optimizer, Sgd, SgdConfig};
use orch_tensor::{MemoryPool, Tensor};
use std::sync::Arc;

const P0: [f32; 4] = [0.5, -1.0, 2.0, 0.0];
const GRADS: [[f32; 4]; 3] = [
    [0.1, -0.2, 0.3, 1.0],
    [-0.5, 0.4, 0.0, 2.0],
    [0.2, 0.2, -0.1, -1.0],
];

fn param(pool: &Arc<MemoryPool>) -> orch_tensor::Result<Tensor> {
    Ok(Tensor::from_slice(&P0, &[2, 2], pool)?.with_requires_grad())
}

fn run(
    opt: &mut dyn Optimizer,
    p: &Tensor,
    pool: &Arc<MemoryPool>,
) -> orch_tensor::Result<Vec<f32>> {
    for g in GRADS {
        p.set_grad(Some(Tensor::from_slice(&g, &[2, 2], pool)?))?;
        opt.step()?;
    }
    p.to_vec()
}

/// PyTorch's SGD (dampening 0) in f64.
fn sgd_by_hand(lr: f64, momentum: f64, wd: f64, nesterov: bool) -> Vec<f64> {
    let mut p: Vec<f64> = P0.iter().map(|&v| v as f64).collect();
    let mut buf = [0.0; 4];
    for g in GRADS {
        for i in 0..4 {
            let mut d = g[i] as f64 + wd * p[i];
            if momentum != 0.0 {
                buf[i] = momentum * buf[i] + d;
                d = if nesterov {
                    d + momentum * buf[i]
                } else {
                    buf[i]
                };
            }
            p[i] -= lr * d;
        }
    }
    p
}

/// PyTorch's Adam / AdamW in f64.
fn adam_by_hand(c: AdamConfig) -> Vec<f64> {
    let (lr, b1, b2, eps, wd) = (
        c.lr as f64,
        c.beta1 as f64,
        c.beta2 as f64,
        c.eps as f64,
        c.weight_decay as f64,
    );
    let mut p: Vec<f64> = P0.iter().map(|&v| v as f64).collect();
    let (mut m, mut v) = (vec![0.0; 4], vec![0.0; 4]);
    for (t, g) in GRADS.iter().enumerate() {
        let t = t as i32 + 1;
        for i in 0..4 {
            let mut g = g[i] as f64;
            if c.decoupled {
                p[i] -= lr * wd * p[i];
            } else {
                g += wd * p[i];
            }
            m[i] = b1 * m[i] + (1.0 - b1) * g;
            v[i] = b2 * v[i] + (1.0 - b2) * g * g;
            let (m_hat, v_hat) = (m[i] / (1.0 - b1.powi(t)), v[i] / (1.0 - b2.powi(t)));
            p[i] -= lr * m_hat / (v_hat.sqrt() + eps);
        }
    }
    p
}

fn sgd_variants(pool: &Arc<MemoryPool>) -> TestResult {
    for (momentum, wd, nesterov) in [
        (0.0, 0.0, false),
        (0.9, 0.0, false),
        (0.9, 0.01, false),
        (0.8, 0.05, true),
        (0.0, 0.1, false),
    ] {
        let p = param(pool)?;
        let mut sgd = Sgd::new(
            vec![p.clone()],
            SgdConfig {
                lr: 0.1,
                momentum,
                nesterov,
                weight_decay: wd,
            },
        )?;
        let got = run(&mut sgd, &p, pool)?;
        assert_close(
            &got,
            &sgd_by_hand(0.1, momentum as f64, wd as f64, nesterov),
            1e-6,
            &format!("sgd {momentum} {wd} {nesterov}"),
        );
    }
    Ok(())
}

fn adam_and_adamw(pool: &Arc<MemoryPool>) -> TestResult {
    let adam_l2 = AdamConfig {
        weight_decay: 0.1,
        ..AdamConfig::adam(0.01)
    };
    for config in [
        AdamConfig::adam(0.01),
        adam_l2,
        AdamConfig::adamw(0.01, 0.1),
    ] {
        let p = param(pool)?;
        let mut adam = Adam::new(vec![p.clone()], config)?;
        let got = run(&mut adam, &p, pool)?;
        assert_close(&got, &adam_by_hand(config), 1e-5, &format!("{config:?}"));
    }
    Ok(())
}

fn optimizer_contract(pool: &Arc<MemoryPool>) -> TestResult {
    let p = param(pool)?;
    assert!(
        Sgd::new(vec![Tensor::zeros(&[2], pool)?], SgdConfig::new(0.1)).is_err(),
        "not a parameter"
    );
    assert!(
        Sgd::new(vec![p.clone(), p.clone()], SgdConfig::new(0.1)).is_err(),
        "listed twice"
    );
    assert!(
        Sgd::new(
            vec![p.clone()],
            SgdConfig {
                nesterov: true,
                ..SgdConfig::new(0.1)
            }
        )
        .is_err()
    );
    assert!(
        Adam::new(
            vec![p.clone()],
            AdamConfig {
                beta1: 1.0,
                ..AdamConfig::adam(0.1)
            }
        )
        .is_err()
    );
    let mut sgd = Sgd::new(vec![p.clone()], SgdConfig::new(0.5))?;
    sgd.step()?; // no gradient yet: nothing moves
    assert_eq!(p.to_vec()?, P0.to_vec());
    p.set_grad(Some(Tensor::ones(&[2, 2], pool)?))?;
    sgd.set_lr(1.0);
    sgd.step()?;
    assert_eq!(p.to_vec()?, P0.iter().map(|v| v - 1.0).collect::<Vec<_>>());
    sgd.zero_grad();
    assert!(p.grad().is_none());
    Ok(())
}

/// Two steps, then the state is copied into a fresh optimizer over a copy of the parameter;
/// one more step on each must agree exactly (what checkpoints rely on).
fn state_round_trip(pool: &Arc<MemoryPool>) -> TestResult {
    let grad = |g: &[f32; 4]| Tensor::from_slice(g, &[2, 2], pool);
    let sgd_config = SgdConfig {
        momentum: 0.9,
        nesterov: true,
        ..SgdConfig::new(0.1)
    };
    let p = param(pool)?;
    let mut sgd = Sgd::new(vec![p.clone()], sgd_config)?;
    for g in &GRADS[..2] {
        p.set_grad(Some(grad(g)?))?;
        sgd.step()?;
    }
    let q = Tensor::from_vec(p.to_vec()?, &[2, 2], pool)?.with_requires_grad();
    let mut resumed = Sgd::new(vec![q.clone()], sgd_config)?;
    let buffer = sgd.momentum_buffers()[0]
        .clone()
        .expect("a buffer after two steps");
    resumed.set_momentum_buffer(0, &buffer)?;
    assert!(
        resumed.set_momentum_buffer(1, &buffer).is_err(),
        "there is no parameter 1"
    );
    for (t, opt) in [(&p, &mut sgd), (&q, &mut resumed)] {
        t.set_grad(Some(grad(&GRADS[2])?))?;
        opt.step()?;
    }
    assert_eq!(p.to_vec()?, q.to_vec()?, "sgd: resumed run diverged");

    let config = AdamConfig::adamw(0.01, 0.1);
    let p = param(pool)?;
    let mut adam = Adam::new(vec![p.clone()], config)?;
    assert!(adam.moments()[0].is_none());
    for g in &GRADS[..2] {
        p.set_grad(Some(grad(g)?))?;
        adam.step()?;
    }
    let q = Tensor::from_vec(p.to_vec()?, &[2, 2], pool)?.with_requires_grad();
    let mut resumed = Adam::new(vec![q.clone()], config)?;
    let (m, v, steps) = adam.moments()[0].clone().expect("moments after two steps");
    assert_eq!(steps, 2);
    resumed.set_moments(0, &m, &v, steps)?;
    assert!(
        !resumed.moments()[0]
            .as_ref()
            .is_some_and(|(m2, _, _)| m2.shares_storage(&m)),
        "copied"
    );
    for (t, opt) in [(&p, &mut adam), (&q, &mut resumed)] {
        t.set_grad(Some(grad(&GRADS[2])?))?;
        opt.step()?;
    }
    assert_eq!(p.to_vec()?, q.to_vec()?, "adam: resumed run diverged");
    Ok(())
}

/// A 2-layer MLP learns a separable synthetic problem on every backend.
fn training_reduces_the_loss(pool: &Arc<MemoryPool>) -> TestResult {
    let x = Tensor::randn(&[64, 8], 1, pool)?;
    let direction = Tensor::randn(&[8, 1], 2, pool)?;
    let scores = x.matmul(&direction)?.to_vec()?;
    let labels: Vec<f32> = scores
        .iter()
        .map(|&s| if s > 0.0 { 1.0 } else { 0.0 })
        .collect();
    let y = Tensor::from_vec(labels, &[64], pool)?;
    for use_adam in [false, true] {
        let w1 = Tensor::randn(&[8, 16], 3, pool)?
            .mul_scalar(0.3)?
            .with_requires_grad();
        let b1 = Tensor::zeros(&[16], pool)?.with_requires_grad();
        let w2 = Tensor::randn(&[16, 2], 4, pool)?
            .mul_scalar(0.3)?
            .with_requires_grad();
        let params = vec![w1.clone(), b1.clone(), w2.clone()];
        let mut opt: Box<dyn Optimizer> = if use_adam {
            Box::new(Adam::new(params, AdamConfig::adam(0.02))?)
        } else {
            Box::new(Sgd::new(
                params,
                SgdConfig {
                    momentum: 0.9,
                    ..SgdConfig::new(0.1)
                },
            )?)
        };
        let step = |opt: &mut Box<dyn Optimizer>| -> orch_tensor::Result<f32> {
            opt.zero_grad();
            let loss = x
                .matmul(&w1)?
                .add(&b1)?
                .relu()?
                .matmul(&w2)?
                .cross_entropy(&y)?;
            loss.backward()?;
            opt.step()?;
            loss.to_scalar()
        };
        let first = step(&mut opt)?;
        let mut last = first;
        for _ in 0..60 {
            last = step(&mut opt)?;
        }
        let accuracy = x
            .matmul(&w1)?
            .add(&b1)?
            .relu()?
            .matmul(&w2)?
            .accuracy(&y)?
            .to_scalar()?;
        assert!(
            last < first * 0.3,
            "adam={use_adam}: loss {first} -> {last}"
        );
        assert!(accuracy > 0.9, "adam={use_adam}: accuracy {accuracy}");
    }
    Ok(())
}

test_device!(
    sgd_variants,
    adam_and_adamw,
    optimizer_contract,
    state_round_trip,
    training_reduces_the_loss
);
