//! `gabp-relay serve`: relay bridges to one or many mods and record every session.
//!
//! The flags here only say what the operator typed: [`PolicyFlags`] and [`GlobalFlags`] turn
//! into config-file keys, and `config::file` layers them over the file and the defaults.

use std::path::PathBuf;
use std::sync::Arc;

use crate::config::file::Layer;
use crate::config::{limits, units, FileConfig};
use anyhow::{bail, Result};
use clap::Args;
use gabp_engine::{auth, discovery, Relay, RelayConfig};
use serde::Serialize;

use super::{check_token, usage, Signal, Signals};

/// Route policies, from flags: each becomes the config key of the same name, over every route.
#[derive(Args, Debug, Clone, Default, Serialize)]
pub struct PolicyFlags {
    /// Slow-bridge policy [default: drop-oldest].
    #[arg(long, value_parser = ["drop-oldest", "disconnect", "block"])]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub on_slow: Option<String>,
    /// How long a forwarded request may wait for the mod, 1ms to 24h [default: 30s].
    #[arg(long, value_parser = timeout)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_timeout: Option<String>,
    /// Per-bridge outbox bound in events, 1 to 1048576 [default: 16384].
    #[arg(long, value_parser = outbox_frames)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outbox_frames: Option<usize>,
    /// Per-bridge outbox bound in bytes, e.g. 16MiB; 1KiB to 1GiB [default: 16MiB].
    #[arg(long, value_parser = outbox_bytes)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outbox_bytes: Option<String>,
    /// Recent events kept in memory for bridges that resume, 0 (off) to 1048576 [default: 16384].
    #[arg(long, value_parser = resume_window_frames)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resume_window_frames: Option<usize>,
    /// Largest accepted frame body, e.g. 1MiB; 1KiB to 64MiB [default: 1MiB].
    #[arg(long, value_parser = max_body)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_body: Option<String>,
    /// Bridges connected at once, 1 to 65536 [default: 256].
    #[arg(long, value_parser = max_bridges)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_bridges: Option<usize>,
    /// How long a connection may take to say hello, or a frame to arrive whole [default: 10s].
    #[arg(long, value_parser = timeout)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub frame_timeout: Option<String>,
    /// How long a bridge's socket may accept nothing before the bridge is cut [default: 10s].
    #[arg(long, value_parser = duration)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub write_deadline: Option<String>,
    /// Subscribe upstream only to what bridges ask for (recordings then miss other channels).
    #[arg(long)]
    #[serde(
        rename = "subscribe_all",
        skip_serializing_if = "unset",
        serialize_with = "negated"
    )]
    pub no_subscribe_all: bool,
    /// Write requests to the mod in ASCII, non-ASCII as \uXXXX escapes (the same JSON): for a
    /// mod that counts Content-Length in characters (`check-mod` says when).
    #[arg(long)]
    #[serde(skip_serializing_if = "unset")]
    pub ascii_requests: bool,
    /// Do not record.
    #[arg(long)]
    #[serde(
        rename = "record",
        skip_serializing_if = "unset",
        serialize_with = "negated"
    )]
    pub no_record: bool,
    /// Label every session recorded with KEY=VALUE (repeatable; over the route's `tags`).
    #[arg(long = "tag", value_name = "KEY=VALUE", value_parser = tag)]
    #[serde(
        rename = "tags",
        skip_serializing_if = "Vec::is_empty",
        serialize_with = "tag_table"
    )]
    pub tag: Vec<String>,
}

