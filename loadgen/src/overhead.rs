//! `gabp-loadgen overhead --mod ADDR --relay ADDR`: what a relay adds to a mod. Each round
//! measures closed-loop `tools/call` at each `--concurrency` straight to the mod and then
//! through the relay, back to back, and (when the mod's welcome lists event channels) events
//! delivered to `--readers` bridges both ways; so drift on the machine hits both sides of
//! every pair. Reports each figure's median and range over the rounds on both sides, the
//! relay's change, the median of the rounds' paired ratios, and whether the difference is
//! beyond the noise (the two ranges do not overlap). Where the mod and the relay run on this
//! machine, their CPU per call and per event is counted too. It starts and stops nothing: the
//! mod and the relay are the user's.

use std::path::PathBuf;

use anyhow::{anyhow, Result};
use clap::Args;
use gabp_rt::display::{self, Align, Table};
use gabp_sim::Addr;
use serde_json::{json, Value};

use crate::args::{parse_rounds, parse_secs, parse_secs_or_zero};
use crate::calls::{self, CallSpec};
use crate::context::{self, Watch};
use crate::figures;
use crate::scenario::Scenario;
use crate::spread::{self, Stats, Verdict};
use crate::target::Target;

#[derive(Args, Debug)]
pub(crate) struct OverheadArgs {
    /// The mod, reached directly.
    #[arg(long = "mod", value_name = "ADDR")]
    pub(crate) the_mod: String,
    /// The mod's token.
    #[arg(
        long,
        default_value = "",
        env = "GABP_UPSTREAM_TOKEN",
        hide_env_values = true
    )]
    pub(crate) mod_token: String,
    /// The relay in front of that mod.
    #[arg(long, value_name = "ADDR")]
    pub(crate) relay: String,
    /// The relay's bridge token.
    #[arg(
        long,
        default_value = "",
        env = "GABP_RELAY_TOKEN",
        hide_env_values = true
    )]
    pub(crate) relay_token: String,
    /// The tool to call.
    #[arg(long, default_value = "sim/echo")]
    pub(crate) tool: String,
    /// Its arguments (JSON).
    #[arg(long, default_value = "{}")]
    pub(crate) args: String,
    /// Concurrent callers (closed loop), each measured in turn (comma separated).
    #[arg(long, value_delimiter = ',', default_value = "1,4")]
    pub(crate) concurrency: Vec<usize>,
    /// Channels each caller subscribes to while it calls (comma separated).
    #[arg(long, value_delimiter = ',')]
    pub(crate) subscribe: Vec<String>,
    /// Bridges reading the mod's events (every channel its welcome lists), direct and through
    /// the relay; 0 measures no events.
    #[arg(long, default_value_t = 4)]
    pub(crate) readers: usize,
    /// Rounds: each measures every figure direct, then through the relay.
    #[arg(long, default_value_t = 3, value_parser = parse_rounds)]
    pub(crate) rounds: usize,
    /// Time measured per figure and side: seconds, or a duration like 3s.
    #[arg(long, default_value = "3s", value_parser = parse_secs)]
    pub(crate) duration: f64,
    /// Warm-up before each: seconds, or a duration like 500ms.
    #[arg(long, default_value = "500ms", value_parser = parse_secs_or_zero)]
    pub(crate) warmup: f64,
    /// Weigh the relay against a byte pipe to the same mod instead of the mod itself: a
    /// process copying bytes unread (started here, stopped at the end), the floor any proxy
    /// adds on this machine; the difference is the relay's own cost.
    #[arg(long)]
    pub(crate) via_pipe: bool,
    /// Print one JSON document.
    #[arg(long)]
    pub(crate) json: bool,
    /// Also write the JSON document to this file.
    #[arg(long, value_name = "PATH")]
    pub(crate) output: Option<PathBuf>,
}

/// One side: where, with which token, and the local processes that serve it.
struct Side {
    addr: Addr,
    token: String,
    pids: Vec<u32>,
}

/// One call measurement on one side: the round's document, with the serving processes' CPU
/// per call when they are local.
async fn call_on(side: &Side, spec: &CallSpec) -> Result<Value> {
    let spec = CallSpec {
        addr: side.addr.clone(),
        token: side.token.clone(),
        ..spec.clone()
    };
    Ok(calls::call_round(&spec, &side.pids, None).await?.doc(&spec))
}

