//! Requests forwarded to the mod and not yet answered, keyed by the relay's upstream id.
//!
//! Bridges reuse ids freely, so every forwarded request gets a fresh upstream id; this table
//! maps it back. Entries leave when the mod answers, when they time out, or when their session
//! ends; in the last two cases the bridge is told the outcome is unknown, never that it failed
//! or succeeded, and nothing is retried.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;
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

impl Drop for Entry {
    fn drop(&mut self) {
        if let Origin::Bridge { in_flight, .. } = &self.origin {
            in_flight.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// The table.
#[derive(Debug, Default)]
pub struct Pending {
    map: Mutex<HashMap<Uuid, Entry>>,
}

impl Pending {
    /// Adds an entry (the bridge's in-flight count was already raised by the caller).
    pub fn insert(&self, id: Uuid, entry: Entry) {
        self.map.lock().insert(id, entry);
    }

    /// Takes the entry for an upstream id.
    pub fn take(&self, id: &Uuid) -> Option<Entry> {
        self.map.lock().remove(id)
    }

    /// Takes every entry past its deadline.
    pub fn expire(&self, now: Instant) -> Vec<Entry> {
        let mut map = self.map.lock();
        let ids: Vec<Uuid> = map
            .iter()
            .filter(|(_, e)| e.deadline <= now)
            .map(|(id, _)| *id)
            .collect();
        ids.iter().filter_map(|id| map.remove(id)).collect()
    }

    /// Takes every entry of a session.
    pub fn drain_session(&self, session: Uuid) -> Vec<Entry> {
        let mut map = self.map.lock();
        let ids: Vec<Uuid> = map
            .iter()
            .filter(|(_, e)| e.session == session)
            .map(|(id, _)| *id)
            .collect();
        ids.iter().filter_map(|id| map.remove(id)).collect()
    }

    /// Entries pending.
    pub fn len(&self) -> usize {
        self.map.lock().len()
    }

    /// Whether nothing is pending.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
