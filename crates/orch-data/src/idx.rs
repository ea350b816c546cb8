//! MNIST in its original IDX format, raw or gzip-compressed.
//!
//! Written here, not taken from a crate: IDX is a magic number, big-endian dimensions and raw
//! bytes, a few dozen lines to read, and this reader checks every length against the file and
//! names the file in each refusal (a dependency would bring its own errors to wrap, for less
//! code than the wrapping).

use crate::{DataError, Dataset};
use flate2::read::GzDecoder;
use std::io::Read;
use std::path::{Path, PathBuf};

const IMAGES_MAGIC: u32 = 0x0000_0803;
const LABELS_MAGIC: u32 = 0x0000_0801;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Split {
    Train,
    Test,
}

impl Split {
    fn prefix(self) -> &'static str {
        match self {
            Split::Train => "train",
            Split::Test => "t10k",
        }
    }
}

/// Loads a split of MNIST from `dir` (`train-images-idx3-ubyte[.gz]` and friends). Pixels are
/// scaled to [0, 1].
pub fn load_mnist(dir: &Path, split: Split) -> Result<Dataset, DataError> {
    let images_path = find(dir, &format!("{}-images-idx3-ubyte", split.prefix()))?;
    let labels_path = find(dir, &format!("{}-labels-idx1-ubyte", split.prefix()))?;
    let images = read_maybe_gz(&images_path)?;
    let labels = read_maybe_gz(&labels_path)?;
    parse(&images_path, &images, &labels_path, &labels)
}

fn find(dir: &Path, stem: &str) -> Result<PathBuf, DataError> {
    [format!("{stem}.gz"), stem.to_string()]
        .into_iter()
        .map(|name| dir.join(name))
        .find(|p| p.is_file())
        .ok_or_else(|| DataError::Missing {
            what: "MNIST file",
            dir: dir.to_path_buf(),
            expected: format!("{stem} or {stem}.gz"),
        })
}

pub(crate) fn read_maybe_gz(path: &Path) -> Result<Vec<u8>, DataError> {
    let raw = std::fs::read(path).map_err(|e| DataError::Read {
        path: path.into(),
        reason: e.to_string(),
    })?;
    if raw.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::with_capacity(raw.len() * 4);
        GzDecoder::new(raw.as_slice())
            .read_to_end(&mut out)
            .map_err(|e| DataError::Read {
                path: path.into(),
                reason: format!("gzip: {e}"),
            })?;
        Ok(out)
    } else {
        Ok(raw)
    }
}

fn be_u32(bytes: &[u8], at: usize) -> Option<u32> {
    bytes
        .get(at..at + 4)
        .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
}

fn parse(
    images_path: &Path,
    images: &[u8],
    labels_path: &Path,
    labels: &[u8],
) -> Result<Dataset, DataError> {
    let bad = |path: &Path, reason: String| DataError::Format {
        path: path.into(),
        format: "IDX",
        reason,
    };
    if be_u32(images, 0) != Some(IMAGES_MAGIC) {
        return Err(bad(
            images_path,
            "the magic number is not 0x00000803 (images)".into(),
        ));
    }
    if be_u32(labels, 0) != Some(LABELS_MAGIC) {
        return Err(bad(
            labels_path,
            "the magic number is not 0x00000801 (labels)".into(),
        ));
    }
    let header = |at| be_u32(images, at).map(|v| v as usize);
    let (Some(n), Some(rows), Some(cols)) = (header(4), header(8), header(12)) else {
        return Err(bad(images_path, "the header is cut short".into()));
    };
    let n_labels = be_u32(labels, 4).map_or(0, |v| v as usize);
    if n != n_labels {
        return Err(bad(
            labels_path,
            format!("{n_labels} labels for {n} images"),
        ));
    }
    let dim = rows * cols;
    let pixels = images
        .get(16..16 + n * dim)
        .ok_or_else(|| bad(images_path, format!("expected {} pixel bytes", n * dim)))?;
    let label_bytes = labels
        .get(8..8 + n)
        .ok_or_else(|| bad(labels_path, format!("expected {n} label bytes")))?;
    let features = pixels.iter().map(|&p| f32::from(p) / 255.0).collect();
    let labels: Vec<u32> = label_bytes.iter().map(|&l| u32::from(l)).collect();
    let num_classes = labels.iter().max().map_or(0, |&m| m as usize + 1);
    Ok(Dataset {
        features,
        labels,
        feature_dim: dim,
        sample_shape: vec![1, rows, cols],
        num_classes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data_dir() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/mnist/data")
    }

    #[test]
    fn loads_the_bundled_test_split() {
        let test = load_mnist(&data_dir(), Split::Test).unwrap();
        assert_eq!(
            (test.len(), test.feature_dim, test.num_classes),
            (10_000, 784, 10)
        );
        assert_eq!(
            &test.labels[..5],
            &[7, 2, 1, 0, 4],
            "the well-known first test labels"
        );
        assert!(test.features.iter().all(|&x| (0.0..=1.0).contains(&x)));
    }

    #[test]
    fn rejects_bad_headers_and_missing_files() {
        let err = parse(Path::new("i"), &[0, 0, 8, 1], Path::new("l"), &[0, 0, 8, 1]).unwrap_err();
        assert!(err.to_string().contains("0x00000803"), "{err}");
        let err = load_mnist(Path::new("/nonexistent"), Split::Train).unwrap_err();
        assert!(err.to_string().contains("train-images-idx3-ubyte"), "{err}");
    }
}
