//! The key layout. Every key is big-endian so lexicographic order is numeric order.
//!
//! | column family | key                                              | value                      |
//! |---------------|--------------------------------------------------|----------------------------|
//! | `frames`      | session id (16) · first frame number (8)         | a chunk ([`crate::chunk`]) |
//! | `chan_index`  | session id (16) · channel id (4) · relay seq (8) | [`IndexEntry`]             |
//! | `catalog`     | session id (16) · 1                              | JSON session record        |
//! | `catalog`     | session id (16) · 2                              | counters, 57 bytes         |
//! | `catalog`     | session id (16) · 3 · connection number (4)      | JSON [`crate::BridgeInfo`] |
//! | `catalog`     | session id (16) (older data dirs only)           | JSON [`crate::SessionMeta`]|
//! | `details`     | session id (16) · kind (1) · number (8)          | see [`Detail`]             |
//!
//! The catalog keeps each part of a session under a key of its own ([`CatalogPart`]), written
//! only when that part changes: the session record (route, the mod's identity, state, how it
//! ended) at its start and its end; the counters (fixed size: version 1, then frames, bytes,
//! events, anomalies, record errors, lost frames and the last frame's time, each a big-endian
//! u64) with every group commit that changes them; a bridge when it attaches or changes. So a
//! commit rewrites 57 bytes per session however many bridges and channels it has, and listing
//! sessions is one scan of the small `catalog` family, never of frames. Data dirs written before
//! this layout hold one JSON entry per session under the bare session id; it is still read
//! (and replaced by the parts above when a read-write open rewrites it).
//!
//! What can grow with the mod (its welcome, every channel name) lives under `details` keys,
//! each written once: kind 1 the welcome (number 0, JSON), kind 2 a channel's name (number =
//! channel id, UTF-8), kind 3 a gap (number = the frame number it sits before, JSON
//! [`crate::catalog::Gap`]): frames lost to a failed write under `--on-record-error continue`.
//!
//! Frames are packed into chunks (many frames per value, as MCAP does): one RocksDB put per
//! frame was measured far slower than one per chunk. A chunk's key is the number of its first
//! frame, so a range scan over a session prefix yields every frame in arrival order, and the
//! chunk holding frame N is the last key at or before (session, N).
//!
//! The channel index has one entry per channel per chunk: its key carries the first relay seq of
//! that channel within the chunk, so the chunk holding (channel, seq S) is the last index key at
//! or before (session, channel, S).

use crate::SessionId;

/// Column family of frame chunks.
pub const CF_FRAMES: &str = "frames";
/// Column family of the per-channel index.
pub const CF_CHAN_INDEX: &str = "chan_index";
/// Column family of the session catalog.
pub const CF_CATALOG: &str = "catalog";
/// Column family of per-session details written once (welcome, channel names, gaps).
pub const CF_DETAILS: &str = "details";

/// Kinds of `details` records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Detail {
    /// The mod's welcome result (number 0).
    Welcome = 1,
    /// A channel's name (number = channel id).
    Channel = 2,
    /// Frames lost before frame `number` (under `continue`).
    Gap = 3,
}

/// Length of a `details` key.
pub const DETAIL_KEY_LEN: usize = 25;

/// `details` key.
pub fn detail_key(session: SessionId, kind: Detail, n: u64) -> [u8; DETAIL_KEY_LEN] {
    let mut k = [0u8; DETAIL_KEY_LEN];
    k[..16].copy_from_slice(session.as_bytes());
    k[16] = kind as u8;
    k[17..].copy_from_slice(&n.to_be_bytes());
    k
}

/// Splits a `details` key into (session, kind byte, number).
pub fn parse_detail_key(k: &[u8]) -> Option<(SessionId, u8, u64)> {
    if k.len() != DETAIL_KEY_LEN {
        return None;
    }
    let session = SessionId::from_slice(&k[..16]).ok()?;
    Some((session, k[16], u64::from_be_bytes(k[17..].try_into().ok()?)))
}

/// Length of a frames key.
pub const FRAME_KEY_LEN: usize = 24;
/// Length of a channel index key.
pub const INDEX_KEY_LEN: usize = 28;

