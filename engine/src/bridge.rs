//! The bridge front: every bridge connection of a route, whatever backend stands behind it
//! (the live mod or a recording, see `crate::upstream`).
//!
//! Bridges are untrusted. Every frame is validated strictly; a bad body gets an error reply
//! and reading continues, broken framing closes the connection. Nothing is forwarded, and
//! nothing recorded, before a successful `session/hello`: that traffic is counted, and a few
//! failures close the connection. Every cost is bounded: replies the bridge does not read stop
//! its reading, forwarded request bytes have a budget, and a socket that takes nothing for the
//! write deadline gets the bridge cut (reset, state freed at once).
//!
//! - `accept`: the accept loop (descriptor exhaustion).
//! - `gate`: the bridge cap (welcomed bridges only, shared fairly between identities) and the
//!   bound on connections before hello (the oldest is closed to make room).
//! - `reader`: reading a bridge, answering what the relay answers, handing the rest to the
//!   backend.
//! - `hello`: the handshake.
//! - `resume`: a reconnecting bridge's missed events, then the live stream (`relay.resume`).
//! - `rights`: who a welcomed bridge is, what it may send, reload's revocations.
//! - `status`: the `relay/status` answer, cut to fit `--max-body`.
//! - `writer`: the writer task, and the backend's direct write when it is idle.

mod accept;
mod gate;
mod hello;
mod reader;
mod resume;
mod rights;
mod status;
mod writer;

use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::Arc;
use std::time::Duration;

use gabp_rt::net::Conn;

pub use accept::accept_loop;
pub use rights::{reload, Reloaded};

use crate::outbox::socket::BridgeSocket;
use crate::outbox::Outbox;
use crate::pending::{self, ByteBudget};
use crate::recorder::RecMsg;
use crate::route::{BridgeState, Route};
use reader::BridgeReader;

/// The relay's method that only answers: counted against the identity's rate like every
/// request, so a bridge serving its client from its own buffer (the MCP front's
/// `events_poll`) still asks the relay's rate for each call.
pub const PING: &str = "relay/ping";
/// Failed frames tolerated before a successful hello; then the connection is closed.
pub const MAX_PREHELLO_ERRORS: u32 = 3;
/// How long a bridge's writer may keep flushing once the relay is shutting down.
const SHUTDOWN_GRACE: Duration = Duration::from_millis(500);

/// What a leaving bridge may still take at shutdown: [`SHUTDOWN_GRACE`], but never more than
/// half of what is left of the shutdown bound (`--shutdown-timeout` is a promise).
fn shutdown_grace(route: &Route) -> Duration {
    route.stop_by.get().map_or(SHUTDOWN_GRACE, |by| {
        SHUTDOWN_GRACE.min(by.saturating_duration_since(std::time::Instant::now()) / 2)
    })
}

/// A second descriptor of a bridge's socket, kept to reset the connection when the bridge is
/// cut: `SO_LINGER` 0 makes the last close send a reset and free the socket's buffers at once,
/// instead of a FIN that a hung peer could hold open forever.
#[derive(Debug, Default)]
pub struct Closer(Option<OwnedFd>);

impl Closer {
    /// A closer for the socket behind `fd` (a duplicate descriptor; `None` if that failed).
    pub fn of(fd: BorrowedFd<'_>) -> Closer {
        Closer(fd.try_clone_to_owned().ok())
    }

    /// Makes the connection end with a reset once its last descriptor closes.
    fn arm_reset(&self) {
        if let Some(fd) = &self.0 {
            let _ = socket2::SockRef::from(fd).set_linger(Some(Duration::ZERO));
        }
    }
}

