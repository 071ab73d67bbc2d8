//! A route's shared state: the current session, the hub, pending requests, bridges.
//!
//! The route's backend (the live mod or a recording, see `crate::upstream`) publishes the
//! session through a `watch` channel; bridge tasks read it to forward requests and wait on it
//! during `session/hello`.
//! Everything here is shared behind short, synchronous locks that are never held across an
//! `.await`.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use gabp_proto::{frame_bytes, message, ErrorCode};
use gabp_storage::{BridgeInfo, Direction, FrameRecord};
use parking_lot::Mutex;
use serde_json::{json, Value};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::auth::FailureThrottle;
use crate::config::RouteConfig;
use crate::hub::Hub;
use crate::metrics::RouteMetrics;
use crate::outbox::Outbox;
use crate::pending::{Entry, Origin, Pending};
use crate::recorder::{RecMsg, Recorder};

pub mod backend;
pub mod lease;

pub use backend::{Backend, PlaybackRefusal, Refusal, Request, NOT_A_REPLAY, PLAYBACK};

/// The relay's version, reported in welcomes and status.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// One connection epoch with the mod.
#[derive(Debug)]
pub struct SessionInfo {
    /// The session id (UUID v7).
    pub id: Uuid,
    /// The mod's welcome result, whole.
    pub welcome: Value,
    /// The same, as the mod wrote it: what bridges are welcomed with, the relay's extension set
    /// in it byte for byte ([`gabp_proto::splice`]).
    pub welcome_result: Bytes,
    /// Channels the mod advertised.
    pub advertised: Vec<String>,
    /// When the welcome arrived (ns since epoch).
    pub started_ns: u64,
    /// Bodies to the mod (`None` for a recorded session: nothing is sent anywhere).
    pub upstream: Option<mpsc::Sender<Bytes>>,
    /// `advertised` as a set: a bridge leaving many channels asks once per channel.
    advertised_set: rustc_hash::FxHashSet<String>,
    /// Marks taken in this session (bounded by the route's `max_marks`).
    marks: std::sync::atomic::AtomicU32,
    /// Bytes of refused and invalid bridge frames recorded in this session, with their
    /// count (the high 16 bits): bounded by [`REFUSALS_RECORDED`], whatever the connections.
    refusals: AtomicU64,
}

/// What one session records of refused and invalid bridge frames, all bridges and
/// connections together: 1,024 frames or 16 MiB, whichever comes first. Later ones are
/// answered and counted, not recorded, so refusals cannot fill the disk by reconnecting.
pub const REFUSALS_RECORDED: (u64, u64) = (1024, 16 << 20);

impl SessionInfo {
    /// A session with the channels the mod advertised (already de-duplicated and capped).
    pub fn new(
        id: Uuid,
        welcome: Value,
        welcome_result: Bytes,
        advertised: Vec<String>,
        started_ns: u64,
        upstream: Option<mpsc::Sender<Bytes>>,
    ) -> SessionInfo {
        SessionInfo {
            id,
            welcome,
            welcome_result,
            advertised_set: advertised.iter().cloned().collect(),
            marks: Default::default(),
            refusals: Default::default(),
            advertised,
            started_ns,
            upstream,
        }
    }

    /// Takes one of the session's `most` marks; false when all are taken.
    pub fn take_mark(&self, most: u32) -> bool {
        self.marks
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < most).then_some(n + 1)
            })
            .is_ok()
    }

    /// Takes room to record a refused or invalid frame of `len` bytes (and its answer);
    /// false when the session's [`REFUSALS_RECORDED`] are spent.
    pub fn take_refusal_room(&self, len: usize) -> bool {
        let (frames, bytes) = REFUSALS_RECORDED;
        self.refusals
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                let (n, b) = (v >> 48, v & ((1 << 48) - 1));
                let b = b + len as u64;
                (n < frames && b <= bytes).then_some(((n + 1) << 48) | b)
            })
            .is_ok()
    }

    /// Whether the mod advertised `channel` in this session.
    pub fn advertises(&self, channel: &str) -> bool {
        self.advertised_set.contains(channel)
    }
}

