//! Shipping recordings to another machine and taking them in there: the ship cursor of each
//! session per destination, committed chunks read in order from it, the catalog snapshot
//! shipped with them, and the idempotent ingest a collector writes an archive with.
//!
//! More `catalog` parts, beside those of [`crate::keys`] (older relays skip them):
//!
//! | key                                | value                                         |
//! |------------------------------------|-----------------------------------------------|
//! | session id (16) · 4                | [`ShipCursor`] of the last snapshot applied (archive side; a source's from before destinations, no longer read) |
//! | session id (16) · 5                | JSON [`Origin`] (archive side)                |
//! | session id (16) · 6 · destination (8) | [`ShipCursor`], 33 bytes (source side)    |
//!
//! A cursor belongs to one [`Destination`]: shipping the same recordings to another cluster
//! or stream starts from the beginning there, and a session counts as shipped (for
//! retention) once any destination acknowledged all of it.
//!
//! Chunks are shipped exactly as stored (the encoding of [`crate::chunk`]), keyed by their
//! first frame number, so an archive holds the same keys and values as its source. Ingest is
//! keyed by (session, first frame): a chunk already there changes nothing, so re-applying a
//! message after a crash or a redelivery neither loses nor doubles anything. A catalog
//! snapshot carries a sequence number; one not newer than the last applied is skipped.

use std::collections::HashMap;

use bytes::Bytes;
use rocksdb::{Direction as Scan, IteratorMode, WriteBatch};
use serde::{Deserialize, Serialize};

use crate::catalog::{Counters, Gap, SessionMeta, SessionState};
use crate::chunk::{self, Direction, FrameRecord};
use crate::destination::Fnv;
use crate::error::StoreError;
use crate::keys::{self, Detail, IndexEntry, CF_CATALOG, CF_CHAN_INDEX, CF_DETAILS, CF_FRAMES};
use crate::store::{Durability, Store};
use crate::SessionId;

pub use crate::destination::Destination;

const PART_INGESTED: u8 = 4;
const PART_ORIGIN: u8 = 5;
const PART_SHIP_TO: u8 = 6;

fn part_key(id: SessionId, part: u8) -> [u8; 17] {
    let mut k = [0u8; 17];
    k[..16].copy_from_slice(id.as_bytes());
    k[16] = part;
    k
}

fn cursor_key(id: SessionId, to: Destination) -> [u8; 25] {
    let mut k = [0u8; 25];
    k[..17].copy_from_slice(&part_key(id, PART_SHIP_TO));
    k[17..].copy_from_slice(&to.0.to_be_bytes());
    k
}

/// How far a session has been shipped: what the destination acknowledged.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ShipCursor {
    /// Frames acknowledged (the next chunk to ship starts here).
    pub frames: u64,
    /// Body bytes of those frames.
    pub bytes: u64,
    /// Sequence number of the last catalog snapshot acknowledged (0: none yet).
    pub catalog_seq: u64,
    /// Fingerprint of that snapshot, so an unchanged catalog is not sent again.
    pub catalog_hash: u64,
}

impl ShipCursor {
    const LEN: usize = 33;
    const VERSION: u8 = 1;

    fn encode(&self) -> [u8; Self::LEN] {
        let mut v = [0u8; Self::LEN];
        v[0] = Self::VERSION;
        for (i, f) in [self.frames, self.bytes, self.catalog_seq, self.catalog_hash]
            .iter()
            .enumerate()
        {
            v[1 + 8 * i..9 + 8 * i].copy_from_slice(&f.to_be_bytes());
        }
        v
    }

    fn decode(v: &[u8]) -> Option<ShipCursor> {
        if v.len() != Self::LEN || v[0] != Self::VERSION {
            return None;
        }
        let f = |i: usize| u64::from_be_bytes(v[1 + 8 * i..9 + 8 * i].try_into().expect("8 bytes"));
        Some(ShipCursor {
            frames: f(0),
            bytes: f(1),
            catalog_seq: f(2),
            catalog_hash: f(3),
        })
    }
}

/// Where an archived session was recorded.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Origin {
    /// The recording machine's host name.
    pub host: String,
    /// The route it was recorded on.
    pub route: String,
    /// The version of the relay that recorded it.
    pub relay_version: String,
}

/// Everything of a session's catalog that is not frames: its entry (with welcome, channels,
/// bridges, tags, state and counters), its gaps, and where it was recorded.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CatalogSnapshot {
    /// Increases with every change shipped; a collector applies only newer ones.
    pub seq: u64,
    /// The entry, with details.
    pub meta: SessionMeta,
    /// Frames lost under `continue`.
    #[serde(default)]
    pub gaps: Vec<Gap>,
    /// Where it was recorded.
    pub origin: Origin,
}

