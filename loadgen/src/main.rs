//! `gabp-loadgen`: seeded load scenarios against a GABP relay or mod, with latency measured
//! from scheduled send times and a raw-forwarder baseline measured in the same run.
//!
//! Modules follow iggy's bench layout: `scenario` (arguments and files), `actors` (the
//! parties), `target` (processes under test), `run` (one measurement), `report` (analytics).

mod actors;
mod chaos;
mod procstat;
mod report;
mod run;
mod scenario;
mod soak;
mod target;

use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Result};
use clap::{Args, Parser, Subcommand};
use gabp_sim::{Addr, ModSim, ModSimConfig};
use indicatif::{ProgressBar, ProgressStyle};

use crate::run::Which;
use crate::scenario::Scenario;
use crate::target::RelayCommand;

#[derive(Parser, Debug)]
#[command(
    name = "gabp-loadgen",
    version,
    about = "Load generator for GABP relays and mods"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Run a scenario end to end against the relay (and with --baseline, the raw forwarder).
    Run(RunArgs),
    /// Run a scenario against the raw forwarder only: the ceiling on this machine.
    Baseline(RunArgs),
    /// Run the simulated mod.
    Mod(ModArgs),
    /// Run N bridges against a relay or mod and report what they receive.
    Bridges(BridgesArgs),
    /// Drive tools/call at a fixed rate or concurrency against a relay or mod.
    Call(CallArgs),
    /// Churn bridges against the relay while the mod restarts; check memory, descriptors,
    /// ordering and the recording afterwards.
    Soak(SoakArgs),
    /// Honest bridges measured alone, then beside hostile clients of every kind; reports
    /// latency, drops, the relay's memory, descriptors and metrics size in both phases.
    Chaos(ChaosArgs),
    /// The baseline forwarder process (started by `run --baseline`).
    #[command(hide = true)]
    Forwarder(ForwarderArgs),
}

#[derive(Args, Debug, Clone)]
struct ScenarioArgs {
    /// A scenario file (loadgen/scenarios/*.toml); flags override its values.
    #[arg(long)]
    scenario: Option<PathBuf>,
    /// Reading bridges.
    #[arg(long)]
    bridges: Option<usize>,
    /// Event body size in bytes.
    #[arg(long)]
    payload_bytes: Option<usize>,
    /// Events per second published by the mod, or `max`.
    #[arg(long)]
    rate: Option<String>,
    /// Seconds measured.
    #[arg(long)]
    duration: Option<f64>,
    /// Seconds of warm-up.
    #[arg(long)]
    warmup: Option<f64>,
    /// Bridges that subscribe and never read.
    #[arg(long)]
    stalled: Option<usize>,
    /// Events per second each bridge reads (0 = as fast as possible).
    #[arg(long)]
    read_rate: Option<f64>,
    /// tools/call per second from an extra bridge.
    #[arg(long)]
    calls_per_s: Option<f64>,
    /// The relay's slow-bridge policy.
    #[arg(long)]
    policy: Option<String>,
    /// Do not record.
    #[arg(long)]
    no_record: bool,
    /// Durability when recording.
    #[arg(long)]
    durability: Option<String>,
    /// Channels (comma separated).
    #[arg(long)]
    channels: Option<String>,
    /// Seed.
    #[arg(long)]
    seed: Option<u64>,
    /// At max rate, events the publisher may run ahead of the slowest reader (closed loop,
    /// lossless); 0 = open loop.
    #[arg(long)]
    window: Option<u64>,
}

