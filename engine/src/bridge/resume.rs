//! Resuming after a drop: a bridge that reconnects names, in its `session/hello`, the session
//! and the last relay seq it saw per channel (`relay.resume = {session, channels: {name: seq}}`).
//! Within the same session it gets every event it missed on those channels, in order and with
//! the same relay seqs and bytes, then the live stream, with no gap and no duplicate; the resume
//! subscribes it to those channels (no `events/subscribe` needed). Another session (the mod
//! restarted) gets a `relay/session` notice of the current epoch and the live stream only,
//! never old events. Requests of the lost connection are not carried over: their answers are
//! lost with it (outcome unknown), and nothing is sent to the mod again.
//!
//! History comes from the route's window of recent events (`crate::window`), and beyond it from
//! the recording, read on a blocking thread and only as far as the recorder has committed (the
//! recorder is flushed when the read comes up short). What neither holds gets a `relay/dropped`
//! notice for exactly that range (`policy: "not-retained"`).
//!
//! The handoff: history is streamed into the bridge's own outbox in bounded batches as its
//! socket drains (never more than its outbox bounds), chasing the live stream; once what is
//! left is a short tail held in the window, [`Hub::join`](crate::hub::Hub::join) queues that
//! tail and subscribes the bridge under the hub's lock, so the next live event follows the last
//! one sent. The bridge's requests are read again once it has joined.

use std::sync::Arc;

use gabp_proto::{Mode, Parser};
use gabp_storage::{SessionId, Store};
use serde_json::{json, Map, Value};

use crate::hub::Join;
use crate::outbox::{EventFrame, Offer, Outbox};
use crate::route::{BridgeState, Route, SessionInfo};
use gabp_rt::log_budget::LogBudget;

/// Events a join may queue under the hub's lock (the rest is sent as history first).
const JOIN_TAIL: usize = 1024;
/// Events, and bytes, read from the recording per batch.
const READ_FRAMES: usize = 1024;
const READ_BYTES: usize = 1 << 20;
/// A bridge that resumes in a loop must not grow the log without bound.
static RESUMED: LogBudget = LogBudget::new(50);
/// Recorder flushes that bring no new history before the rest counts as not retained (each
/// waits for a commit; what the mod reader has sent is committed after one or two).
const MAX_FLUSHES: u32 = 20;
/// Longest channel name accepted in a resume (and echoed in its errors).
const MAX_NAME: usize = 256;

/// A parsed `relay.resume`.
#[derive(Debug)]
pub(super) struct Plan {
    /// (channel, next seq to send), in the order given.
    channels: Vec<(String, u64)>,
    kind: Kind,
}

#[derive(Debug)]
enum Kind {
    /// Same session: catch up from `next` on each channel, in hub epoch `epoch`.
    Resume { session: SessionId, epoch: u64 },
    /// Another session: a notice, then live events only.
    Fresh { named: String },
}

