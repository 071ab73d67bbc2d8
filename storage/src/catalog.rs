//! The session catalog's types and encodings: one [`SessionMeta`] per session, stored as parts
//! under keys of their own (see [`crate::keys`]), and the [`Gap`] records of frames lost under
//! `continue`.
//!
//! The counters are written in the same `WriteBatch` as the frames they count, so after a crash
//! the catalog always agrees with the frames that survived. The session record changes only at
//! the start and end, a bridge only when it attaches or changes; the welcome and channel names
//! are written once under `details` keys and filled into [`SessionMeta`] by
//! [`crate::Store::session`]. Entries of older data dirs (one JSON [`SessionMeta`], sometimes
//! with the welcome and channels inline) read the same. Tags ([`check_tag`]) live in the session
//! record; a record written before tags existed reads as a session without tags.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::error::StoreError;
use crate::keys::CatalogPart;
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

/// What a bridge without a named identity (the route's single token) is called wherever it is
/// shown: metrics, messages, stats and reports.
pub const DEFAULT_IDENTITY: &str = "default";

/// Channels one session may use (advertised or seen in events). Past it, events on new
/// channels are anomalies and further advertised channels are not subscribed to, so a mod
/// that invents channel names cannot grow the channel table, metrics and the catalog without
/// bound; a reader sizes its per-channel tables by it.
pub const MAX_CHANNELS: usize = 4096;

/// A bridge that attached during the session. The token is never stored.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BridgeInfo {
    /// The relay's connection number for this bridge.
    pub conn: u32,
    /// Its configured identity's name (`[[route.bridge]] name`), if it authenticated as one;
    /// `None` for the route's single token and in recordings made before identities existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
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
    /// Frames it sent that failed the bridge boundary's checks beyond the first few the relay
    /// records (with their error replies) per connection: answered and counted, not recorded,
    /// so garbage cannot fill the disk. Absent in older recordings (0).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub unrecorded_bad_frames: u64,
    /// Its requests refused over its identity's rate: counted, not recorded (like the bad
    /// frames above, a flood of them cannot fill the disk). Absent in older recordings (0).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub rate_limited: u64,
    /// Its requests refused because its identity may not send them, counted as it left (the
    /// recording keeps the first refusals only, like other bad frames). Absent in older
    /// recordings (0).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub denied: u64,
    /// Its requests refused while another bridge held the lease, counted as it left. Absent in
    /// older recordings (0).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub lease_refused: u64,
    /// The label it gave itself (its hello's `clientInfo.name`, cleaned and capped by the relay),
    /// shown beside its identity's name; absent when it gave none and in older recordings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
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
    /// Labels (`experiment=ppo-42`) from `serve --tag`, the route config or `sessions tag`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tags: BTreeMap<String, String>,
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

/// The session record: what a session is and how it ended (JSON, written at start and end).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Record {
    route: String,
    state: Option<SessionState>,
    end_reason: Option<EndReason>,
    started_ns: u64,
    ended_ns: Option<u64>,
    agent_id: Option<String>,
    app_name: Option<String>,
    app_version: Option<String>,
    relay_version: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    tags: BTreeMap<String, String>,
}

/// Encodes the session record of `m`.
pub(crate) fn encode_record(m: &SessionMeta) -> Vec<u8> {
    let r = Record {
        route: m.route.clone(),
        state: m.state,
        end_reason: m.end_reason,
        started_ns: m.started_ns,
        ended_ns: m.ended_ns,
        agent_id: m.agent_id.clone(),
        app_name: m.app_name.clone(),
        app_version: m.app_version.clone(),
        relay_version: m.relay_version.clone(),
        tags: m.tags.clone(),
    };
    serde_json::to_vec(&r).expect("a session record serializes")
}

/// Longest tag key, in bytes.
pub const MAX_TAG_KEY: usize = 64;
/// Longest tag value, in bytes.
pub const MAX_TAG_VALUE: usize = 256;
/// Most tags one session may carry.
pub const MAX_TAGS: usize = 32;

