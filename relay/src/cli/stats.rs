//! `gabp-relay stats`: per-channel and per-method figures of a recorded session.

use std::io::Write;

use anyhow::Result;
use clap::Args;
use gabp_storage::Store;

use super::{DataDir, Json};

#[derive(Args, Debug)]
pub struct StatsArgs {
    /// Session id, unique id prefix, or `latest`.
    pub session: String,
    #[command(flatten)]
    pub dir: DataDir,
    #[command(flatten)]
    pub json: Json,
}

pub fn run(a: StatsArgs) -> Result<()> {
    let store = Store::open_for_reading(&a.dir.data_dir)?;
    let meta = super::sessions::resolve(&store, &a.session)?;
    let stats = crate::stats::compute(&store, &meta)?;
    if a.json.json {
        return super::print_json(&stats);
    }
    write!(std::io::stdout(), "{}", crate::stats::render(&stats))?;
    Ok(())
}