/// Reads `relay.resume` from hello params: `Ok(None)` without one; `Err` (one line for the
/// bridge, sent as an invalid-params error instead of the welcome) if it is malformed or names
/// seqs the session never sent.
/// `cap` is how many channels the bridge may subscribe to (its identity's bound, else the
/// route's): a resume subscribes to every channel it names.
pub(super) fn plan(
    route: &Route,
    params: &Value,
    session: Option<&Arc<SessionInfo>>,
    cap: usize,
) -> Result<Option<Plan>, String> {
    let r = &params["relay"]["resume"];
    if r.is_null() {
        return Ok(None);
    }
    let shape = "relay.resume must be {\"session\": \"<id>\", \"channels\": {\"<name>\": <last seq seen, or -1>}}";
    let Some(obj) = r.as_object().filter(|o| {
        o.len() == 2 && o["session"].is_string() && o.get("channels").is_some_and(Value::is_object)
    }) else {
        return Err(shape.into());
    };
    let named = obj["session"].as_str().unwrap_or_default();
    let named_id = uuid::Uuid::parse_str(named)
        .map_err(|_| "relay.resume: session is not a session id".to_string())?;
    let chans = obj["channels"].as_object().expect("checked above");
    if chans.len() > cap {
        return Err(format!(
            "relay.resume: too many channels (at most {cap}, as for subscriptions)"
        ));
    }
    let mut channels = Vec::with_capacity(chans.len());
    for (name, last) in chans {
        if name.is_empty() || name.len() > MAX_NAME {
            return Err(format!(
                "relay.resume: channel names must be 1 to {MAX_NAME} bytes"
            ));
        }
        let next = match last {
            Value::Null => 0,
            v if v.as_i64() == Some(-1) => 0,
            v => match v.as_u64().and_then(|n| n.checked_add(1)) {
                Some(n) => n,
                None => {
                    return Err(format!(
                    "relay.resume: channel {}: the last seq seen must be a whole number from -1 up",
                    shown(name)
                ))
                }
            },
        };
        channels.push((name.clone(), next));
    }
    let Some(s) = session.filter(|s| s.id == named_id) else {
        return Ok(Some(Plan {
            channels,
            kind: Kind::Fresh {
                named: named.to_string(),
            },
        }));
    };
    if s.upstream.is_none() {
        return Err("relay.resume is not available on a route that replays a recording".into());
    }
    // The epoch read between two looks at the current session is that session's: a new session
    // is published only after the hub starts its epoch, and only once the old one is gone.
    let mut epoch = None;
    for (name, next) in &channels {
        let (e, next_seq) = route.hub.next_seq(name);
        if epoch.is_some_and(|x| x != e) {
            return Err("the session changed during the resume; say hello again".into());
        }
        epoch = Some(e);
        if *next > next_seq {
            return Err(format!(
                "relay.resume: channel {}: seq {} was never sent in this session (the last is {})",
                shown(name),
                next - 1,
                next_seq as i64 - 1
            ));
        }
    }
    if route.current().map(|c| c.id) != Some(s.id) {
        return Err("the session changed during the resume; say hello again".into());
    }
    Ok(Some(Plan {
        channels,
        kind: Kind::Resume {
            session: s.id,
            epoch: epoch.unwrap_or_else(|| route.hub.epoch()),
        },
    }))
}

/// A channel name as an error shows it: quoted and cut short.
fn shown(name: &str) -> String {
    format!("{:?}", name.chars().take(64).collect::<String>())
}

/// The relay extension's `resume` field: the window's bounds, and whether this hello's resume
/// (if any) continues its session.
pub(super) fn extend_welcome(route: &Route, plan: Option<&Plan>, relay_ext: &mut Value) {
    let mut resume = Map::new();
    resume.insert(
        "window".into(),
        json!({"frames": route.cfg.resume_window_frames, "bytes": route.cfg.resume_window_bytes}),
    );
    if let Some(p) = plan {
        resume.insert(
            "resumed".into(),
            json!(matches!(p.kind, Kind::Resume { .. })),
        );
    }
    relay_ext["resume"] = Value::Object(resume);
}

/// Carries out a resume after the welcome is queued: history then live (same session), or the
/// new epoch's notice then live (another session).
pub(super) async fn run(route: &Arc<Route>, bridge: &Arc<BridgeState>, plan: Plan) {
    let names: Vec<String> = plan.channels.iter().map(|(c, _)| c.clone()).collect();
    bridge.subs.lock().extend(names.iter().cloned());
    match plan.kind {
        Kind::Fresh { named } => {
            let payload = match route.current() {
                Some(s) => {
                    json!({"state": "started", "sessionId": s.id.to_string(), "resumed": false, "previousSessionId": named,
                    "note": "relay.resume named a session other than the current one (it has ended, or never was this route's): its events are not replayed; this session's relay seqs are its own, counted from 0 at its start, and its live events follow from where it is now"})
                }
                None => json!({"state": "ended", "sessionId": named, "resumed": false,
                    "note": "relay.resume named a session other than the current one, and no mod is connected"}),
            };
            bridge.outbox.push_notice(route.session_notice(payload));
            if let Some(earlier_unlogged) = RESUMED.admit() {
                tracing::info!(route = %route.cfg.name, conn = bridge.conn, earlier_unlogged, "bridge resumed another session: new epoch, no history");
            }
        }
        Kind::Resume { session, epoch } => {
            let mut c = CatchUp {
                route,
                outbox: &bridge.outbox,
                conn: bridge.conn,
                session,
                epoch,
                wants: plan.channels,
                counts: [0; 3],
            };
            let joined = c.run().await;
            let [memory, recording, lost] = c.counts;
            if let Some(earlier_unlogged) = RESUMED.admit() {
                tracing::info!(route = %route.cfg.name, conn = bridge.conn, from_memory = memory, from_recording = recording, not_retained = lost, joined, earlier_unlogged, "bridge resumed");
            }
        }
    }
    if !bridge.outbox.is_closed() {
        // Subscribed in the hub already (a join) or now (another session); this also asks the
        // mod for channels no one had.
        route.backend.subscribe(route, bridge, &names).await;
    }
}

