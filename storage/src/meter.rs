//! What a store's readers have read so far, for a command's progress: frames decoded and the
//! session read last. Counted by the frame iterator; it must not read or hold frames itself.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::SessionId;

/// What the store's readers have read so far: frames, and the session read last. A command
/// that reads whole recordings watches it from another thread to show its progress, whichever
/// reader (export, report, episodes) walks the frames. Counted a chunk at a time.
#[derive(Debug, Default)]
pub struct ReadMeter {
    pub(crate) frames: AtomicU64,
    session: Mutex<Option<SessionId>>,
}

impl ReadMeter {
    /// Frames decoded so far, by every reader of this store.
    pub fn frames(&self) -> u64 {
        self.frames.load(Ordering::Relaxed)
    }

    /// The session the newest reader walks.
    pub fn session(&self) -> Option<SessionId> {
        *self.session.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A reader starts on `session`.
    pub(crate) fn reading(&self, session: SessionId) {
        *self.session.lock().unwrap_or_else(|p| p.into_inner()) = Some(session);
    }
}
