//! Reading recordings back as data: what the relay recorded, turned into rows, figures and
//! pages. Everything here reads a [`gabp_storage::Store`] opened for reading; nothing here
//! knows the relay engine, a socket or a runtime, so the engine never links Parquet or Arrow.
//!
//! - [`export`]: the row every format writes, which frames a filter keeps, which episode each
//!   frame belongs to, JSONL, Parquet (a file per session or a Hive directory) and MCAP, and
//!   atomic output files.
//! - [`episodes`]: `gabp-relay episodes`: each session's episodes, one pass per session.
//! - [`stats`]: `gabp-relay stats`: counts, rates and call latency per method of one session.
//! - [`report`]: `gabp-relay report`: one bounded pass into time buckets, and the HTML page of
//!   a session or of a selection of sessions.
//! - [`callcheck`]: `replay --expect-calls`: an agent's calls to a replay compared with a
//!   recording's, as a readable diff and as JSON.
//! - `calls`: what stats and the report share when they match answers to requests.

pub mod callcheck;
mod calls;
pub mod episodes;
pub mod export;
pub mod report;
pub mod stats;
