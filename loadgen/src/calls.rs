//! `call` and `bridges`: measurements of a target someone else started, reached by its address.
//! One round of each (connect, warm up, measure, disconnect) and its JSON document; the
//! commands over `--rounds N` with each figure's median and spread, the target's description
//! and the run's context. `overhead` runs the same rounds against two targets. Nothing here
//! starts or stops a target.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Result};
use gabp_sim::Addr;
use serde_json::{json, Value};

use crate::actors::caller::CallResult;
use crate::actors::{self, latency_histogram};
use crate::args::{BridgesArgs, CallArgs};
use crate::context::{self, Watch};
use crate::report::{self, Measurement, Percentiles};
use crate::scenario::Scenario;
use crate::{report_html, spread};

/// How one round of tool calls runs.
#[derive(Debug, Clone)]
pub struct CallSpec {
    /// The relay or mod.
    pub addr: Addr,
    /// Its token.
    pub token: String,
    /// The tool.
    pub tool: String,
    /// Its arguments.
    pub args: Value,
    /// Calls per second (open loop), or…
    pub rate: Option<f64>,
    /// …concurrent callers (closed loop).
    pub concurrency: Option<usize>,
    /// Those callers' calls in flight on one connection, not one connection each.
    pub one_connection: bool,
    /// Channels each caller subscribes to.
    pub subscribe: Vec<String>,
    /// Seconds before the window opens.
    pub warmup: f64,
    /// Seconds measured.
    pub duration: f64,
}

impl CallSpec {
    /// From `call`'s flags.
    pub fn from_args(a: &CallArgs) -> Result<CallSpec> {
        let spec = CallSpec {
            addr: a.addr.parse().map_err(|e: String| anyhow!(e))?,
            token: a.token.clone(),
            tool: a.tool.clone(),
            args: serde_json::from_str(&a.args).map_err(|e| anyhow!("--args: {e}"))?,
            rate: a.rate,
            concurrency: a.concurrency,
            one_connection: a.one_connection,
            subscribe: a.subscribe.clone(),
            warmup: a.warmup,
            duration: a.duration,
        };
        spec.check()?;
        Ok(spec)
    }

    /// Refuses a spec with neither a rate nor a concurrency.
    pub fn check(&self) -> Result<()> {
        match (self.rate, self.concurrency) {
            (Some(r), _) if r > 0.0 => Ok(()),
            (None, Some(n)) if n > 0 => Ok(()),
            _ => bail!("give --rate R (calls/s) or --concurrency N"),
        }
    }

    /// `rate` or `concurrency`.
    pub fn mode(&self) -> &'static str {
        if self.rate.is_some() {
            "rate"
        } else {
            "concurrency"
        }
    }

    /// What the latency figures count from.
    pub fn latency_from(&self) -> String {
        match (self.rate, self.concurrency) {
            (Some(r), _) => format!(
                "each call's scheduled send time, {r} calls/s on one connection (open loop: a stall shows in full)"
            ),
            (_, Some(n)) if self.one_connection => format!(
                "each call's send to its answer, {n} call(s) kept in flight on one connection, the next sent as each answer comes (closed loop, pipelined)"
            ),
            (_, Some(n)) => format!(
                "each call's send to its answer, {n} caller(s) each waiting for its answer before the next (closed loop)"
            ),
            _ => String::new(),
        }
    }

    /// The settings that decide the figures, for a result's `config`.
    pub fn config(&self, rounds: usize) -> Value {
        json!({
            "tool": self.tool,
            "args": self.args,
            "mode": self.mode(),
            "rate": self.rate,
            "concurrency": self.concurrency,
            "one_connection": self.one_connection,
            "subscribe": self.subscribe,
            "warmup_s": self.warmup,
            "duration_s": self.duration,
            "rounds": rounds,
            "latency_from": self.latency_from(),
        })
    }

    /// `sim/echo, concurrency 4, 10 s after 1 s warm-up` for a person.
    pub fn config_line(&self, rounds: usize) -> String {
        let mode = match (self.rate, self.concurrency) {
            (Some(r), _) => format!("{r} calls/s (open loop)"),
            (_, Some(n)) if self.one_connection => {
                format!("concurrency {n} on one connection (closed loop, pipelined)")
            }
            (_, Some(n)) => format!("concurrency {n} (closed loop)"),
            _ => String::new(),
        };
        let mut s = format!(
            "{}, {mode}, {} s measured after {} s warm-up, {rounds} round{}",
            gabp_rt::display::text(&self.tool, 48),
            self.duration,
            self.warmup,
            if rounds == 1 { "" } else { "s" }
        );
        if !self.subscribe.is_empty() {
            s.push_str(&format!(
                ", subscribed to {}",
                gabp_rt::display::text(&self.subscribe.join(","), 80)
            ));
        }
        s
    }
}

