//! Reading one bridge: strict parsing, the frame timeout, the pre-hello limits, and what the
//! relay answers itself (`events/*`, `relay/*`); every other request goes to the route's
//! backend. Nothing is recorded before a successful hello.

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use gabp_proto::{frame_bytes, message, ErrorCode, GabpCodec, Mode, MsgType, Parser};
use gabp_rt::clock::now_ns;
use gabp_storage::Direction;
use serde_json::{json, Value};
use tokio_util::codec::FramedRead;

use super::gate::Slot;
use super::MAX_PREHELLO_ERRORS;
use crate::auth;
use crate::pending::ByteBudget;
use crate::route::Request;
use crate::route::{BridgeState, Route};
use gabp_rt::log_budget::LogBudget;

/// Relay replies a bridge may leave unread before the relay stops reading its requests (a
/// bridge that never reads is then cut by the write deadline, never queued without bound).
const CONTROL_PAUSE: usize = 1 << 20;
/// Bad frames recorded per connection (with their error replies); later ones are only counted,
/// so a client that sends garbage cannot fill the disk.
const MAX_BAD_RECORDED: u32 = 16;
/// A read buffer grown past this by one big frame is given back once empty.
const READ_BUFFER_KEEP: usize = 1 << 20;
/// How long a bridge's reader works through frames already buffered before it lets the other
/// tasks on its worker thread run.
const FAIR_SLICE: Duration = Duration::from_millis(1);
/// Connections closed for saying no hello, or for a frame left unfinished, in time: any peer
/// can cause these, so they are logged on a budget.
static NO_HELLO: LogBudget = LogBudget::new(10);
static PARTIAL: LogBudget = LogBudget::new(10);

/// One bridge's reading side and its conversation state.
pub(super) struct BridgeReader {
    pub(super) route: Arc<Route>,
    pub(super) bridge: Arc<BridgeState>,
    parser: Parser,
    pub(super) authed: bool,
    /// Frames refused before a successful hello.
    prehello_errors: u32,
    /// Bad frames recorded so far.
    bad_recorded: u32,
    /// Set when the connection must close after the reply just queued.
    pub(super) done: bool,
    /// This connection's place in the route's gate (pre-hello bound, then bridge cap).
    pub(super) slot: Slot,
    /// Bytes of this bridge's forwarded requests still held by the relay.
    budget: Arc<ByteBudget>,
    /// When the time to be welcomed started: the connection, or the answer to a hello that
    /// failed because the mod was unavailable (the bridge may say hello again).
    pub(super) welcome_clock: Instant,
    /// Whether a hello was answered on this connection: closing it for want of a welcome
    /// then sends nothing more (every request has had its one answer).
    pub(super) hello_answered: bool,
}

/// The route's secrets at one moment (the identity table is replaced on reload).
pub(super) struct Secrets(Arc<crate::identity::Table>);

impl Secrets {
    /// As redaction takes them.
    pub(super) fn list(&self) -> Vec<&str> {
        self.0.secrets()
    }
}

/// The id of a rejected frame, if it can be read at all (so the error can be matched).
fn lenient_id(body: &[u8]) -> Option<String> {
    // Read loosely: the body failed the strict parse, maybe after its id (a non-finite number,
    // nesting too deep), and the bridge still needs to know which request failed.
    let scan = gabp_proto::scan::LooseScan::of(&["id"], body);
    scan.values(0).last().filter(|id| id.len() <= 64).cloned()
}

/// The method of a request that failed the strict parse (in its params), read loosely.
fn lenient_method(body: &[u8]) -> Option<String> {
    let scan = gabp_proto::scan::LooseScan::of(&["method"], body);
    scan.values(0).last().filter(|m| m.len() <= 128).cloned()
}

/// Channel names from subscribe params, de-duplicated in order: `None` if more than `cap`
/// distinct ones are named (it stops at the first past the cap; a long list of repeats costs
/// O(n), n bounded by `--max-body`).
fn channels(params: &Value, cap: usize) -> Option<Vec<String>> {
    let list = params["channels"].as_array().map_or(&[][..], |a| &a[..]);
    // A name repeated in one request counts once (the frame's size bounds the list).
    let mut seen: HashSet<&str> = HashSet::new();
    let mut out = Vec::new();
    for c in list.iter().filter_map(Value::as_str) {
        if seen.insert(c) {
            if out.len() == cap {
                return None;
            }
            out.push(c.to_string());
        }
    }
    Some(out)
}

