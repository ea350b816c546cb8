//! The safetensors format (f32 only), written and read without a dependency: an 8-byte
//! little-endian header length, a JSON header naming each tensor's dtype, shape and byte range,
//! then the raw little-endian data. Files load with `safetensors.torch.load_file` as they are.

use serde_json::{Map, Value, json};
use std::collections::BTreeMap;

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
    let mut sorted: Vec<&NamedTensor> = tensors.iter().collect();
    sorted.sort_by(|a, b| a.name.cmp(&b.name));
    let mut header = Map::new();
    if !metadata.is_empty() {
        header.insert("__metadata__".into(), json!(metadata));
    }
    let mut offset = 0usize;
    for t in &sorted {
        if t.shape.iter().product::<usize>() != t.data.len() {
            return Err(format!(
                "tensor `{}`: shape {:?} does not hold {} values",
                t.name,
                t.shape,
                t.data.len()
            ));
        }
        if header.contains_key(&t.name) {
            return Err(format!("tensor `{}` given twice", t.name));
        }
        let end = offset + t.data.len() * 4;
        header.insert(
            t.name.clone(),
            json!({"dtype": "F32", "shape": t.shape, "data_offsets": [offset, end]}),
        );
        offset = end;
    }
    let mut text = serde_json::to_vec(&Value::Object(header)).map_err(|e| e.to_string())?;
    // The data starts on an 8-byte boundary.
    while (8 + text.len()) % 8 != 0 {
        text.push(b' ');
    }
    let mut bytes = Vec::with_capacity(8 + text.len() + offset);
    bytes.extend_from_slice(&(text.len() as u64).to_le_bytes());
    bytes.extend_from_slice(&text);
    for t in &sorted {
        for v in &t.data {
            bytes.extend_from_slice(&v.to_le_bytes());
        }
    }
    Ok(bytes)
}

/// The tensors (in name order) and metadata of a safetensors file's bytes.
pub fn decode(bytes: &[u8]) -> Result<(Vec<NamedTensor>, BTreeMap<String, String>), String> {
    let len_bytes: [u8; 8] = bytes
        .get(..8)
        .and_then(|b| b.try_into().ok())
        .ok_or("shorter than its header length")?;
    let len = usize::try_from(u64::from_le_bytes(len_bytes)).map_err(|e| e.to_string())?;
    let header_end = 8usize.checked_add(len).ok_or("header length overflows")?;
    let header = bytes.get(8..header_end).ok_or("truncated header")?;
    let data = &bytes[header_end..];
    let header: Map<String, Value> =
        serde_json::from_slice(header).map_err(|e| format!("header: {e}"))?;
    let mut metadata = BTreeMap::new();
    let mut tensors = Vec::new();
    for (name, entry) in header {
        if name == "__metadata__" {
            if let Value::Object(m) = entry {
                for (k, v) in m {
                    metadata.insert(k, v.as_str().unwrap_or_default().to_string());
                }
            }
            continue;
        }
        let dtype = entry["dtype"].as_str().unwrap_or_default();
        if dtype != "F32" {
            return Err(format!("tensor `{name}` is {dtype}, only F32 is read"));
        }
        let shape: Vec<usize> = serde_json::from_value(entry["shape"].clone())
            .map_err(|e| format!("tensor `{name}` shape: {e}"))?;
        let [start, end]: [usize; 2] = serde_json::from_value(entry["data_offsets"].clone())
            .map_err(|e| format!("tensor `{name}` data_offsets: {e}"))?;
        let raw = data
            .get(start..end)
            .filter(|_| start <= end)
            .ok_or_else(|| format!("tensor `{name}`: bytes {start}..{end} are outside the file"))?;
        let count: usize = shape.iter().product();
        if raw.len() != count * 4 {
            return Err(format!(
                "tensor `{name}`: {} bytes for shape {shape:?}",
                raw.len()
            ));
        }
        let values = raw
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        tensors.push(NamedTensor {
            name,
            shape,
            data: values,
        });
    }
    tensors.sort_by(|a, b| a.name.cmp(&b.name));
    Ok((tensors, metadata))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_rejects_damage() {
        let tensors = vec![
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
        ];
        let meta = BTreeMap::from([("step".to_string(), "12".to_string())]);
        let bytes = encode(&tensors, &meta).unwrap();
        let header_len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        assert_eq!((8 + header_len) % 8, 0);
        let (back, meta_back) = decode(&bytes).unwrap();
        let mut expected = tensors.clone();
        expected.sort_by(|a, b| a.name.cmp(&b.name));
        assert_eq!((back, meta_back), (expected, meta.clone()));
        assert!(decode(&bytes[..bytes.len() - 4]).is_err());
        assert!(decode(&bytes[..5]).is_err());
        assert!(
            encode(
                &[NamedTensor {
                    name: "x".into(),
                    shape: vec![2],
                    data: vec![1.0]
                }],
                &meta
            )
            .is_err()
        );
    }
}
