//! Wall-clock time as the project stores it: milliseconds since the Unix epoch.

/// Milliseconds since the Unix epoch; 0 for a clock set before 1970.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// A moment in milliseconds since the Unix epoch as UTC to the second, RFC 3339:
/// `2026-12-06T18:42:32Z`. A moment past the year 9999 (no sane clock gives one) is written as
/// that year's last second.
pub fn rfc3339(ms: u64) -> String {
    // 9999-12-31T23:59:59Z, the last moment RFC 3339's four-digit year can write.
    const LAST_MS: u64 = 253_402_300_799_000;
    let at = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms.min(LAST_MS));
    humantime::format_rfc3339_seconds(at).to_string()
}

#[cfg(test)]
mod tests {
    #[test]
    fn rfc3339_is_utc_to_the_second() {
        assert_eq!(super::rfc3339(1_796_582_552_999), "2026-12-06T18:42:32Z");
        assert_eq!(super::rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(super::rfc3339(u64::MAX), "9999-12-31T23:59:59Z");
    }

    #[test]
    fn is_after_2020_and_does_not_go_back() {
        let a = super::now_ms();
        assert!(a > 1_577_836_800_000);
        assert!(super::now_ms() >= a);
    }
}