impl CatalogSnapshot {
    /// A fingerprint of what a collector applies (not the sequence number, the origin or the
    /// frame counts, which come from the chunks): FNV-1a over the JSON.
    pub fn fingerprint(&self) -> u64 {
        let mut m = self.meta.clone();
        (m.frames, m.bytes, m.events, m.last_ns) = (0, 0, 0, 0);
        let body = serde_json::to_vec(&(&m, &self.gaps)).expect("a catalog snapshot serializes");
        let mut h = Fnv::default();
        h.write(&body);
        h.0
    }
}

/// One committed chunk, as stored.
#[derive(Debug, Clone)]
pub struct StoredChunk {
    /// Its first frame number (its key).
    pub first: u64,
    /// Frames it holds.
    pub frames: u64,
    /// Body bytes of those frames.
    pub bytes: u64,
    /// The stored value, unchanged.
    pub data: Bytes,
}

/// A frame too large for any message the destination takes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "frame {frame} is {size} bytes encoded, over the {limit}-byte message limit of the destination"
)]
pub struct Oversize {
    /// Its frame number.
    pub frame: u64,
    /// Its encoded size, alone in a chunk.
    pub size: usize,
    /// The limit it does not fit.
    pub limit: usize,
}

impl StoredChunk {
    /// This chunk as chunks of at most `limit` encoded bytes each, in order: itself when it
    /// fits, else its frames re-encoded in runs (a message is the unit a destination takes,
    /// and a recorder chunk may be larger than its `max_payload`). A single frame that does not
    /// fit alone is an [`Oversize`] error.
    pub fn split(self, limit: usize) -> Result<Vec<StoredChunk>, SplitError> {
        if self.data.len() <= limit {
            return Ok(vec![self]);
        }
        let recs = chunk::decode(self.data.clone())?;
        let mut out = Vec::new();
        let mut b = chunk::ChunkBuilder::default();
        let (mut first, mut bytes) = (self.first, 0u64);
        for (i, r) in recs.iter().enumerate() {
            let size = chunk::encoded_len(r);
            if !b.is_empty() && b.len() + size - chunk::CHUNK_PREFIX > limit {
                let frames = u64::from(b.count());
                out.push(StoredChunk {
                    first,
                    frames,
                    bytes,
                    data: b.finish(),
                });
                (first, bytes) = (first + frames, 0);
            }
            if size > limit {
                return Err(SplitError::Oversize(Oversize {
                    frame: self.first + i as u64,
                    size,
                    limit,
                }));
            }
            b.push(r);
            bytes += r.body.len() as u64;
        }
        if !b.is_empty() {
            let frames = u64::from(b.count());
            out.push(StoredChunk {
                first,
                frames,
                bytes,
                data: b.finish(),
            });
        }
        Ok(out)
    }
}

