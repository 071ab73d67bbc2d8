//! `gabp-relay export`: recorded sessions as JSON lines (stdout or a file), Parquet (a file
//! for one session, a Hive-partitioned directory for a selection) or MCAP (one session, a
//! file), whole or cut to channels, offsets, marks or one episode.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use crate::config::parse_duration;
use anyhow::{Context, Result};
use clap::{Args, ValueEnum};
use gabp_analysis::export::{self, mcap, parquet, EpisodeMarks, ExportFilter};
use gabp_storage::Store;

use super::select::{select, Filters};
use super::{usage, DataDir};

#[derive(Args, Debug)]
pub struct ExportArgs {
    /// Session ids, unique id prefixes, or `latest` (or select with --all and the filters).
    pub sessions: Vec<String>,
    #[command(flatten)]
    pub dir: DataDir,
    #[command(flatten)]
    pub filters: Filters,
    /// Only events on this channel (repeatable).
    #[arg(long)]
    pub channel: Vec<String>,
    /// Only frames from this offset into the session (e.g. 10s).
    #[arg(long, value_parser = parse_duration)]
    pub from: Option<Duration>,
    /// Only frames before this offset (e.g. 1m).
    #[arg(long, value_parser = parse_duration)]
    pub to: Option<Duration>,
    /// Start at the first mark with this label (inclusive).
    #[arg(long, value_name = "LABEL", conflicts_with_all = ["from", "to"], value_parser = mark_label)]
    pub from_mark: Option<String>,
    /// End at the next mark with this label (inclusive).
    #[arg(long, value_name = "LABEL", conflicts_with_all = ["from", "to"], value_parser = mark_label)]
    pub to_mark: Option<String>,
    /// Only episode N of each session (numbered from 1; both marks included). A selection
    /// leaves out the sessions without it.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..),
          conflicts_with_all = ["from", "to", "from_mark", "to_mark"])]
    pub episode: Option<u64>,
    /// The labels of the marks that start and end an episode.
    #[arg(long, value_name = "START,END", value_parser = EpisodeMarks::parse,
          default_value = "episode-start,episode-end")]
    pub episode_marks: EpisodeMarks,
    /// Write here instead of stdout (`-` is stdout too; with --format parquet: a file for one
    /// session id, a directory for a selection).
    #[arg(short, long)]
    pub output: Option<PathBuf>,
    /// jsonl (one frame per line), parquet (one row per frame; needs -o) or mcap (one session
    /// id; needs -o).
    #[arg(long, value_enum, default_value_t = Format::Jsonl)]
    pub format: Format,
    /// With --format parquet and a selection: replace a non-empty output directory.
    #[arg(long)]
    pub force: bool,
    /// With -o: print what was written as one JSON document (camelCase keys).
    #[arg(long, requires = "output")]
    pub json: bool,
}

/// A mark label to cut at: never empty (no mark has an empty label to find).
fn mark_label(s: &str) -> Result<String, String> {
    if s.trim().is_empty() {
        return Err("a mark label must not be empty".into());
    }
    Ok(s.to_string())
}

/// The export's format.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// JSON lines.
    Jsonl,
    /// Apache Parquet.
    Parquet,
    /// MCAP (Foxglove, Rerun): a channel per event channel and per kind of call.
    Mcap,
}