/// One bridge's catch-up.
struct CatchUp<'a> {
    route: &'a Arc<Route>,
    outbox: &'a Arc<Outbox>,
    conn: u32,
    session: SessionId,
    epoch: u64,
    /// (channel, next seq to send).
    wants: Vec<(String, u64)>,
    /// Events sent from memory, from the recording, and announced as not retained.
    counts: [u64; 3],
}

/// What one step of the catch-up did.
enum Step {
    /// Sent something (or announced a gap).
    Sent,
    /// Nothing this time: the recorder has not committed it yet.
    Waiting,
    /// The bridge is gone or the session changed.
    Over,
}

impl CatchUp<'_> {
    /// Streams history until the bridge joins the live stream; returns whether it did (not:
    /// the bridge left, the relay is stopping, or the session changed).
    async fn run(&mut self) -> bool {
        let cfg = &self.route.cfg;
        let (max_frames, max_bytes) = (cfg.outbox_frames.max(1), cfg.outbox_bytes.max(1));
        let mut flushes = 0u32;
        loop {
            // Bounded batches as the socket drains: never more queued than the outbox allows.
            tokio::select! {
                _ = self.outbox.events_below(max_frames / 2, max_bytes / 2) => {}
                _ = self.route.cancel.cancelled() => return false,
            }
            if self.outbox.is_closed() {
                return false;
            }
            // What the writer took and the socket has not accepted counts too: a bridge that
            // does not read holds no more history than its outbox's bound.
            let depth = self.outbox.depth();
            let bytes = depth.event_bytes + depth.unwritten;
            let room = (
                max_frames.saturating_sub(depth.events).max(1),
                max_bytes.saturating_sub(bytes).max(1),
            );
            let tail = (room.0.min(JOIN_TAIL), room.1);
            match self
                .route
                .hub
                .join(self.epoch, self.conn, self.outbox, &self.wants, tail)
            {
                Join::Joined(tail) => {
                    self.counts[0] += tail as u64;
                    self.outbox.wake();
                    return true;
                }
                Join::Stale => return false,
                Join::Behind => {}
            }
            match self.step(room, flushes >= MAX_FLUSHES).await {
                Step::Sent => flushes = 0,
                Step::Over => return false,
                Step::Waiting => {
                    flushes += 1;
                    let Some(rec) = &self.route.recorder else {
                        continue;
                    };
                    tokio::select! {
                        _ = rec.flush() => {}
                        _ = self.route.cancel.cancelled() => return false,
                        _ = self.outbox.cut_signal().cancelled() => return false,
                    }
                }
            }
        }
    }

    /// Sends the next batch of the first channel that is behind: from the window if it still
    /// holds it, else from the recording, else (or when `give_up`) a not-retained notice.
    async fn step(&mut self, room: (usize, usize), give_up: bool) -> Step {
        for i in 0..self.wants.len() {
            let (name, next) = (self.wants[i].0.clone(), self.wants[i].1);
            let Some(h) = self
                .route
                .hub
                .history(self.epoch, &name, next, room.0, room.1)
            else {
                return Step::Over;
            };
            if next >= h.next_seq {
                continue;
            }
            if !h.events.is_empty() {
                self.counts[0] += h.events.len() as u64;
                return self.send(i, &h.events);
            }
            // Older than the window: what the recording holds of [next, upto).
            let upto = h.first_kept.unwrap_or(h.next_seq);
            let channel: Arc<str> = Arc::from(name.as_str());
            let store = self.route.recorder.as_ref().and_then(|r| r.store());
            let read = match (store, h.id, give_up) {
                (Some(store), Some(id), false) => {
                    let (session, ch) = (self.session, channel.clone());
                    let limit = (room.0.min(READ_FRAMES), room.1.min(READ_BYTES));
                    tokio::task::spawn_blocking(move || {
                        read_recorded(&store, session, id, ch, next, upto, limit)
                    })
                    .await
                    .unwrap_or_else(|_| Err("the read stopped".into()))
                }
                // A recorder reopening its store, or an empty read: try again after a flush.
                (None, _, false) if self.route.recorder.is_some() => return Step::Waiting,
                _ => Ok(Vec::new()),
            };
            let events = match read {
                Ok(events) => events,
                Err(e) => {
                    tracing::warn!(route = %self.route.cfg.name, conn = self.conn, error = %e, "reading a resume's history from the recording failed");
                    Vec::new()
                }
            };
            let Some(first) = events.first().map(|e| e.seq) else {
                if self.route.recorder.is_some() && !give_up {
                    return Step::Waiting;
                }
                return self.gap(i, channel, upto).await;
            };
            if first > next {
                // Recorded later events but not these: lost to a failed write (commits are
                // prefixes, so they are not coming).
                if let Step::Over = self.gap(i, channel, first).await {
                    return Step::Over;
                }
            }
            self.counts[1] += events.len() as u64;
            return self.send(i, &events);
        }
        // Every channel is level with the live stream: the next join takes it.
        Step::Sent
    }

    /// Queues `events` (the next ones of channel `i`, in order).
    fn send(&mut self, i: usize, events: &[Arc<EventFrame>]) -> Step {
        for e in events {
            match self.outbox.offer(e) {
                Offer::Closed | Offer::Disconnected => return Step::Over,
                // Room was checked; if it went anyway (policy block), the rest waits.
                Offer::Full => break,
                Offer::Queued | Offer::QueuedAfterDrop(_) => {}
            }
            self.wants[i].1 = e.seq + 1;
        }
        self.outbox.wake();
        Step::Sent
    }

    /// Announces that channel `i`'s events from its next seq up to `upto` (exclusive) are not
    /// held anywhere, once what was queued before has gone (so the notice stands where the gap
    /// is), and moves past them.
    async fn gap(&mut self, i: usize, channel: Arc<str>, mut upto: u64) -> Step {
        let next = self.wants[i].1;
        // Everything queued must be taken first, the welcome too: a notice is written before
        // the frames of the batch it is taken with.
        tokio::select! {
            _ = async {
                self.outbox.events_below(0, 0).await;
                self.outbox.control_below(0).await;
            } => {}
            _ = self.route.cancel.cancelled() => return Step::Over,
        }
        // With nothing recorded, the window may have let more go meanwhile: one notice for
        // the whole range it no longer holds, not two in a row.
        if self.route.recorder.is_none() {
            let Some(h) = self.route.hub.history(self.epoch, &channel, next, 0, 0) else {
                return Step::Over;
            };
            upto = upto.max(h.first_kept.unwrap_or(h.next_seq));
        }
        if !self.outbox.push_gap(channel, next, upto - 1) {
            return Step::Over;
        }
        self.counts[2] += upto - next;
        self.wants[i].1 = upto;
        Step::Sent
    }
}

