//! Writing to a bridge: its writer task, and the upstream's direct write when that task is idle.
//!
//! The writer drains the bridge's outbox in batches: relay/dropped notices first (they describe
//! gaps before what follows), then frames in the order they were queued, coalesced into few
//! write calls. A bridge that reads nothing for the write deadline is cut.

use std::sync::Arc;

use gabp_storage::Direction;

use crate::outbox::{CutReason, Outbox};
use crate::route::{BridgeState, Route};
use crate::socket::{BridgeSocket, Staged};

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

/// The mod reader's write to one bridge after a burst of events: if the bridge's writer is
/// idle, write what is queued right here without waiting (no wake-up, no context switch);
/// otherwise, or if the socket takes only part of it, wake the writer to do the rest.
pub fn write_from_reader(route: &Route, outbox: &Outbox) {
    outbox.clear_wake_mark();
    let Some(mut sink) = outbox.socket().try_idle() else {
        return outbox.wake();
    };
    if outbox.take(&mut sink.batch).is_none() {
        // Closed and drained: the writer shuts the socket.
        drop(sink);
        return outbox.wake();
    }
    let staged = sink.stage();
    let result = sink.write_now();
    // What the take counted as unwritten, now exact (nothing, when the socket took it all).
    outbox.note_unwritten(sink.queued_bytes());
    record_staged(route, &sink, staged);
    drop(sink);
    match result {
        Ok(true) => {}
        Ok(false) => outbox.wake(),
        Err(_) => outbox.close(),
    }
}

/// Counts what was staged and records its `relay/dropped` notices. Never waits on the
/// recorder: under `stall` that would freeze this bridge (and the mod reader).
fn record_staged(route: &Route, sink: &BridgeSocket, staged: Staged) {
    route.metrics.bridge_out.increment(staged.events);
    for body in staged.notices {
        route.record_current_detached(Direction::RelayToBridge, sink.conn, body);
    }
}
