//! A data set prepared elsewhere (numpy, PyTorch) as one safetensors file: a `features` tensor
//! of shape `[samples, ..sample shape]` and a `labels` tensor of shape `[samples]` holding class
//! indices, in any of the format's integer or float dtypes.

use crate::idx::read_maybe_gz;
use crate::{DataError, Dataset};
use safetensors::{Dtype, SafeTensors};
use std::path::Path;

/// Loads `features` and `labels` from the safetensors file at `path` (optionally gzipped).
pub fn load_safetensors(path: &Path) -> Result<Dataset, DataError> {
    let bad = |reason: String| DataError::Format {
        path: path.into(),
        format: "safetensors",
        reason,
    };
    let bytes = read_maybe_gz(path)?;
    let file = SafeTensors::deserialize(&bytes).map_err(|e| bad(e.to_string()))?;
    let tensor = |name: &str| {
        file.tensor(name).map_err(|_| {
            let names: Vec<String> = file.names().into_iter().map(String::from).collect();
            bad(format!(
                "it has no tensor `{name}` (it has {}); save the samples as `features` [samples, ...] and their classes as `labels` [samples]",
                if names.is_empty() { "none".to_string() } else { names.join(", ") }
            ))
        })
    };
    let features = tensor("features")?;
    let labels = tensor("labels")?;
    let shape = features.shape().to_vec();
    let Some((&samples, sample_shape)) = shape.split_first() else {
        return Err(bad(
            "`features` is a scalar; give it shape [samples, ...]".into()
        ));
    };
    if labels.shape() != [samples] {
        return Err(bad(format!(
            "`labels` has shape {:?}, and `features` {samples} samples: give labels the shape [{samples}]",
            labels.shape()
        )));
    }
    let feature_values =
        values(features.dtype(), features.data()).map_err(|e| bad(format!("`features`: {e}")))?;
    let label_values =
        values(labels.dtype(), labels.data()).map_err(|e| bad(format!("`labels`: {e}")))?;
    let mut class_labels = Vec::with_capacity(samples);
    for (i, &l) in label_values.iter().enumerate() {
        if !(l >= 0.0 && l.fract() == 0.0 && l < 1e9) {
            return Err(bad(format!(
                "`labels`[{i}] = {l} is not a class index (a whole number from 0)"
            )));
        }
        class_labels.push(l as u32);
    }
    if feature_values.iter().any(|v| !v.is_finite()) {
        return Err(bad("`features` holds NaN or infinite values".into()));
    }
    let num_classes = class_labels.iter().max().map_or(0, |&m| m as usize + 1);
    Ok(Dataset {
        features: feature_values,
        labels: class_labels,
        feature_dim: sample_shape.iter().product(),
        sample_shape: sample_shape.to_vec(),
        num_classes,
    })
}

/// A tensor's little-endian bytes as f32 values.
fn values(dtype: Dtype, data: &[u8]) -> Result<Vec<f32>, String> {
    macro_rules! each {
        ($ty:ty, $n:expr) => {
            data.chunks_exact($n)
                .map(|c| {
                    let mut bytes = [0u8; $n];
                    bytes.copy_from_slice(c);
                    <$ty>::from_le_bytes(bytes) as f32
                })
                .collect()
        };
    }
    Ok(match dtype {
        Dtype::F32 => each!(f32, 4),
        Dtype::F64 => each!(f64, 8),
        Dtype::U8 => data.iter().map(|&b| f32::from(b)).collect(),
        Dtype::I8 => data.iter().map(|&b| f32::from(b as i8)).collect(),
        Dtype::U16 => each!(u16, 2),
        Dtype::I16 => each!(i16, 2),
        Dtype::U32 => each!(u32, 4),
        Dtype::I32 => each!(i32, 4),
        Dtype::U64 => each!(u64, 8),
        Dtype::I64 => each!(i64, 8),
        Dtype::BOOL => data.iter().map(|&b| f32::from(u8::from(b != 0))).collect(),
        Dtype::F16 => data
            .chunks_exact(2)
            .map(|c| half_to_f32(u16::from_le_bytes([c[0], c[1]])))
            .collect(),
        Dtype::BF16 => data
            .chunks_exact(2)
            .map(|c| f32::from_bits(u32::from(u16::from_le_bytes([c[0], c[1]])) << 16))
            .collect(),
        other => {
            return Err(format!(
                "dtype {other:?} is not read; save it as f32, f16, bf16 or an integer type"
            ));
        }
    })
}

/// IEEE half precision to f32.
fn half_to_f32(h: u16) -> f32 {
    let sign = if h & 0x8000 != 0 { -1.0 } else { 1.0 };
    let exp = i32::from((h >> 10) & 0x1f);
    let frac = f32::from(h & 0x3ff);
    match exp {
        0 => sign * frac * 2f32.powi(-24),
        31 if frac == 0.0 => sign * f32::INFINITY,
        31 => f32::NAN,
        _ => sign * (1.0 + frac / 1024.0) * 2f32.powi(exp - 15),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use safetensors::tensor::TensorView;

    fn file(tensors: &[(&str, Dtype, Vec<usize>, Vec<u8>)]) -> Vec<u8> {
        let views: Vec<(&str, TensorView<'_>)> = tensors
            .iter()
            .map(|(n, d, s, b)| (*n, TensorView::new(*d, s.clone(), b).unwrap()))
            .collect();
        safetensors::serialize(views, None).unwrap()
    }

    #[test]
    fn reads_any_sample_shape_and_integer_labels() {
        let dir = std::env::temp_dir().join(format!("orch-st-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("d.safetensors");
        let pixels: Vec<u8> = (0..2 * 3 * 2 * 2).map(|i| i as u8).collect();
        let labels: Vec<u8> = [1i64, 4].iter().flat_map(|l| l.to_le_bytes()).collect();
        std::fs::write(
            &path,
            file(&[
                ("features", Dtype::U8, vec![2, 3, 2, 2], pixels),
                ("labels", Dtype::I64, vec![2], labels),
            ]),
        )
        .unwrap();
        let d = load_safetensors(&path).unwrap();
        assert_eq!((d.len(), d.feature_dim, d.num_classes), (2, 12, 5));
        assert_eq!(d.sample_shape, vec![3, 2, 2]);
        assert_eq!(d.features[13], 13.0);

        let bad: Vec<u8> = [0.5f32, 1.0].iter().flat_map(|l| l.to_le_bytes()).collect();
        std::fs::write(
            &path,
            file(&[
                ("features", Dtype::U8, vec![2, 1], vec![0, 1]),
                ("labels", Dtype::F32, vec![2], bad),
            ]),
        )
        .unwrap();
        let err = load_safetensors(&path).unwrap_err().to_string();
        assert!(
            err.contains("`labels`[0] = 0.5 is not a class index"),
            "{err}"
        );
        std::fs::write(&path, file(&[("x", Dtype::U8, vec![1], vec![0])])).unwrap();
        let err = load_safetensors(&path).unwrap_err().to_string();
        assert!(err.contains("no tensor `features` (it has x)"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn half_precision() {
        assert_eq!(half_to_f32(0x3c00), 1.0);
        assert_eq!(half_to_f32(0xc000), -2.0);
        assert_eq!(half_to_f32(0x0001), 2f32.powi(-24));
    }
}