/// Checks one tag: a key of 1 to [`MAX_TAG_KEY`] bytes of letters, digits and `_ - . /`
/// (it becomes a column value and a filter, so nothing that needs quoting), and a value of at
/// most [`MAX_TAG_VALUE`] bytes without control characters. The error is one line.
pub fn check_tag(key: &str, value: &str) -> Result<(), String> {
    if key.is_empty() || key.len() > MAX_TAG_KEY {
        return Err(format!(
            "tag key {key:?}: expected 1 to {MAX_TAG_KEY} bytes"
        ));
    }
    if !key
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '/'))
    {
        return Err(format!(
            "tag key {:?}: only letters, digits and _ - . / are allowed",
            key.escape_debug().to_string()
        ));
    }
    if value.len() > MAX_TAG_VALUE {
        return Err(format!(
            "tag {key}: the value is longer than {MAX_TAG_VALUE} bytes"
        ));
    }
    if value.chars().any(char::is_control) {
        return Err(format!("tag {key}: the value contains control characters"));
    }
    Ok(())
}

/// Parses and checks `key=value`.
pub fn parse_tag(s: &str) -> Result<(String, String), String> {
    let Some((k, v)) = s.split_once('=') else {
        return Err(format!(
            "invalid tag {:?}: expected key=value",
            s.escape_debug().to_string()
        ));
    };
    check_tag(k, v)?;
    Ok((k.to_string(), v.to_string()))
}

/// A session's counters: fixed size, rewritten by every group commit that changes them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Counters {
    pub frames: u64,
    pub bytes: u64,
    pub events: u64,
    pub anomalies: u64,
    pub record_errors: u64,
    pub lost_frames: u64,
    pub last_ns: u64,
}

impl Counters {
    /// Encoded length: a version byte and seven big-endian u64.
    pub const LEN: usize = 57;
    const VERSION: u8 = 1;

    /// The counters of `m`.
    pub fn of(m: &SessionMeta) -> Counters {
        Counters {
            frames: m.frames,
            bytes: m.bytes,
            events: m.events,
            anomalies: m.anomalies,
            record_errors: m.record_errors,
            lost_frames: m.lost_frames,
            last_ns: m.last_ns,
        }
    }

    fn fields(&self) -> [u64; 7] {
        [
            self.frames,
            self.bytes,
            self.events,
            self.anomalies,
            self.record_errors,
            self.lost_frames,
            self.last_ns,
        ]
    }

    /// Writes them into `m`.
    pub fn apply(&self, m: &mut SessionMeta) {
        m.frames = self.frames;
        m.bytes = self.bytes;
        m.events = self.events;
        m.anomalies = self.anomalies;
        m.record_errors = self.record_errors;
        m.lost_frames = self.lost_frames;
        m.last_ns = self.last_ns;
    }

    /// The stored form.
    pub fn encode(&self) -> [u8; Self::LEN] {
        let mut v = [0u8; Self::LEN];
        v[0] = Self::VERSION;
        for (i, f) in self.fields().iter().enumerate() {
            v[1 + 8 * i..9 + 8 * i].copy_from_slice(&f.to_be_bytes());
        }
        v
    }

    /// Reads the stored form.
    pub fn decode(v: &[u8]) -> Option<Counters> {
        if v.len() != Self::LEN || v[0] != Self::VERSION {
            return None;
        }
        let f = |i: usize| u64::from_be_bytes(v[1 + 8 * i..9 + 8 * i].try_into().expect("8 bytes"));
        Some(Counters {
            frames: f(0),
            bytes: f(1),
            events: f(2),
            anomalies: f(3),
            record_errors: f(4),
            lost_frames: f(5),
            last_ns: f(6),
        })
    }
}

/// The stored parts of one session's catalog, gathered in key order and assembled into a
/// [`SessionMeta`]: the legacy entry first (older data dirs), then what the parts say.
#[derive(Debug, Default)]
pub(crate) struct Parts {
    legacy: Option<SessionMeta>,
    record: Option<Record>,
    counters: Option<Counters>,
    bridges: Vec<BridgeInfo>,
}

