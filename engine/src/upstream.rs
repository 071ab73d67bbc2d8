//! What stands behind the bridge front: the two [`Backend`]s.
//!
//! The front ([`crate::bridge`]) serves bridges the same way whatever is behind it: accept,
//! hello and auth, strict parsing, caps, outboxes and slow-bridge policies, write deadline,
//! seq, metrics and status. Behind it a route has one backend, chosen the way a proxy chooses
//! its upstream peer:
//! - [`Live`]: the mod itself, over a TCP or unix socket or as a stdio child (through a
//!   [`Connector`]); sessions come and go with its connection ([`session`], [`reader`]).
//! - [`Recorded`]: a recorded session played back (`gabp-replay`), each bridge on its own
//!   timeline from its first subscribe ([`player`]) following one playhead once a bridge
//!   controls it ([`playback`]), requests answered from the recording ([`answers`]).
//!
//! The front calls the backend for what differs: subscribing, forwarding a request, a bridge
//! leaving. A backend publishes its session in [`Route::session`]; the front's hello waits for it.
//! The [`Backend`] trait itself belongs to the route that holds one ([`crate::route::backend`]).

mod answers;
mod calls;
mod live;
mod marks;
pub mod playback;
mod player;
mod reader;
mod recorded;
mod session;

use std::time::Duration;

use futures::FutureExt;
use gabp_rt::net::Conn;
use tokio_util::codec::FramedRead;

#[cfg(doc)]
use crate::route::{Backend, Route};
pub use calls::{AgentCall, AgentCalls, BridgeCalls, CallsMade};
pub use live::Live;
pub use recorded::{Recorded, ReplayPlan, Speed};

use crate::config::Upstream;

pub use gabp_storage::catalog::MAX_CHANNELS;
/// How often a failure that keeps repeating (a wrong `--upstream-token`) is logged again.
const REPEAT_LOG_EVERY: Duration = Duration::from_secs(60);

/// The mod's frames: one over `--max-body` is passed over unread, not the end of the session.
type Frames = FramedRead<gabp_rt::net::BoxRead, gabp_proto::SkippingCodec>;

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
