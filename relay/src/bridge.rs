//! A bridge connection: strict reading, the relay's own handshake, forwarding, and the writer.
//!
//! Bridges are untrusted. Every frame is validated strictly; a bad body gets an error reply
//! and reading continues, broken framing closes the connection. Nothing is forwarded, and
//! nothing recorded, before a successful `session/hello`: that traffic is counted, and a few
//! failures close the connection. Every cost is bounded: replies the bridge does not read stop
//! its reading, forwarded request bytes have a budget, and a socket that takes nothing for the
//! write deadline gets the bridge cut (reset, state freed at once). The writer drains the
//! bridge's outbox in batches: relay/dropped notices first (they describe gaps before what
//! follows), then frames in the order they were queued, coalesced into few write calls.

use std::collections::HashSet;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use gabp_proto::{frame_bytes, message, ErrorCode, GabpCodec, Mode, MsgType, Parser};
use gabp_rt::clock::now_ns;
use gabp_rt::net::Conn;
use gabp_storage::{BridgeInfo, Direction};
use serde_json::{json, Value};
use tokio::sync::OwnedSemaphorePermit;
use tokio_util::codec::FramedRead;
use uuid::Uuid;

use crate::auth;
use crate::outbox::{CutReason, Outbox};
use crate::pending::{self, ByteBudget, Entry, Origin};
use crate::recorder::RecMsg;
use crate::route::{BridgeState, Route, VERSION};
use crate::socket::{BridgeSocket, Staged};

/// Relay replies a bridge may leave unread before the relay stops reading its requests (a
/// bridge that never reads is then cut by the write deadline, never queued without bound).
const CONTROL_PAUSE: usize = 1 << 20;
/// Failed frames tolerated before a successful hello; then the connection is closed.
pub const MAX_PREHELLO_ERRORS: u32 = 3;
/// Bad frames recorded per connection (with their error replies); later ones are only counted,
/// so a client that sends garbage cannot fill the disk.
const MAX_BAD_RECORDED: u32 = 16;
/// How long a bridge's writer may keep flushing once the relay is shutting down.
const SHUTDOWN_GRACE: Duration = Duration::from_millis(500);
/// A read buffer grown past this by one big frame is given back once empty.
const READ_BUFFER_KEEP: usize = 1 << 20;

/// A second descriptor of a bridge's socket, kept to reset the connection when the bridge is
/// cut: `SO_LINGER` 0 makes the last close send a reset and free the socket's buffers at once,
/// instead of a FIN that a hung peer could hold open forever.
#[derive(Debug, Default)]
pub struct Closer(Option<OwnedFd>);

impl Closer {
    /// A closer for the socket behind `fd` (a duplicate descriptor; `None` if that failed).
    pub fn of(fd: BorrowedFd<'_>) -> Closer {
        Closer(fd.try_clone_to_owned().ok())
    }

    /// Makes the connection end with a reset once its last descriptor closes.
    fn arm_reset(&self) {
        if let Some(fd) = &self.0 {
            let _ = socket2::SockRef::from(fd).set_linger(Some(Duration::ZERO));
        }
    }
}

