//! A live mod's connection epochs: connect with backoff, say hello, publish the session, run
//! the reader, and end the session (pending requests get "outcome unknown").
//!
//! Each connection epoch is a session. Reconnects back off until a session has lasted 10 s; a
//! failure that repeats is logged once with a count. Every wait here ends when the route is
//! cancelled.

use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use gabp_proto::{message, ErrorCode, Mode, MsgType, Parser, SkippingCodec};
use gabp_rt::clock::now_ns;
use gabp_rt::net::{BoxWrite, Conn};
use gabp_storage::{Direction, EndReason, FrameRecord, SessionMeta};
use rand::Rng;
use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;
use tokio_util::codec::FramedRead;
use uuid::Uuid;

use super::{Connector, Frames, Repeats, MAX_CHANNELS};
use crate::recorder::RecMsg;
use crate::route::{Route, SessionInfo, VERSION};

/// Longest wait between reconnect attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(2);
/// How long a session must have run before the reconnect backoff starts again from its
/// shortest wait: a mod (or a downstream relay) that welcomes and then drops the connection at
/// once is retried with growing waits, not in a tight loop.
const STABLE_SESSION: Duration = Duration::from_secs(10);

/// Connects, serves sessions and reconnects until the route is cancelled. Every wait in here
/// (connecting, the welcome, the backoff, the session) ends as soon as the route is cancelled.
pub(super) async fn run(route: Arc<Route>, connector: Arc<dyn Connector>) {
    let mut backoff = Duration::from_millis(50);
    let mut sessions = 0u64;
    let mut failures = Repeats::default();
    loop {
        if route.cancel.is_cancelled() {
            break;
        }
        let connected = tokio::select! {
            biased;
            _ = route.cancel.cancelled() => break,
            c = connector.connect(&route.cfg.upstream) => c,
        };
        match connected {
            Ok(conn) => {
                let started = std::time::Instant::now();
                match serve(&route, conn).await {
                    Ok(()) => {
                        failures.clear();
                        if sessions > 0 {
                            route.metrics.reconnects.increment(1);
                        }
                        sessions += 1;
                        if started.elapsed() >= STABLE_SESSION {
                            backoff = Duration::from_millis(50);
                        }
                    }
                    Err(reason) => {
                        if route.cancel.is_cancelled() {
                            break;
                        }
                        match failures.note(&reason) {
                            Some(0) => {
                                tracing::warn!(route = %route.cfg.name, upstream = %route.cfg.upstream, "{reason}; retrying with backoff")
                            }
                            Some(n) => {
                                tracing::warn!(route = %route.cfg.name, upstream = %route.cfg.upstream, repeated = n, "{reason}; still retrying ({n} more times since last logged)")
                            }
                            None => {
                                tracing::debug!(route = %route.cfg.name, "{reason}")
                            }
                        }
                    }
                }
            }
            Err(e) => {
                let reason = format!("mod not reachable: {e}");
                if failures.note(&reason).is_some() {
                    tracing::warn!(route = %route.cfg.name, upstream = %route.cfg.upstream, error = %e, "mod not reachable; retrying with backoff");
                } else {
                    tracing::debug!(route = %route.cfg.name, error = %e, "mod still not reachable")
                }
            }
        }
        let jitter = rand::thread_rng().gen_range(0..=backoff.as_millis() as u64 / 2);
        tokio::select! {
            _ = route.cancel.cancelled() => break,
            _ = tokio::time::sleep(backoff + Duration::from_millis(jitter)) => {}
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// Frames `body` for the mod: as it is, or with `ascii` (the route's `ascii_requests`) its
/// non-ASCII escaped, so a mod counting `Content-Length` in characters reads it whole. An ASCII
/// body (every frame the relay writes itself) is framed as it is either way.
#[inline]
fn encode_for_mod(body: &[u8], ascii: bool, buf: &mut BytesMut) {
    if ascii && !body.is_ascii() {
        gabp_proto::rewrite::put_wire_ascii(body, buf);
    } else {
        gabp_proto::encode_frame(body, buf);
    }
}

async fn write_loop(mut write: BoxWrite, mut rx: mpsc::Receiver<Bytes>, route: Arc<Route>) {
    let mut buf = BytesMut::with_capacity(64 * 1024);
    let ascii = route.cfg.ascii_requests;
    while let Some(body) = rx.recv().await {
        encode_for_mod(&body, ascii, &mut buf);
        let mut n = 1;
        while buf.len() < 256 * 1024 {
            match rx.try_recv() {
                Ok(b) => {
                    encode_for_mod(&b, ascii, &mut buf);
                    n += 1;
                }
                Err(_) => break,
            }
        }
        if write.write_all(&buf).await.is_err() || write.flush().await.is_err() {
            break;
        }
        route.metrics.mod_out.increment(n);
        buf.clear();
    }
    let _ = write.shutdown().await;
}

/// What the handshake got from the mod and said to it.
struct Handshake {
    /// The welcome result, parsed.
    welcome: Value,
    /// The welcome result's bytes as the mod wrote them (`{}` when it is null).
    welcome_result: Bytes,
    /// The relay's hello as recorded (its token redacted).
    hello_rec: Bytes,
    /// The mod's whole answer, as recorded.
    welcome_frame: Bytes,
}

/// Says hello and waits for the welcome. Frames before the answer are discarded.
async fn handshake(
    route: &Route,
    frames: &mut Frames,
    tx: &mpsc::Sender<Bytes>,
) -> Result<Handshake, String> {
    let id = Uuid::new_v4().to_string();
    let params = |token: &str| json!({"token": token, "bridgeVersion": format!("gabp-relay/{VERSION}"), "platform": std::env::consts::OS, "launchId": route.launch_id});
    let hello = message::request(&id, "session/hello", params(&route.cfg.upstream_token));
    tx.send(hello)
        .await
        .map_err(|_| "connection closed".to_string())?;
    let redacted = message::request(&id, "session/hello", params("[redacted]"));
    let mut parser = Parser::new();
    let finder = memchr::memmem::Finder::new(id.as_bytes());
    let wait = async {
        while let Some(frame) = frames.next().await {
            let frame = match frame.map_err(|e| format!("broken framing from the mod: {e}"))? {
                gabp_proto::codec::Read::Frame(frame) => frame,
                gabp_proto::codec::Read::Skipped { len, answers }
                    if answers.as_ref() == Some(&id) =>
                {
                    return Err(format!(
                        "the mod's welcome is {len} bytes, over --max-body {}: raise --max-body",
                        route.cfg.max_body
                    ));
                }
                gabp_proto::codec::Read::Skipped { .. } => continue,
            };
            let view = match parser.parse(&frame.body, Mode::Tolerant) {
                Ok(view) => view,
                // An answer to this hello the relay cannot read is a failed handshake, said
                // once and clearly, not a frame skipped until the wait runs out.
                Err(e) if finder.find(&frame.body).is_some() => {
                    return Err(format!(
                        "the mod's answer to session/hello is unreadable ({e})"
                    ));
                }
                Err(_) => continue,
            };
            if view.kind != MsgType::Response || view.id.as_deref() != Some(id.as_str()) {
                continue;
            }
            let result_span = view.result.clone();
            let msg: Value = serde_json::from_slice(&frame.body)
                .map_err(|e| format!("the mod's answer to session/hello is unreadable ({e})"))?;
            if let Some(err) = msg.get("error").filter(|e| !e.is_null()) {
                let hint = if err["code"] == ErrorCode::BadToken.code() {
                    " (check --upstream-token)"
                } else {
                    ""
                };
                return Err(format!(
                    "mod rejected the relay's hello: {} {}{hint}",
                    err["code"], err["message"]
                ));
            }
            let result = result_span
                .map_or_else(|| Bytes::from_static(b"{}"), |span| frame.body.slice(span));
            return Ok((msg["result"].clone(), result, frame.body));
        }
        Err("mod closed the connection during the handshake".to_string())
    };
    let (welcome, welcome_result, welcome_frame) = tokio::select! {
        biased;
        _ = route.cancel.cancelled() => return Err("the relay is shutting down".to_string()),
        w = tokio::time::timeout(route.cfg.hello_wait, wait) => {
            w.map_err(|_| "mod did not answer session/hello in time".to_string())??
        }
    };
    Ok(Handshake {
        welcome,
        welcome_result,
        hello_rec: redacted,
        welcome_frame,
    })
}

/// Serves one connection. Returns why no session could be established, if none was.
async fn serve(route: &Arc<Route>, conn: Conn) -> Result<(), String> {
    let mut frames = FramedRead::with_capacity(
        conn.read,
        SkippingCodec::new(route.cfg.max_body),
        256 * 1024,
    );
    let (tx, rx) = mpsc::channel::<Bytes>(1024);
    let writer = tokio::spawn(write_loop(conn.write, rx, route.clone()));
    let Handshake {
        welcome,
        welcome_result,
        hello_rec,
        welcome_frame,
    } = match handshake(route, &mut frames, &tx).await {
        Ok(w) => w,
        Err(reason) => {
            writer.abort();
            return Err(reason);
        }
    };
    let id = Uuid::now_v7();
    let started_ns = now_ns();
    let mut advertised: Vec<String> = welcome["capabilities"]["events"]
        .as_array()
        .map(|a| {
            let mut seen = rustc_hash::FxHashSet::default();
            a.iter()
                .filter_map(|c| c.as_str())
                .filter(|c| !c.is_empty() && seen.insert(*c))
                .map(String::from)
                .collect()
        })
        .unwrap_or_default();
    if advertised.len() > MAX_CHANNELS {
        tracing::warn!(route = %route.cfg.name, advertised = advertised.len(), limit = MAX_CHANNELS, "the mod advertises more channels than one session may use; only the first {MAX_CHANNELS} are subscribed to");
        advertised.truncate(MAX_CHANNELS);
    }
    route.hub.new_session();
    if let Some(r) = &route.recorder {
        let meta = SessionMeta {
            id,
            route: route.cfg.name.clone(),
            started_ns,
            agent_id: welcome["agentId"].as_str().map(String::from),
            app_name: welcome["app"]["name"].as_str().map(String::from),
            app_version: welcome["app"]["version"].as_str().map(String::from),
            welcome: Some(welcome.clone()),
            relay_version: VERSION.into(),
            tags: route.cfg.tags.clone(),
            ..SessionMeta::default()
        };
        let rec = |dir, body| RecMsg::Frame {
            session: id,
            rec: FrameRecord::message(dir, 0, started_ns, true, body),
        };
        r.send_batch(vec![
            RecMsg::Begin(Box::new(meta)),
            rec(Direction::RelayToMod, hello_rec),
            rec(Direction::ModToRelay, welcome_frame),
        ])
        .await;
    }
    let info = Arc::new(SessionInfo::new(
        id,
        welcome.clone(),
        welcome_result,
        advertised,
        started_ns,
        Some(tx),
    ));
    // The session is published before the channels to subscribe to are collected: a bridge
    // subscribing meanwhile either is in the hub's list read below or sees this session and
    // subscribes upstream itself (the set of upstream channels decides who sends, under its
    // lock), so no subscription falls between two sessions.
    // Bridges of an earlier session are told of this one once it is published (a request they
    // send on hearing it finds it), and only they: one welcomed into this session (it waits
    // for the publication) must not be told it started again.
    let listeners = route.session_listeners();
    route.session.send_replace(Some(info.clone()));
    route.notify(&listeners, json!({"state": "started", "sessionId": id.to_string(), "note": "relay seq restarts at 0 on every channel"}));
    let want: Vec<String> = {
        let mut up = route.upstream_channels.lock();
        up.clear();
        let mut want = Vec::new();
        if route.cfg.subscribe_all {
            for c in &info.advertised {
                if up.insert(c.clone()) {
                    want.push(c.clone());
                }
            }
        }
        for c in route.hub.wanted() {
            if up.insert(c.clone()) {
                want.push(c);
            }
        }
        want
    };
    if !want.is_empty() {
        route
            .send_internal(&info, "events/subscribe", json!({ "channels": want }))
            .await;
    }
    route.metrics.upstream_connected.set(1.0);
    tracing::info!(route = %route.cfg.name, session = %id, app = %gabp_rt::display::name(welcome["app"]["name"].as_str().unwrap_or("-")), channels = info.advertised.len(), "mod connected; session started");

    let reason = super::reader::read_loop(route, &info, &mut frames).await;

    route.metrics.upstream_connected.set(0.0);
    drop(info);
    writer.abort();
    let (code, msg) = match reason {
        EndReason::RelayShutdown => (
            ErrorCode::ShuttingDown,
            "the relay is shutting down; the request's outcome is unknown",
        ),
        _ => (
            ErrorCode::OutcomeUnknown,
            "the mod disconnected before answering; the request may or may not have taken effect",
        ),
    };
    // Every pending request is answered before the session is seen to end: at shutdown,
    // bridges wait for that before closing their outboxes (`bridge.rs`). A request that came
    // in meanwhile is answered by the second pass. Each reply a bridge is given is recorded in
    // the session, as every reply the relay writes is.
    let mut replies = Vec::new();
    let answer_pending = |replies: &mut Vec<RecMsg>| {
        for entry in route.pending.drain_session(id) {
            let Some((conn, outbox, body)) = entry.error_reply(code, msg) else {
                continue;
            };
            if outbox.push_control(gabp_proto::frame_bytes(&body)) {
                // It names the bridge's method and request id.
                let body = route.redacted(&body);
                let rec =
                    FrameRecord::message(Direction::RelayToBridge, conn, now_ns(), true, body);
                replies.push(RecMsg::Frame { session: id, rec });
            }
        }
    };
    answer_pending(&mut replies);
    if route.cancel.is_cancelled() {
        // At shutdown the session ends while bridges are still attached: their leaving counts
        // (drops, unrecorded bad frames) go in before its end, as each bridge's own would.
        for b in route.bridges.lock().values() {
            if let Some(info) = b.leaving_info() {
                replies.push(RecMsg::Bridge {
                    session: id,
                    info: Box::new(info),
                });
            }
        }
    }
    route.session.send_if_modified(|s| {
        if s.as_ref().is_some_and(|s| s.id == id) {
            *s = None;
            true
        } else {
            false
        }
    });
    answer_pending(&mut replies);
    route.notify_bridges(
        json!({"state": "ended", "sessionId": id.to_string(), "reason": reason.as_str()}),
    );
    if let Some(r) = &route.recorder {
        if !replies.is_empty() {
            r.send_batch(replies).await;
        }
        r.send(RecMsg::End {
            session: id,
            reason,
            at_ns: now_ns(),
        })
        .await;
    }
    tracing::info!(route = %route.cfg.name, session = %id, reason = reason.as_str(), "session ended");
    Ok(())
}
