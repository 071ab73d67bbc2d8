//! The relay's own handshake: a bridge's `session/hello` is checked (token in constant time,
//! failures throttled per source), then answered with the session's welcome plus the relay's
//! extension (and the backend's, e.g. `replay`).
//!
//! While no mod is connected a hello waits (bounded by `hello_wait`) and then fails, unless it
//! says `relay.withoutMod: true` (`gabp-relay status`, which asks only the relay): that bridge is
//! relay-only. It is welcomed at once (with the mod's welcome if one is connected, else only the
//! relay's extension, `modConnected: false`), may send only `relay/status`, and is never
//! recorded: looking at a relay leaves no trace in its sessions.
//!
//! A bridge's `clientInfo.name` is kept as its label (what it calls itself, shown beside its
//! identity in status, stats, reports and the recording), stripped of control and invisible
//! characters and of any secret, and capped at [`MAX_LABEL`] characters. It is never a metric
//! label.

use std::sync::atomic::Ordering;

use bytes::Bytes;
use gabp_proto::{message, splice, ErrorCode};
use gabp_rt::clock::now_ns;
use gabp_storage::{BridgeInfo, Direction};
use serde_json::{json, Value};

use super::reader::BridgeReader;
use crate::auth;
use crate::identity::Role;
use crate::recorder::RecMsg;
use crate::route::VERSION;
use gabp_rt::log_budget::LogBudget;

/// Longest bridge label kept (its hello's `clientInfo.name`), in characters.
pub const MAX_LABEL: usize = 64;

