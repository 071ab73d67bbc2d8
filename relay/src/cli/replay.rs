//! `gabp-relay replay`: serve a recorded session as a GABP mod.

use std::time::Duration;

use crate::config::{limits, parse_duration, units};
use anyhow::{Context, Result};
use clap::Args;
use gabp_rt::Addr;
use gabp_storage::Store;

use super::{check_token, usage, DataDir, Json, Signals};

#[derive(Args, Debug)]
pub struct ReplayArgs {
    /// Session id, unique id prefix, or `latest`.
    pub session: String,
    #[command(flatten)]
    pub dir: DataDir,
    /// Where bridges connect: HOST:PORT or unix:PATH.
    #[arg(long)]
    pub listen: String,
    /// Token bridges must present [default: generated and printed].
    #[arg(long, env = "GABP_RELAY_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Speed factor (0.5, 2, …), or `max`.
    #[arg(long, default_value = "1")]
    pub speed: gabp_engine::replay::Speed,
    /// Start over at the end.
    #[arg(long = "loop")]
    pub looping: bool,
    /// Only this channel (repeatable).
    #[arg(long)]
    pub channel: Vec<String>,
    /// Start this far into the session (e.g. 10s).
    #[arg(long, value_parser = parse_duration)]
    pub from: Option<Duration>,
    /// Largest frame body a bridge may send, and largest welcome sent, e.g. 4MiB; 1KiB to 64MiB
    /// [default: 1MiB]. A session whose mod's welcome was larger needs as much here to welcome
    /// bridges; recorded events are served whole whatever their size.
    #[arg(long, value_parser = super::serve::max_body)]
    pub max_body: Option<String>,
    /// Allow listening on a non-loopback address.
    #[arg(long)]
    pub allow_remote: bool,
    #[command(flatten)]
    pub calls: super::replay_calls::CallArgs,
    /// Print the start-up line (session, address, token) as one JSON document.
    #[command(flatten)]
    pub json: Json,
}

pub async fn run(a: ReplayArgs) -> Result<()> {
    let mut signals = Signals::install()?;
    // Usage first: a bad --listen is reported before the data dir is touched.
    let listen: Addr = a
        .listen
        .parse()
        .map_err(|e: String| usage(format!("--listen: {e}")))?;
    if !a.allow_remote && !listen.is_local() {
        return Err(usage(format!(
            "refusing to listen on {listen}: not a loopback address (pass --allow-remote to allow it)"
        )));
    }
    let (token, generated) = match &a.token {
        Some(t) => (check_token(t)?.to_string(), false),
        None => (gabp_engine::auth::generate_token(), true),
    };
    let max_body = a
        .max_body
        .as_deref()
        .map(|s| {
            units::parse_size_in(s, limits::MIN_SIZE, limits::MAX_BODY)
                .map_err(|e| usage(format!("--max-body: {e}")))
        })
        .transpose()?;
    let rule = a.calls.rule()?;
    let store = Store::open_for_reading(&a.dir.data_dir)?;
    let meta = super::sessions::resolve(&store, &a.session)?;
    let calls_from = (a.calls.calls_from.as_deref())
        .map(|s| super::sessions::resolve(&store, s))
        .transpose()?;
    // A cut that leaves nothing to play is a mistake to say, not an empty replay to serve.
    if let Some(c) = a.channel.iter().find(|c| !meta.channels.contains(c)) {
        anyhow::bail!(
            "session {} has no channel {c:?} (its channels: {})",
            meta.id,
            if meta.channels.is_empty() {
                "none".to_string()
            } else {
                meta.channels.join(", ")
            }
        );
    }
    let length = Duration::from_nanos(meta.last_ns.saturating_sub(meta.started_ns));
    if let Some(from) = a.from.filter(|f| *f > length) {
        anyhow::bail!(
            "--from {} is past the end of session {} (it lasts {})",
            humantime::format_duration(from),
            meta.id,
            humantime::format_duration(Duration::from_millis(length.as_millis() as u64))
        );
    }
    let opts = gabp_engine::replay::ReplayOptions {
        token: token.clone(),
        speed: a.speed,
        looping: a.looping,
        channels: a.channel,
        from: a.from,
    };
    let rec = gabp_engine::replay::Recording::open(store, meta, &opts)?;
    let mut rec = rec;
    rec.match_calls(rule, a.calls.expect_calls);
    let listener = gabp_rt::Listener::bind(&listen)
        .await
        .with_context(|| format!("cannot listen on {listen}"))?;
    let bound = listener.local_addr()?;
    // Best effort, as in serve: a closed stdout does not stop the replay.
    let text = if a.json.json {
        let doc = serde_json::json!({
            "session": rec.meta.id.to_string(), "events": rec.event_count(),
            "listen": bound.to_string(), "token": generated.then_some(&token),
        });
        format!("{doc}\n")
    } else {
        let mut t = format!(
            "replaying session {} ({} events) on {}\n",
            rec.meta.id,
            rec.event_count(),
            bound
        );
        if generated {
            t += &format!("token {token}\n");
        }
        t
    };
    super::print_best_effort(&text);
    let cancel = tokio_util::sync::CancellationToken::new();
    let rec = std::sync::Arc::new(rec);
    let mut server = tokio::spawn(gabp_engine::replay::serve_with(
        listener,
        rec.clone(),
        opts,
        cancel.clone(),
        move |cfg| {
            if let Some(n) = max_body {
                cfg.max_body = n;
            }
        },
    ));
    // A recording found unreadable while serving ends the replay with its one line.
    tokio::select! {
        sig = signals.shutdown() => {
            tracing::info!("{sig} received: stopping the replay");
            cancel.cancel();
            server.await??;
        }
        served = &mut server => served??,
        // The agent under test is done: its calls are compared below.
        () = rec.calls().finished(), if a.calls.expect_calls => {
            tracing::info!("the last bridge left: comparing the agent's calls");
            cancel.cancel();
            server.await??;
        }
    }
    // The store closes here, before the process exits, once its readers have let go.
    if !rec.readers_stopped(std::time::Duration::from_secs(3)).await {
        tracing::warn!("a reader of the recording did not stop within 3 s");
    }
    let expected = calls_from.as_ref().unwrap_or(&rec.meta);
    super::replay_calls::finish(&a.calls, &rec, expected, a.from, a.speed, a.json.json)
}
