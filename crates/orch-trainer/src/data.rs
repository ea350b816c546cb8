//! The job's data, loaded once and shared by every replica, and the schedule of global batches.
//!
//! The order of samples depends only on the seed and the epoch (orch-data's `EpochOrder`), and
//! replica `r` of `n` takes shard `r` of every global batch, so `n` replicas together see exactly
//! what one replica sees, and a resumed run sees exactly the batches an uninterrupted one sees.

use crate::error::TrainError;
use orch_core::job::{DataFormat, DataSpec};
pub(crate) use orch_data::shard;
use orch_data::{
    CsvOptions, DataError, Dataset, EpochOrder, Split, Unknown, Vocab, eval_windows, load_csv,
    load_mnist, load_safetensors, load_tokens, read_text, train_windows,
};
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

/// One split of the job's data: labelled samples, or a text cut into windows.
#[derive(Debug, Clone)]
pub(crate) enum Samples {
    Table(Dataset),
    /// Token ids; sample `o` is the window `tokens[o..o + block]`, labelled with the tokens
    /// one later.
    Text {
        tokens: Vec<u32>,
        block: usize,
    },
}

impl Samples {
    /// Samples: rows, or window starts.
    pub fn len(&self) -> usize {
        match self {
            Samples::Table(d) => d.len(),
            Samples::Text { tokens, block } => tokens.len().saturating_sub(*block),
        }
    }

    pub fn is_text(&self) -> bool {
        matches!(self, Samples::Text { .. })
    }

    /// Values per sample's features.
    pub fn feature_dim(&self) -> usize {
        match self {
            Samples::Table(d) => d.feature_dim,
            Samples::Text { block, .. } => *block,
        }
    }

    /// The shape of one sample's features.
    pub fn sample_shape(&self) -> Vec<usize> {
        match self {
            Samples::Table(d) => d.sample_shape.clone(),
            Samples::Text { block, .. } => vec![*block],
        }
    }

    /// The shape of one sample's labels: `[]` (a class), or `[block]` (the next tokens).
    pub fn label_shape(&self) -> Vec<usize> {
        match self {
            Samples::Table(_) => Vec::new(),
            Samples::Text { block, .. } => vec![*block],
        }
    }

    /// The features and labels of the samples `ids`, row after row, as f32.
    pub fn gather(&self, ids: &[u32]) -> (Vec<f32>, Vec<f32>) {
        match self {
            Samples::Table(d) => {
                let (x, y) = d.gather(ids);
                (x, y.iter().map(|&l| l as f32).collect())
            }
            Samples::Text { tokens, block } => {
                let mut x = Vec::with_capacity(ids.len() * block);
                let mut y = Vec::with_capacity(ids.len() * block);
                for &o in ids {
                    let o = o as usize;
                    x.extend(tokens[o..o + block].iter().map(|&t| t as f32));
                    y.extend(tokens[o + 1..o + block + 1].iter().map(|&t| t as f32));
                }
                (x, y)
            }
        }
    }
}

/// The training set and, when there is one, the evaluation set, normalised alike.
#[derive(Debug, Clone)]
pub(crate) struct Data {
    pub train: Arc<Samples>,
    pub eval: Option<Arc<Samples>>,
    pub classes: usize,
    /// Text: how characters map to token ids (stored with checkpoints).
    pub vocab: Option<Vocab>,
}

