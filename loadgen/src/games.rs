//! `gabp-loadgen games`: what one relay serving N games costs, against N relays of one game
//! each and against no relay. A game is a simulated mod publishing at a fixed rate, its
//! reading bridges, and one agent calling a tool in a closed loop (concurrency 1). Layouts:
//! `one-relay` (one `gabp-relay` process, one route per game from a config file, one data
//! dir), `relay-per-game` (one process and data dir per game), `direct` (the bridges and the
//! agent on the mod itself). Each round measures every route count in every layout, the
//! layouts' order turned by one from round to round, so drift on the machine hits each alike.
//!
//! Every measurement starts its own mods (threads of this process, beside the bridges and
//! agents on this process's one runtime), relay processes and data dirs, and stops and removes
//! them before the next; it never measures a relay it did not start. The checks it reports
//! are computed from the measured medians, never assumed.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _, Result};
use clap::Args;
use futures::{StreamExt, TryStreamExt};
use gabp_client::Client;
use gabp_rt::display::{self, Align, Table};
use gabp_sim::{Addr, ModSim, ModSimConfig};
use serde::Serialize;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use crate::actors::{bridge, caller, latency_histogram, tally::Tally, Window};
use crate::args::{parse_rounds, ScenarioArgs};
use crate::context::{Context, Watch};
use crate::figures::{self, Unit};
use crate::procstat;
use crate::report::Percentiles;
use crate::scenario::Scenario;
use crate::spread::{self, Stats};
use crate::target::{self, RelayCommand, Target};

/// The scenario when no `--scenario` is given: the shipped `many-games.toml`.
const DEFAULT_SCENARIO: &str = include_str!("../scenarios/many-games.toml");

/// The token every simulated mod wants (the relays present it; the direct layout too).
const MOD_TOKEN: &str = "loadgen-mod-token";

/// The tool each agent calls, and its arguments.
const TOOL: &str = "sim/echo";

/// The most games one measurement runs.
const MAX_ROUTES: usize = 256;

/// A route's calls/s may be this many times below the single route's and still pass.
const CALLS_WITHIN: f64 = 1.2;

/// How the games reach their mods.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Layout {
    /// One relay process, a route per game, one data dir.
    OneRelay,
    /// A relay process and a data dir per game.
    RelayPerGame,
    /// No relay: bridges and agents straight to the mods.
    Direct,
}

impl Layout {
    /// The key of its results in the JSON document.
    fn key(self) -> &'static str {
        match self {
            Layout::OneRelay => "one_relay",
            Layout::RelayPerGame => "relay_per_game",
            Layout::Direct => "direct",
        }
    }

    /// For a person.
    fn label(self) -> &'static str {
        match self {
            Layout::OneRelay => "one relay",
            Layout::RelayPerGame => "a relay per game",
            Layout::Direct => "no relay",
        }
    }

    fn relays(self) -> bool {
        self != Layout::Direct
    }
}

#[derive(Args, Debug)]
pub(crate) struct GamesArgs {
    #[command(flatten)]
    pub(crate) scenario: ScenarioArgs,
    /// Games (routes) to measure, each in every layout (comma separated).
    #[arg(long, value_delimiter = ',', default_value = "1,8,32")]
    pub(crate) routes: Vec<usize>,
    /// Layouts (comma separated): one-relay (one relay process, a route per game, one data
    /// dir), relay-per-game (a relay process and data dir per game), direct (no relay).
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "one-relay,relay-per-game,direct"
    )]
    pub(crate) layouts: Vec<Layout>,
    /// Rounds: each measures every route count in every layout, the layouts' order turned by
    /// one each round; figures are the medians with their spread (min–max).
    #[arg(long, default_value_t = 1, value_parser = parse_rounds)]
    pub(crate) rounds: usize,
    /// The gabp-relay binary (default: next to this one).
    #[arg(long)]
    pub(crate) relay_bin: Option<PathBuf>,
    /// Print one JSON document.
    #[arg(long)]
    pub(crate) json: bool,
}

/// The scenario: the shipped one (or `--scenario`), flags on top; refused where it asks for
/// what this command does not run.
fn scenario(a: &ScenarioArgs) -> Result<Scenario> {
    let base: Scenario = toml::from_str(DEFAULT_SCENARIO).expect("the shipped scenario parses");
    let sc = a.scenario_or(base)?;
    if sc.rate <= 0.0 {
        bail!("games publish at a fixed --rate (events/s per game), not max");
    }
    if sc.bridges == 0 {
        bail!("games need at least one reading bridge each (--bridges)");
    }
    for (what, n) in [
        ("--stalled", sc.stalled as f64),
        ("--calls-per-s", sc.calls_per_s),
        ("--one-channel-bridges", sc.one_channel_bridges as f64),
    ] {
        if n != 0.0 {
            bail!("games does not run {what}: each game has one agent calling {TOOL} in a closed loop");
        }
    }
    Ok(sc)
}

