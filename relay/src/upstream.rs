//! The mod connection: connect with backoff, hello, then read the mod and route everything.
//!
//! Each connection epoch is a session. The reader is the only publisher of events, so per
//! channel order is the mod's order. It never waits for a bridge (unless a bridge's policy is
//! `block`); it does wait for the recorder, which is what makes recording lossless. Outbox
//! wake-ups are batched: touched writers are woken once the socket has nothing more buffered,
//! or every 256 frames at full rate. Recorder messages go out in batches of up to 512, or after
//! lingering at most 2 ms, so a slow trickle of frames does not become many tiny batches.
//!
//! The mod is trusted for content, not for cost: what no bridge could decode (non-finite
//! numbers, lone surrogates), what would exceed `--max-body` once sequenced, and events on
//! channels past [`MAX_CHANNELS`] are anomalies, counted and recorded, never forwarded.
//! Reconnects back off until a session has lasted 10 s; a failure that repeats is
//! logged once with a count. Every wait here ends when the route is cancelled.

use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures::{FutureExt, StreamExt};
use gabp_proto::{encode_header, message, ErrorCode, GabpCodec, Mode, MsgType, Parser};
use gabp_rt::clock::now_ns;
use gabp_rt::net::{BoxWrite, Conn};
use gabp_storage::{Direction, EndReason, FrameRecord, SessionMeta};
use rand::Rng;
use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;
use tokio_util::codec::FramedRead;
use uuid::Uuid;

use crate::config::Upstream;
use crate::outbox::{Offer, Outbox};
use crate::pending::Origin;
use crate::recorder::RecMsg;
use crate::route::{Route, SessionInfo, VERSION};

/// Longest wait between reconnect attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(2);
/// How long a session must have run before the reconnect backoff starts again from its
/// shortest wait: a mod (or a downstream relay) that welcomes and then drops the connection at
/// once is retried with growing waits, not in a tight loop.
const STABLE_SESSION: Duration = Duration::from_secs(10);
/// Channels one session may use (advertised or seen in events). Past it, events on new
/// channels are anomalies and further advertised channels are not subscribed to, so a mod
/// that invents channel names cannot grow the channel table, metrics and recording catalog
/// without bound.
pub const MAX_CHANNELS: usize = 4096;
/// How often a failure that keeps repeating (a wrong `--upstream-token`) is logged again.
const REPEAT_LOG_EVERY: Duration = Duration::from_secs(60);
/// Recorder messages batched before a send even if the socket still has data.
const RECORD_BATCH: usize = 512;
/// How long recorder messages may wait in the reader before they are sent: at low rates this
/// turns many tiny batches into few larger ones, and the recorder thread (which commits every
/// 10 ms) is woken a few times per commit rather than hundreds: on a small machine every wake-up
/// of another thread can delay the readers and writers that carry events.
const RECORD_LINGER: Duration = Duration::from_millis(5);
/// Frames processed before writers are woken even if the socket still has data: at full rate the
/// socket never runs dry, and writers must drain outboxes long before they fill.
const WAKE_EVERY: usize = 256;

/// A failure that may repeat on every attempt, logged once and then summarised with a count
/// at most every `REPEAT_LOG_EVERY` (a minute), so a wrong token does not fill the log forever.
#[derive(Debug, Default)]
pub struct Repeats {
    last: Option<String>,
    since_logged: u64,
    logged_at: Option<std::time::Instant>,
}

impl Repeats {
    /// Whether `what` should be logged now, and how many identical failures were not logged
    /// since it last was.
    pub fn note(&mut self, what: &str) -> Option<u64> {
        let now = std::time::Instant::now();
        if self.last.as_deref() == Some(what) {
            self.since_logged += 1;
            if self
                .logged_at
                .is_some_and(|t| now.duration_since(t) < REPEAT_LOG_EVERY)
            {
                return None;
            }
        } else {
            self.last = Some(what.to_string());
            self.since_logged = 0;
        }
        let skipped = self.since_logged.saturating_sub(1);
        self.since_logged = 0;
        self.logged_at = Some(now);
        Some(skipped)
    }

