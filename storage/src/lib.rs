//! RocksDB persistence for GABP sessions: the recorder's write path and the replay reader.
//!
//! - [`keys`]: the key layout of every column family (the one place it is defined).
//! - [`chunk`]: frame records and the chunk encoding that packs many frames into one value.
//! - [`catalog`]: the per-session catalog entry (route, mod, welcome, bridges, counts, end) and
//!   the encodings of its parts.
//! - [`store`]: opening the data dir (record, read, change) and RocksDB's settings.
//! - [`dir`]: the data dir on the file system: ownership, modes, symlinks, the lock's holder.
//! - [`sessions`]: listing and looking up sessions, details, crash recovery.
//! - [`retention`]: deleting sessions, retention, and reclaiming their disk space.
//! - [`writer`]: group-committed writes of frames, index and catalog in one `WriteBatch`.
//! - [`reader`]: streaming reads of a session in arrival order, or one channel from a seq.
//! - [`repair`]: `gabp-relay repair`, which copies a damaged data dir aside before fixing it.
//! - [`check`]: verifies that a session's frames, index and catalog agree.
//! - [`ship`]: the ship cursor, chunks read from it, catalog snapshots, idempotent ingest.
//!
//! The API is synchronous: the relay runs the writer on a dedicated thread, never on an async
//! worker. Frames are keyed by (session id, frame number), never by the mod's seq, which
//! restarts with the game.
#![warn(missing_docs)]

pub mod catalog;
pub mod check;
pub mod chunk;
pub mod destination;
pub mod dir;
pub mod error;
pub mod keys;
pub mod mark;
pub mod meter;
pub mod reader;
pub mod repair;
pub mod sessions;
pub mod ship;
pub mod store;
pub mod writer;

pub use store::retention;

pub use catalog::{check_tag, parse_tag, BridgeInfo, EndReason, Gap, SessionMeta, SessionState};
pub use chunk::{Direction, FrameRecord};
pub use error::StoreError;
pub use store::{Compression, Durability, Store, StoreOptions};
pub use writer::SessionWriter;

/// A session id: a UUID v7, so ids sort by start time.
pub type SessionId = uuid::Uuid;
