//! `gabp-relay collect`: write what relays ship into an archive data dir, until stopped.

use anyhow::Result;
use clap::Args;
use tokio_util::sync::CancellationToken;

use super::{usage, Signals};
use gabp_ship::collect::{Collector, Tally, Verifier};
use gabp_ship::fleet::FleetKey;
use gabp_ship::NatsFlags;

#[derive(Args, Debug)]
pub struct CollectArgs {
    /// The NATS JetStream cluster: nats://HOST:PORT[,HOST:PORT…].
    #[arg(long, value_name = "URLS")]
    pub from: String,
    /// The archive: an ordinary data dir every read command works on.
    #[arg(long)]
    pub data_dir: std::path::PathBuf,
    /// The durable consumer's name (collectors sharing it share the work).
    #[arg(long, default_value = "gabp-collector", value_parser = gabp_ship::nats_name)]
    pub durable: String,
    /// Serve Prometheus metrics (frames collected, messages rejected) at HOST:PORT.
    #[arg(long, value_name = "HOST:PORT")]
    pub metrics: Option<std::net::SocketAddr>,
    #[command(flatten)]
    pub nats: NatsFlags,
    /// Fleet key file: messages it did not sign are refused (counted, logged, terminated).
    /// Give it more than once to take several keys while one is being replaced.
    #[arg(long, value_name = "FILE")]
    pub fleet_key: Vec<std::path::PathBuf>,
    /// Also take unsigned messages (relays shipping without a key): anyone who can publish on
    /// the subjects can then write into the archive.
    #[arg(long)]
    pub insecure_unsigned: bool,
}

pub async fn run(a: CollectArgs) -> Result<()> {
    gabp_ship::check_urls(&a.from).map_err(|e| usage(format!("--from: {e}")))?;
    a.nats.check().map_err(usage)?;
    let keys = a
        .fleet_key
        .iter()
        .map(|p| FleetKey::load(p))
        .collect::<Result<Vec<_>, _>>()
        .map_err(usage)?;
    let verifier = Verifier::new(keys, a.insecure_unsigned).map_err(usage)?;
    let mut signals = Signals::install()?;
    let cancel = CancellationToken::new();
    if let Some(addr) = a.metrics {
        let listener = gabp_engine::http::bind(addr)
            .await
            .map_err(|e| anyhow::anyhow!("cannot listen for metrics on {addr}: {e}"))?;
        if let Some(handle) = gabp_engine::metrics::install() {
            tokio::spawn(gabp_engine::http::serve(
                listener,
                handle,
                gabp_engine::http::Readiness::default(),
                cancel.clone(),
            ));
        }
    }
    let c = Collector {
        urls: a.from,
        flags: a.nats,
        durable: a.durable,
        data_dir: a.data_dir,
        verifier,
    };
    let stop = cancel.clone();
    tokio::spawn(async move {
        let sig = signals.shutdown().await;
        tracing::info!("{sig} received: stopping the collector");
        stop.cancel();
    });
    super::print_best_effort(&format!(
        "collecting from {} into {}\n",
        gabp_ship::shown(&c.urls),
        c.data_dir.display()
    ));
    let tally = Tally::default();
    // No total: a collector takes what the stream holds and then waits for more.
    let progress = super::progress::Progress::counting("frames collected");
    let done = {
        let run = c.run(cancel, &tally);
        tokio::pin!(run);
        let mut tick = tokio::time::interval(std::time::Duration::from_millis(200));
        loop {
            tokio::select! {
                done = &mut run => break done,
                _ = tick.tick() => progress.at(tally.frames()),
            }
        }
    };
    progress.done();
    // Said even when the archive failed: what was taken is in it, what was refused is gone.
    super::print_best_effort(&format!(
        "collected {} new frame(s); refused {} message(s) not signed with the fleet key and {} unreadable\n",
        tally.frames(),
        tally.unverified(),
        tally.unreadable()
    ));
    done
}