/// Why [`StoredChunk::split`] failed.
#[derive(Debug, thiserror::Error)]
pub enum SplitError {
    /// One frame alone is over the limit.
    #[error(transparent)]
    Oversize(#[from] Oversize),
    /// The stored chunk could not be decoded.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl Store {
    /// The ship cursor of a session at a destination (all zero before it acknowledged anything).
    pub fn ship_cursor(&self, id: SessionId, to: Destination) -> Result<ShipCursor, StoreError> {
        match self.db.get_cf(self.cf(CF_CATALOG), cursor_key(id, to))? {
            Some(v) => ShipCursor::decode(&v)
                .ok_or_else(|| StoreError::Corrupt("ship cursor: bad length or version".into())),
            None => Ok(ShipCursor::default()),
        }
    }

    /// Every ship cursor of a session, one per destination it was shipped to.
    pub fn ship_cursors(
        &self,
        id: SessionId,
    ) -> Result<Vec<(Destination, ShipCursor)>, StoreError> {
        let prefix = part_key(id, PART_SHIP_TO);
        let mut out = Vec::new();
        for item in self.db.iterator_cf(
            self.cf(CF_CATALOG),
            IteratorMode::From(&prefix, Scan::Forward),
        ) {
            let (k, v) = item?;
            if !k.starts_with(&prefix) {
                break;
            }
            let to = k[17..]
                .try_into()
                .map(|b| Destination(u64::from_be_bytes(b)))
                .map_err(|_| StoreError::Corrupt("ship cursor: bad key".into()))?;
            let c = ShipCursor::decode(&v)
                .ok_or_else(|| StoreError::Corrupt("ship cursor: bad length or version".into()))?;
            out.push((to, c));
        }
        Ok(out)
    }

    /// The cursor of the destination that acknowledged most of a session (`None`: never
    /// shipped anywhere).
    pub fn furthest_ship_cursor(&self, id: SessionId) -> Result<Option<ShipCursor>, StoreError> {
        Ok(self
            .ship_cursors(id)?
            .into_iter()
            .map(|(_, c)| c)
            .max_by_key(|c| (c.frames, c.catalog_seq)))
    }

    /// Records what a destination acknowledged. Not synced: a cursor lost to a power cut (a
    /// crash of the process loses nothing) only sends again what the destination already has,
    /// which the stream and the collector drop; an fsync per window would contend with the
    /// recorder's own WAL syncs on the hot path.
    pub fn set_ship_cursor(
        &self,
        id: SessionId,
        to: Destination,
        c: &ShipCursor,
    ) -> Result<(), StoreError> {
        self.db
            .put_cf(self.cf(CF_CATALOG), cursor_key(id, to), c.encode())?;
        Ok(())
    }

    /// Committed chunks of `id` from the one starting at frame `from`, in order, up to `max`
    /// chunks or about `max_bytes` (at least one chunk when there is one).
    pub fn chunks_from(
        &self,
        id: SessionId,
        from: u64,
        max: usize,
        max_bytes: usize,
    ) -> Result<Vec<StoredChunk>, StoreError> {
        let start = keys::frame_key(id, from);
        let mut ro = rocksdb::ReadOptions::default();
        ro.fill_cache(false);
        let mut out = Vec::new();
        let mut size = 0;
        for item in self.db.iterator_cf_opt(
            self.cf(CF_FRAMES),
            ro,
            IteratorMode::From(&start, Scan::Forward),
        ) {
            let (k, v) = item?;
            let Some((s, first)) = keys::parse_frame_key(&k) else {
                break;
            };
            if s != id {
                break;
            }
            let data = Bytes::from(v.into_vec());
            let recs = chunk::decode(data.clone())?;
            size += data.len();
            out.push(StoredChunk {
                first,
                frames: recs.len() as u64,
                bytes: recs.iter().map(|r| r.body.len() as u64).sum(),
                data,
            });
            if out.len() >= max || size >= max_bytes {
                break;
            }
        }
        Ok(out)
    }

    /// The catalog snapshot of a session as it stands (`seq` 0: the shipper numbers it).
    pub fn catalog_snapshot(
        &self,
        id: SessionId,
        host: &str,
    ) -> Result<Option<CatalogSnapshot>, StoreError> {
        let Some(meta) = self.session(id)? else {
            return Ok(None);
        };
        let gaps = self.gaps(id)?;
        let origin = match self.origin(id)? {
            // An archive shipped on keeps the first origin.
            Some(o) => o,
            None => Origin {
                host: host.to_string(),
                route: meta.route.clone(),
                relay_version: meta.relay_version.clone(),
            },
        };
        Ok(Some(CatalogSnapshot {
            seq: 0,
            meta,
            gaps,
            origin,
        }))
    }

    /// Sequence number of the last catalog snapshot an archive applied for `id` (0: none).
    fn ingested_catalog_seq(&self, id: SessionId) -> Result<u64, StoreError> {
        match self
            .db
            .get_cf(self.cf(CF_CATALOG), part_key(id, PART_INGESTED))?
        {
            Some(v) => ShipCursor::decode(&v)
                .map(|c| c.catalog_seq)
                .ok_or_else(|| StoreError::Corrupt("ingest cursor: bad length or version".into())),
            None => Ok(0),
        }
    }

    /// Where an archived session was recorded, if it came from elsewhere.
    pub fn origin(&self, id: SessionId) -> Result<Option<Origin>, StoreError> {
        match self
            .db
            .get_cf(self.cf(CF_CATALOG), part_key(id, PART_ORIGIN))?
        {
            Some(v) => {
                Ok(Some(serde_json::from_slice(&v).map_err(|e| {
                    StoreError::Corrupt(format!("origin: {e}"))
                })?))
            }
            None => Ok(None),
        }
    }

    /// Frames and body bytes of `m` not yet acknowledged by destination `to`, or, with no
    /// destination named, by the one that acknowledged most.
    pub fn ship_lag(
        &self,
        m: &SessionMeta,
        to: Option<Destination>,
    ) -> Result<(u64, u64), StoreError> {
        let c = match to {
            Some(to) => self.ship_cursor(m.id, to)?,
            None => self.furthest_ship_cursor(m.id)?.unwrap_or_default(),
        };
        Ok((
            m.frames.saturating_sub(c.frames),
            m.bytes.saturating_sub(c.bytes),
        ))
    }

    /// Whether `m` is ended and some destination acknowledged every frame and its final
    /// catalog.
    pub fn fully_shipped(&self, m: &SessionMeta) -> Result<bool, StoreError> {
        if m.state != Some(SessionState::Ended) {
            return Ok(false);
        }
        let cursors = self.ship_cursors(m.id)?;
        if !cursors
            .iter()
            .any(|(_, c)| c.frames >= m.frames && c.catalog_seq > 0)
        {
            return Ok(false);
        }
        let Some(snap) = self.catalog_snapshot(m.id, "")? else {
            return Ok(false);
        };
        let final_hash = snap.fingerprint();
        Ok(cursors.iter().any(|(_, c)| {
            c.frames >= m.frames && c.catalog_seq > 0 && c.catalog_hash == final_hash
        }))
    }

    /// Whether `m` is ended and destination `to` acknowledged every frame and its final
    /// catalog.
    pub fn fully_shipped_to(&self, m: &SessionMeta, to: Destination) -> Result<bool, StoreError> {
        if m.state != Some(SessionState::Ended) {
            return Ok(false);
        }
        let c = self.ship_cursor(m.id, to)?;
        if c.frames < m.frames || c.catalog_seq == 0 {
            return Ok(false);
        }
        Ok(self
            .catalog_snapshot(m.id, "")?
            .is_some_and(|s| s.fingerprint() == c.catalog_hash))
    }

    /// Starts a batch of idempotent writes into an archive.
    pub fn ingest(&self) -> Ingest<'_> {
        Ingest {
            store: self,
            batch: WriteBatch::default(),
            counters: HashMap::new(),
            chunks: HashMap::new(),
            snaps: HashMap::new(),
        }
    }
}

