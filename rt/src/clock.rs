//! Wall-clock time in nanoseconds since the Unix epoch.
//!
//! Latency is measured across processes (mod, relay, bridges), so every party stamps and reads
//! the same clock: `CLOCK_REALTIME`, which all processes on one machine share.

use std::time::{SystemTime, UNIX_EPOCH};

/// Nanoseconds since the Unix epoch.
pub fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}
