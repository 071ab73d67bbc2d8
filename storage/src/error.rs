//! Errors of the storage layer.

/// Why a storage operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Another process holds the data dir.
    #[error("data dir {0} is in use by another process")]
    Locked(String),
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
    /// RocksDB reported an error (I/O, disk full, ...).
    #[error("storage error: {0}")]
    Db(#[from] rocksdb::Error),
    /// A filesystem error outside RocksDB.
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
}