/// The simulated mods of one measurement, stopped when dropped.
struct Mods(Vec<ModSim>);

impl Mods {
    fn start(n: usize, sc: &Scenario) -> Result<Mods> {
        let mut mods = Mods(Vec::with_capacity(n));
        for i in 0..n {
            let cfg = ModSimConfig {
                token: MOD_TOKEN.into(),
                channels: sc.channels.clone(),
                rate: sc.mod_rate(),
                payload_bytes: sc.payload_bytes,
                seed: sc.seed.wrapping_add(i as u64),
                tick: sc.tick(),
                ..ModSimConfig::default()
            };
            let addr: Addr = "127.0.0.1:0".parse().map_err(|e: String| anyhow!(e))?;
            mods.0
                .push(ModSim::start(&addr, cfg).context("starting a simulated mod")?);
        }
        Ok(mods)
    }

    fn stop(&self) {
        for m in &self.0 {
            m.stop();
        }
    }

    fn emitted(&self) -> u64 {
        self.0.iter().map(ModSim::emitted).sum()
    }
}

impl Drop for Mods {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Where a game's bridges and agent connect.
#[derive(Clone)]
struct Game {
    addr: Addr,
    token: String,
}

/// Waits until a bridge completes a hello on `game` (a route of a relay already started).
async fn wait_hello(game: &Game) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let hello = tokio::time::timeout(
            Duration::from_secs(2),
            Client::connect_hello(&game.addr, &game.token),
        )
        .await;
        if let Ok(Ok((c, _))) = hello {
            let _ = c.close().await;
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "the relay's route on {} did not welcome a bridge within 20 s",
                game.addr
            );
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// A bridge on each game's relay, connected while the mods still run (a hello waits while a
/// route has no mod), to ask `relay/status` once they stop.
async fn watchers(games: &[Game]) -> Vec<Option<Client>> {
    futures::future::join_all(games.iter().map(|g| async {
        Client::connect_hello(&g.addr, &g.token)
            .await
            .ok()
            .map(|(c, _)| c)
    }))
    .await
}

/// Waits until the relay `watcher` is connected to no longer has its mod's session (it read
/// the mod's stream to its end, so every event the mod wrote reached it); gives up after 10 s.
async fn wait_mod_gone(watcher: Option<Client>) {
    let Some(mut c) = watcher else {
        return;
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        let status =
            tokio::time::timeout(Duration::from_secs(2), c.call("relay/status", json!({}))).await;
        match status {
            Ok(Ok(s)) if s["session"].is_null() => break,
            Ok(Err(_)) => break,
            _ => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    }
    let _ = c.close().await;
}

/// The config file of the one relay: a route per game (`game-1`…), one data dir.
fn one_relay_config(
    data_dir: &Path,
    sc: &Scenario,
    mods: &Mods,
) -> Result<(toml::Table, Vec<Game>)> {
    let mut routes = Vec::new();
    let mut games = Vec::new();
    // Free ports for every route, each held until all are chosen (a port let go is the
    // kernel's to hand out again) and let go for the relay to bind.
    let held: Vec<std::net::TcpListener> = (0..mods.0.len())
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0"))
        .collect::<std::io::Result<_>>()?;
    let ports: Vec<std::net::SocketAddr> = held
        .iter()
        .map(|l| l.local_addr())
        .collect::<std::io::Result<_>>()?;
    drop(held);
    for (i, (m, port)) in mods.0.iter().zip(ports).enumerate() {
        let listen = port.to_string();
        let token = uuid::Uuid::new_v4().simple().to_string();
        let mut r = toml::Table::new();
        r.insert("name".into(), format!("game-{}", i + 1).into());
        r.insert("upstream".into(), m.addr().to_string().into());
        r.insert("upstream_token".into(), MOD_TOKEN.into());
        r.insert("listen".into(), listen.clone().into());
        r.insert("token".into(), token.clone().into());
        r.insert("on_slow".into(), sc.policy.clone().into());
        r.insert("record".into(), sc.record.into());
        routes.push(toml::Value::Table(r));
        games.push(Game {
            addr: listen.parse().map_err(|e: String| anyhow!(e))?,
            token,
        });
    }
    let mut t = toml::Table::new();
    t.insert("data_dir".into(), data_dir.display().to_string().into());
    t.insert("durability".into(), sc.durability.clone().into());
    t.insert("route".into(), toml::Value::Array(routes));
    Ok((t, games))
}

/// The relay processes of a layout and where each game connects.
async fn start_relays(
    layout: Layout,
    bin: &Path,
    sc: &Scenario,
    mods: &Mods,
    dir: &Path,
) -> Result<(Vec<Target>, Vec<Game>)> {
    match layout {
        Layout::Direct => Ok((
            Vec::new(),
            mods.0
                .iter()
                .map(|m| Game {
                    addr: m.addr().clone(),
                    token: MOD_TOKEN.into(),
                })
                .collect(),
        )),
        Layout::OneRelay => {
            let (config, games) = one_relay_config(&dir.join("data"), sc, mods)?;
            // The file holds tokens: readable by this user alone (the relay refuses a file
            // others may write).
            let path = dir.join("relay.toml");
            {
                use std::io::Write;
                use std::os::unix::fs::OpenOptionsExt;
                let mut f = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(&path)?;
                f.write_all(toml::to_string(&config)?.as_bytes())?;
            }
            let log = std::fs::File::create(dir.join("relay.log"))?;
            let relay = Target::relay_config(
                bin,
                &path,
                games[0].addr.clone(),
                games[0].token.clone(),
                Some(log),
            )
            .await
            .map_err(|e| with_log(e, &dir.join("relay.log")))?;
            for g in &games[1..] {
                wait_hello(g).await?;
            }
            Ok((vec![relay], games))
        }
        Layout::RelayPerGame => {
            let cmd = RelayCommand::Builtin(bin.to_path_buf());
            // One at a time: each picks a free port and binds it before the next picks one.
            let relays: Vec<Target> = futures::stream::iter(mods.0.iter().enumerate())
                .map(|(i, m)| {
                    let (cmd, data) = (cmd.clone(), dir.join(format!("data-{}", i + 1)));
                    let log = dir.join(format!("relay-{}.log", i + 1));
                    async move {
                        let file = std::fs::File::create(&log)?;
                        Target::relay(&cmd, m.addr(), MOD_TOKEN, sc, &data, &[], Some(file))
                            .await
                            .map_err(|e| with_log(e, &log))
                    }
                })
                .buffered(1)
                .try_collect()
                .await?;
            let games = relays
                .iter()
                .map(|r| Game {
                    addr: r.addr.clone(),
                    token: r.token.clone(),
                })
                .collect();
            Ok((relays, games))
        }
    }
}

/// Disk used under `path` (as `du` counts it: allocated blocks), in bytes.
fn disk_usage(path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return 0;
    };
    let own = meta.blocks() * 512;
    if !meta.is_dir() {
        return own;
    }
    own + std::fs::read_dir(path)
        .map(|d| {
            d.filter_map(Result::ok)
                .map(|e| disk_usage(&e.path()))
                .sum::<u64>()
        })
        .unwrap_or(0)
}

/// A relay's start-up failure with the last lines it logged.
fn with_log(e: anyhow::Error, log: &Path) -> anyhow::Error {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let tail: Vec<&str> = text.lines().rev().take(3).collect();
    if tail.is_empty() {
        return e;
    }
    let tail: Vec<String> = tail.iter().rev().map(|l| display::text(l, 300)).collect();
    e.context(format!("its log ends: {}", tail.join(" | ")))
}

/// The relays' logs (their stderr) say a mod became unreachable when the run stops its mods;
/// errors are worth showing.
fn report_relay_errors(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.filter_map(Result::ok) {
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.ends_with(".log") {
            continue;
        }
        let text = std::fs::read_to_string(e.path()).unwrap_or_default();
        for line in text.lines().filter(|l| l.contains("ERROR")).take(5) {
            eprintln!("{name}: {}", display::text(line, 400));
        }
    }
}

/// CPU seconds of these processes together (those still running).
fn cpu_of(pids: &[u32]) -> f64 {
    pids.iter()
        .filter_map(|p| procstat::sample(*p))
        .map(|s| s.cpu_s)
        .sum()
}

/// One measurement: `n` games in `layout`, started, warmed up, measured and stopped.
async fn measure(
    layout: Layout,
    n: usize,
    sc: &Scenario,
    bin: &Path,
    say: &dyn Fn(&str),
) -> Result<Value> {
    let dir = tempfile::Builder::new()
        .prefix("gabp-loadgen-games-")
        .tempdir()?;
    say(&format!("{}, {}: starting", games_word(n), layout.label()));
    let mods = Mods::start(n, sc)?;
    let (relays, games) = start_relays(layout, bin, sc, &mods, dir.path()).await?;
    let window = Arc::new(Window::default());
    let stop = CancellationToken::new();
    let mut readers = Vec::new();
    let mut agents = Vec::new();
    for g in &games {
        for b in 0..sc.bridges {
            let c = bridge::connect(&g.addr, &g.token, sc.channels_of(b))
                .await
                .with_context(|| format!("a bridge on {}", g.addr))?;
            readers.push(tokio::spawn(bridge::read(
                c,
                sc.read_rate,
                Tally::new(window.clone(), None),
                stop.clone(),
            )));
        }
    }
    for g in &games {
        let (c, _) = Client::connect_hello(&g.addr, &g.token)
            .await
            .with_context(|| format!("an agent on {}", g.addr))?;
        agents.push(tokio::spawn(caller::fixed_concurrency(
            vec![c],
            TOOL.into(),
            json!({"n": 1}),
            window.clone(),
            stop.clone(),
        )));
    }
    say(&format!(
        "{}, {}: warming up",
        games_word(n),
        layout.label()
    ));
    tokio::time::sleep(sc.warmup()).await;
    let pids: Vec<u32> = relays.iter().filter_map(Target::pid).collect();
    let me = [std::process::id()];
    let (relay0, own0, machine0) = (cpu_of(&pids), cpu_of(&me), procstat::machine_cpu());
    window.set(true);
    let opened = Instant::now();
    say(&format!("{}, {}: measuring", games_word(n), layout.label()));
    tokio::time::sleep(sc.duration()).await;
    window.set(false);
    let secs = opened.elapsed().as_secs_f64();
    let (relay1, own1, machine1) = (cpu_of(&pids), cpu_of(&me), procstat::machine_cpu());
    let rss: u64 = pids
        .iter()
        .filter_map(|p| procstat::sample(*p))
        .map(|s| s.rss)
        .sum();
    stop.cancel();
    let (mut delivered, mut dropped, mut gaps, mut disconnects) = (0u64, 0u64, 0u64, 0u64);
    for r in readers {
        let r = r.await?;
        delivered += r.events;
        dropped += r.dropped;
        gaps += r.unannounced_gaps;
        disconnects += u64::from(r.disconnected);
    }
    let mut latency = latency_histogram();
    let (mut calls, mut errors, mut unanswered) = (0u64, 0u64, 0u64);
    let mut per_agent = Vec::new();
    for a in agents {
        let r = a.await?;
        calls += r.calls;
        errors += r.errors;
        unanswered += r.unanswered;
        per_agent.push(r.calls as f64 / secs);
        let _ = latency.add(&r.latency);
    }
    say(&format!("{}, {}: stopping", games_word(n), layout.label()));
    // The mods stop first: each relay then reads its mod's stream to the end, so what the
    // mods wrote is what the relays recorded, and the data dirs are measured once the relays
    // have stopped and flushed.
    let watching = if layout.relays() {
        watchers(&games).await
    } else {
        Vec::new()
    };
    mods.stop();
    futures::future::join_all(watching.into_iter().map(wait_mod_gone)).await;
    let recorded = mods.emitted();
    futures::future::join_all(relays.into_iter().map(|r| r.stop(Duration::from_secs(15)))).await;
    let relay_cpu = (relay1 - relay0).max(0.0) / secs;
    let loadgen_cpu = (own1 - own0).max(0.0) / secs;
    let others = machine0
        .zip(machine1)
        .map(|(a, b)| ((b.processes_s - a.processes_s) / secs - relay_cpu - loadgen_cpu).max(0.0));
    let agent_rates = Stats::of(&per_agent);
    let mut doc = json!({
        "routes": n,
        "relay_processes": pids.len(),
        "duration_s": secs,
        "scheduled_eps": n as f64 * sc.rate * sc.bridges as f64,
        "delivered": delivered,
        "delivered_eps": delivered as f64 / secs,
        "dropped": dropped,
        "unannounced_gaps": gaps,
        "disconnects": disconnects,
        "calls": calls,
        "calls_per_s": calls as f64 / secs,
        "call_errors": errors,
        "unanswered": unanswered,
        "per_agent_median_calls_per_s": agent_rates.as_ref().map(|s| s.median),
        "per_agent_min_calls_per_s": agent_rates.as_ref().map(|s| s.min),
        "per_agent_max_calls_per_s": agent_rates.as_ref().map(|s| s.max),
        "call_latency_us": Percentiles::of(&latency),
        "loadgen_cpu_cores": loadgen_cpu,
        "others_cpu_cores": others,
    });
    if layout.relays() {
        let disk: u64 = std::fs::read_dir(dir.path())?
            .filter_map(Result::ok)
            .filter(|e| e.file_name().to_string_lossy().starts_with("data"))
            .map(|e| disk_usage(&e.path()))
            .sum();
        let rss_mib = rss as f64 / f64::from(1 << 20);
        doc["relay_cpu_cores"] = json!(relay_cpu);
        doc["relay_rss_mib"] = json!(rss_mib);
        doc["relay_rss_per_route_mib"] = json!(rss_mib / n as f64);
        if sc.record {
            doc["disk_bytes"] = json!(disk);
            doc["events_recorded"] = json!(recorded);
            if recorded > 0 {
                doc["disk_bytes_per_event"] = json!(disk as f64 / recorded as f64);
            }
        }
    }
    report_relay_errors(dir.path());
    drop(dir);
    Ok(doc)
}

/// A figure of a merged result: its median, or `None`.
fn num(doc: &Value, path: &str) -> Option<f64> {
    spread::at(doc, path).and_then(Value::as_f64)
}

/// The path of a figure of `layout` at `n` routes.
fn path(layout: Layout, n: usize, figure: &str) -> String {
    format!("results.{}.routes_{n}.{figure}", layout.key())
}

/// A figure with its spread, for the table.
fn cell(doc: &Value, layout: Layout, n: usize, figure: &str) -> String {
    let p = path(layout, n, figure);
    spread::cell(
        num(doc, &p),
        spread::of(doc, &p).as_ref(),
        figures::unit(&p),
    )
}

/// The acceptance checks, from the merged medians: per route count above one, one relay's CPU
/// against a relay per game's, and the slowest agent behind one relay against the single
/// route's agent.
fn checks(doc: &Value, routes: &[usize], layouts: &[Layout]) -> Vec<Value> {
    let has = |l: Layout| layouts.contains(&l);
    let mut out = Vec::new();
    for &n in routes.iter().filter(|n| **n > 1) {
        if has(Layout::OneRelay) && has(Layout::RelayPerGame) {
            let p1 = path(Layout::OneRelay, n, "relay_cpu_cores");
            let pn = path(Layout::RelayPerGame, n, "relay_cpu_cores");
            if let (Some(one), Some(many)) = (num(doc, &p1), num(doc, &pn)) {
                let overlap = spread::of(doc, &p1)
                    .zip(spread::of(doc, &pn))
                    .filter(|(a, b)| a.n > 1 && b.n > 1)
                    .map(|(a, b)| a.overlaps(&b));
                out.push(json!({
                    "check": "one_relay_cpu_at_most_relay_per_game",
                    "routes": n,
                    "one_relay_cpu_cores": one,
                    "relay_per_game_cpu_cores": many,
                    "ratio": (many > 0.0).then(|| one / many),
                    "ranges_overlap": overlap,
                    "pass": one <= many,
                }));
            }
        }
        if has(Layout::OneRelay) && routes.contains(&1) {
            let single = num(
                doc,
                &path(Layout::OneRelay, 1, "per_agent_median_calls_per_s"),
            );
            let slowest = num(doc, &path(Layout::OneRelay, n, "per_agent_min_calls_per_s"));
            if let (Some(single), Some(slowest)) = (single, slowest) {
                let ratio = (slowest > 0.0).then(|| single / slowest);
                // How far the rounds let the ratio move: the single game at its slowest
                // against the slowest agent at its fastest, and the other way round.
                let single_p = path(Layout::OneRelay, 1, "per_agent_median_calls_per_s");
                let slowest_p = path(Layout::OneRelay, n, "per_agent_min_calls_per_s");
                let range = spread::of(doc, &single_p)
                    .zip(spread::of(doc, &slowest_p))
                    .filter(|(a, b)| a.n > 1 && b.n > 1 && b.min > 0.0 && b.max > 0.0)
                    .map(|(a, b)| [a.min / b.max, a.max / b.min]);
                out.push(json!({
                    "check": "calls_per_route_within_1_2x_of_single_route",
                    "layout": Layout::OneRelay.key(),
                    "routes": n,
                    "single_route_calls_per_s": single,
                    "slowest_agent_calls_per_s": slowest,
                    "ratio": ratio,
                    "ratio_range": range,
                    "limit": CALLS_WITHIN,
                    "pass": ratio.is_some_and(|r| r <= CALLS_WITHIN),
                }));
            }
        }
    }
    out
}

/// `1 game`, `8 games`.
fn games_word(n: usize) -> String {
    if n == 1 {
        "1 game".into()
    } else {
        format!("{n} games")
    }
}

fn pass_word(v: &Value) -> &'static str {
    if v["pass"] == true {
        "PASS"
    } else {
        "FAIL"
    }
}

