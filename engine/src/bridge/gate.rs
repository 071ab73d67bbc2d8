//! Who may hold a connection: the route's bridge cap counts only welcomed bridges, and
//! connections that have not said hello yet have a bound of their own.
//!
//! The bridge cap is shared fairly between identities: when `max_bridges` are welcomed, a hello
//! takes the place of the newest bridge of the identity holding the most (never the bridge
//! holding the route's lease: the next newest), if that identity
//! would still hold at least as many as the hello's identity afterwards (it holds at least two
//! more); otherwise the hello is refused. So one identity filling the route never keeps another
//! out, each identity keeps about its share once the route is full, and the exchange never
//! reverses (no two identities take places from each other in turn). With one identity (the
//! route's single token) nothing is ever taken: a hello at a full route is refused. A bridge
//! whose place is taken is closed at once, like a connection evicted before hello; its place
//! passes to the newcomer before its state is freed, so for a moment the route holds one bridge
//! state more than the cap per such exchange.
//!
//! Relay-only bridges
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
use tokio_util::sync::CancellationToken;

/// Connections that may wait for their hello at once (per route).
pub const MAX_PREHELLO_CONNS: usize = 128;
/// Relay-only bridges (`relay.withoutMod`) welcomed at once per identity, beside the bridge cap;
/// that identity's oldest is closed to make room for a new one.
pub const MAX_RELAY_ONLY: usize = 4;
/// At most one log line per this long about refusals and evictions.
const LOG_EVERY: Duration = Duration::from_secs(10);

/// One identity's welcomed bridges: slot id (arrival order) to the bridge's conn and the token
/// that closes it.
type Places = BTreeMap<u64, (u32, CancellationToken)>;

