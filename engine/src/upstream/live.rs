//! The live backend: the mod itself, reached through a [`Connector`] (TCP or unix socket, or a
//! stdio child). Subscriptions go through the hub and, for channels nobody had, upstream;
//! requests get a fresh upstream id and wait in the pending table for the mod's answer.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use bytes::BytesMut;
use futures::future::BoxFuture;
use futures::FutureExt;
use gabp_proto::ErrorCode;
use gabp_rt::clock::now_ns;
use gabp_storage::{Direction, FrameRecord};
use serde_json::json;
use uuid::Uuid;

use super::Connector;
use crate::config::RouteConfig;
use crate::pending::{self, Entry, Origin};
use crate::route::{Backend, Refusal, Request};
use crate::route::{BridgeState, Route};

/// The mod, connected to (and reconnected) through `connector`.
#[derive(Debug)]
pub struct Live {
    connector: Arc<dyn Connector>,
}

impl Live {
    /// A live backend connecting through `connector`.
    pub fn new(connector: Arc<dyn Connector>) -> Live {
        Live { connector }
    }
}

impl Backend for Live {
    fn run(self: Arc<Self>, route: Arc<Route>) -> BoxFuture<'static, ()> {
        super::session::run(route, self.connector.clone()).boxed()
    }

    fn describe(&self, cfg: &RouteConfig) -> String {
        cfg.upstream.to_string()
    }

    fn subscribe<'a>(
        &'a self,
        route: &'a Route,
        bridge: &'a Arc<BridgeState>,
        chans: &'a [String],
    ) -> BoxFuture<'a, ()> {
        async move {
            route.hub.subscribe(bridge.conn, &bridge.outbox, chans);
            let Some(s) = route.current() else { return };
            // The set of upstream channels decides who sends, under its lock: no channel is
            // asked for twice, and none falls between two sessions (see `session::serve`).
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
        .boxed()
    }

    fn unsubscribe<'a>(
        &'a self,
        route: &'a Route,
        bridge: &'a Arc<BridgeState>,
        chans: &'a [String],
    ) -> BoxFuture<'a, ()> {
        async move {
            let emptied = route.hub.unsubscribe(bridge.conn, chans);
            drop_upstream(route, emptied).await;
        }
        .boxed()
    }

    fn left<'a>(&'a self, route: &'a Route, bridge: &'a Arc<BridgeState>) -> BoxFuture<'a, ()> {
        async move {
            let subs: Vec<String> = bridge.subs.lock().iter().cloned().collect();
            let emptied = route.hub.unsubscribe(bridge.conn, &subs);
            if !route.cancel.is_cancelled() {
                drop_upstream(route, emptied).await;
            }
        }
        .boxed()
    }

    fn request<'a>(
        &'a self,
        route: &'a Route,
        req: Request<'a>,
    ) -> BoxFuture<'a, Result<(), Refusal>> {
        forward(route, req).boxed()
    }
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

/// Forwards a bridge's request to the mod under a fresh upstream id.
async fn forward(route: &Route, req: Request<'_>) -> Result<(), Refusal> {
    let Request {
        bridge,
        id,
        id_span,
        method,
        body,
        budget,
        ..
    } = req;
    let session = route.current();
    let Some((session, upstream)) = session
        .as_ref()
        .and_then(|s| Some((s, s.upstream.as_ref()?)))
    else {
        return Err(Refusal::new(
            ErrorCode::ModUnavailable,
            "the mod is not connected",
        ));
    };
    if bridge.in_flight.fetch_add(1, Ordering::AcqRel) >= route.cfg.max_pending {
        bridge.in_flight.fetch_sub(1, Ordering::AcqRel);
        return Err(Refusal::new(
            ErrorCode::LimitExceeded,
            "too many requests in flight for one bridge",
        ));
    }
    // Bytes in flight are bounded too, per bridge and per route: they are held until the
    // request is written to the mod and recorded, so a mod that stops reading costs a
    // bounded amount of memory, given back as soon as the bytes are gone.
    let holds = budget
        .try_reserve(body.len())
        .and_then(|b| Some(vec![b, route.pending.bytes.try_reserve(body.len())?]));
    let Some(holds) = holds else {
        bridge.in_flight.fetch_sub(1, Ordering::AcqRel);
        return Err(Refusal::new(
            ErrorCode::LimitExceeded,
            "too many request bytes in flight; try again when earlier requests are answered",
        ));
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
    // Recorded before the mod can have it, so its answer is always recorded after it (recorded
    // after the send, a quick answer could overtake it and the call read as unanswered).
    // `Route::record` redacts it.
    if route.recorder.is_some() {
        route
            .record(
                session.id,
                FrameRecord::message(
                    Direction::RelayToMod,
                    bridge.conn,
                    now_ns(),
                    true,
                    out.clone(),
                ),
            )
            .await;
    }
    let now = Instant::now();
    route.pending.insert(
        upstream_id,
        Entry {
            session: session.id,
            origin: Origin::Bridge {
                conn: bridge.conn,
                outbox: bridge.outbox.clone(),
                bridge_id: id.to_string(),
                in_flight: bridge.in_flight.clone(),
            },
            method: method.to_string(),
            sent: now,
            deadline: now + route.cfg.request_timeout,
        },
    );
    if upstream.send(out).await.is_err() {
        route.pending.take(&upstream_id);
        return Err(Refusal::new(
            ErrorCode::ModUnavailable,
            "the mod disconnected",
        ));
    }
    Ok(())
}