    /// The failure stopped (a session started).
    pub fn clear(&mut self) {
        *self = Repeats::default();
    }
}

/// Connects, serves sessions and reconnects until the route is cancelled. Every wait in here
/// (connecting, the welcome, the backoff, the session) ends as soon as the route is cancelled.
pub async fn run(route: Arc<Route>, connector: Arc<dyn Connector>) {
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

/// Opens connections to the mod (a trait so `wrap` and stdio can supply their own).
pub trait Connector: Send + Sync + std::fmt::Debug {
    /// Connects once.
    fn connect<'a>(
        &'a self,
        upstream: &'a Upstream,
    ) -> futures::future::BoxFuture<'a, std::io::Result<Conn>>;
}

/// Connects to socket addresses.
#[derive(Debug, Default)]
pub struct SocketConnector;

impl Connector for SocketConnector {
    fn connect<'a>(
        &'a self,
        upstream: &'a Upstream,
    ) -> futures::future::BoxFuture<'a, std::io::Result<Conn>> {
        async move {
            match upstream {
                Upstream::Addr(a) => tokio::time::timeout(Duration::from_secs(5), Conn::connect(a))
                    .await
                    .unwrap_or_else(|_| {
                        Err(std::io::Error::new(
                            std::io::ErrorKind::TimedOut,
                            "connect timed out",
                        ))
                    }),
                Upstream::Stdio(_) => Err(std::io::Error::other(
                    "stdio upstream needs the stdio connector",
                )),
            }
        }
        .boxed()
    }
}

