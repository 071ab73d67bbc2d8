//! Results: one measurement's figures, the JSON document scripts read, and the human table.

use hdrhistogram::Histogram;
use serde::Serialize;
use serde_json::{json, Value};

use crate::actors::caller::CallResult;
use crate::actors::latency_histogram;
use crate::actors::tally::ReaderResult;

/// Latency percentiles in microseconds. With no samples every figure is `null` in JSON (not
/// measured, which `compare` then leaves out), never a measured-looking 0.
#[derive(Debug, Clone, Default)]
pub struct Percentiles {
    /// Samples.
    pub count: u64,
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
    /// Maximum.
    pub max: f64,
}

impl Serialize for Percentiles {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let measured = |v: f64| (self.count > 0).then_some(v);
        let mut st = s.serialize_struct("Percentiles", 6)?;
        st.serialize_field("count", &self.count)?;
        st.serialize_field("p50", &measured(self.p50))?;
        st.serialize_field("p90", &measured(self.p90))?;
        st.serialize_field("p99", &measured(self.p99))?;
        st.serialize_field("p999", &measured(self.p999))?;
        st.serialize_field("max", &measured(self.max))?;
        st.end()
    }
}

impl Percentiles {
    /// From a histogram of nanoseconds.
    pub fn of(h: &Histogram<u64>) -> Percentiles {
        if h.is_empty() {
            return Percentiles::default();
        }
        let us = |v: u64| v as f64 / 1e3;
        Percentiles {
            count: h.len(),
            p50: us(h.value_at_quantile(0.5)),
            p90: us(h.value_at_quantile(0.9)),
            p99: us(h.value_at_quantile(0.99)),
            p999: us(h.value_at_quantile(0.999)),
            max: us(h.max()),
        }
    }
}

/// One look at a target during the window, for the report's charts over time.
#[derive(Debug, Clone, Copy, Default)]
pub struct Sample {
    /// Seconds since the window opened.
    pub t_s: f64,
    /// Events delivered so far in the window (all readers).
    pub delivered: u64,
    /// The target's CPU seconds so far (`None`: not sampled).
    pub cpu_s: Option<f64>,
    /// The target's resident memory, bytes.
    pub rss: Option<u64>,
}

/// Latency at [`gabp_report::chart::CURVE_QUANTILES`], (quantile, µs); empty without samples.
pub fn curve(h: &Histogram<u64>) -> Vec<(f64, f64)> {
    if h.is_empty() {
        return Vec::new();
    }
    gabp_report::chart::CURVE_QUANTILES
        .iter()
        .map(|&q| (q, h.value_at_quantile(q) as f64 / 1e3))
        .collect()
}

/// What one target did in the measurement window.
#[derive(Debug, Clone, Serialize)]
pub struct Measurement {
    /// `gabp-relay`, `baseline`, or the command measured.
    pub target: String,
    /// Window length in seconds.
    pub duration_s: f64,
    /// Events the mod published in the window.
    pub published: u64,
    /// Events the bridges received in the window (all bridges).
    pub delivered: u64,
    /// Published events per second.
    pub published_eps: f64,
    /// Delivered events per second (the headline figure).
    pub delivered_eps: f64,
    /// Event latency from scheduled send time, µs.
    pub latency_us: Percentiles,
    /// Seq gaps nobody announced (must be 0).
    pub unannounced_gaps: u64,
    /// Events announced as dropped.
    pub dropped: u64,
    /// Bridges disconnected by the target.
    pub disconnects: u64,
    /// tools/call answered in the window.
    pub calls: u64,
    /// tools/call errors.
    pub call_errors: u64,
    /// tools/call never answered.
    pub calls_unanswered: u64,
    /// tools/call latency from scheduled send time, µs.
    pub call_latency_us: Percentiles,
    /// Target CPU over the window, percent of one core.
    pub cpu_percent: f64,
    /// Target peak resident memory, MiB.
    pub peak_rss_mib: f64,
    /// Target resident memory at the end of the window, MiB.
    pub end_rss_mib: f64,
    /// Target open file descriptors at the end of the window.
    pub fds: u64,
    /// Problems met while running.
    pub errors: Vec<String>,
    /// The target process was not sampled (no pid, or a measurement of bridges alone): its
    /// CPU, memory and published figures are unknown and shown as `-`, not 0.
    #[serde(skip)]
    pub unsampled: bool,
    /// Samples over the window (for `--report`).
    #[serde(skip)]
    pub timeline: Vec<Sample>,
    /// Event latency curve, (quantile, µs) (for `--report`).
    #[serde(skip)]
    pub latency_curve: Vec<(f64, f64)>,
    /// tools/call latency curve, (quantile, µs) (for `--report`).
    #[serde(skip)]
    pub call_curve: Vec<(f64, f64)>,
}

