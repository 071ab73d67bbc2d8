//! Group-committed recording: frames, index entries and catalog entries in one `WriteBatch`.
//!
//! The caller (the relay's recorder thread) appends records as they arrive and calls
//! [`SessionWriter::commit`] once per tick. Records accumulate into chunks; a commit seals every
//! open chunk, writes the touched catalog entries and syncs the WAL when durability is `batch`.
//! Because a commit is one atomic batch, a crash leaves a clean prefix: whole commits only.

use std::collections::HashMap;

use rocksdb::{WriteBatch, WriteOptions};

use crate::catalog::{BridgeInfo, EndReason, SessionMeta, SessionState};
use crate::chunk::{ChunkBuilder, Direction, FrameRecord};
use crate::error::StoreError;
use crate::keys::{self, IndexEntry, CF_CATALOG, CF_CHAN_INDEX, CF_FRAMES};
use crate::store::{encode_meta, Durability, Store};
use crate::SessionId;

/// A chunk is sealed at this many frames (a measured sweet spot; see BENCHMARKS.md).
pub const CHUNK_FRAMES: u32 = 256;
/// ... or at this many encoded bytes, whichever comes first.
pub const CHUNK_BYTES: usize = 128 * 1024;

struct Open {
    meta: SessionMeta,
    committed: SessionMeta,
    next_frame: u64,
    committed_next: u64,
    chunk: ChunkBuilder,
    chunk_first: u64,
    /// (channel, first relay seq, its frame number, count) for the open chunk.
    runs: Vec<(u32, u64, u64, u32)>,
    dirty: bool,
    ended: bool,
}

/// Writes sessions into a [`Store`]. Not thread-safe by design: one recorder thread owns it.
pub struct SessionWriter {
    store: Store,
    open: HashMap<SessionId, Open>,
    batch: WriteBatch,
    staged: usize,
}

impl std::fmt::Debug for SessionWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionWriter")
            .field("open", &self.open.len())
            .field("staged", &self.staged)
            .finish()
    }
}

impl SessionWriter {
    /// A writer over an open (read-write) store.
    pub fn new(store: Store) -> SessionWriter {
        SessionWriter {
            store,
            open: HashMap::new(),
            batch: WriteBatch::default(),
            staged: 0,
        }
    }

    /// The store written to.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Starts a session; its catalog entry is written with the next commit.
    pub fn begin(&mut self, mut meta: SessionMeta) {
        meta.state = Some(SessionState::Recording);
        meta.last_ns = meta.last_ns.max(meta.started_ns);
        let committed = SessionMeta {
            state: None,
            ..meta.clone()
        };
        self.open.insert(
            meta.id,
            Open {
                meta,
                committed,
                next_frame: 0,
                committed_next: 0,
                chunk: ChunkBuilder::default(),
                chunk_first: 0,
                runs: Vec::new(),
                dirty: true,
                ended: false,
            },
        );
    }

    /// Names channel `channel` of `session`.
    pub fn define_channel(&mut self, session: SessionId, channel: u32, name: &str) {
        if let Some(o) = self.open.get_mut(&session) {
            let i = channel as usize;
            if o.meta.channels.len() <= i {
                o.meta.channels.resize(i + 1, String::new());
            }
            o.meta.channels[i] = name.to_string();
            o.dirty = true;
        }
    }

    /// Adds or replaces a bridge entry (matched by connection number).
    pub fn upsert_bridge(&mut self, session: SessionId, info: BridgeInfo) {
        if let Some(o) = self.open.get_mut(&session) {
            match o.meta.bridges.iter_mut().find(|b| b.conn == info.conn) {
                Some(b) => *b = info,
                None => o.meta.bridges.push(info),
            }
            o.dirty = true;
        }
    }

    /// Counts a mod frame that could not be routed.
    pub fn note_anomaly(&mut self, session: SessionId) {
        if let Some(o) = self.open.get_mut(&session) {
            o.meta.anomalies += 1;
            o.dirty = true;
        }
    }

    /// Counts a recording failure against every open session.
    pub fn note_error(&mut self) {
        for o in self.open.values_mut() {
            o.meta.record_errors += 1;
            o.dirty = true;
        }
    }

