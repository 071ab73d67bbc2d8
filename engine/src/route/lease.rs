//! The controller lease: `relay/lease` gives one `control` bridge at a time the right to call
//! the tools its route marks `leased`.
//!
//! `relay/lease {action: "acquire"|"renew"|"release", ttlMs?}` (ttlMs from 1 to the route's
//! `lease_max_ttl`, 300,000 unless set, at most 3,600,000; default 30,000). Only a `control`
//! identity that may call at least one leased tool may acquire or renew it (checked by the
//! bridge front). Acquire succeeds when the lease is free, expired or already this bridge's
//! (then it is a renew); renew and release only for the holder. The lease ends when its
//! holder releases it, disconnects, or lets it expire. Every change is recorded (as a
//! relay-to-bridge event frame of the bridge that caused it) and sent as an event on the
//! `relay/lease` channel, `{change, holder, conn, untilNs, tNs}` with `change` one of
//! `acquired`, `renewed`, `released`, `expired`, `holder-left`, to every bridge that subscribes
//! to anything (like `relay/session`). The notice states the lease's current state, so a bridge
//! that has not taken the last one yet gets only the newest ([`crate::outbox::Outbox::set_latest`]):
//! its seq then jumps by the changes it did not need.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gabp_proto::{frame_bytes, message, ErrorCode};
use gabp_rt::clock::now_ns;
use gabp_storage::Direction;
use parking_lot::Mutex;
use serde_json::{json, Value};

use super::{BridgeState, Route};

/// The channel lease changes are sent on.
pub const CHANNEL: &str = "relay/lease";
/// A lease's time to live when the request gives none.
pub const DEFAULT_TTL: Duration = Duration::from_secs(30);
pub use crate::identity::{DEFAULT_MAX_TTL, MAX_TTL_MS};

#[derive(Debug, Clone)]
struct Holder {
    conn: u32,
    name: String,
    until: Instant,
    until_ns: u64,
}

impl Holder {
    /// "planner (conn 3) until 2026-11-30T19:50:01.234Z".
    fn describe(&self) -> String {
        format!(
            "{} (conn {}) until {}",
            self.name,
            self.conn,
            time(self.until_ns)
        )
    }
}

/// An instant as RFC 3339 UTC to the millisecond.
fn time(ns: u64) -> String {
    jiff::Timestamp::from_millisecond((ns / 1_000_000) as i64)
        .map(|t| t.to_string())
        .unwrap_or_else(|_| format!("{ns} ns"))
}

#[derive(Debug, Default)]
struct State {
    holder: Option<Holder>,
    /// Bumped at every change.
    generation: u64,
    /// Whether the route's one expiry timer is running: a renewal moves the holder's expiry
    /// and leaves the timer to find it, so a flood of renewals costs no task each.
    timer: bool,
}

/// A route's lease.
#[derive(Debug, Default)]
pub struct Lease {
    state: Mutex<State>,
    /// Wakes the expiry timer when the holder's expiry moved.
    moved: Arc<tokio::sync::Notify>,
    /// Seq of the `relay/lease` channel.
    seq: AtomicU64,
}

/// A refusal: the error code, its message, and data for the error.
pub type Refusal = (ErrorCode, String, Option<Value>);

impl Lease {
    /// Whether bridge `conn` holds the lease now; otherwise the refusal for calling `tool`.
    pub fn check(&self, conn: u32, tool: &str) -> Result<(), Refusal> {
        let state = self.state.lock();
        match &state.holder {
            Some(h) if h.until > Instant::now() && h.conn == conn => Ok(()),
            Some(h) if h.until > Instant::now() => Err((
                ErrorCode::LeaseHeld,
                format!("tool {tool:?} is leased: held by {}", h.describe()),
                Some(json!({"holder": h.name, "conn": h.conn, "untilNs": h.until_ns})),
            )),
            _ => Err((
                ErrorCode::LeaseHeld,
                format!("tool {tool:?} is leased: acquire the lease with relay/lease first"),
                Some(json!({"holder": null})),
            )),
        }
    }

    /// The bridge holding the lease now, if any.
    pub fn holder_conn(&self) -> Option<u32> {
        let state = self.state.lock();
        state
            .holder
            .as_ref()
            .filter(|h| h.until > Instant::now())
            .map(|h| h.conn)
    }

