//! Edits of a file's text: the mutations a byte fuzzer makes, at char boundaries (a job file is
//! read as UTF-8 before orch parses it), with TOML's own tokens among the inserted pieces.

use proptest::prelude::*;
use proptest::sample::Index;

/// One edit at a position given relative to the text's length when applied.
#[derive(Debug, Clone)]
pub enum Edit {
    Insert(Index, String),
    Delete(Index, usize),
    Replace(Index, usize, String),
    Truncate(Index),
    DuplicateLine(Index),
    /// `depth` opening brackets or braces: deep nesting.
    Nest(Index, char, usize),
}

/// Pieces worth inserting: TOML syntax, escapes, odd numbers and characters.
const TOKENS: &[&str] = &[
    "[",
    "]",
    "[[",
    "]]",
    "{",
    "}",
    "=",
    ",",
    ".",
    "\"",
    "'",
    "'''",
    "\"\"\"",
    "\n",
    "\r\n",
    "\r",
    "#",
    "\\",
    "\\u0000",
    "\\n",
    "\\U0010FFFF",
    "\u{0}",
    "\u{7f}",
    "\t",
    "é",
    "😀",
    "\u{202e}",
    "-",
    "+",
    "_",
    "0",
    "-1",
    "1e309",
    "nan",
    "-inf",
    "-0.0",
    "0x7fffffffffffffff",
    "99999999999999999999",
    "18446744073709551616",
    "1979-05-27T07:32:00Z",
    "true",
    "= \"\"",
    "= []",
    "= {}",
    "= 0",
    "[job]",
    "[[gpu]]",
    "[resources]",
    "[train]",
    "[train.data]",
    "[command]",
    "[policy]",
    "[policy.config]",
];

fn piece() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => prop::sample::select(TOKENS).prop_map(str::to_string),
        1 => any::<String>().prop_map(|s| s.chars().take(12).collect()),
        1 => "[a-z_]{1,12}",
    ]
}

/// An edit of any kind.
pub fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        4 => (any::<Index>(), piece()).prop_map(|(i, s)| Edit::Insert(i, s)),
        2 => (any::<Index>(), 1..16usize).prop_map(|(i, n)| Edit::Delete(i, n)),
        2 => (any::<Index>(), 1..8usize, piece()).prop_map(|(i, n, s)| Edit::Replace(i, n, s)),
        1 => any::<Index>().prop_map(Edit::Truncate),
        1 => any::<Index>().prop_map(Edit::DuplicateLine),
        1 => (any::<Index>(), prop::sample::select(&['[', '{'][..]), 1..5000usize)
            .prop_map(|(i, c, n)| Edit::Nest(i, c, n)),
    ]
}

/// `text` with `edits` applied in order.
pub fn apply(text: &str, edits: &[Edit]) -> String {
    let mut out = text.to_string();
    for edit in edits {
        apply_one(&mut out, edit);
    }
    out
}

fn apply_one(text: &mut String, edit: &Edit) {
    let at = |i: &Index, text: &str| boundary(text, i.index(text.len() + 1));
    match edit {
        Edit::Insert(i, s) => {
            let p = at(i, text);
            text.insert_str(p, s);
        }
        Edit::Delete(i, n) => {
            let p = at(i, text);
            let end = boundary(text, p.saturating_add(*n).min(text.len()));
            text.replace_range(p..end, "");
        }
        Edit::Replace(i, n, s) => {
            let p = at(i, text);
            let end = boundary(text, p.saturating_add(*n).min(text.len()));
            text.replace_range(p..end, s);
        }
        Edit::Truncate(i) => {
            let p = at(i, text);
            text.truncate(p);
        }
        Edit::DuplicateLine(i) => {
            let p = at(i, text);
            let start = text[..p].rfind('\n').map_or(0, |n| n + 1);
            let end = text[p..].find('\n').map_or(text.len(), |n| p + n + 1);
            let line = text[start..end].to_string();
            text.insert_str(end, &line);
        }
        Edit::Nest(i, c, depth) => {
            let p = at(i, text);
            let level = if *c == '{' { "{a = " } else { "[" };
            let opening = level.repeat(*depth);
            text.insert_str(p, &format!("x = {opening}\n"));
        }
    }
}

/// The char boundary at or before byte `i`.
fn boundary(text: &str, mut i: usize) -> usize {
    i = i.min(text.len());
    while !text.is_char_boundary(i) {
        i -= 1;
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest! {
        #[test]
        fn edits_keep_text_valid_at_any_position(
            text in any::<String>(),
            edits in prop::collection::vec(edit(), 0..6),
        ) {
            let out = apply(&text, &edits);
            prop_assert!(out.is_char_boundary(out.len()));
        }
    }
}
