//! The serve.toml the package installs as /etc/orch/serve.toml: every key the daemon reads is
//! in it, and the file with every key uncommented is a valid config.

use super::Config;
use std::path::Path;

const PACKAGED: &str = include_str!("../../../../orch-cli/package/serve.toml");
const CONFIG_SOURCE: &str = include_str!("../config.rs");

/// The field names of the `Raw*` structs serve.toml is read into.
fn keys_the_daemon_reads() -> Vec<String> {
    let mut keys = Vec::new();
    let mut inside = false;
    for line in CONFIG_SOURCE.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with("struct Raw") && trimmed.ends_with('{') {
            inside = true;
            continue;
        }
        if inside && trimmed == "}" {
            inside = false;
            continue;
        }
        if inside
            && let Some((name, _)) = trimmed.split_once(": ")
            && name.chars().all(|c| c.is_ascii_lowercase() || c == '_')
        {
            keys.push(name.to_string());
        }
    }
    keys
}

fn is_key(word: &str) -> bool {
    word.chars().all(|c| c.is_ascii_lowercase() || c == '_')
}

/// The packaged file with its commented keys and tables uncommented.
fn uncommented() -> String {
    PACKAGED
        .lines()
        .map(|line| match line.strip_prefix("# ") {
            Some(rest)
                if rest.starts_with('[')
                    || rest.split_once(" = ").is_some_and(|(k, _)| is_key(k)) =>
            {
                rest
            }
            _ => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn every_key_the_daemon_reads_is_in_the_packaged_config() {
    let keys = keys_the_daemon_reads();
    assert!(keys.len() > 30, "found only {keys:?} in config.rs");
    let text = uncommented();
    // `tenant`, `queue` and `compile` are tables.
    let missing: Vec<&String> = keys
        .iter()
        .filter(|k| {
            !text.lines().any(|l| {
                l.starts_with(&format!("{k} = "))
                    || l == format!("[{k}]")
                    || l == format!("[[{k}]]")
            })
        })
        .collect();
    assert!(
        missing.is_empty(),
        "keys missing from crates/orch-cli/package/serve.toml: {missing:?}"
    );
}

#[test]
fn the_packaged_config_uncommented_is_valid_and_as_shipped_asks_for_a_tenant() {
    let path = Path::new("/etc/orch/serve.toml");
    let text = uncommented();
    let config = Config::parse(path, &text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_eq!(config.tenants.len(), 1);
    let err = Config::parse(path, PACKAGED).unwrap_err();
    assert!(err.to_string().contains("[[tenant]]"), "{err}");
}
