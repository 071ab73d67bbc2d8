//! A welcomed bridge's rights: which identity its hello's token names, what it may send
//! (role, tool globs, the lease, its rate), the per-bridge refusal counters and metrics, and
//! reload's revocations.
//!
//! A refused request was already recorded (like every request); its error reply is recorded
//! too, it is counted on the bridge (`relay/status`: `denied`, `rateLimited`, `leaseRefused`)
//! and in `gabp_bridge_refusals_by_identity_total{route,bridge,reason}`, and it never reaches
//! the mod. Metric labels are identity names from the config only (`default` for the route's
//! own token), never anything a bridge sends.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use gabp_proto::{frame_bytes, message, ErrorCode};
use gabp_storage::Direction;
use serde_json::{json, Value};

use super::reader::BridgeReader;
use crate::auth;
use crate::config::RouteConfig;
use crate::identity::{Denial, Identity, Table};
use crate::route::lease::Lease;
use crate::route::{BridgeState, Route};

/// The per-bridge notice sent just before a revoked bridge is closed.
pub const REVOKED_CHANNEL: &str = "relay/revoked";

fn connected_gauge(route: &Route, name: &str) -> metrics::Gauge {
    metrics::gauge!("gabp_identity_bridges_connected", "route" => route.cfg.name.clone(), "bridge" => name.to_string())
}

fn refused(route: &Route, bridge: &BridgeState, reason: &'static str) {
    let name = bridge.access.label();
    metrics::counter!("gabp_bridge_refusals_by_identity_total", "route" => route.cfg.name.clone(), "bridge" => name, "reason" => reason).increment(1);
}

/// A bridge leaves: its identity's connected gauge goes down.
pub(super) fn left(route: &Route, bridge: &BridgeState) {
    if let Some(id) = bridge.access.identity() {
        connected_gauge(route, id.label()).decrement(1.0);
    }
}

impl BridgeReader {
    /// The identity whose token `presented` is (constant time over every identity).
    pub(super) fn identify(&self, presented: &str) -> Option<Arc<Identity>> {
        self.route.access.table().find(presented)
    }

    /// Welcomes the bridge as the identity `presented` names in the identities in force now
    /// (a reload while its hello waited for the mod may have removed or changed it), with that
    /// identity's shared rate. `None` if no identity has that token any more. A reload that
    /// replaces the table meanwhile is seen: either it finds this bridge's identity set (and
    /// revokes or updates it), or this loop finds the new table and decides again.
    pub(super) fn admit(&self, presented: &str) -> Option<Arc<Identity>> {
        loop {
            let table = self.route.access.table();
            let id = table.find(presented)?;
            self.bridge
                .access
                .set(id.clone(), self.route.access.bucket(&id));
            if Arc::ptr_eq(&table, &self.route.access.table()) {
                connected_gauge(&self.route, id.label()).increment(1.0);
                return Some(id);
            }
        }
    }

    /// Undoes [`Self::admit`] for a hello that then failed.
    pub(super) fn unadmit(&self) {
        if let Some(id) = self.bridge.access.clear() {
            connected_gauge(&self.route, id.label()).decrement(1.0);
        }
    }

    /// The channels this bridge may subscribe to at once.
    pub(super) fn subscription_cap(&self) -> usize {
        let route_cap = self.route.cfg.max_subscriptions;
        self.bridge
            .access
            .identity()
            .and_then(|i| i.max_subscriptions)
            .map_or(route_cap, |n| n.min(route_cap))
    }

    /// Whether the bridge's role or method rules forbid `method` outright (counted as a refusal): asked of a
    /// request whose params failed the strict parse, before saying so.
    pub(super) fn role_refusal(&self, method: &str) -> Option<String> {
        let me = self.bridge.access.identity()?;
        let Err(Denial::Forbidden(why)) = me.check_method(method) else {
            return None;
        };
        self.bridge.access.denied.fetch_add(1, Ordering::Relaxed);
        refused(&self.route, &self.bridge, "denied");
        Some(why)
    }

