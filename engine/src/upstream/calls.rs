//! What a replay learns of the agent under test: every bridge's calls as they arrive (method,
//! params, arrival time, and when that bridge's recorded timeline began), for
//! `replay --expect-calls`, and the counts of requests answered and left unmatched (-32004) for
//! the replay's end summary.
//!
//! Bounded: at most [`MAX_CALLS`] calls and [`MAX_CALL_BYTES`] of params are kept, the rest
//! counted. Kept only when asked for (`keep`); counted always. It keeps and says when the agent
//! is done (the last bridge left after at least one agent's bridge was welcomed); it compares
//! nothing: the call check is a reader's (`gabp-analysis`), which the engine does not link.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use gabp_proto::matching::{MAX_CALLS, MAX_CALL_BYTES};
use parking_lot::Mutex;
use tokio::sync::watch;

use crate::route::{BridgeState, Route};

/// One call an agent made, as it arrived.
#[derive(Debug, Clone)]
pub struct AgentCall {
    /// The method.
    pub method: String,
    /// The params as sent, if any.
    pub params: Option<Bytes>,
    /// When it arrived (ns since the Unix epoch).
    pub at_ns: u64,
}

/// One bridge's calls.
#[derive(Debug, Clone)]
pub struct BridgeCalls {
    /// Its connection number.
    pub conn: u32,
    /// When its recorded timeline began (its first `events/subscribe`; the replay's start for a
    /// bridge that never subscribed), ns since the Unix epoch: the moment that stands for the
    /// session's start.
    pub start_ns: u64,
    /// Its calls in arrival order.
    pub calls: Vec<AgentCall>,
}

/// Every bridge's calls, handed out at the end.
#[derive(Debug, Clone, Default)]
pub struct CallsMade {
    /// Bridges that made at least one call, by connection number.
    pub bridges: Vec<BridgeCalls>,
    /// Calls past the bounds: counted, not kept.
    pub not_kept: u64,
}

#[derive(Debug, Default)]
struct Kept {
    /// Timeline starts, by connection (also of bridges that have made no call yet).
    starts: BTreeMap<u32, u64>,
    calls: BTreeMap<u32, Vec<AgentCall>>,
    count: usize,
    bytes: usize,
    not_kept: u64,
    /// Agent bridges (welcomed, not relay-only) that have left.
    agents_left: u64,
}

/// The calls an agent made to a replay (see the module doc).
#[derive(Debug)]
pub struct AgentCalls {
    keep: bool,
    started_ns: u64,
    kept: Mutex<Kept>,
    requests: AtomicU64,
    answered: AtomicU64,
    unmatched: AtomicU64,
    done: watch::Sender<bool>,
}

impl Default for AgentCalls {
    fn default() -> AgentCalls {
        AgentCalls::new(false)
    }
}

impl AgentCalls {
    /// Counts requests; keeps the calls too when `keep`.
    pub fn new(keep: bool) -> AgentCalls {
        AgentCalls {
            keep,
            started_ns: gabp_rt::clock::now_ns(),
            kept: Mutex::new(Kept::default()),
            requests: AtomicU64::new(0),
            answered: AtomicU64::new(0),
            unmatched: AtomicU64::new(0),
            done: watch::channel(false).0,
        }
    }

    /// A bridge's request reached the replay.
    pub(crate) fn requested(&self, conn: u32, method: &str, params: Option<&[u8]>) {
        self.requests.fetch_add(1, Ordering::Relaxed);
        if !self.keep {
            return;
        }
        let at_ns = gabp_rt::clock::now_ns();
        let size = method.len() + params.map_or(0, <[u8]>::len);
        let mut k = self.kept.lock();
        if k.count >= MAX_CALLS || k.bytes + size > MAX_CALL_BYTES {
            k.not_kept += 1;
            return;
        }
        k.count += 1;
        k.bytes += size;
        k.calls.entry(conn).or_default().push(AgentCall {
            method: method.to_string(),
            params: params.map(Bytes::copy_from_slice),
            at_ns,
        });
    }

    /// `conn`'s recorded timeline begins now (its first subscribe).
    pub(crate) fn timeline_started(&self, conn: u32) {
        if self.keep {
            let now = gabp_rt::clock::now_ns();
            self.kept.lock().starts.entry(conn).or_insert(now);
        }
    }

    /// A request got a recorded answer (`true`) or none matched it (-32004).
    pub(crate) fn answered(&self, matched: bool) {
        if matched {
            self.answered.fetch_add(1, Ordering::Relaxed);
        } else {
            self.unmatched.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// `bridge` has left `route` (already out of its registry): once an agent's bridge has
    /// left and no other bridge but relay-only ones (`gabp-relay status`) is connected, the
    /// agent is done.
    pub(crate) fn left(&self, route: &Route, bridge: &Arc<BridgeState>) {
        let agent = |b: &BridgeState| !b.relay_only.load(Ordering::Relaxed);
        let mut k = self.kept.lock();
        if agent(bridge) && bridge.info.lock().is_some() {
            k.agents_left += 1;
        }
        let others = route.bridges.lock().values().any(|b| agent(b));
        if k.agents_left > 0 && !others {
            self.done.send_replace(true);
        }
    }

    /// Resolves once the agent is done (see [`AgentCalls::left`]).
    pub async fn finished(&self) {
        let mut rx = self.done.subscribe();
        let _ = rx.wait_for(|d| *d).await;
    }

    /// Requests the replay was asked, answered from the recording, and left unmatched (-32004).
    pub fn counts(&self) -> (u64, u64, u64) {
        (
            self.requests.load(Ordering::Relaxed),
            self.answered.load(Ordering::Relaxed),
            self.unmatched.load(Ordering::Relaxed),
        )
    }

    /// The calls kept so far, each bridge's in arrival order, bridges by connection number.
    pub fn made(&self) -> CallsMade {
        let k = self.kept.lock();
        CallsMade {
            bridges: k
                .calls
                .iter()
                .map(|(&conn, calls)| BridgeCalls {
                    conn,
                    start_ns: k.starts.get(&conn).copied().unwrap_or(self.started_ns),
                    calls: calls.clone(),
                })
                .collect(),
            not_kept: k.not_kept,
        }
    }
}
