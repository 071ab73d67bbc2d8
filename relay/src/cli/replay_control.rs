//! `gabp-relay replay-control ACTION`: pause, resume, seek, step or pace a running `replay` for
//! all its bridges, or show where it is, from the shell. It is a bridge for one request: hello
//! with the replay's token, `relay/replay`, goodbye; it prints the state the replay answers.

use std::io::Write;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use gabp_rt::Addr;
use serde_json::{json, Value};

use super::reach::answered;
use super::usage;

#[derive(Args, Debug)]
pub struct ReplayControlArgs {
    #[command(subcommand)]
    pub action: Action,
    /// The replay's address (HOST:PORT or unix:PATH), as `replay` printed it.
    #[arg(long, global = true)]
    pub address: Option<String>,
    /// The replay's bridge token (an identity that may control it; any may ask the state).
    #[arg(long, global = true, env = "GABP_RELAY_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// How long to wait for the replay's answer.
    #[arg(long, global = true, value_parser = crate::config::parse_timeout, default_value = "15s")]
    pub wait: Duration,
    /// Print the replay's answer as one JSON document.
    #[arg(long, global = true)]
    pub json: bool,
}

#[derive(Subcommand, Debug)]
pub enum Action {
    /// Hold every bridge's timeline where the replay is.
    Pause,
    /// Play on from where it was paused.
    Resume,
    /// Show where the replay is (changes nothing).
    State,
    /// Jump to an offset, a mark, or a channel's recorded seq.
    Seek(SeekArgs),
    /// Play some events (or up to a mark), then pause.
    Step(StepArgs),
    /// Change the pace: a factor (2 is twice as fast) or `max`.
    Speed {
        /// The new speed.
        speed: gabp_engine::replay::Speed,
    },
}

#[derive(Args, Debug)]
#[group(required = true, multiple = true)]
pub struct SeekArgs {
    /// Milliseconds from the session's start.
    #[arg(long, value_name = "MS", conflicts_with_all = ["to_mark", "channel"])]
    pub to_ms: Option<f64>,
    /// The first mark with this label.
    #[arg(long, value_name = "LABEL", conflicts_with = "channel")]
    pub to_mark: Option<String>,
    /// With --to-seq: the channel whose recorded seq to go to.
    #[arg(long, requires = "to_seq")]
    pub channel: Option<String>,
    /// With --channel: the seq that channel's event had in the recording.
    #[arg(long, value_name = "N", requires = "channel")]
    pub to_seq: Option<u64>,
}

#[derive(Args, Debug)]
#[group(required = true, multiple = false)]
pub struct StepArgs {
    /// How many events (over every replayed channel) to play.
    #[arg(long, value_name = "N")]
    pub events: Option<u64>,
    /// Play up to the next mark with this label.
    #[arg(long, value_name = "LABEL")]
    pub to_mark: Option<String>,
}

/// The request's params for `action`.
fn params(action: &Action) -> Value {
    match action {
        Action::Pause => json!({"action": "pause"}),
        Action::Resume => json!({"action": "resume"}),
        Action::State => json!({"action": "state"}),
        Action::Speed { speed } => json!({"action": "speed", "speed": match speed {
            gabp_engine::replay::Speed::Max => json!("max"),
            gabp_engine::replay::Speed::Factor(f) if f.fract() == 0.0 => json!(*f as u64),
            gabp_engine::replay::Speed::Factor(f) => json!(f),
        }}),
        Action::Seek(s) => match (&s.to_ms, &s.to_mark, &s.channel, &s.to_seq) {
            (Some(ms), ..) => json!({"action": "seek", "toMs": ms}),
            (_, Some(l), ..) => json!({"action": "seek", "toMark": l}),
            (_, _, Some(c), Some(n)) => json!({"action": "seek", "channel": c, "toSeq": n}),
            _ => json!({"action": "seek"}),
        },
        Action::Step(s) => match (&s.events, &s.to_mark) {
            (Some(n), _) => json!({"action": "step", "events": n}),
            (_, Some(l)) => json!({"action": "step", "toMark": l}),
            _ => json!({"action": "step"}),
        },
    }
}

pub async fn run(a: ReplayControlArgs) -> Result<()> {
    let (Some(address), Some(token)) = (&a.address, &a.token) else {
        return Err(usage(
            "replay-control needs the replay's --address and --token (as `replay` printed them)",
        ));
    };
    let addr: Addr = address
        .parse()
        .map_err(|e: String| usage(format!("--address: {e}")))?;
    let mut c = super::reach::connect(&addr, a.wait).await?;
    let hello = json!({
        "token": token,
        "bridgeVersion": format!("gabp-relay-replay-control/{}", env!("CARGO_PKG_VERSION")),
        "platform": std::env::consts::OS,
        "launchId": uuid::Uuid::new_v4().to_string(),
        "clientInfo": {"name": "gabp-relay-replay-control"},
    });
    let welcome = c
        .request("session/hello", hello)
        .await
        .and_then(answered)
        .context("the replay did not welcome the control")?;
    if welcome["capabilities"]["extensions"]["replay"].is_null() {
        let _ = c.close().await;
        bail!(
            "{addr} is no replay: it relays a live mod (replay-control drives `gabp-relay replay`)"
        );
    }
    let state = c
        .request("relay/replay", params(&a.action))
        .await
        .and_then(answered)
        .context("the replay refused")?;
    let _ = c.close().await;
    if a.json {
        super::print_json(&state)?;
    } else {
        outln!("{}", describe(&state));
    }
    Ok(())
}

/// One line: `paused at 1234.5 ms (speed 1)`, with the step's end or the range when known.
fn describe(state: &Value) -> String {
    let speed = match &state["speed"] {
        Value::String(s) => s.clone(),
        other => format!("{other}x"),
    };
    let mut line = format!(
        "{} at {} ms (speed {speed})",
        state["state"].as_str().unwrap_or("?"),
        state["atMs"]
    );
    if let Some(until) = state["untilMs"].as_f64() {
        line += &format!(", stepping to {until} ms");
    }
    line += &format!(
        "; range {} to {} ms of session {}",
        state["startMs"],
        state["endMs"],
        state["sessionId"].as_str().unwrap_or("-")
    );
    line
}
