//! The flags of `gabp-loadgen`'s commands (the command list itself is in `main`), and the
//! scenario flags layered over a scenario file. Times take plain seconds or a duration (`5s`, `500ms`, `1m`).

use std::path::PathBuf;

use anyhow::{anyhow, Result};
use clap::Args;

use crate::actors;
use crate::scenario::Scenario;

#[derive(Args, Debug, Clone)]
pub(crate) struct ScenarioArgs {
    /// A scenario file (loadgen/scenarios/*.toml); flags override its values.
    #[arg(long)]
    pub(crate) scenario: Option<PathBuf>,
    /// Reading bridges.
    #[arg(long)]
    pub(crate) bridges: Option<usize>,
    /// Event body size in bytes.
    #[arg(long)]
    pub(crate) payload_bytes: Option<usize>,
    /// Events per second published by the mod, or `max`.
    #[arg(long)]
    pub(crate) rate: Option<String>,
    /// At a fixed --rate, the mod writes the events due once per tick (a game's frame), e.g.
    /// 1ms; 0 writes each as it falls due.
    #[arg(long, value_parser = parse_secs_or_zero)]
    pub(crate) tick: Option<f64>,
    /// Time measured: seconds, or a duration like 5s or 1m.
    #[arg(long, value_parser = parse_secs)]
    pub(crate) duration: Option<f64>,
    /// Warm-up: seconds, or a duration like 500ms.
    #[arg(long, value_parser = parse_secs_or_zero)]
    pub(crate) warmup: Option<f64>,
    /// Of the reading bridges, how many subscribe to the first channel only (the rest to
    /// every channel): mixed subscription sets. Needs a fixed --rate, or --window 0.
    #[arg(long)]
    pub(crate) one_channel_bridges: Option<usize>,
    /// Bridges that subscribe and never read.
    #[arg(long)]
    pub(crate) stalled: Option<usize>,
    /// Events per second each bridge reads (0 = as fast as possible).
    #[arg(long)]
    pub(crate) read_rate: Option<f64>,
    /// tools/call per second from an extra bridge.
    #[arg(long)]
    pub(crate) calls_per_s: Option<f64>,
    /// The relay's slow-bridge policy.
    #[arg(long)]
    pub(crate) policy: Option<String>,
    /// Do not record.
    #[arg(long)]
    pub(crate) no_record: bool,
    /// Durability when recording.
    #[arg(long)]
    pub(crate) durability: Option<String>,
    /// Channels (comma separated).
    #[arg(long)]
    pub(crate) channels: Option<String>,
    /// Seed.
    #[arg(long)]
    pub(crate) seed: Option<u64>,
    /// At max rate, events the publisher may run ahead of the slowest reader (closed loop,
    /// lossless); 0 = open loop.
    #[arg(long)]
    pub(crate) window: Option<u64>,
}

impl ScenarioArgs {
    pub(crate) fn scenario(&self) -> Result<Scenario> {
        self.scenario_or(Scenario::default())
    }

    /// The scenario file, or `base` without one, with the flags on top.
    pub(crate) fn scenario_or(&self, base: Scenario) -> Result<Scenario> {
        let mut s = match &self.scenario {
            Some(p) => Scenario::load(p)?,
            None => base,
        };
        if let Some(v) = self.bridges {
            s.bridges = v;
        }
        if let Some(v) = self.payload_bytes {
            s.payload_bytes = v;
        }
        if let Some(v) = &self.rate {
            s.rate = if v == "max" {
                0.0
            } else {
                v.parse()
                    .map_err(|_| anyhow!("--rate takes events per second or max"))?
            };
        }
        if let Some(v) = self.tick {
            s.tick_ms = v * 1e3;
        }
        if let Some(v) = self.duration {
            s.duration_s = v;
        }
        if let Some(v) = self.warmup {
            s.warmup_s = v;
        }
        if let Some(v) = self.stalled {
            s.stalled = v;
        }
        if let Some(v) = self.read_rate {
            s.read_rate = v;
        }
        if let Some(v) = self.calls_per_s {
            s.calls_per_s = v;
        }
        if let Some(v) = &self.policy {
            s.policy = v.clone();
        }
        if self.no_record {
            s.record = false;
        }
        if let Some(v) = &self.durability {
            s.durability = v.clone();
        }
        if let Some(v) = &self.channels {
            s.channels = v
                .split(',')
                .map(str::trim)
                .filter(|c| !c.is_empty())
                .map(String::from)
                .collect();
        }
        if let Some(v) = self.seed {
            s.seed = v;
        }
        if let Some(v) = self.window {
            s.window = v;
        }
        if let Some(v) = self.one_channel_bridges {
            s.one_channel_bridges = v;
        }
        s.check()?;
        Ok(s)
    }
}

