//! The JSONL export: one frame per line, sessions one after another in one stream.
//!
//! Each line holds the session id, frame number, receive time, offset from the session start,
//! direction, bridge connection, kind (request, response, event, mark, other), channel, mod and
//! relay seq, a mark's label and data, the episode (null outside any), the session's tags (`{}`
//! when none, so every line has the same keys), and the frame itself as JSON (`msg`), or as a
//! string (`raw`) when it was not valid JSON when received.

use std::io::Write;

use gabp_storage::{SessionMeta, Store};
use serde_json::json;

use super::{for_each_row, write_atomically, ExportError, ExportFilter, Kind, Row};

/// Writes one session's frames as JSONL; returns how many lines were written.
pub fn export(
    store: &Store,
    meta: &SessionMeta,
    filter: &ExportFilter,
    out: &mut dyn Write,
) -> Result<u64, ExportError> {
    Ok(export_sessions(store, std::slice::from_ref(meta), filter, out)?[0].unwrap_or(0))
}

/// Writes the sessions' frames as JSONL, one after another; returns the lines of each, `None`
/// for a session left out for lacking the episode asked for
/// ([`ExportFilter::skip_without_episode`]: it wrote no line, since rows start with the
/// episode).
pub fn export_sessions(
    store: &Store,
    metas: &[SessionMeta],
    filter: &ExportFilter,
    out: &mut dyn Write,
) -> Result<Vec<Option<u64>>, ExportError> {
    let mut counts = Vec::with_capacity(metas.len());
    for meta in metas {
        let meta = &*store.with_details(meta)?;
        let session = meta.id.to_string();
        let n = for_each_row(store, meta, filter, |row| {
            line(meta, &session, row, &mut *out)
        });
        counts.push(match n {
            Ok(n) => Some(n),
            Err(ExportError::NoEpisode { .. }) if filter.skip_without_episode => None,
            Err(e) => return Err(e),
        });
    }
    out.flush()?;
    Ok(counts)
}

fn line(
    meta: &SessionMeta,
    session: &str,
    row: &Row<'_>,
    out: &mut dyn Write,
) -> Result<(), ExportError> {
    let rec = row.rec;
    let mut head = json!({
        "session": session,
        "frame": row.frame,
        "tNs": rec.time_ns,
        "offsetMs": (rec.time_ns.saturating_sub(meta.started_ns)) as f64 / 1e6,
        "dir": rec.dir.as_str(),
        "conn": rec.conn,
        "kind": row.kind.as_str(),
        "channel": row.channel,
        "modSeq": rec.mod_seq,
        "relaySeq": rec.relay_seq,
        "episode": row.episode,
    });
    if row.kind == Kind::Mark {
        head["label"] = json!(row.label);
    }
    head["tags"] = json!(meta.tags);
    let mut head = serde_json::to_vec(&head).expect("serializable");
    head.pop(); // reopen the object to append the frame
    out.write_all(&head)?;
    if row.kind == Kind::Mark {
        // The mark's data as the bridge wrote it (numbers of any size exact), on one line.
        out.write_all(b",\"data\":")?;
        match row.data.as_deref() {
            Some(d) => write_one_line(d.as_bytes(), out)?,
            None => out.write_all(b"null")?,
        }
    }
    if rec.json_ok {
        out.write_all(b",\"msg\":")?;
        write_one_line(&rec.body, out)?;
    } else {
        out.write_all(b",\"raw\":")?;
        serde_json::to_writer(&mut *out, &String::from_utf8_lossy(&rec.body))
            .map_err(std::io::Error::other)?;
    }
    out.write_all(b"}\n")?;
    Ok(())
}

/// Writes valid JSON `json` with its line breaks made spaces: in valid JSON a raw CR or LF can
/// only be whitespace between tokens (inside strings they are escaped), so the value, every
/// number and string of it, is unchanged and the line stays one line.
fn write_one_line(json: &[u8], out: &mut dyn Write) -> std::io::Result<()> {
    if !json.contains(&b'\n') && !json.contains(&b'\r') {
        return out.write_all(json);
    }
    let flat: Vec<u8> = json
        .iter()
        .map(|&b| if b == b'\n' || b == b'\r' { b' ' } else { b })
        .collect();
    out.write_all(&flat)
}

/// Exports into `path` atomically (see [`write_atomically`]); returns the lines per session
/// (as [`export_sessions`]).
pub fn export_to_file(
    store: &Store,
    metas: &[SessionMeta],
    filter: &ExportFilter,
    path: &std::path::Path,
) -> Result<Vec<Option<u64>>, ExportError> {
    write_atomically(path, |f| {
        let mut out = std::io::BufWriter::new(f);
        let n = export_sessions(store, metas, filter, &mut out)?;
        out.flush()?;
        Ok(n)
    })
}
