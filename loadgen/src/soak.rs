//! The soak run: bridges connect, subscribe, call and disconnect at random for a set time while
//! the mod restarts now and then. Afterwards the relay's memory must be flat, its descriptors back
//! where they started, the recording consistent (`gabp-relay sessions check`), and no bridge may
//! have seen an out-of-order event or a gap that was not announced.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use gabp_client::Client;
use gabp_sim::{Addr, ModSim, ModSimConfig};
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

use crate::procstat;
use crate::scenario::Scenario;
use crate::target::{RelayCommand, Target};

/// Soak settings.
#[derive(Debug, Clone)]
pub struct SoakOptions {
    /// How long bridges churn.
    pub duration: Duration,
    /// Concurrent churning bridges.
    pub workers: usize,
    /// Mod events per second.
    pub rate: f64,
    /// Mean time between mod restarts.
    pub restart_every: Duration,
    /// Seed.
    pub seed: u64,
    /// The relay binary.
    pub relay_bin: PathBuf,
    /// Keep the recording here (a temporary dir otherwise).
    pub data_dir: Option<PathBuf>,
}

#[derive(Default)]
struct Tally {
    connects: AtomicU64,
    events: AtomicU64,
    calls: AtomicU64,
    call_errors: AtomicU64,
    drops_announced: AtomicU64,
    violations: AtomicU64,
}

const MOD_TOKEN: &str = "soak-mod-token-0001";

/// Runs the soak and returns its report; `ok` says whether every check held.
pub async fn run(o: SoakOptions) -> Result<Value> {
    let channels: Vec<String> = ["world/tick", "player/move", "chat/message", "combat/hit"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let cfg = ModSimConfig {
        token: MOD_TOKEN.into(),
        channels: channels.clone(),
        rate: Some(o.rate),
        seed: o.seed,
        ..ModSimConfig::default()
    };
    let sim = ModSim::start(&"127.0.0.1:0".parse::<Addr>().expect("literal"), cfg)?;
    let tmp = tempfile::tempdir()?;
    let data_dir = o
        .data_dir
        .clone()
        .unwrap_or_else(|| tmp.path().to_path_buf());
    let sc = Scenario {
        record: true,
        ..Scenario::default()
    };
    let target = Target::relay(
        &RelayCommand::Builtin(o.relay_bin.clone()),
        sim.addr(),
        MOD_TOKEN,
        &sc,
        &data_dir,
        &[],
        None,
    )
    .await?;
    let pid = target.pid().context("relay pid")?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let start = procstat::sample(pid).context("relay /proc")?;
    let deadline = Instant::now() + o.duration;
    let tally = Arc::new(Tally::default());
    let mut tasks = Vec::new();
    for w in 0..o.workers {
        let (addr, token, tally, channels) = (
            target.addr.clone(),
            target.token.clone(),
            tally.clone(),
            channels.clone(),
        );
        let seed = o.seed.wrapping_mul(1000).wrapping_add(w as u64);
        tasks.push(tokio::spawn(async move {
            worker(addr, token, channels, seed, deadline, tally).await
        }));
    }
    // Memory is judged against a sample taken once the load has warmed up (RocksDB memtables and
    // caches fill to their configured bounds first), so "flat" means no growth after that.
    let warm_at = Instant::now() + o.duration / 4;
    let warm_sample = tokio::spawn(async move {
        tokio::time::sleep_until(warm_at.into()).await;
        procstat::sample(pid)
    });
    let restarts = {
        let mut rng = rand::rngs::SmallRng::seed_from_u64(o.seed ^ 0x5eed);
        let mut n = 0u64;
        loop {
            let wait =
                Duration::from_secs_f64(o.restart_every.as_secs_f64() * rng.gen_range(0.5..1.5));
            if Instant::now() + wait >= deadline {
                tokio::time::sleep_until(deadline.into()).await;
                break n;
            }
            tokio::time::sleep(wait).await;
            sim.kill_connections();
            n += 1;
        }
    };
    for t in tasks {
        let _ = t.await;
    }
    let warm = warm_sample.await.ok().flatten().unwrap_or(start);
    // Let the relay notice every closed connection, then read its sockets and memory.
    let settle = Instant::now();
    let mut end = procstat::sample(pid).context("relay /proc")?;
    while end.sockets > start.sockets && settle.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(100)).await;
        end = procstat::sample(pid).context("relay /proc")?;
    }
    let clean_exit = target.stop(Duration::from_secs(15)).await;
    sim.stop();
    let check = std::process::Command::new(&o.relay_bin)
        .args(["sessions", "check", "--json", "--data-dir"])
        .arg(&data_dir)
        .output()
        .context("running sessions check")?;
    let check: Value = serde_json::from_slice(&check.stdout).unwrap_or(json!({"ok": false}));
    let sessions = check["sessions"].as_array().map_or(0, Vec::len);
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    let violations = tally.violations.load(Ordering::Relaxed);
    let rss_flat = end.rss <= warm.rss + (32 << 20);
    let fds_back = end.sockets <= start.sockets;
    let ok = violations == 0 && check["ok"] == true && rss_flat && fds_back && clean_exit;
    Ok(json!({
        "ok": ok,
        "duration_s": o.duration.as_secs_f64(),
        "workers": o.workers,
        "mod_rate": o.rate,
        "mod_restarts": restarts,
        "bridge_connects": tally.connects.load(Ordering::Relaxed),
        "events_checked": tally.events.load(Ordering::Relaxed),
        "drops_announced": tally.drops_announced.load(Ordering::Relaxed),
        "calls": tally.calls.load(Ordering::Relaxed),
        "call_errors": tally.call_errors.load(Ordering::Relaxed),
        "order_violations": violations,
        "sessions_recorded": sessions,
        "recording_check_ok": check["ok"],
        "rss_start_mib": mib(start.rss),
        "rss_warm_mib": mib(warm.rss),
        "rss_end_mib": mib(end.rss),
        "rss_peak_mib": mib(end.peak_rss),
        "rss_flat": rss_flat,
        "fds_start": start.fds,
        "fds_end": end.fds,
        "sockets_start": start.sockets,
        "sockets_end": end.sockets,
        "fds_back": fds_back,
        "relay_exit_clean": clean_exit,
        "data_dir": o.data_dir.map(|p| p.display().to_string()),
    }))
}