/// A route's admission state, shared by its accept loop and its connections.
#[derive(Debug)]
pub struct Gate {
    route: String,
    max_bridges: usize,
    /// Welcomed bridges (relay-only ones apart) by identity name, each identity's oldest
    /// first: at most `max_bridges` in all.
    bridges: Mutex<BTreeMap<String, Places>>,
    /// Welcomed relay-only connections, oldest first, with their identity's name (configured
    /// identities are few, so this is bounded by [`MAX_RELAY_ONLY`] per identity).
    relay_only: Mutex<BTreeMap<u64, (String, CancellationToken)>>,
    waiting: Mutex<Waiting>,
    evicted: Counter,
    relay_only_evicted: Counter,
    refused: Counter,
    /// Welcomed bridges closed to give their place to another identity's.
    shared: Counter,
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
    /// Welcomed as a bridge, under the cap, as this identity's (its place in `bridges`,
    /// held until the slot is dropped or the place is given to another identity's bridge).
    Bridge { identity: String },
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
            bridges: Mutex::new(BTreeMap::new()),
            relay_only: Mutex::new(BTreeMap::new()),
            waiting: Mutex::new(Waiting::default()),
            evicted: metrics::counter!("gabp_bridge_refusals_total", "route" => label.clone(), "reason" => "evicted_before_hello"),
            relay_only_evicted: metrics::counter!("gabp_bridge_refusals_total", "route" => label.clone(), "reason" => "relay_only_evicted"),
            refused: metrics::counter!("gabp_bridge_refusals_total", "route" => label.clone(), "reason" => "too_many_bridges"),
            shared: metrics::counter!("gabp_bridge_refusals_total", "route" => label, "reason" => "evicted_for_share"),
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
    /// Admits the connection of `identity` (it leaves the pre-hello bound) as a bridge under
    /// the bridge cap (taking the place of another identity's bridge when the cap is full and
    /// that identity holds at least two more), or, if `relay_only`, into that identity's
    /// relay-only places (closing its oldest when they are full): false if it was evicted, or
    /// if the bridge cap is full (counted and logged); either way it then closes.
    pub fn admit(
        &mut self,
        identity: &str,
        relay_only: bool,
        conn: u32,
        lease_holder: Option<u32>,
    ) -> bool {
        if !matches!(self.place, Place::Waiting) {
            return true;
        }
        // Already evicted (a newer connection took the room): closing anyway.
        if self.gate.waiting.lock().conns.remove(&self.id).is_none() {
            return false;
        }
        if relay_only {
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
        let taken = {
            let mut held = self.gate.bridges.lock();
            let taken = if held.values().map(BTreeMap::len).sum::<usize>() >= self.gate.max_bridges
            {
                match take_share(&mut held, identity, lease_holder) {
                    Some(taken) => Some(taken),
                    None => {
                        drop(held);
                        self.gate.refused.increment(1);
                        self.gate.note(false);
                        return false;
                    }
                }
            } else {
                None
            };
            held.entry(identity.to_string())
                .or_default()
                .insert(self.id, (conn, self.evicted.clone()));
            taken
        };
        if let Some((from, t)) = taken {
            t.cancel();
            self.gate.shared.increment(1);
            static LOG: gabp_rt::log_budget::LogBudget = gabp_rt::log_budget::LogBudget::new(5);
            if let Some(earlier_unlogged) = LOG.admit() {
                tracing::warn!(route = %self.gate.route, max_bridges = self.gate.max_bridges, bridge = %from, newcomer = %identity, earlier_unlogged, "bridge closed to give its place to another identity's: the route is full and its identity held the most (counted in gabp_bridge_refusals_total; at most 5 per 10 s logged)");
            }
        }
        self.place = Place::Bridge {
            identity: identity.to_string(),
        };
        true
    }
}

/// At a full route, takes for `identity` the place of the newest bridge of the identity
/// holding the most, if that one holds at least two more than `identity` (so it still holds at
/// least as many afterwards): that identity's name and the bridge's eviction token. The bridge
/// holding the route's lease (`lease_holder`) is never the one taken: the next newest is.
fn take_share(
    held: &mut BTreeMap<String, Places>,
    identity: &str,
    lease_holder: Option<u32>,
) -> Option<(String, CancellationToken)> {
    let mine = held.get(identity).map_or(0, BTreeMap::len);
    let (top, bridges) = held.iter_mut().max_by_key(|(_, b)| b.len())?;
    if bridges.len() < mine + 2 {
        return None;
    }
    let id = *bridges
        .iter()
        .rev()
        .find(|(_, (conn, _))| Some(*conn) != lease_holder)?
        .0;
    let (_, token) = bridges.remove(&id)?;
    let top = top.clone();
    if bridges.is_empty() {
        held.remove(&top);
    }
    Some((top, token))
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
            Place::Bridge { ref identity } => {
                // Gone already if its place was given to another identity's bridge.
                let mut held = self.gate.bridges.lock();
                if let Some(mine) = held.get_mut(identity) {
                    mine.remove(&self.id);
                    if mine.is_empty() {
                        held.remove(identity);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A welcomed bridge of `identity`, or `None` if refused.
    fn welcome(gate: &Arc<Gate>, identity: &str) -> Option<Slot> {
        let mut slot = gate.arrive();
        slot.admit(identity, false, 0, None).then_some(slot)
    }

    #[test]
    fn one_identity_alone_is_refused_at_a_full_route() {
        let gate = Gate::new("r", 3);
        let held: Vec<Slot> = (0..3).map(|_| welcome(&gate, "a").expect("room")).collect();
        assert!(welcome(&gate, "a").is_none(), "as ever: the cap is full");
        assert!(held.iter().all(|s| !s.evicted.is_cancelled()));
        drop(held);
        assert!(welcome(&gate, "a").is_some(), "places come back");
    }

    #[test]
    fn the_lease_holder_keeps_its_place_when_its_identity_gives_one() {
        let gate = Gate::new("r", 3);
        let a: Vec<Slot> = (0..3u32)
            .map(|conn| {
                let mut slot = gate.arrive();
                assert!(slot.admit("a", false, conn, None));
                slot
            })
            .collect();
        // Conn 2, a's newest, holds the lease: conn 1 gives its place instead.
        let mut b = gate.arrive();
        assert!(b.admit("b", false, 3, Some(2)));
        assert!(!a[2].evicted.is_cancelled(), "the lease holder stays");
        assert!(a[1].evicted.is_cancelled());
        assert!(!a[0].evicted.is_cancelled());
    }

    #[test]
    fn a_full_route_gives_another_identity_the_newest_place_of_the_one_holding_the_most() {
        let gate = Gate::new("r", 4);
        let a: Vec<Slot> = (0..4).map(|_| welcome(&gate, "a").expect("room")).collect();
        let b1 = welcome(&gate, "b").expect("a holds 4, b none");
        assert!(a[3].evicted.is_cancelled(), "a's newest gives up its place");
        assert!(a[..3].iter().all(|s| !s.evicted.is_cancelled()));
        let b2 = welcome(&gate, "b").expect("a holds 3, b 1");
        assert!(a[2].evicted.is_cancelled());
        // Two each: neither takes from the other.
        assert!(welcome(&gate, "b").is_none());
        assert!(welcome(&gate, "a").is_none());
        // A third identity takes one from an identity holding two; then 2, 1, 1: no more.
        let _c = welcome(&gate, "c").expect("a and b hold two more than c");
        let lost = [&a[0], &a[1], &b1, &b2]
            .iter()
            .filter(|s| s.evicted.is_cancelled())
            .count();
        assert_eq!(lost, 1);
        assert!(welcome(&gate, "c").is_none());
        let _d = welcome(&gate, "d").expect("the one holding two gives one");
        assert!(
            welcome(&gate, "e").is_none(),
            "1, 1, 1, 1: no one holds two more"
        );
    }

    #[test]
    fn relay_only_bridges_take_no_place_under_the_cap() {
        let gate = Gate::new("r", 1);
        let _a = welcome(&gate, "a").expect("room");
        let mut looking = gate.arrive();
        assert!(
            looking.admit("b", true, 0, None),
            "relay-only places are apart"
        );
        assert!(!_a.evicted.is_cancelled());
    }
}
