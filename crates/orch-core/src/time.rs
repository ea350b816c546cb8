//! Wall-clock time as the project stores it: milliseconds since the Unix epoch.

/// Milliseconds since the Unix epoch; 0 for a clock set before 1970.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    #[test]
    fn is_after_2020_and_does_not_go_back() {
        let a = super::now_ms();
        assert!(a > 1_577_836_800_000);
        assert!(super::now_ms() >= a);
    }
}
