//! Frame records and the chunk encoding: many frames per RocksDB value.
//!
//! A chunk is a version byte, a little-endian record count, then records. Each record is a
//! fixed 38-byte header (direction, flags, connection, receive time, channel, mod seq, relay seq,
//! body length) and the body bytes exactly as received. Decoding hands out bodies as slices of
//! one shared buffer, so reading a chunk copies nothing per frame.

use bytes::{Buf, BufMut, Bytes, BytesMut};

use crate::error::StoreError;

const VERSION: u8 = 1;
const HEADER: usize = 38;
/// The chunk's own prefix (version and record count) before its first record.
pub const CHUNK_PREFIX: usize = 5;
const HAS_CHANNEL: u8 = 1;
const HAS_MOD_SEQ: u8 = 2;
const HAS_RELAY_SEQ: u8 = 4;
const JSON_OK: u8 = 8;

/// Which way a frame travelled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Direction {
    /// Received from a bridge.
    BridgeToRelay = 0,
    /// Sent by the relay to the mod.
    RelayToMod = 1,
    /// Received from the mod.
    ModToRelay = 2,
    /// Sent by the relay to a bridge (frames the relay wrote itself).
    RelayToBridge = 3,
}

impl Direction {
    /// A short stable name, used in exports.
    pub fn as_str(self) -> &'static str {
        match self {
            Direction::BridgeToRelay => "bridge->relay",
            Direction::RelayToMod => "relay->mod",
            Direction::ModToRelay => "mod->relay",
            Direction::RelayToBridge => "relay->bridge",
        }
    }

    fn from_u8(b: u8) -> Option<Direction> {
        Some(match b {
            0 => Direction::BridgeToRelay,
            1 => Direction::RelayToMod,
            2 => Direction::ModToRelay,
            3 => Direction::RelayToBridge,
            _ => return None,
        })
    }
}

/// One recorded frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrameRecord {
    /// Which way it travelled.
    pub dir: Direction,
    /// The bridge connection it belongs to (0 for the mod's own traffic).
    pub conn: u32,
    /// Receive (or send) time, nanoseconds since the Unix epoch.
    pub time_ns: u64,
    /// Channel id (session-scoped) for events.
    pub channel: Option<u32>,
    /// The mod's own seq for events.
    pub mod_seq: Option<u64>,
    /// The relay's seq for events.
    pub relay_seq: Option<u64>,
    /// Whether the body parsed as JSON when it was received.
    pub json_ok: bool,
    /// The body exactly as received.
    pub body: Bytes,
}

impl FrameRecord {
    /// A frame that is not an event (request, response, handshake, notice), stamped now.
    pub fn message(
        dir: Direction,
        conn: u32,
        time_ns: u64,
        json_ok: bool,
        body: Bytes,
    ) -> FrameRecord {
        FrameRecord {
            dir,
            conn,
            time_ns,
            channel: None,
            mod_seq: None,
            relay_seq: None,
            json_ok,
            body,
        }
    }
}

/// The encoded size of `r` alone in a chunk (prefix included).
pub fn encoded_len(r: &FrameRecord) -> usize {
    CHUNK_PREFIX + HEADER + r.body.len()
}

/// Builds one chunk.
#[derive(Debug, Default)]
pub struct ChunkBuilder {
    buf: BytesMut,
    count: u32,
}

impl ChunkBuilder {
    /// Appends a record.
    pub fn push(&mut self, r: &FrameRecord) {
        if self.buf.is_empty() {
            self.buf.put_u8(VERSION);
            self.buf.put_u32_le(0);
        }
        let mut flags = 0;
        if r.channel.is_some() {
            flags |= HAS_CHANNEL;
        }
        if r.mod_seq.is_some() {
            flags |= HAS_MOD_SEQ;
        }
        if r.relay_seq.is_some() {
            flags |= HAS_RELAY_SEQ;
        }
        if r.json_ok {
            flags |= JSON_OK;
        }
        self.buf.reserve(HEADER + r.body.len());
        self.buf.put_u8(r.dir as u8);
        self.buf.put_u8(flags);
        self.buf.put_u32_le(r.conn);
        self.buf.put_u64_le(r.time_ns);
        self.buf.put_u32_le(r.channel.unwrap_or(0));
        self.buf.put_u64_le(r.mod_seq.unwrap_or(0));
        self.buf.put_u64_le(r.relay_seq.unwrap_or(0));
        self.buf.put_u32_le(r.body.len() as u32);
        self.buf.put_slice(&r.body);
        self.count += 1;
    }

