//! The recorded backend: a recorded session played back behind the bridge front
//! (`gabp-relay replay`).
//!
//! The session is published at once from the catalog (recorded welcome and channels); nothing
//! is loaded. Each bridge gets its own timeline from its first subscribe ([`super::player`]),
//! and its own answerer: requests are answered, in the order asked, with the recorded response
//! to the same request under `--match` (in recorded order; the last repeats once they run out),
//! or an error when the recording has none; the agent's calls are kept for `--expect-calls`
//! ([`super::calls`]). The answer index ([`super::answers`]) is built by one
//! streaming pass on a thread of its own while bridges are already served; requests asked before
//! it is ready wait for it (up to the request timeout), events do not. A recording that cannot be read ends the replay
//! ([`Recorded::failure`]). Nothing is recorded: the route has no recorder.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use futures::future::BoxFuture;
use futures::FutureExt;
use gabp_proto::matching::MatchRule;
use gabp_proto::{frame_bytes, message, ErrorCode, Mode, MsgType, Parser};
use gabp_storage::{Direction, SessionMeta, Store};
use parking_lot::Mutex;
use serde_json::{json, Value};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use super::answers::{answer_from, no_match, Answers};
use super::calls::AgentCalls;
use super::playback::Playback;
use super::player::{self, Shared};
use crate::config::RouteConfig;
use crate::route::{Backend, PlaybackRefusal as Refused, Refusal, Request};
use crate::route::{BridgeState, Route, SessionInfo};

/// Replay pace.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Speed {
    /// Recorded timeline times this factor (2.0 is twice as fast).
    Factor(f64),
    /// As fast as possible.
    Max,
}

/// The slowest pace a replay plays at: slower would stand still while saying it plays.
pub const MIN_SPEED: f64 = 0.001;
/// The fastest factor (beyond it, `max`).
pub const MAX_SPEED: f64 = 1e6;

impl std::str::FromStr for Speed {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s == "max" {
            return Ok(Speed::Max);
        }
        match s.trim_end_matches('x').parse::<f64>() {
            Ok(f) if (MIN_SPEED..=MAX_SPEED).contains(&f) => Ok(Speed::Factor(f)),
            _ => Err(format!(
                "invalid speed {s:?}: expected a factor from 0.001 to 1000000 like 1, 10 or 0.5, or max"
            )),
        }
    }
}

/// What to play and how (built by `replay` from its options).
#[derive(Debug, Clone)]
pub struct ReplayPlan {
    /// The data dir, open for reading.
    pub store: Arc<Store>,
    /// The session's catalog entry (with its welcome and channel names).
    pub meta: SessionMeta,
    /// Channel names by id, shared by every event frame of the replay.
    pub names: Vec<Arc<str>>,
    /// Channel ids played at all (`--channel`); every one when `None`.
    pub channels: Option<Vec<u32>>,
    /// The frame to start reading at (a little before `--from`).
    pub start_frame: u64,
    /// Events at frames before this are not played (`--from-mark`, `--episode`).
    pub first_frame: u64,
    /// `--from`, in ns from the session's start: earlier events are skipped.
    pub from_ns: u64,
    /// Where the replayed range starts on the session's timeline (ns from its start).
    pub start_ns: u64,
    /// Frames from this one on are not played (`--to-mark`, `--episode`).
    pub end_frame: Option<u64>,
    /// `--to`, in ns from the session's start: events from there on are not played.
    pub to_ns: Option<u64>,
    /// Where the replayed range ends (ns from the session's start).
    pub end_ns: u64,
    /// Pace.
    pub speed: Speed,
    /// Start over at the end.
    pub looping: bool,
    /// Start paused (`--paused`): nothing plays until a bridge resumes it.
    pub paused: bool,
    /// Events one pass plays (before subscriptions).
    pub events: u64,
    /// How a request finds its recorded answers (`--match`).
    pub matching: MatchRule,
    /// The agent's calls and the answers' counts (`--expect-calls`, the end summary).
    pub calls: Arc<AgentCalls>,
}