/// One events measurement on one side.
async fn events_on(side: &Side, sc: &Scenario) -> Result<Value> {
    let (m, cpu) = calls::bridges_round(&side.addr, &side.token, sc, &side.pids, None).await?;
    let mut doc = json!({
        "duration_s": m.duration_s,
        "delivered": m.delivered,
        "delivered_eps": m.delivered_eps,
        "dropped": m.dropped,
        "unannounced_gaps": m.unannounced_gaps,
        "disconnects": m.disconnects,
    });
    if let Some(cpu) = cpu {
        doc["cpu_percent"] = json!(cpu / m.duration_s * 100.0);
        if m.delivered > 0 {
            doc["cpu_per_event_us"] = json!(cpu / m.delivered as f64 * 1e6);
        }
    }
    Ok(doc)
}

/// The rows of the table: (label, path under `direct` and `relay`).
fn rows(concurrency: &[usize], readers: Option<usize>, doc: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for c in concurrency {
        let k = format!("concurrency_{c}");
        out.push((
            format!("calls/s, concurrency {c}"),
            format!("{k}.calls_per_s"),
        ));
        out.push((
            format!("p50, concurrency {c}"),
            format!("{k}.latency_us.p50"),
        ));
        out.push((
            format!("p99, concurrency {c}"),
            format!("{k}.latency_us.p99"),
        ));
        out.push((
            format!("CPU per call, concurrency {c}"),
            format!("{k}.cpu_per_call_us"),
        ));
        for e in ["errors", "unanswered"] {
            let p = format!("{k}.{e}");
            let any = |side: &str| spread::at(&doc[side], &p).and_then(Value::as_f64) != Some(0.0);
            if any("direct") || any("relay") {
                out.push((format!("{e}, concurrency {c}"), p));
            }
        }
    }
    if let Some(n) = readers {
        out.push((
            format!("events/s delivered, {n} readers"),
            "events.delivered_eps".into(),
        ));
        out.push((
            format!("CPU per event delivered, {n} readers"),
            "events.cpu_per_event_us".into(),
        ));
        out.push(("event drops".into(), "events.dropped".into()));
        out.push(("event gaps".into(), "events.unannounced_gaps".into()));
    }
    // A figure neither side measured (CPU of a process on another machine) has no row.
    out.retain(|(_, p)| {
        spread::at(&doc["direct"], p).is_some_and(Value::is_number)
            || spread::at(&doc["relay"], p).is_some_and(Value::is_number)
    });
    out
}

/// One row of the comparison: both sides' medians and spread, the rounds' paired ratios.
fn comparison(doc: &Value, label: &str, path: &str) -> Value {
    let get = |side: &str| spread::at(&doc[side], path).and_then(Value::as_f64);
    let (d, r) = (get("direct"), get("relay"));
    let (sd, sr) = (
        spread::of(doc, &format!("direct.{path}")),
        spread::of(doc, &format!("relay.{path}")),
    );
    let ratios: Vec<f64> = doc["round_results"]
        .as_array()
        .map(|rounds| {
            rounds
                .iter()
                .filter_map(|round| {
                    let d = spread::at(&round["direct"], path)?.as_f64()?;
                    let r = spread::at(&round["relay"], path)?.as_f64()?;
                    (d != 0.0).then_some(r / d)
                })
                .collect()
        })
        .unwrap_or_else(|| {
            d.zip(r)
                .filter(|(d, _)| *d != 0.0)
                .map(|(d, r)| r / d)
                .into_iter()
                .collect()
        });
    let better = figures::better(path);
    let verdict = spread::verdict(d, r, sd.as_ref(), sr.as_ref(), better);
    json!({
        "figure": path,
        "label": label,
        "unit": figures::unit(path),
        "better": better,
        "direct": d,
        "relay": r,
        "direct_spread": sd,
        "relay_spread": sr,
        "change": d.zip(r).map(|(d, r)| r - d),
        "ratio": Stats::of(&ratios),
        "verdict": verdict,
        "beyond_noise": verdict.beyond_noise(),
    })
}

/// What a verdict says about the relay, in words.
fn phrase(v: Verdict) -> &'static str {
    match v {
        Verdict::Same => "the same",
        Verdict::Better => "better, beyond noise",
        Verdict::Worse => "worse, beyond noise",
        Verdict::WithinNoise => "within noise",
        Verdict::BetterUnknownNoise => "better? (1 round)",
        Verdict::WorseUnknownNoise => "worse? (1 round)",
        Verdict::Changed => "different, beyond noise",
        Verdict::ChangedUnknownNoise => "different? (1 round)",
        Verdict::Missing => "-",
    }
}