/// Serves one bridge until it leaves, is cut, or the relay shuts down.
pub async fn serve(route: Arc<Route>, conn: Conn, permit: OwnedSemaphorePermit, closer: Closer) {
    let conn_id = route.next_conn();
    let outbox = Arc::new(Outbox::new(
        route.cfg.on_slow,
        route.cfg.outbox_frames,
        route.cfg.outbox_bytes,
    ));
    let bridge = Arc::new(BridgeState {
        conn: conn_id,
        outbox: outbox.clone(),
        peer: conn.peer.clone(),
        info: Default::default(),
        subs: Default::default(),
        in_flight: Default::default(),
    });
    route.bridges.lock().insert(conn_id, bridge.clone());
    route.metrics.bridges.increment(1.0);
    outbox
        .socket()
        .install(BridgeSocket::new(conn_id, conn.write));
    let mut writer = tokio::spawn(write_loop(route.clone(), bridge.clone()));
    let mut reader = BridgeReader {
        route: route.clone(),
        bridge: bridge.clone(),
        parser: Parser::new(),
        authed: false,
        prehello_errors: 0,
        bad_recorded: 0,
        done: false,
        budget: ByteBudget::new(pending::BRIDGE_BYTES.max(route.cfg.max_body)),
    };
    let cut = outbox.cut_signal().clone();
    tokio::select! {
        _ = reader.run(conn.read) => {}
        _ = cut.cancelled() => {}
        _ = route.cancel.cancelled() => {}
    }

    // Leave: stop receiving events at once, then let the writer flush what is queued (bounded
    // by the write deadline, and by a short grace at shutdown) unless the bridge was cut.
    let subs: Vec<String> = bridge.subs.lock().iter().cloned().collect();
    let emptied = route.hub.unsubscribe(conn_id, &subs);
    let flushed = !cut.is_cancelled() && {
        outbox.close();
        tokio::select! {
            _ = &mut writer => true,
            _ = cut.cancelled() => false,
            _ = route.cancel.cancelled() => {
                let grace = route.cfg.write_deadline.min(SHUTDOWN_GRACE);
                tokio::time::timeout(grace, &mut writer).await.is_ok()
            }
        }
    };
    if !flushed {
        // Cut (or out of time at shutdown): abort the writer and drop every handle on the
        // socket, which is reset, now.
        closer.arm_reset();
        writer.abort();
        let _ = (&mut writer).await;
        outbox.close();
        outbox.socket().discard();
        if let Some(why) = outbox.cut_reason() {
            tracing::info!(route = %route.cfg.name, conn = conn_id, peer = %bridge.peer, "bridge cut: {}", why.as_str());
        }
    }
    drop(closer);
    route.bridges.lock().remove(&conn_id);
    route.metrics.bridges.decrement(1.0);
    if !route.cancel.is_cancelled() {
        drop_upstream(&route, emptied).await;
    }
    let info = bridge.info.lock().clone();
    if let (Some(mut info), Some(rec), Some(s)) = (info, &route.recorder, route.current()) {
        info.detached_ns = Some(now_ns());
        info.dropped = outbox.dropped();
        rec.send(RecMsg::Bridge {
            session: s.id,
            info: Box::new(info),
        })
        .await;
    }
    drop(permit);
}

struct BridgeReader {
    route: Arc<Route>,
    bridge: Arc<BridgeState>,
    parser: Parser,
    authed: bool,
    /// Frames refused before a successful hello.
    prehello_errors: u32,
    /// Bad frames recorded so far.
    bad_recorded: u32,
    /// Set when the connection must close after the reply just queued.
    done: bool,
    /// Bytes of this bridge's forwarded requests still held by the relay.
    budget: Arc<ByteBudget>,
}

/// The id of a rejected frame, if it can be read at all (so the error can be matched).
fn lenient_id(body: &[u8]) -> Option<String> {
    let v: Value = serde_json::from_slice(body).ok()?;
    let id = v.get("id")?.as_str()?;
    (id.len() <= 64).then(|| id.to_string())
}

/// Channel names from subscribe params: `None` if there are more than `cap` (checked before
/// anything else, so a huge list costs nothing), otherwise de-duplicated in order, in O(n).
fn channels(params: &Value, cap: usize) -> Option<Vec<String>> {
    let list = params["channels"].as_array().map_or(&[][..], |a| &a[..]);
    if list.len() > cap {
        return None;
    }
    let mut seen: HashSet<&str> = HashSet::with_capacity(list.len());
    Some(
        list.iter()
            .filter_map(Value::as_str)
            .filter(|c| seen.insert(*c))
            .map(String::from)
            .collect(),
    )
}

/// Drops the upstream subscription of channels nobody wants any more (unless the route records
/// every advertised channel).
async fn drop_upstream(route: &Route, emptied: Vec<String>) {
    let Some(s) = route.current() else { return };
    let drop_up: Vec<String> = emptied
        .into_iter()
        .filter(|c| !(route.cfg.subscribe_all && s.advertises(c)))
        .collect();
    if drop_up.is_empty() {
        return;
    }
    {
        let mut up = route.upstream_channels.lock();
        for c in &drop_up {
            up.remove(c);
        }
    }
    route
        .send_internal(&s, "events/unsubscribe", json!({ "channels": drop_up }))
        .await;
}