/// A connected bridge.
#[derive(Debug)]
pub struct BridgeState {
    /// Its connection number.
    pub conn: u32,
    /// Its outbox.
    pub outbox: Arc<Outbox>,
    /// Where it connected from.
    pub peer: String,
    /// Its hello, once it succeeded.
    pub info: Mutex<Option<BridgeInfo>>,
    /// Channels it subscribes to.
    pub subs: Mutex<BTreeSet<String>>,
    /// Requests it has in flight.
    pub in_flight: Arc<AtomicUsize>,
    /// Its identity (once welcomed) and its refusal counters.
    pub access: crate::identity::BridgeAccess,
    /// Welcomed with `relay.withoutMod` (`gabp-relay status`): it may ask only `relay/status`,
    /// and nothing of it (frames, attach, detach) is recorded.
    pub relay_only: std::sync::atomic::AtomicBool,
    /// Bad frames answered but not recorded (past the first few a connection may record).
    pub bad_unrecorded: AtomicU64,
}

impl BridgeState {
    /// What the recording keeps of this bridge as it leaves: its hello's details with its
    /// drop and unrecorded bad-frame counts, detached now. `None` before a successful hello,
    /// or for a relay-only bridge (never recorded).
    pub fn leaving_info(&self) -> Option<BridgeInfo> {
        if self.relay_only.load(Ordering::Relaxed) {
            return None;
        }
        let mut info = self.info.lock().clone()?;
        info.detached_ns = Some(gabp_rt::clock::now_ns());
        info.dropped = self.outbox.dropped();
        info.unrecorded_bad_frames = self.bad_unrecorded.load(Ordering::Relaxed);
        (info.denied, info.rate_limited, info.lease_refused) = self.access.counts();
        Some(info)
    }
}

/// A route.
#[derive(Debug)]
pub struct Route {
    /// Its configuration.
    pub(crate) cfg: RouteConfig,
    /// What stands behind the front: the live mod or a recording.
    pub(crate) backend: Arc<dyn Backend>,
    /// Routing state.
    pub(crate) hub: Hub,
    /// Forwarded requests awaiting answers.
    pub(crate) pending: Pending,
    /// The current session, if the mod is connected.
    pub(crate) session: watch::Sender<Option<Arc<SessionInfo>>>,
    /// The recorder, unless recording is off.
    pub(crate) recorder: Option<Recorder>,
    /// Connected bridges.
    pub(crate) bridges: Mutex<HashMap<u32, Arc<BridgeState>>>,
    /// Channels the relay is subscribed to upstream in the current session.
    pub(crate) upstream_channels: Mutex<HashSet<String>>,
    /// Metric handles.
    pub(crate) metrics: RouteMetrics,
    /// Failed-hello throttle.
    pub(crate) throttle: FailureThrottle,
    /// Cancelled at shutdown.
    pub(crate) cancel: CancellationToken,
    /// When the shutdown must be done by (set just before `cancel`): what bridges may still
    /// take to leave is cut to fit it.
    pub(crate) stop_by: std::sync::OnceLock<std::time::Instant>,
    /// The launch id the relay presents to the mod.
    pub(crate) launch_id: String,
    /// Bridge identities (replaced on reload).
    pub(crate) access: crate::identity::RouteAccess,
    /// The controller lease.
    pub(crate) lease: crate::route::lease::Lease,
    next_conn: AtomicU32,
    /// Seq of the route's `relay/session` channel.
    session_notices: std::sync::atomic::AtomicU64,
}

