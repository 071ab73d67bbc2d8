//! `gabp-relay export`: a recorded session as JSON lines, to stdout or a file.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use crate::config::parse_duration;
use crate::export::{export, export_to_file, ExportFilter};
use anyhow::{Context, Result};
use clap::Args;
use gabp_storage::Store;

use super::{usage, DataDir};

#[derive(Args, Debug)]
pub struct ExportArgs {
    /// Session id, unique id prefix, or `latest`.
    pub session: String,
    #[command(flatten)]
    pub dir: DataDir,
    /// Only events on this channel (repeatable).
    #[arg(long)]
    pub channel: Vec<String>,
    /// Only frames from this offset into the session (e.g. 10s).
    #[arg(long, value_parser = parse_duration)]
    pub from: Option<Duration>,
    /// Only frames before this offset (e.g. 1m).
    #[arg(long, value_parser = parse_duration)]
    pub to: Option<Duration>,
    /// Write here instead of stdout.
    #[arg(short, long)]
    pub output: Option<PathBuf>,
    /// With -o: print what was written as one JSON document (the export itself is always
    /// JSON lines, camelCase keys).
    #[arg(long, requires = "output")]
    pub json: bool,
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
    let store = Store::open_for_reading(&a.dir.data_dir)?;
    let meta = super::sessions::resolve(&store, &a.session)?;
    let filter = ExportFilter {
        channels: a.channel,
        from: a.from,
        to: a.to,
    };
    match &a.output {
        Some(path) => {
            let n = export_to_file(&store, &meta, &filter, path)
                .with_context(|| format!("exporting to {}", path.display()))?;
            if a.json {
                super::print_json(&serde_json::json!({
                    "session": meta.id.to_string(), "frames": n, "output": path.display().to_string(),
                }))?;
            } else {
                let _ = writeln!(
                    std::io::stderr(),
                    "exported {n} frames of session {}",
                    meta.id
                );
            }
        }
        None => {
            export(
                &store,
                &meta,
                &filter,
                &mut std::io::BufWriter::new(std::io::stdout().lock()),
            )?;
        }
    }
    Ok(())
}
