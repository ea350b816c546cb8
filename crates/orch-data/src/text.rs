//! Text for language models: a file (plain or gzip) read as a stream of token ids under a
//! vocabulary, and the windows a batch is made of.
//!
//! Design decision: the vocabulary is characters (Unicode scalar values), the sorted distinct
//! characters of the training file, as character-level models (nanoGPT's Shakespeare) use; or
//! the 256 byte values, which need no training file to define and take any input. Token `i` is
//! the `i`-th character of the sorted list, so the same training file gives the same ids on
//! every machine, and a checkpoint stores the list to decode with.

use crate::DataError;
use crate::idx::read_maybe_gz;
use std::collections::BTreeSet;
use std::path::Path;

/// How characters become token ids.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Vocab {
    /// Token `i` is `chars[i]` (sorted, distinct).
    Chars(Vec<char>),
    /// Token `i` is the byte `i` (256 tokens).
    Bytes,
}

/// What to do with a character outside the vocabulary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Unknown {
    /// Refuse the file, naming the character and its line.
    #[default]
    Error,
    /// Leave the character out.
    Skip,
}

impl Vocab {
    /// The sorted distinct characters of `text`.
    pub fn of_text(text: &str) -> Vocab {
        let set: BTreeSet<char> = text.chars().collect();
        Vocab::Chars(set.into_iter().collect())
    }

    /// Tokens in the vocabulary.
    pub fn len(&self) -> usize {
        match self {
            Vocab::Chars(chars) => chars.len(),
            Vocab::Bytes => 256,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `text` as token ids; a character outside the vocabulary is an error naming it and its
    /// line (`what` names the text: a file, "the prompt"), or left out with [`Unknown::Skip`].
    pub fn encode(&self, text: &str, unknown: Unknown, what: &str) -> Result<Vec<u32>, String> {
        match self {
            Vocab::Bytes => Ok(text.bytes().map(u32::from).collect()),
            Vocab::Chars(chars) => {
                let mut tokens = Vec::with_capacity(text.len());
                let mut line = 1;
                for c in text.chars() {
                    match chars.binary_search(&c) {
                        Ok(id) => tokens.push(id as u32),
                        Err(_) if unknown == Unknown::Skip => {}
                        Err(_) => {
                            return Err(format!(
                                "{what}, line {line}: the character {c:?} (U+{:04X}) is not in the vocabulary of the training text; set `unknown = \"skip\"` in [train.data] to leave such characters out, or `vocab = \"bytes\"`",
                                u32::from(c)
                            ));
                        }
                    }
                    if c == '\n' {
                        line += 1;
                    }
                }
                Ok(tokens)
            }
        }
    }

    /// Token ids back to text (an id outside the vocabulary becomes U+FFFD).
    pub fn decode(&self, tokens: &[u32]) -> String {
        match self {
            Vocab::Bytes => {
                let bytes: Vec<u8> = tokens.iter().map(|&t| t.min(255) as u8).collect();
                String::from_utf8_lossy(&bytes).into_owned()
            }
            Vocab::Chars(chars) => tokens
                .iter()
                .map(|&t| chars.get(t as usize).copied().unwrap_or('\u{FFFD}'))
                .collect(),
        }
    }

    /// The vocabulary as a checkpoint stores it: `bytes`, or `chars:` and the characters.
    pub fn to_stored(&self) -> String {
        match self {
            Vocab::Bytes => "bytes".to_string(),
            Vocab::Chars(chars) => format!("chars:{}", chars.iter().collect::<String>()),
        }
    }

    /// Reads [`Vocab::to_stored`]'s form.
    pub fn from_stored(stored: &str) -> Option<Vocab> {
        if stored == "bytes" {
            return Some(Vocab::Bytes);
        }
        let chars: Vec<char> = stored.strip_prefix("chars:")?.chars().collect();
        chars
            .is_sorted_by(|a, b| a < b)
            .then_some(Vocab::Chars(chars))
    }
}

/// A text file's contents. Bytes must be UTF-8 unless the vocabulary is bytes.
pub fn read_text(path: &Path, bytes_vocab: bool) -> Result<String, DataError> {
    let raw = read_maybe_gz(path)?;
    if bytes_vocab {
        // Byte tokens need no decoding: keep every byte, as one char per byte would change them.
        return Ok(raw.iter().map(|&b| char::from(b)).collect());
    }
    String::from_utf8(raw).map_err(|e| DataError::Format {
        path: path.into(),
        format: "UTF-8 text",
        reason: format!("{e}; use `vocab = \"bytes\"` in [train.data] for text that is not UTF-8"),
    })
}

/// Token ids of a text file under `vocab`.
pub fn load_tokens(path: &Path, vocab: &Vocab, unknown: Unknown) -> Result<Vec<u32>, DataError> {
    let text = read_text(path, *vocab == Vocab::Bytes)?;
    let tokens = match vocab {
        // `read_text` kept each byte as the char of the same value.
        Vocab::Bytes => text.chars().map(u32::from).collect(),
        Vocab::Chars(_) => vocab
            .encode(&text, unknown, &path.display().to_string())
            .map_err(|reason| DataError::Format {
                path: path.into(),
                format: "text",
                reason,
            })?,
    };
    Ok(tokens)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vocab_is_the_sorted_distinct_characters() {
        let v = Vocab::of_text("hello\nworld");
        assert_eq!(v, Vocab::Chars("\ndehlorw".chars().collect()));
        let ids = v.encode("hold", Unknown::Error, "t").unwrap();
        assert_eq!(ids, vec![3, 5, 4, 1]);
        assert_eq!(v.decode(&ids), "hold");
        assert_eq!(Vocab::from_stored(&v.to_stored()), Some(v.clone()));
        assert_eq!(Vocab::from_stored("bytes"), Some(Vocab::Bytes));
        assert_eq!(Vocab::from_stored("chars:ba"), None, "unsorted");
    }

    #[test]
    fn an_unknown_character_names_itself_and_its_line() {
        let v = Vocab::of_text("ab\n");
        let err = v
            .encode("ab\nba\naz", Unknown::Error, "val.txt")
            .unwrap_err();
        assert!(
            err.starts_with("val.txt, line 3: the character 'z'"),
            "{err}"
        );
        assert_eq!(v.encode("azb", Unknown::Skip, "x").unwrap(), vec![1, 2]);
    }

    #[test]
    fn bytes_take_any_input() {
        let dir = std::env::temp_dir().join(format!("orch-text-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t.bin");
        std::fs::write(&path, [0u8, 200, 10, 255]).unwrap();
        assert_eq!(
            load_tokens(&path, &Vocab::Bytes, Unknown::Error).unwrap(),
            vec![0, 200, 10, 255]
        );
        let err = load_tokens(&path, &Vocab::of_text("a"), Unknown::Error).unwrap_err();
        assert!(err.to_string().contains("vocab = \"bytes\""), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
