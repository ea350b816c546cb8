//! The run's record: `metrics.jsonl`, a JSON object per training step and per epoch (and
//! `plot.svg`, drawn from it by `plot.rs`).
//!
//! ```text
//! {"kind":"step","step":12,"epoch":1,"loss":0.5321,"samples_per_sec":20512.3,"step_seconds":0.0062,"scalars":{"lr":0.05}}
//! {"kind":"eval","step":469,"eval_loss":0.1403,"eval_accuracy":0.9581,"train_seconds":3.7}
//! {"kind":"epoch","epoch":1,"step":469,"train_loss":0.3012,"eval_loss":0.1403,"eval_accuracy":0.9581,"seconds":4.1,"train_seconds":3.7}
//! ```
//!
//! An `eval` record comes with every evaluation (each epoch's end, every `eval_every` steps, the
//! end of a run by steps); `train_seconds` leaves evaluation time out (an epoch record's is the
//! epoch's own, an eval record's the run's so far); text has no `eval_accuracy`.
//!
//! `step` counts steps done (1-based), `epoch` is 1-based; `eval_*` are absent without
//! evaluation data; `scalars` holds what the plugin reported with `metrics.scalar`, averaged
//! over replicas. JSON has no NaN or infinities: such a value is written as the string `"NaN"`,
//! `"inf"` or `"-inf"` (a diverged loss stays visible instead of turning into `null`).

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
        #[serde(with = "float::single")]
        loss: f32,
        #[serde(with = "float::double")]
        samples_per_sec: f64,
        /// The step's wall time: since the previous step ended, or the run (or its last
        /// evaluation) began.
        #[serde(
            default,
            skip_serializing_if = "Option::is_none",
            with = "float::optional"
        )]
        step_seconds: Option<f64>,
        #[serde(
            default,
            skip_serializing_if = "BTreeMap::is_empty",
            with = "float::map"
        )]
        scalars: BTreeMap<String, f64>,
    },
    Epoch {
        epoch: u32,
        step: u64,
        #[serde(with = "float::double")]
        train_loss: f64,
        #[serde(
            default,
            skip_serializing_if = "Option::is_none",
            with = "float::optional"
        )]
        eval_loss: Option<f64>,
        #[serde(
            default,
            skip_serializing_if = "Option::is_none",
            with = "float::optional"
        )]
        eval_accuracy: Option<f64>,
        #[serde(with = "float::double")]
        seconds: f64,
        /// The epoch's training time, its evaluation left out (absent in files of older
        /// versions).
        #[serde(
            default,
            skip_serializing_if = "Option::is_none",
            with = "float::optional"
        )]
        train_seconds: Option<f64>,
        #[serde(
            default,
            skip_serializing_if = "BTreeMap::is_empty",
            with = "float::map"
        )]
        scalars: BTreeMap<String, f64>,
    },
    /// An evaluation (at an epoch's end, every `eval_every` steps, at the end of a run by steps).
    Eval {
        step: u64,
        #[serde(with = "float::double")]
        eval_loss: f64,
        #[serde(
            default,
            skip_serializing_if = "Option::is_none",
            with = "float::optional"
        )]
        eval_accuracy: Option<f64>,
        /// Training time so far in this process, evaluations left out.
        #[serde(with = "float::double")]
        train_seconds: f64,
    },
}

/// Floats as `metrics.jsonl` holds them: a number, or `"NaN"`, `"inf"`, `"-inf"`.
mod float {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};
    use std::collections::BTreeMap;

    #[derive(Serialize, Deserialize)]
    #[serde(untagged)]
    enum Repr {
        Number(f64),
        Text(String),
    }

    fn to_repr(v: f64) -> Repr {
        if v.is_finite() {
            Repr::Number(v)
        } else if v.is_nan() {
            Repr::Text("NaN".into())
        } else if v > 0.0 {
            Repr::Text("inf".into())
        } else {
            Repr::Text("-inf".into())
        }
    }

    fn from_repr<E: serde::de::Error>(r: Repr) -> Result<f64, E> {
        match r {
            Repr::Number(v) => Ok(v),
            Repr::Text(t) => match t.as_str() {
                "NaN" => Ok(f64::NAN),
                "inf" => Ok(f64::INFINITY),
                "-inf" => Ok(f64::NEG_INFINITY),
                other => Err(E::custom(format!(
                    "`{other}` is not a number, \"NaN\", \"inf\" or \"-inf\""
                ))),
            },
        }
    }

    pub mod double {
        use super::*;

        pub fn serialize<S: Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
            to_repr(*v).serialize(s)
        }

        pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
            from_repr(Repr::deserialize(d)?)
        }
    }

    pub mod single {
        use super::*;

        pub fn serialize<S: Serializer>(v: &f32, s: S) -> Result<S::Ok, S::Error> {
            to_repr(f64::from(*v)).serialize(s)
        }

        pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f32, D::Error> {
            Ok(from_repr::<D::Error>(Repr::deserialize(d)?)? as f32)
        }
    }

    pub mod optional {
        use super::*;

        pub fn serialize<S: Serializer>(v: &Option<f64>, s: S) -> Result<S::Ok, S::Error> {
            v.map(to_repr).serialize(s)
        }

        pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
            Option::<Repr>::deserialize(d)?.map(from_repr).transpose()
        }
    }

    pub mod map {
        use super::*;

        pub fn serialize<S: Serializer>(
            v: &BTreeMap<String, f64>,
            s: S,
        ) -> Result<S::Ok, S::Error> {
            let m: BTreeMap<&String, Repr> = v.iter().map(|(k, v)| (k, to_repr(*v))).collect();
            m.serialize(s)
        }

        pub fn deserialize<'de, D: Deserializer<'de>>(
            d: D,
        ) -> Result<BTreeMap<String, f64>, D::Error> {
            BTreeMap::<String, Repr>::deserialize(d)?
                .into_iter()
                .map(|(k, r)| Ok((k, from_repr(r)?)))
                .collect()
        }
    }
}

