//! Opening a data dir, listing and deleting sessions, retention, and crash recovery.
//!
//! A read-write open takes RocksDB's lock, so a second relay on the same data dir fails with
//! [`StoreError::Locked`]. Read commands always open read-only: they never create, lock, write
//! or let RocksDB "recover" (discard) anything. A read-write open creates a database only in a
//! dir that holds nothing, refuses one it cannot read whole (pointing at `gabp-relay repair`),
//! and finishes sessions a crashed relay left in the `recording` state.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rocksdb::{ColumnFamilyDescriptor, DBCompressionType, IteratorMode, Options, DB};

use crate::catalog::{EndReason, Gap, SessionMeta, SessionState};
use crate::error::StoreError;
use crate::keys::{self, Detail, CF_CATALOG, CF_CHAN_INDEX, CF_DETAILS, CF_FRAMES};
use crate::SessionId;

/// When a group commit is durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Durability {
    /// The WAL is written but not synced: survives a process crash, not a power cut.
    None,
    /// The WAL is synced once per group commit.
    #[default]
    Batch,
}

impl std::str::FromStr for Durability {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "none" => Ok(Durability::None),
            "batch" => Ok(Durability::Batch),
            _ => Err(format!("unknown durability {s:?}: expected none or batch")),
        }
    }
}

/// Block compression for the frames column family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Compression {
    /// No compression.
    None,
    /// LZ4: the default, chosen by the recorder bench (see BENCHMARKS.md).
    #[default]
    Lz4,
    /// Zstd: smaller, slower.
    Zstd,
}

impl std::str::FromStr for Compression {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "none" => Ok(Compression::None),
            "lz4" => Ok(Compression::Lz4),
            "zstd" => Ok(Compression::Zstd),
            _ => Err(format!(
                "unknown compression {s:?}: expected none, lz4 or zstd"
            )),
        }
    }
}

/// How to open a store.
#[derive(Debug, Clone, Default)]
pub struct StoreOptions {
    /// WAL sync policy.
    pub durability: Durability,
    /// Frame compression.
    pub compression: Compression,
    /// Open without the lock and without writing.
    pub read_only: bool,
    /// Compress the write-ahead log with zstd (every frame crosses the WAL before its table).
    pub wal_compression: bool,
    /// Record into a data dir that is a symlink (refused by default: a planted link would make
    /// the relay write into, and retention delete from, another directory).
    pub allow_symlinked_dir: bool,
}

/// An open data dir.
#[derive(Clone)]
pub struct Store {
    pub(crate) db: Arc<DB>,
    pub(crate) opts: StoreOptions,
    path: PathBuf,
    /// Whether the `details` column family exists (data dirs written before it have none).
    details: bool,
    /// A read-only open writes RocksDB's info log here, never into the data dir.
    _log_dir: Option<Arc<tempfile::TempDir>>,
    /// Read-only, with no relay holding the data dir: sessions still marked `recording` were
    /// left by a dead relay and are shown as ended by crash (the next relay writes that).
    orphaned: bool,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("path", &self.path)
            .field("opts", &self.opts)
            .finish()
    }
}

