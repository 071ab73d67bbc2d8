//! The trait of what stands behind a route's bridge front (the live mod, a recording): what the
//! front asks of it and what it may refuse. Defined beside the route that holds one, so the
//! backends depend on the route and never the other way.

use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;
use futures::future::BoxFuture;
use gabp_proto::ErrorCode;
use serde_json::Value;

use crate::config::RouteConfig;
use crate::pending::ByteBudget;

use super::{BridgeState, Route};

/// A bridge's request for the backend (everything but `session/hello`, `events/*` and
/// `relay/*`, which the front answers itself).
#[derive(Debug)]
pub struct Request<'a> {
    /// The bridge asking.
    pub bridge: &'a Arc<BridgeState>,
    /// The bridge's id for the request.
    pub id: &'a str,
    /// Where that id sits in `body` (quotes included).
    pub id_span: Range<usize>,
    /// The method.
    pub method: &'a str,
    /// Where the params sit in `body`.
    pub params: Option<Range<usize>>,
    /// The whole request body, as received.
    pub body: Bytes,
    /// The bridge's budget of forwarded request bytes.
    pub budget: &'a Arc<ByteBudget>,
}

/// Why a request was not taken: the front sends the bridge this error.
#[derive(Debug)]
pub struct Refusal {
    /// The wire error code.
    pub code: ErrorCode,
    /// One human line.
    pub message: &'static str,
}

impl Refusal {
    /// A refusal with `code` and `message`.
    pub fn new(code: ErrorCode, message: &'static str) -> Refusal {
        Refusal { code, message }
    }
}

/// A refused `relay/replay`: the error code and one line.
pub type PlaybackRefusal = (ErrorCode, String);

/// The relay's method for playback controls, answered by the backend.
pub const PLAYBACK: &str = "relay/replay";

/// What a route whose backend plays nothing back answers `relay/replay`.
pub const NOT_A_REPLAY: &str =
    "relay/replay controls a replay (gabp-relay replay); this route relays a live mod";

/// What stands behind a route's bridge front (see the module doc).
pub trait Backend: Send + Sync + std::fmt::Debug {
    /// Runs until the route is cancelled, publishing sessions in [`Route::sessions`].
    fn run(self: Arc<Self>, route: Arc<Route>) -> BoxFuture<'static, ()>;

    /// What it is, for status and logs.
    fn describe(&self, cfg: &RouteConfig) -> String;

    /// The backend's own extensions, set beside the relay's under `capabilities.extensions` in
    /// the welcome a bridge gets.
    fn welcome_extensions(&self) -> Vec<(&'static str, Value)> {
        Vec::new()
    }

    /// `bridge` now subscribes to `chans` too (already added to its `subs`).
    fn subscribe<'a>(
        &'a self,
        route: &'a Route,
        bridge: &'a Arc<BridgeState>,
        chans: &'a [String],
    ) -> BoxFuture<'a, ()>;

    /// `bridge`'s answer to a subscribe is queued: a backend whose events start with the first
    /// subscribe (a recorded timeline) starts them now.
    fn subscribed(&self, _route: &Arc<Route>, _bridge: &Arc<BridgeState>) {}

    /// `bridge` no longer subscribes to `chans` (already removed from its `subs`).
    fn unsubscribe<'a>(
        &'a self,
        route: &'a Route,
        bridge: &'a Arc<BridgeState>,
        chans: &'a [String],
    ) -> BoxFuture<'a, ()>;

    /// Takes a bridge's request; its answer reaches the bridge's outbox later.
    fn request<'a>(
        &'a self,
        route: &'a Route,
        req: Request<'a>,
    ) -> BoxFuture<'a, Result<(), Refusal>>;

    /// The `relay/*` methods this backend answers beyond the front's own (named in the
    /// welcome's `relay.methods`, so a bridge can discover them); a backend answering
    /// [`Backend::playback`] names [`PLAYBACK`] here.
    fn relay_methods(&self) -> &'static [&'static str] {
        &[]
    }

    /// `relay/replay {action, …}` from `bridge` (its rights were checked): the playback
    /// controls of a recording played back, answered with the state after the change. A
    /// backend that plays nothing back refuses it as a method it does not have.
    fn playback<'a>(
        &'a self,
        _route: &'a Route,
        _bridge: &'a Arc<BridgeState>,
        _params: Value,
    ) -> BoxFuture<'a, Result<Value, PlaybackRefusal>> {
        Box::pin(futures::future::ready(Err((
            ErrorCode::MethodNotFound,
            NOT_A_REPLAY.to_string(),
        ))))
    }

    /// `bridge` has gone (its outbox is closed): forget it.
    fn left<'a>(&'a self, route: &'a Route, bridge: &'a Arc<BridgeState>) -> BoxFuture<'a, ()>;
}
