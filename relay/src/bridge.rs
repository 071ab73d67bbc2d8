//! A bridge connection: strict reading, the relay's own handshake, forwarding, and the writer.
//!
//! Bridges are untrusted. Every frame is validated strictly; a bad body gets an error reply
//! and reading continues, broken framing closes the connection. Nothing is forwarded before a
//! successful `session/hello`. The writer drains the bridge's outbox in batches: relay/dropped
//! notices first (they describe gaps before what follows), then responses, then events, all
//! coalesced into few write calls.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use gabp_proto::{message, ErrorCode, GabpCodec, Mode, MsgType, Parser};
use gabp_sim::clock::now_ns;
use gabp_sim::net::Conn;
use gabp_storage::{BridgeInfo, Direction};
use serde_json::{json, Value};
use tokio::sync::OwnedSemaphorePermit;
use tokio_util::codec::FramedRead;
use uuid::Uuid;

use crate::auth;
use crate::outbox::Outbox;
use crate::pending::{Entry, Origin};
use crate::recorder::RecMsg;
use crate::route::{BridgeState, Route, VERSION};
use crate::sink::{Sink, Staged};

/// Serves one bridge until it leaves or the relay shuts down.
pub async fn serve(route: Arc<Route>, conn: Conn, permit: OwnedSemaphorePermit) {
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
    *outbox.sink_slot().lock() = Some(Sink::new(conn_id, conn.write));
    let writer = tokio::spawn(write_loop(route.clone(), bridge.clone()));
    let mut reader = BridgeReader {
        route: route.clone(),
        bridge: bridge.clone(),
        parser: Parser::new(),
        authed: false,
    };
    reader.run(conn.read).await;

    // Leave: stop receiving events, let the writer flush what is queued, then go.
    let subs: Vec<String> = bridge.subs.lock().iter().cloned().collect();
    reader.unsubscribe_upstream(&subs).await;
    outbox.close();
    if tokio::time::timeout(Duration::from_secs(5), writer)
        .await
        .is_err()
    {
        tracing::debug!(conn = conn_id, "bridge writer did not finish; dropped");
    }
    route.bridges.lock().remove(&conn_id);
    route.metrics.bridges.decrement(1.0);
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
}

/// The id of a rejected frame, if it can be read at all (so the error can be matched).
fn lenient_id(body: &[u8]) -> Option<String> {
    let v: Value = serde_json::from_slice(body).ok()?;
    let id = v.get("id")?.as_str()?;
    (id.len() <= 64).then(|| id.to_string())
}

