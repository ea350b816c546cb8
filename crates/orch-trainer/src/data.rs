//! The job's data, loaded once and shared by every replica, and the schedule of global batches.
//!
//! The order of samples depends only on the seed and the epoch (orch-data's `EpochOrder`), and
//! replica `r` of `n` takes shard `r` of every global batch, so `n` replicas together see exactly
//! what one replica sees, and a resumed run sees exactly the batches an uninterrupted one sees.

use crate::error::TrainError;
use orch_core::job::{DataFormat, DataSpec};
pub(crate) use orch_data::shard;
use orch_data::{CsvOptions, DataError, Dataset, EpochOrder, Split, load_csv, load_mnist};
use std::ops::Range;
use std::sync::Arc;

/// The training set and, when there is one, the evaluation set, normalised alike.
#[derive(Debug, Clone)]
pub(crate) struct Data {
    pub train: Arc<Dataset>,
    pub eval: Option<Arc<Dataset>>,
    pub classes: usize,
}

pub(crate) fn load(spec: &DataSpec) -> Result<Data, TrainError> {
    let data_error = |e: DataError| TrainError::Data(e.to_string());
    let (mut train, mut eval) = match spec.format {
        DataFormat::MnistIdx => {
            let train = load_mnist(&spec.train, Split::Train).map_err(data_error)?;
            let eval = match &spec.test {
                Some(dir) => Some(load_mnist(dir, Split::Test).map_err(data_error)?),
                // The t10k files beside the training files, when they are there.
                None => match load_mnist(&spec.train, Split::Test) {
                    Ok(eval) => Some(eval),
                    Err(DataError::Missing { .. }) => None,
                    Err(e) => return Err(data_error(e)),
                },
            };
            (train, eval)
        }
        DataFormat::Csv => {
            let options = CsvOptions {
                label_column: spec.label_column,
                header: spec.header,
                scale: spec.scale,
            };
            let train = load_csv(&spec.train, &options).map_err(data_error)?;
            let eval = spec
                .test
                .as_ref()
                .map(|path| load_csv(path, &options))
                .transpose()
                .map_err(data_error)?;
            (train, eval)
        }
    };
    if train.is_empty() || train.feature_dim == 0 {
        return Err(TrainError::Data(format!(
            "{} holds no samples",
            spec.train.display()
        )));
    }
    if let Some(eval) = &eval
        && eval.feature_dim != train.feature_dim
    {
        return Err(TrainError::Data(format!(
            "the evaluation set has {} features per sample and the training set {}",
            eval.feature_dim, train.feature_dim
        )));
    }
    if spec.normalize {
        let (mean, std) = train.moments();
        train.standardize(mean, std);
        if let Some(eval) = &mut eval {
            eval.standardize(mean, std);
        }
    }
    let classes = train
        .num_classes
        .max(eval.as_ref().map_or(0, |e| e.num_classes));
    Ok(Data {
        train: Arc::new(train),
        eval: eval.filter(|e| !e.is_empty()).map(Arc::new),
        classes,
    })
}

/// The run's global batches: `epochs` passes over `samples`, each in a seeded order cut into
/// batches of `batch_size`. A last batch smaller than the number of replicas is dropped (every
/// replica needs at least one sample of every batch).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Schedule {
    pub samples: usize,
    pub batch_size: usize,
    pub seed: u64,
    pub epochs: u32,
    pub replicas: usize,
}

impl Schedule {
    pub fn batches_per_epoch(&self) -> u32 {
        let full = self.samples / self.batch_size;
        let rest = self.samples % self.batch_size;
        let last = usize::from(rest >= self.replicas && rest > 0);
        u32::try_from(full + last).unwrap_or(u32::MAX)
    }

    pub fn order(&self, epoch: u32) -> EpochOrder {
        EpochOrder::shuffled(self.samples, self.batch_size, self.seed, epoch)
    }
}

/// The samples of `batch` that replica `rank` of `replicas` takes.
pub(crate) fn my_shard(batch: &[u32], replicas: usize, rank: usize) -> &[u32] {
    let Range { start, end } = shard(batch.len(), replicas, rank);
    &batch[start..end]
}

/// Evaluation batches: the evaluation set in file order, `batch_size` at a time.
pub(crate) fn eval_order(samples: usize, batch_size: usize) -> EpochOrder {
    EpochOrder::sequential(samples, batch_size)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_last_batches_are_dropped_only_when_a_replica_would_get_nothing() {
        let s = |samples, replicas| Schedule {
            samples,
            batch_size: 10,
            seed: 0,
            epochs: 2,
            replicas,
        };
        assert_eq!(s(100, 4).batches_per_epoch(), 10);
        assert_eq!(s(103, 1).batches_per_epoch(), 11);
        assert_eq!(s(103, 4).batches_per_epoch(), 10);
        assert_eq!(s(104, 4).batches_per_epoch(), 11);
        let order = s(104, 4).order(0);
        let shards: Vec<&[u32]> = (0..4).map(|r| my_shard(order.batch(10), 4, r)).collect();
        assert!(shards.iter().all(|s| s.len() == 1));
    }
}
