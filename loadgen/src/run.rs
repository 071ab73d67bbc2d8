//! One measurement: a fresh event source (the simulated mod, or a publisher for a peer
//! server), the target, the readers; warm up, measure, stop.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use gabp_sim::events::Pace;
use gabp_sim::{Addr, ModSim, ModSimConfig};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::actors::broker::{self, Broker, PublishConfig, Publisher};
use crate::actors::tally::Tally;
use crate::actors::{bridge, caller, Window};
use crate::procstat;
use crate::report::{Measurement, Sample};
use crate::scenario::Scenario;
use crate::target::{RelayCommand, Target};

/// Which system a measurement drives.
#[derive(Debug, Clone)]
pub enum Which {
    /// The relay under test.
    Relay(RelayCommand),
    /// The raw forwarder.
    Baseline,
    /// A pub/sub server measured as a peer, with the same readers and publisher schedule.
    Peer(Broker),
}

const MOD_TOKEN: &str = "loadgen-mod-token";

/// Where events come from: the simulated mod (in front of the relay or forwarder) or a
/// publisher thread (to a peer server).
enum Source {
    Mod(ModSim),
    Publisher(Option<Publisher>),
}

impl Source {
    fn emitted(&self) -> u64 {
        match self {
            Source::Mod(m) => m.emitted(),
            Source::Publisher(p) => p.as_ref().map_or(0, Publisher::emitted),
        }
    }
}

/// Runs the scenario against one target; `progress` is told what happens.
pub async fn measure(sc: &Scenario, which: &Which, progress: &dyn Fn(&str)) -> Result<Measurement> {
    let pace = sc.pace_window().map(|w| Pace::new(sc.bridges, w));
    let data = tempfile::tempdir()?;
    let (target, mut source) = match which {
        Which::Peer(kind) => (Target::broker(*kind).await?, Source::Publisher(None)),
        Which::Relay(_) | Which::Baseline => {
            let cfg = ModSimConfig {
                token: MOD_TOKEN.into(),
                channels: sc.channels.clone(),
                rate: sc.mod_rate(),
                payload_bytes: sc.payload_bytes,
                seed: sc.seed,
                pace: pace.clone(),
                tick: sc.tick(),
                ..ModSimConfig::default()
            };
            let sim = ModSim::start(&"127.0.0.1:0".parse::<Addr>().expect("literal"), cfg)?;
            let target = match which {
                Which::Relay(cmd) => {
                    Target::relay(cmd, sim.addr(), MOD_TOKEN, sc, data.path(), &[], None).await
                }
                _ => Target::baseline(sim.addr(), MOD_TOKEN).await,
            };
            match target {
                Ok(t) => (t, Source::Mod(sim)),
                Err(e) => {
                    sim.stop();
                    return Err(e);
                }
            }
        }
    };
    let result = measure_with(sc, which, target, &mut source, pace, progress).await;
    if let Source::Mod(sim) = source {
        sim.stop();
    }
    result
}