impl BridgeReader {
    async fn run(&mut self, read: gabp_rt::net::BoxRead) {
        let route = self.route.clone();
        let outbox = self.bridge.outbox.clone();
        let timeout = route.cfg.frame_timeout;
        let pause = CONTROL_PAUSE.min(route.cfg.outbox_bytes / 4).max(1);
        let mut frames =
            FramedRead::with_capacity(read, GabpCodec::new(route.cfg.max_body), 64 * 1024);
        let connected = Instant::now();
        let mut tick = tokio::time::interval((timeout / 4).max(Duration::from_millis(10)));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut partial_since: Option<Instant> = None;
        loop {
            if self.done {
                return;
            }
            if outbox.control_bytes() > pause {
                // The bridge is not reading its replies: read no more requests until it does
                // (one that never does is cut by the write deadline).
                outbox.control_below(pause / 2).await;
            }
            let next = tokio::select! {
                biased;
                n = frames.next() => n,
                _ = tick.tick() => {
                    let now = Instant::now();
                    if !self.authed && now.duration_since(connected) > timeout {
                        tracing::info!(peer = %self.bridge.peer, "closing bridge: no session/hello within {timeout:?}");
                        return self.reply_error(None, ErrorCode::NoSession, "no session/hello in time; closing").await;
                    }
                    if frames.read_buffer().is_empty() {
                        partial_since = None;
                    } else if now.duration_since(*partial_since.get_or_insert(now)) > timeout {
                        tracing::info!(peer = %self.bridge.peer, "closing bridge: frame not completed within {timeout:?}");
                        return self.reply_error(None, ErrorCode::InvalidRequest, "frame not completed in time; closing").await;
                    }
                    continue;
                }
            };
            partial_since = None;
            match next {
                None => return,
                Some(Err(e)) => {
                    route.metrics.bad_frames.increment(1);
                    tracing::debug!(peer = %self.bridge.peer, error = %e, "closing bridge: broken framing");
                    let code = if matches!(e, gabp_proto::FrameError::TooLarge { .. }) {
                        ErrorCode::TooLarge
                    } else {
                        ErrorCode::InvalidRequest
                    };
                    let msg = match e {
                        gabp_proto::FrameError::Io(_) | gabp_proto::FrameError::Truncated => return,
                        other => format!("{other}; closing the connection"),
                    };
                    return self.reply_error(None, code, &msg).await;
                }
                Some(Ok(frame)) => self.on_frame(frame.body).await,
            }
            // One big frame grew the read buffer: give the memory back once it is empty.
            if frames.read_buffer().is_empty() && frames.read_buffer().capacity() > READ_BUFFER_KEEP
            {
                *frames.read_buffer_mut() = BytesMut::with_capacity(64 * 1024);
            }
        }
    }

    /// The secrets no recording may hold.
    fn secrets(&self) -> [&str; 2] {
        self.route.cfg.secrets()
    }

    /// Records a frame of this bridge's conversation, redacted; nothing is recorded before a
    /// successful hello (that traffic is only counted).
    async fn record(&self, dir: Direction, body: Bytes, json_ok: bool) {
        if !self.authed || self.route.recorder.is_none() {
            return;
        }
        let body = auth::redact(&body, &self.secrets());
        self.route
            .record_current(dir, self.bridge.conn, body, json_ok)
            .await;
    }

    /// Queues a reply the relay wrote itself, and records it.
    async fn reply(&mut self, body: Bytes) {
        if self.bridge.outbox.push_control(frame_bytes(&body)) {
            self.record(Direction::RelayToBridge, body, true).await;
        }
    }

    /// Sends an error reply (recorded). Before a successful hello, only a few are sent: then
    /// the connection closes.
    async fn reply_error(&mut self, id: Option<&str>, code: ErrorCode, msg: &str) {
        self.error_reply(id, code, msg, true).await;
    }

    async fn error_reply(&mut self, id: Option<&str>, code: ErrorCode, msg: &str, record: bool) {
        if !self.authed {
            self.prehello_errors += 1;
            if self.prehello_errors >= MAX_PREHELLO_ERRORS {
                self.done = true;
            }
        }
        let body = message::error_response(id, code, msg, None);
        if record {
            self.reply(body).await;
        } else {
            self.bridge.outbox.push_control(frame_bytes(&body));
        }
    }