impl ScenarioArgs {
    fn scenario(&self) -> Result<Scenario> {
        let mut s = match &self.scenario {
            Some(p) => Scenario::load(p)?,
            None => Scenario::default(),
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
        if s.channels.is_empty() {
            bail!("a scenario needs at least one channel");
        }
        Ok(s)
    }
}

#[derive(Args, Debug)]
struct RunArgs {
    #[command(flatten)]
    scenario: ScenarioArgs,
    /// Also measure the raw forwarder in the same invocation and report the ratio.
    #[arg(long)]
    baseline: bool,
    /// Also measure these pub/sub servers (redis, nats; comma separated) with the same
    /// publisher schedule and readers, and report the relay's ratio to each.
    #[arg(long, value_delimiter = ',')]
    peers: Vec<actors::broker::Broker>,
    /// The gabp-relay binary (default: next to this one).
    #[arg(long)]
    relay_bin: Option<PathBuf>,
    /// Measure another relay: a command with {upstream} {upstream_token} {listen} {port} {token} {data_dir}.
    #[arg(long)]
    relay_cmd: Option<String>,
    /// Print one JSON document.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
struct ModArgs {
    #[command(flatten)]
    scenario: ScenarioArgs,
    /// Where to listen.
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: String,
    /// Token bridges must present.
    #[arg(long, default_value = "")]
    token: String,
    /// Delay before answering tools/call.
    #[arg(long, default_value_t = 0.0)]
    tool_latency_ms: f64,
    /// Stop after this many seconds (default: run until interrupted).
    #[arg(long)]
    run_for: Option<f64>,
}

#[derive(Args, Debug)]
struct BridgesArgs {
    #[command(flatten)]
    scenario: ScenarioArgs,
    /// The relay or mod.
    #[arg(long)]
    addr: String,
    /// Its token.
    #[arg(long, default_value = "")]
    token: String,
    /// Print one JSON document.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
struct CallArgs {
    /// The relay or mod.
    #[arg(long)]
    addr: String,
    /// Its token.
    #[arg(long, default_value = "")]
    token: String,
    /// The tool to call.
    #[arg(long, default_value = "sim/echo")]
    tool: String,
    /// Its arguments (JSON).
    #[arg(long, default_value = "{}")]
    args: String,
    /// Calls per second (open loop).
    #[arg(long, conflicts_with = "concurrency")]
    rate: Option<f64>,
    /// Concurrent callers (closed loop).
    #[arg(long)]
    concurrency: Option<usize>,
    /// Seconds measured.
    #[arg(long, default_value_t = 10.0)]
    duration: f64,
    /// Seconds of warm-up.
    #[arg(long, default_value_t = 1.0)]
    warmup: f64,
    /// Print one JSON document.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
struct SoakArgs {
    /// Seconds of churn.
    #[arg(long, default_value_t = 180.0)]
    duration: f64,
    /// Concurrent churning bridges.
    #[arg(long, default_value_t = 12)]
    workers: usize,
    /// Mod events per second.
    #[arg(long, default_value_t = 5000.0)]
    rate: f64,
    /// Mean seconds between mod restarts.
    #[arg(long, default_value_t = 15.0)]
    restart_every: f64,
    /// Seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// The gabp-relay binary (default: next to this one).
    #[arg(long)]
    relay_bin: Option<PathBuf>,
    /// Keep the recording in this data dir.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Print one JSON document.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
struct ChaosArgs {
    /// Seconds measured in each phase (without, then with the hostile clients).
    #[arg(long, default_value = "5", value_parser = parse_secs)]
    duration: f64,
    /// Seconds before each phase's measurement (the hostile clients already run).
    #[arg(long, default_value = "1", value_parser = parse_secs)]
    warmup: f64,
    /// Honest bridges, subscribed to every channel.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..=200))]
    bridges: u64,
    /// Mod events per second.
    #[arg(long, default_value = "20000", value_parser = parse_secs)]
    rate: f64,
    /// Event body size in bytes.
    #[arg(long, default_value_t = 256)]
    payload_bytes: usize,
    /// Honest tools/call per second (0 = none).
    #[arg(long, default_value_t = 200.0)]
    calls_per_s: f64,
    /// The relay's --max-body (the huge-frame clients go up to and over it).
    #[arg(long, default_value_t = gabp_proto::DEFAULT_MAX_BODY as u64, value_parser = clap::value_parser!(u64).range(1024..=(64 << 20)))]
    max_body: u64,
    /// Hostile kinds in the second phase (comma separated; default: all).
    #[arg(long, value_enum, value_delimiter = ',')]
    hostile: Vec<actors::hostile::Kind>,
    /// Concurrent clients per hostile kind.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..=16))]
    hostile_workers: u64,
    /// Relay RSS (MiB) at which the hostile clients are called off, to protect the machine.
    #[arg(long, default_value_t = 2048)]
    rss_limit_mib: u64,
    /// Do not record.
    #[arg(long)]
    no_record: bool,
    /// Seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// The gabp-relay binary (default: next to this one).
    #[arg(long)]
    relay_bin: Option<PathBuf>,
    /// Print one JSON document.
    #[arg(long)]
    json: bool,
}

/// A positive, finite number (seconds or a rate).
fn parse_secs(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 && v <= 1e9 => Ok(v),
        _ => Err(format!("{s:?} is not a positive number")),
    }
}

#[derive(Args, Debug)]
struct ForwarderArgs {
    #[arg(long)]
    upstream: String,
    #[arg(long, default_value = "")]
    upstream_token: String,
    #[arg(long)]
    listen: String,
    #[arg(long)]
    token: String,
}

fn main() {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() { 2 } else { 0 };
            let _ = e.print();
            std::process::exit(code);
        }
    };
    gabp_rt::log::init("warn");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("building the tokio runtime");
    if let Err(e) = rt.block_on(dispatch(cli.cmd)) {
        eprintln!("gabp-loadgen: {}", format!("{e:#}").replace('\n', " "));
        std::process::exit(1);
    }
}

fn progress_bar() -> Option<ProgressBar> {
    if !std::io::stderr().is_terminal() {
        return None;
    }
    let pb = ProgressBar::new_spinner();
    pb.set_style(
        ProgressStyle::with_template("{spinner} {elapsed} {msg}").expect("static template"),
    );
    pb.enable_steady_tick(Duration::from_millis(120));
    Some(pb)
}

async fn dispatch(cmd: Cmd) -> Result<()> {
    match cmd {
        Cmd::Run(a) => run_cmd(a, false).await,
        Cmd::Baseline(a) => run_cmd(a, true).await,
        Cmd::Mod(a) => {
            let sc = a.scenario.scenario()?;
            let cfg = ModSimConfig {
                token: a.token,
                channels: sc.channels.clone(),
                rate: sc.mod_rate(),
                payload_bytes: sc.payload_bytes,
                seed: sc.seed,
                tool_latency: Duration::from_secs_f64(a.tool_latency_ms.max(0.0) / 1e3),
                ..ModSimConfig::default()
            };
            let listen: Addr = a.listen.parse().map_err(|e: String| anyhow!(e))?;
            let sim = ModSim::start(&listen, cfg)?;
            println!("simulated mod listening on {}", sim.addr());
            match a.run_for {
                Some(s) => tokio::time::sleep(Duration::from_secs_f64(s)).await,
                None => tokio::signal::ctrl_c().await?,
            }
            println!(
                "emitted {} events, answered {} calls",
                sim.emitted(),
                sim.calls()
            );
            sim.stop();
            Ok(())
        }
        Cmd::Bridges(a) => {
            let sc = a.scenario.scenario()?;
            let addr: Addr = a.addr.parse().map_err(|e: String| anyhow!(e))?;
            let window = Arc::new(actors::Window::default());
            let stop = tokio_util::sync::CancellationToken::new();
            let mut readers = Vec::new();
            for _ in 0..sc.bridges {
                let c = actors::bridge::connect(&addr, &a.token, &sc.channels).await?;
                readers.push(tokio::spawn(actors::bridge::read(
                    c,
                    sc.read_rate,
                    actors::tally::Tally::new(window.clone(), None),
                    stop.clone(),
                )));
            }
            let mut stalled = Vec::new();
            for _ in 0..sc.stalled {
                stalled.push(actors::bridge::connect(&addr, &a.token, &sc.channels).await?);
            }
            tokio::time::sleep(sc.warmup()).await;
            window.set(true);
            let t = Instant::now();
            tokio::time::sleep(sc.duration()).await;
            window.set(false);
            stop.cancel();
            let mut m = report::Measurement::new("bridges", t.elapsed().as_secs_f64());
            let mut h = actors::latency_histogram();
            for r in readers {
                let r = r.await?;
                m.delivered += r.events;
                m.dropped += r.dropped;
                m.unannounced_gaps += r.unannounced_gaps;
                m.disconnects += u64::from(r.disconnected);
                let _ = h.add(&r.latency);
            }
            m.set_latency(&h);
            drop(stalled);
            if a.json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(
                        &serde_json::json!({"scenario": sc, "bridges": m})
                    )?
                );
            } else {
                print!("{}", report::table(Some(&m), None, &[]));
            }
            Ok(())
        }
        Cmd::Call(a) => {
            let addr: Addr = a.addr.parse().map_err(|e: String| anyhow!(e))?;
            let args: serde_json::Value =
                serde_json::from_str(&a.args).map_err(|e| anyhow!("--args: {e}"))?;
            let window = Arc::new(actors::Window::default());
            let stop = tokio_util::sync::CancellationToken::new();
            let task = match (a.rate, a.concurrency) {
                (Some(rate), _) if rate > 0.0 => {
                    let (c, _) = gabp_sim::Client::connect_hello(&addr, &a.token).await?;
                    tokio::spawn(actors::caller::fixed_rate(
                        c,
                        a.tool.clone(),
                        args,
                        rate,
                        window.clone(),
                        stop.clone(),
                    ))
                }
                (None, Some(n)) if n > 0 => {
                    let mut clients = Vec::new();
                    for _ in 0..n {
                        clients.push(gabp_sim::Client::connect_hello(&addr, &a.token).await?.0);
                    }
                    tokio::spawn(actors::caller::fixed_concurrency(
                        clients,
                        a.tool.clone(),
                        args,
                        window.clone(),
                        stop.clone(),
                    ))
                }
                _ => bail!("give --rate R (calls/s) or --concurrency N"),
            };
            tokio::time::sleep(Duration::from_secs_f64(a.warmup.max(0.0))).await;
            window.set(true);
            let t = Instant::now();
            tokio::time::sleep(Duration::from_secs_f64(a.duration.max(0.1))).await;
            window.set(false);
            let secs = t.elapsed().as_secs_f64();
            stop.cancel();
            let r = task.await?;
            let p = report::Percentiles::of(&r.latency);
            let doc = serde_json::json!({"tool": a.tool, "mode": if a.rate.is_some() { "rate" } else { "concurrency" }, "duration_s": secs, "calls": r.calls, "calls_per_s": r.calls as f64 / secs, "errors": r.errors, "unanswered": r.unanswered, "latency_us": p});
            if a.json {
                println!("{}", serde_json::to_string_pretty(&doc)?);
            } else {
                println!("{} calls in {:.1}s = {:.0}/s, {} errors, {} unanswered; latency µs p50 {:.1} p90 {:.1} p99 {:.1} p99.9 {:.1} max {:.1}", r.calls, secs, r.calls as f64 / secs, r.errors, r.unanswered, p.p50, p.p90, p.p99, p.p999, p.max);
            }
            if r.calls == 0 {
                bail!("no call was answered");
            }
            Ok(())
        }
        Cmd::Soak(a) => {
            let opts = soak::SoakOptions {
                duration: Duration::from_secs_f64(a.duration.max(1.0)),
                workers: a.workers.max(1),
                rate: a.rate.max(1.0),
                restart_every: Duration::from_secs_f64(a.restart_every.max(0.5)),
                seed: a.seed,
                relay_bin: a.relay_bin.unwrap_or_else(|| target::sibling("gabp-relay")),
                data_dir: a.data_dir,
            };
            let report = soak::run(opts).await?;
            if a.json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                for (k, v) in report.as_object().expect("object") {
                    println!("{k:<20} {v}");
                }
            }
            if report["ok"] != true {
                bail!("the soak found problems (see the report)");
            }
            Ok(())
        }
        Cmd::Chaos(a) => {
            let opts = chaos::ChaosOptions {
                phase: Duration::from_secs_f64(a.duration),
                warmup: Duration::from_secs_f64(a.warmup),
                bridges: a.bridges as usize,
                rate: a.rate,
                payload_bytes: a.payload_bytes,
                calls_per_s: a.calls_per_s.max(0.0),
                max_body: a.max_body as usize,
                kinds: if a.hostile.is_empty() {
                    actors::hostile::Kind::ALL.to_vec()
                } else {
                    a.hostile
                },
                workers: a.hostile_workers as usize,
                seed: a.seed,
                relay_bin: a.relay_bin.unwrap_or_else(|| target::sibling("gabp-relay")),
                record: !a.no_record,
                rss_limit_mib: a.rss_limit_mib.max(64),
            };
            let report = chaos::run(opts).await?;
            if a.json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                print!("{}", chaos::table(&report));
            }
            if report["ok"] != true {
                bail!(
                    "the hostile clients harmed the honest bridges or the relay (see the report)"
                );
            }
            Ok(())
        }
        Cmd::Forwarder(a) => {
            let listen: Addr = a.listen.parse().map_err(|e: String| anyhow!(e))?;
            let upstream: Addr = a.upstream.parse().map_err(|e: String| anyhow!(e))?;
            let listener = gabp_sim::Listener::bind(&listen).await?;
            actors::forwarder::serve(listener, upstream, a.upstream_token, a.token).await
        }
    }
}

