//! `gabp-loadgen chaos`: honest bridges at a fixed rate and a tool caller, measured first alone
//! and then with every kind of hostile client running beside them (`actors::hostile`), against
//! the built relay with its metrics endpoint on. The relay's memory and descriptors are sampled
//! every 100 ms, its `/metrics` line count and data dir size are read after each phase. Every
//! process and temp dir started here is removed at the end, also on Ctrl-C or SIGTERM.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use gabp_client::Client;
use gabp_sim::{Addr, ModSim, ModSimConfig};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::signal::unix::{signal, SignalKind};
use tokio_util::sync::CancellationToken;

use crate::actors::hostile::{self, Counts, Kind};
use crate::actors::tally::Tally;
use crate::actors::{bridge, caller, Window};
use crate::procstat;
use crate::report::Measurement;
use crate::scenario::Scenario;
use crate::target::{RelayCommand, Target};

mod table;

use table::report;
pub use table::table;

/// Chaos settings.
#[derive(Debug, Clone)]
pub struct ChaosOptions {
    /// Measured time of each phase.
    pub phase: Duration,
    /// Time before each phase's measurement opens (hostile actors already running).
    pub warmup: Duration,
    /// Honest bridges, subscribed to every channel.
    pub bridges: usize,
    /// Mod events per second.
    pub rate: f64,
    /// Event body size.
    pub payload_bytes: usize,
    /// Honest tools/call per second (0: none).
    pub calls_per_s: f64,
    /// The relay's `--max-body`.
    pub max_body: usize,
    /// Hostile kinds run in the second phase.
    pub kinds: Vec<Kind>,
    /// Concurrent actors per hostile kind.
    pub workers: usize,
    /// Seed of the mod and the actors.
    pub seed: u64,
    /// The relay binary.
    pub relay_bin: PathBuf,
    /// Record the session.
    pub record: bool,
    /// Relay RSS at which the hostile actors are called off (protects the machine).
    pub rss_limit_mib: u64,
}

const MOD_TOKEN: &str = "chaos-mod-token";

/// `/metrics` lines the hostile phase may add over the quiet one (a few bounded series).
const METRICS_SLACK: u64 = 500;

/// What was started, so that it can be stopped whatever happened.
#[derive(Default)]
struct Held {
    sim: Option<ModSim>,
    target: Option<Target>,
    data: Option<tempfile::TempDir>,
}

impl Held {
    /// Stops the relay and the mod and removes the temp dir; the relay's exit status, `None`
    /// if it had to be killed (or never started).
    async fn release(self) -> Option<std::process::ExitStatus> {
        let status = match self.target {
            Some(t) => t.stop_status(Duration::from_secs(15)).await,
            None => None,
        };
        if let Some(sim) = self.sim {
            sim.stop();
        }
        if let Some(d) = self.data {
            let _ = d.close();
        }
        status
    }
}

/// Runs both phases and returns the report; `ok` says whether the honest bridges got every
/// event and call answer, the relay stayed under the RSS limit, its `/metrics` stayed bounded
/// and it exited cleanly. Latency is reported, not judged (it depends on the machine).
pub async fn run(o: ChaosOptions) -> Result<Value> {
    // From here on Ctrl-C and SIGTERM are ours: whatever is running is stopped and removed.
    let mut interrupt = signal(SignalKind::interrupt()).context("handling Ctrl-C")?;
    let mut terminate = signal(SignalKind::terminate()).context("handling SIGTERM")?;
    let mut held = Held::default();
    let stop = CancellationToken::new();
    let outcome = tokio::select! {
        r = phases(&o, &mut held, stop.clone()) => r,
        _ = interrupt.recv() => Err(anyhow!("interrupted; stopped the relay and the mod and removed the temp dir")),
        _ = terminate.recv() => Err(anyhow!("terminated; stopped the relay and the mod and removed the temp dir")),
    };
    stop.cancel();
    let status = held.release().await;
    let mut doc = outcome?;
    // Exited by itself within the bound, with success, after SIGTERM.
    let clean = status.is_some_and(|s| s.success());
    doc["relay_exit_clean"] = json!(clean);
    doc["relay_exit_code"] = json!(status.and_then(|s| s.code()));
    if !clean {
        doc["ok"] = json!(false);
    }
    Ok(doc)
}

