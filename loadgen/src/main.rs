//! `gabp-loadgen`: seeded load scenarios against a GABP relay or mod, with latency measured
//! from scheduled send times and a raw-forwarder baseline measured in the same run.
//!
//! Modules follow iggy's bench layout: `scenario` (arguments and files), `actors` (the
//! parties), `target` (processes under test), `run` (one measurement), `report` (analytics).

mod actors;
mod args;
mod calls;
mod chaos;
mod compare;
mod context;
mod figures;
mod games;
mod overhead;
mod procstat;
mod report;
mod report_html;
mod resume;
mod run;
mod scenario;
mod ship;
mod soak;
mod spread;
mod target;

use std::io::IsTerminal;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use clap::{Parser, Subcommand};
use gabp_sim::{Addr, ModSim, ModSimConfig};
use indicatif::{ProgressBar, ProgressStyle};

use crate::args::{
    BridgesArgs, CallArgs, ChaosArgs, CompareArgs, ForwarderArgs, ModArgs, PipeArgs, RunArgs,
    SoakArgs,
};
use crate::context::Watch;
use crate::run::Which;
use crate::target::RelayCommand;

#[derive(Parser, Debug)]
#[command(
    name = "gabp-loadgen",
    version,
    about = "Load generator for GABP relays and mods"
)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) cmd: Cmd,
}

#[derive(Subcommand, Debug)]
pub(crate) enum Cmd {
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
    /// Two --json results side by side: the settings that differ, then every figure with B's
    /// change against A and whether it is better, worse or within noise.
    Compare(CompareArgs),
    /// What a relay adds to a mod: tool calls and events straight to the mod and through the
    /// relay, in alternating rounds, with each difference weighed against the noise.
    Overhead(crate::overhead::OverheadArgs),
    /// Many games: N simulated mods, each with reading bridges and an agent calling a tool,
    /// behind one relay with a route per game, behind a relay per game, and with no relay, in
    /// alternating order; the relays' CPU, memory and disk per game and every agent's calls/s.
    Games(crate::games::GamesArgs),
    /// Churn bridges against the relay while the mod restarts; check memory, descriptors,
    /// ordering and the recording afterwards.
    Soak(SoakArgs),
    /// Honest bridges measured alone, then beside hostile clients of every kind; reports
    /// latency, drops, the relay's memory, descriptors and metrics size in both phases.
    Chaos(ChaosArgs),
    /// One bridge resumes (`relay.resume`) after missing --missed events, in alternate phases;
    /// reports the other bridges' delivery with and without it.
    Resume(crate::resume::ResumeArgs),
    /// A relay without and with --ship (NATS JetStream) in alternate phases: throughput ratio,
    /// shipping lag, and `gabp-relay collect`'s ingest rate.
    Ship(crate::ship::ShipArgs),
    /// A byte pipe to --upstream: each connection gets its own upstream connection and bytes
    /// are copied unread. What it adds to a call is the floor for any proxy on this machine.
    Pipe(PipeArgs),
    /// The baseline forwarder process (started by `run --baseline`).
    #[command(hide = true)]
    Forwarder(ForwarderArgs),
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
    // Ctrl-C or SIGTERM drops the command's future: every process it started is stopped (a
    // `Target` kills its process group when dropped) and its temp dirs removed, before exiting.
    // `mod` runs until Ctrl-C by design and prints its own summary then.
    let ends_on_ctrl_c = matches!(cli.cmd, Cmd::Mod(_));
    // The baseline forwarder is a child that `run --baseline` stops with SIGTERM when its
    // phase ends, and the pipe runs until stopped: that is their normal end, not worth a line.
    let stopped_by_parent = matches!(cli.cmd, Cmd::Forwarder(_) | Cmd::Pipe(_));
    let code = rt.block_on(async {
        let stop = async {
            if ends_on_ctrl_c {
                return std::future::pending().await;
            }
            use tokio::signal::unix::{signal, SignalKind};
            let (Ok(mut int), Ok(mut term)) = (
                signal(SignalKind::interrupt()),
                signal(SignalKind::terminate()),
            ) else {
                return std::future::pending().await;
            };
            tokio::select! {
                _ = int.recv() => 130,
                _ = term.recv() => 143,
            }
        };
        tokio::select! {
            r = dispatch(cli.cmd) => match r {
                Ok(()) => 0,
                Err(e) => {
                    eprintln!("gabp-loadgen: {}", format!("{e:#}").replace('\n', " "));
                    // An unreadable input to `compare` is a usage error.
                    if e.downcast_ref::<compare::Unreadable>().is_some() { 2 } else { 1 }
                }
            },
            code = stop => {
                if !stopped_by_parent {
                    eprintln!("gabp-loadgen: interrupted; stopped what it started");
                }
                code
            }
        }
    });
    rt.shutdown_timeout(Duration::from_secs(2));
    std::process::exit(code);
}

