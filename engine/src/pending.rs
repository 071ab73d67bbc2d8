//! Requests forwarded to the mod and not yet answered, keyed by the relay's upstream id.
//!
//! Bridges reuse ids freely, so every forwarded request gets a fresh upstream id; this table
//! maps it back. Entries leave when the mod answers, when they time out, or when their session
//! ends; in the last two cases the bridge is told the outcome is unknown, never that it failed
//! or succeeded, and nothing is retried.
//!
//! Forwarded requests are also bounded in bytes, per bridge and per route: a request's bytes
//! hold a [`Reservation`] until the last copy of them is dropped (written to the mod and
//! recorded), so a mod that stops reading cannot make the relay hold more than the budget, and
//! the memory is back as soon as the bytes are gone.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use dashmap::DashMap;
use gabp_proto::{message, ErrorCode};
use uuid::Uuid;

use crate::outbox::Outbox;

/// Who is waiting for an answer.
#[derive(Debug)]
pub enum Origin {
    /// A bridge's request.
    Bridge {
        /// Its connection number.
        conn: u32,
        /// Where the answer goes.
        outbox: Arc<Outbox>,
        /// The id the bridge used, restored in the answer.
        bridge_id: String,
        /// The bridge's count of pending requests (for its cap).
        in_flight: Arc<AtomicUsize>,
    },
    /// The relay's own request (subscriptions).
    Relay,
}

/// One pending request.
#[derive(Debug)]
pub struct Entry {
    /// The session it was sent in.
    pub session: Uuid,
    /// Who waits.
    pub origin: Origin,
    /// Its method.
    pub method: String,
    /// When it was forwarded.
    pub sent: Instant,
    /// When it times out.
    pub deadline: Instant,
}

impl Entry {
    /// The error a bridge's request gets when the relay answers it itself (no answer in time,
    /// an answer it cannot forward, the session's end), naming the method: (the bridge's conn,
    /// its outbox, the body). `None` for the relay's own requests: nobody to tell.
    pub fn error_reply(&self, code: ErrorCode, msg: &str) -> Option<(u32, &Arc<Outbox>, Bytes)> {
        let Origin::Bridge {
            conn,
            outbox,
            bridge_id,
            ..
        } = &self.origin
        else {
            return None;
        };
        let data = serde_json::json!({"method": self.method});
        let body = message::error_response(Some(bridge_id), code, msg, Some(data));
        Some((*conn, outbox, body))
    }
}

