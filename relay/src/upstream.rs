//! What stands behind the bridge front: a [`Backend`].
//!
//! The front ([`crate::bridge`]) serves bridges the same way whatever is behind it: accept,
//! hello and auth, strict parsing, caps, outboxes and slow-bridge policies, write deadline,
//! seq, metrics and status. Behind it a route has one backend, chosen the way a proxy chooses
//! its upstream peer:
//! - [`Live`]: the mod itself, over a TCP or unix socket or as a stdio child (through a
//!   [`Connector`]); sessions come and go with its connection ([`session`], [`reader`]).
//! - [`Recorded`]: a recorded session played back (`gabp-replay`), each bridge on its own
//!   timeline from its first subscribe ([`player`]), requests answered from the recording
//!   ([`answers`]).
//!
//! The front calls the backend for what differs: subscribing, forwarding a request, a bridge
//! leaving. A backend publishes its session in [`Route::session`]; the front's hello waits for it.

mod answers;
mod live;
mod player;
mod reader;
mod recorded;
mod session;

use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use futures::FutureExt;
use gabp_proto::ErrorCode;
use gabp_rt::net::Conn;
use serde_json::Value;
use tokio_util::codec::FramedRead;

pub use live::Live;
pub use recorded::{Recorded, ReplayPlan};

use crate::config::{RouteConfig, Upstream};
use crate::pending::ByteBudget;
use crate::route::{BridgeState, Route};

/// Channels one session may use (advertised or seen in events). Past it, events on new
/// channels are anomalies and further advertised channels are not subscribed to, so a mod
/// that invents channel names cannot grow the channel table, metrics and recording catalog
/// without bound.
pub const MAX_CHANNELS: usize = 4096;
/// How often a failure that keeps repeating (a wrong `--upstream-token`) is logged again.
const REPEAT_LOG_EVERY: Duration = Duration::from_secs(60);

/// The mod's frames: one over `--max-body` is passed over unread, not the end of the session.
type Frames = FramedRead<gabp_rt::net::BoxRead, gabp_proto::SkippingCodec>;

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

/// What stands behind a route's bridge front (see the module doc).
pub trait Backend: Send + Sync + std::fmt::Debug {
    /// Runs until the route is cancelled, publishing sessions in [`Route::session`].
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

    /// `bridge` has gone (its outbox is closed): forget it.
    fn left<'a>(&'a self, route: &'a Route, bridge: &'a Arc<BridgeState>) -> BoxFuture<'a, ()>;
}

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
