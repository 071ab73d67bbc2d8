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
    let mut all = Vec::with_capacity(metas.len());
    for (i, meta) in metas.iter().enumerate() {
        let stats = gabp_analysis::stats::compute(&store, meta)?;
        if a.json.json {
            all.push(stats);
            continue;
        }
        if i > 0 {
            outln!();
        }
        write!(
            std::io::stdout(),
            "{}",
            gabp_analysis::stats::render(&stats)
        )?;
    }
    if a.json.json {
        if single {
            return super::print_json(&all[0]);
        }
        return super::print_json(&serde_json::json!({ "sessions": all }));
    }
    Ok(())
}