async fn measure_with(
    sc: &Scenario,
    which: &Which,
    target: Target,
    source: &mut Source,
    pace: Option<Arc<Pace>>,
    progress: &dyn Fn(&str),
) -> Result<Measurement> {
    let name = target.name.clone();
    progress(&format!(
        "{name}: connecting {} bridges",
        sc.bridges + sc.stalled
    ));
    let window = Arc::new(Window::default());
    let stop = CancellationToken::new();
    let mut readers = Vec::new();
    let mut errors = Vec::new();
    let tally = || Tally::new(window.clone(), pace.as_ref().and_then(Pace::join));
    for i in 0..sc.bridges {
        match which {
            Which::Peer(kind) => {
                match broker::subscribe(*kind, target.socket_addr()?, sc.channels_of(i)).await {
                    Ok(s) => readers.push(tokio::spawn(s.read(tally(), stop.clone()))),
                    Err(e) => errors.push(format!("subscriber: {e:#}")),
                }
            }
            _ => match bridge::connect(&target.addr, &target.token, sc.channels_of(i)).await {
                Ok(c) => readers.push(tokio::spawn(bridge::read(
                    c,
                    sc.read_rate,
                    tally(),
                    stop.clone(),
                ))),
                Err(e) => errors.push(format!("bridge: {e}")),
            },
        }
    }
    let mut stalled = Vec::new();
    // The baseline and the peers are lossless and have no slow-consumer policy of this kind: a
    // reader that never reads would stall them for everyone (or be cut off). They are measured
    // with the healthy readers only, as the ceiling.
    let stalled_count = if matches!(which, Which::Relay(_)) {
        sc.stalled
    } else {
        0
    };
    for _ in 0..stalled_count {
        match bridge::connect(&target.addr, &target.token, &sc.channels).await {
            Ok(c) => stalled.push(c),
            Err(e) => errors.push(format!("stalled bridge: {e}")),
        }
    }
    if let (Which::Peer(kind), Source::Publisher(p)) = (which, &mut *source) {
        *p = Some(Publisher::start(
            *kind,
            target.socket_addr()?,
            PublishConfig {
                channels: sc.channels.clone(),
                payload_bytes: sc.payload_bytes,
                seed: sc.seed,
                rate: sc.mod_rate(),
                pace: pace.clone(),
                tick: sc.tick(),
            },
        )?);
    }
    let caller = if sc.calls_per_s > 0.0 && !matches!(which, Which::Peer(_)) {
        let (c, _) = gabp_client::Client::connect_hello(&target.addr, &target.token).await?;
        Some(tokio::spawn(caller::fixed_rate(
            c,
            "sim/echo".into(),
            json!({"n": 1}),
            sc.calls_per_s,
            window.clone(),
            stop.clone(),
        )))
    } else {
        None
    };
    progress(&format!("{name}: warming up {:.1}s", sc.warmup_s));
    tokio::time::sleep(sc.warmup()).await;
    let pid = target.pid();
    let before = pid.and_then(procstat::sample).unwrap_or_default();
    let emitted_before = source.emitted();
    window.set(true);
    let opened = Instant::now();
    // A look at the target every quarter second, for `--report`'s charts over time.
    let look = |t: Instant| {
        let p = pid.and_then(procstat::sample);
        Sample {
            t_s: t.elapsed().as_secs_f64(),
            delivered: window.delivered(),
            cpu_s: p.as_ref().map(|p| p.cpu_s - before.cpu_s),
            rss: p.map(|p| p.rss),
        }
    };
    let mut timeline = vec![look(opened)];
    while opened.elapsed() < sc.duration() {
        let left = sc.duration().saturating_sub(opened.elapsed());
        tokio::time::sleep(left.min(Duration::from_millis(250))).await;
        timeline.push(look(opened));
        progress(&format!(
            "{name}: measuring {:.1}/{:.1}s",
            opened.elapsed().as_secs_f64().min(sc.duration_s),
            sc.duration_s
        ));
    }
    window.set(false);
    let window_s = opened.elapsed().as_secs_f64();
    let emitted = source.emitted() - emitted_before;
    let after = pid.and_then(procstat::sample);
    let unsampled = after.is_none();
    let after = after.unwrap_or_default();
    stop.cancel();
    // The publisher stops before its server does, or it would see the server go.
    if let Source::Publisher(p) = source {
        if let Some(Err(e)) = p.take().map(Publisher::stop) {
            errors.push(format!("publisher: {e:#}"));
        }
    }
    let mut m = Measurement::new(&name, window_s);
    m.published = emitted;
    m.add_readers(readers, "reader", &mut errors).await;
    if let Some(c) = caller {
        if let Ok(r) = c.await {
            m.set_calls(&r);
        }
    }
    drop(stalled);
    m.cpu_percent = (after.cpu_s - before.cpu_s) / window_s * 100.0;
    m.peak_rss_mib = after.peak_rss as f64 / (1 << 20) as f64;
    m.end_rss_mib = after.rss as f64 / (1 << 20) as f64;
    m.fds = after.fds;
    m.unsampled = unsampled;
    m.errors = errors;
    m.timeline = timeline;
    progress(&format!("{name}: stopping"));
    target.stop(Duration::from_secs(10)).await;
    Ok(m)
}
