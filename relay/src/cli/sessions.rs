//! `gabp-relay sessions [ls|rm|check|tag|prune]`: list (with the selection filters of
//! [`super::select`]), remove, check or tag recorded sessions; `prune` (in [`super::prune`])
//! deletes them by age or size.
//!
//! Only `rm`, `tag` and `prune` open the data dir for change; everything else reads it
//! read-only. Listing never deletes: `sessions --retain` is a usage error that names `prune`.

use std::io::Write;

use anyhow::{bail, Result};
use clap::{Args, Subcommand};
use gabp_rt::display;
use gabp_storage::{SessionMeta, Store, StoreError};
use serde_json::json;

use super::DataDir;

#[derive(Args, Debug)]
pub struct SessionsArgs {
    #[command(subcommand)]
    pub cmd: Option<SessionsCmd>,
    #[command(flatten)]
    pub dir: DataDir,
    /// Print one JSON document (camelCase keys) instead of a table.
    #[arg(long, global = true)]
    pub json: bool,
    /// Not a listing flag: `sessions prune --retain` deletes by age or size. Taken only to say
    /// so (exit 2) instead of clap's generic unknown-argument line.
    #[arg(long, hide = true, num_args = 0..=1, default_missing_value = "", value_name = "SIZE|AGE")]
    pub retain: Option<String>,
    #[command(flatten)]
    pub filters: super::select::Filters,
}

#[derive(Subcommand, Debug)]
pub enum SessionsCmd {
    /// List sessions (the default).
    Ls,
    /// Remove a session.
    Rm {
        /// Session id, unique id prefix, or `latest`.
        session: String,
    },
    /// Verify that sessions' frames, index and catalog agree.
    Check {
        /// Session id, prefix or `latest` (all sessions when absent).
        session: Option<String>,
    },
    /// Set or remove a session's tags (while no relay has the data dir open).
    Tag {
        /// Session id, unique id prefix, or `latest`.
        session: String,
        /// Tags to set, KEY=VALUE.
        #[arg(value_name = "KEY=VALUE", value_parser = gabp_storage::parse_tag)]
        set: Vec<(String, String)>,
        /// Remove this tag (repeatable).
        #[arg(long, value_name = "KEY", value_parser = parse_tag_key)]
        remove: Vec<String>,
    },
    /// Delete ended sessions older than an age and/or the oldest beyond a total size, listing
    /// each (--dry-run: only list them).
    Prune(super::prune::PruneArgs),
}

/// `--remove KEY`: a key that could have been set (removing one that could not is a typo).
fn parse_tag_key(s: &str) -> Result<String, String> {
    gabp_storage::catalog::check_tag(s, "")?;
    Ok(s.to_string())
}

/// A session by id, unique prefix or `latest`; an ambiguous prefix lists its candidates.
/// An empty id is a usage error (it would otherwise be a prefix of every session).
pub fn resolve(store: &Store, query: &str) -> Result<SessionMeta> {
    if query.trim().is_empty() {
        return Err(super::usage(
            "a session id must not be empty: give an id, a unique prefix, or latest",
        ));
    }
    match store.resolve(query) {
        Err(StoreError::Ambiguous(_)) => {
            let q = query.to_ascii_lowercase();
            let ids: Vec<String> = store
                .sessions()?
                .iter()
                .map(|m| m.id.to_string())
                .filter(|id| id.starts_with(&q))
                .collect();
            let shown = ids.iter().take(10).cloned().collect::<Vec<_>>().join(", ");
            let more = if ids.len() > 10 { ", …" } else { "" };
            bail!(
                "session id prefix {query:?} matches {} sessions: {shown}{more}; give more of the id",
                ids.len()
            )
        }
        r => Ok(r?),
    }
}

