//! The session catalog: one small JSON entry per session (counters and state), rewritten with
//! every group commit, and the [`Gap`] records of frames lost under `continue`.
//!
//! Because the entry is written in the same `WriteBatch` as the frames it counts, after a crash
//! the catalog always agrees with the frames that survived. The welcome and channel names are
//! written once under `details` keys of their own (see [`crate::keys`]) and filled into
//! [`SessionMeta`] by [`crate::Store::session`]; entries of older data dirs still carry them
//! inline and read the same.

use serde::{Deserialize, Serialize};

use crate::SessionId;

/// Whether a session is still being written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SessionState {
    /// A relay is (or was, until it crashed) recording it.
    Recording,
    /// It has ended.
    Ended,
}

/// How a session ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EndReason {
    /// The mod closed its connection at a frame boundary.
    Clean,
    /// The mod's connection broke (reset, timeout, truncated frame).
    ModGone,
    /// The relay shut down.
    RelayShutdown,
    /// The relay died; found unfinished when the data dir was next opened.
    Crash,
}

impl EndReason {
    /// A short stable name.
    pub fn as_str(self) -> &'static str {
        match self {
            EndReason::Clean => "clean",
            EndReason::ModGone => "mod_gone",
            EndReason::RelayShutdown => "relay_shutdown",
            EndReason::Crash => "crash",
        }
    }
}

/// A bridge that attached during the session. The token is never stored.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BridgeInfo {
    /// The relay's connection number for this bridge.
    pub conn: u32,
    /// `bridgeVersion` from its hello.
    pub bridge_version: String,
    /// `platform` from its hello.
    pub platform: String,
    /// `launchId` from its hello.
    pub launch_id: String,
    /// Where it connected from.
    pub peer: String,
    /// When its hello succeeded (ns since epoch).
    pub attached_ns: u64,
    /// When it went away, if it did during the session.
    pub detached_ns: Option<u64>,
    /// Events dropped for it by its backpressure policy.
    pub dropped: u64,
    /// Its backpressure policy.
    pub policy: String,
}

/// One session's catalog entry.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SessionMeta {
    /// The session id (UUID v7).
    pub id: SessionId,
    /// The route's name.
    pub route: String,
    /// Recording or ended.
    pub state: Option<SessionState>,
    /// How it ended.
    pub end_reason: Option<EndReason>,
    /// When the mod's welcome arrived (ns since epoch).
    pub started_ns: u64,
    /// When it ended.
    pub ended_ns: Option<u64>,
    /// Time of the last recorded frame.
    pub last_ns: u64,
    /// The mod's `agentId`.
    pub agent_id: Option<String>,
    /// The mod's `app.name`.
    pub app_name: Option<String>,
    /// The mod's `app.version`.
    pub app_version: Option<String>,
    /// The mod's welcome result, whole (stored under its own key; see the module doc).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub welcome: Option<serde_json::Value>,
    /// Version of the relay that recorded it.
    pub relay_version: String,
    /// Bridges that attached.
    pub bridges: Vec<BridgeInfo>,
    /// Channel names; a frame's channel id indexes this list (stored under keys of their own).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub channels: Vec<String>,
    /// Frames recorded.
    pub frames: u64,
    /// Body bytes recorded.
    pub bytes: u64,
    /// Events received from the mod.
    pub events: u64,
    /// Frames from the mod that could not be routed.
    pub anomalies: u64,
    /// Recording failures (I/O errors, full disk).
    pub record_errors: u64,
    /// Frames lost to recording failures under the `continue` policy.
    pub lost_frames: u64,
}

/// Frames lost to failed writes under `--on-record-error continue`, recorded where they would
/// have been so that `sessions check` can tell an announced gap from a hole.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Gap {
    /// The frame number the lost frames would have started at (the next stored frame's).
    pub frame: u64,
    /// Frames lost.
    pub frames: u64,
    /// Body bytes lost.
    pub bytes: u64,
    /// Per channel: (channel id, first relay seq lost, how many).
    pub channels: Vec<(u32, u64, u64)>,
}

impl Gap {
    /// Adds a further loss at the same place.
    pub fn merge(
        &mut self,
        frames: u64,
        bytes: u64,
        runs: impl IntoIterator<Item = (u32, u64, u64)>,
    ) {
        self.frames += frames;
        self.bytes += bytes;
        for (ch, first, n) in runs {
            match self
                .channels
                .iter_mut()
                .find(|c| c.0 == ch && c.1 + c.2 == first)
            {
                Some(c) => c.2 += n,
                None => self.channels.push((ch, first, n)),
            }
        }
    }
}

impl SessionMeta {
    /// Duration in nanoseconds, up to the end or the last frame.
    pub fn duration_ns(&self) -> u64 {
        self.ended_ns
            .unwrap_or(self.last_ns)
            .saturating_sub(self.started_ns)
    }

    /// The end reason as a word, or `recording`.
    pub fn end_label(&self) -> &'static str {
        match (self.state, self.end_reason) {
            (_, Some(r)) => r.as_str(),
            _ => "recording",
        }
    }
}