    /// The refusal a `relay/lease` request of bridge `conn` with `params` gets as things stand,
    /// if any: bad params, or the lease held by another bridge (or by nobody, for `renew` and
    /// `release`). Known before the request is recorded, so a bridge that keeps asking is
    /// answered within the session's refusal budget like any refused request; [`Lease::request`]
    /// decides again under the lock.
    pub fn refusal(&self, conn: u32, params: &Value, max_ttl: Duration) -> Option<Refusal> {
        if let Err(bad) = ttl_of(params, max_ttl) {
            return Some(bad);
        }
        let state = self.state.lock();
        let holder = state.holder.as_ref().filter(|h| h.until > Instant::now());
        match (params["action"].as_str(), holder) {
            (Some("acquire" | "renew"), Some(h)) if h.conn != conn => Some(held(h, "the lease is")),
            (Some("renew"), None) => Some(not_held("the lease is not held: acquire it first")),
            (Some("release"), Some(h)) if h.conn != conn => {
                Some(held(h, "this bridge does not hold the lease; it is"))
            }
            (Some("release"), None) => Some(not_held("the lease is not held")),
            (Some("acquire" | "renew" | "release"), _) => None,
            _ => Some(no_action()),
        }
    }

    /// The lease as `relay/status` shows it.
    pub fn status(&self) -> Value {
        match &self.state.lock().holder {
            Some(h) if h.until > Instant::now() => {
                json!({"holder": h.name, "conn": h.conn, "untilNs": h.until_ns})
            }
            _ => Value::Null,
        }
    }

    /// Answers a `relay/lease` request of `bridge` (named `name`).
    pub async fn request(
        route: &Arc<Route>,
        bridge: &BridgeState,
        name: &str,
        params: &Value,
        max_ttl: Duration,
    ) -> Result<Value, Refusal> {
        let ttl = ttl_of(params, max_ttl)?;
        let lease = &route.lease;
        let now = Instant::now();
        let conn = bridge.conn;
        let mut events = Vec::new();
        let answer = {
            let mut st = lease.state.lock();
            // An expired holder is gone, whether or not its timer has fired yet.
            if let Some(h) = st.holder.clone().filter(|h| h.until <= now) {
                st.holder = None;
                st.generation += 1;
                events.push(("expired", h));
            }
            match params["action"].as_str() {
                Some(action @ ("acquire" | "renew")) => {
                    match &st.holder {
                        Some(h) if h.conn != conn => {
                            return Err(held(h, "the lease is"));
                        }
                        None if action == "renew" => {
                            return Err(not_held("the lease is not held: acquire it first"))
                        }
                        _ => {}
                    }
                    let change = if st.holder.is_some() {
                        "renewed"
                    } else {
                        "acquired"
                    };
                    let until_ns = now_ns() + ttl.as_nanos() as u64;
                    let h = Holder {
                        conn,
                        name: name.to_string(),
                        until: now + ttl,
                        until_ns,
                    };
                    st.holder = Some(h.clone());
                    st.generation += 1;
                    if std::mem::replace(&mut st.timer, true) {
                        lease.moved.notify_one();
                    } else {
                        expire_later(route);
                    }
                    events.push((change, h.clone()));
                    json!({"held": true, "holder": h.name, "conn": conn, "untilNs": until_ns, "ttlMs": ttl.as_millis() as u64})
                }
                Some("release") => match st.holder.take() {
                    Some(h) if h.conn == conn => {
                        st.generation += 1;
                        lease.moved.notify_one();
                        events.push(("released", h));
                        json!({"held": false})
                    }
                    other => {
                        st.holder = other;
                        return Err(match &st.holder {
                            Some(h) => held(h, "this bridge does not hold the lease; it is"),
                            None => not_held("the lease is not held"),
                        });
                    }
                },
                _ => return Err(no_action()),
            }
        };
        for (change, h) in events {
            lease.announce(route, change, &h, conn).await;
        }
        Ok(answer)
    }

    /// Ends the lease if bridge `conn` (which has just left) held it.
    pub async fn holder_left(route: &Arc<Route>, conn: u32) {
        Lease::end_held_by(route, conn, "holder-left").await
    }

    /// Ends the lease if bridge `conn` held it and a reload made it an `observe` bridge, which
    /// may not hold, renew or release one.
    pub async fn holder_demoted(route: &Arc<Route>, conn: u32) {
        Lease::end_held_by(route, conn, "holder-demoted").await
    }