/// What one round of tool calls measured.
#[derive(Debug)]
pub struct CallRound {
    /// The window's length, seconds.
    pub secs: f64,
    /// Calls, errors, latency.
    pub result: CallResult,
    /// CPU seconds the serving processes (those on this machine) used in the window.
    pub cpu_s: Option<f64>,
}

/// The CPU seconds so far of every process in `pids`; `None` if there are none, or one is
/// gone or unreadable.
pub fn cpu_of(pids: &[u32]) -> Option<f64> {
    if pids.is_empty() {
        return None;
    }
    pids.iter()
        .map(|p| crate::procstat::sample(*p).map(|s| s.cpu_s))
        .sum()
}

/// The CPU used between two readings of [`cpu_of`].
fn used(before: Option<f64>, after: Option<f64>) -> Option<f64> {
    Some((after? - before?).max(0.0))
}

/// The local processes that serve a described target: its own and, for a relay, its mod's.
pub fn serving_pids(target: &Value) -> Vec<u32> {
    ["pid", "upstream_pid"]
        .iter()
        .filter_map(|k| target[*k].as_u64().and_then(|p| u32::try_from(p).ok()))
        .collect()
}

impl CallRound {
    /// Calls answered per second.
    pub fn per_s(&self) -> f64 {
        self.result.calls as f64 / self.secs
    }

    /// The round's document: the fields `call --json` has always had, and the serving
    /// processes' CPU when they run on this machine.
    pub fn doc(&self, spec: &CallSpec) -> Value {
        let mut doc = json!({
            "tool": spec.tool,
            "mode": spec.mode(),
            "duration_s": self.secs,
            "calls": self.result.calls,
            "calls_per_s": self.per_s(),
            "errors": self.result.errors,
            "unanswered": self.result.unanswered,
            "latency_us": Percentiles::of(&self.result.latency),
        });
        if let Some(cpu) = self.cpu_s {
            doc["cpu_percent"] = json!(cpu / self.secs * 100.0);
            if self.result.calls > 0 {
                doc["cpu_per_call_us"] = json!(cpu / self.result.calls as f64 * 1e6);
            }
        }
        doc
    }

    /// The round in one line.
    pub fn line(&self) -> String {
        let r = &self.result;
        let p = Percentiles::of(&r.latency);
        let mut line = format!("{} calls in {:.1}s = {:.0}/s, {} errors, {} unanswered; latency µs p50 {:.1} p90 {:.1} p99 {:.1} p99.9 {:.1} max {:.1}", r.calls, self.secs, self.per_s(), r.errors, r.unanswered, p.p50, p.p90, p.p99, p.p999, p.max);
        if let Some(cpu) = self.cpu_s.filter(|_| r.calls > 0) {
            line.push_str(&format!(
                "; serving CPU {:.0} %, {:.1} µs per call",
                cpu / self.secs * 100.0,
                cpu / r.calls as f64 * 1e6
            ));
        }
        line
    }
}

/// What a command learns about its target on the first connection it makes: the target
/// describes itself there, not on a connection of its own (a target may serve only so many,
/// as `gabp-relay check-bridge` serves one), and the command's watch counts its processes' CPU
/// as the run's own from then on.
pub struct Learn<'a> {
    /// The command's watch.
    pub watch: &'a mut Watch,
    /// The description, once learned.
    pub target: Option<Value>,
}

impl Learn<'_> {
    /// The description, or what is known without one.
    pub fn take(&mut self, addr: &Addr) -> Value {
        self.target
            .take()
            .unwrap_or_else(|| json!({"kind": "unknown", "address": addr.to_string()}))
    }
}

