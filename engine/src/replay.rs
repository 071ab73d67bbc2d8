//! `gabp-relay replay`: serve a recorded session as a GABP mod, behind the relay's one bridge
//! front.
//!
//! The recording is a backend like the live mod (`crate::upstream::Recorded`), so bridges of
//! a replay get everything bridges of `serve` get: token checks and failed-hello throttling,
//! strict parsing, pre-hello limits, caps, outboxes, the write deadline, metrics and
//! `relay/status`. Bridges get the recorded welcome, then, from their first `events/subscribe`,
//! the recorded events of the channels they subscribe to on the recorded timeline (scaled by
//! `--speed`, or as fast as the socket takes them: the replay's policy is `block`, lossless per
//! bridge, and a slow bridge slows only its own timeline). Requests are answered with the
//! recorded response to the same request under the replay's [`MatchRule`] (by default the same
//! method and params), in recorded order (the last one repeats once they run out); a request
//! never seen gets an error. The agent's calls can be kept for the call check
//! ([`Recording::match_calls`], [`Recording::calls`]). Two replays at `--speed max` deliver
//! identical event streams.
//!
//! Bridges may control playback for all of them at once with `relay/replay` (pause, resume,
//! seek, step, speed: `crate::upstream::playback`); `--paused` starts the replay held, so a
//! harness can attach every agent first.
//!
//! Nothing is loaded up front: opening a recording reads its catalog entry, its channel index
//! (to count events) and, with `--from` or `--to`, a few chunks (to find where to start); the
//! replay then listens at once and streams. A replay records nothing.

use std::sync::Arc;
use std::time::Duration;

use gabp_rt::net::Listener;
use gabp_storage::{SessionMeta, Store, StoreError};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::{OnSlow, RouteConfig, Upstream};
use crate::route::Route;
pub use crate::upstream::Speed;
pub use crate::upstream::{AgentCall, BridgeCalls, CallsMade};
use crate::upstream::{AgentCalls, Recorded, ReplayPlan};
use gabp_proto::matching::MatchRule;

/// How long a stopping replay waits for its bridges to finish.
const SHUTDOWN: Duration = Duration::from_secs(5);
/// Frames read before the one bisection finds for `--from`: receive times of concurrent
/// writers interleave slightly, so events just at the offset are not missed.
const FROM_SLACK: u64 = crate::upstream::playback::TIME_SLACK;

/// Replay settings.
#[derive(Debug, Clone)]
pub struct ReplayOptions {
    /// Token bridges must present.
    pub token: String,
    /// Pace.
    pub speed: Speed,
    /// Start over when the events run out.
    pub looping: bool,
    /// Only these channels (all when empty).
    pub channels: Vec<String>,
    /// Skip events before this offset from the session start.
    pub from: Option<Duration>,
    /// Play no event from this offset from the session start on.
    pub to: Option<Duration>,
    /// Play nothing before this frame (a mark's or an episode's, found by the caller: the
    /// engine knows no episode rule); overrides `from`.
    pub first_frame: Option<u64>,
    /// Play nothing from this frame on.
    pub end_frame: Option<u64>,
    /// Start paused: nothing plays until a bridge sends `relay/replay {"action": "resume"}`.
    pub paused: bool,
}

impl ReplayOptions {
    /// Options for the whole session at `speed`, once, with bridges presenting `token`.
    pub fn new(token: impl Into<String>, speed: Speed) -> ReplayOptions {
        ReplayOptions {
            token: token.into(),
            speed,
            looping: false,
            channels: Vec::new(),
            from: None,
            to: None,
            first_frame: None,
            end_frame: None,
            paused: false,
        }
    }
}

/// Why a replay stopped serving.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ReplayError(String);

/// A recorded session opened for replay: its catalog entry and where to start, not its frames.
#[derive(Debug)]
pub struct Recording {
    /// The session's catalog entry.
    pub meta: SessionMeta,
    plan: ReplayPlan,
}