impl Record {
    fn step(&self) -> u64 {
        match self {
            Record::Step { step, .. } | Record::Epoch { step, .. } | Record::Eval { step, .. } => {
                *step
            }
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
    /// A fresh file, or (resuming after `keep_until` steps) the old file appended to: the
    /// records up to that step stay as they are (the file is only cut after the last of them,
    /// dropping what a run wrote past its checkpoint and any half-written last line), so a
    /// crash while resuming never loses the record of the run so far.
    pub fn open(path: &Path, keep_until: Option<u64>) -> Result<Metrics, TrainError> {
        let output = |source| TrainError::Output {
            path: path.to_path_buf(),
            source,
        };
        let Some(step) = keep_until else {
            return Ok(Metrics {
                path: path.to_path_buf(),
                file: std::fs::File::create(path).map_err(output)?,
                records: Vec::new(),
            });
        };
        let text = match std::fs::read(path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(output(e)),
        };
        let (records, keep) = kept_prefix(&text, step);
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(output)?;
        file.set_len(keep as u64).map_err(output)?;
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

/// The records of `text` up to `step`, and the byte length of the lines that hold them: up to
/// the first record past `step`, or a last line without its newline (a write cut short).
/// Lines that do not parse are kept as they are (and skipped by readers).
fn kept_prefix(text: &[u8], step: u64) -> (Vec<Record>, usize) {
    let mut records = Vec::new();
    let mut keep = 0;
    for line in text.split_inclusive(|&b| b == b'\n') {
        if !line.ends_with(b"\n") {
            break;
        }
        if let Ok(record) = serde_json::from_slice::<Record>(line) {
            if record.step() > step {
                break;
            }
            records.push(record);
        }
        keep += line.len();
    }
    (records, keep)
}

fn line(record: &Record) -> String {
    serde_json::to_string(record).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn non_finite_values_are_written_as_strings_and_read_back() {
        let record = Record::Step {
            step: 3,
            epoch: 1,
            loss: f32::NAN,
            samples_per_sec: f64::INFINITY,
            step_seconds: None,
            scalars: BTreeMap::from([("grad_norm".into(), f64::NEG_INFINITY)]),
        };
        let text = line(&record);
        assert_eq!(
            text,
            r#"{"kind":"step","step":3,"epoch":1,"loss":"NaN","samples_per_sec":"inf","scalars":{"grad_norm":"-inf"}}"#
        );
        let Record::Step {
            loss,
            samples_per_sec,
            scalars,
            ..
        } = serde_json::from_str::<Record>(&text).unwrap()
        else {
            panic!("not a step: {text}");
        };
        assert!(loss.is_nan());
        assert_eq!(samples_per_sec, f64::INFINITY);
        assert_eq!(scalars["grad_norm"], f64::NEG_INFINITY);
        let epoch = Record::Epoch {
            epoch: 1,
            step: 3,
            train_loss: f64::NAN,
            eval_loss: Some(f64::NAN),
            eval_accuracy: Some(0.5),
            seconds: 1.0,
            train_seconds: None,
            scalars: BTreeMap::new(),
        };
        let text = line(&epoch);
        assert!(text.contains(r#""eval_loss":"NaN""#), "{text}");
        assert!(serde_json::from_str::<Record>(&text).is_ok());
    }

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
                step_seconds: None,
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
            train_seconds: None,
            scalars: BTreeMap::new(),
        })
        .unwrap();
        drop(m);
        assert_eq!(read_metrics(&path).len(), 5);
        let resumed = Metrics::open(&path, Some(2)).unwrap();
        assert_eq!(resumed.records.len(), 2);
        assert_eq!(read_metrics(&path), resumed.records);
        drop(resumed);
        // Resuming appends: the kept lines are byte for byte what was there (a field this
        // version does not know survives), and a half-written last line is cut off.
        let kept = "{\"kind\":\"step\",\"step\":1,\"epoch\":1,\"loss\":0.5,\"samples_per_sec\":1.0,\"note\":\"by hand\"}\n";
        std::fs::write(&path, format!("{kept}{{\"kind\":\"step\",\"st")).unwrap();
        let mut resumed = Metrics::open(&path, Some(1)).unwrap();
        assert_eq!(resumed.records.len(), 1);
        resumed
            .push(Record::Step {
                step: 2,
                epoch: 1,
                loss: 0.25,
                samples_per_sec: 1.0,
                step_seconds: None,
                scalars: BTreeMap::new(),
            })
            .unwrap();
        drop(resumed);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.starts_with(kept), "{text}");
        assert_eq!(read_metrics(&path).len(), 2, "{text}");
        let svg = crate::plot::plot(&read_metrics(&path), "a <test>").unwrap();
        assert!(
            svg.starts_with("<svg") && svg.contains("a &lt;test&gt;") && svg.contains("polyline")
        );
    }
}
