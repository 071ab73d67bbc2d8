//! `gabp-relay replay`: serve a recorded session as a GABP mod.
//!
//! Bridges get the recorded welcome, then, from their first `events/subscribe`, the recorded
//! events of the channels they subscribe to on the recorded timeline (scaled by `--speed`, or
//! as fast as the socket takes them). Requests are answered with the recorded response to the
//! same method and params, in recorded order (the last one repeats once they run out); a
//! request never seen gets an error. Each bridge replays independently and deterministically:
//! two replays at `--speed max` deliver identical event streams.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use gabp_proto::{message, ErrorCode, GabpCodec, Mode, MsgType, Parser};
use gabp_rt::net::{BoxWrite, Conn, Listener};
use gabp_storage::{Direction, SessionMeta, Store, StoreError};
use parking_lot::Mutex;
use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;
use tokio_util::codec::FramedRead;
use tokio_util::sync::CancellationToken;

/// Replay pace.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Speed {
    /// Recorded timeline times this factor (2.0 is twice as fast).
    Factor(f64),
    /// As fast as possible.
    Max,
}

impl std::str::FromStr for Speed {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s == "max" {
            return Ok(Speed::Max);
        }
        match s.trim_end_matches('x').parse::<f64>() {
            Ok(f) if f > 0.0 && f.is_finite() => Ok(Speed::Factor(f)),
            _ => Err(format!(
                "invalid speed {s:?}: expected a positive factor like 1, 10 or 0.5, or max"
            )),
        }
    }
}

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
}

#[derive(Debug)]
struct Event {
    offset_ns: u64,
    channel: Arc<str>,
    body: Bytes,
    seq_span: Option<std::ops::Range<usize>>,
}

/// A session loaded for replay.
#[derive(Debug)]
pub struct Recording {
    /// The session's catalog entry.
    pub meta: SessionMeta,
    welcome: Value,
    events: Vec<Event>,
    responses: HashMap<(String, String), Vec<Value>>,
}

/// The canonical key of a request: method and params with sorted keys.
fn request_key(method: &str, params: &Value) -> (String, String) {
    (
        method.to_string(),
        serde_json::to_string(params).unwrap_or_default(),
    )
}

impl Recording {
    /// Loads a session's welcome, events and request/response pairs.
    pub fn load(
        store: &Store,
        meta: SessionMeta,
        opts: &ReplayOptions,
    ) -> Result<Recording, StoreError> {
        let welcome = meta.welcome.clone().unwrap_or_else(|| json!({}));
        let from_ns = opts.from.map_or(0, |d| d.as_nanos() as u64);
        let mut parser = Parser::new();
        let mut events = Vec::new();
        let mut sent: HashMap<String, (String, Value)> = HashMap::new();
        let mut responses: HashMap<(String, String), Vec<Value>> = HashMap::new();
        let mut names: HashMap<u32, Arc<str>> = HashMap::new();
        for item in store.frames(meta.id) {
            let (_, rec) = item?;
            let Ok(view) = parser.parse(&rec.body, Mode::Tolerant) else {
                continue;
            };
            match (rec.dir, view.kind) {
                (Direction::ModToRelay, MsgType::Event) => {
                    let offset_ns = rec.time_ns.saturating_sub(meta.started_ns);
                    let channel = view.channel.as_deref().unwrap_or_default();
                    if offset_ns < from_ns
                        || (!opts.channels.is_empty()
                            && !opts.channels.iter().any(|c| c == channel))
                    {
                        continue;
                    }
                    let name = names
                        .entry(rec.channel.unwrap_or(u32::MAX))
                        .or_insert_with(|| Arc::from(channel))
                        .clone();
                    events.push(Event {
                        offset_ns: offset_ns - from_ns,
                        channel: name,
                        seq_span: view.seq_span.clone(),
                        body: rec.body.clone(),
                    });
                }
                (Direction::RelayToMod, MsgType::Request) => {
                    let method = view.method.as_deref().unwrap_or_default().to_string();
                    if method == "session/hello" || method.starts_with("events/") {
                        continue;
                    }
                    let params = view
                        .params
                        .clone()
                        .and_then(|p| serde_json::from_slice(&rec.body[p]).ok())
                        .unwrap_or(json!({}));
                    if let Some(id) = view.id.as_deref() {
                        sent.insert(id.to_string(), (method, params));
                    }
                }
                (Direction::ModToRelay, MsgType::Response) => {
                    let Some((method, params)) = view.id.as_deref().and_then(|id| sent.remove(id))
                    else {
                        continue;
                    };
                    let Ok(mut msg) = serde_json::from_slice::<Value>(&rec.body) else {
                        continue;
                    };
                    // Keep the answer, not the envelope: the id is the asker's on replay.
                    let answer = if msg.get("error").is_some_and(|e| !e.is_null()) {
                        json!({"error": msg["error"].take()})
                    } else {
                        json!({"result": msg["result"].take()})
                    };
                    responses
                        .entry(request_key(&method, &params))
                        .or_default()
                        .push(answer);
                }
                _ => {}
            }
        }
        Ok(Recording {
            meta,
            welcome,
            events,
            responses,
        })
    }