/// Opens the data dir for `rm` or `tag`. While a relay records, what `rm` was asked is
/// still checked first, read-only: an ambiguous or unknown session says so (with the
/// candidates), as it would without a relay; only a removal that could be done is refused for
/// the lock.
fn open_for_change(dir: &std::path::Path, cmd: &SessionsCmd) -> Result<Store> {
    match open_to_change(dir) {
        Err(locked @ StoreError::Locked { .. }) => {
            if let SessionsCmd::Rm { session } = cmd {
                resolve(&Store::open_for_reading(dir)?, session)?;
            }
            Err(locked.into())
        }
        r => Ok(r?),
    }
}

/// Opens the data dir for a command that changes it: read-write, refused while a relay holds
/// it (naming its pid) and on a disk without room or written read-only, untouched then.
pub fn open_to_change(dir: &std::path::Path) -> Result<Store, StoreError> {
    // RocksDB writes new logs, tables and manifests on every read-write open.
    gabp_engine::recorder::private_file_modes();
    Store::open_for_change(dir)
}

/// The JSON form of one catalog entry.
fn meta_json(m: &SessionMeta) -> serde_json::Value {
    json!({
        "id": m.id.to_string(), "route": m.route, "app": m.app_name, "appVersion": m.app_version,
        "agentId": m.agent_id, "startedNs": m.started_ns, "startedAt": display::utc(m.started_ns),
        "endedNs": m.ended_ns, "durationS": m.duration_ns() as f64 / 1e9,
        "frames": m.frames, "bytes": m.bytes, "events": m.events, "bridges": m.bridges.len(), "end": m.end_label(),
        "anomalies": m.anomalies, "recordErrors": m.record_errors, "lostFrames": m.lost_frames,
        "tags": m.tags,
    })
}

/// Tags as `k=v k=v` for the table (`-` when none).
fn tags_text(m: &SessionMeta) -> String {
    if m.tags.is_empty() {
        return "-".into();
    }
    let all: Vec<String> = m
        .tags
        .iter()
        .map(|(k, v)| format!("{k}={}", display::name(v)))
        .collect();
    all.join(" ")
}