pub fn run(a: ExportArgs) -> Result<()> {
    if let (Some(from), Some(to)) = (a.from, a.to) {
        if from >= to {
            return Err(usage(format!(
                "--from {} is not before --to {}: nothing to export",
                humantime::format_duration(from),
                humantime::format_duration(to)
            )));
        }
    }
    if a.json && a.output.as_deref().is_some_and(export::is_stdout) {
        return Err(usage(
            "--json with -o - would mix the summary into the export on stdout: write the export to a file",
        ));
    }
    // One session named by id keeps the single-session report; a selection reports each.
    let single = a.sessions.len() == 1 && !a.filters.any();
    if a.format == Format::Parquet && a.output.is_none() {
        return Err(usage(
            "--format parquet writes a file or directory: give it with -o PATH",
        ));
    }
    if a.format == Format::Mcap && (!single || a.output.is_none()) {
        return Err(usage(
            "--format mcap writes one session into one file: give one session id and -o FILE",
        ));
    }
    if a.force && (a.format != Format::Parquet || single) {
        return Err(usage(
            "--force replaces a Parquet export's directory: it needs --format parquet and a selection (several ids, --all or a filter)",
        ));
    }
    if a.format == Format::Parquet && !single && a.output.as_deref().is_some_and(export::is_stdout)
    {
        return Err(usage(
            "a Parquet export of a selection is a directory: give it with -o DIR, not -",
        ));
    }
    if let (Format::Parquet, false, Some(dir)) = (a.format, single, &a.output) {
        if export::is_link_to_a_directory(dir) {
            // `--force` would replace the link, not the directory it leads to.
            return Err(usage(format!(
                "-o {} is a symbolic link to a directory: give the directory itself",
                dir.display()
            )));
        }
        // Checked before any reading, so a forgotten --force costs nothing.
        if !a.force && parquet::non_empty_dir(dir).unwrap_or(false) {
            return Err(usage(format!(
                "{} exists and is not empty: give --force to replace it, or another -o",
                dir.display()
            )));
        }
    }
    if let Some(o) = a.output.as_deref().filter(|o| !export::is_stdout(o)) {
        refuse_the_data_dir("-o", o, &a.dir.data_dir)?;
        if a.format == Format::Jsonl || single {
            let example = match a.format {
                Format::Jsonl => "export.jsonl",
                Format::Parquet => "export.parquet",
                Format::Mcap => "export.mcap",
            };
            refuse_a_directory("-o", o, "the export is one file", example)?;
        }
    }
    let store = Store::open_for_reading(&a.dir.data_dir)?;
    let mut metas = select(&store, &a.sessions, &a.filters, false)?;
    let filter = ExportFilter {
        channels: a.channel,
        from: a.from,
        to: a.to,
        from_mark: a.from_mark,
        to_mark: a.to_mark,
        episode: a.episode,
        episode_marks: a.episode_marks,
        // Found in the export's own walk: a selection leaves out, after the fact, the
        // sessions that ended before that episode began (they wrote nothing).
        skip_without_episode: !single,
    };
    if !single
        && (!filter.channels.is_empty() || filter.from_mark.is_some() || filter.to_mark.is_some())
    {
        metas = keep_those_with_cuts(&store, metas, &filter)?;
    }
    // Cleared before the summary below is printed (and on every early return).
    let watch =
        super::progress::Following::reads(&store, metas.iter().map(|m| m.frames).sum(), a.json);
    let Some(path) = &a.output else {
        let counts = export::export_sessions(
            &store,
            &metas,
            &filter,
            &mut std::io::BufWriter::new(std::io::stdout().lock()),
        )?;
        let kept = metas.iter().zip(counts).filter_map(|(m, n)| n.map(|_| m));
        return without_the_episode(&metas, kept.map(|m| m.id.to_string()).collect(), &filter);
    };
    let written: Vec<(String, u64, Option<PathBuf>)> = match (a.format, single) {
        (Format::Jsonl, _) => {
            let counts = export::export_to_file(&store, &metas, &filter, path)
                .with_context(|| format!("exporting to {}", path.display()))?;
            metas
                .iter()
                .zip(counts)
                .filter_map(|(m, n)| Some((m.id.to_string(), n?, None)))
                .collect()
        }
        (Format::Mcap, _) => {
            let w = mcap::export_to_file(&store, &metas[0], &filter, path)
                .with_context(|| format!("exporting to {}", path.display()))?;
            drop(watch);
            let session = metas[0].id.to_string();
            if a.json {
                return super::print_json(&serde_json::json!({
                    "session": session, "output": path.display().to_string(),
                    "messages": w.messages, "channels": w.topics,
                }));
            }
            let _ = writeln!(
                std::io::stderr(),
                "exported {} messages on {} channels of session {session}",
                w.messages,
                w.topics.len()
            );
            return Ok(());
        }
        (Format::Parquet, true) => {
            let n = parquet::export_to_file(&store, &metas[0], &filter, path)
                .with_context(|| format!("exporting to {}", path.display()))?;
            vec![(metas[0].id.to_string(), n, None)]
        }
        (Format::Parquet, false) => {
            let existing = match a.force {
                true => parquet::Existing::Replace,
                false => parquet::Existing::Refuse,
            };
            parquet::export_hive(&store, &metas, &filter, path, existing)
                .with_context(|| format!("exporting to {}", path.display()))?
                .into_iter()
                .map(|w| (w.session, w.rows, Some(w.file)))
                .collect()
        }
    };
    drop(watch);
    without_the_episode(
        &metas,
        written.iter().map(|(s, ..)| s.clone()).collect(),
        &filter,
    )?;
    let frames: u64 = written.iter().map(|(_, n, _)| n).sum();
    if a.json {
        let sessions: Vec<serde_json::Value> = written
            .iter()
            .map(|(s, n, file)| {
                let mut v = serde_json::json!({"session": s, "frames": n});
                if let Some(f) = file {
                    v["file"] = f.display().to_string().into();
                }
                v
            })
            .collect();
        let mut doc = serde_json::json!({
            "frames": frames, "output": path.display().to_string(), "sessions": sessions,
        });
        if single {
            doc["session"] = written[0].0.clone().into();
        }
        super::print_json(&doc)?;
    } else if single {
        let _ = writeln!(
            std::io::stderr(),
            "exported {frames} frames of session {}",
            written[0].0
        );
    } else {
        let _ = writeln!(
            std::io::stderr(),
            "exported {frames} frames of {} session{}",
            written.len(),
            if written.len() == 1 { "" } else { "s" }
        );
    }
    Ok(())
}