/// Relay-wide settings, from flags: each becomes the top-level config key of the same name.
#[derive(Args, Debug, Clone, Default, Serialize)]
pub struct GlobalFlags {
    /// Where recordings go [default: gabp-data].
    #[arg(long, env = "GABP_RELAY_DATA_DIR")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data_dir: Option<PathBuf>,
    /// WAL sync policy [default: batch].
    #[arg(long, value_parser = ["none", "batch"])]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub durability: Option<String>,
    /// Frame compression [default: lz4].
    #[arg(long, value_parser = ["none", "lz4", "zstd"])]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compression: Option<String>,
    /// Compress the write-ahead log with zstd (smaller WAL, slower synced writes; see BENCHMARKS.md).
    #[arg(long)]
    #[serde(skip_serializing_if = "unset")]
    pub wal_compression: bool,
    /// Bytes queued for the recorder before the mod is held; also the most a crash can leave
    /// out of a recording while the recorder lags [default: 256MiB].
    #[arg(long, value_parser = record_queue)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub record_queue: Option<String>,
    /// Record into --data-dir even if it is a symlink (refused by default).
    #[arg(long)]
    #[serde(skip_serializing_if = "unset")]
    pub allow_symlinked_data_dir: bool,
    /// What a failed recording write does [default: stall].
    #[arg(long, value_parser = ["stall", "continue"])]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub on_record_error: Option<String>,
    /// Keep recordings by age and/or size (at most 1PiB), e.g. 7d, 10GiB or 7d,10GiB [default: keep all].
    #[arg(long, value_parser = retention)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retain: Option<String>,
    /// Serve Prometheus metrics at HOST:PORT [default: off].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metrics: Option<std::net::SocketAddr>,
    /// Allow listening on a non-loopback address.
    #[arg(long)]
    #[serde(skip_serializing_if = "unset")]
    pub allow_remote: bool,
    /// Bound on the whole shutdown, 1ms to 24h [default: 10s].
    #[arg(long, value_parser = timeout)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shutdown_timeout: Option<String>,
}

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// The mod: HOST:PORT, unix:PATH, or `stdio` with the mod's command after `--`.
    #[arg(long)]
    pub upstream: Option<String>,
    /// Where bridges connect: HOST:PORT or unix:PATH.
    #[arg(long)]
    pub listen: Option<String>,
    /// Serve MCP's Streamable HTTP transport at http://ADDR/mcp for the first route (bearer token).
    #[arg(long, value_name = "ADDR")]
    pub mcp_listen: Option<std::net::SocketAddr>,
    #[command(flatten)]
    pub mcp_offer: super::mcp::OfferArgs,
    /// Token bridges must present; shorter than 16 characters gets a warning [default: generated and printed].
    #[arg(long, env = "GABP_RELAY_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Token the relay presents to the mod (the mod's own) [default: none].
    #[arg(long, env = "GABP_UPSTREAM_TOKEN", hide_env_values = true)]
    pub upstream_token: Option<String>,
    /// Route name used in recordings, metrics and the discovery file (1 to 64 bytes, no
    /// control characters, no whitespace at either end).
    #[arg(long, default_value = "default")]
    pub route_name: String,
    /// A TOML config with one or more routes (flags override its settings).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Write the bridge discovery file here (`{route}` is replaced by the route name)
    /// [default: $XDG_CONFIG_HOME/gabp-relay/bridge-{route}.json].
    #[arg(long)]
    pub bridge_file: Option<PathBuf>,
    /// Do not write a bridge discovery file.
    #[arg(long)]
    pub no_bridge_file: bool,
    #[command(flatten)]
    pub globals: GlobalFlags,
    #[command(flatten)]
    pub policy: PolicyFlags,
    #[command(flatten)]
    pub ship: super::ship::ServeShip,
    /// With `--upstream stdio`: the mod's command and arguments.
    #[arg(last = true)]
    pub command: Vec<String>,
}

fn unset(b: &bool) -> bool {
    !*b
}

fn negated<S: serde::Serializer>(b: &bool, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_bool(!*b)
}

fn timeout(s: &str) -> Result<String, String> {
    units::parse_timeout(s).map(|_| s.to_string())
}

fn duration(s: &str) -> Result<String, String> {
    units::parse_duration(s).map(|_| s.to_string())
}

fn record_queue(s: &str) -> Result<String, String> {
    units::parse_size_in(s, limits::RECORD_QUEUE_MIN, limits::RECORD_QUEUE).map(|_| s.to_string())
}

fn outbox_bytes(s: &str) -> Result<String, String> {
    units::parse_size_in(s, limits::MIN_SIZE, limits::OUTBOX_BYTES).map(|_| s.to_string())
}

pub(super) fn max_body(s: &str) -> Result<String, String> {
    units::parse_size_in(s, limits::MIN_SIZE, limits::MAX_BODY).map(|_| s.to_string())
}