impl Drop for Entry {
    fn drop(&mut self) {
        if let Origin::Bridge { in_flight, .. } = &self.origin {
            in_flight.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// Bytes of forwarded requests one route may hold at once.
pub const ROUTE_BYTES: usize = 64 << 20;
/// Bytes of forwarded requests one bridge may hold at once.
pub const BRIDGE_BYTES: usize = 16 << 20;

/// A byte budget shared by the requests that hold part of it.
#[derive(Debug)]
pub struct ByteBudget {
    used: AtomicUsize,
    limit: usize,
}

impl ByteBudget {
    /// A budget of `limit` bytes.
    pub fn new(limit: usize) -> Arc<ByteBudget> {
        Arc::new(ByteBudget {
            used: AtomicUsize::new(0),
            limit,
        })
    }

    /// Reserves `n` bytes, or `None` if that would pass the limit. When nothing is held, any
    /// size is allowed (a frame up to `--max-body` must always be able to go through).
    pub fn try_reserve(self: &Arc<Self>, n: usize) -> Option<Reservation> {
        let mut cur = self.used.load(Ordering::Acquire);
        loop {
            if cur > 0 && cur.saturating_add(n) > self.limit {
                return None;
            }
            match self
                .used
                .compare_exchange_weak(cur, cur + n, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => {
                    return Some(Reservation {
                        budget: self.clone(),
                        n,
                    })
                }
                Err(now) => cur = now,
            }
        }
    }

    /// Bytes held now.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Acquire)
    }
}

/// Part of a [`ByteBudget`], given back when dropped.
#[derive(Debug)]
pub struct Reservation {
    budget: Arc<ByteBudget>,
    n: usize,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.budget.used.fetch_sub(self.n, Ordering::AcqRel);
    }
}

/// `bytes` as a buffer that gives `holds` back when its last copy is dropped.
pub fn hold(bytes: Bytes, holds: Vec<Reservation>) -> Bytes {
    struct Held {
        bytes: Bytes,
        _holds: Vec<Reservation>,
    }
    impl AsRef<[u8]> for Held {
        fn as_ref(&self) -> &[u8] {
            &self.bytes
        }
    }
    Bytes::from_owner(Held {
        bytes,
        _holds: holds,
    })
}

/// Hashes a pending request's upstream id by its own bits. The relay makes those ids at random
/// and no peer chooses them, so a keyed hash (SipHash, the default) protects nothing here; it
/// was most of the table's cost per call.
#[derive(Debug, Default)]
struct IdBits(u64);

impl std::hash::Hasher for IdBits {
    fn write(&mut self, bytes: &[u8]) {
        // The two halves of a random UUID folded together (their few fixed version and variant
        // bits each meet random ones).
        for half in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..half.len()].copy_from_slice(half);
            self.0 ^= u64::from_le_bytes(word);
        }
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// The table: a sharded map, measured at least as fast as one lock (ARCHITECTURE.md).
#[derive(Debug)]
pub struct Pending {
    map: DashMap<Uuid, Entry, std::hash::BuildHasherDefault<IdBits>>,
    /// Bytes of forwarded requests the whole route holds.
    pub bytes: Arc<ByteBudget>,
}

impl Default for Pending {
    fn default() -> Self {
        Pending {
            map: DashMap::default(),
            bytes: ByteBudget::new(ROUTE_BYTES),
        }
    }
}

impl Pending {
    /// Adds an entry (the bridge's in-flight count was already raised by the caller).
    pub fn insert(&self, id: Uuid, entry: Entry) {
        self.map.insert(id, entry);
    }

    /// Takes the entry for an upstream id.
    pub fn take(&self, id: &Uuid) -> Option<Entry> {
        self.map.remove(id).map(|(_, e)| e)
    }

    /// Takes every entry past its deadline.
    pub fn expire(&self, now: Instant) -> Vec<Entry> {
        self.take_where(|e| e.deadline <= now)
    }

    /// Takes every entry of a session.
    pub fn drain_session(&self, session: Uuid) -> Vec<Entry> {
        self.take_where(|e| e.session == session)
    }

    /// Takes every entry matching `f`. Ids are collected first: removing while iterating
    /// would deadlock on the shard being read.
    fn take_where(&self, f: impl Fn(&Entry) -> bool) -> Vec<Entry> {
        let ids: Vec<Uuid> = self
            .map
            .iter()
            .filter(|e| f(e.value()))
            .map(|e| *e.key())
            .collect();
        ids.iter()
            .filter_map(|id| self.map.remove(id).map(|(_, e)| e))
            .collect()
    }

    /// Entries pending.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether nothing is pending.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budget_counts_bytes_until_the_last_copy_is_dropped() {
        let b = ByteBudget::new(100);
        let big = b.try_reserve(500).expect("nothing held: any size goes");
        assert!(b.try_reserve(1).is_none(), "over the limit");
        let held = hold(Bytes::from(vec![1u8; 500]), vec![big]);
        let copy = held.clone();
        drop(held);
        assert_eq!(b.used(), 500, "a copy still holds it");
        assert_eq!(copy.len(), 500);
        drop(copy);
        assert_eq!(b.used(), 0);
        let r = b.try_reserve(60).expect("fits");
        assert!(b.try_reserve(60).is_none());
        assert!(b.try_reserve(40).is_some());
        drop(r);
    }
}