impl Recording {
    /// Opens `meta`'s session in `store` for replay with `opts` (reads its index, not its
    /// frames).
    pub fn open(
        store: Store,
        meta: SessionMeta,
        opts: &ReplayOptions,
    ) -> Result<Recording, StoreError> {
        let names: Vec<Arc<str>> = meta
            .channels
            .iter()
            .map(|c| Arc::from(c.as_str()))
            .collect();
        let channels: Option<Vec<u32>> = (!opts.channels.is_empty()).then(|| {
            (0..names.len() as u32)
                .filter(|&i| opts.channels.iter().any(|c| **c == *names[i as usize]))
                .collect()
        });
        let started = meta.started_ns;
        let nanos = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        let offset = |frame: u64| -> Result<Option<u64>, StoreError> {
            Ok(store
                .frame_at(meta.id, frame)?
                .map(|r| r.time_ns.saturating_sub(started)))
        };
        let length = meta
            .last_ns
            .max(meta.ended_ns.unwrap_or(0))
            .saturating_sub(started);
        // Where the range starts: a frame (a mark's), or an offset read from a little before
        // the frame it bisects to.
        let (start_frame, first_frame, from_ns, start_ns, count_from) = match opts.first_frame {
            Some(f) => (f, f, 0, offset(f)?.unwrap_or(length), f),
            None => {
                let from_ns = opts.from.map_or(0, nanos);
                let at = if from_ns > 0 {
                    store.frame_at_time(meta.id, started.saturating_add(from_ns))?
                } else {
                    0
                };
                (at.saturating_sub(FROM_SLACK), 0, from_ns, from_ns, at)
            }
        };
        let to_ns = opts.to.map(nanos);
        let end_ns = match (opts.end_frame, to_ns) {
            (Some(e), _) => offset(e.saturating_sub(1))?.unwrap_or(length),
            (None, Some(t)) => t.min(length),
            (None, None) => length,
        };
        let count_to = match (opts.end_frame, to_ns) {
            (Some(e), _) => Some(e),
            (None, Some(t)) => Some(store.frame_at_time(meta.id, started.saturating_add(t))?),
            (None, None) => None,
        };
        let plays = |c: u32| channels.as_ref().is_none_or(|w| w.contains(&c));
        // The catalog counts exactly the frames the index holds (the recorder indexes every
        // event it records, and records nothing else on a channel), so a whole-session replay
        // needs no index scan: opening costs the same for any session length.
        let events = if channels.is_none() && count_from == 0 && count_to.is_none() {
            meta.events
        } else {
            let after_end = match count_to {
                Some(e) => store.count_events(meta.id, e, plays)?,
                None => 0,
            };
            store
                .count_events(meta.id, count_from, plays)?
                .saturating_sub(after_end)
        };
        let plan = ReplayPlan {
            store: Arc::new(store),
            meta: meta.clone(),
            names,
            channels,
            start_frame,
            first_frame,
            from_ns,
            start_ns,
            end_frame: opts.end_frame,
            to_ns,
            end_ns: end_ns.max(start_ns),
            speed: opts.speed,
            looping: opts.looping,
            paused: opts.paused,
            events,
            matching: MatchRule::Exact,
            calls: Arc::new(AgentCalls::new(false)),
        };
        Ok(Recording { meta, plan })
    }

    /// Waits (at most `bound`) until nothing but this recording holds its store: every reader
    /// of the replay has stopped. A process that exits while a thread still uses RocksDB can
    /// abort in RocksDB's static destructors (`pthread lock: Invalid argument`).
    pub async fn readers_stopped(&self, bound: Duration) -> bool {
        let until = tokio::time::Instant::now() + bound;
        while Arc::strong_count(&self.plan.store) > 1 {
            if tokio::time::Instant::now() >= until {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        true
    }

    /// Recorded events one pass replays (after `--from`, `--to` and `--channel`).
    pub fn event_count(&self) -> usize {
        self.plan.events as usize
    }

    /// Where the replayed range starts and ends, as offsets from the session's start.
    pub fn range(&self) -> (Duration, Duration) {
        (
            Duration::from_nanos(self.plan.start_ns),
            Duration::from_nanos(self.plan.end_ns),
        )
    }
}

/// Serves `rec` on `listener` until cancelled. Fails (with one line) if the recording turns
/// out unreadable while it is served.
pub async fn serve(
    listener: Listener,
    rec: Arc<Recording>,
    opts: ReplayOptions,
    cancel: CancellationToken,
) -> Result<(), ReplayError> {
    serve_with(listener, rec, opts, cancel, |_| {}).await
}

/// [`serve`], with the front's settings (limits, deadlines) adjusted by `tweak`.
pub async fn serve_with(
    listener: Listener,
    rec: Arc<Recording>,
    opts: ReplayOptions,
    cancel: CancellationToken,
    tweak: impl FnOnce(&mut RouteConfig),
) -> Result<(), ReplayError> {
    let listen = listener
        .local_addr()
        .map_err(|e| ReplayError(format!("cannot listen: {e}")))?;
    // The route's upstream address is not used: the recording stands behind this front.
    let mut cfg = RouteConfig::new(
        &rec.meta.route,
        Upstream::Addr(listen.clone()),
        listen,
        opts.token.clone(),
    );
    cfg.record = false;
    cfg.subscribe_all = false;
    // Lossless per bridge: a full outbox holds that bridge's timeline, nothing else.
    cfg.on_slow = OnSlow::Block;
    tweak(&mut cfg);
    let backend = Arc::new(Recorded::new(rec.plan.clone()));
    let route = Route::new(cfg, None, cancel.child_token(), backend.clone());
    let tracker = TaskTracker::new();
    crate::server::serve_route(&route, listener, &tracker);
    let result = tokio::select! {
        _ = cancel.cancelled() => Ok(()),
        why = backend.failure() => Err(ReplayError(why)),
    };
    route.cancel.cancel();
    tracker.close();
    if tokio::time::timeout(SHUTDOWN, tracker.wait())
        .await
        .is_err()
    {
        tracing::warn!("replay bridges did not finish within {SHUTDOWN:?}");
    }
    result
}

/// What the call check (`replay --expect-calls`) needs of a recording.
impl Recording {
    /// Matches requests to recorded answers under `rule` (`--match`; exact by default), and
    /// keeps the agent's calls for the call check when `keep` (`--expect-calls`). Before
    /// serving.
    pub fn match_calls(&mut self, rule: MatchRule, keep: bool) {
        self.plan.matching = rule;
        self.plan.calls = Arc::new(AgentCalls::new(keep));
    }

    /// The agent's calls and the counts of requests answered and unmatched, while and after
    /// the recording is served.
    pub fn calls(&self) -> &Arc<AgentCalls> {
        &self.plan.calls
    }

    /// The data dir the recording is read from (to read the recorded calls once served).
    pub fn store(&self) -> &Store {
        &self.plan.store
    }
}