/// The sessions of a selection that have every channel and mark the filter cuts at; each one
/// skipped is named on stderr. None left is one error line (exit 1): an empty export would
/// look like success.
fn keep_those_with_cuts(
    store: &Store,
    metas: Vec<gabp_storage::SessionMeta>,
    filter: &ExportFilter,
) -> anyhow::Result<Vec<gabp_storage::SessionMeta>> {
    let total = metas.len();
    let mut kept = Vec::with_capacity(total);
    let mut skipped = Vec::new();
    for meta in metas {
        match export::check(store, &meta, filter) {
            Ok(()) => kept.push(meta),
            Err(e) => match e.missing_in_session() {
                Some(why) => skipped.push(format!("session {}: {why}", meta.id)),
                None => return Err(e.into()),
            },
        }
    }
    if kept.is_empty() {
        let last = skipped.pop().unwrap_or_default();
        anyhow::bail!("none of the {total} selected sessions has what the export cuts at ({last})");
    }
    let mut err = std::io::stderr().lock();
    for s in skipped {
        let _ = writeln!(err, "skipping {s}");
    }
    Ok(kept)
}

/// Names on stderr each session of a selection left out for lacking `--episode N` (found as it
/// was exported); none exported at all is one error line (exit 1): an empty export would look
/// like success.
fn without_the_episode(
    metas: &[gabp_storage::SessionMeta],
    kept: Vec<String>,
    filter: &ExportFilter,
) -> anyhow::Result<()> {
    let Some(n) = filter.episode else {
        return Ok(());
    };
    let kept: std::collections::HashSet<String> = kept.into_iter().collect();
    let skipped: Vec<String> = metas
        .iter()
        .map(|m| m.id.to_string())
        .filter(|id| !kept.contains(id))
        .collect();
    if kept.is_empty() {
        anyhow::bail!(
            "none of the {} selected sessions has an episode {n}",
            metas.len()
        );
    }
    let mut err = std::io::stderr().lock();
    for s in skipped {
        let _ = writeln!(err, "skipping session {s}: it has no episode {n}");
    }
    Ok(())
}

/// Refuses an existing directory where one file is written (found before any reading, not
/// when the finished file cannot be put there).
pub(super) fn refuse_a_directory(
    flag: &str,
    output: &std::path::Path,
    what: &str,
    example: &str,
) -> Result<()> {
    // Followed through links: a link to a directory would be replaced by the file.
    if std::fs::metadata(output).is_ok_and(|m| m.is_dir()) {
        let kind = match export::is_link_to_a_directory(output) {
            true => "a symbolic link to a directory",
            false => "a directory",
        };
        return Err(usage(format!(
            "{flag} {} is {kind} and {what}: give a file path (such as {})",
            output.display(),
            output.join(example).display()
        )));
    }
    Ok(())
}

/// Refuses an output that is, holds or lies in the data dir: an export or report never
/// writes where the recordings are (with `--force` it would replace them).
pub(super) fn refuse_the_data_dir(
    flag: &str,
    output: &std::path::Path,
    data: &std::path::Path,
) -> Result<()> {
    if export::overlaps_data_dir(output, data) {
        return Err(usage(format!(
            "{flag} {} is, holds or lies in the data dir {}: write the output somewhere else",
            output.display(),
            data.display()
        )));
    }
    Ok(())
}