fn outbox_frames(s: &str) -> Result<usize, String> {
    units::parse_count_in(s, 1, limits::OUTBOX_FRAMES)
}

fn resume_window_frames(s: &str) -> Result<usize, String> {
    units::parse_count_in(s, 0, limits::OUTBOX_FRAMES)
}

fn max_bridges(s: &str) -> Result<usize, String> {
    units::parse_count_in(s, 1, limits::MAX_BRIDGES)
}

/// A token given on the command line: well-formed, said without its value. A short bridge
/// token gets a warning (the mod's token is the mod's choice).
fn flag_token<'t>(flag: &str, t: &'t str) -> Result<&'t str> {
    check_token(t).map_err(|e| usage(e.to_string().replace("--token", flag)))?;
    if flag == "--token" {
        auth::warn_if_short(t, flag);
    }
    Ok(t)
}

fn tag(s: &str) -> Result<String, String> {
    gabp_storage::parse_tag(s).map(|_| s.to_string())
}

/// `--tag k=v …` as the config's `tags = { k = "v" }` table.
fn tag_table<S: serde::Serializer>(tags: &[String], s: S) -> Result<S::Ok, S::Error> {
    s.collect_map(tags.iter().filter_map(|t| t.split_once('=')))
}

fn retention(s: &str) -> Result<String, String> {
    s.parse::<crate::config::Retention>().map(|_| s.to_string())
}

/// Flags as config keys.
fn table(v: &impl Serialize) -> toml::Table {
    toml::Table::try_from(v).unwrap_or_default()
}

impl ServeArgs {
    /// The route given by flags, as a `[[route]]` table, if any.
    fn route(&self) -> Result<Option<toml::Table>> {
        let (upstream, listen) = match (&self.upstream, &self.listen) {
            (Some(u), Some(l)) => (u, l),
            (None, None) => return Ok(None),
            _ => return Err(usage("--upstream and --listen go together")),
        };
        crate::config::check_route_name(&self.route_name).map_err(|m| {
            let shown = crate::config::shown_route_name(&self.route_name);
            usage(format!("--route-name {shown:?}: {m}"))
        })?;
        let mut t = toml::Table::new();
        t.insert("name".into(), self.route_name.clone().into());
        if upstream == "stdio" {
            if self.command.is_empty() {
                return Err(usage("--upstream stdio needs the mod's command after --"));
            }
            t.insert("upstream_command".into(), self.command.clone().into());
        } else {
            upstream
                .parse::<gabp_rt::Addr>()
                .map_err(|e| usage(format!("--upstream: {e}")))?;
            t.insert("upstream".into(), upstream.clone().into());
        }
        listen
            .parse::<gabp_rt::Addr>()
            .map_err(|e| usage(format!("--listen: {e}")))?;
        t.insert("listen".into(), listen.clone().into());
        if let Some(tok) = &self.token {
            t.insert("token".into(), flag_token("--token", tok)?.into());
        }
        if let Some(tok) = self.upstream_token.as_ref().filter(|t| !t.is_empty()) {
            t.insert(
                "upstream_token".into(),
                flag_token("--upstream-token", tok)?.into(),
            );
        }
        Ok(Some(t))
    }

