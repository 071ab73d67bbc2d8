//! Group-committed recording: frames, index entries and catalog parts in one `WriteBatch`.
//!
//! The caller (the relay's recorder thread) appends records as they arrive and calls
//! [`SessionWriter::commit`] once per tick. Records accumulate into chunks; a commit seals every
//! open chunk, writes the catalog parts that changed (a session's fixed-size counters; its
//! record only at start and end; a bridge only when it changes: see [`crate::keys`]) and syncs
//! the WAL when durability is `batch`.
//! Because a commit is one atomic batch, a crash leaves a clean prefix: whole commits only.
//!
//! A failed commit keeps everything it tried to write: calling [`SessionWriter::commit`] again
//! retries the whole batch (after [`SessionWriter::reopen`], which clears RocksDB's sticky
//! background error once the disk or descriptors are back). [`SessionWriter::discard_staged`]
//! instead drops it and records a [`Gap`] where the frames would have been.

use rustc_hash::FxHashMap;
use std::path::PathBuf;

use rocksdb::{WriteBatch, WriteOptions};

use crate::catalog::{
    encode_record, BridgeInfo, Counters, EndReason, Gap, SessionMeta, SessionState,
};
use crate::chunk::{ChunkBuilder, Direction, FrameRecord};
use crate::error::StoreError as E;
use crate::keys::{self, Detail, IndexEntry, CF_CATALOG, CF_CHAN_INDEX, CF_DETAILS, CF_FRAMES};
use crate::store::{Compression, Durability, Store, StoreOptions};
use crate::SessionId;

/// A chunk is sealed at this many frames (a measured sweet spot; see BENCHMARKS.md).
pub const CHUNK_FRAMES: u32 = 256;
/// ... or at this many encoded bytes, whichever comes first.
pub const CHUNK_BYTES: usize = 128 * 1024;

struct Open {
    /// The session as appended so far (bridges included; welcome and channels go to `pending`).
    meta: SessionMeta,
    /// The counters as of the last commit, restored when staged frames are discarded.
    committed: Counters,
    next_frame: u64,
    committed_next: u64,
    chunk: ChunkBuilder,
    chunk_first: u64,
    /// (channel, first relay seq, its frame number, count) for the open chunk.
    runs: Vec<(u32, u64, u64, u32)>,
    /// Per channel since the last commit: (first relay seq, count), for a gap record.
    staged_runs: FxHashMap<u32, (u64, u64)>,
    /// `details` records (welcome, channel names) not yet committed; written once.
    pending: Vec<([u8; keys::DETAIL_KEY_LEN], Vec<u8>)>,
    /// Frames lost since the last commit, not yet recorded.
    gap: Option<Gap>,
    /// The session record changed (begin, end) since the last commit.
    record_dirty: bool,
    /// The counters changed since the last commit.
    counters_dirty: bool,
    /// Connection numbers of the bridges that changed since the last commit.
    bridges_dirty: Vec<u32>,
    ended: bool,
}

impl Open {
    fn bridge_changed(&mut self, conn: u32) {
        if !self.bridges_dirty.contains(&conn) {
            self.bridges_dirty.push(conn);
        }
    }

    /// Past [`BRIDGES_IN_MEMORY`] entries (plus a quarter, so this runs rarely), forgets the
    /// oldest bridges that have left and whose entry is committed: each stays in the catalog on
    /// disk, and a session that bridges keep joining and leaving holds no more memory for it.
    fn forget_departed(&mut self) {
        if self.meta.bridges.len() <= BRIDGES_IN_MEMORY + BRIDGES_IN_MEMORY / 4 {
            return;
        }
        let mut excess = self.meta.bridges.len() - BRIDGES_IN_MEMORY;
        let dirty = &self.bridges_dirty;
        self.meta.bridges.retain(|b| {
            let forget = excess > 0 && b.detached_ns.is_some() && !dirty.contains(&b.conn);
            if forget {
                excess -= 1;
            }
            !forget
        });
    }
}

