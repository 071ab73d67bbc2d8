//! `gabp-relay export`: recorded sessions as JSON lines, to stdout or a file.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use crate::config::parse_duration;
use crate::export::{self, ExportFilter};
use anyhow::{Context, Result};
use clap::Args;
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
    /// Write here instead of stdout (`-` is stdout too).
    #[arg(short, long)]
    pub output: Option<PathBuf>,
    /// With -o: print what was written as one JSON document (the export itself is always
    /// JSON lines, camelCase keys).
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
    let store = Store::open_for_reading(&a.dir.data_dir)?;
    let metas = select(&store, &a.sessions, &a.filters, false)?;
    // One session named by id keeps the single-session report; a selection reports each.
    let single = a.sessions.len() == 1 && !a.filters.any();
    let filter = ExportFilter {
        channels: a.channel,
        from: a.from,
        to: a.to,
        from_mark: a.from_mark,
        to_mark: a.to_mark,
    };
    let Some(path) = &a.output else {
        export::export_sessions(
            &store,
            &metas,
            &filter,
            &mut std::io::BufWriter::new(std::io::stdout().lock()),
        )?;
        return Ok(());
    };
    let counts = export::export_to_file(&store, &metas, &filter, path)
        .with_context(|| format!("exporting to {}", path.display()))?;
    let written: Vec<(String, u64)> = metas.iter().map(|m| m.id.to_string()).zip(counts).collect();
    let frames: u64 = written.iter().map(|(_, n)| n).sum();
    if a.json {
        let mut doc = serde_json::json!({
            "frames": frames, "output": path.display().to_string(),
            "sessions": written.iter().map(|(s, n)| serde_json::json!({"session": s, "frames": n})).collect::<Vec<_>>(),
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
            "exported {frames} frames of {} sessions",
            written.len()
        );
    }
    Ok(())
}
