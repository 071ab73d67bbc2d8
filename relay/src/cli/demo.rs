//! `gabp-relay demo`: a simulated mod, the relay and simulated bridges for a few seconds.

use std::path::PathBuf;
use std::time::Duration;

use crate::config::parse_duration;
use anyhow::{anyhow, Result};
use clap::Args;

use super::{parse_rate, Signals};

#[derive(Args, Debug)]
pub struct DemoArgs {
    /// How long to run (Ctrl-C stops it early, summary included).
    #[arg(long, value_parser = parse_duration, default_value = "5s")]
    pub duration: Duration,
    /// Where to record.
    #[arg(long, env = "GABP_RELAY_DATA_DIR", default_value = "gabp-data")]
    pub data_dir: PathBuf,
    /// Simulated bridges.
    #[arg(long, default_value_t = 3)]
    pub bridges: usize,
    /// Events per second from the simulated mod.
    #[arg(long, default_value_t = 20_000.0, value_parser = parse_rate)]
    pub rate: f64,
    /// Do not record.
    #[arg(long)]
    pub no_record: bool,
}

pub async fn run(a: DemoArgs) -> Result<()> {
    let mut signals = Signals::install()?;
    let stop = tokio_util::sync::CancellationToken::new();
    let on_signal = stop.clone();
    tokio::spawn(async move {
        signals.shutdown().await;
        on_signal.cancel();
    });
    let opts = crate::demo::DemoOptions {
        duration: a.duration,
        data_dir: a.data_dir,
        bridges: a.bridges.max(1),
        rate: a.rate,
        record: !a.no_record,
        stop,
    };
    let mut out = std::io::stdout();
    crate::demo::run(opts, &mut out)
        .await
        .map_err(|e| anyhow!(e))
}