async fn phases(o: &ChaosOptions, held: &mut Held, stop: CancellationToken) -> Result<Value> {
    let sc = Scenario {
        name: "chaos".into(),
        seed: o.seed,
        rate: o.rate,
        payload_bytes: o.payload_bytes,
        bridges: o.bridges,
        calls_per_s: o.calls_per_s,
        record: o.record,
        ..Scenario::default()
    };
    let sim = held.sim.insert(ModSim::start(
        &"127.0.0.1:0".parse::<Addr>().expect("literal"),
        ModSimConfig {
            token: MOD_TOKEN.into(),
            channels: sc.channels.clone(),
            rate: Some(o.rate),
            payload_bytes: o.payload_bytes,
            seed: o.seed,
            ..ModSimConfig::default()
        },
    )?);
    let tmp = held.data.insert(
        tempfile::Builder::new()
            .prefix("gabp-chaos-")
            .tempdir()
            .context("creating a temp dir")?,
    );
    let data_path = tmp.path().join("data");
    std::fs::create_dir(&data_path).context("creating the data dir")?;
    // The relay's own log: kept out of the report's stdout and counted per phase (a hostile
    // client must not be able to flood it either).
    let log_path = tmp.path().join("relay.log");
    let log = std::fs::File::create(&log_path).context("creating the relay log")?;
    let metrics = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let extra = [
        "--metrics".to_string(),
        metrics.to_string(),
        "--max-body".into(),
        o.max_body.to_string(),
    ];
    let started = Target::relay(
        &RelayCommand::Builtin(o.relay_bin.clone()),
        sim.addr(),
        MOD_TOKEN,
        &sc,
        &data_path,
        &extra,
        Some(log),
    )
    .await;
    let target = match started {
        Ok(t) => held.target.insert(t),
        Err(e) => {
            let text = std::fs::read_to_string(&log_path).unwrap_or_default();
            let last = text.lines().rev().take(3).collect::<Vec<_>>();
            let said: Vec<&str> = last.into_iter().rev().collect();
            return Err(e.context(format!("the relay said: {}", said.join(" / "))));
        }
    };
    let pid = target.pid().context("relay pid")?;
    eprintln!(
        "chaos: relay pid {pid}, data dir {}, metrics http://{metrics}/metrics",
        data_path.display()
    );
    // The metrics listener may come up just after the bridge listener.
    let since = Instant::now();
    let metrics_at_start = loop {
        match metrics_lines(metrics).await {
            Ok(n) => break n,
            Err(e) if since.elapsed() > Duration::from_secs(5) => return Err(e),
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    };
    let log_lines =
        || std::fs::read(&log_path).map_or(0, |b| b.iter().filter(|c| **c == b'\n').count() as u64);
    let mut quiet = phase(o, &sc, target, sim, pid, &[], &stop).await?;
    quiet.after = After {
        metrics_lines: metrics_lines(metrics).await.ok(),
        data_bytes: dir_bytes(&data_path),
        log_lines: log_lines(),
    };
    let mut hostile = phase(o, &sc, target, sim, pid, &o.kinds, &stop).await?;
    hostile.after = After {
        metrics_lines: metrics_lines(metrics).await.ok(),
        data_bytes: dir_bytes(&data_path),
        log_lines: log_lines(),
    };
    Ok(report(o, quiet, hostile, metrics_at_start))
}

/// One phase's figures.
struct Phase {
    honest: Measurement,
    samples: Samples,
    hostile: Vec<Value>,
    rss_limit_hit: bool,
    after: After,
}

/// What the relay left behind by the end of a phase (cumulative since it started).
#[derive(Debug, Default)]
struct After {
    metrics_lines: Option<u64>,
    data_bytes: u64,
    log_lines: u64,
}

/// Relay memory and descriptors over a phase.
#[derive(Debug, Default, Clone, Copy)]
struct Samples {
    n: u64,
    rss_start: u64,
    rss_peak: u64,
    rss_end: u64,
    fds_start: u64,
    fds_peak: u64,
    fds_end: u64,
    /// The relay process was gone at some sample.
    gone: bool,
}

async fn phase(
    o: &ChaosOptions,
    sc: &Scenario,
    target: &Target,
    sim: &ModSim,
    pid: u32,
    kinds: &[Kind],
    stop: &CancellationToken,
) -> Result<Phase> {
    let name = if kinds.is_empty() { "quiet" } else { "hostile" };
    let phase_stop = stop.child_token();
    let hostile_stop = phase_stop.child_token();
    let sampler_stop = CancellationToken::new();
    let rss_hit = Arc::new(AtomicBool::new(false));
    let sampler = tokio::spawn(sample(
        pid,
        o.rss_limit_mib << 20,
        hostile_stop.clone(),
        rss_hit.clone(),
        sampler_stop.clone(),
    ));
    let window = Arc::new(Window::default());
    let mut errors = Vec::new();
    let mut readers = Vec::new();
    for _ in 0..o.bridges {
        let c = bridge::connect(&target.addr, &target.token, &sc.channels)
            .await
            .with_context(|| format!("{name} phase: an honest bridge"))?;
        readers.push(tokio::spawn(bridge::read(
            c,
            0.0,
            Tally::new(window.clone(), None),
            phase_stop.clone(),
        )));
    }
    let calls = if o.calls_per_s > 0.0 {
        let (c, _) = Client::connect_hello(&target.addr, &target.token)
            .await
            .with_context(|| format!("{name} phase: the tool caller"))?;
        Some(tokio::spawn(caller::fixed_rate(
            c,
            "sim/echo".into(),
            json!({"n": 1}),
            o.calls_per_s,
            window.clone(),
            phase_stop.clone(),
        )))
    } else {
        None
    };
    // Hostile actors start with the warm-up, so the window opens on them in full swing.
    let deadline = Instant::now() + o.warmup + o.phase;
    let hostile_target = hostile::Target {
        addr: target.addr.clone(),
        token: target.token.clone(),
        channels: sc.channels.clone(),
        max_body: o.max_body,
        method_counter: Arc::new(AtomicU64::new(0)),
    };
    let mut actors = Vec::new();
    let counts: Vec<(Kind, Arc<Counts>)> = kinds
        .iter()
        .map(|k| (*k, Arc::new(Counts::default())))
        .collect();
    for (i, (kind, c)) in counts.iter().enumerate() {
        for w in 0..o.workers {
            let seed = o.seed ^ (((i as u64) << 32) | w as u64);
            actors.push(tokio::spawn(hostile::actor(
                *kind,
                hostile_target.clone(),
                c.clone(),
                seed,
                deadline,
                hostile_stop.clone(),
            )));
        }
    }
    tokio::time::sleep(o.warmup).await;
    let cpu_before = procstat::sample(pid).map_or(0.0, |s| s.cpu_s);
    let emitted_before = sim.emitted();
    window.set(true);
    let opened = Instant::now();
    tokio::time::sleep(o.phase).await;
    window.set(false);
    let window_s = opened.elapsed().as_secs_f64();
    let published = sim.emitted() - emitted_before;
    let cpu_after = procstat::sample(pid).map_or(cpu_before, |s| s.cpu_s);
    hostile_stop.cancel();
    for a in actors {
        let _ = a.await;
    }
    phase_stop.cancel();
    let mut m = Measurement::new(name, window_s);
    m.published = published;
    m.add_readers(readers, "honest bridge", &mut errors).await;
    if let Some(c) = calls {
        match c.await {
            Ok(r) => m.set_calls(&r),
            Err(e) => errors.push(format!("tool caller: {e}")),
        }
    }
    sampler_stop.cancel();
    let samples = sampler.await.unwrap_or_default();
    if samples.gone {
        errors.push("the relay exited during the phase".into());
    }
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    m.cpu_percent = (cpu_after - cpu_before) / window_s * 100.0;
    m.peak_rss_mib = mib(samples.rss_peak);
    m.end_rss_mib = mib(samples.rss_end);
    m.fds = samples.fds_peak;
    m.errors = errors;
    Ok(Phase {
        honest: m,
        samples,
        hostile: counts
            .iter()
            .map(|(k, c)| c.summary(*k, o.workers))
            .collect(),
        rss_limit_hit: rss_hit.load(Ordering::Relaxed),
        after: After::default(),
    })
}

/// Samples the relay every 100 ms until `done`; past `limit` bytes of RSS, calls off the
/// hostile actors (`hostile`) and says so in `hit`.
async fn sample(
    pid: u32,
    limit: u64,
    hostile: CancellationToken,
    hit: Arc<AtomicBool>,
    done: CancellationToken,
) -> Samples {
    let mut s = Samples::default();
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = done.cancelled() => break,
            _ = tick.tick() => {}
        }
        let Some(p) = procstat::sample(pid) else {
            s.gone = true;
            break;
        };
        if s.n == 0 {
            (s.rss_start, s.fds_start) = (p.rss, p.fds);
        }
        s.n += 1;
        s.rss_peak = s.rss_peak.max(p.rss);
        s.fds_peak = s.fds_peak.max(p.fds);
        (s.rss_end, s.fds_end) = (p.rss, p.fds);
        if p.rss > limit && !hit.swap(true, Ordering::Relaxed) {
            hostile.cancel();
        }
    }
    s
}

/// Lines of the relay's `/metrics` page.
async fn metrics_lines(addr: std::net::SocketAddr) -> Result<u64> {
    let get = async {
        let mut s = tokio::net::TcpStream::connect(addr).await?;
        s.write_all(
            format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        )
        .await?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await?;
        Ok::<_, std::io::Error>(buf)
    };
    let buf = tokio::time::timeout(Duration::from_secs(20), get)
        .await
        .map_err(|_| anyhow!("the relay's metrics page did not load within 20 s"))?
        .context("reading the relay's metrics page")?;
    let text = String::from_utf8_lossy(&buf);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| anyhow!("the relay's metrics page is not HTTP"))?;
    if !head.starts_with("HTTP/1.1 200") {
        bail!(
            "the relay's metrics page answered {}",
            head.lines().next().unwrap_or("")
        );
    }
    Ok(body.lines().count() as u64)
}

/// Bytes under `dir`.
fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir).map_or(0, |entries| {
        entries
            .filter_map(Result::ok)
            .map(|e| match e.file_type() {
                Ok(t) if t.is_dir() => dir_bytes(&e.path()),
                Ok(_) => e.metadata().map_or(0, |m| m.len()),
                Err(_) => 0,
            })
            .sum()
    })
}