/// The human table of a result's comparison rows.
pub fn table(comparison: &[Value], baseline: Baseline) -> String {
    let (side, short) = baseline.labels();
    let (minus, ratio) = (format!("RELAY - {short}"), format!("RELAY ÷ {short}"));
    let mut t = Table::new(&[
        ("FIGURE", Align::Left, 44),
        (side, Align::Right, 36),
        ("THROUGH THE RELAY", Align::Right, 36),
        (&minus, Align::Right, 16),
        (&ratio, Align::Right, 24),
        ("THE RELAY IS", Align::Left, 48),
    ]);
    for c in comparison {
        let path = c["figure"].as_str().unwrap_or("");
        let unit = figures::unit(path);
        let stats = |k: &str| Stats::from_json(&c[k]);
        let ratio = stats("ratio").map_or("-".into(), |s| {
            let f = |v: f64| format!("{v:.2}");
            if s.n > 1 {
                format!("×{} ({}–{})", f(s.median), f(s.min), f(s.max))
            } else {
                format!("×{}", f(s.median))
            }
        });
        let verdict: Verdict =
            serde_json::from_value(c["verdict"].clone()).unwrap_or(Verdict::Missing);
        t.row(vec![
            display::text(c["label"].as_str().unwrap_or(path), 44),
            spread::cell(c["direct"].as_f64(), stats("direct_spread").as_ref(), unit),
            spread::cell(c["relay"].as_f64(), stats("relay_spread").as_ref(), unit),
            c["change"]
                .as_f64()
                .map_or("-".into(), |d| figures::difference(d, unit)),
            ratio,
            format!(
                "{}{}",
                phrase(verdict),
                match c["better"].as_str() {
                    Some("higher") if verdict != Verdict::Same => " (higher is better)",
                    Some("lower") if verdict != Verdict::Same => " (lower is better)",
                    _ => "",
                }
            ),
        ]);
    }
    t.render()
}

/// What the relay is weighed against: the mod itself, or a byte pipe in front of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Baseline {
    Direct,
    Pipe,
}

impl Baseline {
    /// The table's column and its short name.
    fn labels(self) -> (&'static str, &'static str) {
        match self {
            Baseline::Direct => ("DIRECT", "DIRECT"),
            Baseline::Pipe => ("THROUGH A BYTE PIPE", "PIPE"),
        }
    }

    /// How to read the table.
    fn legend(self) -> &'static str {
        match self {
            Baseline::Direct => {
                "\
Cells read median (min–max) over the rounds. RELAY ÷ DIRECT is the median (min–max) of each
round's own ratio, the two sides measured back to back. Beyond noise: the relay's range over
the rounds does not overlap the direct one; within noise: they overlap; the same: within 0.5 %
in every round. CPU is that of the processes serving the calls or events (the mod; the relay
and the mod), counted where they run on this machine. Events/s is what the mod emits times the readers
unless a side falls behind: equal figures say neither fell behind, not that both are as fast.
"
            }
            Baseline::Pipe => {
                "\
Cells read median (min–max) over the rounds. RELAY ÷ PIPE is the median (min–max) of each
round's own ratio, the two sides measured back to back. The pipe copies bytes unread, each
connection on a connection of its own to the mod: what any proxy process costs here, so the
difference is the relay's own work. Beyond noise: the two ranges over the rounds do not
overlap; within noise: they do; the same: within 0.5 % in every round. CPU is that of the
processes serving the calls or events (the pipe and the mod; the relay and the mod), counted
where they run on this machine. Events/s is what the mod emits times the readers unless a side falls behind.
"
            }
        }
    }
}

