//! Writing to a bridge: its writer task (the mod reader's direct write when this task is idle
//! is `crate::direct`).
//!
//! The writer drains the bridge's outbox in batches: relay/dropped notices first (they describe
//! gaps before what follows), then frames in the order they were queued, coalesced into few
//! write calls. A bridge that reads nothing for the write deadline is cut.

use std::sync::Arc;

use crate::direct::record_staged;
use crate::outbox::CutReason;
use crate::route::{BridgeState, Route};

/// The bridge's writer task: writes whatever the mod reader did not write directly (control
/// frames, notices, bursts a full socket held back), waiting for the socket as long as it keeps
/// taking bytes or the peer keeps reading; a bridge that reads nothing for the write deadline
/// is cut.
pub(super) async fn write_loop(route: Arc<Route>, bridge: Arc<BridgeState>) {
    let outbox = &bridge.outbox;
    let deadline = route.cfg.write_deadline;
    loop {
        // The slot is empty only while this task holds the lease, so this always succeeds;
        // the mod reader writes in place under the slot's lock and never takes it out.
        let Some(mut sink) = outbox.socket().lease() else {
            outbox.ready().await;
            continue;
        };
        // What the mod reader's direct write left in the socket goes out before more is
        // taken: a bridge that reads nothing then holds at most one take beside its outbox,
        // never a take on top of a leftover (2.2x its bound was seen from outside).
        let open = !sink.is_idle() || outbox.take(&mut sink.batch).is_some();
        let staged = sink.stage();
        outbox.note_unwritten(sink.queued_bytes());
        let written = sink.flush(deadline).await;
        outbox.note_unwritten(sink.queued_bytes());
        record_staged(&route, &sink, staged);
        match written {
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {
                // Retiring the socket here lets the connection task reset it.
                outbox.cut(CutReason::WriteDeadline);
                return sink.retire();
            }
            Err(_) => {
                // A write failure means the bridge is gone: stop queueing for it.
                outbox.close();
                return sink.retire();
            }
            Ok(()) if !open => {
                let _ = tokio::time::timeout(deadline, sink.shutdown()).await;
                return sink.retire();
            }
            Ok(()) => {}
        }
        drop(sink); // back in the slot
        if !outbox.has_queued() {
            outbox.ready().await;
        }
    }
}