impl ReplayPlan {
    /// Whether events of channel `id` are played at all.
    pub fn plays(&self, id: u32) -> bool {
        self.channels.as_ref().is_none_or(|c| c.contains(&id))
    }
}

/// The answer index, while it is built.
#[derive(Debug, Clone)]
enum Index {
    Building,
    Ready(Arc<Answers>),
    Failed(String),
}

/// A bridge's request waiting for its answer.
#[derive(Debug)]
struct Ask {
    id: String,
    method: String,
    key: u128,
}

/// One bridge's state in the replay.
#[derive(Debug)]
struct Timeline {
    shared: Arc<Shared>,
    asks: mpsc::Sender<Ask>,
    answerer: JoinHandle<()>,
    player: Mutex<Option<JoinHandle<()>>>,
}

impl Drop for Timeline {
    fn drop(&mut self) {
        self.answerer.abort();
        if let Some(p) = self.player.lock().take() {
            p.abort();
        }
    }
}

/// A recorded session played back (see the module doc).
#[derive(Debug)]
pub struct Recorded {
    plan: Arc<ReplayPlan>,
    index: Arc<watch::Sender<Index>>,
    timelines: Mutex<HashMap<u32, Arc<Timeline>>>,
    /// Ends the index pass early at shutdown.
    stop: Arc<AtomicBool>,
    /// The playhead `relay/replay` moves.
    playback: Arc<Playback>,
}

impl Recorded {
    /// A backend playing `plan`.
    pub fn new(plan: ReplayPlan) -> Recorded {
        let plan = Arc::new(plan);
        let stop = Arc::new(AtomicBool::new(false));
        Recorded {
            playback: Arc::new(Playback::new(plan.clone(), stop.clone())),
            plan,
            index: Arc::new(watch::channel(Index::Building).0),
            timelines: Mutex::new(HashMap::new()),
            stop,
        }
    }

    /// Resolves with a one-line reason if the recording turns out unreadable (the replay
    /// must then end); pending forever otherwise.
    pub async fn failure(&self) -> String {
        let mut rx = self.index.subscribe();
        if let Ok(i) = rx.wait_for(|i| matches!(i, Index::Failed(_))).await {
            if let Index::Failed(why) = &*i {
                return why.clone();
            }
        }
        std::future::pending().await
    }

    /// `bridge`'s timeline, created (with its answerer) on first use.
    fn timeline(&self, route: &Route, bridge: &Arc<BridgeState>) -> Arc<Timeline> {
        self.timelines
            .lock()
            .entry(bridge.conn)
            .or_insert_with(|| {
                let (asks, rx) = mpsc::channel(route.cfg.max_pending.max(1));
                let answerer = tokio::spawn(answer(
                    self.plan.clone(),
                    self.index.subscribe(),
                    rx,
                    bridge.clone(),
                    route.cfg.request_timeout,
                ));
                Arc::new(Timeline {
                    shared: Arc::new(Shared {
                        subs: (0..self.plan.names.len())
                            .map(|_| AtomicBool::new(false))
                            .collect(),
                        resubscribed: Default::default(),
                        delivered: Default::default(),
                    }),
                    asks,
                    answerer,
                    player: Mutex::new(None),
                })
            })
            .clone()
    }

    /// Sets or clears `bridge`'s subscription bits for `chans` (names the recording never
    /// used have no events, so nothing to set).
    fn mark(&self, route: &Route, bridge: &Arc<BridgeState>, chans: &[String], on: bool) {
        let t = self.timeline(route, bridge);
        for c in chans {
            if let Some(id) = self.plan.names.iter().position(|n| **n == **c) {
                t.shared.subs[id].store(on, Ordering::Relaxed);
            }
        }
        if on {
            t.shared.resubscribed.notify_one();
        }
    }
}