impl BridgeReader {
    pub(super) async fn hello(
        &mut self,
        id: &str,
        body: &Bytes,
        params: Option<std::ops::Range<usize>>,
    ) {
        let route = self.route.clone();
        let p: Value = params
            .and_then(|p| serde_json::from_slice(&body[p]).ok())
            .unwrap_or(Value::Null);
        if self.authed {
            // Recorded without its token (and without any other secret).
            let rec = auth::redact_hello(body, &self.secrets().list());
            self.record(Direction::BridgeToRelay, rec, true).await;
            return self
                .reply_error(
                    Some(id),
                    ErrorCode::InvalidRequest,
                    "session already established",
                )
                .await;
        }
        self.hello_answered = true;
        let source = auth::source_of(&self.bridge.peer);
        let token = p["token"].as_str().unwrap_or("");
        let Some(identity) = self.identify(token) else {
            route.metrics.auth_failures.increment(1);
            let delay = route.throttle.fail(&source);
            static LOG: LogBudget = LogBudget::new(5);
            if let Some(earlier_unlogged) = LOG.admit() {
                tracing::warn!(route = %route.cfg.name, peer = %self.bridge.peer, earlier_unlogged, "security: rejected session/hello with a wrong token (all are counted in gabp_auth_failures_total; at most 5 per 10 s logged)");
            }
            tokio::time::sleep(delay).await;
            return self
                .reply_error(Some(id), ErrorCode::BadToken, "invalid token")
                .await;
        };
        route.throttle.succeed(&source);
        if !matches!(p["relay"], Value::Null | Value::Object(_)) {
            let why = "relay must be an object ({\"withoutMod\": …, \"resume\": …})";
            return self
                .reply_error(Some(id), ErrorCode::InvalidParams, why)
                .await;
        }
        let relay_only = match &p["relay"]["withoutMod"] {
            Value::Null => false,
            Value::Bool(b) => *b,
            _ => {
                let why = "relay.withoutMod must be true or false";
                return self
                    .reply_error(Some(id), ErrorCode::InvalidParams, why)
                    .await;
            }
        };
        // Only welcomed bridges count against the cap: taken here, with the right token, as
        // its identity's (at a full route, from an identity holding at least two more). A
        // relay-only bridge takes one of its identity's few places (its oldest closed to make
        // room), so `status` always sees a relay whose bridge cap is full, and no other
        // identity's churn can close it.
        let lease_holder = self.route.lease.holder_conn();
        if !self
            .slot
            .admit(identity.label(), relay_only, self.bridge.conn, lease_holder)
        {
            self.done = true;
            return self
                .reply_error(
                    Some(id),
                    ErrorCode::LimitExceeded,
                    "too many bridges connected",
                )
                .await;
        }
        let session = match route.current() {
            Some(s) => Some(s),
            // A relay-only bridge is not kept waiting for a mod it does not talk to.
            None if relay_only => None,
            None => {
                let mut rx = route.session.subscribe();
                let session =
                    tokio::time::timeout(route.cfg.hello_wait, rx.wait_for(|s| s.is_some()))
                        .await
                        .ok()
                        .and_then(|r| r.ok())
                        .and_then(|s| s.clone());
                if session.is_none() {
                    // It may say hello again on this connection: the time to be welcomed
                    // starts again from this answer (the pre-hello strikes still count).
                    self.welcome_clock = std::time::Instant::now();
                    return self
                        .reply_error(
                            Some(id),
                            ErrorCode::ModUnavailable,
                            "the mod is not connected; try again later",
                        )
                        .await;
                }
                session
            }
        };
        if let Some(why) = route.recording_held().filter(|_| !relay_only) {
            // Its hello and attach could not be recorded: it joins once recording works.
            route.metrics.stall_refusals.increment(1);
            let msg = format!(
                "recording is stalled ({why}): bridges join once it works again; hello again then"
            );
            return self
                .error_reply(Some(id), ErrorCode::ModUnavailable, &msg, false)
                .await;
        }
        // The identity is decided now, against the identities in force as it is welcomed: a
        // reload while it waited for the mod may have removed or changed the one its token
        // named then.
        let Some(identity) = self.admit(token) else {
            self.done = true;
            return self
                .reply_error(
                    Some(id),
                    ErrorCode::BadToken,
                    "invalid token (its identity was removed while this hello waited)",
                )
                .await;
        };
        let cap = identity
            .max_subscriptions
            .map_or(route.cfg.max_subscriptions, |n| {
                n.min(route.cfg.max_subscriptions)
            });
        let resume = match super::resume::plan(&route, &p, session.as_ref(), cap) {
            Ok(Some(_)) if relay_only => {
                self.unadmit();
                let why = "a relay-only bridge (relay.withoutMod) cannot resume";
                return self
                    .reply_error(Some(id), ErrorCode::InvalidParams, why)
                    .await;
            }
            Ok(r) => r,
            Err(why) => {
                self.unadmit();
                return self
                    .reply_error(Some(id), ErrorCode::InvalidParams, &why)
                    .await;
            }
        };
        let mut relay_ext = json!({
            "name": "gabp-relay",
            "version": VERSION,
            "route": route.cfg.name,
            "sessionId": session.as_ref().map(|s| s.id.to_string()),
            "modConnected": session.is_some(),
            "backpressure": {
                "policy": route.cfg.on_slow.as_str(),
                "outboxFrames": route.cfg.outbox_frames,
                "outboxBytes": route.cfg.outbox_bytes,
                "droppedChannel": "relay/dropped",
            },
            "methods": offered_methods(relay_only, identity.role, route.backend.relay_methods()),
            "bridge": {"name": identity.name, "role": identity.role.as_str()},
            "maxBodyBytes": route.cfg.max_body,
        });
        super::resume::extend_welcome(&route, resume.as_ref(), &mut relay_ext);
        // The mod's welcome as it wrote it (big numbers, key order and all), with the relay's
        // and the backend's extensions set in it.
        let mut extensions = vec![("relay", message::to_ascii_json(&relay_ext))];
        for (name, ext) in route.backend.welcome_extensions() {
            extensions.push((name, message::to_ascii_json(&ext)));
        }
        let extensions: Vec<(&str, &[u8])> =
            extensions.iter().map(|(n, e)| (*n, e.as_slice())).collect();
        let mod_welcome = session.as_ref().map_or(&b"{}"[..], |s| &s.welcome_result);
        let welcome = splice::set_extensions(mod_welcome, &extensions);
        // The relay never sends what its own limit refuses: a mod's welcome close to the limit
        // can pass it once the relay's extension is added.
        let mut answer = message::result_response_raw(id, &welcome);
        if answer.len() > route.cfg.max_body && relay_only {
            // A relay-only bridge (`status`) needs only the relay's part: it must still see a
            // relay whose mod's welcome is near the limit.
            answer =
                message::result_response_raw(id, &splice::set_extensions(b"{}", &extensions[..1]));
        }
        if answer.len() > route.cfg.max_body {
            // Debug only: every hello would log it; the bridge's error says what to do.
            tracing::debug!(route = %route.cfg.name, bytes = answer.len(), max_body = route.cfg.max_body, "a bridge's welcome, with the relay's extension, is over --max-body");
            self.done = true;
            self.unadmit();
            let msg = format!(
                "the welcome is {} bytes with the relay's extension, over this relay's --max-body of {} bytes; the operator must raise --max-body",
                answer.len(),
                route.cfg.max_body
            );
            return self.reply_error(Some(id), ErrorCode::TooLarge, &msg).await;
        }
        self.authed = true;
        self.bridge.relay_only.store(relay_only, Ordering::Relaxed);
        // The first frame this bridge has recorded: its hello, without the token.
        let rec = auth::redact_hello(body, &self.secrets().list());
        self.record(Direction::BridgeToRelay, rec, true).await;
        // Free-form strings from the bridge: capped, and never carrying a secret.
        let field = |name: &str, max: usize| -> String {
            auth::redact_str(p[name].as_str().unwrap_or_default(), &self.secrets().list())
                .chars()
                .take(max)
                .collect()
        };
        // Its own label (a name it chose): no control or invisible characters, no secret.
        let label = p["clientInfo"]["name"].as_str().and_then(|n| {
            let n = gabp_rt::display::strip(&auth::redact_str(n, &self.secrets().list()), false);
            let n: String = n.trim().chars().take(MAX_LABEL).collect();
            (!n.is_empty()).then_some(n)
        });
        let info = BridgeInfo {
            conn: self.bridge.conn,
            name: identity.name.clone(),
            bridge_version: field("bridgeVersion", 128),
            platform: field("platform", 32),
            launch_id: field("launchId", 128),
            peer: self.bridge.peer.clone(),
            attached_ns: now_ns(),
            detached_ns: None,
            dropped: 0,
            policy: route.cfg.on_slow.as_str().into(),
            unrecorded_bad_frames: 0,
            rate_limited: 0,
            denied: 0,
            lease_refused: 0,
            label,
        };
        *self.bridge.info.lock() = Some(info.clone());
        if let (Some(rec), Some(session), false) = (&route.recorder, &session, relay_only) {
            rec.send(RecMsg::Bridge {
                session: session.id,
                info: Box::new(info),
            })
            .await;
        }
        static ATTACHED: LogBudget = LogBudget::new(50);
        if let Some(earlier_unlogged) = ATTACHED.admit() {
            tracing::info!(route = %route.cfg.name, conn = self.bridge.conn, bridge = %identity.label(), peer = %self.bridge.peer, earlier_unlogged, "bridge attached");
        }
        self.reply(answer).await;
        if let Some(plan) = resume {
            super::resume::run(&route, &self.bridge, plan).await;
        }
    }
}

/// The relay's own methods a bridge welcomed this way may send and get answered (not refused
/// -32601 or, for its role, -32006): the front's, then the backend's (a replay's
/// `relay/replay`, whose `state` an observer may ask too).
fn offered_methods(relay_only: bool, role: Role, backend: &[&'static str]) -> Vec<&'static str> {
    if relay_only {
        return vec!["relay/status"];
    }
    let mut methods = vec!["relay/status", gabp_proto::mark::MARK];
    if role != Role::Observe {
        methods.push("relay/lease");
    }
    methods.push(super::PING);
    methods.extend_from_slice(backend);
    methods
}