/// One churning bridge: connect, subscribe to a random subset, read and call for a random
/// while, disconnect, repeat. Checks seq order on every channel it reads.
async fn worker(
    addr: Addr,
    token: String,
    channels: Vec<String>,
    seed: u64,
    deadline: Instant,
    tally: Arc<Tally>,
) {
    let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
    while Instant::now() < deadline {
        let Ok((mut c, _)) = Client::connect_hello(&addr, &token).await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        tally.connects.fetch_add(1, Ordering::Relaxed);
        let subset: Vec<&str> = channels
            .iter()
            .filter(|_| rng.gen_bool(0.6))
            .map(String::as_str)
            .collect();
        let subset = if subset.is_empty() {
            vec![channels[0].as_str()]
        } else {
            subset
        };
        if c.subscribe(&subset).await.is_err() {
            continue;
        }
        let life = Instant::now() + Duration::from_secs_f64(rng.gen_range(0.2..3.0));
        let mut last: HashMap<String, u64> = HashMap::new();
        c.set_wait(Duration::from_secs(2));
        while Instant::now() < life.min(deadline) {
            if rng.gen_bool(0.01) {
                tally.calls.fetch_add(1, Ordering::Relaxed);
                match c
                    .request(
                        "tools/call",
                        json!({"name": "sim/echo", "arguments": {"n": rng.gen::<u32>()}}),
                    )
                    .await
                {
                    // Success, or the mod is restarting (not connected / outcome unknown).
                    Ok(r)
                        if r.get("error").is_none()
                            || matches!(r["error"]["code"].as_i64(), Some(-32000 | -32001)) => {}
                    _ => {
                        tally.call_errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
                continue;
            }
            let Ok(ev) = c.next_event().await else { break };
            let ch = ev["channel"].as_str().unwrap_or_default().to_string();
            match ch.as_str() {
                "relay/session" => {
                    if ev["payload"]["state"] == "started" {
                        last.clear(); // a new session: seq restarts at 0
                    }
                }
                "relay/dropped" => {
                    let p = &ev["payload"];
                    if let (Some(c), Some(from), Some(to)) = (
                        p["channel"].as_str(),
                        p["fromSeq"].as_u64(),
                        p["toSeq"].as_u64(),
                    ) {
                        if let Some(prev) = last.get(c) {
                            if from != prev + 1 {
                                tally.violations.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        last.insert(c.to_string(), to);
                        tally
                            .drops_announced
                            .fetch_add(p["count"].as_u64().unwrap_or(0), Ordering::Relaxed);
                    }
                }
                _ => {
                    let Some(seq) = ev["seq"].as_u64() else {
                        continue;
                    };
                    if let Some(prev) = last.get(&ch) {
                        if seq != prev + 1 {
                            tally.violations.fetch_add(1, Ordering::Relaxed);
                            tracing::warn!(channel = %ch, prev, seq, "out of order or unannounced gap");
                        }
                    }
                    last.insert(ch, seq);
                    tally.events.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }
}
