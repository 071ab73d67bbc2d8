//! Errors of the storage layer.

/// Why a storage operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Another process holds the data dir.
    #[error("data dir {path} is in use by another process{}", pid.map(|p| format!(" (pid {p}, a running relay?)")).unwrap_or_default())]
    Locked {
        /// The directory.
        path: String,
        /// The holder of RocksDB's lock, when it can be found.
        pid: Option<u32>,
    },
    /// The data dir does not exist (read commands never create it).
    #[error("no data dir at {0}")]
    NoDataDir(String),
    /// The data dir exists but cannot be opened without RocksDB discarding or guessing data.
    #[error("data dir {path} cannot be read safely ({reason}); no recorded data was changed: run `gabp-relay repair --data-dir {path}` (it copies the dir first)")]
    Damaged {
        /// The directory.
        path: String,
        /// A short reason.
        reason: String,
    },
    /// The data dir is not safe to record into (owner, permissions, symlink).
    #[error("refusing data dir {path}: {reason}")]
    Unsafe {
        /// The directory.
        path: String,
        /// A short reason.
        reason: String,
    },
    /// The data dir could not be created or opened.
    #[error("cannot open data dir {path}: {reason}")]
    Open {
        /// The directory.
        path: String,
        /// A short reason.
        reason: String,
    },
    /// No session with that id (or id prefix).
    #[error("no session matches {0:?}")]
    NoSuchSession(String),
    /// An id prefix matches more than one session.
    #[error("session id prefix {0:?} is ambiguous")]
    Ambiguous(String),
    /// A stored value does not decode: the data dir is damaged.
    #[error("corrupt record: {0}")]
    Corrupt(String),
    /// RocksDB reported an error (I/O, disk full, a damaged block found when read, ...).
    #[error("{}", db_line(.0))]
    Db(#[from] rocksdb::Error),
    /// A filesystem error outside RocksDB.
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
}

/// A RocksDB error as one line; damage found while reading points at the two commands that
/// deal with it (the data dir is not known here, so no `--data-dir` is named).
fn db_line(e: &rocksdb::Error) -> String {
    if e.kind() == rocksdb::ErrorKind::Corruption {
        format!(
            "the data dir is damaged ({e}): `gabp-relay sessions check` shows which sessions are affected; `gabp-relay repair` salvages what can be read (it copies the dir first)"
        )
    } else {
        format!("storage error: {e}")
    }
}

impl StoreError {
    /// The failure without advice on what to run next, for reports that give their own
    /// (`sessions check`, `repair`).
    pub fn detail(&self) -> String {
        match self {
            StoreError::Db(e) => e.to_string(),
            StoreError::Damaged { reason, .. } => reason.clone(),
            other => other.to_string(),
        }
    }
}