/// Channel `channel`'s recorded events with relay seq in `[from, upto)`, as the live stream
/// sent them (the mod's body with the relay seq written in), at most `limit` (frames, bytes).
/// Runs on a blocking thread; only committed frames are visible.
fn read_recorded(
    store: &Store,
    session: SessionId,
    channel: u32,
    name: Arc<str>,
    from: u64,
    upto: u64,
    limit: (usize, usize),
) -> Result<Vec<Arc<EventFrame>>, String> {
    let mut out = Vec::new();
    let mut bytes = 0;
    let mut parser = Parser::new();
    let frames = store
        .channel_frames(session, channel, from)
        .map_err(|e| e.to_string())?;
    for item in frames {
        let (_, rec) = item.map_err(|e| e.to_string())?;
        let Some(seq) = rec.relay_seq else { continue };
        if seq >= upto || out.len() >= limit.0 {
            break;
        }
        let span = parser
            .parse(&rec.body, Mode::Tolerant)
            .ok()
            .and_then(|v| v.seq_span.clone());
        let wire = gabp_proto::rewrite::wire_with_seq(&rec.body, span, seq);
        // Within the room, as the window's reads are (past the first): one event more would
        // overflow the outbox, and under drop-oldest cost the history an event.
        if !out.is_empty() && bytes + wire.len() > limit.1 {
            break;
        }
        bytes += wire.len();
        out.push(Arc::new(EventFrame {
            channel: name.clone(),
            seq,
            wire,
            keep: false,
        }));
    }
    Ok(out)
}