/// A bridge on `addr`: hello, then (on the first connection of a command that learns) the
/// target's description, then the subscription to `channels`, whose events a caller skips
/// unread while it waits (`discard_events`) and a reader reads.
async fn connect(
    addr: &Addr,
    token: &str,
    channels: &[String],
    discard_events: bool,
    learn: Option<&mut Learn<'_>>,
) -> Result<gabp_client::Client> {
    let (mut c, welcome) = gabp_client::Client::connect_hello(addr, token).await?;
    if let Some(l) = learn.filter(|l| l.target.is_none()) {
        let t = context::describe_client(&mut c, &welcome, addr).await;
        l.watch.own_target(&t);
        l.target = Some(t);
    }
    if !channels.is_empty() {
        let names: Vec<&str> = channels.iter().map(String::as_str).collect();
        c.subscribe(&names).await?;
        c.discard_events = discard_events;
    }
    Ok(c)
}

/// The serving processes of a round: those given, or those of the target learned.
fn pids_of(given: &[u32], learn: Option<&Learn<'_>>) -> Vec<u32> {
    match learn.and_then(|l| l.target.as_ref()) {
        Some(t) if given.is_empty() => serving_pids(t),
        _ => given.to_vec(),
    }
}

/// One round: connect, warm up, measure, stop; the CPU of `pids` (the serving processes, or
/// those of the target `learn`s about) is read as the window opens and closes.
pub async fn call_round(
    spec: &CallSpec,
    pids: &[u32],
    mut learn: Option<&mut Learn<'_>>,
) -> Result<CallRound> {
    let window = Arc::new(actors::Window::default());
    let stop = tokio_util::sync::CancellationToken::new();
    let (addr, token, subs) = (&spec.addr, &spec.token, &spec.subscribe);
    let task = match (spec.rate, spec.concurrency) {
        (Some(rate), _) if rate > 0.0 => {
            let c = connect(addr, token, subs, true, learn.as_deref_mut()).await?;
            tokio::spawn(actors::caller::fixed_rate(
                c,
                spec.tool.clone(),
                spec.args.clone(),
                rate,
                window.clone(),
                stop.clone(),
            ))
        }
        (None, Some(n)) if n > 0 && spec.one_connection => {
            let c = connect(addr, token, subs, true, learn.as_deref_mut()).await?;
            tokio::spawn(actors::caller::pipelined(
                c,
                spec.tool.clone(),
                spec.args.clone(),
                n,
                window.clone(),
                stop.clone(),
            ))
        }
        (None, Some(n)) if n > 0 => {
            let mut clients = Vec::new();
            for _ in 0..n {
                clients.push(connect(addr, token, subs, true, learn.as_deref_mut()).await?);
            }
            tokio::spawn(actors::caller::fixed_concurrency(
                clients,
                spec.tool.clone(),
                spec.args.clone(),
                window.clone(),
                stop.clone(),
            ))
        }
        _ => bail!("give --rate R (calls/s) or --concurrency N"),
    };
    let pids = pids_of(pids, learn.as_deref());
    tokio::time::sleep(Duration::from_secs_f64(spec.warmup.max(0.0))).await;
    let cpu = cpu_of(&pids);
    window.set(true);
    let t = Instant::now();
    tokio::time::sleep(Duration::from_secs_f64(spec.duration.max(0.1))).await;
    window.set(false);
    let secs = t.elapsed().as_secs_f64();
    let cpu_s = used(cpu, cpu_of(&pids));
    stop.cancel();
    let result = task.await?;
    Ok(CallRound {
        secs,
        result,
        cpu_s,
    })
}

/// The figures a person reads first in a call result: (label, path).
fn call_rows() -> Vec<(String, String)> {
    [
        ("calls/s", "calls_per_s"),
        ("latency p50", "latency_us.p50"),
        ("latency p90", "latency_us.p90"),
        ("latency p99", "latency_us.p99"),
        ("latency p99.9", "latency_us.p999"),
        ("target CPU", "cpu_percent"),
        ("CPU per call", "cpu_per_call_us"),
        ("errors", "errors"),
        ("unanswered", "unanswered"),
    ]
    .map(|(a, b)| (a.to_string(), b.to_string()))
    .to_vec()
}

