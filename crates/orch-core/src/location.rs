//! Where in a user's file something went wrong, and the error that says so.

use std::fmt;
use std::path::{Path, PathBuf};

/// A position in a text file, 1-based, as editors show it. Line 0 means no position: the
/// whole source (the command line of `orch run`'s quick form), shown by its name alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Location {
    pub file: PathBuf,
    pub line: usize,
    pub column: usize,
}

impl Location {
    /// The location of byte `offset` in `text` (clamped to the end of the text).
    pub fn from_offset(file: &Path, text: &str, offset: usize) -> Location {
        let offset = offset.min(text.len());
        let before = &text.as_bytes()[..offset];
        let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
        let line_start = before
            .iter()
            .rposition(|&b| b == b'\n')
            .map_or(0, |i| i + 1);
        let column = String::from_utf8_lossy(&before[line_start..])
            .chars()
            .count()
            + 1;
        Location {
            file: file.to_path_buf(),
            line,
            column,
        }
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line == 0 {
            write!(f, "{}", self.file.display())
        } else {
            write!(f, "{}:{}:{}", self.file.display(), self.line, self.column)
        }
    }
}

/// Bad input in a user's file: where, what was wrong, and (optionally) what to do.
///
/// One sentence on one line: the constructors escape control characters (a line break in a
/// quoted value, or in a message `toml` built from a key) as `\n`, `\u{1b}`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{location}: {message}{}", hint.as_ref().map(|h| format!(" ({h})")).unwrap_or_default())]
pub struct InputError {
    pub location: Location,
    pub message: String,
    pub hint: Option<String>,
}

impl InputError {
    /// Turns a `toml` deserialisation error into an [`InputError`] pointing at the offending value.
    pub fn from_toml(file: &Path, text: &str, err: &toml::de::Error) -> InputError {
        let offset = err.span().map_or(0, |s| s.start);
        InputError {
            location: Location::from_offset(file, text, offset),
            message: one_line(err.message().trim()),
            hint: None,
        }
    }

    /// An error at byte `offset` of `text`.
    pub fn at(file: &Path, text: &str, offset: usize, message: impl Into<String>) -> InputError {
        InputError {
            location: Location::from_offset(file, text, offset),
            message: one_line(&message.into()),
            hint: None,
        }
    }

    #[must_use]
    pub fn with_hint(mut self, hint: impl Into<String>) -> InputError {
        self.hint = Some(one_line(&hint.into()));
        self
    }
}

/// The longest message or hint kept, in characters: a value quoted in a message (TOML's
/// parser quotes whole strings) must not turn one sentence into pages.
const MAX_CHARS: usize = 1000;

/// `text` with its unprintable characters ([`crate::text::is_unprintable`]) escaped the way Rust
/// writes them in a string literal, cut after [`MAX_CHARS`] characters.
fn one_line(text: &str) -> String {
    let mut out = String::with_capacity(text.len().min(4 * MAX_CHARS));
    for (n, c) in text.chars().enumerate() {
        if n == MAX_CHARS {
            out.push('…');
            break;
        }
        if crate::text::is_unprintable(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_quoted_value_is_cut() {
        let text = format!("a = \"{}\"\n", "[".repeat(5000));
        let err = toml::from_str::<std::collections::BTreeMap<String, i64>>(&text).unwrap_err();
        let e = InputError::from_toml(Path::new("f.toml"), &text, &err).to_string();
        assert!(e.len() < 4096 && e.contains('…'), "{}", e.len());
    }

    #[test]
    fn offsets_map_to_one_based_line_and_column() {
        let text = "a = 1\nbb = \"x\"\n";
        let f = Path::new("f.toml");
        assert_eq!(Location::from_offset(f, text, 0).to_string(), "f.toml:1:1");
        assert_eq!(Location::from_offset(f, text, 6).to_string(), "f.toml:2:1");
        assert_eq!(Location::from_offset(f, text, 11).to_string(), "f.toml:2:6");
        assert_eq!(Location::from_offset(f, text, 999).line, 3);
    }

    #[test]
    fn errors_are_one_line_whatever_they_quote() {
        let f = Path::new("f.toml");
        let e = InputError::at(f, "", 0, "key `a\nb` is bad\r").with_hint("tab\there\u{1b}[31m");
        assert_eq!(
            e.to_string(),
            "f.toml:1:1: key `a\\nb` is bad\\r (tab\\there\\u{1b}[31m)"
        );
    }
}