    async fn on_frame(&mut self, body: Bytes) {
        let route = self.route.clone();
        route.metrics.bridge_in.increment(1);
        if !self.authed {
            route.metrics.unauthenticated.increment(1);
        }
        let view = match self.parser.parse(&body, Mode::Strict) {
            Ok(v) => v,
            Err(e) => {
                route.metrics.bad_frames.increment(1);
                let record = self.authed && self.bad_recorded < MAX_BAD_RECORDED;
                if record {
                    self.bad_recorded += 1;
                    let (rec, json_ok) = auth::redact_unparsed(&body, &self.secrets());
                    self.record(Direction::BridgeToRelay, rec, json_ok).await;
                }
                let id = lenient_id(&body);
                return self
                    .error_reply(id.as_deref(), e.code(), &e.to_string(), record)
                    .await;
            }
        };
        let id = view
            .id
            .as_deref()
            .expect("strict views have an id")
            .to_string();
        if view.kind != MsgType::Request {
            drop(view);
            self.record(Direction::BridgeToRelay, body, true).await;
            return self
                .reply_error(
                    Some(&id),
                    ErrorCode::InvalidRequest,
                    "bridges may only send requests",
                )
                .await;
        }
        let method = view
            .method
            .as_deref()
            .expect("requests have a method")
            .to_string();
        let params: Option<std::ops::Range<usize>> = view.params.clone();
        let id_span = view.id_span.clone().expect("strict views have an id span");
        drop(view);
        if method == "session/hello" {
            return self.hello(&id, &body, params).await;
        }
        if !self.authed {
            return self
                .reply_error(
                    Some(&id),
                    ErrorCode::NoSession,
                    "no session: send session/hello first",
                )
                .await;
        }
        if method == "relay/status" {
            // Answered before it is recorded, so the status stays visible even while a failing
            // disk holds the recorder (policy `stall`).
            self.reply(message::result_response(&id, route.status()))
                .await;
            return self.record(Direction::BridgeToRelay, body, true).await;
        }
        self.record(Direction::BridgeToRelay, body.clone(), true)
            .await;
        let params_value = || -> Value {
            params
                .clone()
                .and_then(|p| serde_json::from_slice(&body[p]).ok())
                .unwrap_or(Value::Null)
        };
        match method.as_str() {
            "events/subscribe" => self.subscribe(&id, &params_value()).await,
            "events/unsubscribe" => self.unsubscribe(&id, &params_value()).await,
            m if m.starts_with("relay/") => {
                self.reply_error(Some(&id), ErrorCode::MethodNotFound, "unknown relay method")
                    .await
            }
            _ => self.forward(&id, id_span, &method, body).await,
        }
    }

    async fn hello(&mut self, id: &str, body: &Bytes, params: Option<std::ops::Range<usize>>) {
        let route = self.route.clone();
        let p: Value = params
            .and_then(|p| serde_json::from_slice(&body[p]).ok())
            .unwrap_or(Value::Null);
        if self.authed {
            // Recorded without its token (and without any other secret).
            let rec = auth::redact_hello(body, &self.secrets());
            self.record(Direction::BridgeToRelay, rec, true).await;
            return self
                .reply_error(
                    Some(id),
                    ErrorCode::InvalidRequest,
                    "session already established",
                )
                .await;
        }
        let source = auth::source_of(&self.bridge.peer);
        if !auth::token_matches(&route.cfg.token, p["token"].as_str().unwrap_or("")) {
            route.metrics.auth_failures.increment(1);
            let delay = route.throttle.fail(&source);
            tracing::warn!(route = %route.cfg.name, peer = %self.bridge.peer, "security: rejected session/hello with a wrong token");
            tokio::time::sleep(delay).await;
            return self
                .reply_error(Some(id), ErrorCode::BadToken, "invalid token")
                .await;
        }
        route.throttle.succeed(&source);
        let mut rx = route.session.subscribe();
        let session = tokio::time::timeout(route.cfg.hello_wait, rx.wait_for(|s| s.is_some()))
            .await
            .ok()
            .and_then(|r| r.ok())
            .and_then(|s| s.clone());
        let Some(session) = session else {
            return self
                .reply_error(
                    Some(id),
                    ErrorCode::ModUnavailable,
                    "the mod is not connected; try again later",
                )
                .await;
        };
        let mut welcome = session.welcome.clone();
        if !welcome.is_object() {
            welcome = json!({});
        }
        if !welcome["capabilities"].is_object() {
            welcome["capabilities"] = json!({});
        }
        if !welcome["capabilities"]["extensions"].is_object() {
            welcome["capabilities"]["extensions"] = json!({});
        }
        welcome["capabilities"]["extensions"]["relay"] = json!({
            "name": "gabp-relay",
            "version": VERSION,
            "route": route.cfg.name,
            "sessionId": session.id.to_string(),
            "backpressure": {
                "policy": route.cfg.on_slow.as_str(),
                "outboxFrames": route.cfg.outbox_frames,
                "outboxBytes": route.cfg.outbox_bytes,
                "droppedChannel": "relay/dropped",
            },
            "methods": ["relay/status"],
        });
        self.authed = true;
        // The first frame this bridge has recorded: its hello, without the token.
        let rec = auth::redact_hello(body, &self.secrets());
        self.record(Direction::BridgeToRelay, rec, true).await;
        // Free-form strings from the bridge: capped, and never carrying a secret.
        let field = |name: &str, max: usize| -> String {
            auth::redact_str(p[name].as_str().unwrap_or_default(), &self.secrets())
                .chars()
                .take(max)
                .collect()
        };
        let info = BridgeInfo {
            conn: self.bridge.conn,
            bridge_version: field("bridgeVersion", 128),
            platform: field("platform", 32),
            launch_id: field("launchId", 128),
            peer: self.bridge.peer.clone(),
            attached_ns: now_ns(),
            detached_ns: None,
            dropped: 0,
            policy: route.cfg.on_slow.as_str().into(),
        };
        *self.bridge.info.lock() = Some(info.clone());
        if let Some(rec) = &route.recorder {
            rec.send(RecMsg::Bridge {
                session: session.id,
                info: Box::new(info),
            })
            .await;
        }
        tracing::info!(route = %route.cfg.name, conn = self.bridge.conn, peer = %self.bridge.peer, "bridge attached");
        self.reply(message::result_response(id, welcome)).await;
    }