    /// Appends a frame; returns its frame number, or `None` for an unknown session.
    pub fn append(&mut self, session: SessionId, rec: &FrameRecord) -> Option<u64> {
        let o = self.open.get_mut(&session)?;
        let frame_no = o.next_frame;
        o.next_frame += 1;
        if o.chunk.is_empty() {
            o.chunk_first = frame_no;
        }
        o.chunk.push(rec);
        if let (Some(ch), Some(seq)) = (rec.channel, rec.relay_seq) {
            match o.runs.iter_mut().find(|r| r.0 == ch) {
                Some(run) => run.3 += 1,
                None => o.runs.push((ch, seq, frame_no, 1)),
            }
        }
        o.meta.frames += 1;
        o.meta.bytes += rec.body.len() as u64;
        o.meta.last_ns = o.meta.last_ns.max(rec.time_ns);
        if rec.dir == Direction::ModToRelay && rec.channel.is_some() {
            o.meta.events += 1;
        }
        o.dirty = true;
        self.staged += 1;
        if o.chunk.count() >= CHUNK_FRAMES || o.chunk.len() >= CHUNK_BYTES {
            seal(&self.store, &mut self.batch, session, o);
        }
        Some(frame_no)
    }

    /// Ends a session; it is written and closed with the next commit.
    pub fn end(&mut self, session: SessionId, reason: EndReason, at_ns: u64) {
        if let Some(o) = self.open.get_mut(&session) {
            o.meta.state = Some(SessionState::Ended);
            o.meta.end_reason = Some(reason);
            o.meta.ended_ns = Some(at_ns.max(o.meta.last_ns));
            for b in &mut o.meta.bridges {
                b.detached_ns.get_or_insert(at_ns);
            }
            o.ended = true;
            o.dirty = true;
        }
    }

    /// Frames appended since the last commit.
    pub fn staged(&self) -> usize {
        self.staged
    }

    /// Ids of sessions still open.
    pub fn open_sessions(&self) -> Vec<SessionId> {
        self.open.keys().copied().collect()
    }

    /// Writes everything appended since the last commit as one atomic batch.
    pub fn commit(&mut self) -> Result<usize, StoreError> {
        let catalog = self.store.cf(CF_CATALOG);
        for (id, o) in self.open.iter_mut() {
            if !o.chunk.is_empty() {
                seal(&self.store, &mut self.batch, *id, o);
            }
            if o.dirty {
                self.batch
                    .put_cf(catalog, keys::catalog_key(*id), encode_meta(&o.meta));
            }
        }
        let mut wo = WriteOptions::default();
        wo.set_sync(self.store.opts.durability == Durability::Batch);
        let batch = std::mem::take(&mut self.batch);
        self.store.db.write_opt(batch, &wo)?;
        let n = std::mem::take(&mut self.staged);
        self.open.retain(|_, o| {
            o.dirty = false;
            o.committed = o.meta.clone();
            o.committed_next = o.next_frame;
            !o.ended
        });
        Ok(n)
    }

    /// Drops everything appended since the last commit (after a failed commit, under the
    /// `continue` policy). Frame numbers roll back so the recording keeps no holes; the loss
    /// is counted in `lost_frames`. Returns how many frames were dropped.
    pub fn discard_staged(&mut self) -> usize {
        self.batch = WriteBatch::default();
        let lost = std::mem::take(&mut self.staged);
        for o in self.open.values_mut() {
            let lost_here = o.meta.frames - o.committed.frames;
            let (errors, ended, end_reason, ended_ns, bridges, channels) = (
                o.meta.record_errors,
                o.meta.state,
                o.meta.end_reason,
                o.meta.ended_ns,
                o.meta.bridges.clone(),
                o.meta.channels.clone(),
            );
            o.meta = o.committed.clone();
            o.meta.state = ended.or(Some(SessionState::Recording));
            o.meta.end_reason = end_reason;
            o.meta.ended_ns = ended_ns;
            o.meta.bridges = bridges;
            o.meta.channels = channels;
            o.meta.record_errors = errors;
            o.meta.lost_frames += lost_here;
            o.next_frame = o.committed_next;
            o.chunk = ChunkBuilder::default();
            o.runs.clear();
            o.dirty = true;
        }
        lost
    }
}

fn seal(store: &Store, batch: &mut WriteBatch, session: SessionId, o: &mut Open) {
    let chunk = o.chunk.finish();
    batch.put_cf(
        store.cf(CF_FRAMES),
        keys::frame_key(session, o.chunk_first),
        &chunk,
    );
    for (ch, seq, frame_no, count) in o.runs.drain(..) {
        let entry = IndexEntry {
            frame_no,
            chunk: o.chunk_first,
            count,
        };
        batch.put_cf(
            store.cf(CF_CHAN_INDEX),
            keys::index_key(session, ch, seq),
            entry.encode(),
        );
    }
}