impl Route {
    /// A route with no session yet.
    pub fn new(
        cfg: RouteConfig,
        recorder: Option<Recorder>,
        cancel: CancellationToken,
        backend: Arc<dyn Backend>,
    ) -> Arc<Route> {
        let metrics = RouteMetrics::new(&cfg.name);
        let recorder = if cfg.record { recorder } else { None };
        let hub = Hub::with_window(cfg.resume_window_frames, cfg.resume_window_bytes);
        let access = crate::identity::RouteAccess::new(cfg.access_table());
        Arc::new(Route {
            access,
            lease: Default::default(),
            cfg,
            backend,
            hub,
            pending: Pending::default(),
            session: watch::channel(None).0,
            recorder,
            bridges: Mutex::new(HashMap::new()),
            upstream_channels: Mutex::new(HashSet::new()),
            metrics,
            throttle: FailureThrottle::default(),
            cancel,
            stop_by: std::sync::OnceLock::new(),
            launch_id: Uuid::new_v4().to_string(),
            next_conn: AtomicU32::new(1),
            session_notices: std::sync::atomic::AtomicU64::new(0),
        })
    }

    /// A fresh bridge connection number.
    pub fn next_conn(&self) -> u32 {
        self.next_conn.fetch_add(1, Ordering::Relaxed)
    }

    /// The current session.
    pub fn current(&self) -> Option<Arc<SessionInfo>> {
        self.session.borrow().clone()
    }

    /// Its configuration, as it started (a reload changes only [`Route::access`]).
    pub fn cfg(&self) -> &RouteConfig {
        &self.cfg
    }

    /// Its bridge identities, replaced on reload.
    pub fn access(&self) -> &crate::identity::RouteAccess {
        &self.access
    }

    /// Follows the route's session: the current one, then each change (a new session, or none
    /// while the mod is away).
    pub fn sessions(&self) -> watch::Receiver<Option<Arc<SessionInfo>>> {
        self.session.subscribe()
    }

    /// Makes `session` the current one, as a backend does when its mod welcomed the relay.
    pub fn set_session(&self, session: Option<Arc<SessionInfo>>) {
        self.session.send_replace(session);
    }

    /// The bridges connected now.
    pub fn bridges(&self) -> Vec<Arc<BridgeState>> {
        self.bridges.lock().values().cloned().collect()
    }

    /// Events the mod has published in the current session, per channel.
    pub fn events_per_channel(&self) -> Vec<(String, u64)> {
        self.hub.channel_counts()
    }

    /// Forwarded requests awaiting the mod's answers.
    pub fn pending(&self) -> &Pending {
        &self.pending
    }

    /// Counts a failed authentication from `source` (an IP address) on any of the route's
    /// fronts, and says how long to wait before answering it.
    pub fn auth_failed(&self, source: &str) -> std::time::Duration {
        self.metrics.auth_failures.increment(1);
        self.throttle.fail(source)
    }

    /// Forgets `source`'s failed authentications once it presented a valid token.
    pub fn auth_succeeded(&self, source: &str) {
        self.throttle.succeed(source);
    }

    /// `body` as it may be recorded: every secret of the route replaced (see `auth`). Every
    /// frame the relay records passes here or through the mod reader's own record, the relay's
    /// own frames too: they carry names a bridge chose (channels, methods, request ids).
    pub fn redacted(&self, body: &Bytes) -> Bytes {
        self.access.table().redactor().redact(body)
    }

    /// The latency histogram and the outcome counter of `method`, whose label is never a name
    /// holding a secret.
    pub fn request_metrics(
        &self,
        method: &str,
        outcome: &'static str,
    ) -> (metrics::Histogram, metrics::Counter) {
        self.metrics
            .request(method, outcome, |m| self.access.table().redactor().hits(m))
    }

    /// Records a frame in `session`, if recording, redacted.
    pub async fn record(&self, session: Uuid, mut rec: FrameRecord) {
        if let Some(r) = &self.recorder {
            rec.body = self.redacted(&rec.body);
            r.send(RecMsg::Frame { session, rec }).await;
        }
    }

    /// Records a frame in the current session, if any, redacted; returns whether a failing
    /// recorder (policy `stall`) held it first.
    pub async fn record_current(
        &self,
        dir: Direction,
        conn: u32,
        body: Bytes,
        json_ok: bool,
    ) -> bool {
        if let (Some(r), Some(s)) = (&self.recorder, self.current()) {
            let body = self.redacted(&body);
            let rec = FrameRecord::message(dir, conn, gabp_rt::clock::now_ns(), json_ok, body);
            return r.send(RecMsg::Frame { session: s.id, rec }).await;
        }
        false
    }

