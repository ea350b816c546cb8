//! The contract 0.3.0 ops beyond their gradients: dropout's reproducible masks, bad arguments
//! as error values, outputs over the element limit (zero-size shapes: degenerate.rs).

use crate::common::TestResult;
use crate::test_device;
use orch_tensor::{Dropout, MemoryPool, Tensor, TensorError};
use std::sync::Arc;

type Pool = Arc<MemoryPool>;

fn dropout_masks_are_the_same_split_over_replicas(pool: &Pool) -> TestResult {
    let x = Tensor::ones(&[8, 3, 5], pool)?;
    let d = Dropout::new(0.5, 42, 11);
    let whole = x.dropout(&d)?.to_vec()?;
    // Two replicas with four rows each, the second starting at global sample 4.
    let first = x.narrow(0, 0, 4)?.dropout(&d)?;
    let second = x.narrow(0, 4, 4)?.dropout(&Dropout {
        sample_offset: 4,
        ..d
    })?;
    assert_eq!(Tensor::concat(&[first, second], 0)?.to_vec()?, whole);
    // A resumed run (same seed and step) draws the same mask again.
    assert_eq!(x.dropout(&d)?.to_vec()?, whole);
    // Another step, another site or another seed draws another mask.
    for other in [
        Dropout { step: 12, ..d },
        Dropout { site: 1, ..d },
        Dropout { seed: 43, ..d },
    ] {
        assert_ne!(x.dropout(&other)?.to_vec()?, whole, "{other:?}");
    }
    // Kept values are scaled by 1/(1-p); about p of them are dropped.
    assert!(whole.iter().all(|&v| v == 0.0 || v == 2.0));
    let big = Tensor::ones(&[64, 1000], pool)?.dropout(&Dropout::new(0.3, 1, 1))?;
    let dropped = big.to_vec()?.iter().filter(|&&v| v == 0.0).count() as f64 / 64000.0;
    assert!((dropped - 0.3).abs() < 0.01, "dropped {dropped}");
    // Not training, or p = 0: the identity.
    let y = Tensor::from_slice(&[1.0, -2.0, 3.0], &[3], pool)?;
    let eval = Dropout {
        training: false,
        ..d
    };
    assert_eq!(y.dropout(&eval)?.to_vec()?, vec![1.0, -2.0, 3.0]);
    assert_eq!(
        y.dropout(&Dropout::new(0.0, 1, 1))?.to_vec()?,
        vec![1.0, -2.0, 3.0]
    );
    Ok(())
}

/// The parallel CPU path (large rows) draws the same masks as row-by-row halves.
fn dropout_large_batches_split_the_same_way(pool: &Pool) -> TestResult {
    let x = Tensor::ones(&[16, 4096], pool)?;
    let d = Dropout::new(0.1, 7, 3);
    let whole = x.dropout(&d)?.to_vec()?;
    let mut parts = Vec::new();
    for start in [0, 5, 9] {
        let len = [5, 4, 7][parts.len()];
        let part = x.narrow(0, start, len)?.dropout(&Dropout {
            sample_offset: start as u64,
            ..d
        })?;
        parts.push(part);
    }
    assert_eq!(Tensor::concat(&parts, 0)?.to_vec()?, whole);
    Ok(())
}

