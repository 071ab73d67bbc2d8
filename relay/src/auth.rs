//! Tokens: generation from the OS RNG, constant-time comparison, and throttling of failures.
//!
//! Tokens are never logged or recorded. A failed hello is answered only after a delay that
//! grows with the source's recent failures, so guessing is slow, while a correct token is
//! always answered at once and other sources are never delayed.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use subtle::ConstantTimeEq;

/// A fresh 128-bit token as 32 lowercase hex digits.
pub fn generate_token() -> String {
    let mut bytes = [0u8; 16];
    getrandom(&mut bytes);
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn getrandom(buf: &mut [u8]) {
    use rand::RngCore;
    // OsRng reads the kernel's CSPRNG (getrandom(2)).
    rand::rngs::OsRng.fill_bytes(buf);
}

/// Compares a presented token with the expected one in time independent of where they differ.
pub fn token_matches(expected: &str, presented: &str) -> bool {
    let (e, p) = (expected.as_bytes(), presented.as_bytes());
    // Only the length can leak, and token lengths are public (32 hex digits when generated).
    e.len() == p.len() && bool::from(e.ct_eq(p))
}

/// Per-source memory of failed hellos.
#[derive(Debug, Default)]
pub struct FailureThrottle {
    sources: Mutex<HashMap<String, (u32, Instant)>>,
}

/// Failures are forgotten after this long without another.
const FORGET_AFTER: Duration = Duration::from_secs(60);
/// The longest delay before a failure is answered.
const MAX_DELAY: Duration = Duration::from_secs(2);
/// Sources remembered at most; the map never grows without bound.
const MAX_SOURCES: usize = 4096;

impl FailureThrottle {
    /// Records a failure from `source` and returns how long to wait before answering it.
    pub fn fail(&self, source: &str) -> Duration {
        let now = Instant::now();
        let mut map = self.sources.lock();
        if map.len() >= MAX_SOURCES {
            map.retain(|_, (_, at)| now.duration_since(*at) < FORGET_AFTER);
            if map.len() >= MAX_SOURCES {
                map.clear();
            }
        }
        let entry = map.entry(source.to_string()).or_insert((0, now));
        if now.duration_since(entry.1) > FORGET_AFTER {
            entry.0 = 0;
        }
        entry.0 = entry.0.saturating_add(1);
        entry.1 = now;
        let shift = entry.0.saturating_sub(1).min(10);
        (Duration::from_millis(10) * (1u32 << shift)).min(MAX_DELAY)
    }

    /// Forgets a source's failures after it succeeds.
    pub fn succeed(&self, source: &str) {
        self.sources.lock().remove(source);
    }
}

/// The part of a peer description that identifies its source (the IP, not the port).
pub fn source_of(peer: &str) -> String {
    match peer.parse::<std::net::SocketAddr>() {
        Ok(a) => a.ip().to_string(),
        Err(_) => peer.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_128_bit_hex_and_distinct() {
        let a = generate_token();
        assert_eq!(a.len(), 32);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, generate_token());
    }

    #[test]
    fn comparison() {
        assert!(token_matches("abc", "abc"));
        assert!(!token_matches("abc", "abd"));
        assert!(!token_matches("abc", "ab"));
        assert!(!token_matches("abc", ""));
    }

    #[test]
    fn delay_grows_per_source_and_resets_on_success() {
        let t = FailureThrottle::default();
        let d1 = t.fail("1.2.3.4");
        let d2 = t.fail("1.2.3.4");
        assert!(d2 > d1);
        assert_eq!(t.fail("5.6.7.8"), d1, "other sources are not slowed");
        for _ in 0..50 {
            assert!(t.fail("1.2.3.4") <= MAX_DELAY);
        }
        t.succeed("1.2.3.4");
        assert_eq!(t.fail("1.2.3.4"), d1);
    }
}
