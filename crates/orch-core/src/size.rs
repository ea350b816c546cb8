//! Byte sizes as users write them: integer bytes, or `NNN[KMGT]iB` (binary) / `NNN[KMGT]B`
//! (decimal), with an optional fractional part (`1.5GiB`).
//!
//! Parsed here, not by `bytesize` or `byte-unit`: the accepted forms are exactly the ones above
//! (fractions only with a unit, overflow refused), and a refusal is the one sentence the job
//! parser places at the value's file:line:col (toml's spans). A crate's parser decides for itself
//! which other forms it takes (spaces, letter case) and words its own errors, so the same wrapper
//! would be needed around it; the parser is some thirty lines with property tests.

use serde::de::{self, Deserializer, Visitor};
use std::fmt;
use std::str::FromStr;

/// A number of bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct ByteSize(pub u64);

/// Why a size string was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "expected a size such as \"80GiB\", \"512MB\" or an integer number of bytes, found \"{0}\""
)]
pub struct SizeParseError(pub String);

impl ByteSize {
    pub fn bytes(self) -> u64 {
        self.0
    }
}

impl FromStr for ByteSize {
    type Err = SizeParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || SizeParseError(s.to_string());
        let t = s.trim();
        let split = t
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(t.len());
        let (number, unit) = t.split_at(split);
        let multiplier: u64 = match unit.trim() {
            "" | "B" => 1,
            "KiB" => 1 << 10,
            "MiB" => 1 << 20,
            "GiB" => 1 << 30,
            "TiB" => 1 << 40,
            "KB" | "kB" => 1_000,
            "MB" => 1_000_000,
            "GB" => 1_000_000_000,
            "TB" => 1_000_000_000_000,
            _ => return Err(err()),
        };
        if number.is_empty() || number.starts_with('.') || number.ends_with('.') {
            return Err(err());
        }
        if let Ok(whole) = number.parse::<u64>() {
            return whole.checked_mul(multiplier).map(ByteSize).ok_or_else(err);
        }
        let value: f64 = number.parse().map_err(|_| err())?;
        let bytes = value * multiplier as f64;
        if !bytes.is_finite()
            || bytes >= u64::MAX as f64
            || bytes.fract() != 0.0 && unit.trim().is_empty()
        {
            return Err(err());
        }
        Ok(ByteSize(bytes.round() as u64))
    }
}

impl fmt::Display for ByteSize {
    /// Binary units with one decimal: `80.0 GiB`, `512 B`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
        let mut value = self.0 as f64;
        let mut unit = 0;
        while value >= 1024.0 && unit < UNITS.len() - 1 {
            value /= 1024.0;
            unit += 1;
        }
        if unit == 0 {
            write!(f, "{} B", self.0)
        } else {
            write!(f, "{value:.1} {}", UNITS[unit])
        }
    }
}

impl<'de> serde::Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct SizeVisitor;
        impl Visitor<'_> for SizeVisitor {
            type Value = ByteSize;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a size such as \"80GiB\" or an integer number of bytes")
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<ByteSize, E> {
                u64::try_from(v)
                    .map(ByteSize)
                    .map_err(|_| E::custom(format!("a size cannot be negative, found {v}")))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<ByteSize, E> {
                Ok(ByteSize(v))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<ByteSize, E> {
                v.parse().map_err(E::custom)
            }
        }
        deserializer.deserialize_any(SizeVisitor)
    }
}

impl serde::Serialize for ByteSize {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_u64(self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_units() {
        let cases = [
            ("0", 0),
            ("1234", 1234),
            ("80GiB", 80 << 30),
            ("3 GiB", 3 << 30),
            ("512MB", 512_000_000),
            ("1.5GiB", 3 << 29),
            ("2KiB", 2048),
            ("1TB", 1_000_000_000_000),
            ("7B", 7),
        ];
        for (text, bytes) in cases {
            assert_eq!(text.parse::<ByteSize>(), Ok(ByteSize(bytes)), "{text}");
        }
    }

    #[test]
    fn rejects_garbage() {
        for text in [
            "",
            "GiB",
            "80 gigs",
            "-1",
            "1.5",
            "1.GiB",
            ".5GiB",
            "1e3",
            "99999999999TiB",
        ] {
            assert!(
                text.parse::<ByteSize>().is_err(),
                "{text} should be rejected"
            );
        }
    }

    #[test]
    fn displays_binary_units() {
        assert_eq!(ByteSize(512).to_string(), "512 B");
        assert_eq!(ByteSize(80 << 30).to_string(), "80.0 GiB");
        assert_eq!(ByteSize(3 << 29).to_string(), "1.5 GiB");
    }

    proptest! {
        #[test]
        fn integer_bytes_round_trip(n in any::<u64>()) {
            prop_assert_eq!(n.to_string().parse::<ByteSize>(), Ok(ByteSize(n)));
        }

        #[test]
        fn gib_is_1024_cubed(n in 0u64..1_000_000) {
            prop_assert_eq!(format!("{n}GiB").parse::<ByteSize>(), Ok(ByteSize(n << 30)));
        }
    }
}
