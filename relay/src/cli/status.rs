//! `gabp-relay status [--route R]`: what running relays are doing, asked as a bridge.
//!
//! Relays are found through their discovery files (address and token), or given by
//! `--address` and `--token`. Each is sent the relay's own `relay/status` request; the answer
//! is shown as a table (routes, mod, session, bridges with their queues and drops, recorder
//! lag) or passed through under `--json`. The status connection itself is left out.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Result};
use clap::Args;
use gabp_engine::discovery::{self, Holder};
use gabp_rt::display;
use gabp_rt::Addr;
use serde_json::{json, Value};

use super::{usage, Json};

#[derive(Args, Debug)]
pub struct StatusArgs {
    /// Only this route [default: every route with a discovery file].
    #[arg(long)]
    pub route: Option<String>,
    /// Read this discovery file instead of the default one.
    #[arg(long, conflicts_with = "address")]
    pub bridge_file: Option<PathBuf>,
    /// Ask the relay listening here (HOST:PORT or unix:PATH) instead; needs --token.
    #[arg(long, requires = "token")]
    pub address: Option<String>,
    /// The bridge token for --address.
    #[arg(long, env = "GABP_RELAY_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// How long to wait for each relay's answer.
    #[arg(long, value_parser = crate::config::parse_timeout, default_value = "15s")]
    pub wait: Duration,
    #[command(flatten)]
    pub json: Json,
}

/// One relay to ask.
pub(super) struct Target {
    pub(super) route: String,
    pub(super) addr: String,
    pub(super) token: String,
    pub(super) pid: Option<u32>,
}

/// The discovery files to read: the one given, the route's, or every `bridge-*.json`.
fn discovery_files(a: &StatusArgs) -> Result<Vec<PathBuf>> {
    if let Some(p) = &a.bridge_file {
        return Ok(vec![p.clone()]);
    }
    let Some(one) = discovery::default_path(a.route.as_deref().unwrap_or("default")) else {
        bail!("no discovery dir: neither XDG_CONFIG_HOME nor HOME is set (pass --address and --token)");
    };
    if a.route.is_some() {
        return Ok(vec![one]);
    }
    let dir = one.parent().map(PathBuf::from).unwrap_or_default();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| {
                    p.file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.starts_with("bridge-") && n.ends_with(".json"))
                })
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    if files.is_empty() {
        bail!(
            "no running relay found: no discovery file in {} (pass --address and --token to ask one directly)",
            dir.display()
        );
    }
    Ok(files)
}

pub(super) fn targets(a: &StatusArgs) -> Result<Vec<Target>> {
    if let Some(addr) = &a.address {
        addr.parse::<Addr>()
            .map_err(|e| usage(format!("--address: {e}")))?;
        let token = a.token.clone().unwrap_or_default();
        super::check_token(&token)?;
        return Ok(vec![Target {
            route: a.route.clone().unwrap_or_else(|| "-".into()),
            addr: addr.clone(),
            token,
            pid: None,
        }]);
    }
    let mut out = Vec::new();
    let mut stale = Vec::new();
    for path in discovery_files(a)? {
        let Ok(bytes) = std::fs::read(&path) else {
            bail!("no running relay found: cannot read {}", path.display());
        };
        let v: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        let (Some(addr), Some(token)) = (v["transport"]["address"].as_str(), v["token"].as_str())
        else {
            bail!("{} is not a relay's discovery file", path.display());
        };
        match discovery::holder(&path) {
            Holder::Stale(pid) => {
                stale.push((path, pid));
                continue;
            }
            Holder::Live(_) | Holder::Free => {}
        }
        out.push(Target {
            route: v["metadata"]["route"].as_str().unwrap_or("-").to_string(),
            addr: addr.to_string(),
            token: token.to_string(),
            pid: discovery::recorded_pid(&path),
        });
    }
    // One line either way: the error names the stale files itself; beside live relays each
    // stale file is a warning.
    if out.is_empty() {
        let files: Vec<String> = stale
            .iter()
            .map(|(p, pid)| format!("{} (pid {pid})", p.display()))
            .collect();
        bail!(
            "no running relay found: {} left by a relay that is gone",
            files.join(", ")
        );
    }
    for (path, pid) in stale {
        tracing::warn!(path = %path.display(), pid, "skipping a discovery file left by a relay that is no longer running");
    }
    Ok(out)
}

/// The bridges a status lists, with `+N` for those an answer cut to fit `--max-body` left out.
fn bridge_count(st: &Value) -> String {
    let shown = st["bridges"].as_array().map_or(0, Vec::len);
    match st["bridgesOmitted"].as_u64() {
        Some(omitted) if omitted > 0 => format!("{shown}+{omitted}"),
        _ => shown.to_string(),
    }
}

/// Asks one relay for its status; `launch` identifies this connection so it can be left out.
pub(super) async fn ask(t: &Target, wait: Duration, launch: &str) -> Result<Value> {
    let addr: Addr = t.addr.parse().map_err(anyhow::Error::msg)?;
    let mut c = super::reach::connect(&addr, wait).await?;
    // `withoutMod`: welcomed at once even while the mod is down, which status reports.
    let hello = json!({"token": t.token, "bridgeVersion": format!("gabp-relay-status/{}", env!("CARGO_PKG_VERSION")), "platform": std::env::consts::OS, "launchId": launch, "relay": {"withoutMod": true}});
    c.call("session/hello", hello).await?;
    let status = c.call("relay/status", json!({})).await?;
    let _ = c.close().await;
    Ok(status)
}