/// Adds what makes a result self-describing: `config`, `target`, `context` and, on a busy
/// machine, `warnings`.
pub fn describe(doc: &mut Value, config: Value, target: Value, ctx: &context::Context) {
    doc["config"] = config;
    doc["target"] = target;
    doc["context"] = ctx.to_json();
    if let Some(w) = ctx.warning() {
        doc["warnings"] = json!([w]);
    }
}

/// The head of a human result: target, settings, command, version, machine.
pub fn head(target: &str, config: &str, ctx: &context::Context) -> String {
    let mut lines = vec![
        ("target", target.to_string()),
        ("config", config.to_string()),
    ];
    lines.extend(ctx.lines());
    lines
        .into_iter()
        .map(|(k, v)| format!("{k:<8} {v}\n"))
        .collect()
}

/// `gabp-loadgen call`.
pub async fn call_cmd(a: CallArgs) -> Result<()> {
    let mut watch = Watch::start();
    let spec = CallSpec::from_args(&a)?;
    let mut learn = Learn {
        watch: &mut watch,
        target: None,
    };
    let mut rounds = Vec::new();
    for _ in 0..a.rounds {
        rounds.push(call_round(&spec, &[], Some(&mut learn)).await?);
    }
    let target = learn.take(&spec.addr);
    let ctx = watch.finish();
    let docs: Vec<Value> = rounds.iter().map(|r| r.doc(&spec)).collect();
    let mut doc = spread::merge(docs);
    describe(&mut doc, spec.config(a.rounds), target.clone(), &ctx);
    if a.json {
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        print!(
            "{}",
            head(
                &context::target_line(&target),
                &spec.config_line(a.rounds),
                &ctx
            )
        );
        if rounds.len() == 1 {
            println!("{}", rounds[0].line());
        } else {
            for (i, r) in rounds.iter().enumerate() {
                println!("round {}/{}: {}", i + 1, rounds.len(), r.line());
            }
            print!("{}", spread::summary(&doc, &call_rows()));
        }
        println!("latency from {}", spec.latency_from());
    }
    ctx.warn();
    if let Some(path) = &a.report {
        let mut all = latency_histogram();
        for r in &rounds {
            let _ = all.add(&r.result.latency);
        }
        let mut figures: Vec<(&str, String)> = vec![
            ("target", context::target_line(&target)),
            ("config", spec.config_line(a.rounds)),
        ];
        figures.extend(ctx.lines());
        let p = |path: &str| {
            let v = spread::at(&doc, path).and_then(Value::as_f64);
            spread::cell(
                v,
                spread::of(&doc, path).as_ref(),
                crate::figures::unit(path),
            )
        };
        let n = rounds.len();
        let med = if n > 1 {
            format!(" (median of {n} rounds, min–max)")
        } else {
            String::new()
        };
        figures.extend([
            ("window", format!("{:.1} s", rounds[0].secs)),
            ("calls", p("calls")),
            ("calls/s", format!("{}{med}", p("calls_per_s"))),
            ("errors", p("errors")),
            ("unanswered", p("unanswered")),
            ("p50", p("latency_us.p50")),
            ("p90", p("latency_us.p90")),
            ("p99", p("latency_us.p99")),
            ("p99.9", p("latency_us.p999")),
            ("max", p("latency_us.max")),
            ("latency from", spec.latency_from()),
        ]);
        let html = report_html::call_page("gabp-loadgen call", &figures, report::curve(&all))?;
        report_html::write(path, &html)?;
    }
    if rounds.iter().all(|r| r.result.calls == 0) {
        bail!("no call was answered");
    }
    Ok(())
}