impl Measurement {
    /// An empty measurement of `target` over `duration_s`.
    pub fn new(target: &str, duration_s: f64) -> Measurement {
        Measurement {
            target: target.into(),
            duration_s,
            published: 0,
            delivered: 0,
            published_eps: 0.0,
            delivered_eps: 0.0,
            latency_us: Percentiles::default(),
            unannounced_gaps: 0,
            dropped: 0,
            disconnects: 0,
            calls: 0,
            call_errors: 0,
            calls_unanswered: 0,
            call_latency_us: Percentiles::default(),
            cpu_percent: 0.0,
            peak_rss_mib: 0.0,
            end_rss_mib: 0.0,
            fds: 0,
            errors: Vec::new(),
            unsampled: false,
            timeline: Vec::new(),
            latency_curve: Vec::new(),
            call_curve: Vec::new(),
        }
    }

    /// Adds every reader's tally (counts and latency) and sets the rates; a reader that failed
    /// is named in `errors` as `who`.
    pub async fn add_readers(
        &mut self,
        readers: Vec<tokio::task::JoinHandle<ReaderResult>>,
        who: &str,
        errors: &mut Vec<String>,
    ) {
        let mut latency = latency_histogram();
        for r in readers {
            match r.await {
                Ok(r) => {
                    self.delivered += r.events;
                    self.unannounced_gaps += r.unannounced_gaps;
                    self.dropped += r.dropped;
                    self.disconnects += u64::from(r.disconnected);
                    let _ = latency.add(&r.latency);
                }
                Err(e) => errors.push(format!("{who}: {e}")),
            }
        }
        self.set_latency(&latency);
    }

    /// Sets event latency and the per-second rates.
    pub fn set_latency(&mut self, h: &Histogram<u64>) {
        self.latency_us = Percentiles::of(h);
        self.latency_curve = curve(h);
        self.published_eps = self.published as f64 / self.duration_s;
        self.delivered_eps = self.delivered as f64 / self.duration_s;
    }

    /// Sets the tool-call figures.
    pub fn set_calls(&mut self, r: &CallResult) {
        self.calls = r.calls;
        self.call_errors = r.errors;
        self.calls_unanswered = r.unanswered;
        self.call_latency_us = Percentiles::of(&r.latency);
        self.call_curve = curve(&r.latency);
    }
}

/// The JSON document of a run.
pub fn document(
    scenario: &crate::scenario::Scenario,
    relay: Option<&Measurement>,
    baseline: Option<&Measurement>,
    peers: &[Measurement],
) -> Value {
    let ratio = match (relay, baseline) {
        (Some(r), Some(b)) if b.delivered_eps > 0.0 => Some(r.delivered_eps / b.delivered_eps),
        _ => None,
    };
    // relay delivered/s over each peer's, measured in the same run.
    let peer_ratios: serde_json::Map<String, Value> = peers
        .iter()
        .filter_map(|p| {
            let r = relay?;
            (p.delivered_eps > 0.0)
                .then(|| (p.target.clone(), json!(r.delivered_eps / p.delivered_eps)))
        })
        .collect();
    json!({
        "tool": "gabp-loadgen",
        "version": env!("CARGO_PKG_VERSION"),
        "machine": crate::procstat::machine(),
        "scenario": scenario,
        "relay": relay,
        "baseline": baseline,
        "ratio": ratio,
        "peers": peers,
        "peer_ratios": peer_ratios,
    })
}

/// What the event latency of a paced run (`--rate max`, a closed loop) measures: mostly time
/// queued in the pacing window, not the target's service time. `per_bridge_eps` (events per
/// second each bridge received) sizes the window in time. `None` for a run at a fixed rate.
pub fn pace_note(
    scenario: &crate::scenario::Scenario,
    per_bridge_eps: Option<f64>,
) -> Option<String> {
    let w = scenario.pace_window()?;
    let drain = per_bridge_eps
        .filter(|r| *r > 0.0)
        .map(|r| {
            format!(
                " ({} events at {} per bridge ≈ {})",
                crate::figures::grouped(w as f64, 0),
                crate::figures::value(r, crate::figures::Unit::PerSecond),
                crate::figures::micros(w as f64 / r * 1e6)
            )
        })
        .unwrap_or_default();
    Some(format!(
        "at --rate max the publisher runs a closed loop at most {} events ahead of the slowest bridge, so event latency here is mostly time queued in that window{drain}, not the target's service time; measure latency at a fixed --rate (e.g. --rate 50000), and a call's with `call` or `overhead`",
        crate::figures::grouped(w as f64, 0)
    ))
}