/// `frames` key for the chunk starting at `frame_no`.
pub fn frame_key(session: SessionId, frame_no: u64) -> [u8; FRAME_KEY_LEN] {
    let mut k = [0u8; FRAME_KEY_LEN];
    k[..16].copy_from_slice(session.as_bytes());
    k[16..].copy_from_slice(&frame_no.to_be_bytes());
    k
}

/// Splits a `frames` key.
pub fn parse_frame_key(k: &[u8]) -> Option<(SessionId, u64)> {
    if k.len() != FRAME_KEY_LEN {
        return None;
    }
    let session = SessionId::from_slice(&k[..16]).ok()?;
    Some((session, u64::from_be_bytes(k[16..].try_into().ok()?)))
}

/// `chan_index` key.
pub fn index_key(session: SessionId, channel: u32, relay_seq: u64) -> [u8; INDEX_KEY_LEN] {
    let mut k = [0u8; INDEX_KEY_LEN];
    k[..16].copy_from_slice(session.as_bytes());
    k[16..20].copy_from_slice(&channel.to_be_bytes());
    k[20..].copy_from_slice(&relay_seq.to_be_bytes());
    k
}

/// Splits a `chan_index` key.
pub fn parse_index_key(k: &[u8]) -> Option<(SessionId, u32, u64)> {
    if k.len() != INDEX_KEY_LEN {
        return None;
    }
    let session = SessionId::from_slice(&k[..16]).ok()?;
    let channel = u32::from_be_bytes(k[16..20].try_into().ok()?);
    Some((
        session,
        channel,
        u64::from_be_bytes(k[20..].try_into().ok()?),
    ))
}

/// The legacy `catalog` key: one JSON entry per session, as data dirs written before the
/// catalog was split into parts hold it (read, never written).
pub fn catalog_key(session: SessionId) -> [u8; 16] {
    *session.as_bytes()
}

/// The parts of a session's catalog, each under a key of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CatalogPart {
    /// The whole JSON entry of an older data dir (the bare session id).
    Legacy,
    /// The session record (JSON): route, the mod's identity, state and end.
    Session,
    /// The counters (fixed size), rewritten by group commits.
    Counters,
    /// One bridge (JSON), by connection number.
    Bridge(u32),
}

const PART_SESSION: u8 = 1;
const PART_COUNTERS: u8 = 2;
const PART_BRIDGE: u8 = 3;

/// `catalog` key of a session's record.
pub fn session_key(session: SessionId) -> [u8; 17] {
    let mut k = [0u8; 17];
    k[..16].copy_from_slice(session.as_bytes());
    k[16] = PART_SESSION;
    k
}

/// `catalog` key of a session's counters.
pub fn counters_key(session: SessionId) -> [u8; 17] {
    let mut k = session_key(session);
    k[16] = PART_COUNTERS;
    k
}

/// `catalog` key of one bridge of a session.
pub fn bridge_key(session: SessionId, conn: u32) -> [u8; 21] {
    let mut k = [0u8; 21];
    k[..16].copy_from_slice(session.as_bytes());
    k[16] = PART_BRIDGE;
    k[17..].copy_from_slice(&conn.to_be_bytes());
    k
}

/// Splits a `catalog` key into (session, part); `None` for a key of no known part.
pub fn parse_catalog_key(k: &[u8]) -> Option<(SessionId, CatalogPart)> {
    let session = SessionId::from_slice(k.get(..16)?).ok()?;
    let part = match (k.get(16), k.len()) {
        (None, 16) => CatalogPart::Legacy,
        (Some(&PART_SESSION), 17) => CatalogPart::Session,
        (Some(&PART_COUNTERS), 17) => CatalogPart::Counters,
        (Some(&PART_BRIDGE), 21) => {
            CatalogPart::Bridge(u32::from_be_bytes(k[17..21].try_into().ok()?))
        }
        _ => return None,
    };
    Some((session, part))
}

/// A key above every key with this session prefix (for range deletes): the prefix followed by
/// more 0xff bytes than any key of ours has after it (keys are at most 28 bytes).
pub fn session_end(session: SessionId) -> [u8; 29] {
    let mut k = [0xffu8; 29];
    k[..16].copy_from_slice(session.as_bytes());
    k
}

/// Value of a `chan_index` entry: where the channel's run inside one chunk starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexEntry {
    /// Frame number of the first frame of this channel in the chunk.
    pub frame_no: u64,
    /// Key (first frame number) of the chunk.
    pub chunk: u64,
    /// How many frames of this channel the chunk holds.
    pub count: u32,
}

