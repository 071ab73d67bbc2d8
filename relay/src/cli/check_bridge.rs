//! `gabp-relay check-bridge`: listens as a simulated mod (`gabp-check`'s) for a bridge to
//! connect to, and reports how the bridge's requests deviate from GABP 1.0. Where it listens
//! (and a generated token) goes to stderr, the report to stdout; exit 1 when a check failed.

use std::io::Write;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use gabp_check::bridge::{self, Options};
use gabp_rt::net::Listener;
use gabp_rt::Addr;

use super::{check_token, usage, Json};
use crate::config::parse_timeout;

#[derive(Args, Debug)]
pub struct CheckBridgeArgs {
    /// Where the bridge connects: HOST:PORT on loopback or unix:PATH (port 0 takes a free one;
    /// the address is printed on stderr).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: String,
    /// The token bridges must present [default: generated and printed on stderr].
    #[arg(long, env = "GABP_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Report once this many bridge connections have closed.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
    pub connections: u16,
    /// Report after this long, whatever the bridges are doing.
    #[arg(long, value_parser = parse_timeout, default_value = "60s")]
    pub timeout: Duration,
    /// Channels the welcome advertises (comma separated).
    #[arg(long, default_value = "check/tick,check/notice")]
    pub channels: String,
    #[command(flatten)]
    pub json: Json,
}

/// Serves bridges until they are done (or the timeout); the exit code is 1 when a check failed.
pub async fn run(a: CheckBridgeArgs) -> Result<i32> {
    let addr: Addr = a
        .listen
        .parse()
        .map_err(|e: String| usage(format!("--listen: {e}")))?;
    if !addr.is_local() {
        return Err(usage(
            "--listen: check-bridge listens on loopback or a unix socket only",
        ));
    }
    let (token, generated) = match &a.token {
        Some(t) => (check_token(t)?.to_string(), false),
        None => (gabp_engine::auth::generate_token(), true),
    };
    let listener = Listener::bind(&addr)
        .await
        .with_context(|| format!("cannot listen on {addr}"))?;
    let bound = listener.local_addr()?;
    let mut err = std::io::stderr().lock();
    writeln!(err, "check-bridge listening on {bound}")?;
    if generated {
        writeln!(err, "check-bridge token {token}")?;
    }
    drop(err);
    let opts = Options {
        token,
        connections: usize::from(a.connections),
        timeout: a.timeout,
        channels: a
            .channels
            .split(',')
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .map(String::from)
            .collect(),
        ..Options::default()
    };
    let report = bridge::run(listener, &opts).await;
    if a.json.json {
        super::print_json(&report)?;
    } else {
        write!(std::io::stdout(), "{}", report.text())?;
    }
    Ok(if report.ok { 0 } else { 1 })
}