impl BridgeReader {
    /// A reader for a bridge that has not said hello yet.
    pub(super) fn new(
        route: Arc<Route>,
        bridge: Arc<BridgeState>,
        budget: Arc<ByteBudget>,
        slot: Slot,
    ) -> BridgeReader {
        BridgeReader {
            route,
            bridge,
            parser: Parser::new(),
            authed: false,
            prehello_errors: 0,
            bad_recorded: 0,
            done: false,
            slot,
            budget,
            welcome_clock: Instant::now(),
            hello_answered: false,
        }
    }

    pub(super) async fn run(&mut self, read: gabp_rt::net::BoxRead) {
        let route = self.route.clone();
        let outbox = self.bridge.outbox.clone();
        let timeout = route.cfg.frame_timeout;
        let pause = CONTROL_PAUSE.min(route.cfg.outbox_bytes / 4).max(1);
        let mut frames =
            FramedRead::with_capacity(read, GabpCodec::new(route.cfg.max_body), 64 * 1024);
        self.welcome_clock = Instant::now();
        let mut tick = tokio::time::interval((timeout / 4).max(Duration::from_millis(10)));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut partial_since: Option<Instant> = None;
        let mut busy_since: Option<Instant> = None;
        loop {
            // A bridge whose frames are queued back to back (heavy ones cost milliseconds to
            // check) must not keep a worker thread from every other bridge: after a slice of
            // work on what is buffered, the others' tasks run. (Reading the socket is already
            // budgeted by tokio; an empty buffer means the next frame is read from it.)
            if frames.read_buffer().is_empty() {
                busy_since = None;
            } else if busy_since.get_or_insert_with(Instant::now).elapsed() > FAIR_SLICE {
                tokio::task::yield_now().await;
                busy_since = None;
            }
            // At shutdown, frames already buffered are not taken on: the session is ending,
            // and a request read now could be neither forwarded nor recorded.
            if self.done || route.cancel.is_cancelled() {
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
                    if !self.authed && now.duration_since(self.welcome_clock) > timeout {
                        if let Some(earlier_unlogged) = NO_HELLO.admit() {
                            tracing::info!(peer = %self.bridge.peer, earlier_unlogged, "closing bridge: not welcomed within {timeout:?} (no session/hello, or none that succeeded)");
                        }
                        if self.hello_answered {
                            // Its hello has its answer; a second, unasked one would only
                            // confuse it.
                            return;
                        }
                        return self.reply_error(None, ErrorCode::NoSession, "not welcomed in time (no successful session/hello); closing").await;
                    }
                    if frames.read_buffer().is_empty() {
                        partial_since = None;
                    } else if now.duration_since(*partial_since.get_or_insert(now)) > timeout {
                        if let Some(earlier_unlogged) = PARTIAL.admit() {
                            tracing::info!(peer = %self.bridge.peer, earlier_unlogged, "closing bridge: frame not completed within {timeout:?}");
                        }
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

    /// The secrets no recording may hold: every identity's token and the mod's.
    pub(super) fn secrets(&self) -> Secrets {
        Secrets(self.route.access.table())
    }

    /// Whether this bridge was welcomed relay-only (`relay.withoutMod`).
    fn relay_only(&self) -> bool {
        self.bridge.relay_only.load(Ordering::Relaxed)
    }

    /// Records a frame of this bridge's conversation, redacted; nothing is recorded before a
    /// successful hello (that traffic is only counted), nor for a relay-only bridge. Returns
    /// whether a failing recorder (policy `stall`) held it first.
    pub(super) async fn record(&self, dir: Direction, body: Bytes, json_ok: bool) -> bool {
        if !self.authed || self.relay_only() || self.route.recorder.is_none() {
            return false;
        }
        // Redacted there, as everything the relay records is.
        self.route
            .record_current(dir, self.bridge.conn, body, json_ok)
            .await
    }

    /// A welcomed bridge's frame while a failing recorder holds the mod (policy `stall`, a
    /// full disk): answered at once and not recorded, since recording is what is stalled.
    /// Waiting here would leave the bridge unanswered for as long as the disk stays full and
    /// then forward its request to the game long after it gave up. `relay/status` is
    /// answered as ever; anything else is refused -32000, not forwarded.
    fn refuse_while_held(&mut self, id: &str, method: &str, why: &str) {
        self.route.metrics.stall_refusals.increment(1);
        let answer = if method == "relay/status" {
            self.status_answer(id)
        } else {
            let msg = format!(
                "recording is stalled ({why}): the mod is held until it works again, and nothing reaches it unrecorded; {method} was not forwarded, send it again then"
            );
            message::error_response(Some(id), ErrorCode::ModUnavailable, &msg, None)
        };
        self.bridge.outbox.push_control(frame_bytes(&answer));
    }

    /// The answer to `relay/status` (or the error saying it does not fit `--max-body`).
    fn status_answer(&self, id: &str) -> Bytes {
        super::status::answer(id, self.route.status(), self.route.cfg.max_body).unwrap_or_else(
            || {
                message::error_response(
                    Some(id),
                    ErrorCode::TooLarge,
                    "the status does not fit in this relay's --max-body even with its lists left out; raise --max-body",
                    None,
                )
            },
        )
    }

    /// Queues a reply the relay wrote itself, and records it.
    pub(super) async fn reply(&mut self, body: Bytes) {
        if self.bridge.outbox.push_control(frame_bytes(&body)) {
            self.record(Direction::RelayToBridge, body, true).await;
        }
    }

    /// Sends an error reply (recorded). Before a successful hello, only a few are sent: then
    /// the connection closes.
    pub(super) async fn reply_error(&mut self, id: Option<&str>, code: ErrorCode, msg: &str) {
        self.error_reply(id, code, msg, true).await;
    }

    /// Sends an error reply with `error.data` (recorded).
    pub(super) async fn reply_error_data(
        &mut self,
        id: Option<&str>,
        code: ErrorCode,
        msg: &str,
        data: Option<Value>,
    ) {
        self.reply(message::error_response(id, code, msg, data))
            .await;
    }

    /// An error reply, recorded or not; before a successful hello it counts toward the
    /// strikes that close the connection.
    pub(super) async fn error_reply(
        &mut self,
        id: Option<&str>,
        code: ErrorCode,
        msg: &str,
        record: bool,
    ) {
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

    /// A frame refused at the bridge boundary: counted, answered, and recorded (redacted, with
    /// its reply) only among the connection's first [`MAX_BAD_RECORDED`]; later ones are
    /// counted for the recording instead, so garbage cannot fill the disk.
    async fn bad_frame(&mut self, body: &Bytes, id: Option<&str>, code: ErrorCode, msg: &str) {
        self.route.metrics.bad_frames.increment(1);
        let record =
            self.authed && self.bad_recorded < MAX_BAD_RECORDED && self.refusal_room(body.len());
        if self.authed && !record {
            self.bridge
                .bad_unrecorded
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        if record {
            self.bad_recorded += 1;
            let (rec, json_ok) = auth::redact_unparsed(body, &self.secrets().list());
            self.record(Direction::BridgeToRelay, rec, json_ok).await;
        }
        self.error_reply(id, code, msg, record).await;
    }

    /// Whether the session has room left to record a refused or invalid frame of `len` bytes
    /// (see [`crate::route::REFUSALS_RECORDED`]).
    fn refusal_room(&self, len: usize) -> bool {
        self.route
            .current()
            .is_some_and(|s| s.take_refusal_room(len))
    }

    /// Answers a request its bridge's rights refuse: the request and its answer are recorded
    /// while the session's budget for refusals lasts, then only counted.
    pub(super) async fn refused(
        &mut self,
        body: &Bytes,
        id: &str,
        (code, why, data): crate::route::lease::Refusal,
    ) {
        if self.refusal_room(body.len()) {
            self.record(Direction::BridgeToRelay, body.clone(), true)
                .await;
            self.reply_error_data(Some(id), code, &why, data).await;
        } else {
            self.bridge.bad_unrecorded.fetch_add(1, Ordering::Relaxed);
            let answer = message::error_response(Some(id), code, &why, data);
            self.bridge.outbox.push_control(frame_bytes(&answer));
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
                let id = lenient_id(&body);
                // A method the bridge's role may not call at all is refused as such, whatever
                // is wrong with its params: -32006 says more than -32602 would.
                let forbidden = (self.authed && e.code() == ErrorCode::InvalidParams)
                    .then(|| lenient_method(&body))
                    .flatten()
                    .and_then(|m| self.role_refusal(&m));
                if let Some(why) = forbidden {
                    return self
                        .bad_frame(&body, id.as_deref(), ErrorCode::Forbidden, &why)
                        .await;
                }
                return self
                    .bad_frame(&body, id.as_deref(), e.code(), &e.to_string())
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
            return self
                .bad_frame(
                    &body,
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
        if self.authed && self.over_rate(&id) {
            return;
        }
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
        if method == super::PING && !self.relay_only() {
            // Its rate was taken above, which is all it is for. Not recorded: it reads and
            // changes nothing, and a client polling its own buffer would fill the recording
            // with it; so it is answered while a failing recorder holds the mod too.
            let answer = message::result_response(&id, json!({}));
            self.bridge.outbox.push_control(frame_bytes(&answer));
            return;
        }
        if let Some(why) = route.recording_held().filter(|_| !self.relay_only()) {
            return self.refuse_while_held(&id, &method, &why);
        }
        if method == "relay/status" {
            // Queued before anything is recorded, so the status stays visible even if a
            // failing disk holds the recorder meanwhile; recorded request first, then its
            // answer, in the order they happened.
            let answer = self.status_answer(&id);
            let queued = self.bridge.outbox.push_control(frame_bytes(&answer));
            self.record(Direction::BridgeToRelay, body, true).await;
            if queued {
                self.record(Direction::RelayToBridge, answer, true).await;
            }
            return;
        }
        if self.relay_only() {
            return self
                .reply_error(
                    Some(&id),
                    ErrorCode::Forbidden,
                    "a relay-only bridge (relay.withoutMod) may send only relay/status",
                )
                .await;
        }
        let params_value = || -> Value {
            params
                .clone()
                .and_then(|p| serde_json::from_slice(&body[p]).ok())
                .unwrap_or(Value::Null)
        };
        if method == gabp_proto::mark::MARK && !self.admit_mark(&id, &body, &params_value()).await {
            return;
        }
        let answered_by_relay = method.starts_with("relay/") || method.starts_with("events/");
        // Playback controls are for bridges that may change things; anyone may ask the state.
        let controls_playback =
            method == crate::route::PLAYBACK && params_value()["action"] != "state";
        if !answered_by_relay || method == "relay/lease" || controls_playback {
            if let Some(refusal) = self.rights_refusal(&method, params_value) {
                return self.refused(&body, &id, refusal).await;
            }
        }
        let waited = Instant::now();
        let held = self
            .record(Direction::BridgeToRelay, body.clone(), true)
            .await;
        match method.as_str() {
            "events/subscribe" => self.subscribe(&id, &params_value()).await,
            "events/unsubscribe" => self.unsubscribe(&id, &params_value()).await,
            "relay/mark" => self.mark(&id, &params_value()).await,
            "relay/lease" => self.lease(&id, &params_value()).await,
            crate::route::PLAYBACK => self.playback(&id, params_value()).await,
            m if m.starts_with("relay/") => {
                self.reply_error(Some(&id), ErrorCode::MethodNotFound, "unknown relay method")
                    .await
            }
            _ if held => {
                // The recorder began failing as this request was read: it waited for the
                // disk, and the game may have moved on meanwhile. It is recorded; not sent.
                let msg = format!(
                    "{method} waited {:.1} s for a stalled recording and was not forwarded; send it again",
                    waited.elapsed().as_secs_f64()
                );
                route.metrics.stall_refusals.increment(1);
                self.reply_error(Some(&id), ErrorCode::ModUnavailable, &msg)
                    .await;
            }
            _ => {
                let req = Request {
                    bridge: &self.bridge,
                    id: &id,
                    id_span,
                    method: &method,
                    params,
                    body,
                    budget: &self.budget,
                };
                if let Err(no) = route.backend.request(&route, req).await {
                    self.reply_error(Some(&id), no.code, no.message).await;
                }
            }
        }
    }

    /// Whether a `relay/mark` may be taken: at most [`gabp_proto::mark::MAX_MARK_BYTES`] with a
    /// label, and within the session's `max_marks`. A malformed one is a bad frame (recorded
    /// only among the connection's first few); one past the session's bound is answered and
    /// counted, never recorded, so marks cannot fill the disk.
    async fn admit_mark(&mut self, id: &str, body: &Bytes, params: &Value) -> bool {
        if let Some(why) = gabp_proto::mark::mark_refusal(body.len(), params) {
            self.bad_frame(body, Some(id), ErrorCode::InvalidParams, &why)
                .await;
            return false;
        }
        let most = self.route.cfg.max_marks;
        match self.route.current() {
            Some(session) if !session.take_mark(most) => {
                self.bridge.bad_unrecorded.fetch_add(1, Ordering::Relaxed);
                let why = format!(
                    "this session has {most} marks, the most one session keeps (the route's max_marks); this mark was not kept"
                );
                let body = message::error_response(Some(id), ErrorCode::LimitExceeded, &why, None);
                self.bridge.outbox.push_control(frame_bytes(&body));
                false
            }
            _ => true,
        }
    }

    /// `relay/mark {label, data?}`: a point on the session's timeline (an episode's start or
    /// end, a reward, a test step). The request itself is the recorded mark (with its bridge
    /// and time); it is answered here and never reaches the mod. Its size and the session's
    /// count were checked before it was recorded ([`Self::admit_mark`]).
    async fn mark(&mut self, id: &str, params: &Value) {
        if self.route.current().is_none() && !self.relay_only() {
            // A mark lives in a session's recording: with no mod connected there is none, and
            // a mark answered but kept nowhere would be a silent loss.
            let why =
                "no session is being recorded (the mod is not connected); mark again once it is";
            return self
                .reply_error(Some(id), ErrorCode::ModUnavailable, why)
                .await;
        }
        let label = gabp_proto::mark::mark_label(params).unwrap_or_default();
        let answer = if self.route.recorder.is_none() {
            // Replay and `--no-record` keep nothing: the answer says so instead of confirming
            // a mark no export or report will ever show (not an error: a harness driving a
            // replay as it drives the live game goes on).
            let why = "nothing is recorded here (replay and --no-record record nothing), \
                       so the mark is kept nowhere";
            json!({"marked": false, "label": label, "tNs": now_ns(), "why": why})
        } else {
            json!({"marked": true, "label": label, "tNs": now_ns()})
        };
        self.reply(message::result_response(id, answer)).await;
    }

    /// `relay/replay {action, …}`: the backend's playback controls (its rights were checked
    /// before it was recorded); a live route says it is no replay.
    async fn playback(&mut self, id: &str, params: Value) {
        let route = self.route.clone();
        match route.backend.playback(&route, &self.bridge, params).await {
            Ok(state) => self.reply(message::result_response(id, state)).await,
            Err((code, why)) => self.reply_error(Some(id), code, &why).await,
        }
    }

    async fn subscribe(&mut self, id: &str, params: &Value) {
        let route = self.route.clone();
        // A name is held per subscription, listed by relay/status and sent on to the mod: one
        // a bridge invents is bounded in length; one the mod advertises is the mod's choice.
        let session = route.current();
        let invented_long = params["channels"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .any(|c| {
                c.len() > gabp_proto::params::MAX_CHANNEL_NAME
                    && !session.as_ref().is_some_and(|s| s.advertises(c))
            });
        if invented_long {
            return self
                .reply_error(
                    Some(id),
                    ErrorCode::InvalidParams,
                    "a channel name is longer than 256 bytes and not one the mod advertises",
                )
                .await;
        }
        let cap = self.subscription_cap();
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
        route.backend.subscribe(&route, &self.bridge, &chans).await;
        self.reply(message::result_response(id, json!({ "subscribed": chans })))
            .await;
        // After the reply is queued: a recorded timeline starts now, so its first event never
        // overtakes the answer to the subscribe that started it.
        route.backend.subscribed(&route, &self.bridge);
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
        route
            .backend
            .unsubscribe(&route, &self.bridge, &chans)
            .await;
        self.reply(message::result_response(
            id,
            json!({ "unsubscribed": chans }),
        ))
        .await;
    }
}

#[cfg(test)]
mod tests {
    use super::channels;
    use serde_json::json;

    #[test]
    fn a_name_repeated_in_one_request_counts_once_against_the_cap() {
        let p = json!({"channels": ["a", "a", "a", "a", "a", "b", "a"]});
        assert_eq!(channels(&p, 2), Some(vec!["a".into(), "b".into()]));
        assert_eq!(
            channels(&json!({"channels": vec!["a"; 100]}), 1),
            Some(vec!["a".into()])
        );
        assert_eq!(channels(&json!({"channels": ["a", "b", "c"]}), 2), None);
        assert_eq!(channels(&json!({}), 2), Some(vec![]));
    }
}
