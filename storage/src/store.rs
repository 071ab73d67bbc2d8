//! Opening a data dir: the store's options, RocksDB's settings and column families, and the
//! three ways to open (record, read, change).
//!
//! A read-write open takes RocksDB's lock, so a second relay on the same data dir fails with
//! [`StoreError::Locked`]. Read commands always open read-only: they never create, lock, write
//! or let RocksDB "recover" (discard) anything. A read-write open creates a database only in a
//! dir that holds nothing, refuses one it cannot read whole (pointing at `gabp-relay repair`),
//! and finishes sessions a crashed relay left in the `recording` state.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rocksdb::{ColumnFamilyDescriptor, DBCompressionType, Options, DB};

pub use crate::dir::lock_holder;
use crate::dir::{make_private, prepare_writable_dir, DirHold};
use crate::error::StoreError;
use crate::keys::{self, CF_CATALOG, CF_CHAN_INDEX, CF_DETAILS, CF_FRAMES};
pub mod retention;

use crate::SessionId;
use retention::Reclaimer;

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
    /// Gives back the space of deleted sessions (it may hold the last handle on `db`).
    pub(crate) reclaimer: Arc<Reclaimer>,
    pub(crate) opts: StoreOptions,
    path: PathBuf,
    /// Whether the `details` column family exists (data dirs written before it have none).
    details: bool,
    /// Read-only, with no relay holding the data dir: sessions still marked `recording` were
    /// left by a dead relay and are shown as ended by crash (the next relay writes that).
    pub(crate) orphaned: bool,
    /// Opened for recording: the data dir's hold, which a [`crate::SessionWriter`] keeps
    /// across its reopens (RocksDB's own lock is let go during each).
    pub(crate) hold: Option<Arc<DirHold>>,
    /// Frames read so far, for a command's progress.
    pub(crate) meter: Arc<crate::meter::ReadMeter>,
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
    // Not `track_and_verify_wals_in_manifest`: it covers closed logs only (the committed mark,
    // `crate::mark`, covers the live one), and a read-only open without it of a dir written
    // with it crashes RocksDB 10.4 (a null recovery context in `DBImpl::Recover`).
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
    if opts.compression == Compression::Lz4 {
        // The recorder LZ4-compresses each chunk itself (`chunk.rs`): RocksDB's LZ4 over the
        // same bytes shrank nothing (132.7 B/frame either way) and cost 11 % of the recording's
        // CPU in every flush (`examples/record_loop`, BENCHMARKS.md). One type on every level
        // also lets compactions move table files down instead of rewriting them (their keys
        // only grow; RocksDB moves a file only if its compression stays the same).
        frames.set_compression_type(DBCompressionType::None);
    }
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

/// RocksDB's old info logs kept beside the current one.
const KEPT_INFO_LOGS: usize = 3;

/// Room a read-write open needs besides its write-ahead logs: a manifest, options, an info log.
const REOPEN_ROOM: u64 = 1 << 20;

/// The bytes of the write-ahead logs in `path`.
fn wal_bytes(path: &Path) -> u64 {
    std::fs::read_dir(path)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok())
                .filter(|e| e.file_name().to_str().is_some_and(|n| n.ends_with(".log")))
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

/// Refuses a read-write open the disk has no room for: an open writes the write-ahead logs out
/// as a table before anything else, and without room for that it fails halfway (a rotated info
/// log, an empty log file left behind). `doing` and `after` frame the reason.
fn room_to_open(path: &Path, doing: &str, after: &str) -> Result<(), StoreError> {
    let logs = wal_bytes(path);
    let Ok(fs) = nix::sys::statvfs::statvfs(path) else {
        return Ok(());
    };
    let free = fs.blocks_available().saturating_mul(fs.fragment_size());
    if free >= logs + REOPEN_ROOM {
        return Ok(());
    }
    Err(StoreError::Open {
        path: path.display().to_string(),
        reason: format!(
            "{doing} writes the write-ahead log ({} MB) out as a table and needs {} MB more, {} MB in all, and {} MB is free{after}",
            mb(logs),
            mb(REOPEN_ROOM),
            mb(logs + REOPEN_ROOM),
            mb(free)
        ),
    })
}

fn mb(bytes: u64) -> String {
    format!("{:.1}", bytes as f64 / 1e6)
}

/// Deletes all but the newest `keep` of RocksDB's old info logs (`LOG.old.<time>`): each open
/// rotates one, and a reopen that fails (a full disk) never gets to RocksDB's own clean-up, so
/// retries would otherwise fill the disk with them.
fn prune_info_logs(path: &Path, keep: usize) {
    let Ok(entries) = std::fs::read_dir(path) else {
        return;
    };
    let mut old: Vec<_> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.file_name())
        .filter(|n| n.to_str().is_some_and(|n| n.starts_with("LOG.old.")))
        .collect();
    // The suffix is a timestamp in microseconds: newest last.
    old.sort();
    for name in old.iter().rev().skip(keep) {
        let _ = std::fs::remove_file(path.join(name));
    }
}

