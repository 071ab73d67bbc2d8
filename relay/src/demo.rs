//! `gabp-relay demo`: a simulated mod, the relay and a few simulated bridges in one process.
//!
//! It shows the product end to end on any machine: events fanned out with contiguous seqs,
//! tool calls multiplexed through one mod connection, the session recorded to the data dir,
//! and the recording's stats at the end. It prints what it does as it goes.

use std::collections::HashMap;
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gabp_client::Client;
use gabp_sim::{Addr, ModSim, ModSimConfig};
use gabp_storage::{Store, StoreOptions};
use hdrhistogram::Histogram;
use parking_lot::Mutex;
use serde_json::json;

use crate::config::{RelayConfig, RouteConfig, Upstream};
use gabp_engine::Relay;

/// Demo settings.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    /// How long to run.
    pub duration: Duration,
    /// Where to record.
    pub data_dir: PathBuf,
    /// Simulated bridges.
    pub bridges: usize,
    /// Events per second from the simulated mod.
    pub rate: f64,
    /// Record the session.
    pub record: bool,
    /// Cancelled to stop early (Ctrl-C): the demo then ends as if its time were up, with the
    /// summary printed and the session ended clean.
    pub stop: tokio_util::sync::CancellationToken,
}

/// Why the demo failed.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct DemoError(String);

fn err<E: std::fmt::Display>(what: &str) -> impl FnOnce(E) -> DemoError + '_ {
    move |e| DemoError(format!("{what}: {e}"))
}

#[derive(Default)]
struct Tally {
    events: AtomicU64,
    gaps: AtomicU64,
    calls: AtomicU64,
    latency: Mutex<Option<Histogram<u64>>>,
}