    /// Recorded events to be replayed.
    pub fn event_count(&self) -> usize {
        self.events.len()
    }
}

/// Serves `rec` on `listener` until cancelled.
pub async fn serve(
    listener: Listener,
    rec: Arc<Recording>,
    opts: ReplayOptions,
    cancel: CancellationToken,
) {
    // Accept errors (EMFILE above all) repeat at once until a descriptor frees up: back off
    // instead of spinning, and log once per run of errors.
    let mut failing = false;
    loop {
        let conn = tokio::select! {
            _ = cancel.cancelled() => return,
            c = listener.accept() => c,
        };
        let conn = match conn {
            Ok(c) => {
                failing = false;
                c
            }
            Err(e) => {
                if !failing {
                    tracing::warn!(error = %e, "replay cannot accept connections; retrying every 100 ms");
                    failing = true;
                }
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = tokio::time::sleep(std::time::Duration::from_millis(100)) => {}
                }
                continue;
            }
        };
        let (rec, opts, cancel) = (rec.clone(), opts.clone(), cancel.clone());
        tokio::spawn(async move { serve_bridge(conn, rec, opts, cancel).await });
    }
}

async fn writer(mut w: BoxWrite, mut rx: mpsc::Receiver<Bytes>) {
    let mut buf = BytesMut::with_capacity(64 * 1024);
    while let Some(b) = rx.recv().await {
        buf.extend_from_slice(&b);
        while buf.len() < 256 * 1024 {
            match rx.try_recv() {
                Ok(b) => buf.extend_from_slice(&b),
                Err(_) => break,
            }
        }
        if w.write_all(&buf).await.is_err() {
            return;
        }
        buf.clear();
    }
    let _ = w.shutdown().await;
}

