//! Opening a data dir, listing and deleting sessions, retention, and crash recovery.
//!
//! A read-write open takes RocksDB's lock, so a second relay on the same data dir fails with
//! [`StoreError::Locked`]; read commands fall back to a read-only open while a relay runs. A
//! read-write open also finishes sessions a crashed relay left in the `recording` state.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rocksdb::{ColumnFamilyDescriptor, DBCompressionType, IteratorMode, Options, DB};

use crate::catalog::{EndReason, SessionMeta, SessionState};
use crate::error::StoreError;
use crate::keys::{self, CF_CATALOG, CF_CHAN_INDEX, CF_FRAMES};
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
}

/// An open data dir.
#[derive(Clone)]
pub struct Store {
    pub(crate) db: Arc<DB>,
    pub(crate) opts: StoreOptions,
    path: PathBuf,
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
    o.create_if_missing(true);
    o.create_missing_column_families(true);
    o.set_max_background_jobs(2);
    o.set_wal_recovery_mode(rocksdb::DBRecoveryMode::PointInTime);
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

fn cf_descriptors(opts: &StoreOptions) -> Vec<ColumnFamilyDescriptor> {
    let mut frames = db_options(opts);
    frames.set_write_buffer_size(64 << 20);
    vec![
        ColumnFamilyDescriptor::new(CF_FRAMES, frames),
        ColumnFamilyDescriptor::new(CF_CHAN_INDEX, db_options(opts)),
        ColumnFamilyDescriptor::new(
            CF_CATALOG,
            db_options(&StoreOptions {
                compression: Compression::None,
                ..opts.clone()
            }),
        ),
    ]
}

fn is_lock_error(e: &rocksdb::Error) -> bool {
    let s = e.to_string();
    s.contains("lock") || s.contains("Resource temporarily unavailable")
}

impl Store {
    /// Opens (creating if needed) the data dir. A read-write open recovers crashed sessions.
    pub fn open(path: &Path, opts: StoreOptions) -> Result<Store, StoreError> {
        let open_err = |reason: String| StoreError::Open {
            path: path.display().to_string(),
            reason,
        };
        let db = if opts.read_only {
            if !path.join("CURRENT").exists() {
                return Err(open_err(
                    "no recordings here (the data dir does not exist or is empty)".into(),
                ));
            }
            DB::open_cf_descriptors_read_only(
                &db_options(&opts),
                path,
                cf_descriptors(&opts),
                false,
            )
            .map_err(|e| open_err(e.to_string()))?
        } else {
            create_private_dir(path).map_err(|e| open_err(e.to_string()))?;
            DB::open_cf_descriptors(&db_options(&opts), path, cf_descriptors(&opts)).map_err(
                |e| {
                    if is_lock_error(&e) {
                        StoreError::Locked(path.display().to_string())
                    } else {
                        open_err(e.to_string())
                    }
                },
            )?
        };
        let store = Store {
            db: Arc::new(db),
            opts,
            path: path.to_path_buf(),
        };
        if !store.opts.read_only {
            store.recover_crashed()?;
        }
        Ok(store)
    }

    /// Opens read-write if possible, read-only if another process holds the data dir.
    pub fn open_for_reading(path: &Path) -> Result<Store, StoreError> {
        match Store::open(path, StoreOptions::default()) {
            Err(StoreError::Locked(_)) => Store::open(
                path,
                StoreOptions {
                    read_only: true,
                    ..StoreOptions::default()
                },
            ),
            other => other,
        }
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

    /// Every session in the catalog, oldest first (ids are UUID v7).
    pub fn sessions(&self) -> Result<Vec<SessionMeta>, StoreError> {
        let mut out = Vec::new();
        for item in self
            .db
            .iterator_cf(self.cf(CF_CATALOG), IteratorMode::Start)
        {
            let (_, v) = item?;
            out.push(decode_meta(&v)?);
        }
        Ok(out)
    }

    /// One session's catalog entry.
    pub fn session(&self, id: SessionId) -> Result<Option<SessionMeta>, StoreError> {
        match self.db.get_cf(self.cf(CF_CATALOG), keys::catalog_key(id))? {
            Some(v) => Ok(Some(decode_meta(&v)?)),
            None => Ok(None),
        }
    }

    /// Finds a session by full id, unique id prefix, or `latest`.
    pub fn resolve(&self, query: &str) -> Result<SessionMeta, StoreError> {
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
                m.state = Some(SessionState::Ended);
                m.end_reason = Some(EndReason::Crash);
                m.ended_ns = Some(m.last_ns.max(m.started_ns));
                for b in &mut m.bridges {
                    b.detached_ns.get_or_insert(m.last_ns);
                }
                self.put_meta(&m)?;
                fixed.push(m.id);
            }
        }
        Ok(fixed)
    }

    /// Flushes memtables and syncs the WAL (used at shutdown).
    pub fn sync(&self) -> Result<(), StoreError> {
        if !self.opts.read_only {
            self.db.flush_wal(true)?;
        }
        Ok(())
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
