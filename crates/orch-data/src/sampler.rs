//! The order samples are visited in: a seeded permutation per epoch, cut into global batches,
//! each batch cut into per-replica shards.

use std::ops::Range;

/// Where a run is: the epoch and the next batch within it. Saved in checkpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Position {
    pub epoch: u32,
    pub batch: u32,
}

/// The sample order of one epoch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EpochOrder {
    pub order: Vec<u32>,
    pub batch_size: usize,
}

impl EpochOrder {
    /// A permutation of `0..len` that depends only on `seed` and `epoch`.
    pub fn shuffled(len: usize, batch_size: usize, seed: u64, epoch: u32) -> EpochOrder {
        let mut order: Vec<u32> = (0..len as u32).collect();
        let mut rng = SplitMix64(seed ^ (u64::from(epoch) + 1).wrapping_mul(0xD1B5_4A32_D192_ED03));
        for i in (1..order.len()).rev() {
            let j = (rng.next() % (i as u64 + 1)) as usize;
            order.swap(i, j);
        }
        EpochOrder {
            order,
            batch_size: batch_size.max(1),
        }
    }

    /// In file order (for evaluation).
    pub fn sequential(len: usize, batch_size: usize) -> EpochOrder {
        EpochOrder {
            order: (0..len as u32).collect(),
            batch_size: batch_size.max(1),
        }
    }

    /// Number of batches; the last one may be smaller.
    pub fn batches(&self) -> usize {
        self.order.len().div_ceil(self.batch_size)
    }

    /// The sample indices of global batch `b`.
    pub fn batch(&self, b: usize) -> &[u32] {
        let start = (b * self.batch_size).min(self.order.len());
        let end = (start + self.batch_size).min(self.order.len());
        &self.order[start..end]
    }
}

/// The seed evaluation windows are drawn from: the same windows at every evaluation of every
/// run of a text (the ASCII of `eval`).
pub const EVAL_WINDOW_SEED: u64 = 0x6576_616c;

/// The window starts of training step `step`: `count` draws from SplitMix64 seeded with
/// `seed ^ (step + 1) * 0xD1B5_4A32_D192_ED03`, each `next() % positions`. They depend only on
/// the seed and the step, so a resumed run and N replicas (each taking its shard) see the
/// windows of one uninterrupted replica.
pub fn train_windows(positions: usize, count: usize, seed: u64, step: u64) -> Vec<u32> {
    let rng = SplitMix64(seed ^ step.wrapping_add(1).wrapping_mul(0xD1B5_4A32_D192_ED03));
    draw(rng, positions, count)
}

/// The window starts of every evaluation: `count` draws from SplitMix64 seeded with
/// [`EVAL_WINDOW_SEED`], each `next() % positions` (batch `b` takes draws `b * batch..`).
pub fn eval_windows(positions: usize, count: usize) -> Vec<u32> {
    draw(SplitMix64(EVAL_WINDOW_SEED), positions, count)
}

fn draw(mut rng: SplitMix64, positions: usize, count: usize) -> Vec<u32> {
    let positions = positions.max(1) as u64;
    (0..count)
        .map(|_| u32::try_from(rng.next() % positions).unwrap_or(u32::MAX))
        .collect()
}

/// The part of a batch of `len` samples that replica `rank` of `replicas` takes: contiguous,
/// sizes differing by at most one, together exactly the batch.
pub fn shard(len: usize, replicas: usize, rank: usize) -> Range<usize> {
    let replicas = replicas.max(1);
    let base = len / replicas;
    let extra = len % replicas;
    let start = rank * base + rank.min(extra);
    let size = base + usize::from(rank < extra);
    start.min(len)..(start + size).min(len)
}

/// SplitMix64 (Steele, Lea and Flood), written here rather than taken from `rand`: the epoch
/// order is part of what a checkpoint means, so a seed must give the same batches on every
/// machine and every future build of orch, or a resumed run would see other samples. This
/// generator is fixed by its published constants; `rand` documents that `StdRng`'s algorithm may
/// change between its versions, and its sampling helpers (`shuffle`, ranges) have changed between
/// major versions.
#[derive(Debug, Clone)]
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    /// A uniform value in `[0, 1)` (the top 53 bits).
    pub fn next_f64(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn order_depends_on_seed_and_epoch_only() {
        let a = EpochOrder::shuffled(100, 10, 42, 0);
        assert_eq!(a, EpochOrder::shuffled(100, 10, 42, 0));
        assert_ne!(a.order, EpochOrder::shuffled(100, 10, 42, 1).order);
        assert_ne!(a.order, EpochOrder::shuffled(100, 10, 43, 0).order);
        let mut sorted = a.order.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..100).collect::<Vec<u32>>());
        assert_eq!(EpochOrder::shuffled(95, 10, 1, 0).batches(), 10);
        assert_eq!(EpochOrder::shuffled(95, 10, 1, 0).batch(9).len(), 5);
    }

    #[test]
    fn windows_depend_on_seed_and_step_only() {
        let a = train_windows(1000, 12, 7, 3);
        assert_eq!(a, train_windows(1000, 12, 7, 3));
        assert_ne!(a, train_windows(1000, 12, 7, 4));
        assert_ne!(a, train_windows(1000, 12, 8, 3));
        assert!(a.iter().all(|&o| o < 1000));
        assert_eq!(eval_windows(500, 30)[..10], eval_windows(500, 10)[..]);
        // SplitMix64's published first output for seed 0, so other languages can redraw these.
        assert_eq!(SplitMix64(0).next(), 0xE220_A839_7B1D_CDAF);
    }

    proptest! {
        #[test]
        fn shards_partition_the_batch(len in 0usize..1000, replicas in 1usize..9) {
            let mut next = 0;
            for rank in 0..replicas {
                let r = shard(len, replicas, rank);
                prop_assert_eq!(r.start, next);
                prop_assert!(r.len() == len / replicas || r.len() == len / replicas + 1);
                next = r.end;
            }
            prop_assert_eq!(next, len);
        }
    }
}