/// The command line, version and machine above a command's own table.
fn print_context(ctx: &context::Context) {
    for (k, v) in ctx.lines() {
        println!("{k:<8} {v}");
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
                tick: sc.tick(),
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
        Cmd::Bridges(a) => calls::bridges_cmd(a).await,
        Cmd::Call(a) => calls::call_cmd(a).await,
        Cmd::Overhead(a) => overhead::main(a).await,
        Cmd::Games(a) => games::main(a).await,
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
            let watch = Watch::start();
            let mut report = soak::run(opts).await?;
            let ctx = watch.finish();
            report["context"] = ctx.to_json();
            if a.json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                print_context(&ctx);
                for (k, v) in report.as_object().expect("object") {
                    if k != "context" {
                        println!("{k:<20} {v}");
                    }
                }
            }
            ctx.warn();
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
            let watch = Watch::start();
            let mut report = chaos::run(opts).await?;
            let ctx = watch.finish();
            report["context"] = ctx.to_json();
            if a.json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                print_context(&ctx);
                print!("{}", chaos::table(&report));
            }
            ctx.warn();
            if report["ok"] != true {
                bail!(
                    "the hostile clients harmed the honest bridges or the relay (see the report)"
                );
            }
            Ok(())
        }
        Cmd::Compare(a) => {
            let (va, vb) = (compare::read(&a.a)?, compare::read(&a.b)?);
            compare::comparable(&va, &vb)?;
            if a.label.len() > 2 {
                return Err(compare::Unreadable(
                    "--label is given once for A and once for B, not more".into(),
                )
                .into());
            }
            let (la, lb) = compare::labels(&a.a, &a.b, &a.label);
            let settings = compare::settings(&va, &vb);
            let changes = compare::compare(&va, &vb);
            if a.json {
                let doc =
                    compare::document((&a.a, &a.b), (&la, &lb), (&va, &vb), &settings, &changes);
                println!("{}", serde_json::to_string_pretty(&doc)?);
            } else {
                print!(
                    "{}",
                    compare::table((&la, &lb), (&va, &vb), &settings, &changes)
                );
            }
            Ok(())
        }
        Cmd::Resume(a) => {
            let json = a.json;
            let watch = Watch::start();
            let mut doc = resume::run(a).await?;
            let ctx = watch.finish();
            doc["context"] = ctx.to_json();
            if json {
                println!("{}", serde_json::to_string_pretty(&doc)?);
            } else {
                print_context(&ctx);
                print!("{}", resume::table(&doc));
            }
            ctx.warn();
            Ok(())
        }
        Cmd::Ship(a) => ship::main(a).await,
        Cmd::Pipe(a) => {
            let listener = tokio::net::TcpListener::bind(a.listen)
                .await
                .with_context(|| format!("listening on {}", a.listen))?;
            println!("pipe listening on {}", listener.local_addr()?);
            actors::pipe::serve(listener, a.upstream).await
        }
        Cmd::Forwarder(a) => {
            let listen: Addr = a.listen.parse().map_err(|e: String| anyhow!(e))?;
            let upstream: Addr = a.upstream.parse().map_err(|e: String| anyhow!(e))?;
            let listener = gabp_sim::Listener::bind(&listen).await?;
            actors::forwarder::serve(listener, upstream, a.upstream_token, a.token).await
        }
    }
}