pub(crate) fn load(spec: &DataSpec) -> Result<Data, TrainError> {
    let data_error = |e: DataError| TrainError::Data(e.to_string());
    if spec.format == DataFormat::Text {
        return load_text(spec).map_err(data_error);
    }
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
        DataFormat::Safetensors => {
            let train = load_safetensors(&spec.train).map_err(data_error)?;
            let eval = spec
                .test
                .as_ref()
                .map(|path| load_safetensors(path))
                .transpose()
                .map_err(data_error)?;
            (train, eval)
        }
        DataFormat::Text => unreachable!("handled above"),
    };
    if train.is_empty() || train.feature_dim == 0 {
        return Err(TrainError::Data(format!(
            "{} holds no samples",
            spec.train.display()
        )));
    }
    if let Some(eval) = &eval
        && eval.sample_shape != train.sample_shape
    {
        return Err(TrainError::Data(format!(
            "the evaluation set's samples have shape {:?} and the training set's {:?}",
            eval.sample_shape, train.sample_shape
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
        train: Arc::new(Samples::Table(train)),
        eval: eval
            .filter(|e| !e.is_empty())
            .map(|e| Arc::new(Samples::Table(e))),
        classes,
        vocab: None,
    })
}

/// A text job's data: the vocabulary of the training text (or bytes), both files as tokens.
fn load_text(spec: &DataSpec) -> Result<Data, DataError> {
    let block = spec.block_size.unwrap_or(1).max(1) as usize;
    let vocab = if spec.bytes_vocab {
        Vocab::Bytes
    } else {
        Vocab::of_text(&read_text(&spec.train, false)?)
    };
    let unknown = if spec.skip_unknown {
        Unknown::Skip
    } else {
        Unknown::Error
    };
    let split = |path: &Path| -> Result<Samples, DataError> {
        let tokens = load_tokens(path, &vocab, unknown)?;
        if tokens.len() <= block {
            return Err(DataError::Format {
                path: path.into(),
                format: "text",
                reason: format!(
                    "it holds {} tokens, and a window of block_size = {block} needs {} (the labels are one token later)",
                    tokens.len(),
                    block + 1
                ),
            });
        }
        Ok(Samples::Text { tokens, block })
    };
    let train = split(&spec.train)?;
    let eval = spec.test.as_deref().map(split).transpose()?;
    Ok(Data {
        train: Arc::new(train),
        eval: eval.map(Arc::new),
        classes: vocab.len(),
        vocab: Some(vocab),
    })
}

/// The run's global batches: `epochs` passes over `samples` (or `steps` steps), each pass in a
/// seeded order cut into batches of `batch_size`; for text (`windows`), every step draws its
/// batch of window starts from the seed and the step. A last batch smaller than the number of
/// replicas is dropped (every replica needs at least one sample of every batch).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Schedule {
    pub samples: usize,
    pub batch_size: usize,
    pub seed: u64,
    pub epochs: u32,
    pub replicas: usize,
    /// `[train] steps`: the run's steps, instead of `epochs` passes.
    pub steps: Option<u64>,
    /// Text: batches are windows drawn per step; there are no passes (one "epoch" is the run).
    pub windows: bool,
}

impl Schedule {
    pub fn batches_per_epoch(&self) -> u32 {
        if self.windows {
            return u32::try_from(self.steps.unwrap_or(1)).unwrap_or(u32::MAX);
        }
        let full = self.samples / self.batch_size;
        let rest = self.samples % self.batch_size;
        let last = usize::from(rest >= self.replicas && rest > 0);
        u32::try_from(full + last).unwrap_or(u32::MAX)
    }

    /// Training steps of the whole run.
    pub fn total_steps(&self) -> u64 {
        self.steps
            .unwrap_or(u64::from(self.epochs) * u64::from(self.batches_per_epoch()))
    }

    /// Epochs the run's steps touch (the last may be partial).
    pub fn epochs_spanned(&self) -> u32 {
        let per = u64::from(self.batches_per_epoch().max(1));
        u32::try_from(self.total_steps().div_ceil(per)).unwrap_or(u32::MAX)
    }

    /// The epoch and the batch within it of the step after `done` steps.
    pub fn position(&self, done: u64) -> (u32, u32) {
        let per = u64::from(self.batches_per_epoch().max(1));
        let epoch = u32::try_from(done / per).unwrap_or(u32::MAX);
        (epoch, (done % per) as u32)
    }

    pub fn order(&self, epoch: u32) -> EpochOrder {
        EpochOrder::shuffled(self.samples, self.batch_size, self.seed, epoch)
    }