    async fn subscribe(&mut self, id: &str, params: &Value) {
        let route = self.route.clone();
        let cap = route.cfg.max_subscriptions;
        let within_cap = channels(params, cap).filter(|chans| {
            let mut subs = self.bridge.subs.lock();
            let new = chans.iter().filter(|c| !subs.contains(*c)).count();
            let ok = subs.len() + new <= cap;
            if ok {
                subs.extend(chans.iter().cloned());
            }
            ok
        });
        let Some(chans) = within_cap else {
            return self
                .reply_error(
                    Some(id),
                    ErrorCode::LimitExceeded,
                    "too many subscriptions for one bridge",
                )
                .await;
        };
        route
            .hub
            .subscribe(self.bridge.conn, &self.bridge.outbox, &chans);
        if let Some(s) = route.current() {
            let missing: Vec<String> = {
                let mut up = route.upstream_channels.lock();
                chans
                    .iter()
                    .filter(|c| up.insert((*c).clone()))
                    .cloned()
                    .collect()
            };
            if !missing.is_empty() {
                route
                    .send_internal(&s, "events/subscribe", json!({ "channels": missing }))
                    .await;
            }
        }
        self.reply(message::result_response(id, json!({ "subscribed": chans })))
            .await;
    }

    async fn unsubscribe(&mut self, id: &str, params: &Value) {
        let route = self.route.clone();
        let Some(chans) = channels(params, route.cfg.max_subscriptions) else {
            return self
                .reply_error(
                    Some(id),
                    ErrorCode::LimitExceeded,
                    "too many channels in one request",
                )
                .await;
        };
        {
            let mut subs = self.bridge.subs.lock();
            for c in &chans {
                subs.remove(c);
            }
        }
        let emptied = route.hub.unsubscribe(self.bridge.conn, &chans);
        drop_upstream(&route, emptied).await;
        self.reply(message::result_response(
            id,
            json!({ "unsubscribed": chans }),
        ))
        .await;
    }