    /// Records in the chunk so far.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// Encoded bytes so far.
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    /// Whether nothing was pushed.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Finishes the chunk and resets the builder.
    pub fn finish(&mut self) -> Bytes {
        let count = self.count;
        self.count = 0;
        let mut buf = self.buf.split();
        if buf.len() >= 5 {
            buf[1..5].copy_from_slice(&count.to_le_bytes());
        }
        buf.freeze()
    }
}

/// Decodes every record of a chunk.
pub fn decode(chunk: Bytes) -> Result<Vec<FrameRecord>, StoreError> {
    let mut out = Vec::new();
    decode_into(chunk, &mut out)?;
    Ok(out)
}

/// Decodes every record of a chunk, appending to `out`.
pub fn decode_into(mut chunk: Bytes, out: &mut Vec<FrameRecord>) -> Result<(), StoreError> {
    let bad = |what: &str| StoreError::Corrupt(format!("chunk: {what}"));
    if chunk.len() < 5 || chunk[0] != VERSION {
        return Err(bad("bad version or header"));
    }
    chunk.advance(1);
    let count = chunk.get_u32_le();
    out.reserve(count as usize);
    for _ in 0..count {
        if chunk.remaining() < HEADER {
            return Err(bad("truncated record header"));
        }
        let dir = Direction::from_u8(chunk.get_u8()).ok_or_else(|| bad("bad direction"))?;
        let flags = chunk.get_u8();
        let conn = chunk.get_u32_le();
        let time_ns = chunk.get_u64_le();
        let channel = chunk.get_u32_le();
        let mod_seq = chunk.get_u64_le();
        let relay_seq = chunk.get_u64_le();
        let len = chunk.get_u32_le() as usize;
        if chunk.remaining() < len {
            return Err(bad("truncated body"));
        }
        let body = chunk.split_to(len);
        out.push(FrameRecord {
            dir,
            conn,
            time_ns,
            channel: (flags & HAS_CHANNEL != 0).then_some(channel),
            mod_seq: (flags & HAS_MOD_SEQ != 0).then_some(mod_seq),
            relay_seq: (flags & HAS_RELAY_SEQ != 0).then_some(relay_seq),
            json_ok: flags & JSON_OK != 0,
            body,
        });
    }
    if chunk.has_remaining() {
        return Err(bad("trailing bytes"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_round_trip() {
        let records = vec![
            FrameRecord {
                dir: Direction::ModToRelay,
                conn: 0,
                time_ns: 5,
                channel: Some(2),
                mod_seq: Some(1),
                relay_seq: Some(0),
                json_ok: true,
                body: Bytes::from_static(b"{\"a\":1}"),
            },
            FrameRecord {
                dir: Direction::BridgeToRelay,
                conn: 3,
                time_ns: 6,
                channel: None,
                mod_seq: None,
                relay_seq: None,
                json_ok: false,
                body: Bytes::from_static(b"\xff\x00"),
            },
        ];
        let mut b = ChunkBuilder::default();
        for r in &records {
            b.push(r);
        }
        assert_eq!(b.count(), 2);
        let bytes = b.finish();
        assert_eq!(decode(bytes.clone()).expect("decodes"), records);
        assert!(
            decode(bytes.slice(..bytes.len() - 1)).is_err(),
            "truncation is detected"
        );
        assert!(b.is_empty());
    }
}
