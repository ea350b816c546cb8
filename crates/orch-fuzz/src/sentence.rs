//! "Every refusal is one sentence": what the targets check of each error message.

/// The longest refusal accepted. The longest honest ones quote two shapes of 32 dimensions.
pub const MAX_LEN: usize = 4096;

/// `Ok` when `message` reads as one sentence on one line: not blank, no line break or other
/// control character (a value quoted from the input must be escaped), at most [`MAX_LEN`]
/// bytes. Otherwise why not.
pub fn one_sentence(message: &str) -> Result<(), String> {
    if message.trim().is_empty() {
        return Err("the refusal is empty".to_string());
    }
    if let Some(c) = message.chars().find(|c| c.is_control()) {
        return Err(format!(
            "the refusal holds the control character {c:?}: {message:?}"
        ));
    }
    if message.len() > MAX_LEN {
        return Err(format!(
            "the refusal is {} bytes long, past {MAX_LEN}: {:?}...",
            message.len(),
            message.chars().take(200).collect::<String>()
        ));
    }
    Ok(())
}

/// [`one_sentence`] as a fuzz case's outcome.
pub fn check(message: &str) -> Result<(), proptest::test_runner::TestCaseError> {
    one_sentence(message).map_err(proptest::test_runner::TestCaseError::fail)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_a_sentence_and_refuses_lines_and_blanks() {
        assert!(one_sentence("j.toml:3:9: gpus = 0 is impossible (ask for 1 to 4096)").is_ok());
        assert!(one_sentence("").is_err());
        assert!(one_sentence("  ").is_err());
        assert!(one_sentence("max_runtime = \"a\nb\" is not a duration").is_err());
        assert!(one_sentence("tab\there").is_err());
        assert!(one_sentence(&"x".repeat(MAX_LEN + 1)).is_err());
    }
}