    /// Flags over the config file over the defaults.
    pub fn relay_config(&self) -> Result<RelayConfig> {
        if !self.command.is_empty() && self.upstream.as_deref() != Some("stdio") {
            return Err(usage(
                "a command after -- is the stdio mod's: it needs --upstream stdio",
            ));
        }
        let mut globals = table(&self.globals);
        if let Some(p) = &self.bridge_file {
            globals.insert("bridge_file".into(), p.display().to_string().into());
        }
        let layer = Layer {
            globals,
            policy: table(&self.policy),
            route: self.route()?,
        };
        let text = match &self.config {
            Some(p) => Some((FileConfig::read(p)?, p.display().to_string())),
            None => None,
        };
        let file = text.as_ref().map_or("command line", |(_, f)| f.as_str());
        let merged =
            FileConfig::layered(text.as_ref().map(|(t, f)| (t.as_str(), f.as_str())), layer)?;
        let mut cfg = merged.relay_config(file)?;
        let mut ship = match self.ship.target()? {
            Some(t) => Some(t),
            None => merged.ship_target(file)?,
        };
        if self.ship.retain_unshipped && ship.is_none() {
            return Err(usage(
                "--retain-unshipped applies to shipping: pass --ship too (or a [ship] table in the config file)",
            ));
        }
        cfg.retain_unshipped |= self.ship.retain_unshipped;
        if cfg.routes.is_empty() {
            return Err(usage(
                "nothing to serve: give --upstream and --listen, or --config with [[route]] tables",
            ));
        }
        if ship.is_some() && !cfg.records() {
            return Err(usage(
                "shipping sends the recordings, and recording is off: drop --no-record (or record = false in the config), or --ship",
            ));
        }
        self.ship.check_signing(ship.as_mut())?;
        cfg.ship = ship.map(|t| Arc::new(t) as Arc<dyn gabp_engine::shipping::Shipping>);
        if let Some(r) = cfg
            .routes
            .iter()
            .find(|r| !cfg.allow_remote && !r.listen.is_local())
        {
            return Err(usage(format!(
                "refusing to listen on {}: not a loopback address (pass --allow-remote to allow it)",
                r.listen
            )));
        }
        Ok(cfg)
    }
}

pub async fn run(a: ServeArgs) -> Result<()> {
    let mut signals = Signals::install()?;
    let cfg = a.relay_config()?;
    if a.mcp_listen.is_some_and(|m| !m.ip().is_loopback()) && !cfg.allow_remote {
        return Err(usage(
            "--mcp-listen must be a loopback address unless --allow-remote is given",
        ));
    }
    if a.mcp_offer.given() && a.mcp_listen.is_none() {
        return Err(usage(
            "--mcp-tools and --mcp-strip-output-schema need --mcp-listen",
        ));
    }
    let offer = a.mcp_offer.offer()?;
    let paths = if a.no_bridge_file {
        Vec::new()
    } else {
        discovery::paths(&cfg.routes, cfg.bridge_file.as_ref())
    };
    discovery::check_free(&cfg.routes, &paths).map_err(anyhow::Error::msg)?;
    let relay = Relay::start_with(
        cfg.clone(),
        std::sync::Arc::new(gabp_engine::transport::AnyConnector::default()),
    )
    .await?;
    let bridge_files = discovery::write_all(&relay, &paths);
    // What the operator needs to connect, on stdout. The recording line comes last.
    let mut text = String::new();
    for (i, r) in relay.routes.iter().enumerate() {
        text += &format!(
            "route {} listening on {} -> mod {}\n",
            r.cfg().name,
            relay.addrs[i],
            r.cfg().upstream
        );
        if r.cfg().token_generated {
            text += &format!("route {} token {}\n", r.cfg().name, r.cfg().token);
        }
    }
    if let Some(m) = relay.metrics_addr {
        text += &format!("metrics on http://{m}/metrics\n");
    }
    if let Some(addr) = a.mcp_listen {
        match gabp_mcp::http::serve_route(
            &relay,
            addr,
            cfg.allow_remote,
            cfg.records().then(|| cfg.data_dir.clone()),
            offer,
        )
        .await
        {
            Ok(at) => text += &format!("mcp on http://{at}{}\n", gabp_mcp::http::PATH),
            Err(e) => {
                bridge_files.iter().for_each(|p| discovery::remove_own(p));
                return Err(e);
            }
        }
    }
    for p in &bridge_files {
        text += &format!("bridge file {}\n", p.display());
    }
    if let Some(t) = &cfg.ship {
        text += &format!("shipping to {}\n", t.shown_destination());
    }
    text += &if cfg.records() {
        let durability = match cfg.durability {
            gabp_storage::Durability::None => "none",
            gabp_storage::Durability::Batch => "batch",
        };
        format!(
            "recording to {} (durability {durability})\n",
            cfg.data_dir.display()
        )
    } else {
        "recording off\n".to_string()
    };
    super::print_best_effort(&text);
    let sig = loop {
        match signals.next().await {
            Signal::Shutdown(name) => break name,
            Signal::Reload => reload(&a, &cfg, &relay).await,
        }
    };
    tracing::info!("{sig} received: shutting down");
    // The discovery files go first: bridges stop finding a relay that is leaving, and they are
    // gone even if the shutdown overruns its bound.
    for p in &bridge_files {
        discovery::remove_own(p);
    }
    let report = relay.shutdown_report().await;
    let bound = humantime::format_duration(cfg.shutdown_timeout);
    if report.unrecorded > 0 {
        bail!(
            "{} frame(s) were not recorded: the disk still failed at the shutdown bound ({bound}); the recording holds a clean prefix up to its last committed frame",
            report.unrecorded,
        );
    }
    if !report.clean {
        bail!("shutdown did not finish within {bound}");
    }
    Ok(())
}

