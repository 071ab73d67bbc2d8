//! The parties of a load run: reading bridges, stalled bridges, a tool caller, hostile clients
//! (`chaos`), the raw forwarder that serves as the baseline, the byte pipe that is the floor
//! for a proxied call, peer pub/sub servers' publisher and
//! subscribers, and the per-reader tally they all count into.

pub mod bridge;
pub mod broker;
pub mod caller;
pub mod forwarder;
pub mod hostile;
pub mod pipe;
pub mod tally;

use std::sync::atomic::{AtomicBool, Ordering};

/// Whether the measurement window is open; actors count only inside it.
#[derive(Debug, Default)]
pub struct Window {
    open: AtomicBool,
    /// Events counted in the window so far, all readers (added in batches, for reports).
    delivered: std::sync::atomic::AtomicU64,
}

impl Window {
    /// Opens or closes the window.
    pub fn set(&self, open: bool) {
        self.open.store(open, Ordering::Release);
    }

    /// Whether it is open.
    pub fn is_open(&self) -> bool {
        self.open.load(Ordering::Acquire)
    }

    /// Adds events a reader counted in the window.
    pub fn add_delivered(&self, n: u64) {
        self.delivered.fetch_add(n, Ordering::Relaxed);
    }

    /// Events counted in the window so far (each reader adds its own every few events).
    pub fn delivered(&self) -> u64 {
        self.delivered.load(Ordering::Relaxed)
    }
}

/// A histogram of latencies in nanoseconds, from 1 ns to 60 s at 3 significant digits.
pub fn latency_histogram() -> hdrhistogram::Histogram<u64> {
    hdrhistogram::Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("static bounds are valid")
}

/// Finds `key` (e.g. `"seq":`) in a body and parses the unsigned integer after it.
pub fn find_u64(body: &[u8], key: &[u8]) -> Option<u64> {
    let at = memchr::memmem::find(body, key)? + key.len();
    let digits = body[at..].iter().take_while(|b| b.is_ascii_digit()).count();
    if digits == 0 || digits > 19 {
        return None;
    }
    Some(
        body[at..at + digits]
            .iter()
            .fold(0u64, |n, d| n * 10 + u64::from(d - b'0')),
    )
}

/// Finds `"channel":"` in a body and returns the channel name bytes.
pub fn find_channel(body: &[u8]) -> Option<&[u8]> {
    const KEY: &[u8] = b"\"channel\":\"";
    let at = memchr::memmem::find(body, KEY)? + KEY.len();
    let end = memchr::memchr(b'"', &body[at..])? + at;
    Some(&body[at..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_scanning() {
        let b = br#"{"type":"event","channel":"a/b","seq":42,"payload":{"t":1700000000000000000,"pad":"x"}}"#;
        assert_eq!(find_u64(b, b"\"seq\":"), Some(42));
        assert_eq!(find_u64(b, b"\"t\":"), Some(1_700_000_000_000_000_000));
        assert_eq!(find_channel(b), Some(&b"a/b"[..]));
        assert_eq!(find_u64(b"{\"seq\":x}", b"\"seq\":"), None);
    }
}
