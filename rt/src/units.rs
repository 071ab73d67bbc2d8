//! Durations and sizes as people write them, for flags and the config file alike.
//!
//! Durations go through `humantime` (`200ms`, `10m`, `1h 30m`, `7d`), plus plain seconds and a
//! decimal with one unit (`1.5s`), which existing scripts use. Sizes go through `bytesize`
//! (`16MiB`, `500MB`, `1024`), with a bare letter meaning the binary unit (`16M` = 16 MiB), as
//! the relay has always read it.

use std::time::Duration;

use serde::{Deserialize, Deserializer};

/// The longest duration accepted anywhere.
const MAX_DURATION: Duration = Duration::from_secs(100 * 365 * 86400);

/// The longest timeout accepted: a day.
const MAX_TIMEOUT: Duration = Duration::from_secs(86400);

/// Parses `1.5s`, `200ms`, `10m`, `2h`, `7d`, `1h 30m`, or plain seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let invalid = || format!("invalid duration {s:?}: expected e.g. 500ms, 10s, 5m, 2h or 7d");
    let secs = if let Ok(n) = s.parse::<f64>() {
        n
    } else if let Ok(d) = humantime::parse_duration(s) {
        d.as_secs_f64()
    } else {
        // A decimal with one unit (`1.5s`, `0.5h`), which humantime does not read.
        let split = s
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(invalid)?;
        let (num, unit) = s.split_at(split);
        let n: f64 = num.parse().map_err(|_| invalid())?;
        let one = humantime::parse_duration(&format!("1{unit}")).map_err(|_| invalid())?;
        n * one.as_secs_f64()
    };
    // Bounded so that no later `Instant + duration` or nanosecond count can overflow.
    if !secs.is_finite() || secs < 0.0 {
        return Err(invalid());
    }
    if secs > MAX_DURATION.as_secs_f64() {
        return Err(format!("duration {s:?} is too long (at most 100 years)"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Parses a timeout: a duration from 1 ms to 24 h.
pub fn parse_timeout(s: &str) -> Result<Duration, String> {
    let too_long = || format!("timeout {s:?} is too long (at most 24h)");
    let d = parse_duration(s).map_err(|e| {
        if e.contains("too long") {
            too_long()
        } else {
            e
        }
    })?;
    if d < Duration::from_millis(1) {
        return Err(format!("timeout {s:?} is too short (at least 1ms)"));
    }
    if d > MAX_TIMEOUT {
        return Err(too_long());
    }
    Ok(d)
}

/// Parses a size: `16MiB`, `500MB`, `10GiB`, `16M` (binary), or plain bytes.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let invalid = || format!("invalid size {s:?}: expected bytes or e.g. 64KiB, 16MiB, 10GiB");
    if let Ok(n) = t.parse::<u64>() {
        return Ok(n);
    }
    // `16M` has always meant MiB here; bytesize would read it as MB.
    let binary = match t.chars().last() {
        Some(c) if "kKmMgGtT".contains(c) && t[..t.len() - 1].trim().parse::<f64>().is_ok() => {
            format!("{t}iB")
        }
        _ => t.to_string(),
    };
    binary
        .parse::<bytesize::ByteSize>()
        .map(|b| b.as_u64())
        .map_err(|_| invalid())
}

/// A size from `min` to `max` bytes, as a `usize`.
pub fn parse_size_in(s: &str, min: usize, max: usize) -> Result<usize, String> {
    let n = parse_size(s)?;
    let show = |b: usize| crate::display::bytes(b as u64);
    match usize::try_from(n) {
        Ok(n) if n < min => Err(format!("{s:?} is too small (at least {})", show(min))),
        Ok(n) if n <= max => Ok(n),
        _ => Err(format!("{s:?} is too large (at most {})", show(max))),
    }
}

/// A whole number from `min` to `max` (a bound of 0 would make the relay useless, not safe;
/// a huge one is a typo that would let one client take the machine's memory).
pub fn parse_count_in(s: &str, min: usize, max: usize) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(n) if (min..=max).contains(&n) => Ok(n),
        _ => Err(format!("expected a whole number from {min} to {max}")),
    }
}

/// A value a config file may write as a number or as a string (`16MiB`, `30s`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum NumOrText {
    /// A TOML integer.
    Int(u64),
    /// A TOML float (seconds).
    Float(f64),
    /// A TOML string.
    Text(String),
}

impl NumOrText {
    /// The value as text, for the parsers above.
    pub fn text(&self) -> String {
        match self {
            NumOrText::Int(n) => n.to_string(),
            NumOrText::Float(f) => f.to_string(),
            NumOrText::Text(s) => s.clone(),
        }
    }
}

/// Deserializes an optional size or duration written as a number or a string.
pub fn num_or_text<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    Ok(Option::<NumOrText>::deserialize(d)?.map(|v| v.text()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_and_sizes() {
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("200ms"), Ok(Duration::from_millis(200)));
        assert_eq!(parse_duration("7d"), Ok(Duration::from_secs(7 * 86400)));
        assert_eq!(parse_duration("10"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("1h 30m"), Ok(Duration::from_secs(5400)));
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("-1s").is_err());
        assert!(parse_duration("99999999999999999999999d").is_err());
        assert!(parse_timeout("0").is_err());
        assert!(parse_timeout("99999999999999d")
            .expect_err("too long")
            .contains("at most 24h"));
        assert_eq!(parse_timeout("24h"), Ok(Duration::from_secs(86400)));
        assert_eq!(parse_size("16MiB"), Ok(16 << 20));
        assert_eq!(parse_size("16M"), Ok(16 << 20));
        assert_eq!(parse_size("500MB"), Ok(500_000_000));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64 KiB"), Ok(64 << 10));
        assert!(parse_size("lots").is_err());
        assert!(parse_size_in("512", 1024, 4096)
            .expect_err("small")
            .contains("at least 1.0 KiB"));
        assert!(parse_size_in("1TiB", 1024, 64 << 20)
            .expect_err("large")
            .contains("at most 64.0 MiB"));
        assert!(parse_size_in("99999999999999999999", 1024, 64 << 20).is_err());
        assert_eq!(parse_size_in("64MiB", 1024, 64 << 20), Ok(64 << 20));
        assert_eq!(parse_count_in("65536", 1, 65536), Ok(65536));
        assert!(parse_count_in("65537", 1, 65536).is_err());
        assert!(parse_count_in("0", 1, 65536).is_err());
    }
}