/// The welcome result the mod wrote, as recorded: the mod's answer among the session's first
/// frames, recorded at the session's start with the relay's hello. `None` if it is not there.
fn recorded_welcome(plan: &ReplayPlan) -> Option<Bytes> {
    let mut parser = Parser::new();
    for item in plan.store.frames(plan.meta.id).take(4) {
        let (_, rec) = item.ok()?;
        if rec.dir != Direction::ModToRelay || rec.time_ns != plan.meta.started_ns {
            continue;
        }
        let view = parser.parse(&rec.body, Mode::Tolerant).ok()?;
        let span = view.result.filter(|_| view.kind == MsgType::Response)?;
        return Some(rec.body.slice(span));
    }
    None
}

impl Backend for Recorded {
    fn run(self: Arc<Self>, route: Arc<Route>) -> BoxFuture<'static, ()> {
        async move {
            let meta = &self.plan.meta;
            let welcome = meta.welcome.clone().unwrap_or_else(|| json!({}));
            // The welcome as the mod wrote it, from the recording; failing that (a recording
            // without it), the catalog's parsed copy as serde_json writes it.
            let plan = self.plan.clone();
            let recorded = tokio::task::spawn_blocking(move || recorded_welcome(&plan))
                .await
                .ok()
                .flatten();
            let welcome_result = recorded.unwrap_or_else(|| {
                Bytes::from(gabp_proto::message::to_ascii_json(&welcome))
            });
            route.session.send_replace(Some(Arc::new(SessionInfo::new(
                meta.id,
                welcome,
                welcome_result,
                meta.channels.clone(),
                meta.started_ns,
                None,
            ))));
            let (plan, index, stop) = (self.plan.clone(), self.index.clone(), self.stop.clone());
            let name = route.cfg.name.clone();
            let built = std::thread::Builder::new()
                .name("replay-index".into())
                .spawn(move || {
                    let t = std::time::Instant::now();
                    match Answers::build(&plan.store, plan.meta.id, &plan.matching, &stop) {
                        Ok(a) => {
                            tracing::info!(route = %name, answers = a.len(), secs = t.elapsed().as_secs_f64(), "recorded answers indexed");
                            index.send_replace(Index::Ready(Arc::new(a)));
                        }
                        Err(e) => {
                            index.send_replace(Index::Failed(e.to_string()));
                        }
                    }
                });
            if let Err(e) = built {
                self.index
                    .send_replace(Index::Failed(format!("cannot start the replay: {e}")));
            }
            route.cancel.cancelled().await;
            // The session is over: bridges waiting at shutdown for it to end close now.
            route.session.send_replace(None);
            self.stop.store(true, Ordering::Relaxed);
            self.timelines.lock().clear();
        }
        .boxed()
    }

    fn describe(&self, _cfg: &RouteConfig) -> String {
        format!("recording {}", self.plan.meta.id)
    }

    fn welcome_extensions(&self) -> Vec<(&'static str, Value)> {
        vec![(
            "replay",
            json!({
                "sessionId": self.plan.meta.id.to_string(),
                "route": self.plan.meta.route,
                "notices": player::NOTICE_CHANNEL,
                "control": super::playback::METHOD,
                "paused": self.plan.paused,
            }),
        )]
    }

    fn relay_methods(&self) -> &'static [&'static str] {
        &[super::playback::METHOD]
    }

    fn subscribe<'a>(
        &'a self,
        route: &'a Route,
        bridge: &'a Arc<BridgeState>,
        chans: &'a [String],
    ) -> BoxFuture<'a, ()> {
        self.mark(route, bridge, chans, true);
        futures::future::ready(()).boxed()
    }

    fn subscribed(&self, route: &Arc<Route>, bridge: &Arc<BridgeState>) {
        let t = self.timeline(route, bridge);
        let mut player = t.player.lock();
        if player.is_none() {
            self.plan.calls.timeline_started(bridge.conn);
            *player = Some(tokio::spawn(player::play(
                route.clone(),
                bridge.clone(),
                self.plan.clone(),
                self.playback.clone(),
                t.shared.clone(),
            )));
        }
    }

    fn unsubscribe<'a>(
        &'a self,
        route: &'a Route,
        bridge: &'a Arc<BridgeState>,
        chans: &'a [String],
    ) -> BoxFuture<'a, ()> {
        self.mark(route, bridge, chans, false);
        futures::future::ready(()).boxed()
    }

    fn request<'a>(
        &'a self,
        route: &'a Route,
        req: Request<'a>,
    ) -> BoxFuture<'a, Result<(), Refusal>> {
        let params = req.params.clone().map(|p| &req.body[p]);
        let key = self.plan.matching.key(req.method, params);
        self.plan
            .calls
            .requested(req.bridge.conn, req.method, params);
        let t = self.timeline(route, req.bridge);
        let in_flight = &req.bridge.in_flight;
        let result = if in_flight.fetch_add(1, Ordering::AcqRel) >= route.cfg.max_pending {
            Err(())
        } else {
            t.asks
                .try_send(Ask {
                    id: req.id.to_string(),
                    method: req.method.to_string(),
                    key,
                })
                .map_err(|_| ())
        };
        let result = result.map_err(|()| {
            in_flight.fetch_sub(1, Ordering::AcqRel);
            Refusal::new(
                ErrorCode::LimitExceeded,
                "too many requests in flight for one bridge",
            )
        });
        futures::future::ready(result).boxed()
    }

    fn playback<'a>(
        &'a self,
        _route: &'a Route,
        _bridge: &'a Arc<BridgeState>,
        params: Value,
    ) -> BoxFuture<'a, Result<Value, Refused>> {
        async move { self.playback.control(&params).await }.boxed()
    }

    fn left<'a>(&'a self, route: &'a Route, bridge: &'a Arc<BridgeState>) -> BoxFuture<'a, ()> {
        if let Some(t) = self.timelines.lock().remove(&bridge.conn) {
            tracing::info!(route = %route.cfg.name, conn = bridge.conn, events = t.shared.delivered.load(Ordering::Relaxed), "bridge left the replay");
        }
        self.plan.calls.left(route, bridge);
        futures::future::ready(()).boxed()
    }
}