/// The command.
pub(crate) async fn main(a: OverheadArgs) -> Result<()> {
    let mut watch = Watch::start();
    let parse = |s: &str| s.parse::<Addr>().map_err(|e: String| anyhow!(e));
    let (mod_addr, relay_addr) = (parse(&a.the_mod)?, parse(&a.relay)?);
    let mod_t = context::describe_target(&mod_addr, &a.mod_token).await?;
    let relay_t = context::describe_target(&relay_addr, &a.relay_token).await?;
    watch.own_target(&mod_t);
    watch.own_target(&relay_t);
    let mut warnings = Vec::new();
    if relay_t["kind"] != "relay" {
        warnings.push(format!(
            "{} does not say it is a relay in its welcome",
            relay_addr
        ));
    }
    let upstream: Option<Addr> = relay_t["upstream"].as_str().and_then(|u| u.parse().ok());
    if let Some(u) = upstream.filter(|u| *u != mod_addr) {
        warnings.push(format!(
            "the relay's mod is {u}, not --mod {mod_addr}: the two sides may not reach the same mod"
        ));
    }
    let pid = |t: &Value, k: &str| t[k].as_u64().and_then(|p| u32::try_from(p).ok());
    let mod_pid = pid(&mod_t, "pid");
    let baseline = if a.via_pipe {
        Baseline::Pipe
    } else {
        Baseline::Direct
    };
    let pipe = match (baseline, &mod_addr) {
        (Baseline::Direct, _) => None,
        (Baseline::Pipe, Addr::Tcp(m)) => Some(Target::pipe(*m, &a.mod_token).await?),
        (Baseline::Pipe, Addr::Unix(p)) => {
            anyhow::bail!("--via-pipe needs a mod on TCP, not {}", p.display())
        }
    };
    let direct = match &pipe {
        // Through the pipe, a call costs the pipe's CPU and the mod's.
        Some(p) => Side {
            addr: p.addr.clone(),
            token: a.mod_token.clone(),
            pids: p.pid().into_iter().chain(mod_pid).collect(),
        },
        None => Side {
            addr: mod_addr,
            token: a.mod_token.clone(),
            pids: mod_pid.into_iter().collect(),
        },
    };
    let relay = Side {
        addr: relay_addr,
        token: a.relay_token.clone(),
        // Through the relay, a call costs the relay's CPU and the mod's.
        pids: pid(&relay_t, "pid").into_iter().chain(mod_pid).collect(),
    };
    let channels: Vec<String> = mod_t["channels"]
        .as_array()
        .map(|c| {
            c.iter()
                .filter_map(|c| c.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default();
    let readers = (a.readers > 0 && !channels.is_empty()).then_some(a.readers);
    let sc = Scenario {
        name: "overhead".into(),
        bridges: a.readers,
        channels: channels.clone(),
        warmup_s: a.warmup,
        duration_s: a.duration,
        ..Scenario::default()
    };
    let base = CallSpec {
        addr: direct.addr.clone(),
        token: String::new(),
        tool: a.tool.clone(),
        args: serde_json::from_str(&a.args).map_err(|e| anyhow!("--args: {e}"))?,
        rate: None,
        concurrency: None,
        one_connection: false,
        subscribe: a.subscribe.clone(),
        warmup: a.warmup,
        duration: a.duration,
    };
    let mut concurrency = a.concurrency.clone();
    concurrency.retain(|c| *c > 0);
    if concurrency.is_empty() {
        anyhow::bail!("--concurrency needs at least one count above 0");
    }
    let mut rounds = Vec::new();
    for i in 0..a.rounds {
        if !a.json {
            eprintln!("round {}/{}", i + 1, a.rounds);
        }
        let (mut d, mut r) = (json!({}), json!({}));
        for c in &concurrency {
            let spec = CallSpec {
                concurrency: Some(*c),
                ..base.clone()
            };
            let k = format!("concurrency_{c}");
            d[&k] = call_on(&direct, &spec).await?;
            r[&k] = call_on(&relay, &spec).await?;
        }
        if readers.is_some() {
            d["events"] = events_on(&direct, &sc).await?;
            r["events"] = events_on(&relay, &sc).await?;
        }
        rounds.push(json!({"direct": d, "relay": r}));
    }
    let ctx = watch.finish();
    let mut doc = spread::merge(rounds);
    let rows = rows(&concurrency, readers, &doc);
    let comparison: Vec<Value> = rows
        .iter()
        .map(|(label, path)| comparison(&doc, label, path))
        .collect();
    doc["comparison"] = json!(comparison);
    let config = json!({
        "tool": a.tool, "args": base.args, "concurrency": concurrency, "subscribe": a.subscribe,
        "readers": readers.unwrap_or(0), "channels": channels, "rounds": a.rounds,
        "warmup_s": a.warmup, "duration_s": a.duration,
        "baseline": match baseline { Baseline::Direct => "the mod", Baseline::Pipe => "a byte pipe to the mod" },
        "order": match baseline {
            Baseline::Direct => "each round: every figure direct, then through the relay",
            Baseline::Pipe => "each round: every figure through the pipe, then through the relay",
        },
    });
    calls::describe(
        &mut doc,
        config,
        json!({"mod": mod_t, "relay": relay_t}),
        &ctx,
    );
    // `describe` put both targets under `target`; `targets` says there are two.
    if let Some(t) = doc.as_object_mut().and_then(|m| m.remove("target")) {
        doc["targets"] = t;
    }
    if let Some(p) = &pipe {
        doc["targets"]["pipe"] = json!({"addr": p.addr.to_string(), "pid": p.pid()});
    }
    if !warnings.is_empty() {
        let mut all = warnings.clone();
        all.extend(ctx.warning());
        doc["warnings"] = json!(all);
    }
    if let Some(path) = &a.output {
        std::fs::write(path, serde_json::to_vec_pretty(&doc)?)
            .map_err(|e| anyhow!("writing {}: {e}", path.display()))?;
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        let config = format!(
            "{}, closed loop at concurrency {}{}, {} s measured after {} s warm-up per figure and side, {} round{}, {} then relay in each",
            display::text(&a.tool, 48),
            concurrency.iter().map(usize::to_string).collect::<Vec<_>>().join(" and "),
            readers.map_or(String::new(), |n| format!(
                "; events to {n} readers on {}",
                display::text(&channels.join(","), 80)
            )),
            a.duration,
            a.warmup,
            a.rounds,
            if a.rounds == 1 { "" } else { "s" },
            match baseline {
                Baseline::Direct => "direct",
                Baseline::Pipe => "pipe",
            }
        );
        let mut lines = vec![
            (
                if pipe.is_some() { "mod" } else { "direct" },
                context::target_line(&mod_t),
            ),
            ("relay", context::target_line(&relay_t)),
        ];
        if let Some(p) = &pipe {
            lines.push((
                "pipe",
                format!("gabp-loadgen pipe at {}, bytes copied unread", p.addr),
            ));
        }
        lines.push(("config", config));
        lines.extend(ctx.lines());
        for (k, v) in lines {
            println!("{k:<8} {v}");
        }
        println!("\n{}", table(&comparison, baseline));
        print!("{}", baseline.legend());
    }
    for w in &warnings {
        eprintln!("gabp-loadgen: warning: {w}");
    }
    ctx.warn();
    if let Some(p) = pipe {
        p.stop(std::time::Duration::from_secs(1)).await;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round(d: f64, r: f64, dp50: f64, rp50: f64) -> Value {
        json!({
            "direct": {"concurrency_1": {"calls_per_s": d, "latency_us": {"p50": dp50}, "errors": 0}},
            "relay": {"concurrency_1": {"calls_per_s": r, "latency_us": {"p50": rp50}, "errors": 0}},
        })
    }

    #[test]
    fn the_table_says_what_the_relay_adds_and_whether_it_is_noise() {
        let doc = spread::merge(vec![
            round(12_000.0, 5_000.0, 80.0, 190.0),
            round(12_500.0, 5_200.0, 78.0, 185.0),
            round(11_800.0, 5_100.0, 82.0, 80.0),
        ]);
        let rows = rows(&[1], None, &doc);
        assert_eq!(
            rows.iter().map(|(_, p)| p.as_str()).collect::<Vec<_>>(),
            ["concurrency_1.calls_per_s", "concurrency_1.latency_us.p50"],
            "no CPU and no errors measured: no rows for them"
        );
        let c: Vec<Value> = rows.iter().map(|(l, p)| comparison(&doc, l, p)).collect();
        assert_eq!(c[0]["verdict"], "worse");
        assert_eq!(c[0]["beyond_noise"], true);
        let ratio = Stats::from_json(&c[0]["ratio"]).expect("paired ratios");
        assert_eq!(ratio.n, 3);
        assert!(
            (ratio.median - 5_000.0 / 12_000.0).abs() < 1e-9,
            "{ratio:?}"
        );
        assert_eq!(
            c[1]["verdict"], "within_noise",
            "one relay round as fast as direct"
        );
        let t = table(&c, Baseline::Direct);
        assert!(t
            .lines()
            .next()
            .is_some_and(|h| h.contains("RELAY ÷ DIRECT")));
        let piped = table(&c, Baseline::Pipe);
        let header = piped.lines().next().expect("header");
        assert!(
            header.contains("THROUGH A BYTE PIPE") && header.contains("RELAY ÷ PIPE"),
            "{header}"
        );
        let row = t.lines().find(|l| l.starts_with("calls/s")).expect("row");
        assert!(
            row.contains("12 k/s (11.8–12.5 k/s)") || row.contains("12 k/s (11.8–12.5)"),
            "{row}"
        );
        assert!(
            row.contains("worse, beyond noise (higher is better)"),
            "{row}"
        );
        assert!(row.contains("×0.42 (0.42–0.43)"), "{row}");
        let p50 = t.lines().find(|l| l.starts_with("p50")).expect("row");
        assert!(p50.contains("within noise (lower is better)"), "{p50}");
    }
}
