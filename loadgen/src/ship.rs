//! `gabp-loadgen ship`: what shipping every recording to NATS JetStream costs the relay, and
//! whether shipping keeps up. A single-node `nats-server` with JetStream runs on free loopback
//! ports in a temporary dir for the whole run. Phases alternate in the same run: a relay
//! *without* `--ship`, then one *with* it (each phase a fresh relay, mod and data dir, the
//! scenario's bridges reading at its rate). The figures: the bridges' delivered events per
//! second with shipping over without it; in shipping phases the lag (frames and bytes recorded
//! but not acknowledged by JetStream, from the relay's metrics) sampled every second, whether
//! it stays bounded (the last third's maximum against the first third's) and the time it takes
//! to drain to 0 once the mod stops; last, `gabp-relay collect` into a fresh archive from the
//! stream: its ingest rate, frames per second until the archive holds every shipped frame.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::procstat;
use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use gabp_sim::events::Pace;
use gabp_sim::{Addr, ModSim, ModSimConfig};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, Command};
use tokio_util::sync::CancellationToken;

use crate::actors::broker::Broker;
use crate::actors::tally::Tally;
use crate::actors::{bridge, Window};
use crate::args::ScenarioArgs;
use crate::target::{self, RelayCommand, Target};

const MOD_TOKEN: &str = "loadgen-mod-token";

#[derive(Args, Debug)]
pub(crate) struct ShipArgs {
    #[command(flatten)]
    pub(crate) scenario: ScenarioArgs,
    /// Phases, alternating without and with --ship (without first).
    #[arg(long, default_value_t = 4)]
    pub(crate) phases: usize,
    /// Seconds measured per phase (the run measures phases × this; the default makes 60 s).
    #[arg(long, default_value_t = 15.0)]
    pub(crate) phase_s: f64,
    /// The gabp-relay binary (default: next to this one).
    #[arg(long)]
    pub(crate) relay_bin: Option<PathBuf>,
    /// Skip the collector measurement.
    #[arg(long)]
    pub(crate) no_collect: bool,
    /// Print one JSON document.
    #[arg(long)]
    pub(crate) json: bool,
}

/// A free loopback port (bound, read, released).
fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// A single-node `nats-server` with JetStream in its own dir, killed on drop.
struct Nats {
    child: Child,
    url: String,
    _dir: tempfile::TempDir,
}