/// One round of `run`: the relay, the baseline and the peers, each measured in turn.
struct RunRound {
    relay: Option<report::Measurement>,
    baseline: Option<report::Measurement>,
    peers: Vec<report::Measurement>,
}

impl RunRound {
    fn all(&self) -> impl Iterator<Item = &report::Measurement> {
        self.relay
            .iter()
            .chain(self.baseline.iter())
            .chain(self.peers.iter())
    }
}

async fn run_cmd(a: RunArgs, baseline_only: bool) -> Result<()> {
    let watch = Watch::start();
    let sc = a.scenario.scenario()?;
    if sc.one_channel_bridges > 0 && (baseline_only || a.baseline) {
        bail!("the raw forwarder hands every event to every reader: it cannot measure bridges on one channel");
    }
    let pb = progress_bar();
    let relay_cmd = match (&a.relay_cmd, &a.relay_bin) {
        (Some(t), _) => RelayCommand::Template(t.clone()),
        (None, Some(b)) => RelayCommand::Builtin(b.clone()),
        (None, None) => RelayCommand::Builtin(target::sibling("gabp-relay")),
    };
    let mut rounds = Vec::new();
    for i in 0..a.rounds {
        let say = |m: &str| {
            if let Some(pb) = &pb {
                if a.rounds > 1 {
                    pb.set_message(format!("round {}/{}: {m}", i + 1, a.rounds));
                } else {
                    pb.set_message(m.to_string());
                }
            }
        };
        // Within a round the targets follow each other (relay, baseline, peers): drift on
        // the machine over the rounds hits each of them alike.
        let relay = if baseline_only {
            None
        } else {
            Some(run::measure(&sc, &Which::Relay(relay_cmd.clone()), &say).await?)
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
        rounds.push(RunRound {
            relay,
            baseline,
            peers,
        });
    }
    if let Some(pb) = pb {
        pb.finish_and_clear();
    }
    let ctx = watch.finish();
    let docs: Vec<serde_json::Value> = rounds
        .iter()
        .map(|r| report::document(&sc, r.relay.as_ref(), r.baseline.as_ref(), &r.peers))
        .collect();
    let mut doc = spread::merge(docs);
    let relay_program = match &relay_cmd {
        RelayCommand::Builtin(p) => p.display().to_string(),
        RelayCommand::Template(t) => t.clone(),
    };
    let target = if baseline_only {
        serde_json::json!({
            "kind": "forwarder",
            "started_by": "gabp-loadgen, in front of its simulated mod",
        })
    } else {
        serde_json::json!({
            "kind": "relay",
            "started_by": "gabp-loadgen, in front of its simulated mod",
            "program": relay_program,
            "recording": sc.record,
            "durability": sc.durability,
            "policy": sc.policy,
        })
    };
    let config = serde_json::json!({
        "rounds": a.rounds,
        "baseline": baseline_only || a.baseline,
        "peers": a.peers.iter().map(|p| p.label()).collect::<Vec<_>>(),
        "pace_window": sc.pace_window(),
    });
    calls::describe(&mut doc, config, target, &ctx);
    let per_bridge = |path: &str| {
        spread::at(&doc, path)
            .and_then(serde_json::Value::as_f64)
            .map(|v| v / sc.bridges.max(1) as f64)
    };
    let pace_note = report::pace_note(
        &sc,
        per_bridge("relay.delivered_eps").or_else(|| per_bridge("baseline.delivered_eps")),
    );
    if let Some(n) = &pace_note {
        doc["latency_note"] = n.clone().into();
    }
    let scenario_line = format!(
        "scenario {}: {} bridges (+{} stalled), {} B events, rate {}, record {}, {:.0}s measured",
        sc.name,
        sc.bridges,
        sc.stalled,
        sc.payload_bytes,
        if sc.rate > 0.0 {
            format!("{}/s", sc.rate)
        } else {
            "max".into()
        },
        sc.record,
        sc.duration_s
    );
    let target_line = crate::context::target_line(&doc["target"]);
    // The figures a person reads first, for every target measured.
    let mut rows = Vec::new();
    for m in rounds[0].all() {
        let key = match m.target.as_str() {
            "baseline" => "baseline".to_string(),
            _ if rounds[0]
                .relay
                .as_ref()
                .is_some_and(|r| r.target == m.target) =>
            {
                "relay".to_string()
            }
            _ => match rounds[0].peers.iter().position(|p| p.target == m.target) {
                Some(i) => format!("peers.{i}"),
                None => continue,
            },
        };
        for (label, figure) in [
            ("delivered/s", "delivered_eps"),
            ("p50", "latency_us.p50"),
            ("p99", "latency_us.p99"),
            ("CPU", "cpu_percent"),
        ] {
            rows.push((format!("{} {label}", m.target), format!("{key}.{figure}")));
        }
    }
    rows.push(("relay ÷ baseline".into(), "ratio".into()));
    for p in &rounds[0].peers {
        rows.push((
            format!("relay ÷ {}", p.target),
            format!("peer_ratios.{}", p.target),
        ));
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        print!("{}", calls::head(&target_line, &scenario_line, &ctx));
        for (i, r) in rounds.iter().enumerate() {
            if rounds.len() > 1 {
                println!("round {}/{}:", i + 1, rounds.len());
            }
            print!(
                "{}",
                report::table(r.relay.as_ref(), r.baseline.as_ref(), &r.peers)
            );
        }
        if rounds.len() > 1 {
            print!("{}", spread::summary(&doc, &rows));
        }
        if let Some(n) = &pace_note {
            println!("note: {n}");
        }
    }
    ctx.warn();
    let last = rounds.last().expect("at least one round");
    if let Some(path) = &a.report {
        let mut scenario = vec![
            ("scenario", sc.name.clone()),
            (
                "bridges",
                format!("{} (+{} stalled)", sc.bridges, sc.stalled),
            ),
            ("event payload", format!("{} B", sc.payload_bytes)),
            (
                "rate",
                if sc.rate > 0.0 {
                    format!("{}/s", sc.rate)
                } else {
                    "max".into()
                },
            ),
            ("record", sc.record.to_string()),
            (
                "measured",
                format!("{:.1} s after {:.1} s warm-up", sc.duration_s, sc.warmup_s),
            ),
            ("target", target_line.clone()),
        ];
        scenario.extend(ctx.lines());
        if let Some(n) = &pace_note {
            scenario.push(("latency", n.clone()));
        }
        if rounds.len() > 1 {
            scenario.push((
                "rounds",
                format!(
                    "{}; the figures and charts below are the last round's, the medians and ranges are these: {}",
                    rounds.len(),
                    spread::summary(&doc, &rows)
                        .lines()
                        .skip(1)
                        .map(str::trim)
                        .collect::<Vec<_>>()
                        .join("; ")
                ),
            ));
        }
        let ms: Vec<&report::Measurement> = last.all().collect();
        let html = report_html::run_page(&format!("gabp-loadgen {}", sc.name), &scenario, &ms)?;
        report_html::write(path, &html)?;
    }
    let failed: Vec<&String> = rounds
        .iter()
        .flat_map(RunRound::all)
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
    if rounds
        .iter()
        .flat_map(RunRound::all)
        .any(|m| m.delivered == 0 && sc.bridges > 0)
    {
        bail!("no event was delivered");
    }
    Ok(())
}
