//! `gabp-relay replay`: serve a recorded session as a GABP mod.

use std::time::Duration;

use crate::config::{limits, parse_duration, units};
use anyhow::{Context, Result};
use clap::Args;
use gabp_analysis::export::EpisodeMarks;
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
    #[command(flatten)]
    pub range: RangeArgs,
}

/// Where the replay starts and ends, and whether it starts paused.
#[derive(Args, Debug)]
pub struct RangeArgs {
    /// Stop this far into the session (e.g. 1m): no event from there on is played.
    #[arg(long, value_parser = parse_duration)]
    pub to: Option<Duration>,
    /// Start at the first mark with this label.
    #[arg(long, value_name = "LABEL", conflicts_with = "from", value_parser = mark_label)]
    pub from_mark: Option<String>,
    /// Stop at the first mark with this label after the start.
    #[arg(long, value_name = "LABEL", conflicts_with = "to", value_parser = mark_label)]
    pub to_mark: Option<String>,
    /// Play only episode N (numbered from 1, as `episodes` lists them).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..),
          conflicts_with_all = ["from", "to", "from_mark", "to_mark"])]
    pub episode: Option<u64>,
    /// The labels of the marks that start and end an episode.
    #[arg(long, value_name = "START,END", value_parser = EpisodeMarks::parse,
          default_value = "episode-start,episode-end")]
    pub episode_marks: EpisodeMarks,
    /// Start paused: nothing plays until a bridge sends relay/replay {"action":"resume"} (or
    /// `gabp-relay replay-control resume`), so every agent can attach first.
    #[arg(long)]
    pub paused: bool,
}

fn mark_label(s: &str) -> Result<String, String> {
    if s.is_empty() || s.len() > gabp_proto::mark::MAX_MARK_LABEL {
        return Err(format!(
            "a mark label is 1 to {} bytes",
            gabp_proto::mark::MAX_MARK_LABEL
        ));
    }
    Ok(s.to_string())
}

/// Why an episode's frames could not be found (or that they were: the walk stops there).
enum Walk {
    Found(u64, u64),
    Store(gabp_storage::StoreError),
}

impl From<gabp_storage::StoreError> for Walk {
    fn from(e: gabp_storage::StoreError) -> Walk {
        Walk::Store(e)
    }
}

/// The frames `--from-mark`, `--to-mark` and `--episode` cut at, found by the export's rules
/// (one pass each, stopping where it finds them): the first frame played and the first not.
fn frame_range(
    store: &Store,
    meta: &gabp_storage::SessionMeta,
    from: Option<Duration>,
    r: &RangeArgs,
) -> Result<(Option<u64>, Option<u64>)> {
    use gabp_analysis::export::find_mark;
    if let Some(n) = r.episode {
        let found = gabp_analysis::episodes::for_each_episode(store, meta, &r.episode_marks, |e| {
            if e.episode == n {
                return Err(Walk::Found(e.first_frame, e.last_frame + 1));
            }
            Ok(())
        });
        return match found {
            Err(Walk::Found(first, end)) => Ok((Some(first), Some(end))),
            Err(Walk::Store(e)) => Err(e.into()),
            Ok(count) => anyhow::bail!("session {} has no episode {n} (it has {count})", meta.id),
        };
    }
    let mut first = None;
    if let Some(label) = &r.from_mark {
        let (frame, _) = find_mark(store, meta, label, 0)?
            .ok_or_else(|| anyhow::anyhow!("session {} has no mark labelled {label:?}", meta.id))?;
        first = Some(frame);
    }
    let mut end = None;
    if let Some(label) = &r.to_mark {
        // After the start mark, never at it: `--from-mark L --to-mark L` is the span between
        // two marks.
        let start = match (first, from) {
            (Some(f), _) => f + 1,
            (None, Some(d)) => {
                store.frame_at_time(meta.id, meta.started_ns.saturating_add(d.as_nanos() as u64))?
            }
            (None, None) => 0,
        };
        let (frame, _) = find_mark(store, meta, label, start)?.ok_or_else(|| {
            anyhow::anyhow!(
                "session {} has no mark labelled {label:?} after the start",
                meta.id
            )
        })?;
        end = Some(frame + 1);
    }
    Ok((first, end))
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
    // Checked before the run, not found when its end cannot be written.
    if let Some(p) = &a.calls.diff_json {
        super::export::refuse_the_data_dir("--diff-json", p, &a.dir.data_dir)?;
        super::export::refuse_a_directory("--diff-json", p, "the diff is one file", "diff.json")?;
    }
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
    if let (Some(from), Some(to)) = (a.from, a.range.to) {
        if to <= from {
            return Err(usage("--to must be later than --from"));
        }
    }
    let (first_frame, end_frame) = frame_range(&store, &meta, a.from, &a.range)?;
    let mut opts = gabp_engine::replay::ReplayOptions {
        token: token.clone(),
        speed: a.speed,
        looping: a.looping,
        channels: a.channel,
        from: a.from,
        ..gabp_engine::replay::ReplayOptions::new(token.clone(), a.speed)
    };
    // Where it starts and ends, and whether it starts paused.
    opts.to = a.range.to;
    opts.first_frame = first_frame;
    opts.end_frame = end_frame;
    opts.paused = a.range.paused;
    let rec = gabp_engine::replay::Recording::open(store, meta, &opts)?;
    let mut rec = rec;
    rec.match_calls(rule, a.calls.expect_calls);
    let (start, _) = rec.range();
    if let Some(to) = a.range.to.filter(|to| *to <= start) {
        anyhow::bail!(
            "--to {} is not after where the replay starts ({} into session {})",
            humantime::format_duration(to),
            humantime::format_duration(Duration::from_micros(start.as_micros() as u64)),
            rec.meta.id
        );
    }
    let listener = gabp_rt::Listener::bind(&listen)
        .await
        .with_context(|| format!("cannot listen on {listen}"))?;
    let bound = listener.local_addr()?;
    // Best effort, as in serve: a closed stdout does not stop the replay.
    let text = if a.json.json {
        let (start, end) = rec.range();
        let doc = serde_json::json!({
            "session": rec.meta.id.to_string(), "events": rec.event_count(),
            "listen": bound.to_string(), "token": generated.then_some(&token),
            "paused": a.range.paused, "startMs": start.as_millis() as u64,
            "endMs": end.as_millis() as u64,
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
        if a.range.paused {
            t += "paused: nothing plays until a bridge resumes it (gabp-relay replay-control resume)\n";
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
    super::replay_calls::finish(&a.calls, &rec, expected, a.speed, a.json.json)
}