/// The human report: the table, the checks, and what limited the run.
fn text(doc: &Value, routes: &[usize], layouts: &[Layout], cores: f64) -> String {
    use std::fmt::Write;
    let mut t = Table::new(&[
        ("GAMES", Align::Right, 6),
        ("LAYOUT", Align::Left, 18),
        ("DELIVERED/S", Align::Right, 28),
        ("GAPS", Align::Right, 8),
        ("DROPS", Align::Right, 12),
        ("CALLS/S (ALL)", Align::Right, 28),
        ("CALLS/S PER AGENT", Align::Right, 28),
        ("SLOWEST AGENT", Align::Right, 28),
        ("CALL p99", Align::Right, 28),
        ("RELAY CPU (cores)", Align::Right, 24),
        ("RELAY RSS/GAME", Align::Right, 28),
        ("DISK/EVENT (B)", Align::Right, 20),
        ("LOADGEN CPU (cores)", Align::Right, 24),
    ]);
    for &n in routes {
        for &l in layouts {
            let c = |f: &str| cell(doc, l, n, f);
            t.row(vec![
                n.to_string(),
                l.label().into(),
                c("delivered_eps"),
                c("unannounced_gaps"),
                c("dropped"),
                c("calls_per_s"),
                c("per_agent_median_calls_per_s"),
                c("per_agent_min_calls_per_s"),
                c("call_latency_us.p99"),
                c("relay_cpu_cores"),
                c("relay_rss_per_route_mib"),
                c("disk_bytes_per_event"),
                c("loadgen_cpu_cores"),
            ]);
        }
    }
    let rounds = doc["round_results"].as_array().map_or(1, Vec::len);
    let mut o = String::new();
    if rounds > 1 {
        let _ = writeln!(o, "median of {rounds} rounds (min–max):");
    }
    o.push_str(&t.render());
    let _ = writeln!(
        o,
        "\nRELAY CPU sums the relay processes (one, or one per game); RELAY RSS/GAME is their RSS at the end of the window over the games; DISK/EVENT is the data dir(s) after the relays stopped over the events the mods wrote to them. LOADGEN CPU is this process: the mods, the bridges and the agents."
    );
    let checks = doc["checks"].as_array().cloned().unwrap_or_default();
    if !checks.is_empty() {
        let _ = writeln!(o, "\nchecks (from the medians above):");
    }
    for c in &checks {
        let n = c["routes"].as_u64().unwrap_or(0);
        let v = |k: &str| c[k].as_f64();
        match c["check"].as_str() {
            Some("one_relay_cpu_at_most_relay_per_game") => {
                let noise = match c["ranges_overlap"].as_bool() {
                    Some(true) => "; the rounds' ranges overlap: within noise",
                    Some(false) => "; the rounds' ranges do not overlap",
                    None => "; one round: noise unknown",
                };
                let _ = writeln!(
                    o,
                    "  {}  one relay for {n} games costs no more CPU than {n} relays: {:.2} against {:.2} cores{}{noise}",
                    pass_word(c),
                    v("one_relay_cpu_cores").unwrap_or(f64::NAN),
                    v("relay_per_game_cpu_cores").unwrap_or(f64::NAN),
                    v("ratio").map_or(String::new(), |r| format!(" (×{r:.2})")),
                );
            }
            Some(_) => {
                let range = c["ratio_range"].as_array().and_then(|r| {
                    let (lo, hi) = (r.first()?.as_f64()?, r.get(1)?.as_f64()?);
                    let side = |x: f64| x <= CALLS_WITHIN;
                    let verdict = if side(lo) == side(hi) {
                        "every round on the same side of the limit"
                    } else {
                        "the rounds' ranges cross the limit: within noise"
                    };
                    Some(format!("; ×{lo:.2}–{hi:.2} over the rounds, {verdict}"))
                });
                let _ = writeln!(
                    o,
                    "  {}  behind one relay, every one of {n} games' agents within {CALLS_WITHIN}× of the single game's calls/s: slowest {} against {}{}{}",
                    pass_word(c),
                    figures::value(v("slowest_agent_calls_per_s").unwrap_or(0.0), Unit::PerSecond),
                    figures::value(v("single_route_calls_per_s").unwrap_or(0.0), Unit::PerSecond),
                    v("ratio").map_or(" (no call answered)".into(), |r| format!(" ({r:.2}× slower)")),
                    range.unwrap_or_else(|| "; one round: noise unknown".into()),
                );
            }
            None => {}
        }
    }
    let notes = limits(doc, routes, layouts, cores);
    if notes.is_empty() {
        let _ = writeln!(
            o,
            "\nlimits: no measurement filled the machine or fell behind the mods' schedule"
        );
    } else {
        let _ = writeln!(
            o,
            "\nlimits (closed-loop agents take whatever CPU is left, so a full machine is expected; whose CPU filled it is not):"
        );
        for n in notes {
            let _ = writeln!(o, "  {n}");
        }
    }
    o
}