impl BridgeReader {
    async fn run(&mut self, read: gabp_sim::net::BoxRead) {
        let route = self.route.clone();
        let timeout = route.cfg.frame_timeout;
        let mut frames =
            FramedRead::with_capacity(read, GabpCodec::new(route.cfg.max_body), 64 * 1024);
        let connected = Instant::now();
        let mut tick = tokio::time::interval((timeout / 4).max(Duration::from_millis(10)));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut partial_since: Option<Instant> = None;
        loop {
            let next = tokio::select! {
                biased;
                _ = route.cancel.cancelled() => return,
                n = frames.next() => n,
                _ = tick.tick() => {
                    let now = Instant::now();
                    if !self.authed && now.duration_since(connected) > timeout {
                        tracing::info!(peer = %self.bridge.peer, "closing bridge: no session/hello within {timeout:?}");
                        return self.close_with(None, ErrorCode::NoSession, "no session/hello in time; closing").await;
                    }
                    if frames.read_buffer().is_empty() {
                        partial_since = None;
                    } else if now.duration_since(*partial_since.get_or_insert(now)) > timeout {
                        tracing::info!(peer = %self.bridge.peer, "closing bridge: frame not completed within {timeout:?}");
                        return self.close_with(None, ErrorCode::InvalidRequest, "frame not completed in time; closing").await;
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
                    return self.close_with(None, code, &msg).await;
                }
                Some(Ok(frame)) => self.on_frame(frame.body).await,
            }
        }
    }

    async fn close_with(&self, id: Option<&str>, code: ErrorCode, msg: &str) {
        self.route.reply_error(&self.bridge, id, code, msg).await;
    }

    async fn on_frame(&mut self, body: Bytes) {
        let route = self.route.clone();
        route.metrics.bridge_in.increment(1);
        let view = match self.parser.parse(&body, Mode::Strict) {
            Ok(v) => v,
            Err(e) => {
                route.metrics.bad_frames.increment(1);
                route
                    .record_current(
                        Direction::BridgeToRelay,
                        self.bridge.conn,
                        body.clone(),
                        false,
                    )
                    .await;
                let id = lenient_id(&body);
                return route
                    .reply_error(&self.bridge, id.as_deref(), e.code(), &e.to_string())
                    .await;
            }
        };
        let id = view
            .id
            .as_deref()
            .expect("strict views have an id")
            .to_string();
        if view.kind != MsgType::Request {
            route
                .record_current(
                    Direction::BridgeToRelay,
                    self.bridge.conn,
                    body.clone(),
                    true,
                )
                .await;
            return route
                .reply_error(
                    &self.bridge,
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
            return route
                .reply_error(
                    &self.bridge,
                    Some(&id),
                    ErrorCode::NoSession,
                    "no session: send session/hello first",
                )
                .await;
        }
        if method == "relay/status" {
            // Answered before it is recorded, so the status stays visible even while a failing
            // disk holds the recorder (policy `stall`).
            route
                .reply(&self.bridge, message::result_response(&id, route.status()))
                .await;
            return route
                .record_current(Direction::BridgeToRelay, self.bridge.conn, body, true)
                .await;
        }
        route
            .record_current(
                Direction::BridgeToRelay,
                self.bridge.conn,
                body.clone(),
                true,
            )
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
                route
                    .reply_error(
                        &self.bridge,
                        Some(&id),
                        ErrorCode::MethodNotFound,
                        "unknown relay method",
                    )
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
        // Record the hello without its token.
        if let Ok(mut msg) = serde_json::from_slice::<Value>(body) {
            msg["params"]["token"] = json!("[redacted]");
            route
                .record_current(
                    Direction::BridgeToRelay,
                    self.bridge.conn,
                    Bytes::from(message::to_ascii_json(&msg)),
                    true,
                )
                .await;
        }
        if self.authed {
            return route
                .reply_error(
                    &self.bridge,
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
            return route
                .reply_error(&self.bridge, Some(id), ErrorCode::BadToken, "invalid token")
                .await;
        }
        route.throttle.succeed(&source);
        let mut rx = route.session.subscribe();
        let session = tokio::select! {
            _ = route.cancel.cancelled() => None,
            s = tokio::time::timeout(route.cfg.hello_wait, rx.wait_for(|s| s.is_some())) => s.ok().and_then(|r| r.ok()).and_then(|s| s.clone()),
        };
        let Some(session) = session else {
            return route
                .reply_error(
                    &self.bridge,
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
        let info = BridgeInfo {
            conn: self.bridge.conn,
            bridge_version: p["bridgeVersion"]
                .as_str()
                .unwrap_or_default()
                .chars()
                .take(128)
                .collect(),
            platform: p["platform"]
                .as_str()
                .unwrap_or_default()
                .chars()
                .take(32)
                .collect(),
            launch_id: p["launchId"]
                .as_str()
                .unwrap_or_default()
                .chars()
                .take(128)
                .collect(),
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
        route
            .reply(&self.bridge, message::result_response(id, welcome))
            .await;
    }

    fn channels(params: &Value) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for c in params["channels"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| c.as_str())
        {
            if !out.iter().any(|o| o == c) {
                out.push(c.to_string());
            }
        }
        out
    }

    async fn subscribe(&mut self, id: &str, params: &Value) {
        let route = self.route.clone();
        let chans = Self::channels(params);
        let within_cap = {
            let mut subs = self.bridge.subs.lock();
            let new = chans.iter().filter(|c| !subs.contains(*c)).count();
            let ok = subs.len() + new <= route.cfg.max_subscriptions;
            if ok {
                subs.extend(chans.iter().cloned());
            }
            ok
        };
        if !within_cap {
            return route
                .reply_error(
                    &self.bridge,
                    Some(id),
                    ErrorCode::LimitExceeded,
                    "too many subscriptions for one bridge",
                )
                .await;
        }
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
        route
            .reply(
                &self.bridge,
                message::result_response(id, json!({ "subscribed": chans })),
            )
            .await;
    }

    async fn unsubscribe(&mut self, id: &str, params: &Value) {
        let route = self.route.clone();
        let chans = Self::channels(params);
        {
            let mut subs = self.bridge.subs.lock();
            for c in &chans {
                subs.remove(c);
            }
        }
        self.unsubscribe_upstream(&chans).await;
        route
            .reply(
                &self.bridge,
                message::result_response(id, json!({ "unsubscribed": chans })),
            )
            .await;
    }

    /// Leaves channels in the hub and drops the upstream subscription of any channel nobody
    /// wants any more (unless the route records every advertised channel).
    async fn unsubscribe_upstream(&self, chans: &[String]) {
        let route = &self.route;
        let emptied = route.hub.unsubscribe(self.bridge.conn, chans);
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

    async fn forward(
        &mut self,
        id: &str,
        id_span: std::ops::Range<usize>,
        method: &str,
        body: Bytes,
    ) {
        let route = self.route.clone();
        let Some(session) = route.current() else {
            return route
                .reply_error(
                    &self.bridge,
                    Some(id),
                    ErrorCode::ModUnavailable,
                    "the mod is not connected",
                )
                .await;
        };
        if self.bridge.in_flight.fetch_add(1, Ordering::AcqRel) >= route.cfg.max_pending {
            self.bridge.in_flight.fetch_sub(1, Ordering::AcqRel);
            return route
                .reply_error(
                    &self.bridge,
                    Some(id),
                    ErrorCode::LimitExceeded,
                    "too many requests in flight for one bridge",
                )
                .await;
        }
        let upstream_id = Uuid::new_v4();
        let up = upstream_id.hyphenated().to_string();
        let mut out = BytesMut::from(&body[..]);
        let rewritten =
            gabp_proto::rewrite::rewrite_id_in_place(&mut out, id_span.clone(), up.as_bytes());
        let out = if rewritten {
            out.freeze()
        } else {
            gabp_proto::rewrite::with_id(&body, id_span, &up)
        };
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
            return route
                .reply_error(
                    &self.bridge,
                    Some(id),
                    ErrorCode::ModUnavailable,
                    "the mod disconnected",
                )
                .await;
        }
        route
            .record(
                session.id,
                gabp_storage::FrameRecord::message(
                    Direction::RelayToMod,
                    self.bridge.conn,
                    now_ns(),
                    true,
                    out,
                ),
            )
            .await;
    }
}

/// The bridge's writer task: writes whatever the mod reader did not write directly (control
/// frames, notices, bursts a full socket held back), waiting for the socket as needed.
async fn write_loop(route: Arc<Route>, bridge: Arc<BridgeState>) {
    let outbox = &bridge.outbox;
    loop {
        // The slot is empty only while this task holds the sink, so this always succeeds;
        // the mod reader writes in place under the slot's lock and never takes it out.
        let Some(mut sink) = outbox.sink_slot().lock().take() else {
            outbox.ready().await;
            continue;
        };
        let open = outbox.take(&mut sink.batch).is_some();
        let staged = sink.stage();
        let written = sink.flush().await.is_ok();
        record_staged(&route, &sink, staged);
        if !written || !open {
            // A write failure means the bridge is gone: stop queueing for it.
            outbox.close();
            sink.shutdown().await;
            return;
        }
        *outbox.sink_slot().lock() = Some(sink);
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
    let Some(mut slot) = outbox.sink_slot().try_lock() else {
        return outbox.wake();
    };
    let Some(sink) = slot.as_mut().filter(|s| s.is_idle()) else {
        drop(slot);
        return outbox.wake();
    };
    if outbox.take(&mut sink.batch).is_none() {
        // Closed and drained: the writer shuts the socket.
        drop(slot);
        return outbox.wake();
    }
    let staged = sink.stage();
    let result = sink.write_now();
    record_staged(route, sink, staged);
    drop(slot);
    match result {
        Ok(true) => {}
        Ok(false) => outbox.wake(),
        Err(_) => outbox.close(),
    }
}

/// Counts what was staged and records its `relay/dropped` notices. Never waits on the
/// recorder: under `stall` that would freeze this bridge (and the mod reader).
fn record_staged(route: &Route, sink: &Sink, staged: Staged) {
    route.metrics.bridge_out.increment(staged.events);
    for body in staged.notices {
        route.record_current_detached(Direction::RelayToBridge, sink.conn, body);
    }
}