    async fn forward(
        &mut self,
        id: &str,
        id_span: std::ops::Range<usize>,
        method: &str,
        body: Bytes,
    ) {
        let route = self.route.clone();
        let Some(session) = route.current() else {
            return self
                .reply_error(
                    Some(id),
                    ErrorCode::ModUnavailable,
                    "the mod is not connected",
                )
                .await;
        };
        if self.bridge.in_flight.fetch_add(1, Ordering::AcqRel) >= route.cfg.max_pending {
            self.bridge.in_flight.fetch_sub(1, Ordering::AcqRel);
            return self
                .reply_error(
                    Some(id),
                    ErrorCode::LimitExceeded,
                    "too many requests in flight for one bridge",
                )
                .await;
        }
        // Bytes in flight are bounded too, per bridge and per route: they are held until the
        // request is written to the mod and recorded, so a mod that stops reading costs a
        // bounded amount of memory, given back as soon as the bytes are gone.
        let holds = self
            .budget
            .try_reserve(body.len())
            .and_then(|b| Some(vec![b, route.pending.bytes.try_reserve(body.len())?]));
        let Some(holds) = holds else {
            self.bridge.in_flight.fetch_sub(1, Ordering::AcqRel);
            return self
                .reply_error(
                    Some(id),
                    ErrorCode::LimitExceeded,
                    "too many request bytes in flight; try again when earlier requests are answered",
                )
                .await;
        };
        let upstream_id = Uuid::new_v4();
        let up = upstream_id.hyphenated().to_string();
        let mut out = BytesMut::from(&body[..]);
        drop(body);
        let rewritten =
            gabp_proto::rewrite::rewrite_id_in_place(&mut out, id_span.clone(), up.as_bytes());
        let out = if rewritten {
            out.freeze()
        } else {
            gabp_proto::rewrite::with_id(&out, id_span, &up)
        };
        let out = pending::hold(out, holds);
        let now = Instant::now();
        route.pending.insert(
            upstream_id,
            Entry {
                session: session.id,
                origin: Origin::Bridge {
                    conn: self.bridge.conn,
                    outbox: self.bridge.outbox.clone(),
                    bridge_id: id.to_string(),
                    in_flight: self.bridge.in_flight.clone(),
                },
                method: method.to_string(),
                sent: now,
                deadline: now + route.cfg.request_timeout,
            },
        );
        if session.upstream.send(out.clone()).await.is_err() {
            route.pending.take(&upstream_id);
            return self
                .reply_error(Some(id), ErrorCode::ModUnavailable, "the mod disconnected")
                .await;
        }
        if route.recorder.is_some() {
            let rec = auth::redact(&out, &self.secrets());
            drop(out);
            route
                .record(
                    session.id,
                    gabp_storage::FrameRecord::message(
                        Direction::RelayToMod,
                        self.bridge.conn,
                        now_ns(),
                        true,
                        rec,
                    ),
                )
                .await;
        }
    }
}

/// The bridge's writer task: writes whatever the mod reader did not write directly (control
/// frames, notices, bursts a full socket held back), waiting for the socket as long as it keeps
/// taking bytes; a socket that takes nothing for the write deadline gets the bridge cut.
async fn write_loop(route: Arc<Route>, bridge: Arc<BridgeState>) {
    let outbox = &bridge.outbox;
    let deadline = route.cfg.write_deadline;
    loop {
        // The slot is empty only while this task holds the lease, so this always succeeds;
        // the mod reader writes in place under the slot's lock and never takes it out.
        let Some(mut sink) = outbox.socket().lease() else {
            outbox.ready().await;
            continue;
        };
        let open = outbox.take(&mut sink.batch).is_some();
        let staged = sink.stage();
        let written = sink.flush(deadline).await;
        record_staged(&route, &sink, staged);
        match written {
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {
                // Retiring the socket here lets the connection task reset it.
                outbox.cut(CutReason::WriteDeadline);
                return sink.retire();
            }
            Err(_) => {
                // A write failure means the bridge is gone: stop queueing for it.
                outbox.close();
                return sink.retire();
            }
            Ok(()) if !open => {
                let _ = tokio::time::timeout(deadline, sink.shutdown()).await;
                return sink.retire();
            }
            Ok(()) => {}
        }
        drop(sink); // back in the slot
        if !outbox.has_queued() {
            outbox.ready().await;
        }
    }
}

/// The mod reader's write to one bridge after a burst of events: if the bridge's writer is
/// idle, write what is queued right here without waiting (no wake-up, no context switch);
/// otherwise, or if the socket takes only part of it, wake the writer to do the rest.
pub fn write_from_reader(route: &Route, outbox: &Outbox) {
    outbox.clear_wake_mark();
    let Some(mut sink) = outbox.socket().try_idle() else {
        return outbox.wake();
    };
    if outbox.take(&mut sink.batch).is_none() {
        // Closed and drained: the writer shuts the socket.
        drop(sink);
        return outbox.wake();
    }
    let staged = sink.stage();
    let result = sink.write_now();
    record_staged(route, &sink, staged);
    drop(sink);
    match result {
        Ok(true) => {}
        Ok(false) => outbox.wake(),
        Err(_) => outbox.close(),
    }
}

/// Counts what was staged and records its `relay/dropped` notices. Never waits on the
/// recorder: under `stall` that would freeze this bridge (and the mod reader).
fn record_staged(route: &Route, sink: &BridgeSocket, staged: Staged) {
    route.metrics.bridge_out.increment(staged.events);
    for body in staged.notices {
        route.record_current_detached(Direction::RelayToBridge, sink.conn, body);
    }
}