async fn serve_bridge(
    conn: Conn,
    rec: Arc<Recording>,
    opts: ReplayOptions,
    cancel: CancellationToken,
) {
    let (tx, rx) = mpsc::channel::<Bytes>(1024);
    let writer = tokio::spawn(writer(conn.write, rx));
    let mut frames = FramedRead::new(conn.read, GabpCodec::default());
    let mut parser = Parser::new();
    let mut authed = false;
    let subs: Arc<Mutex<HashSet<String>>> = Arc::default();
    let mut timeline: Option<tokio::task::JoinHandle<()>> = None;
    let mut answers: HashMap<(String, String), VecDeque<Value>> = rec
        .responses
        .iter()
        .map(|(k, v)| (k.clone(), v.iter().cloned().collect()))
        .collect();
    let send = |body: Bytes| {
        let tx = tx.clone();
        async move { tx.send(gabp_proto::frame_bytes(&body)).await.is_ok() }
    };
    loop {
        let frame = tokio::select! {
            _ = cancel.cancelled() => break,
            f = frames.next() => match f { Some(Ok(f)) => f, _ => break },
        };
        let view = match parser.parse(&frame.body, Mode::Strict) {
            Ok(v) => v,
            Err(e) => {
                send(message::error_response(
                    None,
                    e.code(),
                    &e.to_string(),
                    None,
                ))
                .await;
                continue;
            }
        };
        let id = view.id.as_deref().unwrap_or(message::NIL_ID).to_string();
        let method = view.method.as_deref().unwrap_or_default().to_string();
        let params: Value = view
            .params
            .clone()
            .and_then(|p| serde_json::from_slice(&frame.body[p]).ok())
            .unwrap_or(json!({}));
        let reply = match method.as_str() {
            "session/hello" => {
                if crate::auth::token_matches(&opts.token, params["token"].as_str().unwrap_or("")) {
                    authed = true;
                    let mut w = rec.welcome.clone();
                    if w["capabilities"].is_object() {
                        w["capabilities"]["extensions"]["replay"] =
                            json!({"sessionId": rec.meta.id.to_string(), "route": rec.meta.route});
                    }
                    message::result_response(&id, w)
                } else {
                    message::error_response(Some(&id), ErrorCode::BadToken, "invalid token", None)
                }
            }
            _ if !authed => message::error_response(
                Some(&id),
                ErrorCode::NoSession,
                "no session: send session/hello first",
                None,
            ),
            "events/subscribe" | "events/unsubscribe" => {
                let chans: Vec<String> = params["channels"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|c| c.as_str().map(String::from))
                    .collect();
                let subscribing = method == "events/subscribe";
                {
                    let mut s = subs.lock();
                    for c in &chans {
                        if subscribing {
                            s.insert(c.clone());
                        } else {
                            s.remove(c);
                        }
                    }
                }
                if subscribing && timeline.is_none() {
                    timeline = Some(tokio::spawn(play(
                        rec.clone(),
                        opts.clone(),
                        subs.clone(),
                        tx.clone(),
                        cancel.clone(),
                    )));
                }
                let key = if subscribing {
                    "subscribed"
                } else {
                    "unsubscribed"
                };
                message::result_response(&id, json!({ key: chans }))
            }
            _ => match answers.get_mut(&request_key(&method, &params)) {
                Some(q) => {
                    let answer = if q.len() > 1 {
                        q.pop_front().expect("non-empty")
                    } else {
                        q.front().cloned().expect("non-empty")
                    };
                    match answer.get("error") {
                        Some(e) => {
                            let v =
                                json!({"v": "gabp/1", "id": id, "type": "response", "error": e});
                            Bytes::from(message::to_ascii_json(&v))
                        }
                        None => message::result_response(&id, answer["result"].clone()),
                    }
                }
                None => message::error_response(
                    Some(&id),
                    ErrorCode::NoRecordedResponse,
                    "no recorded response matches this request (method and params)",
                    Some(json!({"method": method})),
                ),
            },
        };
        if !send(reply).await {
            break;
        }
    }
    if let Some(t) = timeline {
        t.abort();
    }
    drop(tx);
    let _ = writer.await;
}

async fn play(
    rec: Arc<Recording>,
    opts: ReplayOptions,
    subs: Arc<Mutex<HashSet<String>>>,
    tx: mpsc::Sender<Bytes>,
    cancel: CancellationToken,
) {
    let mut seqs: HashMap<Arc<str>, u64> = HashMap::new();
    loop {
        let start = Instant::now();
        for ev in &rec.events {
            if let Speed::Factor(f) = opts.speed {
                let due = start + Duration::from_nanos((ev.offset_ns as f64 / f) as u64);
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = tokio::time::sleep_until(due.into()) => {}
                }
            }
            if !subs.lock().contains(&*ev.channel) {
                continue;
            }
            let seq = seqs.entry(ev.channel.clone()).or_insert(0);
            let wire = gabp_proto::rewrite::wire_with_seq(&ev.body, ev.seq_span.clone(), *seq);
            *seq += 1;
            if tx.send(wire).await.is_err() {
                return;
            }
        }
        if !opts.looping || rec.events.is_empty() {
            return;
        }
    }
}