    /// Ends the lease if `conn` holds it, announcing `change` (or `expired` if it had).
    async fn end_held_by(route: &Arc<Route>, conn: u32, change: &str) {
        let gone = {
            let mut st = route.lease.state.lock();
            match st.holder.take() {
                Some(h) if h.conn == conn => {
                    st.generation += 1;
                    route.lease.moved.notify_one();
                    Some(h)
                }
                other => {
                    st.holder = other;
                    None
                }
            }
        };
        if let Some(h) = gone {
            let change = if h.until <= Instant::now() {
                "expired"
            } else {
                change
            };
            route.lease.announce(route, change, &h, conn).await;
        }
    }

    /// Sends a change to every subscribing bridge (in order with their events) and records it.
    async fn announce(&self, route: &Route, change: &str, h: &Holder, conn: u32) {
        let payload = json!({
            "change": change,
            "holder": h.name,
            "conn": h.conn,
            "untilNs": (change == "acquired" || change == "renewed").then_some(h.until_ns),
            "tNs": now_ns(),
        });
        let body = {
            // Seq taken and pushed under the bridges' lock: every bridge sees one order.
            let bridges = route.bridges.lock();
            let seq = self.seq.fetch_add(1, Ordering::Relaxed);
            let body = message::event(CHANNEL, seq, payload);
            let frame = Arc::new(crate::outbox::EventFrame {
                channel: Arc::from(CHANNEL),
                seq,
                wire: frame_bytes(&body),
                keep: true,
            });
            for b in bridges.values() {
                if !b.subs.lock().is_empty() {
                    b.outbox.set_latest(frame.clone());
                }
            }
            body
        };
        static LOG: gabp_rt::log_budget::LogBudget = gabp_rt::log_budget::LogBudget::new(20);
        if let Some(earlier_unlogged) = LOG.admit() {
            tracing::info!(route = %route.cfg.name, bridge = %h.name, conn = h.conn, earlier_unlogged, "lease {change}");
        }
        route
            .record_current(Direction::RelayToBridge, conn, body, true)
            .await;
    }
}

/// The time to live `params` ask for: `ttlMs` from 1 to `max_ttl`, [`DEFAULT_TTL`] (at most
/// `max_ttl`) when absent.
fn ttl_of(params: &Value, max_ttl: Duration) -> Result<Duration, Refusal> {
    let most = max_ttl.as_millis() as u64;
    match &params["ttlMs"] {
        Value::Null => Ok(DEFAULT_TTL.min(max_ttl)),
        v => match v.as_u64() {
            Some(ms) if (1..=most).contains(&ms) => Ok(Duration::from_millis(ms)),
            _ => Err((
                ErrorCode::InvalidParams,
                format!(
                    "ttlMs must be a whole number from 1 to {most} (this route's lease_max_ttl)"
                ),
                None,
            )),
        },
    }
}

fn no_action() -> Refusal {
    (
        ErrorCode::InvalidParams,
        "relay/lease needs action: acquire, renew or release".into(),
        None,
    )
}

fn not_held(why: &str) -> Refusal {
    (
        ErrorCode::LeaseHeld,
        why.into(),
        Some(json!({"holder": null})),
    )
}

fn held(h: &Holder, what: &str) -> Refusal {
    (
        ErrorCode::LeaseHeld,
        format!("{what} held by {}", h.describe()),
        Some(json!({"holder": h.name, "conn": h.conn, "untilNs": h.until_ns})),
    )
}

/// The route's expiry timer: sleeps until the holder's expiry and ends the lease then; a
/// change wakes it to look again, and it stops once nobody holds the lease. One task per
/// route, however often the lease changes.
fn expire_later(route: &Arc<Route>) {
    let route = Arc::downgrade(route);
    tokio::spawn(async move {
        loop {
            let Some(r) = route.upgrade() else {
                return;
            };
            // The holder's expiry while it holds, or the holder whose lease has ended.
            let next: Result<Instant, Option<Holder>> = {
                let mut st = r.lease.state.lock();
                match st.holder.as_ref().map(|h| h.until) {
                    Some(until) if until > Instant::now() => Ok(until),
                    Some(_) => {
                        st.generation += 1;
                        st.timer = false;
                        Err(st.holder.take())
                    }
                    None => {
                        st.timer = false;
                        Err(None)
                    }
                }
            };
            let until = match next {
                Ok(until) => until,
                Err(ended) => {
                    if let Some(h) = ended {
                        r.lease.announce(&r, "expired", &h, h.conn).await;
                    }
                    return;
                }
            };
            let moved = r.lease.moved.clone();
            // Holds no strong reference while it sleeps: a relay that stops is not kept.
            drop(r);
            tokio::select! {
                _ = tokio::time::sleep_until(until.into()) => {}
                _ = moved.notified() => {}
            }
        }
    });
}