#[derive(Args, Debug)]
pub(crate) struct RunArgs {
    #[command(flatten)]
    pub(crate) scenario: ScenarioArgs,
    /// Also measure the raw forwarder in the same invocation and report the ratio.
    #[arg(long)]
    pub(crate) baseline: bool,
    /// Also measure these pub/sub servers (redis, nats; comma separated) with the same
    /// publisher schedule and readers, and report the relay's ratio to each.
    #[arg(long, value_delimiter = ',')]
    pub(crate) peers: Vec<actors::broker::Broker>,
    /// The gabp-relay binary (default: next to this one).
    #[arg(long)]
    pub(crate) relay_bin: Option<PathBuf>,
    /// Measure another relay: a command with {upstream} {upstream_token} {listen} {port} {token} {data_dir}.
    #[arg(long)]
    pub(crate) relay_cmd: Option<String>,
    /// Print one JSON document.
    #[arg(long)]
    pub(crate) json: bool,
    /// Also write the run as a self-contained HTML page with charts.
    #[arg(long, value_name = "PATH")]
    pub(crate) report: Option<PathBuf>,
    /// Measure this many rounds and report each figure's median and spread (min–max); with
    /// two targets (relay and --baseline or --peers) they alternate within each round.
    #[arg(long, default_value_t = 1, value_parser = parse_rounds)]
    pub(crate) rounds: usize,
}