impl IndexEntry {
    /// Encoded length.
    pub const LEN: usize = 20;

    /// Encodes the entry.
    pub fn encode(&self) -> [u8; Self::LEN] {
        let mut v = [0u8; Self::LEN];
        v[..8].copy_from_slice(&self.frame_no.to_be_bytes());
        v[8..16].copy_from_slice(&self.chunk.to_be_bytes());
        v[16..].copy_from_slice(&self.count.to_be_bytes());
        v
    }

    /// Decodes an entry.
    pub fn decode(v: &[u8]) -> Option<IndexEntry> {
        if v.len() != Self::LEN {
            return None;
        }
        Some(IndexEntry {
            frame_no: u64::from_be_bytes(v[..8].try_into().ok()?),
            chunk: u64::from_be_bytes(v[8..16].try_into().ok()?),
            count: u32::from_be_bytes(v[16..].try_into().ok()?),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_round_trips_and_sorts_numerically() {
        let s = SessionId::now_v7();
        assert_eq!(parse_frame_key(&frame_key(s, 258)), Some((s, 258)));
        assert_eq!(
            parse_index_key(&index_key(s, 7, 1 << 40)),
            Some((s, 7, 1 << 40))
        );
        assert!(frame_key(s, 255) < frame_key(s, 256));
        assert!(index_key(s, 1, u64::MAX) < index_key(s, 2, 0));
        assert!(frame_key(s, u64::MAX).as_slice() < session_end(s).as_slice());
        assert!(index_key(s, u32::MAX, u64::MAX).as_slice() < session_end(s).as_slice());
        // Pin the byte layout itself: changing it breaks every recorded data dir.
        let fixed = SessionId::from_u128(0x0102030405060708090a0b0c0d0e0f10);
        assert_eq!(
            frame_key(fixed, 0x1122),
            [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 0, 0, 0, 0, 0, 0, 0x11, 0x22]
        );
        assert_eq!(
            detail_key(fixed, Detail::Channel, 7),
            [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 2, 0, 0, 0, 0, 0, 0, 0, 7]
        );
        assert_eq!(detail_key(fixed, Detail::Welcome, 0)[16], 1);
        assert_eq!(detail_key(fixed, Detail::Gap, 0)[16], 3);
        assert_eq!(
            parse_detail_key(&detail_key(s, Detail::Gap, 9)),
            Some((s, 3, 9))
        );
        assert!(detail_key(s, Detail::Gap, u64::MAX).as_slice() < session_end(s).as_slice());
        // The catalog's parts: legacy entry, then record, counters, bridges in connection order.
        let mut head = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16].to_vec();
        assert_eq!(catalog_key(fixed).as_slice(), head.as_slice());
        head.push(1);
        assert_eq!(session_key(fixed).as_slice(), head.as_slice());
        head[16] = 2;
        assert_eq!(counters_key(fixed).as_slice(), head.as_slice());
        head[16] = 3;
        head.extend([0, 0, 1, 2]);
        assert_eq!(bridge_key(fixed, 0x102).as_slice(), head.as_slice());
        assert!(catalog_key(s).as_slice() < session_key(s).as_slice());
        assert!(session_key(s) < counters_key(s));
        assert!(counters_key(s).as_slice() < bridge_key(s, 0).as_slice());
        assert!(bridge_key(s, 9) < bridge_key(s, 10));
        assert!(bridge_key(s, u32::MAX).as_slice() < session_end(s).as_slice());
        for (k, part) in [
            (catalog_key(s).to_vec(), CatalogPart::Legacy),
            (session_key(s).to_vec(), CatalogPart::Session),
            (counters_key(s).to_vec(), CatalogPart::Counters),
            (bridge_key(s, 7).to_vec(), CatalogPart::Bridge(7)),
        ] {
            assert_eq!(parse_catalog_key(&k), Some((s, part)));
        }
        assert_eq!(parse_catalog_key(&[0u8; 18]), None);
        let e = IndexEntry {
            frame_no: 9,
            chunk: 8,
            count: 3,
        };
        assert_eq!(IndexEntry::decode(&e.encode()), Some(e));
    }
}