impl Nats {
    async fn start() -> Result<Nats> {
        let dir = tempfile::tempdir()?;
        let (port, http) = (free_port()?, free_port()?);
        let child = Command::new(Broker::Nats.program_path())
            .args(["-a", "127.0.0.1", "-p", &port.to_string(), "-m"])
            .arg(http.to_string())
            .args(["-js", "-sd"])
            .arg(dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .context("cannot start nats-server (scripts/setup installs it)")?;
        let nats = Nats {
            child,
            url: format!("nats://127.0.0.1:{port}"),
            _dir: dir,
        };
        // Ready when its health check says JetStream is up.
        let deadline = Instant::now() + Duration::from_secs(30);
        let health = format!("127.0.0.1:{http}");
        loop {
            if let Ok((200, _)) = http_get(&health, "/healthz?js-enabled-only=true").await {
                return Ok(nats);
            }
            if Instant::now() > deadline {
                bail!("nats-server did not become ready within 30 s");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Nats {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

/// A plain HTTP/1.0 GET on loopback: the status and the body.
async fn http_get(addr: &str, path: &str) -> Result<(u16, String)> {
    let get = async {
        let mut s = tokio::net::TcpStream::connect(addr).await?;
        s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
            .await?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await?;
        Ok::<_, std::io::Error>(buf)
    };
    let buf = tokio::time::timeout(Duration::from_secs(5), get)
        .await
        .map_err(|_| anyhow!("no answer from {addr}"))??;
    let text = String::from_utf8_lossy(&buf);
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| anyhow!("not an HTTP answer from {addr}"))?;
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    Ok((status, body.to_string()))
}

/// A gauge or counter's value in a Prometheus text page (summed over its label sets).
fn metric(page: &str, name: &str) -> Option<f64> {
    let mut found = None;
    for line in page.lines() {
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        if !(rest.starts_with(' ') || rest.starts_with('{')) {
            continue;
        }
        if let Some(v) = rest.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()) {
            found = Some(found.unwrap_or(0.0) + v);
        }
    }
    found
}

/// Shipping's lag now (frames, bytes) and frames shipped, from the relay's metrics page.
async fn lag(metrics: &str) -> Option<(u64, u64, u64)> {
    let (status, page) = http_get(metrics, "/metrics").await.ok()?;
    if status != 200 {
        return None;
    }
    Some((
        metric(&page, "gabp_ship_lag_frames")? as u64,
        metric(&page, "gabp_ship_lag_bytes").unwrap_or(0.0) as u64,
        metric(&page, "gabp_shipped_frames_total").unwrap_or(0.0) as u64,
    ))
}

/// `gabp-relay sessions --json` on `data`: (frames of every session, frames not shipped yet).
async fn recorded(bin: &Path, data: &Path) -> Result<(u64, u64)> {
    let out = Command::new(bin)
        .args(["sessions", "--json", "--data-dir"])
        .arg(data)
        .output()
        .await?;
    if !out.status.success() {
        bail!(
            "gabp-relay sessions failed on {}: {}",
            data.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let v: Value = serde_json::from_slice(&out.stdout)?;
    let (mut frames, mut lag) = (0, 0);
    for s in v["sessions"].as_array().into_iter().flatten() {
        frames += s["frames"].as_u64().unwrap_or(0);
        lag += s["ship"]["lagFrames"].as_u64().unwrap_or(0);
    }
    Ok((frames, lag))
}

/// Runs the benchmark, then prints the table or the JSON document.
pub(crate) async fn main(a: ShipArgs) -> Result<()> {
    let json = a.json;
    let watch = crate::context::Watch::start();
    let mut doc = run(a).await?;
    let ctx = watch.finish();
    doc["context"] = ctx.to_json();
    if json {
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        for (k, v) in ctx.lines() {
            println!("{k:<8} {v}");
        }
        print!("{}", table(&doc));
    }
    ctx.warn();
    Ok(())
}

/// Runs the benchmark and returns its JSON document.
pub(crate) async fn run(a: ShipArgs) -> Result<Value> {
    let sc = a.scenario.scenario()?;
    let bin = a
        .relay_bin
        .clone()
        .unwrap_or_else(|| target::sibling("gabp-relay"));
    let nats = Nats::start().await?;
    let root = tempfile::tempdir()?;
    // Shipped messages are signed and checked, as in production.
    let key = root.path().join("fleet.key");
    let made = Command::new(&bin)
        .args(["fleet-key", "new", "-o"])
        .arg(&key)
        .stdout(Stdio::null())
        .status()
        .await?;
    if !made.success() {
        return Err(anyhow!("gabp-relay fleet-key new failed ({made})"));
    }
    let mut rows = Vec::new();
    let mut shipped_total = 0u64;
    for i in 0..a.phases.max(2) {
        let ship = i % 2 == 1;
        let data = root.path().join(format!("phase-{i}"));
        let row = phase(
            &a,
            &sc,
            &bin,
            &data,
            ship.then_some((nats.url.as_str(), key.as_path())),
            nats.child.id(),
        )
        .await?;
        if ship {
            shipped_total += row["recorded_frames"].as_u64().unwrap_or(0);
        }
        rows.push(row);
    }
    let collect = if a.no_collect {
        Value::Null
    } else {
        collect(
            &bin,
            &nats.url,
            &key,
            &root.path().join("archive"),
            shipped_total,
        )
        .await?
    };
    let mean = |ship: bool| {
        let v: Vec<f64> = rows
            .iter()
            .filter(|r| r["ship"] == ship)
            .filter_map(|r| r["events_per_s"].as_f64())
            .collect();
        v.iter().sum::<f64>() / v.len().max(1) as f64
    };
    let (off, on) = (mean(false), mean(true));
    let bounded = rows
        .iter()
        .filter(|r| r["ship"] == true)
        .all(|r| r["lag"]["bounded"] == true && r["lag"]["final_frames"] == 0);
    Ok(json!({
        "bridges": sc.bridges, "channels": sc.channels.len(), "payload_bytes": sc.payload_bytes,
        "rate": if sc.rate > 0.0 { json!(sc.rate) } else { json!("max") }, "record": sc.record,
        "durability": sc.durability, "phase_s": a.phase_s, "phases": rows,
        "without_ship_events_per_s": off, "with_ship_events_per_s": on,
        "ratio": if off > 0.0 { on / off } else { 0.0 },
        "lag_bounded_and_drained": bounded,
        "collect": collect,
    }))
}

/// One phase: a fresh mod, relay and data dir; `ship` is the NATS url and the fleet key file
/// in a shipping phase.
async fn phase(
    a: &ShipArgs,
    sc: &crate::scenario::Scenario,
    bin: &Path,
    data: &Path,
    ship: Option<(&str, &Path)>,
    nats_pid: Option<u32>,
) -> Result<Value> {
    let pace = sc.pace_window().map(|w| Pace::new(sc.bridges, w));
    let sim = ModSim::start(
        &"127.0.0.1:0".parse::<Addr>().expect("literal"),
        ModSimConfig {
            token: MOD_TOKEN.into(),
            channels: sc.channels.clone(),
            rate: sc.mod_rate(),
            payload_bytes: sc.payload_bytes,
            seed: sc.seed,
            pace: pace.clone(),
            ..ModSimConfig::default()
        },
    )?;
    // Both kinds serve metrics, so that only shipping differs.
    let metrics = format!("127.0.0.1:{}", free_port()?);
    let mut extra = vec!["--metrics".to_string(), metrics.clone()];
    if let Some((url, key)) = ship {
        extra.extend([
            "--ship".to_string(),
            url.to_string(),
            "--fleet-key".to_string(),
            key.display().to_string(),
        ]);
    }
    let relay = Target::relay(
        &RelayCommand::Builtin(bin.to_path_buf()),
        sim.addr(),
        MOD_TOKEN,
        sc,
        data,
        &extra,
        None,
    )
    .await;
    let relay = match relay {
        Ok(t) => t,
        Err(e) => {
            sim.stop();
            return Err(e);
        }
    };
    let pids = Pids {
        relay: relay.pid(),
        nats: nats_pid,
    };
    let r = measure(a, sc, &relay, &sim, pace, &metrics, ship.is_some(), pids).await;
    sim.stop();
    relay.stop(Duration::from_secs(10)).await;
    let mut row = r?;
    let (frames, unshipped) = recorded(bin, data).await?;
    row["recorded_frames"] = json!(frames);
    if ship.is_some() {
        row["unshipped_frames_at_exit"] = json!(unshipped);
    }
    Ok(row)
}

/// The processes whose CPU time a phase reports.
#[derive(Debug, Clone, Copy)]
struct Pids {
    relay: Option<u32>,
    nats: Option<u32>,
}

impl Pids {
    /// CPU seconds so far of the relay, the NATS server and this process (the mod and the
    /// bridges).
    fn cpu(&self) -> [f64; 3] {
        let of = |pid: Option<u32>| pid.and_then(procstat::sample).map_or(0.0, |s| s.cpu_s);
        [of(self.relay), of(self.nats), of(Some(std::process::id()))]
    }
}

#[allow(clippy::too_many_arguments)]
async fn measure(
    a: &ShipArgs,
    sc: &crate::scenario::Scenario,
    relay: &Target,
    sim: &ModSim,
    pace: Option<Arc<Pace>>,
    metrics: &str,
    ship: bool,
    pids: Pids,
) -> Result<Value> {
    let window = Arc::new(Window::default());
    let stop = CancellationToken::new();
    let mut readers = Vec::new();
    for _ in 0..sc.bridges {
        let c = bridge::connect(&relay.addr, &relay.token, &sc.channels).await?;
        let tally = Tally::new(window.clone(), pace.as_ref().and_then(Pace::join));
        readers.push(tokio::spawn(bridge::read(
            c,
            sc.read_rate,
            tally,
            stop.clone(),
        )));
    }
    tokio::time::sleep(sc.warmup()).await;
    window.set(true);
    let started = Instant::now();
    let cpu_before = pids.cpu();
    let phase = Duration::from_secs_f64(a.phase_s.max(1.0));
    let mut samples: Vec<(f64, u64, u64)> = Vec::new();
    let mut next = started;
    while started.elapsed() < phase {
        next += Duration::from_secs(1);
        tokio::time::sleep_until(next.min(started + phase).into()).await;
        if ship {
            if let Some((f, b, _)) = lag(metrics).await {
                samples.push((started.elapsed().as_secs_f64(), f, b));
            }
        }
    }
    let secs = started.elapsed().as_secs_f64();
    let delivered = window.delivered();
    let emitted = sim.emitted();
    let cpu_after = pids.cpu();
    window.set(false);
    stop.cancel();
    let mut gaps = 0;
    for rd in readers {
        gaps += rd.await?.unannounced_gaps;
    }
    let cores = |i: usize| (cpu_after[i] - cpu_before[i]) / secs;
    let mut row = json!({
        "ship": ship, "seconds": secs, "events_per_s": delivered as f64 / secs,
        "mod_emitted": emitted, "unannounced_gaps": gaps,
        // Cores used while measured: what shipping costs the relay, and what the NATS server
        // on the same machine takes from everything else.
        "cpu_cores": {
            "relay": cores(0),
            "nats_server": if ship { cores(1) } else { 0.0 },
            "mod_and_bridges": cores(2),
        },
        "relay_cpu_us_per_delivered_event": if delivered > 0 {
            (cpu_after[0] - cpu_before[0]) * 1e6 / delivered as f64
        } else { 0.0 },
    });
    if ship {
        // The mod stops; every recorded frame must be acknowledged soon after.
        sim.stop();
        let stopped = Instant::now();
        let mut last = None;
        let deadline = stopped + Duration::from_secs(120);
        while Instant::now() < deadline {
            last = lag(metrics).await;
            if matches!(last, Some((0, _, n)) if n > 0)
                && stopped.elapsed() > Duration::from_secs(1)
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let third = samples.len() / 3;
        let max = |s: &[(f64, u64, u64)]| s.iter().map(|x| x.1).max().unwrap_or(0);
        let min = |s: &[(f64, u64, u64)]| s.iter().map(|x| x.1).min().unwrap_or(0);
        let late_part = &samples[samples.len() - third..];
        let (first, late, late_min) = (max(&samples[..third]), max(late_part), min(late_part));
        let final_frames = last.map_or(u64::MAX, |l| l.0);
        row["lag"] = json!({
            "samples": samples.iter().map(|s| json!([s.0, s.1, s.2])).collect::<Vec<_>>(),
            "max_frames": max(&samples),
            "max_bytes": samples.iter().map(|x| x.2).max().unwrap_or(0),
            "first_third_max_frames": first, "last_third_max_frames": late,
            "last_third_min_frames": late_min,
            // Bounded: the lag comes and goes with shipping's windows and the machine's load;
            // one that grows never comes back down, so the last third's lowest sample would be
            // above everything of the first third.
            "bounded": third > 0 && late_min <= first,
            "final_frames": final_frames,
            "drain_s": (final_frames == 0).then(|| stopped.elapsed().as_secs_f64()),
            "shipped_frames": last.map_or(0, |l| l.2),
        });
    }
    Ok(row)
}

/// `gabp-relay collect` into a fresh archive until it holds `expected` frames.
async fn collect(
    bin: &Path,
    url: &str,
    key: &Path,
    archive: &Path,
    expected: u64,
) -> Result<Value> {
    let started = Instant::now();
    let mut child = Command::new(bin)
        .args(["collect", "--from", url, "--fleet-key"])
        .arg(key)
        .arg("--data-dir")
        .arg(archive)
        .env("GABP_LOG", "warn")
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()?;
    let deadline = started + Duration::from_secs(600);
    let mut polls = 0u64;
    let mut have = 0;
    let result = loop {
        if let Some(st) = child.try_wait()? {
            break Err(anyhow!("the collector exited early ({st})"));
        }
        if archive.join("CURRENT").exists() {
            if let Ok((f, _)) = recorded(bin, archive).await {
                polls += 1;
                have = f;
                if f >= expected {
                    break Ok(started.elapsed().as_secs_f64());
                }
            }
        }
        if Instant::now() > deadline {
            break Err(anyhow!(
                "the archive held {have} of {expected} frames after 600 s"
            ));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let _ = child.start_kill();
    let _ = child.wait().await;
    let secs = result?;
    Ok(json!({
        "frames": expected, "archive_frames": have, "seconds": secs,
        "frames_per_s": expected as f64 / secs, "polls": polls,
    }))
}

/// The text form of the document.
pub(crate) fn table(doc: &Value) -> String {
    let mut s = String::new();
    for (i, r) in doc["phases"].as_array().into_iter().flatten().enumerate() {
        let f = |v: &Value| v.as_f64().unwrap_or(0.0);
        let cpu = &r["cpu_cores"];
        s += &format!(
            "phase {i} {:<8} {:>6.2}s  delivered {:>12.0} ev/s  recorded {:>10}  cores: relay {:.2} nats {:.2} mod+bridges {:.2}, relay {:.3} us/event",
            if r["ship"] == true { "ship" } else { "no-ship" },
            f(&r["seconds"]),
            f(&r["events_per_s"]),
            r["recorded_frames"],
            f(&cpu["relay"]),
            f(&cpu["nats_server"]),
            f(&cpu["mod_and_bridges"]),
            f(&r["relay_cpu_us_per_delivered_event"]),
        );
        if r["ship"] == true {
            let l = &r["lag"];
            s += &format!(
                "  lag max {} frames / {} B (first third max {}, last third max {} min {}), bounded {}, drained to {} in {}",
                l["max_frames"],
                l["max_bytes"],
                l["first_third_max_frames"],
                l["last_third_max_frames"],
                l["last_third_min_frames"],
                l["bounded"],
                l["final_frames"],
                l["drain_s"]
                    .as_f64()
                    .map_or("-".into(), |d| format!("{d:.2}s"))
            );
        }
        s += "\n";
    }
    s += &format!(
        "ratio ship/no-ship {:.3} ({:.0} vs {:.0} ev/s); lag bounded and drained: {}\n",
        doc["ratio"].as_f64().unwrap_or(0.0),
        doc["with_ship_events_per_s"].as_f64().unwrap_or(0.0),
        doc["without_ship_events_per_s"].as_f64().unwrap_or(0.0),
        doc["lag_bounded_and_drained"]
    );
    if doc["collect"].is_object() {
        s += &format!(
            "collect: {} frames into a fresh archive in {:.2}s = {:.0} frames/s\n",
            doc["collect"]["frames"],
            doc["collect"]["seconds"].as_f64().unwrap_or(0.0),
            doc["collect"]["frames_per_s"].as_f64().unwrap_or(0.0)
        );
    }
    s
}