/// What [`Ingest::chunk`] did with a chunk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Taken {
    /// Added to the batch.
    New,
    /// Already in the archive or the batch: nothing to do.
    Known,
    /// Not a chunk this version can read (why, one line): nothing written.
    Undecodable(String),
}

/// A batch of chunks and catalog snapshots for an archive, written atomically by
/// [`Ingest::commit`]. Applying anything already applied changes nothing.
pub struct Ingest<'a> {
    store: &'a Store,
    batch: WriteBatch,
    /// Counters of every session touched, as they will stand after the commit.
    counters: HashMap<SessionId, Counters>,
    /// Chunk keys written in this batch (not yet readable from the store).
    chunks: HashMap<(SessionId, u64), ()>,
    /// Highest snapshot seq per session in this batch, and whether it says the session ended.
    snaps: HashMap<SessionId, (u64, bool)>,
}

impl std::fmt::Debug for Ingest<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ingest")
            .field("chunks", &self.chunks.len())
            .finish()
    }
}

impl Ingest<'_> {
    fn counters(&mut self, id: SessionId) -> Result<&mut Counters, StoreError> {
        if !self.counters.contains_key(&id) {
            let c = match self
                .store
                .db
                .get_cf(self.store.cf(CF_CATALOG), keys::counters_key(id))?
            {
                Some(v) => Counters::decode(&v)
                    .ok_or_else(|| StoreError::Corrupt("catalog counters".into()))?,
                // None yet (or chunks came before the first snapshot): count what is stored.
                None => {
                    let mut c = Counters::default();
                    for item in self.store.frames(id) {
                        let (_, r) = item?;
                        add_counts(&mut c, std::slice::from_ref(&r));
                    }
                    c
                }
            };
            self.counters.insert(id, c);
        }
        Ok(self.counters.get_mut(&id).expect("inserted above"))
    }

    /// Adds one shipped chunk (stored as is, its channel runs indexed, the session's counts
    /// raised); returns what it did with it.
    pub fn chunk(&mut self, id: SessionId, first: u64, data: Bytes) -> Result<Taken, StoreError> {
        let key = keys::frame_key(id, first);
        if self.chunks.contains_key(&(id, first))
            || self
                .store
                .db
                .get_pinned_cf(self.store.cf(CF_FRAMES), key)?
                .is_some()
        {
            return Ok(Taken::Known);
        }
        // An undecodable chunk is the message's fault, not the archive's: nothing is written.
        let recs = match chunk::decode(data.clone()) {
            Ok(r) => r,
            Err(e) => return Ok(Taken::Undecodable(e.to_string())),
        };
        let mut runs: Vec<(u32, u64, u64, u32)> = Vec::new();
        for (i, r) in recs.iter().enumerate() {
            if let (Some(ch), Some(seq)) = (r.channel, r.relay_seq) {
                match runs.iter_mut().find(|x| x.0 == ch) {
                    Some(x) => x.3 += 1,
                    None => runs.push((ch, seq, first + i as u64, 1)),
                }
            }
        }
        self.batch.put_cf(self.store.cf(CF_FRAMES), key, &data);
        for (ch, seq, frame_no, count) in runs {
            let e = IndexEntry {
                frame_no,
                chunk: first,
                count,
            };
            self.batch.put_cf(
                self.store.cf(CF_CHAN_INDEX),
                keys::index_key(id, ch, seq),
                e.encode(),
            );
        }
        let c = self.counters(id)?;
        add_counts(c, &recs);
        self.chunks.insert((id, first), ());
        Ok(Taken::New)
    }

    /// Applies a catalog snapshot unless one at least as new was applied, or the session has
    /// ended here and the snapshot says it has not (a session never starts recording again);
    /// returns whether it was applied. Counts of frames come from the chunks taken in, never
    /// from the snapshot.
    pub fn snapshot(&mut self, snap: &CatalogSnapshot) -> Result<bool, StoreError> {
        let id = snap.meta.id;
        let (applied, ended) = match self.snaps.get(&id) {
            Some(s) => *s,
            None => (
                self.store.ingested_catalog_seq(id)?,
                self.store
                    .session(id)?
                    .is_some_and(|m| m.state == Some(SessionState::Ended)),
            ),
        };
        if snap.seq <= applied || (ended && snap.meta.state != Some(SessionState::Ended)) {
            return Ok(false);
        }
        let mut meta = snap.meta.clone();
        let c = *self.counters(id)?;
        meta.frames = c.frames;
        meta.bytes = c.bytes;
        meta.events = c.events;
        meta.last_ns = c.last_ns.max(meta.started_ns);
        let store = self.store;
        crate::sessions::put_parts(store, &mut self.batch, &meta);
        if let Some(details) = store.details_cf() {
            for g in &snap.gaps {
                self.batch.put_cf(
                    details,
                    keys::detail_key(id, Detail::Gap, g.frame),
                    serde_json::to_vec(g).expect("a gap serializes"),
                );
            }
        }
        self.batch.put_cf(
            store.cf(CF_CATALOG),
            part_key(id, PART_ORIGIN),
            serde_json::to_vec(&snap.origin).expect("an origin serializes"),
        );
        // The archive remembers the last snapshot applied (in a cursor, as older versions did).
        let applied = ShipCursor {
            catalog_seq: snap.seq,
            ..ShipCursor::default()
        };
        self.batch.put_cf(
            store.cf(CF_CATALOG),
            part_key(id, PART_INGESTED),
            applied.encode(),
        );
        self.snaps
            .insert(id, (snap.seq, snap.meta.state == Some(SessionState::Ended)));
        let counters = self.counters.get_mut(&id).expect("read above");
        counters.anomalies = meta.anomalies;
        counters.record_errors = meta.record_errors;
        counters.lost_frames = meta.lost_frames;
        counters.last_ns = meta.last_ns;
        Ok(true)
    }

    /// Writes everything added, atomically, synced under `batch` durability.
    pub fn commit(mut self) -> Result<(), StoreError> {
        let cf = self.store.cf(CF_CATALOG);
        for (id, c) in &self.counters {
            // Counters without a session record would make the catalog unreadable: a chunk
            // that arrives first waits for its snapshot to write them (counted again then).
            let has_record = self.snaps.contains_key(id)
                || self
                    .store
                    .db
                    .get_pinned_cf(cf, keys::session_key(*id))?
                    .is_some();
            if has_record {
                self.batch.put_cf(cf, keys::counters_key(*id), c.encode());
            }
        }
        let mut wo = rocksdb::WriteOptions::default();
        wo.set_sync(self.store.opts.durability == Durability::Batch);
        self.store.db.write_opt(self.batch, &wo)?;
        Ok(())
    }

    /// Whether nothing was added.
    pub fn is_empty(&self) -> bool {
        self.batch.is_empty()
    }
}