async fn write_loop(mut write: BoxWrite, mut rx: mpsc::Receiver<Bytes>, route: Arc<Route>) {
    let mut buf = BytesMut::with_capacity(64 * 1024);
    while let Some(body) = rx.recv().await {
        gabp_proto::encode_frame(&body, &mut buf);
        let mut n = 1;
        while buf.len() < 256 * 1024 {
            match rx.try_recv() {
                Ok(b) => {
                    gabp_proto::encode_frame(&b, &mut buf);
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

type Frames = FramedRead<gabp_rt::net::BoxRead, GabpCodec>;

/// Says hello and waits for the welcome. Frames before the answer are discarded.
async fn handshake(
    route: &Route,
    frames: &mut Frames,
    tx: &mpsc::Sender<Bytes>,
) -> Result<(Value, Bytes, Bytes), String> {
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
            let frame = frame.map_err(|e| format!("broken framing from the mod: {e}"))?;
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
            return Ok((msg["result"].clone(), frame.body));
        }
        Err("mod closed the connection during the handshake".to_string())
    };
    let (welcome, raw) = tokio::select! {
        biased;
        _ = route.cancel.cancelled() => return Err("the relay is shutting down".to_string()),
        w = tokio::time::timeout(route.cfg.hello_wait, wait) => {
            w.map_err(|_| "mod did not answer session/hello in time".to_string())??
        }
    };
    Ok((welcome, redacted, raw))
}

/// Serves one connection. Returns why no session could be established, if none was.
async fn serve(route: &Arc<Route>, conn: Conn) -> Result<(), String> {
    let mut frames =
        FramedRead::with_capacity(conn.read, GabpCodec::new(route.cfg.max_body), 256 * 1024);
    let (tx, rx) = mpsc::channel::<Bytes>(1024);
    let writer = tokio::spawn(write_loop(conn.write, rx, route.clone()));
    let (welcome, hello_rec, welcome_raw) = match handshake(route, &mut frames, &tx).await {
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
            ..SessionMeta::default()
        };
        let rec = |dir, body| RecMsg::Frame {
            session: id,
            rec: FrameRecord::message(dir, 0, started_ns, true, body),
        };
        r.send_batch(vec![
            RecMsg::Begin(Box::new(meta)),
            rec(Direction::RelayToMod, hello_rec),
            rec(Direction::ModToRelay, welcome_raw),
        ])
        .await;
    }
    let info = Arc::new(SessionInfo::new(
        id,
        welcome.clone(),
        advertised,
        started_ns,
        tx,
    ));
    // The session is published before the channels to subscribe to are collected: a bridge
    // subscribing meanwhile either is in the hub's list read below or sees this session and
    // subscribes upstream itself (the set of upstream channels decides who sends, under its
    // lock), so no subscription falls between two sessions.
    route.session.send_replace(Some(info.clone()));
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
    tracing::info!(route = %route.cfg.name, session = %id, app = %welcome["app"]["name"], channels = info.advertised.len(), "mod connected; session started");
    route.notify_bridges(json!({"state": "started", "sessionId": id.to_string(), "note": "relay seq restarts at 0 on every channel"}));

    let reason = read_loop(route, &info, &mut frames).await;

    route.session.send_if_modified(|s| {
        if s.as_ref().is_some_and(|s| s.id == id) {
            *s = None;
            true
        } else {
            false
        }
    });
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
    for entry in route.pending.drain_session(id) {
        if let Origin::Bridge {
            outbox, bridge_id, ..
        } = &entry.origin
        {
            let body = message::error_response(
                Some(bridge_id),
                code,
                msg,
                Some(json!({"method": entry.method})),
            );
            outbox.push_control(gabp_proto::frame_bytes(&body));
        }
    }
    route.notify_bridges(
        json!({"state": "ended", "sessionId": id.to_string(), "reason": reason.as_str()}),
    );
    if let Some(r) = &route.recorder {
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

/// Per-session reader state.
struct Reader<'a> {
    route: &'a Arc<Route>,
    session: &'a SessionInfo,
    parser: Parser,
    records: Vec<RecMsg>,
    touched: Vec<Arc<Outbox>>,
    channel_counters: Vec<metrics::Counter>,
    last_record_send: std::time::Instant,
    clock: BurstClock,
    /// Channels this session has used (the hub's table holds as many).
    channels: usize,
    /// Events published in this session: no channel's relay seq is larger.
    events: u64,
}

/// Arrival time for a burst of events: read once per [`BurstClock::EVERY`] events and after
/// every wait for the socket, so a burst read in one go shares one reading (reading the clock
/// per event was ~1.3% of the relay's CPU at full rate) and times never go backwards.
struct BurstClock {
    ns: u64,
    uses: u32,
}

impl BurstClock {
    const EVERY: u32 = 32;

    fn now(&mut self) -> u64 {
        if self.uses == 0 {
            self.ns = self.ns.max(now_ns());
        }
        self.uses = (self.uses + 1) % Self::EVERY;
        self.ns
    }

    /// The next reading is fresh (the reader waited).
    fn expire(&mut self) {
        self.uses = 0;
    }
}

async fn read_loop(route: &Arc<Route>, session: &SessionInfo, frames: &mut Frames) -> EndReason {
    let mut r = Reader {
        route,
        session,
        parser: Parser::new(),
        records: Vec::with_capacity(RECORD_BATCH),
        touched: Vec::new(),
        channel_counters: Vec::new(),
        last_record_send: std::time::Instant::now(),
        clock: BurstClock { ns: 0, uses: 0 },
        channels: 0,
        events: 0,
    };
    let mut since_flush = 0usize;
    loop {
        let next = match frames.next().now_or_never() {
            Some(n) => n,
            None => {
                r.flush(false).await;
                // Wait for the socket; lingering recorder messages go out after RECORD_LINGER.
                loop {
                    tokio::select! {
                        biased;
                        _ = route.cancel.cancelled() => {
                            r.flush(true).await;
                            return EndReason::RelayShutdown;
                        }
                        n = frames.next() => {
                            r.clock.expire();
                            break n;
                        }
                        _ = tokio::time::sleep(RECORD_LINGER), if !r.records.is_empty() => r.flush(true).await,
                    }
                }
            }
        };
        match next {
            Some(Ok(frame)) => {
                r.on_frame(frame.body).await;
                since_flush += 1;
                if since_flush >= WAKE_EVERY || r.records.len() >= RECORD_BATCH {
                    r.flush(false).await;
                    since_flush = 0;
                    // A mod that never pauses never reaches the select below: shutdown is
                    // checked here too.
                    if route.cancel.is_cancelled() {
                        r.flush(true).await;
                        return EndReason::RelayShutdown;
                    }
                }
            }
            Some(Err(e)) => {
                r.flush(true).await;
                tracing::warn!(route = %route.cfg.name, error = %e, "mod connection broken");
                return EndReason::ModGone;
            }
            None => {
                r.flush(true).await;
                return EndReason::Clean;
            }
        }
    }
}

impl Reader<'_> {
    /// Wakes touched writers; sends recorder messages when `force`d, when the batch is full, or
    /// once they have lingered long enough.
    async fn flush(&mut self, force: bool) {
        for o in self.touched.drain(..) {
            crate::bridge::write_from_reader(self.route, &o);
        }
        let due = force
            || self.records.len() >= RECORD_BATCH
            || self.last_record_send.elapsed() >= RECORD_LINGER;
        if let Some(rec) = &self.route.recorder {
            if !self.records.is_empty() && due {
                self.last_record_send = std::time::Instant::now();
                rec.send_batch(std::mem::replace(
                    &mut self.records,
                    Vec::with_capacity(RECORD_BATCH),
                ))
                .await;
            }
        } else {
            self.records.clear();
        }
    }

    fn record(&mut self, rec: FrameRecord) {
        if self.route.recorder.is_some() {
            self.records.push(RecMsg::Frame {
                session: self.session.id,
                rec,
            });
        }
    }

    fn anomaly(&mut self, body: Bytes, json_ok: bool, why: &str) {
        self.route.metrics.anomalies.increment(1);
        tracing::debug!(route = %self.route.cfg.name, why, "unroutable frame from the mod");
        if self.route.recorder.is_some() {
            self.records.push(RecMsg::Anomaly {
                session: self.session.id,
            });
        }
        self.record(FrameRecord::message(
            Direction::ModToRelay,
            0,
            now_ns(),
            json_ok,
            body,
        ));
    }

    async fn on_frame(&mut self, body: Bytes) {
        let route = self.route;
        route.metrics.mod_in.increment(1);
        let view = match self.parser.parse(&body, Mode::Tolerant) {
            Ok(v) => v,
            Err(e) => {
                // Non-finite numbers and lone surrogates break the same rule as bad grammar:
                // no peer downstream could decode the frame.
                let json_ok = !matches!(
                    e,
                    gabp_proto::EnvelopeError::InvalidJson
                        | gabp_proto::EnvelopeError::InvalidUtf8
                        | gabp_proto::EnvelopeError::NonFiniteNumber
                        | gabp_proto::EnvelopeError::LoneSurrogate
                );
                let why = e.to_string();
                return self.anomaly(body, json_ok, &why);
            }
        };
        match view.kind {
            MsgType::Event => {
                let channel = view
                    .channel
                    .as_deref()
                    .expect("tolerant events have a channel");
                // The relay's seq can be longer than the mod's (or added where the mod sent
                // none): an event that might then exceed --max-body is refused, so no peer
                // with the same limit is ever sent a frame it must refuse. The seq is bounded
                // by the session's event count, which bounds its digits.
                let mut digits = [0u8; 20];
                let seq_len = gabp_proto::rewrite::decimal(self.events, &mut digits).len();
                let sequenced = match &view.seq_span {
                    Some(span) => body.len() - span.len().min(body.len()) + seq_len,
                    None => body.len() + ",\"seq\":".len() + seq_len,
                };
                if sequenced > route.cfg.max_body {
                    return self.anomaly(
                        body,
                        true,
                        "event too large to forward once the relay's seq is written",
                    );
                }
                if self.channels >= MAX_CHANNELS && !route.hub.knows(channel) {
                    return self.anomaly(body, true, "event on a channel past the session's limit");
                }
                let p = route.hub.publish(channel, &body, view.seq_span.clone());
                self.events += 1;
                let cid = p.channel_id as usize;
                if p.new_channel {
                    self.channels += 1;
                    if route.recorder.is_some() {
                        self.records.push(RecMsg::Channel {
                            session: self.session.id,
                            id: p.channel_id,
                            name: channel.to_string(),
                        });
                    }
                    if self.channel_counters.len() <= cid {
                        self.channel_counters
                            .resize(cid + 1, metrics::Counter::noop());
                    }
                    self.channel_counters[cid] = route.metrics.channel_events(channel);
                }
                if let Some(c) = self.channel_counters.get(cid) {
                    c.increment(1);
                }
                let mod_seq = view.seq;
                let time_ns = self.clock.now();
                self.record(FrameRecord {
                    dir: Direction::ModToRelay,
                    conn: 0,
                    time_ns,
                    channel: Some(p.channel_id),
                    mod_seq,
                    relay_seq: Some(p.event.seq),
                    json_ok: true,
                    body: body.clone(),
                });
                for (conn, outbox) in p.subscribers.iter() {
                    self.offer(*conn, outbox, &p.event).await;
                }
            }
            MsgType::Response => {
                let Some(upstream_id) = view.id.as_deref().and_then(|s| Uuid::parse_str(s).ok())
                else {
                    return self.anomaly(body, true, "response without a relay id");
                };
                let Some(entry) = route.pending.take(&upstream_id) else {
                    return self.anomaly(body, true, "response to an unknown or expired request");
                };
                let outcome = if view.is_error() { "error" } else { "ok" };
                let (latency, count) = route.metrics.request(&entry.method, outcome);
                latency.record(entry.sent.elapsed().as_secs_f64());
                count.increment(1);
                match &entry.origin {
                    Origin::Bridge {
                        conn,
                        outbox,
                        bridge_id,
                        ..
                    } => {
                        let wire = response_wire(
                            &body,
                            view.id_span.clone().expect("responses have an id"),
                            bridge_id,
                        );
                        outbox.push_control(wire);
                        let conn = *conn;
                        // A mod may echo a bridge's arguments: no secret is recorded.
                        let body = crate::auth::redact(&body, &route.cfg.secrets());
                        self.record(FrameRecord::message(
                            Direction::ModToRelay,
                            conn,
                            now_ns(),
                            true,
                            body,
                        ));
                    }
                    Origin::Relay => {
                        if view.is_error() {
                            tracing::warn!(route = %route.cfg.name, method = %entry.method, "mod refused the relay's request: {}", String::from_utf8_lossy(&body));
                        }
                        self.record(FrameRecord::message(
                            Direction::ModToRelay,
                            0,
                            now_ns(),
                            true,
                            body,
                        ));
                    }
                }
            }
            MsgType::Request => self.anomaly(body, true, "the mod sent a request"),
        }
    }

    async fn offer(
        &mut self,
        conn: u32,
        outbox: &Arc<Outbox>,
        event: &Arc<crate::outbox::EventFrame>,
    ) {
        loop {
            match outbox.offer(event) {
                Offer::Queued => {}
                Offer::QueuedAfterDrop(n) => self.route.metrics.dropped.increment(n),
                Offer::Full => {
                    // Block policy: let every writer drain, then wait for this one.
                    for o in self.touched.drain(..) {
                        o.wake();
                    }
                    tokio::select! {
                        _ = outbox.space() => continue,
                        _ = self.route.cancel.cancelled() => return,
                    }
                }
                Offer::Disconnected => {
                    tracing::info!(route = %self.route.cfg.name, conn, "bridge disconnected: its outbox is full (policy disconnect)");
                    self.route.metrics.dropped.increment(1);
                }
                Offer::Closed => {}
            }
            break;
        }
        if outbox.mark_for_wake() {
            self.touched.push(outbox.clone());
        }
    }
}

/// The wire frame of a mod response with the bridge's id put back (in place when the lengths
/// agree, which they do for UUID ids).
fn response_wire(body: &[u8], id_span: std::ops::Range<usize>, bridge_id: &str) -> Bytes {
    if id_span.len() == bridge_id.len() + 2 {
        let mut out = BytesMut::with_capacity(body.len() + 64);
        encode_header(body.len(), &mut out);
        let at = out.len();
        out.extend_from_slice(body);
        gabp_proto::rewrite::rewrite_id_in_place(&mut out[at..], id_span, bridge_id.as_bytes());
        out.freeze()
    } else {
        gabp_proto::frame_bytes(&gabp_proto::rewrite::with_id(body, id_span, bridge_id))
    }
}
