//! `gabp-relay export`: a session as JSONL, one frame per line, streamed in constant memory.
//!
//! Each line holds the frame number, receive time, offset from the session start, direction,
//! bridge connection, channel, mod and relay seq, and the frame itself as JSON (`msg`), or as a
//! string (`raw`) when it was not valid JSON when received.
//!
//! With `-o FILE` ([`export_to_file`]) the lines go to a private (0600) temporary file beside
//! FILE, renamed over it only once everything is written: a failed export never truncates
//! FILE, and a symlink at FILE is replaced, never followed.

use std::io::Write;
use std::time::Duration;

use gabp_storage::{SessionMeta, Store, StoreError};
use serde_json::{json, Value};

/// Which frames to export.
#[derive(Debug, Clone, Default)]
pub struct ExportFilter {
    /// Only events on these channels (all frames when empty).
    pub channels: Vec<String>,
    /// Only frames at or after this offset from the session start.
    pub from: Option<Duration>,
    /// Only frames before this offset.
    pub to: Option<Duration>,
}

/// Writes the session's frames as JSONL; returns how many lines were written.
pub fn export(
    store: &Store,
    meta: &SessionMeta,
    filter: &ExportFilter,
    out: &mut dyn Write,
) -> Result<u64, ExportError> {
    let meta = &*store.with_details(meta)?;
    let ids: Vec<u32> = filter
        .channels
        .iter()
        .map(|c| {
            meta.channels
                .iter()
                .position(|n| n == c)
                .map(|i| i as u32)
                .ok_or_else(|| ExportError::UnknownChannel(c.clone()))
        })
        .collect::<Result<_, _>>()?;
    let from_ns = filter.from.map(|d| meta.started_ns + d.as_nanos() as u64);
    let to_ns = filter.to.map(|d| meta.started_ns + d.as_nanos() as u64);
    let mut lines = 0;
    for item in store.frames(meta.id) {
        let (n, rec) = item?;
        if !ids.is_empty() && !rec.channel.is_some_and(|c| ids.contains(&c)) {
            continue;
        }
        if from_ns.is_some_and(|f| rec.time_ns < f) {
            continue;
        }
        if to_ns.is_some_and(|t| rec.time_ns >= t) {
            break;
        }
        let channel = rec
            .channel
            .and_then(|c| meta.channels.get(c as usize))
            .map(String::as_str);
        let head = json!({
            "frame": n,
            "tNs": rec.time_ns,
            "offsetMs": (rec.time_ns.saturating_sub(meta.started_ns)) as f64 / 1e6,
            "dir": rec.dir.as_str(),
            "conn": rec.conn,
            "channel": channel,
            "modSeq": rec.mod_seq,
            "relaySeq": rec.relay_seq,
        });
        let mut head = serde_json::to_vec(&head).expect("serializable");
        head.pop(); // reopen the object to append the frame
        out.write_all(&head)?;
        if rec.json_ok && !rec.body.contains(&b'\n') && !rec.body.contains(&b'\r') {
            out.write_all(b",\"msg\":")?;
            out.write_all(&rec.body)?;
        } else if let (true, Ok(v)) = (rec.json_ok, serde_json::from_slice::<Value>(&rec.body)) {
            out.write_all(b",\"msg\":")?;
            serde_json::to_writer(&mut *out, &v).map_err(std::io::Error::other)?;
        } else {
            out.write_all(b",\"raw\":")?;
            serde_json::to_writer(&mut *out, &String::from_utf8_lossy(&rec.body))
                .map_err(std::io::Error::other)?;
        }
        out.write_all(b"}\n")?;
        lines += 1;
    }
    out.flush()?;
    Ok(lines)
}

/// Exports into `path` atomically (see the module doc); returns how many lines were written.
pub fn export_to_file(
    store: &Store,
    meta: &SessionMeta,
    filter: &ExportFilter,
    path: &std::path::Path,
) -> Result<u64, ExportError> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => std::path::Path::new("."),
    };
    let mut tmp = tempfile::Builder::new()
        .prefix(".gabp-export-")
        .tempfile_in(dir)?;
    let mut out = std::io::BufWriter::new(tmp.as_file_mut());
    let n = export(store, meta, filter, &mut out)?;
    drop(out);
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(n)
}

/// Why an export failed.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// Reading the store failed.
    #[error("{0}")]
    Store(#[from] StoreError),
    /// Writing the output failed.
    #[error("writing output: {0}")]
    Io(#[from] std::io::Error),
    /// A `--channel` the session never saw.
    #[error("the session has no channel {0:?}")]
    UnknownChannel(String),
}