fn add_counts(c: &mut Counters, recs: &[FrameRecord]) {
    for r in recs {
        c.frames += 1;
        c.bytes += r.body.len() as u64;
        c.last_ns = c.last_ns.max(r.time_ns);
        if r.dir == Direction::ModToRelay && r.channel.is_some() {
            c.events += 1;
        }
    }
}

/// Whether the store has the `details` family (used by tests of archives).
#[doc(hidden)]
pub fn has_details(store: &Store) -> bool {
    store.db.cf_handle(CF_DETAILS).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{SessionWriter, StoreOptions};

    fn record(store: &Store, frames: u64) -> SessionId {
        let mut w = SessionWriter::new(store.clone());
        let id = SessionId::now_v7();
        w.begin(SessionMeta {
            id,
            route: "r".into(),
            started_ns: 1,
            relay_version: "t".into(),
            channels: vec!["ch".into()],
            ..SessionMeta::default()
        });
        for i in 0..frames {
            let mut rec = FrameRecord::message(
                Direction::ModToRelay,
                0,
                10 + i,
                true,
                Bytes::from(format!("{{\"n\":{i}}}")),
            );
            rec.channel = Some(0);
            rec.relay_seq = Some(i);
            rec.mod_seq = Some(i);
            w.append(id, &rec);
            if i % 300 == 0 {
                w.commit().expect("commit");
            }
        }
        w.end(id, crate::EndReason::Clean, 5000);
        w.commit().expect("commit");
        id
    }

    /// Ships everything of `id` from `src` into `dst` the way the relay does, returning how
    /// many chunks were new.
    /// Ships `id` from `src` into `dst` as the shipper does (snapshot, chunks split to messages
    /// of at most `limit` bytes, final snapshot); returns how many chunks were new there.
    fn ship(src: &Store, dst: &Store, id: SessionId, seq: u64, limit: usize) -> usize {
        let mut new = 0;
        let mut snap = src
            .catalog_snapshot(id, "host")
            .expect("snap")
            .expect("some");
        snap.seq = seq;
        let mut ing = dst.ingest();
        ing.snapshot(&snap).expect("apply");
        let mut next = 0;
        for c in src.chunks_from(id, 0, 1000, usize::MAX).expect("chunks") {
            for p in split_checked(c, limit, next) {
                next = p.first + p.frames;
                new += usize::from(ing.chunk(id, p.first, p.data).expect("ingest") == Taken::New);
            }
        }
        // The final snapshot again, after the chunks, as the shipper sends it.
        snap.seq = seq + 1;
        ing.snapshot(&snap).expect("apply");
        ing.commit().expect("commit");
        new
    }

    /// `c` split to `limit`, checked: split only when over it, parts within it, contiguous
    /// from frame `next`, with the frames and bytes of the whole.
    fn split_checked(c: StoredChunk, limit: usize, next: u64) -> Vec<StoredChunk> {
        let (frames, bytes, size) = (c.frames, c.bytes, c.data.len());
        let parts = c.split(limit).expect("split");
        assert_eq!(
            parts.len() > 1,
            size > limit,
            "split only when over the limit"
        );
        assert_eq!(parts.iter().map(|p| p.frames).sum::<u64>(), frames);
        assert_eq!(parts.iter().map(|p| p.bytes).sum::<u64>(), bytes);
        let mut at = next;
        for p in &parts {
            assert!(p.data.len() <= limit, "{} > {limit}", p.data.len());
            assert_eq!(p.first, at, "parts are contiguous");
            at += p.frames;
        }
        parts
    }

    #[test]
    fn shipping_twice_changes_nothing_and_the_archive_equals_the_source() {
        let (a, b) = (
            tempfile::tempdir().expect("tmp"),
            tempfile::tempdir().expect("tmp"),
        );
        let src = Store::open(a.path(), StoreOptions::default()).expect("open");
        let dst = Store::open(b.path(), StoreOptions::default()).expect("open");
        let id = record(&src, 1000);
        let chunks = src.chunk_keys(id).expect("keys").len();
        assert!(chunks > 3, "several chunks: {chunks}");
        assert_eq!(ship(&src, &dst, id, 1, usize::MAX), chunks);
        assert_eq!(
            ship(&src, &dst, id, 1, usize::MAX),
            0,
            "nothing new the second time"
        );
        let (s, d) = (
            src.session(id).expect("s").expect("s"),
            dst.session(id).expect("d").expect("d"),
        );
        assert_eq!(s, d);
        assert!(dst.check_session(id).expect("check").ok());
        assert_eq!(dst.origin(id).expect("origin").expect("some").host, "host");
        let f = |st: &Store| st.frames(id).map(|r| r.expect("frame")).collect::<Vec<_>>();
        assert_eq!(f(&src), f(&dst));
        // A stale snapshot (older seq) is skipped.
        let mut old = src.catalog_snapshot(id, "h").expect("s").expect("s");
        old.seq = 1;
        old.meta.tags.insert("k".into(), "v".into());
        let mut ing = dst.ingest();
        assert!(!ing.snapshot(&old).expect("apply"));
        ing.commit().expect("commit");
        assert!(dst.session(id).expect("d").expect("d").tags.is_empty());
        // A newer one saying the ended session records again is skipped too, in a batch of
        // its own or after the end in the same batch; one that keeps it ended applies.
        let mut again = src.catalog_snapshot(id, "h").expect("s").expect("s");
        (again.meta.state, again.meta.end_reason, again.meta.ended_ns) =
            (Some(SessionState::Recording), None, None);
        again.seq = u64::MAX;
        let mut ing = dst.ingest();
        assert!(!ing.snapshot(&again).expect("apply"));
        ing.commit().expect("commit");
        let mut ended = src.catalog_snapshot(id, "h").expect("s").expect("s");
        ended.seq = 10;
        ended.meta.tags.insert("k".into(), "v".into());
        let mut ing = dst.ingest();
        assert!(ing.snapshot(&ended).expect("apply"));
        again.seq = 11;
        assert!(!ing.snapshot(&again).expect("apply"));
        ing.commit().expect("commit");
        let d = dst.session(id).expect("d").expect("d");
        assert_eq!(d.state, Some(SessionState::Ended));
        assert_eq!(d.tags.get("k").map(String::as_str), Some("v"));
        assert!(dst.check_session(id).expect("check").ok());
    }

    #[test]
    fn chunks_split_to_a_message_limit_make_the_same_archive() {
        let (a, b) = (
            tempfile::tempdir().expect("tmp"),
            tempfile::tempdir().expect("tmp"),
        );
        let src = Store::open(a.path(), StoreOptions::default()).expect("open");
        let dst = Store::open(b.path(), StoreOptions::default()).expect("open");
        let id = record(&src, 1000);
        let stored = src.chunks_from(id, 0, 1000, usize::MAX).expect("chunks");
        let biggest = stored.iter().map(|c| c.data.len()).max().expect("some");
        let limit = 1000;
        assert!(biggest > 4 * limit, "chunks to split: {biggest}");
        assert!(ship(&src, &dst, id, 1, limit) > stored.len());
        assert!(dst.check_session(id).expect("check").ok());
        let f = |st: &Store| st.frames(id).map(|r| r.expect("frame")).collect::<Vec<_>>();
        assert_eq!(f(&src), f(&dst));
        assert_eq!(
            src.session(id).expect("s").expect("s"),
            dst.session(id).expect("d").expect("d")
        );
        // A frame that cannot fit alone is named.
        let c = src
            .chunks_from(id, 0, 1, usize::MAX)
            .expect("chunks")
            .remove(0);
        // Its chunk is never larger than the frame re-encoded alone (LZ4 only when smaller).
        let limit = c.data.len() - 1;
        match c.split(limit) {
            Err(SplitError::Oversize(o)) => assert_eq!((o.frame, o.limit), (0, limit)),
            other => panic!("expected an oversize frame, got {other:?}"),
        }
    }

    #[test]
    fn an_undecodable_chunk_is_refused_and_the_rest_of_its_batch_goes_in() {
        let (a, b) = (
            tempfile::tempdir().expect("tmp"),
            tempfile::tempdir().expect("tmp"),
        );
        let src = Store::open(a.path(), StoreOptions::default()).expect("open");
        let dst = Store::open(b.path(), StoreOptions::default()).expect("open");
        let id = record(&src, 700);
        let mut snap = src.catalog_snapshot(id, "h").expect("s").expect("s");
        snap.seq = 1;
        let mut ing = dst.ingest();
        ing.snapshot(&snap).expect("apply");
        for bad in [&b"\x09junk"[..], b"", &[1, 5, 0, 0, 0, 1][..]] {
            let t = ing
                .chunk(id, 1_000_000, Bytes::from(bad.to_vec()))
                .expect("no db error");
            assert!(matches!(t, Taken::Undecodable(_)), "{t:?}");
        }
        for c in src.chunks_from(id, 0, 1000, usize::MAX).expect("chunks") {
            assert_eq!(ing.chunk(id, c.first, c.data).expect("ingest"), Taken::New);
        }
        ing.commit().expect("commit");
        let f = |st: &Store| st.frames(id).map(|r| r.expect("frame")).collect::<Vec<_>>();
        assert_eq!(f(&src), f(&dst));
        assert!(dst.check_session(id).expect("check").ok());
    }

    #[test]
    fn chunks_before_their_snapshot_are_counted_once_it_comes() {
        let (a, b) = (
            tempfile::tempdir().expect("tmp"),
            tempfile::tempdir().expect("tmp"),
        );
        let src = Store::open(a.path(), StoreOptions::default()).expect("open");
        let dst = Store::open(b.path(), StoreOptions::default()).expect("open");
        let id = record(&src, 700);
        let mut ing = dst.ingest();
        for c in src.chunks_from(id, 0, 1000, usize::MAX).expect("chunks") {
            ing.chunk(id, c.first, c.data).expect("ingest");
        }
        ing.commit().expect("commit");
        assert!(dst.sessions().expect("list").is_empty(), "no record yet");
        ship(&src, &dst, id, 5, usize::MAX);
        assert_eq!(
            src.session(id).expect("s").expect("s"),
            dst.session(id).expect("d").expect("d")
        );
        assert!(dst.check_session(id).expect("check").ok());
    }

    #[test]
    fn the_cursor_survives_a_reopen_and_guards_retention() {
        let a = tempfile::tempdir().expect("tmp");
        let src = Store::open(a.path(), StoreOptions::default()).expect("open");
        let id = record(&src, 50);
        let m = src.session(id).expect("s").expect("s");
        let to = Destination::new("GABP", 1, "gabp");
        assert!(!src.fully_shipped(&m).expect("q"));
        assert_eq!(src.ship_lag(&m, Some(to)).expect("lag"), (50, m.bytes));
        assert!(src
            .apply_retention_shipped(u64::MAX, Some(0), None, Some(to))
            .expect("retain")
            .is_empty());
        let snap = src.catalog_snapshot(id, "h").expect("s").expect("s");
        let c = ShipCursor {
            frames: 50,
            bytes: m.bytes,
            catalog_seq: 3,
            catalog_hash: snap.fingerprint(),
        };
        src.set_ship_cursor(id, to, &c).expect("set");
        drop(src);
        let src = Store::open(a.path(), StoreOptions::default()).expect("reopen");
        assert_eq!(src.ship_cursor(id, to).expect("cursor"), c);
        assert_eq!(src.ship_lag(&m, Some(to)).expect("lag"), (0, 0));
        assert!(src.fully_shipped(&m).expect("q"));
        // Shipped whole elsewhere is not shipped to where shipping goes now, and nothing is
        // shipped while that is not known: both keep it.
        let elsewhere = Destination::new("GABP", 2, "gabp");
        for keeps in [Some(elsewhere), None] {
            assert!(src
                .apply_retention_shipped(u64::MAX, Some(0), None, keeps)
                .expect("retain")
                .is_empty());
        }
        assert_eq!(
            src.apply_retention_shipped(u64::MAX, Some(0), None, Some(to))
                .expect("retain"),
            vec![id]
        );
    }

    #[test]
    fn an_archived_session_still_recording_at_its_source_is_not_marked_crashed() {
        let (a, b) = (
            tempfile::tempdir().expect("tmp"),
            tempfile::tempdir().expect("tmp"),
        );
        let src = Store::open(a.path(), StoreOptions::default()).expect("open");
        let id = record(&src, 10);
        let mut snap = src.catalog_snapshot(id, "h").expect("s").expect("s");
        (snap.meta.state, snap.meta.end_reason, snap.meta.ended_ns) =
            (Some(SessionState::Recording), None, None);
        snap.seq = 1;
        let dst = Store::open(b.path(), StoreOptions::default()).expect("open");
        let mut ing = dst.ingest();
        ing.snapshot(&snap).expect("apply");
        ing.commit().expect("commit");
        drop(dst);
        // A read-write open (the collector's, after a stop) marks a dead relay's sessions.
        let dst = Store::open(b.path(), StoreOptions::default()).expect("reopen");
        let m = dst.session(id).expect("s").expect("s");
        assert_eq!(m.state, Some(SessionState::Recording));
        assert_eq!(m.end_reason, None);
    }

    #[test]
    fn each_destination_has_its_own_cursor() {
        let a = tempfile::tempdir().expect("tmp");
        let src = Store::open(a.path(), StoreOptions::default()).expect("open");
        let id = record(&src, 40);
        let m = src.session(id).expect("s").expect("s");
        // The same stream name made again, or on another cluster, is another destination.
        let (first, again, other_prefix) = (
            Destination::new("GABP", 1_000, "gabp"),
            Destination::new("GABP", 2_000, "gabp"),
            Destination::new("GABP", 1_000, "lab"),
        );
        assert_ne!(first, again);
        assert_ne!(first, other_prefix);
        let snap = src.catalog_snapshot(id, "h").expect("s").expect("s");
        let all = ShipCursor {
            frames: 40,
            bytes: m.bytes,
            catalog_seq: 2,
            catalog_hash: snap.fingerprint(),
        };
        src.set_ship_cursor(id, first, &all).expect("set");
        let half = ShipCursor {
            frames: 20,
            ..ShipCursor::default()
        };
        src.set_ship_cursor(id, other_prefix, &half).expect("set");
        assert_eq!(
            src.ship_cursor(id, again).expect("c"),
            ShipCursor::default()
        );
        assert_eq!(src.ship_lag(&m, Some(again)).expect("lag"), (40, m.bytes));
        assert_eq!(src.ship_lag(&m, Some(other_prefix)).expect("lag").0, 20);
        assert_eq!(src.ship_lag(&m, None).expect("lag"), (0, 0));
        let mut cursors = src.ship_cursors(id).expect("cursors");
        cursors.sort_by_key(|(_, c)| c.frames);
        assert_eq!(cursors, vec![(other_prefix, half), (first, all)]);
        // Shipped whole to one destination is shipped; another session's cursors are its own.
        assert!(src.fully_shipped(&m).expect("q"));
        let other = record(&src, 5);
        assert!(src.ship_cursors(other).expect("cursors").is_empty());
        // Deleting the session deletes its cursors.
        src.delete_session(id).expect("rm");
        assert!(src.ship_cursors(id).expect("cursors").is_empty());
    }
}
