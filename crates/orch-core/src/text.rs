//! Text a user typed, as orch checks and shows it: job names at submission, and everything a
//! person typed (names, reasons, users, tenants, events) when the CLI prints it.
//!
//! Design decision: one definition of "not printable" for the whole project. A character that
//! could move a terminal's cursor, retitle or clear it, break a table row, or reorder what
//! follows it on screen (a bidirectional override) is refused in a job name and escaped
//! wherever it is shown, so text from an older database, a daemon log or a plugin cannot forge
//! what a person reads.

use std::borrow::Cow;

/// Most characters a job name may hold.
pub const MAX_NAME_CHARS: usize = 128;

/// True for a character that is never shown raw: control characters (C0 such as NUL, BEL, ESC,
/// CR and LF, DEL, and C1), the bidirectional formatting characters (marks, embeddings,
/// overrides and isolates: U+061C, U+200E, U+200F, U+202A to U+202E, U+2066 to U+2069), and the
/// line and paragraph separators (U+2028, U+2029).
pub fn is_unprintable(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{061C}'
                | '\u{200E}'
                | '\u{200F}'
                | '\u{202A}'..='\u{202E}'
                | '\u{2066}'..='\u{2069}'
                | '\u{2028}'
                | '\u{2029}'
        )
}

/// `text` as the CLI prints it: every [unprintable](is_unprintable) character written the way
/// Rust writes it in a string literal (`\n`, `\t`, `\u{1b}`, `\u{202e}`); everything else as it
/// is. Borrowed when there is nothing to escape.
pub fn escape(text: &str) -> Cow<'_, str> {
    if !text.chars().any(is_unprintable) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if is_unprintable(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// What is wrong with `name` as a job name, as the end of a sentence ("holds ..."); `None` when
/// it is fine. Emptiness is the caller's to check (it has its own message).
pub fn name_problem(name: &str) -> Option<String> {
    if let Some((at, c)) = name.chars().enumerate().find(|(_, c)| is_unprintable(*c)) {
        return Some(format!(
            "holds the unprintable character U+{:04X} (at character {})",
            c as u32,
            at + 1
        ));
    }
    let count = name.chars().count();
    (count > MAX_NAME_CHARS).then(|| format!("is {count} characters long"))
}

/// The rule a job name must follow, as a hint: what to do.
pub const NAME_RULE: &str = "give at most 128 printable characters: no control characters, line breaks or bidirectional overrides";

/// A job name made from something the user did not write as a name (a command's program, a
/// script's file name): unprintable characters become `_`, surrounding blanks go, and it is cut
/// to [`MAX_NAME_CHARS`]; `job` when nothing is left. Always passes [`name_problem`].
pub fn derived_name(from: &str) -> String {
    let clean: String = from
        .chars()
        .map(|c| if is_unprintable(c) { '_' } else { c })
        .collect();
    let name: String = clean.trim().chars().take(MAX_NAME_CHARS).collect();
    let name = name.trim_end().to_string();
    if name.is_empty() {
        "job".to_string()
    } else {
        name
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostile_characters_are_escaped_and_the_rest_kept() {
        assert_eq!(escape("plain name, ümlaut 日本"), "plain name, ümlaut 日本");
        assert!(matches!(escape("plain"), Cow::Borrowed(_)));
        assert_eq!(
            escape("a\u{1b}]0;pwned\u{7}b\r\n\0\u{7f}\u{9b}"),
            "a\\u{1b}]0;pwned\\u{7}b\\r\\n\\u{0}\\u{7f}\\u{9b}"
        );
        assert_eq!(
            escape("x\u{202e}gpj.exe\u{2066}\u{2069}\u{200e}\u{200f}\u{2028}"),
            "x\\u{202e}gpj.exe\\u{2066}\\u{2069}\\u{200e}\\u{200f}\\u{2028}"
        );
        // A backslash the user typed stays one: only characters are escaped, not text.
        assert_eq!(escape("a\\b"), "a\\b");
    }

    #[test]
    fn names_are_printable_and_short() {
        assert_eq!(name_problem("resnet-50 (run 2)"), None);
        assert_eq!(name_problem(&"x".repeat(MAX_NAME_CHARS)), None);
        assert_eq!(
            name_problem(&"x".repeat(10_000)).as_deref(),
            Some("is 10000 characters long")
        );
        for (name, code) in [
            ("a\u{1b}[2J", "U+001B"),
            ("bell\u{7}", "U+0007"),
            ("cr\r", "U+000D"),
            ("lf\n", "U+000A"),
            ("nul\0", "U+0000"),
            ("del\u{7f}", "U+007F"),
            ("csi\u{9b}", "U+009B"),
            ("rlo\u{202e}", "U+202E"),
            ("iso\u{2066}", "U+2066"),
            ("lrm\u{200e}", "U+200E"),
            ("tab\t", "U+0009"),
        ] {
            let problem = name_problem(name).unwrap_or_default();
            assert!(problem.contains(code), "{name:?}: {problem}");
        }
        assert!(name_problem("ab\u{1b}").unwrap().contains("at character 3"));
    }

    #[test]
    fn derived_names_are_cleaned_not_refused() {
        assert_eq!(derived_name("python"), "python");
        assert_eq!(derived_name("evil\u{1b}[2J"), "evil_[2J");
        assert_eq!(derived_name("\n\t"), "__");
        assert_eq!(derived_name("   "), "job");
        assert_eq!(derived_name(""), "job");
        let long = derived_name(&"y".repeat(10_000));
        assert_eq!(long.chars().count(), MAX_NAME_CHARS);
        for from in ["a\u{202e}b", &"z".repeat(500), " x ", "\u{2028}"] {
            assert_eq!(name_problem(&derived_name(from)), None, "{from:?}");
        }
    }
}
