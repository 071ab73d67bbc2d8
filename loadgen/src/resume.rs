//! `gabp-loadgen resume`: what one bridge resuming after a drop costs the others. One relay, the
//! simulated mod at the scenario's rate, the scenario's reading bridges, and one more bridge,
//! the resumer. Phases alternate in the same run: in a *plain* phase the resumer reads live; in
//! a *resume* phase it drops its connection, waits until the mod has published `--missed`
//! events, reconnects with `relay.resume` and reads history then live. The figure is the
//! readers' delivered events per second in resume phases over plain phases; the resumer checks
//! that it got every seq once, in order (announced `not-retained` ranges are counted apart).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Result};
use clap::Args;
use gabp_client::Client;
use gabp_sim::events::Pace;
use gabp_sim::{Addr, ModSim, ModSimConfig};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use crate::actors::tally::Tally;
use crate::actors::{bridge, find_channel, find_u64, Window};
use crate::args::ScenarioArgs;
use crate::target::{self, RelayCommand, Target};

const MOD_TOKEN: &str = "loadgen-mod-token";

#[derive(Args, Debug)]
pub(crate) struct ResumeArgs {
    #[command(flatten)]
    pub(crate) scenario: ScenarioArgs,
    /// Events the resumer misses while disconnected, per resume phase.
    #[arg(long, default_value_t = 100_000)]
    pub(crate) missed: u64,
    /// Phases, alternating plain and resume (plain first).
    #[arg(long, default_value_t = 6)]
    pub(crate) phases: usize,
    /// Seconds per phase (a resume phase lasts at least until the resumer has caught up).
    #[arg(long, default_value_t = 3.0)]
    pub(crate) phase_s: f64,
    /// The gabp-relay binary (default: next to this one).
    #[arg(long)]
    pub(crate) relay_bin: Option<std::path::PathBuf>,
    /// Print one JSON document.
    #[arg(long)]
    pub(crate) json: bool,
}

/// What the resumer saw on one connection.
#[derive(Debug, Default)]
struct Seen {
    /// Last seq per channel.
    last: HashMap<Vec<u8>, u64>,
    events: u64,
    /// Seqs that were not the next one (a gap or a duplicate), unannounced.
    out_of_order: u64,
    /// Events announced as not retained (history the relay no longer held).
    not_retained: u64,
    /// Events announced as dropped by the slow-bridge policy (the resumer fell behind live).
    dropped: u64,
}

impl Seen {
    fn event(&mut self, body: &[u8]) {
        let Some(ch) = find_channel(body) else { return };
        if ch == b"relay/dropped" {
            let from = find_u64(body, b"\"fromSeq\":");
            let to = find_u64(body, b"\"toSeq\":");
            let at = memchr::memmem::find(body, b"\"payload\":").unwrap_or(0);
            if let (Some(from), Some(to), Some(c)) = (from, to, find_channel(&body[at..])) {
                if memchr::memmem::find(body, b"not-retained").is_some() {
                    self.not_retained += to + 1 - from;
                } else {
                    self.dropped += to + 1 - from;
                }
                self.last.insert(c.to_vec(), to);
            }
            return;
        }
        if ch.starts_with(b"relay/") {
            return;
        }
        let Some(seq) = find_u64(body, b"\"seq\":") else {
            return;
        };
        if let Some(prev) = self.last.get(ch) {
            if seq != prev + 1 {
                self.out_of_order += 1;
            }
        }
        self.last.insert(ch.to_vec(), seq);
        self.events += 1;
    }
}

/// Reads `c` into `seen` until `stop`, or until `until` events when given.
async fn read(c: &mut Client, seen: &mut Seen, stop: &CancellationToken, until: Option<u64>) {
    loop {
        if until.is_some_and(|n| seen.events >= n) {
            return;
        }
        tokio::select! {
            biased;
            _ = stop.cancelled() => return,
            f = c.next_frame() => match f {
                Ok(Some(body)) => seen.event(&body),
                _ => return,
            },
        }
    }
}

fn hello_params(token: &str, resume: Option<Value>) -> Value {
    let mut p = json!({"token": token, "bridgeVersion": "gabp-loadgen", "platform": std::env::consts::OS, "launchId": gabp_client::new_id()});
    if let Some(r) = resume {
        p["relay"] = json!({ "resume": r });
    }
    p
}