    /// Why this route's recorder holds the mod now (a failing disk under `stall`), if it does.
    pub fn recording_held(&self) -> Option<String> {
        self.recorder.as_ref().and_then(|r| r.holding())
    }

    /// Records a frame in the current session, redacted, without ever waiting (see
    /// `Recorder::send_detached`).
    pub fn record_current_detached(&self, dir: Direction, conn: u32, body: Bytes) {
        if let Some(s) = self.current() {
            self.record_detached_in(s.id, dir, conn, body);
        }
    }

    /// Records a reply the relay wrote to a bridge in `session`, if that is still the session
    /// being recorded, without ever waiting.
    pub fn record_reply_detached(&self, session: Uuid, conn: u32, body: Bytes) {
        if self.current().is_some_and(|s| s.id == session) {
            self.record_detached_in(session, Direction::RelayToBridge, conn, body);
        }
    }

    fn record_detached_in(&self, session: Uuid, dir: Direction, conn: u32, body: Bytes) {
        if let Some(r) = &self.recorder {
            let body = self.redacted(&body);
            let rec = FrameRecord::message(dir, conn, gabp_rt::clock::now_ns(), true, body);
            r.send_detached(RecMsg::Frame { session, rec });
        }
    }

    /// Sends a reply the relay wrote itself to a bridge, and records it.
    pub async fn reply(&self, bridge: &BridgeState, body: Bytes) {
        bridge.outbox.push_control(frame_bytes(&body));
        self.record_current(Direction::RelayToBridge, bridge.conn, body, true)
            .await;
    }

    /// Sends an error reply to a bridge.
    pub async fn reply_error(
        &self,
        bridge: &BridgeState,
        id: Option<&str>,
        code: ErrorCode,
        msg: &str,
    ) {
        self.reply(bridge, message::error_response(id, code, msg, None))
            .await;
    }

    /// Sends the relay's own request to the mod (subscriptions), tracked so the answer is
    /// recognised.
    pub async fn send_internal(&self, session: &SessionInfo, method: &str, params: Value) {
        let Some(upstream) = &session.upstream else {
            return;
        };
        let id = Uuid::new_v4();
        let body = message::request(&id.to_string(), method, params);
        // Recorded before the mod can have it, as a bridge's request is (`upstream::live`).
        self.record(
            session.id,
            FrameRecord::message(
                Direction::RelayToMod,
                0,
                gabp_rt::clock::now_ns(),
                true,
                body.clone(),
            ),
        )
        .await;
        let now = Instant::now();
        self.pending.insert(
            id,
            Entry {
                session: session.id,
                origin: Origin::Relay,
                method: method.into(),
                sent: now,
                deadline: now + self.cfg.request_timeout,
            },
        );
        // A mod gone meanwhile: the session ends and answers nobody (this is the relay's own).
        let _ = upstream.send(body).await;
    }

    /// Sends a `relay/session` notice to every bridge that subscribes to anything, in order with
    /// the events around it (so "ended" follows the session's last event and "started" precedes
    /// the next session's first).
    pub fn notify_bridges(&self, payload: Value) {
        let listeners = self.session_listeners();
        self.notify(&listeners, payload);
    }

    /// The outboxes of the bridges that subscribe to anything now: the bridges a session
    /// notice is for, taken before a new session is published and told after it, so that a
    /// bridge told "started" finds the session there (and one welcomed into it is not told).
    pub fn session_listeners(&self) -> Vec<Arc<Outbox>> {
        self.bridges
            .lock()
            .values()
            .filter(|b| !b.subs.lock().is_empty())
            .map(|b| b.outbox.clone())
            .collect()
    }

    /// Sends a `relay/session` notice to `listeners`.
    pub fn notify(&self, listeners: &[Arc<Outbox>], payload: Value) {
        let notice = self.session_notice(payload);
        for outbox in listeners {
            outbox.push_notice(notice.clone());
        }
    }