impl Parts {
    /// Adds one stored part.
    pub fn add(&mut self, part: CatalogPart, v: &[u8]) -> Result<(), StoreError> {
        let corrupt = |what: &str, e: &dyn std::fmt::Display| {
            StoreError::Corrupt(format!("catalog {what}: {e}"))
        };
        match part {
            CatalogPart::Legacy => {
                self.legacy = Some(serde_json::from_slice(v).map_err(|e| corrupt("entry", &e))?)
            }
            CatalogPart::Session => {
                self.record = Some(serde_json::from_slice(v).map_err(|e| corrupt("record", &e))?)
            }
            CatalogPart::Counters => {
                self.counters = Some(
                    Counters::decode(v)
                        .ok_or_else(|| corrupt("counters", &"bad length or version"))?,
                )
            }
            CatalogPart::Bridge(_) => self
                .bridges
                .push(serde_json::from_slice(v).map_err(|e| corrupt("bridge", &e))?),
        }
        Ok(())
    }

    /// The session these parts describe.
    pub fn into_meta(self, id: SessionId) -> Result<SessionMeta, StoreError> {
        let mut m = match (self.legacy, &self.record) {
            (Some(m), _) => m,
            (None, Some(_)) => SessionMeta::default(),
            (None, None) => {
                return Err(StoreError::Corrupt(format!(
                    "catalog of session {id}: parts without a session record"
                )))
            }
        };
        m.id = id;
        if let Some(r) = self.record {
            m.route = r.route;
            m.state = r.state;
            m.end_reason = r.end_reason;
            m.started_ns = r.started_ns;
            m.ended_ns = r.ended_ns;
            m.agent_id = r.agent_id;
            m.app_name = r.app_name;
            m.app_version = r.app_version;
            m.relay_version = r.relay_version;
            m.tags = r.tags;
        }
        if let Some(c) = self.counters {
            c.apply(&mut m);
        }
        if !self.bridges.is_empty() {
            m.bridges = self.bridges;
        }
        Ok(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_fixed_size_and_round_trip() {
        let c = Counters {
            frames: 1,
            bytes: 2,
            events: 3,
            anomalies: 4,
            record_errors: 5,
            lost_frames: 6,
            last_ns: u64::MAX,
        };
        let v = c.encode();
        assert_eq!(v.len(), Counters::LEN);
        assert_eq!(&v[..9], &[1, 0, 0, 0, 0, 0, 0, 0, 1]);
        assert_eq!(Counters::decode(&v), Some(c));
        assert_eq!(Counters::decode(&v[..56]), None);
    }

    #[test]
    fn a_record_without_tags_reads_as_no_tags_and_tags_round_trip() {
        let old = br#"{"route":"r","state":"ended","end_reason":"clean","started_ns":5,"ended_ns":9,"agent_id":null,"app_name":"g","app_version":null,"relay_version":"0.1.0"}"#;
        let mut parts = Parts::default();
        parts
            .add(CatalogPart::Session, old)
            .expect("an old record reads");
        let m = parts.into_meta(SessionId::nil()).expect("meta");
        assert!(m.tags.is_empty());
        assert_eq!(m.route, "r");
        let mut m = m;
        m.tags.insert("seed".into(), "7".into());
        let v = encode_record(&m);
        let mut parts = Parts::default();
        parts.add(CatalogPart::Session, &v).expect("reads");
        assert_eq!(parts.into_meta(m.id).expect("meta").tags, m.tags);
        // Without tags the stored record has no tags key: older relays read it unchanged.
        m.tags.clear();
        assert!(!String::from_utf8_lossy(&encode_record(&m)).contains("tags"));
    }

    #[test]
    fn tags_are_checked() {
        assert_eq!(
            parse_tag("experiment=ppo-42"),
            Ok(("experiment".into(), "ppo-42".into()))
        );
        assert_eq!(parse_tag("note=a=b"), Ok(("note".into(), "a=b".into())));
        assert!(parse_tag("k=").is_ok(), "an empty value is allowed");
        for bad in [
            "novalue",
            "=v",
            "a b=c",
            "k\u{7}=v",
            "k=line\nbreak",
            "k=tab\there",
        ] {
            let e = parse_tag(bad).expect_err(bad);
            assert_eq!(e.lines().count(), 1, "{e}");
        }
        assert!(parse_tag(&format!("{}=v", "k".repeat(MAX_TAG_KEY + 1))).is_err());
        assert!(parse_tag(&format!("k={}", "v".repeat(MAX_TAG_VALUE + 1))).is_err());
        assert!(parse_tag(&format!("k={}", "v".repeat(MAX_TAG_VALUE))).is_ok());
    }
}
