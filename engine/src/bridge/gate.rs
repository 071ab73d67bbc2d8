//! Who may hold a connection: the route's bridge cap counts only welcomed bridges, and
//! connections that have not said hello yet have a bound of their own. Relay-only bridges
//! (`gabp-relay status`, which talk to the relay and never to the mod) have a small bound of
//! their own per identity (token), [`MAX_RELAY_ONLY`], so a relay whose `--max-bridges` is full
//! can still be looked at, and one identity's connections never take another's places. When
//! either of those bounds is full the OLDEST connection in it is closed to make room, so idle
//! connections can never keep an honest bridge (which says hello at once) or `status` (which
//! asks and leaves) from getting in. Refusals and evictions are counted
//! (`gabp_bridge_refusals_total`) and logged at most once per burst.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use metrics::Counter;
use parking_lot::Mutex;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

/// Connections that may wait for their hello at once (per route).
pub const MAX_PREHELLO_CONNS: usize = 128;
/// Relay-only bridges (`relay.withoutMod`) welcomed at once per identity, beside the bridge cap;
/// that identity's oldest is closed to make room for a new one.
pub const MAX_RELAY_ONLY: usize = 4;
/// At most one log line per this long about refusals and evictions.
const LOG_EVERY: Duration = Duration::from_secs(10);

/// A route's admission state, shared by its accept loop and its connections.
#[derive(Debug)]
pub struct Gate {
    route: String,
    max_bridges: usize,
    bridges: Arc<Semaphore>,
    /// Welcomed relay-only connections, oldest first, with their identity's name (configured
    /// identities are few, so this is bounded by [`MAX_RELAY_ONLY`] per identity).
    relay_only: Mutex<BTreeMap<u64, (String, CancellationToken)>>,
    waiting: Mutex<Waiting>,
    evicted: Counter,
    relay_only_evicted: Counter,
    refused: Counter,
    log: Mutex<Burst>,
}

#[derive(Debug, Default)]
struct Waiting {
    next: u64,
    /// Connections before hello, oldest first.
    conns: BTreeMap<u64, CancellationToken>,
}

/// Refusals and evictions since the last log line.
#[derive(Debug, Default)]
struct Burst {
    last: Option<Instant>,
    evicted: u64,
    refused: u64,
}

/// Where a connection stands.
#[derive(Debug)]
enum Place {
    /// In the pre-hello bound.
    Waiting,
    /// Welcomed as a bridge, under the cap.
    Bridge {
        /// Held for as long as the bridge is: its place under the cap.
        _permit: OwnedSemaphorePermit,
    },
    /// Welcomed relay-only, in the relay-only bound.
    RelayOnly,
}

/// One connection's place: in the pre-hello bound until admitted, then a bridge permit or a
/// relay-only place.
#[derive(Debug)]
pub struct Slot {
    gate: Arc<Gate>,
    id: u64,
    /// Cancelled when the connection is evicted to make room for a newer one.
    pub evicted: CancellationToken,
    place: Place,
}

impl Gate {
    /// The gate of route `route` with its bridge cap.
    pub fn new(route: &str, max_bridges: usize) -> Arc<Gate> {
        let label = route.to_string();
        Arc::new(Gate {
            route: label.clone(),
            max_bridges,
            bridges: Arc::new(Semaphore::new(max_bridges)),
            relay_only: Mutex::new(BTreeMap::new()),
            waiting: Mutex::new(Waiting::default()),
            evicted: metrics::counter!("gabp_bridge_refusals_total", "route" => label.clone(), "reason" => "evicted_before_hello"),
            relay_only_evicted: metrics::counter!("gabp_bridge_refusals_total", "route" => label.clone(), "reason" => "relay_only_evicted"),
            refused: metrics::counter!("gabp_bridge_refusals_total", "route" => label, "reason" => "too_many_bridges"),
            log: Mutex::new(Burst::default()),
        })
    }

    /// A slot for a new connection; the oldest waiting one is evicted if the bound is full.
    pub fn arrive(self: &Arc<Self>) -> Slot {
        let evicted = CancellationToken::new();
        let (id, oldest) = {
            let mut w = self.waiting.lock();
            let oldest = if w.conns.len() >= MAX_PREHELLO_CONNS {
                w.conns.pop_first().map(|(_, t)| t)
            } else {
                None
            };
            let id = w.next;
            w.next += 1;
            w.conns.insert(id, evicted.clone());
            (id, oldest)
        };
        if let Some(t) = oldest {
            t.cancel();
            self.evicted.increment(1);
            self.note(true);
        }
        Slot {
            gate: self.clone(),
            id,
            evicted,
            place: Place::Waiting,
        }
    }

    /// Logs a refusal or eviction, at most once per [`LOG_EVERY`] (with the count since).
    fn note(&self, evicted: bool) {
        let mut b = self.log.lock();
        if evicted {
            b.evicted += 1;
        } else {
            b.refused += 1;
        }
        let now = Instant::now();
        if b.last.is_none_or(|l| now.duration_since(l) >= LOG_EVERY) {
            tracing::warn!(
                route = %self.route,
                max_bridges = self.max_bridges,
                max_waiting = MAX_PREHELLO_CONNS,
                evicted = b.evicted,
                refused = b.refused,
                "bridge connections refused or closed before hello (too many; logged once per {}s)",
                LOG_EVERY.as_secs()
            );
            *b = Burst {
                last: Some(now),
                ..Burst::default()
            };
        }
    }
}

impl Slot {
    /// Admits the connection (it leaves the pre-hello bound) as a bridge under the bridge cap,
    /// or, when `relay_only` names its identity, into that identity's relay-only places
    /// (closing its oldest when they are full): false if it was evicted, or if the bridge cap is
    /// full (counted and logged); either way it then closes.
    pub fn admit(&mut self, relay_only: Option<&str>) -> bool {
        if !matches!(self.place, Place::Waiting) {
            return true;
        }
        // Already evicted (a newer connection took the room): closing anyway.
        if self.gate.waiting.lock().conns.remove(&self.id).is_none() {
            return false;
        }
        if let Some(identity) = relay_only {
            let oldest = {
                let mut held = self.gate.relay_only.lock();
                let mine: Vec<u64> = held
                    .iter()
                    .filter(|(_, (who, _))| who == identity)
                    .map(|(id, _)| *id)
                    .collect();
                // Ids grow with arrival, so the first is this identity's oldest.
                let oldest = (mine.len() >= MAX_RELAY_ONLY)
                    .then(|| held.remove(&mine[0]))
                    .flatten()
                    .map(|(_, t)| t);
                held.insert(self.id, (identity.to_string(), self.evicted.clone()));
                oldest
            };
            if let Some(t) = oldest {
                t.cancel();
                self.gate.relay_only_evicted.increment(1);
            }
            self.place = Place::RelayOnly;
            return true;
        }
        match self.gate.bridges.clone().try_acquire_owned() {
            Ok(p) => {
                self.place = Place::Bridge { _permit: p };
                true
            }
            Err(_) => {
                self.gate.refused.increment(1);
                self.gate.note(false);
                false
            }
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        match self.place {
            Place::Waiting => {
                self.gate.waiting.lock().conns.remove(&self.id);
            }
            Place::RelayOnly => {
                self.gate.relay_only.lock().remove(&self.id);
            }
            Place::Bridge { .. } => {}
        }
    }
}