    /// A `relay/session` notice, numbered on the route's `relay/session` channel.
    pub fn session_notice(&self, payload: Value) -> Arc<crate::outbox::EventFrame> {
        let seq = self.session_notices.fetch_add(1, Ordering::Relaxed);
        let body = message::event("relay/session", seq, payload);
        Arc::new(crate::outbox::EventFrame {
            channel: Arc::from("relay/session"),
            seq,
            wire: frame_bytes(&body),
            keep: true,
        })
    }

    /// The `relay/status` result.
    pub fn status(&self) -> Value {
        let session = self.current().map(|s| {
            json!({
                "id": s.id.to_string(),
                "state": "connected",
                // Only the strings: the mod's own values nested in this answer could take it
                // past what serde_json reads (MAX_DEPTH), and no mod may break `status`.
                "agentId": s.welcome.get("agentId").filter(|v| v.is_string()),
                "app": {
                    "name": s.welcome["app"].get("name").filter(|v| v.is_string()),
                    "version": s.welcome["app"].get("version").filter(|v| v.is_string()),
                },
                "startedNs": s.started_ns,
                "channels": self.hub.channel_counts().into_iter().map(|(c, n)| json!({"channel": c, "events": n})).collect::<Vec<_>>(),
            })
        });
        let lease = self.lease.status();
        let mut bridges: Vec<Value> = self
            .bridges
            .lock()
            .values()
            .map(|b| {
                let depth = b.outbox.depth();
                let info = b.info.lock().clone().unwrap_or_default();
                let (denied, limited, lease_refused) = b.access.counts();
                json!({
                    "conn": b.conn,
                    "name": info.name,
                    "label": info.label,
                    "role": b.access.role(),
                    "denied": denied,
                    "rateLimited": limited,
                    "leaseRefused": lease_refused,
                    "peer": b.peer,
                    "bridgeVersion": info.bridge_version,
                    "platform": info.platform,
                    "launchId": info.launch_id,
                    "subscriptions": b.subs.lock().iter().cloned().collect::<Vec<_>>(),
                    "queueEvents": depth.events,
                    "queueBytes": depth.event_bytes,
                    "queueControl": depth.controls,
                    "queueControlBytes": depth.control_bytes,
                    "queueNotices": depth.notices,
                    "queueNoticeBytes": depth.notice_bytes,
                    // Taken by its writer, not yet accepted by its socket.
                    "unwrittenBytes": depth.unwritten,
                    "dropped": b.outbox.dropped(),
                    "delivered": b.outbox.delivered(),
                    "pending": b.in_flight.load(Ordering::Relaxed),
                    "policy": b.outbox.policy().as_str(),
                })
            })
            .collect();
        bridges.sort_by_key(|b| b["conn"].as_u64());
        let window = self.hub.window_size();
        let mut status = json!({
            "relay": { "name": "gabp-relay", "version": VERSION },
            "route": self.cfg.name,
            "upstream": self.backend.describe(&self.cfg),
            "listen": self.cfg.listen.to_string(),
            "recording": self.recorder.is_some(),
            "recorderLag": self.recorder.as_ref().map(|r| r.lag()),
            "recorderLagBytes": self.recorder.as_ref().map(|r| r.lag_bytes()),
            "recorderHealth": self.recorder.as_ref().map(|r| r.health()),
            "ship": self.recorder.as_ref().and_then(|r| r.ship()),
            "session": session,
            "policy": { "onSlow": self.cfg.on_slow.as_str(), "outboxFrames": self.cfg.outbox_frames, "outboxBytes": self.cfg.outbox_bytes },
            "pendingRequests": self.pending.len(),
            "resumeWindow": { "events": window.0, "bytes": window.1, "maxEvents": self.cfg.resume_window_frames, "maxBytes": self.cfg.resume_window_bytes },
            "lease": lease,
            "reload": self.access.reload_status(),
            "bridges": bridges,
        });
        // Names bridges chose (subscriptions, channels, their hello's strings) may spell a
        // token, and an observer reads this answer: secrets are replaced wherever they stand,
        // those a reload added since a name was taken in too.
        self.access.table().redactor().redact_json(&mut status);
        status
    }
}
