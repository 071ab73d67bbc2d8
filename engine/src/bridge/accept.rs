//! Accepting bridges: each connection gets a slot of the route's [`Gate`] (the pre-hello
//! bound, then the bridge cap at hello), and descriptor exhaustion
//! (a failing accept is retried every 100 ms and logged once per run, never spun on).

use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::Duration;

use gabp_rt::net::{Conn, Listener};
use tokio_util::task::TaskTracker;

use super::gate::Gate;
use super::Closer;
use crate::route::Route;

/// Pause after a failed accept.
const RETRY_ACCEPT: Duration = Duration::from_millis(100);

/// Accepts bridges for `route` until it is cancelled; each is served by [`super::serve`] with
/// its slot of the route's gate.
pub async fn accept_loop(route: Arc<Route>, listener: Listener, tracker: TaskTracker) {
    let gate = Gate::new(&route.cfg.name, route.cfg.max_bridges);
    let mut failing = false;
    loop {
        let conn = tokio::select! {
            _ = route.cancel.cancelled() => return,
            c = accept(&listener) => c,
        };
        let (conn, closer) = match conn {
            Ok(c) => {
                failing = false;
                c
            }
            Err(e) => {
                // Out of descriptors and the like: the error repeats at once until a descriptor
                // frees up, so pause instead of spinning, and log once per run of errors.
                if !failing {
                    tracing::warn!(route = %route.cfg.name, error = %e, "cannot accept connections; retrying every 100 ms");
                    failing = true;
                }
                tokio::select! {
                    _ = route.cancel.cancelled() => return,
                    _ = tokio::time::sleep(RETRY_ACCEPT) => {}
                }
                continue;
            }
        };
        tracker.spawn(super::serve(route.clone(), conn, gate.arrive(), closer));
        // Let the connections already accepted read before the next one is: under a flood of
        // new connections an honest bridge's hello is read before newer ones evict it.
        tokio::task::yield_now().await;
    }
}

/// Accepts one connection, with a second descriptor of its socket kept to reset it if the
/// bridge has to be cut.
async fn accept(listener: &Listener) -> std::io::Result<(Conn, Closer)> {
    match listener {
        Listener::Tcp(l) => {
            let (s, _) = l.accept().await?;
            let closer = Closer::of(s.as_fd());
            Ok((Conn::tcp(s), closer))
        }
        Listener::Unix(l, _) => {
            let (s, _) = l.accept().await?;
            let closer = Closer::of(s.as_fd());
            Ok((Conn::unix(s), closer))
        }
    }
}