#[derive(Args, Debug)]
pub(crate) struct CompareArgs {
    /// The first --json result (A).
    pub(crate) a: PathBuf,
    /// The second --json result (B), compared against A.
    pub(crate) b: PathBuf,
    /// A name for A's column, then one for B's (given twice) [default: the file names].
    #[arg(long, value_name = "NAME", action = clap::ArgAction::Append)]
    pub(crate) label: Vec<String>,
    /// Print one JSON document.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Args, Debug)]
pub(crate) struct ModArgs {
    #[command(flatten)]
    pub(crate) scenario: ScenarioArgs,
    /// Where to listen.
    #[arg(long, default_value = "127.0.0.1:0")]
    pub(crate) listen: String,
    /// Token bridges must present.
    #[arg(long, default_value = "")]
    pub(crate) token: String,
    /// Delay before answering tools/call.
    #[arg(long, default_value_t = 0.0)]
    pub(crate) tool_latency_ms: f64,
    /// Stop after this long: seconds, or a duration like 30s [default: run until interrupted].
    #[arg(long, value_parser = parse_secs)]
    pub(crate) run_for: Option<f64>,
}

#[derive(Args, Debug)]
pub(crate) struct BridgesArgs {
    #[command(flatten)]
    pub(crate) scenario: ScenarioArgs,
    /// The relay or mod.
    #[arg(long)]
    pub(crate) addr: String,
    /// Its token.
    #[arg(long, default_value = "")]
    pub(crate) token: String,
    /// Print one JSON document.
    #[arg(long)]
    pub(crate) json: bool,
    /// Measure this many rounds and report each figure's median and spread (min–max).
    #[arg(long, default_value_t = 1, value_parser = parse_rounds)]
    pub(crate) rounds: usize,
}

#[derive(Args, Debug)]
pub(crate) struct CallArgs {
    /// The relay or mod.
    #[arg(long)]
    pub(crate) addr: String,
    /// Its token.
    #[arg(long, default_value = "")]
    pub(crate) token: String,
    /// The tool to call.
    #[arg(long, default_value = "sim/echo")]
    pub(crate) tool: String,
    /// Its arguments (JSON).
    #[arg(long, default_value = "{}")]
    pub(crate) args: String,
    /// Calls per second (open loop).
    #[arg(long, conflicts_with = "concurrency")]
    pub(crate) rate: Option<f64>,
    /// Concurrent callers (closed loop).
    #[arg(long)]
    pub(crate) concurrency: Option<usize>,
    /// Keep the --concurrency calls in flight on one connection (pipelined; the next call as
    /// each answer comes back), as a relay does to its mod: run against the mod itself, it
    /// shows what the mod's handling of one connection costs, apart from any relay.
    #[arg(long, requires = "concurrency", conflicts_with = "rate")]
    pub(crate) one_connection: bool,
    /// Channels each caller subscribes to (comma separated): its connection then carries
    /// their events while it calls, which it skips unread. The same flag against a relay
    /// and against the mod itself measures what the relay adds to a call under load.
    #[arg(long, value_delimiter = ',')]
    pub(crate) subscribe: Vec<String>,
    /// Time measured: seconds, or a duration like 5s or 1m.
    #[arg(long, default_value = "10s", value_parser = parse_secs)]
    pub(crate) duration: f64,
    /// Warm-up: seconds, or a duration like 500ms.
    #[arg(long, default_value = "1s", value_parser = parse_secs_or_zero)]
    pub(crate) warmup: f64,
    /// Print one JSON document.
    #[arg(long)]
    pub(crate) json: bool,
    /// Also write the run as a self-contained HTML page with charts.
    #[arg(long, value_name = "PATH")]
    pub(crate) report: Option<PathBuf>,
    /// Measure this many rounds and report each figure's median and spread (min–max).
    #[arg(long, default_value_t = 1, value_parser = parse_rounds)]
    pub(crate) rounds: usize,
}

#[derive(Args, Debug)]
pub(crate) struct SoakArgs {
    /// Time of churn: seconds, or a duration like 3m.
    #[arg(long, default_value = "3m", value_parser = parse_secs)]
    pub(crate) duration: f64,
    /// Concurrent churning bridges.
    #[arg(long, default_value_t = 12)]
    pub(crate) workers: usize,
    /// Mod events per second.
    #[arg(long, default_value_t = 5000.0)]
    pub(crate) rate: f64,
    /// Mean time between mod restarts: seconds, or a duration like 15s.
    #[arg(long, default_value = "15s", value_parser = parse_secs)]
    pub(crate) restart_every: f64,
    /// Seed.
    #[arg(long, default_value_t = 1)]
    pub(crate) seed: u64,
    /// The gabp-relay binary (default: next to this one).
    #[arg(long)]
    pub(crate) relay_bin: Option<PathBuf>,
    /// Keep the recording in this data dir.
    #[arg(long)]
    pub(crate) data_dir: Option<PathBuf>,
    /// Print one JSON document.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Args, Debug)]
pub(crate) struct ChaosArgs {
    /// Time measured in each phase (without, then with the hostile clients), e.g. 5s.
    #[arg(long, default_value = "5s", value_parser = parse_secs)]
    pub(crate) duration: f64,
    /// Time before each phase's measurement (the hostile clients already run), e.g. 1s.
    #[arg(long, default_value = "1s", value_parser = parse_secs)]
    pub(crate) warmup: f64,
    /// Honest bridges, subscribed to every channel.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..=200))]
    pub(crate) bridges: u64,
    /// Mod events per second.
    #[arg(long, default_value = "20000", value_parser = parse_rate)]
    pub(crate) rate: f64,
    /// Event body size in bytes.
    #[arg(long, default_value_t = 256)]
    pub(crate) payload_bytes: usize,
    /// Honest tools/call per second (0 = none).
    #[arg(long, default_value_t = 200.0)]
    pub(crate) calls_per_s: f64,
    /// The relay's --max-body (the huge-frame clients go up to and over it).
    #[arg(long, default_value_t = gabp_proto::DEFAULT_MAX_BODY as u64, value_parser = clap::value_parser!(u64).range(1024..=(64 << 20)))]
    pub(crate) max_body: u64,
    /// Hostile kinds in the second phase (comma separated; default: all).
    #[arg(long, value_enum, value_delimiter = ',')]
    pub(crate) hostile: Vec<actors::hostile::Kind>,
    /// Concurrent clients per hostile kind.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..=16))]
    pub(crate) hostile_workers: u64,
    /// Relay RSS (MiB) at which the hostile clients are called off, to protect the machine.
    #[arg(long, default_value_t = 2048)]
    pub(crate) rss_limit_mib: u64,
    /// Do not record.
    #[arg(long)]
    pub(crate) no_record: bool,
    /// Seed.
    #[arg(long, default_value_t = 1)]
    pub(crate) seed: u64,
    /// The gabp-relay binary (default: next to this one).
    #[arg(long)]
    pub(crate) relay_bin: Option<PathBuf>,
    /// Print one JSON document.
    #[arg(long)]
    pub(crate) json: bool,
}

/// A count of rounds: 1 to 1000.
pub(crate) fn parse_rounds(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if (1..=1000).contains(&n) => Ok(n),
        _ => Err(format!("{s:?} is not a number of rounds from 1 to 1000")),
    }
}

/// A positive, finite rate.
pub(crate) fn parse_rate(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 && v <= 1e9 => Ok(v),
        _ => Err(format!("{s:?} is not a positive number")),
    }
}