/// One round of `bridges`: `sc.bridges` readers (and `sc.stalled` that never read) on
/// `addr`, warm up, measure, stop; with the CPU seconds `pids` used in the window.
pub async fn bridges_round(
    addr: &Addr,
    token: &str,
    sc: &Scenario,
    pids: &[u32],
    mut learn: Option<&mut Learn<'_>>,
) -> Result<(Measurement, Option<f64>)> {
    let window = Arc::new(actors::Window::default());
    let stop = tokio_util::sync::CancellationToken::new();
    let mut readers = Vec::new();
    for i in 0..sc.bridges {
        let c = connect(addr, token, sc.channels_of(i), false, learn.as_deref_mut()).await?;
        readers.push(tokio::spawn(actors::bridge::read(
            c,
            sc.read_rate,
            actors::tally::Tally::new(window.clone(), None),
            stop.clone(),
        )));
    }
    let mut stalled = Vec::new();
    for _ in 0..sc.stalled {
        stalled.push(connect(addr, token, &sc.channels, false, learn.as_deref_mut()).await?);
    }
    let pids = pids_of(pids, learn.as_deref());
    tokio::time::sleep(sc.warmup()).await;
    let cpu = cpu_of(&pids);
    window.set(true);
    let t = Instant::now();
    tokio::time::sleep(sc.duration()).await;
    window.set(false);
    let cpu_s = used(cpu, cpu_of(&pids));
    stop.cancel();
    let mut m = Measurement::new("bridges", t.elapsed().as_secs_f64());
    m.unsampled = true;
    let mut h = latency_histogram();
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
    Ok((m, cpu_s))
}

/// `gabp-loadgen bridges`.
pub async fn bridges_cmd(a: BridgesArgs) -> Result<()> {
    let mut watch = Watch::start();
    let sc = a.scenario.scenario()?;
    let addr: Addr = a.addr.parse().map_err(|e: String| anyhow!(e))?;
    let mut learn = Learn {
        watch: &mut watch,
        target: None,
    };
    let mut rounds = Vec::new();
    let mut docs = Vec::new();
    for _ in 0..a.rounds {
        let (m, cpu) = bridges_round(&addr, &a.token, &sc, &[], Some(&mut learn)).await?;
        let mut doc = json!({"scenario": sc, "bridges": m});
        // The serving processes' CPU, when they run here (`bridges.cpu_percent` stays the
        // reading bridges' target as `run` samples it: unknown here).
        if let Some(cpu) = cpu {
            doc["cpu_percent"] = json!(cpu / m.duration_s * 100.0);
            if m.delivered > 0 {
                doc["cpu_per_event_us"] = json!(cpu / m.delivered as f64 * 1e6);
            }
        }
        docs.push(doc);
        rounds.push(m);
    }
    let target = learn.take(&addr);
    let ctx = watch.finish();
    let round_docs = docs.clone();
    let mut doc = spread::merge(docs);
    let config = json!({"rounds": a.rounds, "readers": sc.bridges, "stalled": sc.stalled, "channels": sc.channels, "read_rate": sc.read_rate, "warmup_s": sc.warmup_s, "duration_s": sc.duration_s});
    describe(&mut doc, config, target.clone(), &ctx);
    if a.json {
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        let config = format!(
            "{} reading bridges (+{} stalled) on {}, {} s measured after {} s warm-up, {} round{}",
            sc.bridges,
            sc.stalled,
            gabp_rt::display::text(&sc.channels.join(","), 80),
            sc.duration_s,
            sc.warmup_s,
            a.rounds,
            if a.rounds == 1 { "" } else { "s" }
        );
        print!("{}", head(&context::target_line(&target), &config, &ctx));
        for (i, m) in rounds.iter().enumerate() {
            if rounds.len() > 1 {
                println!("round {}/{}:", i + 1, rounds.len());
            }
            print!("{}", report::table(Some(m), None, &[]));
            let d = &round_docs[i];
            if let Some(cpu) = d["cpu_percent"].as_f64() {
                println!(
                    "serving CPU (the target's processes on this machine) {cpu:.0} %{}",
                    d["cpu_per_event_us"]
                        .as_f64()
                        .map_or(String::new(), |e| format!(", {e:.2} µs per event"))
                );
            }
        }
        if rounds.len() > 1 {
            let rows = [
                ("delivered/s", "bridges.delivered_eps"),
                ("latency p50", "bridges.latency_us.p50"),
                ("latency p99", "bridges.latency_us.p99"),
                ("drops", "bridges.dropped"),
                ("gaps", "bridges.unannounced_gaps"),
            ]
            .map(|(a, b)| (a.to_string(), b.to_string()));
            print!("{}", spread::summary(&doc, &rows));
        }
    }
    ctx.warn();
    Ok(())
}