/// What limited each measurement that filled the machine or fell behind the mods' schedule:
/// the machine's cores, and whose CPU filled them. A line each.
fn limits(doc: &Value, routes: &[usize], layouts: &[Layout], cores: f64) -> Vec<String> {
    let mut notes = Vec::new();
    for &n in routes {
        for &l in layouts {
            let g = |f: &str| num(doc, &path(l, n, f));
            let (lg, relay, others) = (
                g("loadgen_cpu_cores").unwrap_or(0.0),
                g("relay_cpu_cores").unwrap_or(0.0),
                g("others_cpu_cores").unwrap_or(0.0),
            );
            let behind = g("delivered_eps")
                .zip(g("scheduled_eps"))
                .is_some_and(|(d, s)| d < 0.98 * s);
            let saturated = lg + relay + others >= 0.9 * cores;
            if !(saturated || behind) {
                continue;
            }
            let mut line = format!(
                "{}, {}: loadgen {lg:.2} + relay {relay:.2} + other processes {others:.2} of {cores} cores",
                games_word(n),
                l.label()
            );
            if behind {
                line.push_str("; delivered less than the mods' schedule");
            }
            if saturated && lg >= relay {
                line.push_str("; the machine was saturated and the harness (mods, bridges, agents) used more of it than the relay: these figures are the machine's limit, not the relay's alone");
            } else if saturated {
                line.push_str("; the machine was saturated");
            }
            notes.push(line);
        }
    }
    notes
}