/// A positive time in seconds: plain seconds (`10`, `0.5`) or a duration (`5s`, `200ms`, `1m`).
pub(crate) fn parse_secs(s: &str) -> Result<f64, String> {
    match parse_secs_or_zero(s)? {
        v if v > 0.0 => Ok(v),
        _ => Err(format!("{s:?} is not a positive time")),
    }
}

/// A time of zero or more seconds, written as for [`parse_secs`].
pub(crate) fn parse_secs_or_zero(s: &str) -> Result<f64, String> {
    let t = s.trim();
    let v = match t.parse::<f64>() {
        Ok(v) => v,
        Err(_) => humantime::parse_duration(t)
            .map_err(|_| format!("invalid time {s:?}: expected seconds or e.g. 500ms, 5s, 1m"))?
            .as_secs_f64(),
    };
    if v.is_finite() && (0.0..=1e9).contains(&v) {
        Ok(v)
    } else {
        Err(format!("{s:?} is out of range"))
    }
}

#[derive(Args, Debug)]
pub(crate) struct PipeArgs {
    /// Where to listen (TCP).
    #[arg(long)]
    pub(crate) listen: std::net::SocketAddr,
    /// The mod (or relay) each connection is piped to (TCP).
    #[arg(long)]
    pub(crate) upstream: std::net::SocketAddr,
}

#[derive(Args, Debug)]
pub(crate) struct ForwarderArgs {
    #[arg(long)]
    pub(crate) upstream: String,
    #[arg(
        long,
        default_value = "",
        env = "GABP_UPSTREAM_TOKEN",
        hide_env_values = true
    )]
    pub(crate) upstream_token: String,
    #[arg(long)]
    pub(crate) listen: String,
    #[arg(long, env = "GABP_RELAY_TOKEN", hide_env_values = true)]
    pub(crate) token: String,
}
