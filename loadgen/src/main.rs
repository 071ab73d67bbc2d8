//! `gabp-loadgen`: seeded load scenarios against a GABP relay or mod, with latency measured
//! from scheduled send times and a raw-forwarder baseline measured in the same run.
//!
//! Modules follow iggy's bench layout: `scenario` (arguments and files), `actors` (the
//! parties), `target` (processes under test), `run` (one measurement), `report` (analytics).

mod actors;
mod args;
mod chaos;
mod compare;
mod procstat;
mod report;
mod report_html;
mod resume;
mod run;
mod scenario;
mod ship;
mod soak;
mod target;

use std::io::IsTerminal;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use clap::{Parser, Subcommand};
use gabp_sim::{Addr, ModSim, ModSimConfig};
use indicatif::{ProgressBar, ProgressStyle};

use crate::args::{
    BridgesArgs, CallArgs, ChaosArgs, CompareArgs, ForwarderArgs, ModArgs, PipeArgs, RunArgs,
    SoakArgs,
};
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
    /// The change of every figure between two --json results (A then B).
    Compare(CompareArgs),
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

/// A calling client, subscribed to `channels` (whose events it skips while it waits).
async fn caller(addr: &Addr, token: &str, channels: &[String]) -> Result<gabp_client::Client> {
    let (mut c, _) = gabp_client::Client::connect_hello(addr, token).await?;
    if !channels.is_empty() {
        let names: Vec<&str> = channels.iter().map(String::as_str).collect();
        c.subscribe(&names).await?;
        c.discard_events = true;
    }
    Ok(c)
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
            m.unsampled = true;
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
                    let c = caller(&addr, &a.token, &a.subscribe).await?;
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
                        clients.push(caller(&addr, &a.token, &a.subscribe).await?);
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
            if let Some(path) = &a.report {
                let figures = [
                    ("tool", a.tool.clone()),
                    ("mode", doc["mode"].as_str().unwrap_or("").to_string()),
                    ("window", format!("{secs:.1} s")),
                    ("calls", r.calls.to_string()),
                    ("calls/s", format!("{:.0}", r.calls as f64 / secs)),
                    ("errors", r.errors.to_string()),
                    ("unanswered", r.unanswered.to_string()),
                    (
                        "p50 / p90 / p99 / p99.9 / max µs",
                        format!(
                            "{:.1} / {:.1} / {:.1} / {:.1} / {:.1}",
                            p.p50, p.p90, p.p99, p.p999, p.max
                        ),
                    ),
                ];
                let html = report_html::call_page(
                    "gabp-loadgen call",
                    &figures,
                    report::curve(&r.latency),
                )?;
                report_html::write(path, &html)?;
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
        Cmd::Compare(a) => {
            let (va, vb) = (compare::read(&a.a)?, compare::read(&a.b)?);
            compare::comparable(&va, &vb)?;
            let changes = compare::compare(&va, &vb);
            if a.json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(
                        &serde_json::json!({"a": a.a, "b": a.b, "figures": changes})
                    )?
                );
            } else {
                print!("{}", compare::table(&changes));
            }
            Ok(())
        }
        Cmd::Resume(a) => {
            let json = a.json;
            let doc = resume::run(a).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&doc)?);
            } else {
                print!("{}", resume::table(&doc));
            }
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

async fn run_cmd(a: RunArgs, baseline_only: bool) -> Result<()> {
    let sc = a.scenario.scenario()?;
    if sc.one_channel_bridges > 0 && (baseline_only || a.baseline) {
        bail!("the raw forwarder hands every event to every reader: it cannot measure bridges on one channel");
    }
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
    if let Some(path) = &a.report {
        let scenario = [
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
            ("machine", {
                let m = procstat::machine();
                format!("{} cores, {}", m["cores"], m["cpu"].as_str().unwrap_or(""))
            }),
        ];
        let ms: Vec<&report::Measurement> = relay
            .iter()
            .chain(baseline.iter())
            .chain(peers.iter())
            .collect();
        let html = report_html::run_page(&format!("gabp-loadgen {}", sc.name), &scenario, &ms)?;
        report_html::write(path, &html)?;
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