/// Serves one bridge until it leaves, is cut, or the relay shuts down.
pub async fn serve(route: Arc<Route>, conn: Conn, slot: gate::Slot, closer: Closer) {
    let conn_id = route.next_conn();
    let outbox = Arc::new(Outbox::new(
        route.cfg.on_slow,
        route.cfg.outbox_frames,
        route.cfg.outbox_bytes,
    ));
    let bridge = Arc::new(BridgeState {
        conn: conn_id,
        outbox: outbox.clone(),
        peer: conn.peer.clone(),
        info: Default::default(),
        subs: Default::default(),
        in_flight: Default::default(),
        access: Default::default(),
        relay_only: Default::default(),
        bad_unrecorded: Default::default(),
    });
    route.bridges.lock().insert(conn_id, bridge.clone());
    route.metrics.bridges.increment(1.0);
    outbox
        .socket()
        .install(BridgeSocket::new(conn_id, conn.write).with_fd(conn.fd));
    let mut writer = tokio::spawn(writer::write_loop(route.clone(), bridge.clone()));
    let mut reader = BridgeReader::new(
        route.clone(),
        bridge.clone(),
        ByteBudget::new(pending::BRIDGE_BYTES.max(route.cfg.max_body)),
        slot,
    );
    let cut = outbox.cut_signal().clone();
    let evicted = reader.slot.evicted.clone();
    // Evicted before hello (a newer connection needed the room), or its place under the cap
    // given to another identity's bridge: closed at once, nothing owed.
    let mut gone = false;
    tokio::select! {
        _ = reader.run(conn.read) => {}
        _ = cut.cancelled() => {}
        _ = evicted.cancelled() => gone = true,
        _ = route.cancel.cancelled() => {}
        // Its identity was revoked on reload: the notice is queued, flushed below.
        _ = bridge.access.revoked.cancelled() => {}
    }

    // Leave: the outbox closes (no more events are queued), then the writer flushes what is
    // queued (bounded by the write deadline, and by a short grace at shutdown) unless the
    // bridge was cut.
    let flushed = !cut.is_cancelled() && !gone && {
        if route.cancel.is_cancelled() {
            // At shutdown the session ends first, answering this bridge's pending requests
            // (-32005), so those answers are queued before the outbox closes.
            let mut sessions = route.session.subscribe();
            let ended = sessions.wait_for(Option::is_none);
            let _ = tokio::time::timeout(shutdown_grace(&route), ended).await;
        }
        outbox.close();
        tokio::select! {
            _ = &mut writer => true,
            _ = cut.cancelled() => false,
            _ = route.cancel.cancelled() => {
                let grace = route.cfg.write_deadline.min(shutdown_grace(&route));
                tokio::time::timeout(grace, &mut writer).await.is_ok()
            }
        }
    };
    if !flushed {
        // Cut (or out of time at shutdown): abort the writer and drop every handle on the
        // socket, which is reset, now.
        closer.arm_reset();
        writer.abort();
        let _ = (&mut writer).await;
        outbox.close();
        outbox.socket().discard();
        if let Some(why) = outbox.cut_reason() {
            static LOG: gabp_rt::log_budget::LogBudget = gabp_rt::log_budget::LogBudget::new(20);
            if let Some(earlier_unlogged) = LOG.admit() {
                tracing::info!(route = %route.cfg.name, conn = conn_id, peer = %bridge.peer, earlier_unlogged, "bridge cut: {}", why.as_str());
            }
        }
    }
    drop(closer);
    route.bridges.lock().remove(&conn_id);
    route.metrics.bridges.decrement(1.0);
    route.backend.left(&route, &bridge).await;
    crate::route::lease::Lease::holder_left(&route, conn_id).await;
    rights::left(&route, &bridge);
    // At shutdown the session's end recorded this already (see `upstream::session`).
    if let (Some(info), Some(rec), Some(s)) =
        (bridge.leaving_info(), &route.recorder, route.current())
    {
        rec.send(RecMsg::Bridge {
            session: s.id,
            info: Box::new(info),
        })
        .await;
    }
    // Last: the bridge's place under the cap frees only once its state is gone.
    drop(reader);
}