fn db_options(opts: &StoreOptions) -> Options {
    let mut o = Options::default();
    // Never let RocksDB create or "recover" its way past data it cannot read: `open` turns
    // creation on only for a dir that holds nothing, and any unreadable file fails the open.
    o.create_if_missing(false);
    o.set_paranoid_checks(true);
    // A torn last record (kill -9 mid-write, a full disk) is tolerated; corruption anywhere
    // else fails the open instead of silently dropping everything after it (PointInTime did).
    o.set_wal_recovery_mode(rocksdb::DBRecoveryMode::TolerateCorruptedTailRecords);
    o.set_max_total_wal_size(256 << 20);
    // A recorder must not be throttled by compaction debt on a busy 2-core machine: let L0 grow
    // further before RocksDB slows or stops writes (reads of recordings tolerate the extra L0).
    o.set_max_write_buffer_number(4);
    // Bounded descriptors: table files beyond this are opened on demand.
    o.set_max_open_files(256);
    o.set_level_zero_slowdown_writes_trigger(40);
    o.set_level_zero_stop_writes_trigger(64);
    o.set_keep_log_file_num(3);
    if opts.wal_compression {
        o.set_wal_compression_type(DBCompressionType::Zstd);
    }
    if !opts.read_only {
        o.create_missing_column_families(true);
        o.set_max_background_jobs(2);
        // Flushes and compactions yield to the relay's latency-critical threads; the recorder
        // is lossless with backpressure, so slower background work costs no data.
        if let Ok(mut env) = rocksdb::Env::new() {
            env.lower_thread_pool_cpu_priority();
            env.lower_high_priority_thread_pool_cpu_priority();
            env.lower_thread_pool_io_priority();
            o.set_env(&env);
        }
    }
    o.set_compression_type(match opts.compression {
        Compression::None => DBCompressionType::None,
        Compression::Lz4 => DBCompressionType::Lz4,
        Compression::Zstd => DBCompressionType::Zstd,
    });
    o
}

fn cf_descriptors(opts: &StoreOptions, details: bool) -> Vec<ColumnFamilyDescriptor> {
    let mut frames = db_options(opts);
    frames.set_write_buffer_size(64 << 20);
    let plain = || {
        db_options(&StoreOptions {
            compression: Compression::None,
            ..opts.clone()
        })
    };
    let mut cfs = vec![
        ColumnFamilyDescriptor::new(CF_FRAMES, frames),
        ColumnFamilyDescriptor::new(CF_CHAN_INDEX, db_options(opts)),
        ColumnFamilyDescriptor::new(CF_CATALOG, plain()),
    ];
    if details {
        cfs.push(ColumnFamilyDescriptor::new(CF_DETAILS, db_options(opts)));
    }
    cfs
}

fn is_lock_error(e: &rocksdb::Error) -> bool {
    // "While lock file: DIR/LOCK: Resource temporarily unavailable", or "lock hold by current
    // process"; never a mere "block" in a corruption message.
    let s = e.to_string();
    s.contains("/LOCK") || s.contains("lock hold by")
}

/// The pid holding RocksDB's `LOCK` file, from /proc/locks (RocksDB locks it with fcntl).
pub fn lock_holder(dir: &Path) -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(dir.join("LOCK")).ok()?;
    let locks = std::fs::read_to_string("/proc/locks").ok()?;
    let ino = m.ino().to_string();
    locks.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        // "1: POSIX  ADVISORY  WRITE 1234 08:01:5678 0 EOF"
        let dev_ino = f.get(5)?;
        (dev_ino.rsplit(':').next()? == ino).then(|| f.get(4)?.parse().ok())?
    })
}

/// The effective uid of this process (the owner of /proc/self), if /proc is mounted.
fn effective_uid() -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").ok().map(|m| m.uid())
}

/// Makes sure `path` is a data dir this process may record into: creates it 0700 when absent
/// and returns whether it is new (empty), so only then may RocksDB create a database in it.
fn prepare_writable_dir(path: &Path, allow_symlink: bool) -> Result<bool, StoreError> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let unsafe_dir = |reason: String| StoreError::Unsafe {
        path: path.display().to_string(),
        reason,
    };
    let link = match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            create_private_dir(path).map_err(|e| StoreError::Open {
                path: path.display().to_string(),
                reason: e.to_string(),
            })?;
            return Ok(true);
        }
        Err(e) => return Err(e.into()),
        Ok(m) => m,
    };
    if link.file_type().is_symlink() && !allow_symlink {
        return Err(unsafe_dir(
            "it is a symlink (pass --allow-symlinked-data-dir if that is intended)".into(),
        ));
    }
    let m = std::fs::metadata(path)?;
    if !m.is_dir() {
        return Err(unsafe_dir("it is not a directory".into()));
    }
    if let Some(uid) = effective_uid() {
        if m.uid() != uid {
            return Err(unsafe_dir(format!(
                "it is owned by uid {}, not by this user (uid {uid})",
                m.uid()
            )));
        }
    }
    if m.permissions().mode() & 0o022 != 0 {
        return Err(unsafe_dir(format!(
            "it is writable by group or others (mode {:o}; chmod 700 it)",
            m.permissions().mode() & 0o777
        )));
    }
    Ok(std::fs::read_dir(path)?.next().is_none())
}