/// The command.
pub(crate) async fn main(a: GamesArgs) -> Result<()> {
    let watch = Watch::start();
    let sc = scenario(&a.scenario)?;
    let mut routes: Vec<usize> = Vec::new();
    for &n in &a.routes {
        if !(1..=MAX_ROUTES).contains(&n) {
            bail!("--routes takes counts from 1 to {MAX_ROUTES}, not {n}");
        }
        if !routes.contains(&n) {
            routes.push(n);
        }
    }
    let mut layouts: Vec<Layout> = Vec::new();
    for &l in &a.layouts {
        if !layouts.contains(&l) {
            layouts.push(l);
        }
    }
    if routes.is_empty() || layouts.is_empty() {
        bail!("give at least one --routes count and one --layouts");
    }
    let bin = a
        .relay_bin
        .clone()
        .unwrap_or_else(|| target::sibling("gabp-relay"));
    if layouts.iter().any(|l| l.relays()) && !bin.exists() {
        bail!(
            "{} is missing (build it, or give --relay-bin)",
            bin.display()
        );
    }
    let pb = if a.json { None } else { crate::progress_bar() };
    let mut rounds = Vec::new();
    for i in 0..a.rounds {
        let mut order = layouts.clone();
        order.rotate_left(i % layouts.len());
        let mut round = json!({"results": {}});
        for &n in &routes {
            for &l in &order {
                let say = |m: &str| {
                    if let Some(pb) = &pb {
                        pb.set_message(format!("round {}/{}: {m}", i + 1, a.rounds));
                    }
                };
                let m = measure(l, n, &sc, &bin, &say).await?;
                round["results"][l.key()][format!("routes_{n}")] = m;
            }
        }
        rounds.push(round);
    }
    if let Some(pb) = pb {
        pb.finish_and_clear();
    }
    let ctx: Context = watch.finish();
    let mut doc = spread::merge(rounds);
    doc["checks"] = json!(checks(&doc, &routes, &layouts));
    let config = json!({
        "routes": routes,
        "layouts": layouts,
        "rounds": a.rounds,
        "agents_per_game": 1,
        "agent_concurrency": 1,
        "tool": TOOL,
        "relay": bin.display().to_string(),
        "data_dirs": "one_relay: one for the relay; relay_per_game: one per relay",
        "order": "each round: every route count, each in every layout, the layouts' order turned by one each round",
    });
    doc["config"] = config;
    doc["scenario"] = serde_json::to_value(&sc)?;
    doc["context"] = ctx.to_json();
    if let Some(w) = ctx.warning() {
        doc["warnings"] = json!([w]);
    }
    let cores = ctx.machine["cores"].as_f64().unwrap_or(1.0);
    doc["limits"] = json!(limits(&doc, &routes, &layouts, cores));
    if a.json {
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        for (k, v) in ctx.lines() {
            println!("{k:<8} {v}");
        }
        println!(
            "config   {} games: a mod each at {} events/s ({} B, {} channels{}), {} reading bridges, 1 agent calling {TOOL} (closed loop, concurrency 1); policy {}, recording {}{}; {} s measured after {} s warm-up, {} round{}",
            display::text(
                &routes.iter().map(usize::to_string).collect::<Vec<_>>().join(","),
                40
            ),
            sc.rate,
            sc.payload_bytes,
            sc.channels.len(),
            if sc.tick_ms > 0.0 {
                format!(", written every {} ms", sc.tick_ms)
            } else {
                String::new()
            },
            sc.bridges,
            display::text(&sc.policy, 24),
            if sc.record { "on" } else { "off" },
            if sc.record {
                format!(" (durability {})", display::text(&sc.durability, 16))
            } else {
                String::new()
            },
            sc.duration_s,
            sc.warmup_s,
            a.rounds,
            if a.rounds == 1 { "" } else { "s" },
        );
        println!();
        print!("{}", text(&doc, &routes, &layouts, cores));
    }
    ctx.warn();
    // Lost events are a fault, whatever the load; so is a layout that delivered or answered
    // nothing.
    let mut faults = Vec::new();
    for round in doc["round_results"]
        .as_array()
        .cloned()
        .unwrap_or_else(|| vec![doc.clone()])
    {
        for &n in &routes {
            for &l in &layouts {
                let g = |f: &str| num(&round, &path(l, n, f)).unwrap_or(0.0);
                let what = format!("{}, {}", games_word(n), l.label());
                if g("unannounced_gaps") > 0.0 {
                    faults.push(format!(
                        "{what}: {} unannounced gaps",
                        g("unannounced_gaps")
                    ));
                }
                if g("disconnects") > 0.0 {
                    faults.push(format!("{what}: {} bridges cut off", g("disconnects")));
                }
                if g("delivered") == 0.0 {
                    faults.push(format!("{what}: no event delivered"));
                }
                if g("calls") == 0.0 {
                    faults.push(format!("{what}: no call answered"));
                }
            }
        }
    }
    if !faults.is_empty() {
        faults.dedup();
        bail!("{}", faults.join("; "));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(one_cpu: f64, many_cpu: f64, single: f64, slowest: f64) -> Value {
        json!({"results": {
            "one_relay": {
                "routes_1": {"relay_cpu_cores": 0.1, "per_agent_median_calls_per_s": single, "per_agent_min_calls_per_s": single},
                "routes_8": {"relay_cpu_cores": one_cpu, "per_agent_median_calls_per_s": slowest, "per_agent_min_calls_per_s": slowest},
            },
            "relay_per_game": {
                "routes_1": {"relay_cpu_cores": 0.1},
                "routes_8": {"relay_cpu_cores": many_cpu},
            },
        }})
    }

    #[test]
    fn checks_come_from_the_measured_figures() {
        let all = [Layout::OneRelay, Layout::RelayPerGame, Layout::Direct];
        let c = checks(&result(0.5, 0.8, 1000.0, 900.0), &[1, 8], &all);
        assert_eq!(c.len(), 2, "{c:?}");
        assert_eq!(c[0]["pass"], true);
        assert_eq!(c[1]["pass"], true, "900/s is within 1.2× of 1000/s");
        let c = checks(&result(0.9, 0.8, 1000.0, 800.0), &[1, 8], &all);
        assert_eq!(c[0]["pass"], false, "more CPU than the relays per game");
        assert_eq!(c[1]["pass"], false, "1000/800 = 1.25× slower");
        let c = checks(&result(0.5, 0.8, 1000.0, 0.0), &[1, 8], &all);
        assert_eq!(c[1]["pass"], false, "no call answered");
        assert!(
            checks(&result(0.5, 0.8, 1000.0, 900.0), &[8], &all)
                .iter()
                .all(|c| c["check"] != "calls_per_route_within_1_2x_of_single_route"),
            "no single route measured: no calls check"
        );
        // With rounds, the ratio's range over them says whether the verdict is noise.
        let mut d = result(0.5, 0.8, 1000.0, 900.0);
        let stats = |min: f64, max: f64| json!({"n": 3, "median": (min + max) / 2.0, "min": min, "max": max});
        d["spread"] = json!({
            "results.one_relay.routes_1.per_agent_median_calls_per_s": stats(950.0, 1100.0),
            "results.one_relay.routes_8.per_agent_min_calls_per_s": stats(850.0, 950.0),
        });
        let c = checks(&d, &[1, 8], &all);
        let range = c[1]["ratio_range"].as_array().expect("a range");
        assert!(
            (range[0].as_f64().expect("lo") - 1.0).abs() < 1e-9,
            "{range:?}"
        );
        assert!(
            (range[1].as_f64().expect("hi") - 1100.0 / 850.0).abs() < 1e-9,
            "{range:?}"
        );
        d["checks"] = json!(c);
        let t = text(&d, &[1, 8], &all, 2.0);
        assert!(
            t.contains(
                "×1.00–1.29 over the rounds, the rounds' ranges cross the limit: within noise"
            ),
            "{t}"
        );
        let t = text(
            &{
                let mut d = result(0.5, 0.8, 1000.0, 900.0);
                d["checks"] = json!(checks(&d, &[1, 8], &all));
                d
            },
            &[1, 8],
            &all,
            2.0,
        );
        assert!(
            t.contains("PASS  one relay for 8 games costs no more CPU than 8 relays"),
            "{t}"
        );
    }

    #[test]
    fn the_shipped_scenario_is_the_default() {
        let sc: Scenario = toml::from_str(DEFAULT_SCENARIO).expect("parses");
        assert_eq!((sc.rate, sc.bridges, sc.payload_bytes), (5000.0, 2, 256));
        assert!(sc.record && sc.durability == "batch");
    }
}
