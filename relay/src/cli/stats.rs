//! `gabp-relay stats`: per-channel and per-method figures of recorded sessions, one session
//! after another.

use std::io::Write;

use anyhow::Result;
use clap::Args;
use gabp_storage::Store;

use super::select::{select, Filters};
use super::{DataDir, Json};

#[derive(Args, Debug)]
pub struct StatsArgs {
    /// Session ids, unique id prefixes, or `latest` (or select with --all and the filters).
    pub sessions: Vec<String>,
    #[command(flatten)]
    pub dir: DataDir,
    #[command(flatten)]
    pub filters: Filters,
    #[command(flatten)]
    pub json: Json,
}

pub fn run(a: StatsArgs) -> Result<()> {
    let store = Store::open_for_reading(&a.dir.data_dir)?;
    let metas = select(&store, &a.sessions, &a.filters, false)?;
    // One session named by id prints its figures alone (the form scripts already read);
    // a selection prints `{"sessions": [...]}`.
    let single = a.sessions.len() == 1 && !a.filters.any();
    // Figures are small: all are computed (under one progress bar) before any is printed.
    let mut all = Vec::with_capacity(metas.len());
    let total = metas.iter().map(|m| m.frames).sum();
    let progress = super::progress::Progress::frames(total, a.json.json);
    let mut before = 0;
    for meta in &metas {
        progress.reading(&meta.id.to_string());
        all.push(gabp_analysis::stats::compute_with(
            &store,
            meta,
            &mut |n| progress.at(before + n),
        )?);
        before += meta.frames;
    }
    progress.done();
    if !a.json.json {
        for (i, stats) in all.iter().enumerate() {
            if i > 0 {
                outln!();
            }
            write!(std::io::stdout(), "{}", gabp_analysis::stats::render(stats))?;
        }
        return Ok(());
    }
    if single {
        return super::print_json(&all[0]);
    }
    super::print_json(&serde_json::json!({ "sessions": all }))
}
