//! Checkpoint tensors in the safetensors format, written and read by Hugging Face's
//! `safetensors` crate: files load with `safetensors.torch.load_file` as they are. Checkpoints
//! hold named f32 tensors only; this module converts between them and the crate's byte views
//! (little-endian, as the format fixes).

use safetensors::{Dtype, SafeTensors, tensor::TensorView};
use std::collections::{BTreeMap, HashMap};

/// A named f32 tensor.
#[derive(Debug, Clone, PartialEq)]
pub struct NamedTensor {
    pub name: String,
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

/// The file's bytes for `tensors` (names unique) with string `metadata`.
pub fn encode(
    tensors: &[NamedTensor],
    metadata: &BTreeMap<String, String>,
) -> Result<Vec<u8>, String> {
    let mut names = std::collections::HashSet::new();
    let mut bytes = Vec::with_capacity(tensors.len());
    for t in tensors {
        if !names.insert(t.name.as_str()) {
            // The crate keeps the last of two tensors of one name in the header but writes both
            // tensors' data: refuse instead of writing a file it would not read back.
            return Err(format!("tensor `{}` given twice", t.name));
        }
        if t.shape.iter().product::<usize>() != t.data.len() {
            return Err(format!(
                "tensor `{}`: shape {:?} does not hold {} values",
                t.name,
                t.shape,
                t.data.len()
            ));
        }
        bytes.push(
            t.data
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect::<Vec<u8>>(),
        );
    }
    let views = tensors
        .iter()
        .zip(&bytes)
        .map(|(t, b)| {
            TensorView::new(Dtype::F32, t.shape.clone(), b)
                .map(|view| (t.name.as_str(), view))
                .map_err(|e| format!("tensor `{}`: {e}", t.name))
        })
        .collect::<Result<Vec<_>, String>>()?;
    let metadata = (!metadata.is_empty()).then(|| {
        metadata
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect::<HashMap<_, _>>()
    });
    safetensors::serialize(views, metadata).map_err(|e| e.to_string())
}

/// The tensors (in name order) and metadata of a safetensors file's bytes.
pub fn decode(bytes: &[u8]) -> Result<(Vec<NamedTensor>, BTreeMap<String, String>), String> {
    // The crate hands out the string metadata only with the header, not with the tensors: the
    // header (a few hundred bytes of JSON) is parsed twice.
    let (_, header) = SafeTensors::read_metadata(bytes).map_err(|e| e.to_string())?;
    let file = SafeTensors::deserialize(bytes).map_err(|e| e.to_string())?;
    let metadata: BTreeMap<String, String> = header
        .metadata()
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let mut tensors = file
        .tensors()
        .into_iter()
        .map(|(name, view)| {
            if view.dtype() != Dtype::F32 {
                return Err(format!(
                    "tensor `{name}` is {}, only F32 is read",
                    view.dtype()
                ));
            }
            let data = view
                .data()
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            Ok(NamedTensor {
                shape: view.shape().to_vec(),
                name,
                data,
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    tensors.sort_by(|a, b| a.name.cmp(&b.name));
    Ok((tensors, metadata))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<NamedTensor> {
        vec![
            NamedTensor {
                name: "w".into(),
                shape: vec![2, 3],
                data: vec![1., 2., 3., 4., 5., 6.5],
            },
            NamedTensor {
                name: "b".into(),
                shape: vec![3],
                data: vec![-1., 0., f32::MIN_POSITIVE],
            },
            NamedTensor {
                name: "s".into(),
                shape: vec![],
                data: vec![7.0],
            },
        ]
    }

    #[test]
    fn round_trips_and_rejects_damage() {
        let tensors = sample();
        let meta = BTreeMap::from([("step".to_string(), "12".to_string())]);
        let bytes = encode(&tensors, &meta).unwrap();
        let header_len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        assert_eq!((8 + header_len) % 8, 0, "the data starts 8-byte aligned");
        let (back, meta_back) = decode(&bytes).unwrap();
        let mut expected = tensors.clone();
        expected.sort_by(|a, b| a.name.cmp(&b.name));
        assert_eq!((back, meta_back), (expected, meta.clone()));
        assert!(decode(&bytes[..bytes.len() - 4]).is_err());
        assert!(decode(&bytes[..5]).is_err());
        let short = NamedTensor {
            name: "x".into(),
            shape: vec![2],
            data: vec![1.0],
        };
        assert!(encode(&[short], &meta).is_err());
        let twice = [sample()[1].clone(), sample()[1].clone()];
        assert_eq!(encode(&twice, &meta).unwrap_err(), "tensor `b` given twice");
    }

    #[test]
    fn other_dtypes_are_named_in_the_refusal() {
        let half = [0u8; 4];
        let view = TensorView::new(Dtype::F16, vec![2], &half).unwrap();
        let bytes = safetensors::serialize([("h", view)], None).unwrap();
        assert_eq!(
            decode(&bytes).unwrap_err(),
            "tensor `h` is F16, only F32 is read"
        );
    }

    #[test]
    fn empty_metadata_and_no_tensors_round_trip() {
        let bytes = encode(&[], &BTreeMap::new()).unwrap();
        assert_eq!(decode(&bytes).unwrap(), (Vec::new(), BTreeMap::new()));
    }
}