    /// Why the bridge's rights refuse a request bound for the mod (or `relay/lease`): its
    /// role and globs, the lease over leased tools, and who may hold the lease. Counted and
    /// logged here; the caller answers ([`BridgeReader::refused`]).
    pub(super) fn rights_refusal(
        &self,
        method: &str,
        params: impl Fn() -> Value,
    ) -> Option<crate::route::lease::Refusal> {
        let route = &self.route;
        let me = self.bridge.access.identity()?;
        let table = route.access.table();
        let wants_tool =
            method == "tools/call" && (me.tools != Default::default() || table.has_leased());
        let tool = wants_tool
            .then(|| params()["name"].as_str().map(String::from))
            .flatten();
        let denied = match me.check(method, tool.as_deref()) {
            Err(Denial::Forbidden(why)) => Some(why),
            Ok(()) if method == "relay/lease" => {
                let taking = matches!(params()["action"].as_str(), Some("acquire" | "renew"));
                (taking && !table.may_hold_lease(&me)).then(|| {
                    let leased: Vec<String> =
                        table.leased_globs().iter().map(|g| format!("{g:?}")).collect();
                    format!(
                        "bridge {:?} may not hold the lease: it may call none of the leased tools (leased = [{}])",
                        me.label(),
                        leased.join(", ")
                    )
                })
            }
            Ok(()) => None,
        };
        if let Some(why) = denied {
            self.bridge.access.denied.fetch_add(1, Ordering::Relaxed);
            refused(route, &self.bridge, "denied");
            // The method and tool named are the bridge's words (decoded: a `\u` escape hides
            // nothing here) and may spell a token, which no log line may hold.
            let redactor = table.redactor();
            let why = redactor.redact_name(&why).into_owned();
            static LOG: gabp_rt::log_budget::LogBudget = gabp_rt::log_budget::LogBudget::new(10);
            if let Some(earlier_unlogged) = LOG.admit() {
                let method = redactor.redact_name(method);
                tracing::info!(route = %route.cfg.name, conn = self.bridge.conn, bridge = %me.label(), %method, earlier_unlogged, "request refused: {why}");
            }
            return Some((ErrorCode::Forbidden, why, None));
        }
        if method == "relay/lease" {
            let refusal = route
                .lease
                .refusal(self.bridge.conn, &params(), table.lease_max_ttl());
            if let Some(refusal) = refusal {
                if refusal.0 == ErrorCode::LeaseHeld {
                    self.bridge
                        .access
                        .lease_refused
                        .fetch_add(1, Ordering::Relaxed);
                    refused(route, &self.bridge, "lease_held");
                }
                return Some(refusal);
            }
        }
        if let Some(tool) = tool.as_deref().filter(|t| table.leased(t)) {
            if let Err(refusal) = route.lease.check(self.bridge.conn, tool) {
                self.bridge
                    .access
                    .lease_refused
                    .fetch_add(1, Ordering::Relaxed);
                refused(route, &self.bridge, "lease_held");
                return Some(refusal);
            }
        }
        None
    }

    /// Takes one request from the bridge's identity's rate (every request after the hello
    /// counts, the relay's own `relay/*` included, shared by all of the identity's
    /// connections); when there is none left, the refusal is sent and `true` returned. A
    /// refused request is counted, not recorded: a flood of them cannot fill the disk.
    pub(super) fn over_rate(&mut self, id: &str) -> bool {
        let Err(wait) = self.bridge.access.take_call() else {
            return false;
        };
        let route = self.route.clone();
        self.bridge.access.limited.fetch_add(1, Ordering::Relaxed);
        self.bridge.bad_unrecorded.fetch_add(1, Ordering::Relaxed);
        refused(&route, &self.bridge, "rate_limited");
        let ms = wait.as_millis().max(1) as u64;
        let me = self.bridge.access.identity();
        let rate = me
            .as_ref()
            .and_then(|m| m.calls_per_second)
            .unwrap_or_default();
        let why = format!(
            "slow down: bridge {:?} is limited to {rate} calls per second; retry after {ms} ms",
            me.as_ref()
                .map_or(crate::identity::DEFAULT_NAME, |m| m.label())
        );
        let body = message::error_response(
            Some(id),
            ErrorCode::SlowDown,
            &why,
            Some(json!({"retryAfterMs": ms})),
        );
        self.bridge.outbox.push_control(frame_bytes(&body));
        true
    }

