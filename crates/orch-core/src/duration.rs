//! Durations as users write them in job files, limits files and on the command line.

use std::time::Duration;

/// A positive duration: humantime's grammar (`90s`, `15m`, `2h 30m`, `3d`, `500ms`, `1week`),
/// or a plain number of seconds (`3`, `0.5`, as `sleep` reads it); `None` when malformed or zero.
pub fn parse(text: &str) -> Option<Duration> {
    let t = text.trim();
    let duration = match t.parse::<f64>() {
        Ok(seconds) => Duration::try_from_secs_f64(seconds).ok()?,
        Err(_) => humantime::parse_duration(t).ok()?,
    };
    (!duration.is_zero()).then_some(duration)
}

#[cfg(test)]
mod tests {
    use super::parse;
    use std::time::Duration;

    #[test]
    fn reads_units_and_plain_seconds_and_refuses_zero() {
        assert_eq!(parse("90s"), Some(Duration::from_secs(90)));
        assert_eq!(parse(" 2h 30m "), Some(Duration::from_secs(9000)));
        assert_eq!(parse("0.5"), Some(Duration::from_millis(500)));
        assert_eq!(parse("15m"), Some(Duration::from_secs(900)));
        assert_eq!(parse("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(parse("3d"), Some(Duration::from_secs(3 * 86400)));
        assert_eq!(parse("1.5h"), Some(Duration::from_secs(5400)));
        for bad in ["", "s", "0", "0s", "-1s", "-3", "10 parsecs", "soon"] {
            assert_eq!(parse(bad), None, "{bad}");
        }
    }
}