/// Takes group and other permissions off `dir` and everything under it (owner bits kept:
/// dirs end 0700, RocksDB's files 0600), as the README promises for a data dir.
pub(crate) fn make_private(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let tighten = |p: &Path, m: &std::fs::Metadata| {
        let mode = m.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode & 0o700))
        } else {
            Ok(())
        }
    };
    tighten(dir, &std::fs::metadata(dir)?)?;
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        let ty = e.file_type()?;
        if ty.is_dir() {
            make_private(&e.path())?;
        } else if ty.is_file() {
            tighten(&e.path(), &e.metadata()?)?;
        }
    }
    Ok(())
}

impl Store {
    /// Opens a data dir. Read-only opens never create, write or lock anything; a read-write
    /// open creates only a dir that holds nothing, refuses anything it cannot read, and
    /// finishes sessions a crashed relay left `recording`.
    pub fn open(path: &Path, opts: StoreOptions) -> Result<Store, StoreError> {
        let store = Store::open_db(path, opts, None)?;
        if !store.opts.read_only {
            // Files an older relay, a manual copy or a repair left readable by others.
            if let Err(e) = make_private(path) {
                tracing::warn!(error = %e, "could not make every file in the data dir private");
            }
            store.recover_crashed()?;
        }
        Ok(store)
    }

    /// Opens without crash recovery: the recorder's reopen after an I/O error, when its own
    /// sessions are still `recording`.
    pub fn reopen(path: &Path, opts: StoreOptions) -> Result<Store, StoreError> {
        Store::open_db(path, opts, None)
    }

    /// For `repair` only, on a copied-aside dir: a read-write open whose write-ahead log replay
    /// uses `mode` (skipping, or stopping at, records it cannot read) instead of refusing them.
    pub(crate) fn open_salvaging(
        path: &Path,
        mode: rocksdb::DBRecoveryMode,
    ) -> Result<Store, StoreError> {
        Store::open_db(path, StoreOptions::default(), Some(mode))
    }

    fn open_db(
        path: &Path,
        opts: StoreOptions,
        salvage: Option<rocksdb::DBRecoveryMode>,
    ) -> Result<Store, StoreError> {
        let p = path.display().to_string();
        let damaged = |reason: String| StoreError::Damaged {
            path: p.clone(),
            reason,
        };
        let fresh = if opts.read_only {
            if !path.is_dir() {
                return Err(StoreError::NoDataDir(p.clone()));
            }
            false
        } else {
            prepare_writable_dir(path, opts.allow_symlinked_dir)?
        };
        if !fresh && !path.join("CURRENT").exists() {
            return Err(if std::fs::read_dir(path)?.next().is_none() {
                StoreError::Open {
                    path: p.clone(),
                    reason: "no recordings here (the data dir is empty)".into(),
                }
            } else {
                damaged("its CURRENT file is missing".into())
            });
        }
        let present = if fresh {
            Vec::new()
        } else {
            DB::list_cf(&db_options(&opts), path).map_err(|e| damaged(e.to_string()))?
        };
        let details = fresh || !opts.read_only || present.iter().any(|c| c == CF_DETAILS);
        let mut o = db_options(&opts);
        if let Some(mode) = salvage {
            o.set_wal_recovery_mode(mode);
        }
        let mut log_dir = None;
        let db = if opts.read_only {
            // RocksDB would otherwise rotate its info log inside the data dir.
            let tmp = tempfile::Builder::new()
                .prefix("gabp-relay-rocksdb-log")
                .tempdir()?;
            o.set_db_log_dir(tmp.path());
            log_dir = Some(Arc::new(tmp));
            DB::open_cf_descriptors_read_only(&o, path, cf_descriptors(&opts, details), false)
                .map_err(|e| damaged(e.to_string()))?
        } else {
            o.create_if_missing(fresh);
            DB::open_cf_descriptors(&o, path, cf_descriptors(&opts, details)).map_err(|e| {
                if is_lock_error(&e) {
                    StoreError::Locked {
                        path: p.clone(),
                        pid: lock_holder(path),
                    }
                } else if e.kind() == rocksdb::ErrorKind::IOError
                    && !e.to_string().contains("No such file")
                {
                    StoreError::Open {
                        path: p.clone(),
                        reason: e.to_string(),
                    }
                } else {
                    damaged(e.to_string())
                }
            })?
        };
        let orphaned = opts.read_only && lock_holder(path).is_none();
        Ok(Store {
            db: Arc::new(db),
            opts,
            path: path.to_path_buf(),
            details,
            _log_dir: log_dir,
            orphaned,
        })
    }

