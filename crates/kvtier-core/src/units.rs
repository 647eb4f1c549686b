//! Sizes and durations as people write them: `64GiB`, `512MB`, `7d`, `250ms`.
//!
//! Sizes take B, KB/MB/GB/TB (powers of 1000) and KiB/MiB/GiB/TiB (powers of 1024), or a
//! plain number of bytes. Durations take ms, s, m, h, d, or a plain number of seconds.
//! Both print back in the largest unit that divides them exactly, so a printed
//! configuration reads back to the same values. The one parser of sizes and durations:
//! `kvtier serve`'s settings (through `kvtier-node`, with serde under the `serde`
//! feature) and the gateway's flags read them here.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

#[cfg(feature = "serde")]
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A byte count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct ByteSize(pub u64);

/// A duration with a human unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct HumanDuration(pub Duration);

const SIZE_UNITS: [(&str, u64); 9] = [
    ("TiB", 1 << 40),
    ("GiB", 1 << 30),
    ("MiB", 1 << 20),
    ("KiB", 1 << 10),
    ("TB", 1_000_000_000_000),
    ("GB", 1_000_000_000),
    ("MB", 1_000_000),
    ("KB", 1_000),
    ("B", 1),
];

const TIME_UNITS: [(&str, u64); 5] = [
    ("d", 86_400_000),
    ("h", 3_600_000),
    ("m", 60_000),
    ("s", 1_000),
    ("ms", 1),
];

/// Splits `"64GiB"` into `(64, "GiB")`.
fn split_number(s: &str) -> Result<(u64, &str), String> {
    let s = s.trim();
    let end = s
        .find(|c: char| !c.is_ascii_digit() && c != '_')
        .unwrap_or(s.len());
    let (digits, unit) = s.split_at(end);
    let digits: String = digits.chars().filter(|c| *c != '_').collect();
    if digits.is_empty() {
        return Err(format!("`{s}` does not start with a number"));
    }
    let n = digits.parse::<u64>().map_err(|e| format!("`{s}`: {e}"))?;
    Ok((n, unit.trim()))
}

impl FromStr for ByteSize {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (n, unit) = split_number(s)?;
        if unit.is_empty() {
            return Ok(ByteSize(n));
        }
        let (_, mult) = SIZE_UNITS
            .iter()
            .find(|(u, _)| u.eq_ignore_ascii_case(unit))
            .ok_or_else(|| {
                format!(
                    "`{s}`: unknown size unit `{unit}` (use B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)"
                )
            })?;
        n.checked_mul(*mult)
            .map(ByteSize)
            .ok_or_else(|| format!("`{s}` is too large"))
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0 == 0 {
            return f.write_str("0B");
        }
        // The unit that divides exactly and leaves the smallest number, so a size prints
        // back as it was written: `2GB` (not `1953125KiB`), `64GiB`.
        let (unit, mult) = SIZE_UNITS
            .iter()
            .filter(|(_, m)| self.0.is_multiple_of(*m))
            .min_by_key(|(_, m)| self.0 / m)
            .copied()
            .unwrap_or(("B", 1));
        write!(f, "{}{unit}", self.0 / mult)
    }
}

impl FromStr for HumanDuration {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (n, unit) = split_number(s)?;
        if unit.is_empty() {
            return Ok(HumanDuration(Duration::from_secs(n)));
        }
        let (_, ms) = TIME_UNITS
            .iter()
            .find(|(u, _)| *u == unit)
            .ok_or_else(|| format!("`{s}`: unknown time unit `{unit}` (use ms, s, m, h, d)"))?;
        n.checked_mul(*ms)
            .map(|total| HumanDuration(Duration::from_millis(total)))
            .ok_or_else(|| format!("`{s}` is too long"))
    }
}

impl fmt::Display for HumanDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = self.0.as_millis() as u64;
        if ms == 0 {
            return f.write_str("0s");
        }
        let (unit, mult) = TIME_UNITS
            .iter()
            .find(|(_, m)| ms.is_multiple_of(*m))
            .copied()
            .unwrap_or(("ms", 1));
        write!(f, "{}{unit}", ms / mult)
    }
}

/// Either a string with a unit or a bare integer.
#[cfg(feature = "serde")]
#[derive(Deserialize)]
#[serde(untagged)]
enum Raw {
    Number(u64),
    Text(String),
}

#[cfg(feature = "serde")]
macro_rules! serde_via_text {
    ($t:ty, $from_number:expr) => {
        impl Serialize for $t {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_str(self)
            }
        }
        impl<'de> Deserialize<'de> for $t {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                match Raw::deserialize(d)? {
                    Raw::Number(n) => Ok($from_number(n)),
                    Raw::Text(s) => s.parse().map_err(serde::de::Error::custom),
                }
            }
        }
    };
}

#[cfg(feature = "serde")]
serde_via_text!(ByteSize, ByteSize);
#[cfg(feature = "serde")]
serde_via_text!(HumanDuration, |n| HumanDuration(Duration::from_secs(n)));

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test code")]

    use super::*;

    #[test]
    fn sizes_parse_and_print_back() {
        for (text, bytes) in [
            ("64GiB", 64u64 << 30),
            ("512 MiB", 512 << 20),
            ("1gib", 1 << 30),
            ("10MB", 10_000_000),
            ("4096", 4096),
            ("1_000B", 1000),
        ] {
            let parsed: ByteSize = text.parse().unwrap();
            assert_eq!(parsed.0, bytes, "{text}");
            let again: ByteSize = parsed.to_string().parse().unwrap();
            assert_eq!(again, parsed);
        }
        assert_eq!(ByteSize(64 << 30).to_string(), "64GiB");
        assert_eq!(ByteSize(1_500_000).to_string(), "1500KB");
        // Decimal sizes divisible by a binary unit print in the unit they were written in.
        for text in ["2GB", "10MB", "3TB", "512MiB", "1KiB", "1KB", "3B"] {
            assert_eq!(text.parse::<ByteSize>().unwrap().to_string(), text);
        }
        for bad in ["", "GiB", "12XB", "-1GiB", "99999999999999TiB"] {
            assert!(bad.parse::<ByteSize>().is_err(), "{bad}");
        }
    }

    #[test]
    fn durations_parse_and_print_back() {
        for (text, ms) in [
            ("7d", 7 * 86_400_000u64),
            ("250ms", 250),
            ("90s", 90_000),
            ("2h", 7_200_000),
            ("30", 30_000),
        ] {
            let parsed: HumanDuration = text.parse().unwrap();
            assert_eq!(parsed.0.as_millis() as u64, ms, "{text}");
            let again: HumanDuration = parsed.to_string().parse().unwrap();
            assert_eq!(again, parsed);
        }
        assert_eq!(
            HumanDuration(Duration::from_secs(7 * 86_400)).to_string(),
            "7d"
        );
        for bad in ["", "d", "5 weeks", "1.5h"] {
            assert!(bad.parse::<HumanDuration>().is_err(), "{bad}");
        }
    }
}