/// Runs the benchmark and returns its JSON document.
pub(crate) async fn run(a: ResumeArgs) -> Result<Value> {
    let sc = a.scenario.scenario()?;
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
    let data = tempfile::tempdir()?;
    let bin = a
        .relay_bin
        .clone()
        .unwrap_or_else(|| target::sibling("gabp-relay"));
    let relay = Target::relay(
        &RelayCommand::Builtin(bin),
        sim.addr(),
        MOD_TOKEN,
        &sc,
        data.path(),
        &[],
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
    let result = phases(&a, &sc, &relay, &sim, pace).await;
    relay.stop(Duration::from_secs(10)).await;
    sim.stop();
    result
}

async fn phases(
    a: &ResumeArgs,
    sc: &crate::scenario::Scenario,
    relay: &Target,
    sim: &ModSim,
    pace: Option<Arc<Pace>>,
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
    let names: Vec<&str> = sc.channels.iter().map(String::as_str).collect();
    let (mut r, welcome) = Client::connect_hello(&relay.addr, &relay.token).await?;
    let session = welcome["capabilities"]["extensions"]["relay"]["sessionId"]
        .as_str()
        .ok_or_else(|| anyhow!("the welcome names no session"))?
        .to_string();
    r.subscribe(&names).await?;
    let mut seen = Seen::default();
    tokio::time::sleep(sc.warmup()).await;
    window.set(true);
    let phase = Duration::from_secs_f64(a.phase_s.max(0.5));
    let mut rows = Vec::new();
    for i in 0..a.phases.max(2) {
        let resume = i % 2 == 1;
        let started = Instant::now();
        let before = window.delivered();
        let mut catch_up_s = None;
        if resume {
            // Drop, miss `missed` events, come back with what was seen.
            drop(std::mem::replace(
                &mut r,
                Client::connect(&relay.addr).await?,
            ));
            let at_drop = sim.emitted();
            while sim.emitted() < at_drop + a.missed {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            let last: serde_json::Map<String, Value> = seen
                .last
                .iter()
                .map(|(c, s)| (String::from_utf8_lossy(c).into_owned(), json!(s)))
                .collect();
            let resumed_at = Instant::now();
            let missed_now = sim.emitted() - at_drop;
            let p = hello_params(
                &relay.token,
                Some(json!({"session": session, "channels": last})),
            );
            let w = r.request("session/hello", p).await?;
            if w["result"]["capabilities"]["extensions"]["relay"]["resume"]["resumed"] != true {
                bail!("the relay did not resume: {w}");
            }
            let target_events = seen.events + missed_now;
            let never = CancellationToken::new();
            tokio::time::timeout(
                Duration::from_secs(120),
                read(&mut r, &mut seen, &never, Some(target_events)),
            )
            .await
            .map_err(|_| anyhow!("the resumer did not catch up within 120 s"))?;
            catch_up_s = Some(resumed_at.elapsed().as_secs_f64());
        }
        let left = phase.saturating_sub(started.elapsed());
        let tick = CancellationToken::new();
        let t = tick.clone();
        tokio::spawn(async move {
            tokio::time::sleep(left).await;
            t.cancel();
        });
        read(&mut r, &mut seen, &tick, None).await;
        let secs = started.elapsed().as_secs_f64();
        let delivered = window.delivered() - before;
        rows.push(
            json!({"phase": i, "kind": if resume { "resume" } else { "plain" }, "seconds": secs,
            "readers_events_per_s": delivered as f64 / secs, "catch_up_s": catch_up_s}),
        );
    }
    window.set(false);
    stop.cancel();
    let mut gaps = 0;
    for rd in readers {
        let res = rd.await?;
        gaps += res.unannounced_gaps;
    }
    let mean = |kind: &str| {
        let v: Vec<f64> = rows
            .iter()
            .filter(|r| r["kind"] == kind)
            .filter_map(|r| r["readers_events_per_s"].as_f64())
            .collect();
        v.iter().sum::<f64>() / v.len().max(1) as f64
    };
    let (plain, resumed) = (mean("plain"), mean("resume"));
    Ok(json!({
        "bridges": sc.bridges, "channels": sc.channels.len(), "payload_bytes": sc.payload_bytes,
        "rate": if sc.rate > 0.0 { json!(sc.rate) } else { json!("max") }, "record": sc.record,
        "missed_per_resume": a.missed, "phases": rows,
        "plain_events_per_s": plain, "resume_events_per_s": resumed,
        "ratio": if plain > 0.0 { resumed / plain } else { 0.0 },
        "resumer": {"events": seen.events, "out_of_order": seen.out_of_order, "not_retained": seen.not_retained, "dropped_when_behind": seen.dropped},
        "readers_unannounced_gaps": gaps,
    }))
}

/// The text form of the document.
pub(crate) fn table(doc: &Value) -> String {
    let mut s = String::new();
    for r in doc["phases"].as_array().into_iter().flatten() {
        s += &format!(
            "phase {} {:<6} {:>6.2}s  readers {:>12.0} ev/s{}\n",
            r["phase"],
            r["kind"].as_str().unwrap_or(""),
            r["seconds"].as_f64().unwrap_or(0.0),
            r["readers_events_per_s"].as_f64().unwrap_or(0.0),
            r["catch_up_s"]
                .as_f64()
                .map(|c| format!("  (resumer caught up in {c:.2}s)"))
                .unwrap_or_default()
        );
    }
    s += &format!(
        "ratio resume/plain {:.3}; resumer: {} events, {} out of order, {} not retained, {} dropped behind live\n",
        doc["ratio"].as_f64().unwrap_or(0.0),
        doc["resumer"]["events"],
        doc["resumer"]["out_of_order"],
        doc["resumer"]["not_retained"],
        doc["resumer"]["dropped_when_behind"]
    );
    s
}