    /// Opens for a read command: read-only, always; never creates, locks or changes anything.
    pub fn open_for_reading(path: &Path) -> Result<Store, StoreError> {
        let ro = StoreOptions {
            read_only: true,
            ..StoreOptions::default()
        };
        let mut tries = 0;
        loop {
            match Store::open(path, ro.clone()) {
                // A running relay may delete a write-ahead log it just flushed while we list
                // it: that is a race, not damage, so look again.
                Err(StoreError::Damaged { .. }) if tries < 3 && lock_holder(path).is_some() => {
                    tries += 1;
                }
                other => return other,
            }
        }
    }

    /// Opens for a command that deletes (`sessions rm`, retention): read-write, never
    /// creating, without crash recovery; fails with the relay's pid while one records.
    pub fn open_for_change(path: &Path) -> Result<Store, StoreError> {
        if !path.is_dir() {
            return Err(StoreError::NoDataDir(path.display().to_string()));
        }
        if !path.join("CURRENT").exists() {
            return Err(StoreError::Damaged {
                path: path.display().to_string(),
                reason: "its CURRENT file is missing".into(),
            });
        }
        Store::open_db(path, StoreOptions::default(), None)
    }

    /// The data dir.
    pub fn path(&self) -> &Path {
        &self.path
    }

    pub(crate) fn cf(&self, name: &str) -> &rocksdb::ColumnFamily {
        self.db
            .cf_handle(name)
            .expect("column families are created at open")
    }

    pub(crate) fn details_cf(&self) -> Option<&rocksdb::ColumnFamily> {
        if self.details {
            self.db.cf_handle(CF_DETAILS)
        } else {
            None
        }
    }

    /// Every session in the catalog, oldest first (ids are UUID v7). Entries hold counters and
    /// state; [`Store::session`] and [`Store::resolve`] also fill in the welcome and channels.
    pub fn sessions(&self) -> Result<Vec<SessionMeta>, StoreError> {
        let mut out = Vec::new();
        for item in self
            .db
            .iterator_cf(self.cf(CF_CATALOG), IteratorMode::Start)
        {
            let (_, v) = item?;
            out.push(self.present(decode_meta(&v)?));
        }
        Ok(out)
    }

    fn present(&self, mut m: SessionMeta) -> SessionMeta {
        if self.orphaned && m.state == Some(SessionState::Recording) {
            mark_crashed(&mut m);
        }
        m
    }

    /// One session's catalog entry with its welcome and channel names.
    pub fn session(&self, id: SessionId) -> Result<Option<SessionMeta>, StoreError> {
        match self.db.get_cf(self.cf(CF_CATALOG), keys::catalog_key(id))? {
            Some(v) => {
                let mut m = self.present(decode_meta(&v)?);
                self.fill_details(&mut m)?;
                Ok(Some(m))
            }
            None => Ok(None),
        }
    }

