//! The run's record: `metrics.jsonl`, a JSON object per training step and per epoch (and
//! `plot.svg`, drawn from it by `plot.rs`).
//!
//! ```text
//! {"kind":"step","step":12,"epoch":1,"loss":0.5321,"samples_per_sec":20512.3,"scalars":{"lr":0.05}}
//! {"kind":"epoch","epoch":1,"step":469,"train_loss":0.3012,"eval_loss":0.1403,"eval_accuracy":0.9581,"seconds":4.1}
//! ```
//!
//! `step` counts steps done (1-based), `epoch` is 1-based; `eval_*` are absent without
//! evaluation data; `scalars` holds what the plugin reported with `metrics.scalar`, averaged
//! over replicas.

use crate::error::TrainError;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

/// One line of `metrics.jsonl`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Record {
    Step {
        step: u64,
        epoch: u32,
        loss: f32,
        samples_per_sec: f64,
        #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
        scalars: BTreeMap<String, f64>,
    },
    Epoch {
        epoch: u32,
        step: u64,
        train_loss: f64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        eval_loss: Option<f64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        eval_accuracy: Option<f64>,
        seconds: f64,
        #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
        scalars: BTreeMap<String, f64>,
    },
}

impl Record {
    fn step(&self) -> u64 {
        match self {
            Record::Step { step, .. } | Record::Epoch { step, .. } => *step,
        }
    }
}

/// Reads a `metrics.jsonl` (lines that do not parse are skipped).
pub fn read_metrics(path: &Path) -> Vec<Record> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// The metrics file, appended to as the run goes.
#[derive(Debug)]
pub(crate) struct Metrics {
    path: PathBuf,
    file: std::fs::File,
    pub records: Vec<Record>,
}

impl Metrics {
    /// A fresh file, or (resuming after `keep_until` steps) the old records up to that step.
    pub fn open(path: &Path, keep_until: Option<u64>) -> Result<Metrics, TrainError> {
        let output = |source| TrainError::Output {
            path: path.to_path_buf(),
            source,
        };
        let records: Vec<Record> = match keep_until {
            Some(step) => read_metrics(path)
                .into_iter()
                .filter(|r| r.step() <= step)
                .collect(),
            None => Vec::new(),
        };
        let mut file = std::fs::File::create(path).map_err(output)?;
        for record in &records {
            writeln!(file, "{}", line(record)).map_err(output)?;
        }
        Ok(Metrics {
            path: path.to_path_buf(),
            file,
            records,
        })
    }

    pub fn push(&mut self, record: Record) -> Result<(), TrainError> {
        writeln!(self.file, "{}", line(&record)).map_err(|source| TrainError::Output {
            path: self.path.clone(),
            source,
        })?;
        self.records.push(record);
        Ok(())
    }

    /// Mean training loss over the step records of `epoch` (1-based).
    pub fn epoch_loss(&self, epoch: u32) -> f64 {
        let losses: Vec<f64> = self
            .records
            .iter()
            .filter_map(|r| match r {
                Record::Step { epoch: e, loss, .. } if *e == epoch => Some(f64::from(*loss)),
                _ => None,
            })
            .collect();
        losses.iter().sum::<f64>() / losses.len().max(1) as f64
    }
}

fn line(record: &Record) -> String {
    serde_json::to_string(record).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_resume_keeps_what_the_checkpoint_covers() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metrics.jsonl");
        let mut m = Metrics::open(&path, None).unwrap();
        for step in 1..=4 {
            m.push(Record::Step {
                step,
                epoch: 1,
                loss: 1.0 / step as f32,
                samples_per_sec: 10.0,
                scalars: BTreeMap::from([("lr".into(), 0.1)]),
            })
            .unwrap();
        }
        m.push(Record::Epoch {
            epoch: 1,
            step: 4,
            train_loss: m.epoch_loss(1),
            eval_loss: Some(0.5),
            eval_accuracy: Some(0.75),
            seconds: 1.0,
            scalars: BTreeMap::new(),
        })
        .unwrap();
        drop(m);
        assert_eq!(read_metrics(&path).len(), 5);
        let resumed = Metrics::open(&path, Some(2)).unwrap();
        assert_eq!(resumed.records.len(), 2);
        assert_eq!(read_metrics(&path), resumed.records);
        let svg = crate::plot::plot(&read_metrics(&path), "a <test>");
        assert!(
            svg.starts_with("<svg") && svg.contains("a &lt;test&gt;") && svg.contains("polyline")
        );
    }
}