/// Why a relay started without `--config` reloads nothing.
const NO_CONFIG_TO_RELOAD: &str = "the relay was started without --config, so there is no file to re-read; its token and settings came from flags and change only by a restart";

/// SIGHUP: re-reads the config (file and flags) and swaps every running route's identities
/// and leased tools (`bridge::reload`: unchanged identities stay connected, revoked or
/// changed ones are disconnected with a notice). Everything else needs a restart, and the log
/// says which changed settings are so ignored. A config that no longer loads changes nothing.
async fn reload(a: &ServeArgs, running: &RelayConfig, relay: &gabp_engine::Relay) {
    tracing::info!("SIGHUP received: reloading bridge identities and tokens");
    if a.config.is_none() {
        // Identities and tokens come from flags, which a running process cannot re-read: a
        // reload that said "reloaded" here would tell the operator a change took effect.
        let why = NO_CONFIG_TO_RELOAD.to_string();
        tracing::warn!("reload: {why}");
        for r in &relay.routes {
            r.access().note_reload(0, 0, Some(why.clone()));
        }
        return;
    }
    let new = match a.relay_config() {
        Ok(c) => c,
        Err(e) => {
            let why = super::one_line(&e);
            tracing::error!("reload failed, nothing changed: {why}");
            for r in &relay.routes {
                r.access().note_reload(0, 0, Some(why.clone()));
            }
            return;
        }
    };
    for route in &relay.routes {
        let Some(rc) = new.routes.iter().find(|r| r.name == route.cfg().name) else {
            tracing::warn!(route = %route.cfg().name, "reload: this route is no longer in the configuration; it keeps serving as it is until a restart");
            route.access().note_reload(
                0,
                0,
                Some("the route is no longer in the configuration".into()),
            );
            continue;
        };
        let done = gabp_engine::bridge::reload(route, rc).await;
        let table = route.access().table();
        let names: Vec<&str> = table.names().collect();
        tracing::info!(
            route = %route.cfg().name,
            kept = done.kept,
            disconnected = done.revoked,
            "reload: identities now {:?} plus the route token",
            names
        );
        route.access().note_reload(done.kept, done.revoked, None);
        let ignored = ignored_route_changes(route.cfg(), rc);
        if !ignored.is_empty() {
            tracing::warn!(route = %route.cfg().name, "reload: changed settings ignored until a restart: {}", ignored.join(", "));
        }
    }
    for r in new
        .routes
        .iter()
        .filter(|r| !relay.routes.iter().any(|x| x.cfg().name == r.name))
    {
        tracing::warn!(route = %r.name, "reload: new routes are started only by a restart; ignored");
    }
    let ignored = ignored_global_changes(running, &new);
    if !ignored.is_empty() {
        tracing::warn!(
            "reload: changed settings ignored until a restart: {}",
            ignored.join(", ")
        );
    }
}

/// The route settings that differ between `old` and `new` but that a reload does not apply.
fn ignored_route_changes(
    old: &gabp_engine::RouteConfig,
    new: &gabp_engine::RouteConfig,
) -> Vec<&'static str> {
    restart_needed(old.reload_table(new))
}

/// The relay-wide settings that differ between `old` and `new` (none is reloaded).
fn ignored_global_changes(old: &RelayConfig, new: &RelayConfig) -> Vec<&'static str> {
    restart_needed(old.reload_table(new))
}

fn restart_needed(table: Vec<gabp_engine::config::ReloadedSetting>) -> Vec<&'static str> {
    table
        .into_iter()
        .filter(|s| s.changed && s.on_reload == gabp_engine::config::OnReload::RestartNeeded)
        .map(|s| s.name)
        .collect()
}