    /// `meta` with its welcome and channel names: itself when they are there, else a copy
    /// filled from their own keys (an entry from [`Store::sessions`] holds counters only).
    pub fn with_details<'a>(
        &self,
        meta: &'a SessionMeta,
    ) -> Result<std::borrow::Cow<'a, SessionMeta>, StoreError> {
        if !meta.channels.is_empty() {
            return Ok(std::borrow::Cow::Borrowed(meta));
        }
        let mut m = meta.clone();
        self.fill_details(&mut m)?;
        Ok(std::borrow::Cow::Owned(m))
    }

    /// Fills in the welcome and channel names stored under their own keys.
    pub fn fill_details(&self, m: &mut SessionMeta) -> Result<(), StoreError> {
        if let Some(w) = self.detail(m.id, Detail::Welcome, 0)? {
            m.welcome = Some(
                serde_json::from_slice(&w)
                    .map_err(|e| StoreError::Corrupt(format!("welcome: {e}")))?,
            );
        }
        self.for_each_detail(m.id, Detail::Channel, |id, v| {
            let i = id as usize;
            if m.channels.len() <= i {
                m.channels.resize(i + 1, String::new());
            }
            m.channels[i] = String::from_utf8_lossy(v).into_owned();
            Ok(())
        })
    }

    fn detail(&self, id: SessionId, kind: Detail, n: u64) -> Result<Option<Vec<u8>>, StoreError> {
        match self.details_cf() {
            Some(cf) => Ok(self.db.get_cf(cf, keys::detail_key(id, kind, n))?),
            None => Ok(None),
        }
    }

    /// Calls `f(number, value)` for every `details` record of one kind, in number order.
    pub(crate) fn for_each_detail(
        &self,
        id: SessionId,
        kind: Detail,
        mut f: impl FnMut(u64, &[u8]) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        let Some(cf) = self.details_cf() else {
            return Ok(());
        };
        let start = keys::detail_key(id, kind, 0);
        for item in self
            .db
            .iterator_cf(cf, IteratorMode::From(&start, rocksdb::Direction::Forward))
        {
            let (k, v) = item?;
            match keys::parse_detail_key(&k) {
                Some((s, kd, n)) if s == id && kd == kind as u8 => f(n, &v)?,
                _ => break,
            }
        }
        Ok(())
    }

    /// A session's gaps: frames lost to failed writes under `continue`.
    pub fn gaps(&self, id: SessionId) -> Result<Vec<Gap>, StoreError> {
        let mut out = Vec::new();
        self.for_each_detail(id, Detail::Gap, |_, v| {
            out.push(
                serde_json::from_slice(v)
                    .map_err(|e| StoreError::Corrupt(format!("gap record: {e}")))?,
            );
            Ok(())
        })?;
        Ok(out)
    }

    /// Finds a session by full id, unique id prefix, or `latest`; with welcome and channels.
    pub fn resolve(&self, query: &str) -> Result<SessionMeta, StoreError> {
        let mut m = self.resolve_entry(query)?;
        self.fill_details(&mut m)?;
        Ok(m)
    }

    fn resolve_entry(&self, query: &str) -> Result<SessionMeta, StoreError> {
        let all = self.sessions()?;
        if query == "latest" || query == "last" {
            return all
                .into_iter()
                .last()
                .ok_or_else(|| StoreError::NoSuchSession(query.into()));
        }
        let q = query.to_ascii_lowercase();
        let mut hits = all.into_iter().filter(|m| {
            m.id.to_string().starts_with(&q) || m.id.simple().to_string().starts_with(&q)
        });
        match (hits.next(), hits.next()) {
            (Some(m), None) if !q.is_empty() => Ok(m),
            (Some(_), Some(_)) => Err(StoreError::Ambiguous(query.into())),
            _ => Err(StoreError::NoSuchSession(query.into())),
        }
    }

    /// Writes a catalog entry on its own (outside a group commit).
    pub fn put_meta(&self, meta: &SessionMeta) -> Result<(), StoreError> {
        let mut wo = rocksdb::WriteOptions::default();
        wo.set_sync(self.opts.durability == Durability::Batch);
        self.db.put_cf_opt(
            self.cf(CF_CATALOG),
            keys::catalog_key(meta.id),
            encode_meta(meta),
            &wo,
        )?;
        Ok(())
    }

    /// Deletes a session: its frames, index entries and catalog entry.
    pub fn delete_session(&self, id: SessionId) -> Result<(), StoreError> {
        let start = keys::frame_key(id, 0);
        let end = keys::session_end(id);
        let mut batch = rocksdb::WriteBatch::default();
        batch.delete_range_cf(self.cf(CF_FRAMES), &start[..16], &end[..]);
        batch.delete_range_cf(self.cf(CF_CHAN_INDEX), &start[..16], &end[..]);
        if let Some(cf) = self.details_cf() {
            batch.delete_range_cf(cf, &start[..16], &end[..]);
        }
        batch.delete_cf(self.cf(CF_CATALOG), keys::catalog_key(id));
        let mut wo = rocksdb::WriteOptions::default();
        wo.set_sync(true);
        self.db.write_opt(batch, &wo)?;
        Ok(())
    }

    /// Deletes ended sessions older than `max_age_ns` or beyond `max_bytes` in total (oldest
    /// first). Returns the ids deleted. Sessions still recording are never deleted.
    pub fn apply_retention(
        &self,
        now_ns: u64,
        max_age_ns: Option<u64>,
        max_bytes: Option<u64>,
    ) -> Result<Vec<SessionId>, StoreError> {
        let sessions = self.sessions()?;
        let mut total: u64 = sessions.iter().map(|m| m.bytes).sum();
        let mut deleted = Vec::new();
        for m in &sessions {
            if m.state != Some(SessionState::Ended) {
                continue;
            }
            let too_old = max_age_ns
                .is_some_and(|age| now_ns.saturating_sub(m.ended_ns.unwrap_or(m.last_ns)) > age);
            let too_big = max_bytes.is_some_and(|cap| total > cap);
            if too_old || too_big {
                self.delete_session(m.id)?;
                total -= m.bytes;
                deleted.push(m.id);
            }
        }
        Ok(deleted)
    }

    /// Marks sessions left `recording` by a dead relay as ended by crash. Called on every
    /// read-write open, when no other relay can be writing (RocksDB's lock is held).
    pub fn recover_crashed(&self) -> Result<Vec<SessionId>, StoreError> {
        let mut fixed = Vec::new();
        for mut m in self.sessions()? {
            if m.state == Some(SessionState::Recording) {
                mark_crashed(&mut m);
                self.put_meta(&m)?;
                fixed.push(m.id);
            }
        }
        Ok(fixed)
    }

    /// Deletes one chunk, as a damaged disk would lose it: for tests of `sessions check`.
    #[doc(hidden)]
    pub fn delete_chunk_for_test(&self, id: SessionId, first: u64) -> Result<(), StoreError> {
        self.db
            .delete_cf(self.cf(CF_FRAMES), keys::frame_key(id, first))?;
        Ok(())
    }

    /// Flushes memtables and syncs the WAL (used at shutdown).
    pub fn sync(&self) -> Result<(), StoreError> {
        if !self.opts.read_only {
            self.db.flush_wal(true)?;
        }
        Ok(())
    }
}

fn mark_crashed(m: &mut SessionMeta) {
    m.state = Some(SessionState::Ended);
    m.end_reason = Some(EndReason::Crash);
    m.ended_ns = Some(m.last_ns.max(m.started_ns));
    for b in &mut m.bridges {
        b.detached_ns.get_or_insert(m.last_ns);
    }
}

fn create_private_dir(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    if !path.exists() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(path)?;
    }
    Ok(())
}

pub(crate) fn encode_meta(meta: &SessionMeta) -> Vec<u8> {
    serde_json::to_vec(meta).expect("catalog entries always serialize")
}

pub(crate) fn decode_meta(v: &[u8]) -> Result<SessionMeta, StoreError> {
    serde_json::from_slice(v).map_err(|e| StoreError::Corrupt(format!("catalog entry: {e}")))
}