/// Runs the demo, printing progress to `out`.
pub async fn run(opts: DemoOptions, out: &mut (dyn Write + Send)) -> Result<(), DemoError> {
    let token = gabp_engine::auth::generate_token();
    let mod_cfg = ModSimConfig {
        token: token.clone(),
        rate: (opts.rate > 0.0).then_some(opts.rate),
        payload_bytes: 256,
        tool_latency: Duration::from_millis(1),
        quirks: true,
        seq_start: 1,
        ..ModSimConfig::default()
    };
    let channels = mod_cfg.channels.clone();
    let sim = ModSim::start(
        &"127.0.0.1:0".parse::<Addr>().expect("literal address"),
        mod_cfg,
    )
    .map_err(err("starting the simulated mod"))?;
    let _ = writeln!(out, "simulated mod   {}  channels {:?}, {} events/s, 256 B events, quirks on (seq from 1, \"error\": null, timestamp)", sim.addr(), channels, opts.rate);

    let bridge_token = gabp_engine::auth::generate_token();
    let mut route = RouteConfig::new(
        "demo",
        Upstream::Addr(sim.addr().clone()),
        "127.0.0.1:0".parse().expect("literal address"),
        bridge_token.clone(),
    );
    route.upstream_token = token;
    route.record = opts.record;
    let cfg = RelayConfig::new(vec![route], opts.data_dir.clone());
    let relay = Relay::start(cfg).await.map_err(err("starting the relay"))?;
    let addr = relay.addrs[0].clone();
    let _ = writeln!(out, "relay           {addr}  token {bridge_token}");
    if opts.record {
        let _ = writeln!(out, "recording to    {}", opts.data_dir.display());
    }

    let tally = Arc::new(Tally::default());
    let stop = tokio_util::sync::CancellationToken::new();
    let mut tasks = Vec::new();
    for i in 0..opts.bridges {
        let (mut c, welcome) = Client::connect_hello(&addr, &bridge_token)
            .await
            .map_err(err("bridge hello"))?;
        if i == 0 {
            let ext = &welcome["capabilities"]["extensions"]["relay"];
            let _ = writeln!(
                out,
                "bridge welcome  app {} via relay {} session {}",
                welcome["app"]["name"], ext["version"], ext["sessionId"]
            );
        }
        let names: Vec<&str> = channels.iter().map(String::as_str).collect();
        c.subscribe(&names).await.map_err(err("subscribe"))?;
        let (tally, stop) = (tally.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            let mut last: HashMap<String, u64> = HashMap::new();
            loop {
                let ev = tokio::select! { _ = stop.cancelled() => break, e = c.next_event() => match e { Ok(e) => e, Err(_) => break } };
                let (Some(ch), Some(seq)) = (ev["channel"].as_str(), ev["seq"].as_u64()) else { continue };
                if let Some(prev) = last.insert(ch.to_string(), seq) {
                    if seq != prev + 1 {
                        tally.gaps.fetch_add(1, Ordering::Relaxed);
                    }
                }
                tally.events.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    let _ = writeln!(out, "bridges         {} subscribed to every channel; one agent calls tools/call sim/echo every 10 ms\n", opts.bridges);
    let (mut agent, _) = Client::connect_hello(&addr, &bridge_token)
        .await
        .map_err(err("agent hello"))?;
    let (t2, stop2) = (tally.clone(), stop.clone());
    tasks.push(tokio::spawn(async move {
        *t2.latency.lock() = Histogram::new_with_bounds(1, 60_000_000_000, 3).ok();
        let mut n = 0u64;
        loop {
            tokio::select! { _ = stop2.cancelled() => break, _ = tokio::time::sleep(Duration::from_millis(10)) => {} }
            let t = Instant::now();
            if agent.call("tools/call", json!({"name": "sim/echo", "arguments": {"n": n}})).await.is_err() {
                break;
            }
            n += 1;
            t2.calls.fetch_add(1, Ordering::Relaxed);
            if let Some(h) = t2.latency.lock().as_mut() {
                let _ = h.record(t.elapsed().as_nanos() as u64);
            }
        }
    }));

    let started = Instant::now();
    let (mut prev_in, mut prev_out) = (0u64, 0u64);
    while started.elapsed() < opts.duration {
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            _ = opts.stop.cancelled() => {
                let _ = writeln!(out, "\ninterrupted after {:.1}s: stopping", started.elapsed().as_secs_f64());
                break;
            }
        }
        let ev_in: u64 = relay.routes[0]
            .events_per_channel()
            .iter()
            .map(|(_, n)| n)
            .sum();
        let ev_out = tally.events.load(Ordering::Relaxed);
        let p50 = tally
            .latency
            .lock()
            .as_ref()
            .map_or(0.0, |h| h.value_at_quantile(0.5) as f64 / 1e6);
        let status = relay.routes[0].status();
        let dropped: u64 = status["bridges"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|b| b["dropped"].as_u64())
            .sum();
        let _ = writeln!(
            out,
            "[{:>2}s] mod->relay {:>8} ev/s | relay->bridges {:>8} ev/s | seq gaps {} | drops {} | calls {} (p50 {:.2} ms)",
            started.elapsed().as_secs(),
            ev_in - prev_in,
            ev_out - prev_out,
            tally.gaps.load(Ordering::Relaxed),
            dropped,
            tally.calls.load(Ordering::Relaxed),
            p50
        );
        (prev_in, prev_out) = (ev_in, ev_out);
    }
    stop.cancel();
    for t in tasks {
        let _ = t.await;
    }
    let clean = relay.shutdown().await;
    sim.stop();
    let _ = writeln!(
        out,
        "\nrelay stopped{}",
        if clean {
            " cleanly"
        } else {
            " (shutdown bound exceeded)"
        }
    );
    if opts.record {
        let store = Store::open(&opts.data_dir, StoreOptions::default())
            .map_err(err("opening the recording"))?;
        let meta = store
            .resolve("latest")
            .map_err(err("finding the session"))?;
        let check = store
            .check_session(meta.id)
            .map_err(err("checking the session"))?;
        let _ = writeln!(
            out,
            "recorded        session {} ({} frames, {}, ended {}), consistency check: {}",
            meta.id,
            meta.frames,
            gabp_rt::display::bytes(meta.bytes),
            meta.end_label(),
            if check.ok() { "ok" } else { "FAILED" }
        );
        let stats = gabp_analysis::stats::compute(&store, &meta).map_err(err("computing stats"))?;
        let _ = writeln!(out, "\n{}", gabp_analysis::stats::render(&stats));
        // One command per line: a `|` between them would read as a shell pipe.
        let _ = writeln!(
            out,
            "next, to look at what was recorded:\n  gabp-relay sessions --data-dir {0}\n  gabp-relay stats latest --data-dir {0}\n  gabp-relay export latest --data-dir {0}\n  gabp-relay replay latest --data-dir {0} --listen 127.0.0.1:0",
            opts.data_dir.display()
        );
    }
    Ok(())
}