async fn run_cmd(a: RunArgs, baseline_only: bool) -> Result<()> {
    let sc = a.scenario.scenario()?;
    let pb = progress_bar();
    let say = |m: &str| {
        if let Some(pb) = &pb {
            pb.set_message(m.to_string());
        }
    };
    let relay_cmd = match (&a.relay_cmd, &a.relay_bin) {
        (Some(t), _) => RelayCommand::Template(t.clone()),
        (None, Some(b)) => RelayCommand::Builtin(b.clone()),
        (None, None) => RelayCommand::Builtin(target::sibling("gabp-relay")),
    };
    let relay = if baseline_only {
        None
    } else {
        Some(run::measure(&sc, &Which::Relay(relay_cmd), &say).await?)
    };
    let baseline = if baseline_only || a.baseline {
        Some(run::measure(&sc, &Which::Baseline, &say).await?)
    } else {
        None
    };
    let mut peers = Vec::new();
    for p in &a.peers {
        peers.push(run::measure(&sc, &Which::Peer(*p), &say).await?);
    }
    if let Some(pb) = pb {
        pb.finish_and_clear();
    }
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report::document(
                &sc,
                relay.as_ref(),
                baseline.as_ref(),
                &peers
            ))?
        );
    } else {
        println!("scenario {}: {} bridges (+{} stalled), {} B events, rate {}, record {}, {:.0}s measured", sc.name, sc.bridges, sc.stalled, sc.payload_bytes, if sc.rate > 0.0 { format!("{}/s", sc.rate) } else { "max".into() }, sc.record, sc.duration_s);
        print!(
            "{}",
            report::table(relay.as_ref(), baseline.as_ref(), &peers)
        );
    }
    let failed: Vec<&String> = relay
        .iter()
        .chain(baseline.iter())
        .chain(peers.iter())
        .flat_map(|m| m.errors.iter())
        .collect();
    if !failed.is_empty() {
        bail!(
            "the run had errors: {}",
            failed
                .iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join("; ")
        );
    }
    if relay
        .iter()
        .chain(baseline.iter())
        .chain(peers.iter())
        .any(|m| m.delivered == 0 && sc.bridges > 0)
    {
        bail!("no event was delivered");
    }
    Ok(())
}
