//! The mod reader's direct write to a bridge: after a burst of events, what is queued for a
//! bridge whose writer task is idle goes out from the reader's own task, with no wake-up and
//! no context switch. Shared by the live mod's reader, the replay player and the bridge's
//! writer task (which records the same way). It never waits: a busy or full socket is left
//! to the writer task.

use gabp_storage::Direction;

use crate::outbox::socket::{BridgeSocket, Staged};
use crate::outbox::Outbox;
use crate::route::Route;

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
pub(crate) fn record_staged(route: &Route, sink: &BridgeSocket, staged: Staged) {
    route.metrics.bridge_out.increment(staged.events);
    for body in staged.notices {
        route.record_current_detached(Direction::RelayToBridge, sink.conn, body);
    }
}