/// Bridge entries an open session keeps in memory: those still attached, and the latest that
/// left up to this many in all (every entry is kept in the catalog on disk).
pub const BRIDGES_IN_MEMORY: usize = 1024;

/// Writes sessions into a [`Store`]. Not thread-safe by design: one recorder thread owns it.
pub struct SessionWriter {
    /// `None` only between a failed reopen and the next attempt.
    store: Option<Store>,
    path: PathBuf,
    opts: StoreOptions,
    /// Looked up once per frame: a fast hash (the keys are ours, not an attacker's).
    open: FxHashMap<SessionId, Open>,
    batch: WriteBatch,
    staged: usize,
    /// Why the last reopen failed, said by every commit until one succeeds.
    reopen_failed: Option<String>,
    /// The data dir's hold, kept while the store is closed between reopens.
    hold: Option<std::sync::Arc<crate::dir::DirHold>>,
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
            hold: store.hold.clone(),
            path: store.path().to_path_buf(),
            opts: store.opts.clone(),
            store: Some(store),
            open: FxHashMap::default(),
            batch: WriteBatch::default(),
            staged: 0,
            reopen_failed: None,
        }
    }

    /// An empty chunk: LZ4-compressed when the store compresses frames with LZ4 (one
    /// compression in the recorder instead of one per RocksDB flush, a third of the bytes
    /// through the WAL; see [`crate::chunk`]).
    fn new_chunk(&self) -> ChunkBuilder {
        match self.opts.compression {
            Compression::Lz4 => ChunkBuilder::lz4(),
            Compression::None | Compression::Zstd => ChunkBuilder::default(),
        }
    }

    /// The store written to (`None` while a reopen is failing).
    pub fn store(&self) -> Option<&Store> {
        self.store.as_ref()
    }

    /// Closes and reopens the database: RocksDB keeps failing every write after an I/O error
    /// (a full disk, no descriptors) until it is reopened. Staged work is kept. The writer must
    /// hold the only handle on the store, or RocksDB's lock is still held.
    pub fn reopen(&mut self) -> Result<(), E> {
        drop(self.store.take());
        match Store::reopen(&self.path, self.opts.clone()) {
            Ok(mut store) => {
                store.hold = self.hold.clone();
                self.store = Some(store);
                self.reopen_failed = None;
                Ok(())
            }
            Err(e) => {
                self.reopen_failed = Some(match &e {
                    E::Open { reason, .. } => reason.clone(),
                    other => other.to_string(),
                });
                Err(e)
            }
        }
    }

    /// Starts a session; its catalog entry is written with the next commit, its welcome under
    /// a key of its own.
    pub fn begin(&mut self, mut meta: SessionMeta) {
        let chunk = self.new_chunk();
        let mut pending = Vec::new();
        if let Some(w) = meta.welcome.take() {
            pending.push((
                keys::detail_key(meta.id, Detail::Welcome, 0),
                serde_json::to_vec(&w).expect("a JSON value serializes"),
            ));
        }
        for (i, name) in std::mem::take(&mut meta.channels).into_iter().enumerate() {
            pending.push((
                keys::detail_key(meta.id, Detail::Channel, i as u64),
                name.into_bytes(),
            ));
        }
        meta.state = Some(SessionState::Recording);
        meta.last_ns = meta.last_ns.max(meta.started_ns);
        let committed = Counters::of(&meta);
        let bridges_dirty = meta.bridges.iter().map(|b| b.conn).collect();
        self.open.insert(
            meta.id,
            Open {
                meta,
                committed,
                next_frame: 0,
                committed_next: 0,
                chunk,
                chunk_first: 0,
                runs: Vec::new(),
                staged_runs: FxHashMap::default(),
                pending,
                gap: None,
                record_dirty: true,
                counters_dirty: true,
                bridges_dirty,
                ended: false,
            },
        );
    }

    /// Names channel `channel` of `session`.
    pub fn define_channel(&mut self, session: SessionId, channel: u32, name: &str) {
        if let Some(o) = self.open.get_mut(&session) {
            o.pending.push((
                keys::detail_key(session, Detail::Channel, channel as u64),
                name.as_bytes().to_vec(),
            ));
        }
    }

    /// Adds or replaces a bridge entry (matched by connection number).
    pub fn upsert_bridge(&mut self, session: SessionId, info: BridgeInfo) {
        if let Some(o) = self.open.get_mut(&session) {
            let conn = info.conn;
            match o.meta.bridges.iter_mut().find(|b| b.conn == conn) {
                Some(b) if *b == info => return,
                Some(b) => *b = info,
                None => o.meta.bridges.push(info),
            }
            o.bridge_changed(conn);
            o.forget_departed();
        }
    }

    /// Bridge entries held in memory for an open session (see [`BRIDGES_IN_MEMORY`]).
    pub fn bridges_held(&self, session: SessionId) -> usize {
        self.open.get(&session).map_or(0, |o| o.meta.bridges.len())
    }

    /// Counts a mod frame that could not be routed.
    pub fn note_anomaly(&mut self, session: SessionId) {
        if let Some(o) = self.open.get_mut(&session) {
            o.meta.anomalies += 1;
            o.counters_dirty = true;
        }
    }

    /// Counts a recording failure against every open session.
    pub fn note_error(&mut self) {
        for o in self.open.values_mut() {
            o.meta.record_errors += 1;
            o.counters_dirty = true;
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
        // A session's `events` counter is also its index's size (replay relies on it).
        debug_assert_eq!(
            rec.channel.is_some(),
            rec.relay_seq.is_some() && rec.dir == Direction::ModToRelay,
            "only the mod's events have a channel"
        );
        if let (Some(ch), Some(seq)) = (rec.channel, rec.relay_seq) {
            match o.runs.iter_mut().find(|r| r.0 == ch) {
                Some(run) => run.3 += 1,
                None => o.runs.push((ch, seq, frame_no, 1)),
            }
            o.staged_runs.entry(ch).or_insert((seq, 0)).1 += 1;
        }
        o.meta.frames += 1;
        o.meta.bytes += rec.body.len() as u64;
        o.meta.last_ns = o.meta.last_ns.max(rec.time_ns);
        if rec.dir == Direction::ModToRelay && rec.channel.is_some() {
            o.meta.events += 1;
        }
        o.counters_dirty = true;
        self.staged += 1;
        if o.chunk.count() >= CHUNK_FRAMES || o.chunk.len() >= CHUNK_BYTES {
            if let Some(store) = &self.store {
                seal(store, &mut self.batch, session, o);
            }
        }
        Some(frame_no)
    }

    /// Ends a session; it is written and closed with the next commit.
    pub fn end(&mut self, session: SessionId, reason: EndReason, at_ns: u64) {
        if let Some(o) = self.open.get_mut(&session) {
            o.meta.state = Some(SessionState::Ended);
            o.meta.end_reason = Some(reason);
            o.meta.ended_ns = Some(at_ns.max(o.meta.last_ns));
            let mut detached = Vec::new();
            for b in &mut o.meta.bridges {
                if b.detached_ns.is_none() {
                    b.detached_ns = Some(at_ns);
                    detached.push(b.conn);
                }
            }
            for conn in detached {
                o.bridge_changed(conn);
            }
            o.ended = true;
            o.record_dirty = true;
            o.counters_dirty = true;
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

    /// Writes everything appended since the last commit as one atomic batch. On failure
    /// nothing is lost: the next call retries the whole batch.
    pub fn commit(&mut self) -> Result<usize, E> {
        let Some(store) = self.store.as_ref() else {
            return Err(E::Open {
                path: self.path.display().to_string(),
                reason: match &self.reopen_failed {
                    Some(why) => format!("closed after an error; reopening it failed: {why}"),
                    None => "closed after an error, not reopened yet".into(),
                },
            });
        };
        for (id, o) in self.open.iter_mut() {
            if !o.chunk.is_empty() {
                seal(store, &mut self.batch, *id, o);
            }
        }
        // Frames stay in `self.batch` until they land; what is added per commit (details,
        // gaps, catalog parts) goes into this copy, so a retry does not repeat it.
        let mut batch = WriteBatch::from_data(self.batch.data());
        let (catalog, details) = (store.cf(CF_CATALOG), store.cf(CF_DETAILS));
        for (id, o) in self.open.iter() {
            for (k, v) in &o.pending {
                batch.put_cf(details, k, v);
            }
            if let Some(g) = &o.gap {
                batch.put_cf(
                    details,
                    keys::detail_key(*id, Detail::Gap, g.frame),
                    serde_json::to_vec(g).expect("a gap serializes"),
                );
            }
            if o.record_dirty {
                batch.put_cf(catalog, keys::session_key(*id), encode_record(&o.meta));
            }
            if o.counters_dirty {
                batch.put_cf(
                    catalog,
                    keys::counters_key(*id),
                    Counters::of(&o.meta).encode(),
                );
            }
            for conn in &o.bridges_dirty {
                if let Some(b) = o.meta.bridges.iter().find(|b| b.conn == *conn) {
                    batch.put_cf(
                        catalog,
                        keys::bridge_key(*id, *conn),
                        serde_json::to_vec(b).expect("a bridge serializes"),
                    );
                }
            }
        }
        let mut wo = WriteOptions::default();
        wo.set_sync(self.opts.durability == Durability::Batch);
        store.db.write_opt(batch, &wo)?;
        self.batch.clear();
        let n = std::mem::take(&mut self.staged);
        self.open.retain(|_, o| {
            o.record_dirty = false;
            o.counters_dirty = false;
            o.bridges_dirty.clear();
            o.committed = Counters::of(&o.meta);
            o.committed_next = o.next_frame;
            o.staged_runs.clear();
            o.pending.clear();
            o.gap = None;
            !o.ended
        });
        Ok(n)
    }

    /// Frames lost (dropped after a failed commit) whose gap record is not committed yet: if
    /// no commit succeeds any more, the recording never says they are missing.
    pub fn unrecorded_losses(&self) -> u64 {
        self.open
            .values()
            .filter_map(|o| o.gap.as_ref())
            .map(|g| g.frames)
            .sum()
    }

    /// Drops the frames appended since the last commit (after a failed commit, under the
    /// `continue` policy, or when giving up at shutdown). Frame numbers roll back, and the loss
    /// becomes a [`Gap`] record written with the next commit, so `sessions check` can tell it
    /// from a hole; it is also counted in `lost_frames`. Returns how many frames were dropped.
    pub fn discard_staged(&mut self) -> usize {
        self.batch = WriteBatch::default();
        let lost = std::mem::take(&mut self.staged);
        for o in self.open.values_mut() {
            let c = o.committed;
            let lost_here = o.meta.frames - c.frames;
            let lost_bytes = o.meta.bytes - c.bytes;
            // Back to the committed counts; failures, anomalies, state and bridges stay.
            o.meta.frames = c.frames;
            o.meta.bytes = c.bytes;
            o.meta.events = c.events;
            o.meta.last_ns = c.last_ns;
            o.meta.lost_frames += lost_here;
            if lost_here > 0 {
                let mut runs: Vec<(u32, u64, u64)> =
                    o.staged_runs.drain().map(|(c, (s, n))| (c, s, n)).collect();
                runs.sort_unstable();
                o.gap
                    .get_or_insert_with(|| Gap {
                        frame: o.committed_next,
                        ..Gap::default()
                    })
                    .merge(lost_here, lost_bytes, runs);
            }
            o.staged_runs.clear();
            o.next_frame = o.committed_next;
            o.chunk.clear();
            o.runs.clear();
            o.counters_dirty = true;
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