pub async fn run(a: StatusArgs) -> Result<()> {
    let launch = uuid::Uuid::new_v4().to_string();
    let mut docs = Vec::new();
    let mut failed = 0;
    for t in targets(&a)? {
        let mut doc = json!({"route": t.route, "address": t.addr, "pid": t.pid});
        match ask(&t, a.wait, &launch).await {
            Ok(mut s) => {
                let (listed, kept) = match s["bridges"].as_array_mut() {
                    Some(b) => {
                        let listed = b.len();
                        b.retain(|b| b["launchId"] != launch.as_str());
                        (listed, b.len())
                    }
                    None => (0, 0),
                };
                // An answer cut to fit --max-body may have left this connection out instead:
                // it is then among the omitted.
                let omitted = s["bridgesOmitted"].as_u64().unwrap_or(0);
                if kept == listed && omitted > 0 {
                    s["bridgesOmitted"] = json!(omitted - 1);
                }
                doc["modConnected"] = json!(!s["session"].is_null());
                doc["status"] = s;
            }
            Err(e) => {
                failed += 1;
                doc["modConnected"] = Value::Null;
                doc["error"] = json!(super::one_line(&e));
            }
        }
        docs.push(doc);
    }
    if a.json.json {
        super::print_json(&json!({ "relays": docs }))?;
    } else {
        render(&docs)?;
    }
    if failed == docs.len() {
        bail!("no relay answered");
    }
    Ok(())
}

fn render(docs: &[Value]) -> Result<()> {
    let s = |v: &Value| v.as_str().map_or("-".to_string(), display::name);
    let n = |v: &Value| v.as_u64().map_or("-".to_string(), |n| n.to_string());
    outln!(
        "{:<16} {:<22} {:<12} {:<36} {:>7} {:>13} {:>8}  RECORDER",
        "ROUTE",
        "LISTEN",
        "MOD",
        "SESSION",
        "BRIDGES",
        "LAG (batches)",
        "PENDING"
    );
    for d in docs {
        let st = &d["status"];
        if let Some(err) = d["error"].as_str() {
            outln!(
                "{:<16} {:<22} error: {}",
                s(&d["route"]),
                s(&d["address"]),
                display::text(err, 200)
            );
            continue;
        }
        let recorder = match (
            st["recording"].as_bool(),
            st["recorderHealth"]["ok"].as_bool(),
        ) {
            (Some(false), _) => "off",
            (_, Some(false)) => "FAILING",
            _ => "ok",
        };
        outln!(
            "{:<16} {:<22} {:<12} {:<36} {:>7} {:>13} {:>8}  {}",
            s(&st["route"]),
            s(&d["address"]),
            if d["modConnected"] == true {
                "connected"
            } else {
                "disconnected"
            },
            s(&st["session"]["id"]),
            bridge_count(st),
            n(&st["recorderLag"]),
            n(&st["pendingRequests"]),
            recorder
        );
    }
    let bridges: Vec<(&Value, &Value)> = docs
        .iter()
        .flat_map(|d| {
            d["status"]["bridges"]
                .as_array()
                .into_iter()
                .flatten()
                .map(move |b| (&d["status"]["route"], b))
        })
        .collect();
    if bridges.is_empty() {
        return Ok(());
    }
    outln!(
        "\n{:<16} {:>5} {:<16} {:<20} {:<8} {:<24} {:<22} {:>5} {:>14} {:>12} {:>9} {:>10} {:>7}",
        "ROUTE",
        "CONN",
        "NAME",
        "LABEL",
        "ROLE",
        "BRIDGE",
        "PEER",
        "SUBS",
        "QUEUE (events)",
        "QUEUE SIZE",
        "DROPPED",
        "DELIVERED",
        "REFUSED"
    );
    for (route, b) in bridges {
        outln!(
            "{:<16} {:>5} {:<16} {:<20} {:<8} {:<24} {:<22} {:>5} {:>14} {:>12} {:>9} {:>10} {:>7}",
            s(route),
            n(&b["conn"]),
            // A welcomed bridge without a name holds the route's token: the implicit identity.
            match (&b["name"], b["role"].is_string()) {
                (Value::Null, true) => gabp_engine::identity::DEFAULT_NAME.to_string(),
                (name, _) => s(name),
            },
            s(&b["label"]),
            s(&b["role"]),
            s(&b["bridgeVersion"]),
            s(&b["peer"]),
            b["subscriptions"].as_array().map_or(0, Vec::len),
            n(&b["queueEvents"]),
            b["queueBytes"].as_u64().map_or("-".into(), display::bytes),
            n(&b["dropped"]),
            n(&b["delivered"]),
            ["denied", "rateLimited", "leaseRefused"]
                .iter()
                .map(|k| b[*k].as_u64().unwrap_or(0))
                .sum::<u64>()
        );
    }
    Ok(())
}
