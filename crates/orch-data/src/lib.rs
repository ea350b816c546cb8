//! Training data for orch trainers: loaders (MNIST IDX raw or gzip, CSV, safetensors, text),
//! normalisation, a seeded shuffle per epoch, seeded text windows per step and
//! DistributedSampler-style shards per replica.
//!
//! Design decision: the host owns the data. A trainer plugin never sees a file or a bulk list: it
//! asks for the next batch and receives tensors the host built from a [`Dataset`] with
//! [`Dataset::gather`]. The order of samples depends only on the seed and the epoch, so a run
//! interrupted and resumed at a [`Position`] sees exactly the batches an uninterrupted run sees,
//! and N replicas together see exactly the global batch one replica would.

mod csv;
mod dataset;
mod idx;
mod sampler;
mod tensors;
mod text;

pub use csv::{CsvOptions, load_csv};
pub use dataset::{DataError, Dataset};
pub use idx::{Split, load_mnist};
pub use sampler::{
    EVAL_WINDOW_SEED, EpochOrder, Position, SplitMix64, eval_windows, shard, train_windows,
};
pub use tensors::load_safetensors;
pub use text::{Unknown, Vocab, load_tokens, read_text};
