//! `gabp-relay ship`: send recorded sessions to NATS JetStream (backfill), and the `serve`
//! flags that ship while serving. Messages carry the same ids as the relay's own shipping,
//! and each session resumes from its cursor, so shipping twice changes nothing.

use std::sync::Arc;

use std::io::Write;

use anyhow::{anyhow, Result};
use clap::Args;
use gabp_storage::Store;

use super::{usage, DataDir};
use gabp_ship::shipper::{self, ShipStatus, Target};
use gabp_ship::{NatsFlags, Signing};
use std::path::PathBuf;

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
    #[command(flatten)]
    pub sign: SignFlags,
}

/// How `serve` and `ship` sign what they ship.
#[derive(Args, Debug, Clone, Default)]
pub struct SignFlags {
    /// The fleet key file every shipped message is signed with (collectors refuse what it did
    /// not sign); `gabp-relay fleet-key new -o FILE` makes one.
    #[arg(long, value_name = "FILE")]
    pub fleet_key: Option<PathBuf>,
    /// Ship unsigned messages: collectors cannot tell them from forged ones.
    #[arg(long, conflicts_with = "fleet_key")]
    pub insecure_unsigned: bool,
}

impl SignFlags {
    /// The first flag given, by name.
    fn given(&self) -> Option<&'static str> {
        if self.fleet_key.is_some() {
            Some("--fleet-key")
        } else if self.insecure_unsigned {
            Some("--insecure-unsigned")
        } else {
            None
        }
    }

    /// The signing these flags describe (the key file read and checked: a usage error).
    fn signing(&self) -> Result<Signing> {
        Signing::new(self.fleet_key.as_deref(), self.insecure_unsigned).map_err(usage)
    }
}

impl ServeShip {
    /// The shipping target, if any (a usage error for a malformed address). Whether it may
    /// ship unsigned is checked apart, by [`ServeShip::check_signing`], once the rest of the
    /// configuration is known.
    pub fn target(&self) -> Result<Option<Target>> {
        let Some(urls) = &self.ship else {
            if let Some(name) = self.nats.given().first() {
                return Err(usage(format!(
                    "{name} applies to shipping: pass --ship too (a config file's [ship] table takes its own settings)"
                )));
            }
            return Ok(None);
        };
        gabp_ship::check_urls(urls).map_err(|e| usage(format!("--ship: {e}")))?;
        self.nats.check().map_err(usage)?;
        Ok(Some(Target {
            urls: urls.clone(),
            flags: self.nats.clone(),
            host: gabp_ship::host_name(),
            signing: self.sign.signing()?,
        }))
    }

    /// Applies `--fleet-key`/`--insecure-unsigned` to a config file's `[ship]` table when
    /// `--ship` is not given (the flags override the table's), and checks that whatever ships
    /// is signed or unsigned on purpose.
    pub fn check_signing(&self, ship: Option<&mut Target>) -> Result<()> {
        match ship {
            Some(t) => {
                if self.ship.is_none() && self.sign.given().is_some() {
                    t.signing = self.sign.signing()?;
                }
                t.signing.check().map_err(usage)
            }
            None => match self.sign.given() {
                Some(name) => Err(usage(format!(
                    "{name} applies to shipping: pass --ship too (or a [ship] table in the config file)"
                ))),
                None => Ok(()),
            },
        }
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
    pub sign: SignFlags,
    #[command(flatten)]
    pub dir: DataDir,
}

pub async fn run(a: ShipArgs) -> Result<()> {
    if a.sessions.is_empty() && !a.all {
        return Err(usage("name the sessions to ship, or pass --all"));
    }
    gabp_ship::check_urls(&a.to).map_err(|e| usage(format!("--to: {e}")))?;
    a.nats.check().map_err(usage)?;
    let signing = a.sign.signing()?;
    signing.check().map_err(usage)?;
    // The cursor is written, so the data dir is opened for change (not while a relay records).
    let store = Store::open_for_change(&a.dir.data_dir).map_err(|e| anyhow!("{e}"))?;
    let metas = if a.all {
        store.sessions()?
    } else {
        a.sessions
            .iter()
            .map(|q| store.resolve(q))
            .collect::<Result<Vec<_>, _>>()?
    };
    let conn = gabp_ship::connect(&a.to, &a.nats, "gabp-relay ship").await?;
    let target = Target {
        urls: a.to.clone(),
        flags: a.nats.clone(),
        host: gabp_ship::host_name(),
        signing,
    };
    let status = Arc::new(ShipStatus::new(&a.to));
    let mut frames = 0;
    let mut cursors = Vec::with_capacity(metas.len());
    for m in &metas {
        // Each destination (a stream, as created) has its own cursor: shipping to a new one
        // sends everything.
        cursors.push(store.ship_cursor(m.id, conn.to)?);
    }
    let to_ship = metas
        .iter()
        .zip(&cursors)
        .map(|(m, c)| m.frames.saturating_sub(c.frames))
        .sum();
    let progress = super::progress::Progress::frames(to_ship, false);
    for (m, &cursor) in metas.iter().zip(&cursors) {
        let id = &m.id;
        progress.reading(&id.to_string());
        // A turn is bounded in time: go on until the session is caught up.
        let mut after = cursor;
        loop {
            let before = after;
            let (finished, c) =
                shipper::ship_session(&conn, &store, *id, after, &target, &status).await?;
            after = c;
            progress.at(frames + (after.frames - cursor.frames));
            if finished
                || (after.frames == before.frames && after.catalog_seq == before.catalog_seq)
            {
                break;
            }
        }
        frames += after.frames - cursor.frames;
    }
    progress.done();
    outln!(
        "shipped {} session(s) to {}: {frames} new frame(s)",
        metas.len(),
        gabp_ship::shown(&a.to)
    );
    Ok(())
}