fn bad_arguments_are_errors(pool: &Pool) -> TestResult {
    let x = Tensor::zeros(&[2, 3], pool)?;
    let invalid = |r: orch_tensor::Result<Tensor>, op: &str| match r {
        Err(TensorError::InvalidArgument { op: got, .. }) if got == op => {}
        other => panic!("{op}: expected InvalidArgument, got {other:?}"),
    };
    invalid(x.clamp(1.0, 0.0), "clamp");
    invalid(x.clamp(f32::NAN, 0.0), "clamp");
    invalid(x.slice(1, 0, 3, 0), "slice");
    invalid(x.expand(&[3]), "expand");
    invalid(x.expand(&[-1, -1, 3]), "expand");
    invalid(x.expand(&[2, -2]), "expand");
    invalid(x.pad(&[(1, 1)], 0.0), "pad");
    invalid(Tensor::concat(&[], 0), "concat");
    for p in [1.0, -0.1, f32::NAN, 2.0] {
        invalid(x.dropout(&Dropout::new(p, 1, 1)), "dropout");
    }
    assert!(matches!(
        x.split(&[1, 2], 0),
        Err(TensorError::InvalidShape { op: "split", .. })
    ));
    assert!(matches!(
        x.slice(2, 0, 1, 1),
        Err(TensorError::InvalidAxis { .. })
    ));
    assert!(matches!(
        Tensor::concat(&[x.clone(), Tensor::zeros(&[3, 3], pool)?], 1),
        Err(TensorError::ShapeMismatch { op: "concat", .. })
    ));
    assert!(matches!(
        x.maximum(&Tensor::zeros(&[4], pool)?),
        Err(TensorError::ShapeMismatch { .. })
    ));
    assert!(matches!(
        Tensor::where_(&Tensor::zeros(&[4], pool)?, &x, &x),
        Err(TensorError::ShapeMismatch { op: "where", .. })
    ));
    // The mask must broadcast to the tensor, not the tensor to the mask.
    assert!(matches!(
        Tensor::zeros(&[3], pool)?.masked_fill(&x, 1.0),
        Err(TensorError::ShapeMismatch {
            op: "masked_fill",
            ..
        })
    ));
    // Indices: negative, fractional, NaN, past the table; nothing is read.
    let table = Tensor::ones(&[4, 2], pool)?;
    for bad in [-1.0, 0.5, f32::NAN, 4.0, 1e9] {
        let ids = Tensor::from_slice(&[0.0, bad], &[2], pool)?;
        invalid(table.embedding(&ids), "index_select");
        invalid(table.index_select(0, &ids), "index_select");
        let gi = Tensor::from_slice(&[0.0, bad], &[1, 2], pool)?;
        invalid(table.gather(0, &gi), "gather");
    }
    assert!(matches!(
        table.index_select(0, &Tensor::zeros(&[1, 1], pool)?),
        Err(TensorError::InvalidShape { .. })
    ));
    assert!(matches!(
        table.gather(1, &Tensor::zeros(&[5, 1], pool)?),
        Err(TensorError::ShapeMismatch { op: "gather", .. })
    ));
    assert!(matches!(
        Tensor::zeros(&[2, 3, 4], pool)?.embedding(&table),
        Err(TensorError::InvalidShape {
            op: "embedding",
            ..
        })
    ));
    // Cross-entropy over a leading shape: labels must match it; a bad label is still refused
    // (on the CPU; CUDA gives NaN) unless it is the ignored one.
    let logits = Tensor::zeros(&[2, 3, 4], pool)?;
    assert!(matches!(
        logits.cross_entropy_with(&Tensor::zeros(&[3, 2], pool)?, None),
        Err(TensorError::ShapeMismatch { .. })
    ));
    assert!(logits.cross_entropy(&Tensor::zeros(&[2, 3], pool)?).is_ok());
    let labels = Tensor::full(&[2, 3], -100.0, pool)?;
    assert_eq!(
        logits
            .cross_entropy_with(&labels, Some(-100))?
            .to_scalar()?,
        0.0,
        "all ignored gives 0"
    );
    if pool.device().is_host() {
        assert!(logits.cross_entropy_with(&labels, None).is_err());
    }
    Ok(())
}

fn outputs_over_the_limit_are_errors(pool: &Pool) -> TestResult {
    // A limited pool: an unlimited one cannot refuse a request that fits the element limit.
    let pool = &MemoryPool::new(pool.device(), Some(1 << 30))?;
    let x = Tensor::zeros(&[1, 1], pool)?;
    let huge = usize::MAX / 4;
    assert!(matches!(
        x.pad(&[(huge, 0), (huge, 0)], 0.0),
        Err(TensorError::InvalidShape { op: "pad", .. })
    ));
    assert!(matches!(
        x.pad(&[(usize::MAX, 1), (0, 0)], 0.0),
        Err(TensorError::InvalidShape { op: "pad", .. })
    ));
    assert!(x.expand(&[1 << 40, 1 << 40]).is_err());
    let wide = x.expand(&[1, 1 << 40])?;
    assert!(matches!(
        Tensor::concat(&[wide.clone(), wide.clone(), wide], 0),
        Err(TensorError::OutOfMemory { .. } | TensorError::InvalidShape { .. })
    ));
    Ok(())
}

test_device!(
    dropout_masks_are_the_same_split_over_replicas,
    dropout_large_batches_split_the_same_way,
    bad_arguments_are_errors,
    outputs_over_the_limit_are_errors,
);