/// Answers one bridge's requests in the order asked (see the module doc).
async fn answer(
    plan: Arc<ReplayPlan>,
    mut index: watch::Receiver<Index>,
    mut asks: mpsc::Receiver<Ask>,
    bridge: Arc<BridgeState>,
    wait: std::time::Duration,
) {
    // Answers already given per request key: the next recorded one comes next.
    let mut given: HashMap<u128, usize> = HashMap::new();
    while let Some(ask) = asks.recv().await {
        // Bounded by the request timeout, as a live mod's answer would be.
        let ready =
            match tokio::time::timeout(wait, index.wait_for(|i| !matches!(i, Index::Building)))
                .await
            {
                Ok(Ok(i)) => i.clone(),
                Ok(Err(_)) => return,
                Err(_) => Index::Building,
            };
        let frame = match &ready {
            Index::Ready(a) => {
                let n = given.entry(ask.key).or_default();
                *n += 1;
                a.pick(ask.key, *n - 1)
            }
            _ => None,
        };
        if matches!(ready, Index::Ready(_)) {
            plan.calls.answered(frame.is_some());
        }
        let body = match frame {
            Some(frame) => {
                let (plan, id) = (plan.clone(), ask.id.clone());
                let read = tokio::task::spawn_blocking(move || {
                    answer_from(&plan.store, plan.meta.id, frame, &id)
                })
                .await;
                match read {
                    Ok(Ok(body)) => body,
                    _ => message::error_response(
                        Some(&ask.id),
                        ErrorCode::InternalError,
                        "the recorded answer cannot be read",
                        None,
                    ),
                }
            }
            None if matches!(ready, Index::Building) => message::error_response(
                Some(&ask.id),
                ErrorCode::OutcomeUnknown,
                "the recorded answers are still being indexed; try again later",
                Some(json!({"method": ask.method})),
            ),
            None => message::error_response(
                Some(&ask.id),
                ErrorCode::NoRecordedResponse,
                no_match(&plan.matching),
                Some(json!({"method": ask.method, "match": plan.matching.name()})),
            ),
        };
        bridge.outbox.push_control(frame_bytes(&body));
        bridge.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}