/// The human table of a run.
pub fn table(
    relay: Option<&Measurement>,
    baseline: Option<&Measurement>,
    peers: &[Measurement],
) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    let _ = writeln!(
        o,
        "{:<13} {:>12} {:>12} {:>9} {:>9} {:>9} {:>9} {:>9} {:>7} {:>6} {:>6} {:>8}",
        "TARGET",
        "PUBLISHED/S",
        "DELIVERED/S",
        "P50 µs",
        "P90 µs",
        "P99 µs",
        "P99.9 µs",
        "MAX µs",
        "DROPS",
        "GAPS",
        "CPU%",
        "RSS MiB"
    );
    // A figure that was not measured shows `-`, never a 0 that reads as a measurement.
    let fig = |known: bool, v: f64, decimals: usize| {
        if known {
            format!("{v:.decimals$}")
        } else {
            "-".to_string()
        }
    };
    for m in [relay, baseline].into_iter().flatten().chain(peers) {
        let l = &m.latency_us;
        let lat = l.count > 0;
        let proc = !m.unsampled;
        let _ = writeln!(
            o,
            "{:<13} {:>12} {:>12.0} {:>9} {:>9} {:>9} {:>9} {:>9} {:>7} {:>6} {:>6} {:>8}",
            m.target,
            fig(proc || m.published > 0, m.published_eps, 0),
            m.delivered_eps,
            fig(lat, l.p50, 1),
            fig(lat, l.p90, 1),
            fig(lat, l.p99, 1),
            fig(lat, l.p999, 1),
            fig(lat, l.max, 1),
            m.dropped,
            m.unannounced_gaps,
            fig(proc, m.cpu_percent, 0),
            fig(proc, m.peak_rss_mib, 1)
        );
        if m.calls > 0 && m.call_latency_us.count > 0 {
            let c = &m.call_latency_us;
            let _ = writeln!(o, "{:<12} tools/call: {} answered, {} errors, {} unanswered, p50 {:.1} µs, p99 {:.1} µs, max {:.1} µs", "", m.calls, m.call_errors, m.calls_unanswered, c.p50, c.p99, c.max);
        }
        for e in &m.errors {
            let _ = writeln!(o, "{:<12} error: {e}", "");
        }
    }
    if let (Some(r), Some(b)) = (relay, baseline) {
        if b.delivered_eps > 0.0 {
            let _ = writeln!(
                o,
                "ratio (relay delivered / baseline delivered): {:.3}",
                r.delivered_eps / b.delivered_eps
            );
        }
    }
    for p in peers {
        if let Some(r) = relay.filter(|_| p.delivered_eps > 0.0) {
            let _ = writeln!(
                o,
                "ratio (relay delivered / {} delivered): {:.3}",
                p.target,
                r.delivered_eps / p.delivered_eps
            );
        }
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn closed_loop_latency_is_labelled_as_queueing() {
        let mut sc = crate::scenario::Scenario::default();
        let n = pace_note(&sc, Some(512_000.0)).expect("paced at max rate");
        assert!(n.contains("8,192 events") && n.contains("16 ms"), "{n}");
        assert!(n.contains("queued"), "{n}");
        sc.rate = 50_000.0;
        assert!(
            pace_note(&sc, Some(50_000.0)).is_none(),
            "a fixed rate is not paced"
        );
    }

    #[test]
    fn unmeasured_figures_show_a_dash_not_zero() {
        let mut m = Measurement::new("bridges", 1.0);
        m.delivered = 10;
        m.delivered_eps = 10.0;
        m.unsampled = true;
        let t = table(Some(&m), None, &[]);
        let row = t.lines().nth(1).expect("a row");
        let cells: Vec<&str> = row.split_whitespace().collect();
        // target, published/s, delivered/s, five latencies, drops, gaps, cpu, rss
        assert_eq!(cells.len(), 12, "{row}");
        assert_eq!(cells[1], "-", "published not measured: {row}");
        assert_eq!(cells[2], "10", "{row}");
        assert!(
            cells[3..8].iter().all(|c| *c == "-"),
            "no latency samples: {row}"
        );
        assert_eq!(&cells[10..], ["-", "-"], "process not sampled: {row}");
        m.unsampled = false;
        m.cpu_percent = 12.0;
        let t = table(Some(&m), None, &[]);
        assert!(t.lines().nth(1).expect("row").contains(" 12 "), "{t}");
    }

    /// In JSON too: percentiles with no samples (no tool calls made) are null, so `compare`
    /// leaves them out instead of comparing two zeros; measured ones are numbers.
    #[test]
    fn unmeasured_percentiles_are_null_in_json() {
        let none = serde_json::to_value(Percentiles::default()).expect("json");
        assert_eq!(none["count"], 0);
        for k in ["p50", "p90", "p99", "p999", "max"] {
            assert!(none[k].is_null(), "{k}: {none}");
        }
        let mut h = latency_histogram();
        h.record(1_500).expect("record");
        let some = serde_json::to_value(Percentiles::of(&h)).expect("json");
        assert_eq!(some["count"], 1);
        assert!(some["p50"].as_f64().is_some_and(|v| v > 1.0), "{some}");
        let figures = crate::compare::compare(&json!({"c": none.clone()}), &json!({"c": none}));
        assert_eq!(figures.len(), 1, "only the count is a figure: {figures:?}");
    }
}