pub fn run(a: SessionsArgs) -> Result<()> {
    if let Some(r) = &a.retain {
        let r = if r.trim().is_empty() { "SIZE|AGE" } else { r };
        return Err(super::usage(format!(
            "sessions only lists and never deletes: to delete by age or size run gabp-relay sessions prune --retain {} (--dry-run first to see what would go)",
            display::name(r)
        )));
    }
    let cmd = a.cmd.unwrap_or(SessionsCmd::Ls);
    if let SessionsCmd::Prune(p) = &cmd {
        if a.filters.any() {
            return Err(super::usage(
                "sessions prune chooses sessions by --retain alone: --all, --route, --since, --tag and --app do not apply",
            ));
        }
        return super::prune::run(&a.dir.data_dir, p, a.json);
    }
    let changes = matches!(cmd, SessionsCmd::Rm { .. } | SessionsCmd::Tag { .. });
    if let SessionsCmd::Tag { set, remove, .. } = &cmd {
        if set.is_empty() && remove.is_empty() {
            return Err(super::usage(
                "sessions tag: give KEY=VALUE tags to set and/or --remove KEY",
            ));
        }
        if let Some((k, _)) = set.iter().find(|(k, _)| remove.contains(k)) {
            return Err(super::usage(format!(
                "sessions tag: {k} is both set and removed"
            )));
        }
    }
    let store = if changes {
        open_for_change(&a.dir.data_dir, &cmd)?
    } else {
        Store::open_for_reading(&a.dir.data_dir)?
    };
    match cmd {
        SessionsCmd::Ls => {
            let now = gabp_rt::clock::now_ns();
            let list: Vec<SessionMeta> = store
                .sessions()?
                .into_iter()
                .filter(|m| a.filters.matches(m, now))
                .collect();
            if list.is_empty() && a.filters.any() {
                bail!("no session matches the selection");
            }
            if a.json {
                let v: Vec<_> = list
                    .iter()
                    .map(|m| gabp_ship::session_json(&store, m, meta_json(m)))
                    .collect();
                return super::print_json(&json!({ "sessions": v }));
            }
            use display::Align::{Left, Right};
            let mut table = display::Table::new(&[
                ("SESSION", Left, 36),
                ("ROUTE", Left, 24),
                ("APP", Left, 24),
                ("START (UTC)", Left, 20),
                ("DURATION (s)", Right, 14),
                ("FRAMES", Right, 14),
                ("SIZE", Right, 12),
                ("END", Left, 16),
                ("TAGS", Left, 80),
            ]);
            for m in &list {
                table.row(vec![
                    m.id.to_string(),
                    display::name(&m.route),
                    m.app_name.as_deref().map_or("-".into(), display::name),
                    display::utc(m.started_ns),
                    format!("{:.1}", m.duration_ns() as f64 / 1e9),
                    m.frames.to_string(),
                    display::bytes(m.bytes),
                    m.end_label().to_string(),
                    tags_text(m),
                ]);
            }
            write!(std::io::stdout(), "{}", table.render())?;
        }
        SessionsCmd::Rm { session } => {
            let meta = resolve(&store, &session)?;
            store.delete_session(meta.id)?;
            if a.json {
                return super::print_json(&json!({ "removed": meta.id.to_string() }));
            }
            outln!("removed session {}", meta.id);
        }
        SessionsCmd::Tag {
            session,
            set,
            remove,
        } => {
            let meta = resolve(&store, &session)?;
            let mut tags = meta.tags.clone();
            for k in &remove {
                tags.remove(k);
            }
            tags.extend(set);
            let most = gabp_storage::catalog::MAX_TAGS;
            if tags.len() > most {
                return Err(super::usage(format!(
                    "a session carries at most {most} tags ({} asked)",
                    tags.len()
                )));
            }
            let m = store.set_tags(meta.id, tags)?;
            if a.json {
                return super::print_json(&json!({ "session": m.id.to_string(), "tags": m.tags }));
            }
            outln!("session {}  {}", m.id, tags_text(&m));
        }
        // Handled (and returned) before the data dir is opened here.
        SessionsCmd::Prune(_) => {}
        SessionsCmd::Check { session } => {
            let metas: Vec<SessionMeta> = match session {
                Some(s) => vec![resolve(&store, &s)?],
                None => store.sessions()?,
            };
            let progress =
                super::progress::Progress::frames(metas.iter().map(|m| m.frames).sum(), a.json);
            let (mut reports, mut before) = (Vec::new(), 0);
            for m in &metas {
                progress.reading(&m.id.to_string());
                reports.push(store.check_session_with(m.id, &mut |n| progress.at(before + n))?);
                before += m.frames;
            }
            progress.done();
            let bad = reports.iter().filter(|r| !r.ok()).count();
            if a.json {
                let v: Vec<_> = reports
                    .iter()
                    .map(|r| {
                        json!({
                            "session": r.session, "ok": r.ok(), "frames": r.frames, "chunks": r.chunks,
                            "indexEntries": r.index_entries, "channels": r.channels, "gaps": r.gaps,
                            "lostFrames": r.lost_frames, "problems": r.problems,
                        })
                    })
                    .collect();
                super::print_json(&json!({ "ok": bad == 0, "sessions": v }))?;
            } else {
                for r in &reports {
                    outln!(
                        "{}  {}  {} frames, {} chunks, {} index entries, {} channels",
                        r.session,
                        if r.ok() { "ok" } else { "FAILED" },
                        r.frames,
                        r.chunks,
                        r.index_entries,
                        r.channels
                    );
                    for p in &r.problems {
                        outln!("    {}", display::text(p, 300));
                    }
                }
            }
            if bad > 0 {
                bail!("{bad} session(s) failed the consistency check");
            }
        }
    }
    Ok(())
}