    /// The sample ids of step `step`'s global batch; `cache` keeps the last epoch's order.
    pub fn global_batch(&self, step: u64, cache: &mut Option<(u32, EpochOrder)>) -> Vec<u32> {
        if self.windows {
            return train_windows(self.samples, self.batch_size, self.seed, step);
        }
        let (epoch, batch) = self.position(step);
        let order = match cache {
            Some((e, order)) if *e == epoch => order,
            _ => &cache.insert((epoch, self.order(epoch))).1,
        };
        order.batch(batch as usize).to_vec()
    }
}

/// The samples of `batch` that replica `rank` of `replicas` takes.
pub(crate) fn my_shard(batch: &[u32], replicas: usize, rank: usize) -> &[u32] {
    let Range { start, end } = shard(batch.len(), replicas, rank);
    &batch[start..end]
}

/// Evaluation batches per evaluation of text when `[train] eval_batches` does not say.
pub(crate) const DEFAULT_TEXT_EVAL_BATCHES: u32 = 20;

/// Every evaluation's global batches, the same each time: a table's evaluation set in file
/// order, `batch_size` at a time (the first `limit` batches when given); for text, `limit`
/// (default 20) batches of `batch_size` windows drawn from a fixed seed.
pub(crate) fn eval_batches(eval: &Samples, batch_size: usize, limit: Option<u32>) -> Vec<Vec<u32>> {
    let batch_size = batch_size.max(1);
    if eval.is_text() {
        let batches = limit.unwrap_or(DEFAULT_TEXT_EVAL_BATCHES) as usize;
        return eval_windows(eval.len(), batches * batch_size)
            .chunks(batch_size)
            .map(<[u32]>::to_vec)
            .collect();
    }
    let order = EpochOrder::sequential(eval.len(), batch_size);
    let batches = limit.map_or(order.batches(), |l| order.batches().min(l as usize));
    (0..batches).map(|b| order.batch(b).to_vec()).collect()
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
            steps: None,
            windows: false,
        };
        assert_eq!(s(100, 4).batches_per_epoch(), 10);
        assert_eq!(s(103, 1).batches_per_epoch(), 11);
        assert_eq!(s(103, 4).batches_per_epoch(), 10);
        assert_eq!(s(104, 4).batches_per_epoch(), 11);
        let order = s(104, 4).order(0);
        let shards: Vec<&[u32]> = (0..4).map(|r| my_shard(order.batch(10), 4, r)).collect();
        assert!(shards.iter().all(|s| s.len() == 1));
    }

    #[test]
    fn steps_walk_the_epochs_orders_in_turn() {
        let s = Schedule {
            samples: 25,
            batch_size: 10,
            seed: 3,
            epochs: 1,
            replicas: 1,
            steps: Some(7),
            windows: false,
        };
        assert_eq!(
            (s.batches_per_epoch(), s.total_steps(), s.epochs_spanned()),
            (3, 7, 3)
        );
        assert_eq!(s.position(4), (1, 1));
        let mut cache = None;
        assert_eq!(s.global_batch(4, &mut cache), s.order(1).batch(1));
        assert_eq!(s.global_batch(6, &mut cache), s.order(2).batch(0));
    }

    #[test]
    fn text_windows_and_their_labels() {
        let text = Samples::Text {
            tokens: vec![5, 6, 7, 8, 9],
            block: 3,
        };
        assert_eq!(text.len(), 2);
        assert_eq!(
            text.gather(&[1, 0]),
            (vec![6., 7., 8., 5., 6., 7.], vec![7., 8., 9., 6., 7., 8.])
        );
        let batches = eval_batches(&text, 4, Some(3));
        assert_eq!(batches.len(), 3);
        assert!(batches.iter().flatten().all(|&o| o < 2));
        assert_eq!(
            batches,
            eval_batches(&text, 4, Some(3)),
            "the same every time"
        );
    }
}
