//! An in-memory labelled data set of f32 feature rows.

use std::path::PathBuf;

/// Samples as rows of `feature_dim` floats, with integer class labels.
#[derive(Debug, Clone, PartialEq)]
pub struct Dataset {
    pub features: Vec<f32>,
    pub labels: Vec<u32>,
    pub feature_dim: usize,
    /// The shape of one sample (its product is `feature_dim`): `[1, 28, 28]` for MNIST,
    /// `[feature_dim]` for CSV, what the file says for safetensors.
    pub sample_shape: Vec<usize>,
    /// One more than the largest label.
    pub num_classes: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum DataError {
    #[error("cannot read {path}: {reason}")]
    Read { path: PathBuf, reason: String },
    #[error("{path} is not a valid {format} file: {reason}")]
    Format {
        path: PathBuf,
        format: &'static str,
        reason: String,
    },
    #[error("{path}:{line}: {reason}")]
    Csv {
        path: PathBuf,
        line: usize,
        reason: String,
    },
    #[error("no {what} found in {dir} (expected {expected})")]
    Missing {
        what: &'static str,
        dir: PathBuf,
        expected: String,
    },
}

impl Dataset {
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// Copies the samples at `indices` into one contiguous `(indices.len(), feature_dim)` buffer
    /// and their labels.
    pub fn gather(&self, indices: &[u32]) -> (Vec<f32>, Vec<u32>) {
        let d = self.feature_dim;
        let mut features = Vec::with_capacity(indices.len() * d);
        let mut labels = Vec::with_capacity(indices.len());
        for &i in indices {
            let i = i as usize;
            features.extend_from_slice(&self.features[i * d..(i + 1) * d]);
            labels.push(self.labels[i]);
        }
        (features, labels)
    }

    /// Mean and standard deviation over every feature value (for [`Dataset::standardize`]).
    pub fn moments(&self) -> (f32, f32) {
        let n = self.features.len().max(1) as f64;
        let mean = self.features.iter().map(|&x| f64::from(x)).sum::<f64>() / n;
        let var = self
            .features
            .iter()
            .map(|&x| (f64::from(x) - mean).powi(2))
            .sum::<f64>()
            / n;
        (mean as f32, var.sqrt().max(1e-12) as f32)
    }

    /// `x = (x - mean) / std` for every value. Use the training set's moments on both splits.
    pub fn standardize(&mut self, mean: f32, std: f32) {
        let inv = 1.0 / std;
        for x in &mut self.features {
            *x = (*x - mean) * inv;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gather_and_standardize() {
        let mut d = Dataset {
            features: vec![0., 1., 2., 3., 4., 5.],
            labels: vec![0, 1, 2],
            feature_dim: 2,
            sample_shape: vec![2],
            num_classes: 3,
        };
        assert_eq!(d.gather(&[2, 0]), (vec![4., 5., 0., 1.], vec![2, 0]));
        let (mean, std) = d.moments();
        assert!((mean - 2.5).abs() < 1e-6);
        d.standardize(mean, std);
        let (m2, s2) = d.moments();
        assert!(m2.abs() < 1e-6 && (s2 - 1.0).abs() < 1e-5);
    }
}
