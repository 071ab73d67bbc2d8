//! `gabp-relay mark`: records a mark (an episode's start or end, a reset, a note) in the session a
//! running route is recording, from the shell. It is a bridge for one request: hello with the
//! route's token (from its discovery file, or `--address`/`--token` for any identity allowed to
//! mark), `relay/mark`, goodbye; the recording shows it under the name given with `--name`.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;
use gabp_rt::Addr;
use serde_json::{json, Value};

use super::reach::answered;
use super::status::{targets, StatusArgs};
use super::{usage, Json};
use gabp_proto::mark::{MAX_MARK_BYTES, MAX_MARK_LABEL};

#[derive(Args, Debug)]
pub struct MarkArgs {
    /// What the mark says, e.g. `episode-start` (1 to 256 bytes).
    pub label: String,
    /// A little JSON kept with the mark, e.g. '{"episode":3,"seed":7}' (the whole mark at most
    /// 2 KiB).
    #[arg(long, value_name = "JSON")]
    pub data: Option<String>,
    /// The route to mark [default: the only running route].
    #[arg(long)]
    pub route: Option<String>,
    /// Read this discovery file instead of the route's.
    #[arg(long, conflicts_with = "address")]
    pub bridge_file: Option<PathBuf>,
    /// Mark through the relay listening here (HOST:PORT or unix:PATH) instead; needs --token.
    #[arg(long, requires = "token")]
    pub address: Option<String>,
    /// The bridge token for --address (any identity allowed to mark).
    #[arg(long, env = "GABP_RELAY_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// The name the recording shows for who marked (the bridge's label).
    #[arg(long, default_value = "gabp-relay-mark")]
    pub name: String,
    /// How long to wait for the relay (and for the mod, if it is connecting).
    #[arg(long, value_parser = crate::config::parse_timeout, default_value = "15s")]
    pub wait: Duration,
    #[command(flatten)]
    pub json: Json,
}

pub async fn run(a: MarkArgs) -> Result<()> {
    if a.label.is_empty() || a.label.len() > MAX_MARK_LABEL {
        return Err(usage(format!(
            "the label is {} bytes; a label is 1 to {MAX_MARK_LABEL} bytes",
            a.label.len()
        )));
    }
    let data: Option<Value> = match &a.data {
        None => None,
        Some(text) => Some(
            serde_json::from_str(text).map_err(|e| usage(format!("--data is not JSON: {e}")))?,
        ),
    };
    let mut params = json!({ "label": a.label });
    if let Some(d) = &data {
        params["data"] = d.clone();
    }
    // The relay refuses a mark over its bound; say so before connecting, with the same number.
    let size = params.to_string().len() + 96;
    if size > MAX_MARK_BYTES {
        return Err(usage(format!(
            "this mark is about {size} bytes; a mark (label and data) may take at most {MAX_MARK_BYTES}"
        )));
    }
    let found = targets(&StatusArgs {
        route: a.route.clone(),
        bridge_file: a.bridge_file.clone(),
        address: a.address.clone(),
        token: a.token.clone(),
        wait: a.wait,
        json: Json { json: false },
    })?;
    let target = match found.as_slice() {
        [one] => one,
        many => {
            let routes: Vec<&str> = many.iter().map(|t| t.route.as_str()).collect();
            return Err(usage(format!(
                "{} routes are running ({}): say which with --route",
                many.len(),
                routes.join(", ")
            )));
        }
    };
    let addr: Addr = target.addr.parse().map_err(anyhow::Error::msg)?;
    let mut c = super::reach::connect(&addr, a.wait).await?;
    let hello = json!({
        "token": target.token,
        "bridgeVersion": format!("gabp-relay-mark/{}", env!("CARGO_PKG_VERSION")),
        "platform": std::env::consts::OS,
        "launchId": uuid::Uuid::new_v4().to_string(),
        "clientInfo": {"name": a.name},
    });
    let welcome = c
        .request("session/hello", hello)
        .await
        .and_then(answered)
        .context("the relay did not welcome the mark")?;
    let answer = c
        .request("relay/mark", params)
        .await
        .and_then(answered)
        .context("the mark was refused")?;
    let _ = c.close().await;
    let session = welcome["capabilities"]["extensions"]["relay"]["sessionId"].clone();
    if answer["marked"] != true {
        bail!(
            "nothing was recorded: {}",
            answer["why"].as_str().unwrap_or("the relay kept no mark")
        );
    }
    if a.json.json {
        super::print_json(&json!({
            "route": target.route,
            "session": session,
            "label": a.label,
            "data": data,
            "tNs": answer["tNs"],
        }))?;
    } else {
        outln!(
            "marked {:?} in session {} of route {}",
            a.label,
            session.as_str().unwrap_or("-"),
            gabp_rt::display::name(&target.route)
        );
    }
    Ok(())
}
