//! `gabp-relay ship`: send recorded sessions to NATS JetStream (backfill), and the `serve`
//! flags that ship while serving. Messages carry the same ids as the relay's own shipping,
//! and each session resumes from its cursor, so shipping twice changes nothing.

use std::sync::Arc;

use std::io::Write;

use anyhow::{anyhow, Result};
use clap::Args;
use gabp_storage::Store;

use super::{usage, DataDir};
use crate::ship::shipper::{self, ShipStatus, Target};
use crate::ship::NatsFlags;

/// `serve`'s shipping flags.
#[derive(Args, Debug, Clone, Default)]
pub struct ServeShip {
    /// Ship every recording to this NATS JetStream cluster: nats://HOST:PORT[,HOST:PORT…].
    #[arg(long, value_name = "URLS")]
    pub ship: Option<String>,
    /// Let --retain delete sessions not fully shipped yet (kept by default while shipping).
    #[arg(long)]
    pub retain_unshipped: bool,
    #[command(flatten)]
    pub nats: NatsFlags,
}

impl ServeShip {
    /// The shipping target, if any (a usage error for a malformed address).
    pub fn target(&self) -> Result<Option<Target>> {
        let Some(urls) = &self.ship else {
            if let Some(name) = self.nats.given().first() {
                return Err(usage(format!(
                    "{name} applies to shipping: pass --ship too (a config file's [ship] table takes its own settings)"
                )));
            }
            return Ok(None);
        };
        crate::ship::check_urls(urls).map_err(|e| usage(format!("--ship: {e}")))?;
        Ok(Some(Target {
            urls: urls.clone(),
            flags: self.nats.clone(),
            host: crate::ship::host_name(),
        }))
    }
}

#[derive(Args, Debug)]
pub struct ShipArgs {
    /// Sessions to ship (id, unique prefix or `latest`).
    pub sessions: Vec<String>,
    /// Ship every session.
    #[arg(long, conflicts_with = "sessions")]
    pub all: bool,
    /// The NATS JetStream cluster: nats://HOST:PORT[,HOST:PORT…].
    #[arg(long, value_name = "URLS")]
    pub to: String,
    #[command(flatten)]
    pub nats: NatsFlags,
    #[command(flatten)]
    pub dir: DataDir,
}

pub async fn run(a: ShipArgs) -> Result<()> {
    if a.sessions.is_empty() && !a.all {
        return Err(usage("name the sessions to ship, or pass --all"));
    }
    crate::ship::check_urls(&a.to).map_err(|e| usage(format!("--to: {e}")))?;
    // The cursor is written, so the data dir is opened for change (not while a relay records).
    let store = Store::open_for_change(&a.dir.data_dir).map_err(|e| anyhow!("{e}"))?;
    let ids = if a.all {
        store
            .sessions()?
            .into_iter()
            .map(|m| m.id)
            .collect::<Vec<_>>()
    } else {
        a.sessions
            .iter()
            .map(|q| store.resolve(q).map(|m| m.id))
            .collect::<Result<_, _>>()?
    };
    let conn = crate::ship::connect(&a.to, &a.nats, "gabp-relay ship").await?;
    let target = Target {
        urls: a.to.clone(),
        flags: a.nats.clone(),
        host: crate::ship::host_name(),
    };
    let status = Arc::new(ShipStatus::new(&a.to));
    let mut frames = 0;
    for id in &ids {
        // Each destination (a stream, as created) has its own cursor: shipping to a new one
        // sends everything.
        let cursor = store.ship_cursor(*id, conn.to)?;
        // A turn is bounded in time: go on until the session is caught up.
        let mut after = cursor;
        loop {
            let before = after;
            let (finished, c) =
                shipper::ship_session(&conn, &store, *id, after, &target, &status).await?;
            after = c;
            if finished
                || (after.frames == before.frames && after.catalog_seq == before.catalog_seq)
            {
                break;
            }
        }
        frames += after.frames - cursor.frames;
    }
    outln!(
        "shipped {} session(s) to {}: {frames} new frame(s)",
        ids.len(),
        crate::ship::shown(&a.to)
    );
    Ok(())
}