    /// `relay/lease {action, ttlMs?}`: see `crate::route::lease` (the bridge's rights to it were
    /// checked before it was recorded).
    pub(super) async fn lease(&mut self, id: &str, params: &Value) {
        let table = self.route.access.table();
        let name = self.bridge.access.label();
        let max_ttl = table.lease_max_ttl();
        match Lease::request(&self.route.clone(), &self.bridge, &name, params, max_ttl).await {
            Ok(answer) => self.reply(message::result_response(id, answer)).await,
            Err((code, why, data)) => {
                if code == ErrorCode::LeaseHeld {
                    self.bridge
                        .access
                        .lease_refused
                        .fetch_add(1, Ordering::Relaxed);
                    refused(&self.route, &self.bridge, "lease_held");
                }
                self.reply_error_data(Some(id), code, &why, data).await
            }
        }
    }
}

/// What a reload did to one route's bridges.
#[derive(Debug, Default)]
pub struct Reloaded {
    /// Welcomed bridges whose identity is unchanged (kept, with the new rights).
    pub kept: usize,
    /// Bridges disconnected: their identity was removed or its token changed.
    pub revoked: usize,
}

/// Replaces `route`'s identities with those of `cfg` (the re-read config). A welcomed bridge
/// whose identity still exists with the same token stays connected and gets the new rights
/// (role, tools, rate, subscriptions cap); one whose identity is gone or whose token changed
/// gets a `relay/revoked` notice and is closed. The route's own token (the one in its discovery
/// file, which `status` and `mcp` use) and the mod's token are not reloaded.
pub async fn reload(route: &Arc<Route>, cfg: &RouteConfig) -> Reloaded {
    let table = Table::new(
        &route.cfg.token,
        &cfg.identities,
        &route.cfg.upstream_token,
        &cfg.leased,
    )
    .with_lease_max_ttl(cfg.lease_max_ttl);
    let mut out = Reloaded::default();
    let mut notices = Vec::new();
    let mut demoted = Vec::new();
    {
        route.access.replace(table.clone());
        for b in route.bridges.lock().values() {
            let Some(old) = b.access.identity() else {
                continue;
            };
            let reason = match table.by_name(old.name.as_deref()) {
                Some(new) if auth::token_matches(new.token(), old.token()) => {
                    if !table.may_hold_lease(new) {
                        demoted.push(b.conn);
                    }
                    b.access.set(new.clone(), route.access.bucket(new));
                    // A relay-only connection (`reload` itself asking for the outcome) is no
                    // bridge the operator counts.
                    if !b.relay_only.load(Ordering::Relaxed) {
                        out.kept += 1;
                    }
                    continue;
                }
                Some(_) => "token-changed",
                None => "identity-removed",
            };
            out.revoked += 1;
            let body = message::event(
                REVOKED_CHANNEL,
                0,
                json!({"bridge": old.label(), "reason": reason, "tNs": gabp_rt::clock::now_ns()}),
            );
            b.outbox.push_control(frame_bytes(&body));
            b.access.revoked.cancel();
            tracing::warn!(route = %route.cfg.name, conn = b.conn, bridge = %old.label(), "bridge disconnected on reload: {reason}");
            notices.push((b.conn, body));
        }
    }
    for conn in demoted {
        Lease::holder_demoted(route, conn).await;
    }
    for (conn, body) in notices {
        route
            .record_current(Direction::RelayToBridge, conn, body, true)
            .await;
    }
    out
}