fn is_lock_error(e: &rocksdb::Error) -> bool {
    // "While lock file: DIR/LOCK: Resource temporarily unavailable", or "lock hold by current
    // process"; never a mere "block" in a corruption message.
    let s = e.to_string();
    s.contains("/LOCK") || s.contains("lock hold by")
}

impl Store {
    /// Opens a data dir. Read-only opens never create, write or lock anything; a read-write
    /// open creates only a dir that holds nothing, refuses anything it cannot read, and
    /// finishes sessions a crashed relay left `recording`.
    pub fn open(path: &Path, opts: StoreOptions) -> Result<Store, StoreError> {
        // Read before the open: a running relay may commit and mark more meanwhile.
        let committed = crate::mark::read(path);
        if !opts.read_only {
            Store::probe_committed(path, &committed)?;
        }
        let mut store = Store::open_db(path, opts, None)?;
        store.verify_committed(committed)?;
        if !store.opts.read_only {
            store.hold = Some(Arc::new(DirHold::take(path)?));
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
        prune_info_logs(path, KEPT_INFO_LOGS);
        room_to_open(path, "waiting for room: reopening", "")?;
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
        // A permissions problem is said as one, never as damage for `repair` to fix.
        let damaged = |reason: String| {
            if reason.contains("Permission denied") {
                crate::dir::permission_denied(path, "read its files")
            } else {
                StoreError::Damaged {
                    path: p.clone(),
                    reason,
                }
            }
        };
        crate::dir::check_access(path, !opts.read_only)?;
        let fresh = if opts.read_only {
            if !path.is_dir() {
                return Err(StoreError::NoDataDir(p.clone()));
            }
            false
        } else {
            prepare_writable_dir(path, opts.allow_symlinked_dir).map_err(|e| match e {
                StoreError::Io(io) if io.kind() == std::io::ErrorKind::PermissionDenied => {
                    crate::dir::permission_denied(path, "create it or make it private")
                }
                e => e,
            })?
        };
        if !fresh && !path.join("CURRENT").exists() {
            return Err(if std::fs::read_dir(path)?.next().is_none() {
                StoreError::Open {
                    path: p.clone(),
                    reason: "no recordings here (the data dir is empty)".into(),
                }
            } else if !crate::dir::holds_rocksdb_files(path)? {
                // Not a damaged data dir but some other dir: `repair` could not help.
                crate::dir::not_a_data_dir(path)
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
        let db = if opts.read_only {
            // A read-only open makes no info log (RocksDB creates one only when writable), so
            // it creates no file anywhere: not in the data dir, not in a temporary dir that a
            // killed read command would leave behind.
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
        let db = Arc::new(db);
        Ok(Store {
            reclaimer: Arc::new(Reclaimer::new(db.clone(), true)),
            db,
            opts,
            path: path.to_path_buf(),
            details,
            orphaned,
            hold: None,
            meter: Default::default(),
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
        crate::dir::check_access(path, true)?;
        if !path.is_dir() {
            return Err(StoreError::NoDataDir(path.display().to_string()));
        }
        if !path.join("CURRENT").exists() {
            if !crate::dir::holds_rocksdb_files(path)? {
                return Err(crate::dir::not_a_data_dir(path));
            }
            return Err(StoreError::Damaged {
                path: path.display().to_string(),
                reason: "its CURRENT file is missing".into(),
            });
        }
        let committed = crate::mark::read(path);
        Store::probe_committed(path, &committed)?;
        room_to_open(
            path,
            "no room to change it: opening it",
            " (deleting a session writes before it frees: make room by other means); nothing was changed",
        )?;
        let mut store = Store::open_db(path, StoreOptions::default(), None)?;
        store.verify_committed(committed)?;
        // A command waits for the space of what it deletes to be given back.
        store.reclaimer = Arc::new(Reclaimer::new(store.db.clone(), false));
        Ok(store)
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

    /// Deletes one chunk, as a damaged disk would lose it: for tests of `sessions check`.
    #[doc(hidden)]
    pub fn delete_chunk_for_test(&self, id: SessionId, first: u64) -> Result<(), StoreError> {
        self.db
            .delete_cf(self.cf(CF_FRAMES), keys::frame_key(id, first))?;
        Ok(())
    }

    /// Writes every memtable to table files. A read-only open replays the write-ahead log
    /// into memory (up to its 256 MiB bound), so a dir flushed this way opens lean.
    pub fn flush(&self) -> Result<(), StoreError> {
        if !self.opts.read_only {
            for name in [CF_FRAMES, CF_CHAN_INDEX, CF_CATALOG, CF_DETAILS] {
                if let Some(cf) = self.db.cf_handle(name) {
                    self.db.flush_cf(&cf)?;
                }
            }
        }
        Ok(())
    }

    /// Syncs the WAL (used at shutdown), then marks everything written as committed.
    pub fn sync(&self) -> Result<(), StoreError> {
        if !self.opts.read_only {
            self.db.flush_wal(true)?;
            self.mark_committed()?;
        }
        Ok(())
    }

    /// Writes the memtables out as tables (at a clean stop), so the recording no longer lives
    /// only in the write-ahead log: a table-only rebuild (`repair` of a broken MANIFEST) then
    /// finds all of it.
    pub fn flush_tables(&self) -> Result<(), StoreError> {
        let mut names = vec![CF_FRAMES, CF_CHAN_INDEX, CF_CATALOG];
        if self.details {
            names.push(CF_DETAILS);
        }
        for name in names {
            self.db.flush_cf(self.cf(name))?;
        }
        Ok(())
    }

    /// Records that every write so far is synced (call only after a synced commit or a WAL
    /// sync): an open that later finds fewer writes refuses the data dir ([`crate::mark`]).
    pub fn mark_committed(&self) -> Result<(), StoreError> {
        crate::mark::write(&self.path, self.db.latest_sequence_number())?;
        Ok(())
    }

    /// After a repair: moves the mark to what an ordinary read-only open of `path` finds (a
    /// salvaging open may have held more than the dir gives back once closed); returns how
    /// many marked writes that open does not find.
    pub fn remark_as_read(path: &Path) -> Result<u64, StoreError> {
        let opts = StoreOptions {
            read_only: true,
            ..StoreOptions::default()
        };
        let store = Store::open_db(path, opts, None)?;
        let held = store.db.latest_sequence_number();
        let marked = crate::mark::read(path).ok().flatten().unwrap_or(0);
        drop(store);
        crate::mark::write(path, held)?;
        Ok(marked.saturating_sub(held))
    }

    /// The writes the mark names and the writes this data dir holds.
    pub fn committed_and_held(&self) -> (Option<u64>, u64) {
        (
            crate::mark::read(&self.path).ok().flatten(),
            self.db.latest_sequence_number(),
        )
    }

    /// Before a read-write open (which writes a new MANIFEST and log at once): a read-only look
    /// at whether the data dir holds what its mark says was committed, so a damaged one is
    /// refused untouched. Also refuses, untouched, a data dir another process holds.
    fn probe_committed(
        path: &Path,
        committed: &Result<Option<u64>, String>,
    ) -> Result<(), StoreError> {
        if path.join("LOCK").exists() {
            if let Some(pid) = lock_holder(path) {
                return Err(StoreError::Locked {
                    path: path.display().to_string(),
                    pid: Some(pid),
                });
            }
        }
        if !matches!(committed, Ok(Some(_))) || !path.join("CURRENT").exists() {
            return Ok(());
        }
        let ro = StoreOptions {
            read_only: true,
            ..StoreOptions::default()
        };
        Store::open_db(path, ro, None)?.verify_committed(committed.clone())
    }

    /// Refuses a data dir holding fewer writes than its mark (read before it was opened) says
    /// were committed: its write-ahead log is missing or was cut short.
    fn verify_committed(&self, committed: Result<Option<u64>, String>) -> Result<(), StoreError> {
        let damaged = |reason: String| StoreError::Damaged {
            path: self.path.display().to_string(),
            reason,
        };
        let committed = committed.map_err(damaged)?;
        let held = self.db.latest_sequence_number();
        match committed {
            Some(c) if c > held => Err(damaged(format!(
                "{} committed write(s) are missing: its write-ahead log is gone or shorter than what was synced",
                c - held
            ))),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_newest_old_info_logs_are_kept() {
        let dir = tempfile::tempdir().expect("tempdir");
        for t in [1000001u64, 1000005, 1000002, 1000009, 1000003] {
            std::fs::write(dir.path().join(format!("LOG.old.{t}")), "x").expect("log");
        }
        std::fs::write(dir.path().join("LOG"), "x").expect("log");
        prune_info_logs(dir.path(), 3);
        let mut left: Vec<String> = std::fs::read_dir(dir.path())
            .expect("dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(
            left,
            [
                "LOG",
                "LOG.old.1000003",
                "LOG.old.1000005",
                "LOG.old.1000009"
            ]
        );
    }
}
