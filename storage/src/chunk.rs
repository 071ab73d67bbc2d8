//! Frame records and the chunk encoding: many frames per RocksDB value.
//!
//! A chunk is a version byte, a little-endian record count, then records. Each record is a
//! fixed 38-byte header (direction, flags, connection, receive time, channel, mod seq, relay seq,
//! body length) and the body bytes exactly as received. Version 2 chunks hold the same records
//! LZ4-compressed (after the count: the records' length, then one LZ4 block), which the recorder
//! writes when the store compresses frames with LZ4: RocksDB's WAL, memtables and flushes then
//! carry about a third of the bytes, and the chunk is compressed once instead of in every flush.
//! A chunk the compression would not shrink stays version 1. Decoding hands out bodies as slices
//! of one shared buffer, so reading a chunk copies nothing per frame.

use bytes::{Buf, BufMut, Bytes, BytesMut};

use crate::error::StoreError;

const VERSION: u8 = 1;
/// Records LZ4-compressed.
const VERSION_LZ4: u8 = 2;
/// A version 2 chunk's prefix: version, record count, records' length.
const LZ4_PREFIX: usize = 9;
/// No chunk's records are longer than this: a larger length read back is damage, and is never
/// allocated (the writer seals chunks at 128 KiB, plus one frame of at most 16 MiB).
const MAX_RECORDS_LEN: usize = 64 << 20;
const HEADER: usize = 38;
/// The largest compression buffer a builder keeps between chunks (sealed chunks are 128 KiB).
const SCRATCH_KEPT: usize = 256 * 1024;
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
    /// Finish as a version 2 (LZ4) chunk when that is smaller.
    lz4: bool,
    /// Where chunks are compressed, kept between chunks: a new zeroed buffer of the largest
    /// possible output per chunk cost more than the copy of the compressed bytes out of it.
    scratch: Vec<u8>,
}

impl ChunkBuilder {
    /// A builder whose chunks are LZ4-compressed when that makes them smaller.
    pub fn lz4() -> ChunkBuilder {
        ChunkBuilder {
            lz4: true,
            ..ChunkBuilder::default()
        }
    }

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

    /// Forgets what was pushed (the builder's kind stays).
    pub fn clear(&mut self) {
        self.buf.clear();
        self.count = 0;
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
        if buf.len() >= CHUNK_PREFIX {
            buf[1..5].copy_from_slice(&count.to_le_bytes());
        }
        if self.lz4 && buf.len() > CHUNK_PREFIX {
            if let Some(packed) = compress(count, &buf[CHUNK_PREFIX..], &mut self.scratch) {
                return packed;
            }
        }
        buf.freeze()
    }
}

/// A version 2 chunk of `records`, if it is at most 7/8 of the version 1 chunk (as RocksDB
/// judges its blocks: less saving is not worth a decompression on every read).
fn compress(count: u32, records: &[u8], scratch: &mut Vec<u8>) -> Option<Bytes> {
    let room = lz4_flex::block::get_maximum_output_size(records.len());
    // A chunk holding one huge frame is compressed in a buffer of its own, not kept.
    let mut once = Vec::new();
    let scratch = if room > SCRATCH_KEPT {
        &mut once
    } else {
        scratch
    };
    if scratch.len() < room {
        scratch.resize(room, 0);
    }
    let n = lz4_flex::block::compress_into(records, scratch).ok()?;
    if (LZ4_PREFIX + n) * 8 > (CHUNK_PREFIX + records.len()) * 7 {
        return None;
    }
    let mut out = BytesMut::with_capacity(LZ4_PREFIX + n);
    out.put_u8(VERSION_LZ4);
    out.put_u32_le(count);
    out.put_u32_le(u32::try_from(records.len()).ok()?);
    out.put_slice(&scratch[..n]);
    Some(out.freeze())
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
    if chunk.len() < CHUNK_PREFIX || !matches!(chunk[0], VERSION | VERSION_LZ4) {
        return Err(bad("bad version or header"));
    }
    let version = chunk.get_u8();
    let count = chunk.get_u32_le();
    if version == VERSION_LZ4 {
        if chunk.remaining() < LZ4_PREFIX - CHUNK_PREFIX {
            return Err(bad("truncated header"));
        }
        let len = chunk.get_u32_le() as usize;
        // LZ4 expands at most 255-fold: a longer claim is damage, whatever the cap allows.
        if len > MAX_RECORDS_LEN || len > chunk.len().saturating_mul(255) {
            return Err(bad("implausible length"));
        }
        let mut records = vec![0u8; len];
        match lz4_flex::block::decompress_into(&chunk, &mut records) {
            Ok(n) if n == len => {}
            _ => return Err(bad("damaged compressed records")),
        }
        chunk = Bytes::from(records);
    }
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

    fn event(i: u64) -> FrameRecord {
        FrameRecord {
            dir: Direction::ModToRelay,
            conn: 0,
            time_ns: 1_764_000_000_000_000_000 + i * 1000,
            channel: Some((i % 3) as u32),
            mod_seq: Some(i),
            relay_seq: Some(i / 3),
            json_ok: true,
            body: Bytes::from(format!(
                r#"{{"v":"gabp/1","type":"event","channel":"c{}","seq":{i},"payload":{{"x":{}}}}}"#,
                i % 3,
                i * 7
            )),
        }
    }

    #[test]
    fn lz4_chunks_round_trip_and_are_smaller() {
        let records: Vec<FrameRecord> = (0..256).map(event).collect();
        let (mut plain, mut packed) = (ChunkBuilder::default(), ChunkBuilder::lz4());
        for r in &records {
            plain.push(r);
            packed.push(r);
        }
        let (plain, packed) = (plain.finish(), packed.finish());
        assert_eq!(packed[0], VERSION_LZ4);
        assert!(
            packed.len() * 3 < plain.len(),
            "{} vs {}",
            packed.len(),
            plain.len()
        );
        assert_eq!(decode(packed.clone()).expect("decodes"), records);
        assert_eq!(decode(plain).expect("decodes"), records);
        // Damage anywhere is an error, never a panic or a wrong record list.
        for cut in [1, 5, 8, 9, packed.len() / 2, packed.len() - 1] {
            assert!(decode(packed.slice(..cut)).is_err(), "cut at {cut}");
        }
        for at in 9..packed.len() {
            let mut bad = packed.to_vec();
            bad[at] ^= 0x5a;
            if let Ok(recs) = decode(Bytes::from(bad)) {
                assert_eq!(recs.len(), 256, "a record count is kept or refused");
            }
        }
        let mut huge = packed.to_vec();
        huge[5..9].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(
            decode(Bytes::from(huge)).is_err(),
            "a huge length is refused"
        );
    }

    #[test]
    fn incompressible_records_stay_version_1() {
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let noise: Vec<u8> = (0..4000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        let r = FrameRecord::message(Direction::BridgeToRelay, 1, 2, false, Bytes::from(noise));
        let mut b = ChunkBuilder::lz4();
        b.push(&r);
        let chunk = b.finish();
        assert_eq!(chunk[0], VERSION);
        assert_eq!(decode(chunk).expect("decodes"), vec![r]);
    }
}
