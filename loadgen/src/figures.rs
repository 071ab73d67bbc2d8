//! What a figure in a `--json` result is: its path (`relay.latency_us.p99`), its unit (from its
//! name), which direction is better, and how a person reads it (`48.6 k/s`, `104 µs`, `×0.87
//! (-13.0 %)`, thousands grouped, never scientific notation in the usual range). Also which
//! parts of a result are settings (what was run, where, on what) rather than measurements.
//! Nothing here measures or prints; `compare`, the rounds' summaries and `overhead` use it.

use serde::Serialize;
use serde_json::Value;

/// Top-level members that say what was run and where, not what was measured: compared as
/// settings, never as figures.
pub const SETTINGS: &[&str] = &[
    "config",
    "scenario",
    "target",
    "targets",
    "machine",
    "version",
    "tool_version",
];

/// Top-level members that describe the run or hold its rounds: neither settings nor figures.
pub const ABOUT: &[&str] = &[
    "context",
    "spread",
    "round_results",
    "warnings",
    "comparison",
    "checks",
];

/// Whether the top-level member `key` holds figures.
pub fn holds_figures(key: &str) -> bool {
    !SETTINGS.contains(&key) && !ABOUT.contains(&key)
}

/// A path joined with `key`.
pub fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

/// Every leaf of `v` (numbers, strings, booleans, nulls) with its path, in document order.
pub fn leaves<'a>(v: &'a Value, path: &str, out: &mut Vec<(String, &'a Value)>) {
    match v {
        Value::Object(m) => m.iter().for_each(|(k, v)| leaves(v, &join(path, k), out)),
        Value::Array(a) => a
            .iter()
            .enumerate()
            .for_each(|(i, v)| leaves(v, &join(path, &i.to_string()), out)),
        _ => out.push((path.to_string(), v)),
    }
}

/// The figures of a result: every number outside its settings and its description.
pub fn numbers(doc: &Value) -> Vec<(String, f64)> {
    let mut all = Vec::new();
    match doc {
        Value::Object(m) => m
            .iter()
            .filter(|(k, _)| holds_figures(k))
            .for_each(|(k, v)| leaves(v, k, &mut all)),
        other => leaves(other, "", &mut all),
    }
    all.into_iter()
        .filter_map(|(p, v)| v.as_f64().map(|f| (p, f)))
        .collect()
}

/// The settings of a result: every leaf of its settings members, and every string or boolean
/// among its figures (a mode, a target's name, `record: false`).
pub fn settings(doc: &Value) -> Vec<(String, Value)> {
    let Value::Object(m) = doc else {
        return Vec::new();
    };
    let mut all = Vec::new();
    for (k, v) in m {
        if ABOUT.contains(&k.as_str()) {
            continue;
        }
        let mut here = Vec::new();
        setting_leaves(v, k, &mut here);
        let setting = SETTINGS.contains(&k.as_str());
        all.extend(
            here.into_iter()
                .filter(|(_, v)| {
                    setting
                        || v.is_string()
                        || v.is_boolean()
                        || v.as_array()
                            .is_some_and(|a| !a.iter().any(Value::is_number))
                })
                .map(|(p, v)| (p, v.clone())),
        );
    }
    all
}

/// Like [`leaves`], but a list of plain values (channels, concurrencies) is one leaf: a setting
/// of its own, not one per item. Empty lists are left out.
fn setting_leaves<'a>(v: &'a Value, path: &str, out: &mut Vec<(String, &'a Value)>) {
    match v {
        Value::Object(m) => m
            .iter()
            .for_each(|(k, v)| setting_leaves(v, &join(path, k), out)),
        Value::Array(a) if a.is_empty() => {}
        Value::Array(a) if a.iter().all(|x| !x.is_object() && !x.is_array()) => {
            out.push((path.to_string(), v));
        }
        Value::Array(a) => a
            .iter()
            .enumerate()
            .for_each(|(i, v)| setting_leaves(v, &join(path, &i.to_string()), out)),
        _ => out.push((path.to_string(), v)),
    }
}

/// The last name in a path that is not an array index.
fn last_name(path: &str) -> &str {
    path.rsplit('.')
        .find(|s| s.parse::<usize>().is_err())
        .unwrap_or(path)
}

/// What a figure measures, from its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Unit {
    /// Microseconds (`latency_us.p50`).
    Micros,
    /// Milliseconds (`*_ms`).
    Millis,
    /// Seconds (`duration_s`).
    Seconds,
    /// Per second (`calls_per_s`, `delivered_eps`).
    PerSecond,
    /// Mebibytes (`peak_rss_mib`).
    Mib,
    /// Percent (`cpu_percent`).
    Percent,
    /// A ratio of two figures (`ratio`, `peer_ratios.redis`).
    Ratio,
    /// A count or any other number.
    Plain,
}

/// The unit of the figure at `path`.
pub fn unit(path: &str) -> Unit {
    let name = last_name(path);
    let parent = path
        .rsplit('.')
        .filter(|s| s.parse::<usize>().is_err())
        .nth(1)
        .unwrap_or("");
    if parent.ends_with("_us") && name != "count" || name.ends_with("_us") {
        Unit::Micros
    } else if parent.ends_with("_ms") && name != "count" || name.ends_with("_ms") {
        Unit::Millis
    } else if name.ends_with("_per_s") || name.ends_with("_eps") || name.ends_with("_hz") {
        Unit::PerSecond
    } else if name.ends_with("_s") {
        Unit::Seconds
    } else if name.ends_with("_mib") {
        Unit::Mib
    } else if name.ends_with("_percent") || name.ends_with("_pct") {
        Unit::Percent
    } else if name == "ratio" || name.ends_with("_ratio") || parent.ends_with("ratios") {
        Unit::Ratio
    } else {
        Unit::Plain
    }
}

/// Which direction of a figure is better.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Better {
    /// More is better (throughput, ratios to a baseline, events delivered).
    Higher,
    /// Less is better (latency, errors, drops, CPU, memory).
    Lower,
}

impl Better {
    /// `higher` or `lower`.
    pub fn word(self) -> &'static str {
        match self {
            Better::Higher => "higher",
            Better::Lower => "lower",
        }
    }
}

/// Which direction of the figure at `path` is better; `None` when neither is (a window's
/// length, a sample count, a seed).
pub fn better(path: &str) -> Option<Better> {
    let name = last_name(path);
    const LOWER: &[&str] = &[
        "errors",
        "call_errors",
        "unanswered",
        "calls_unanswered",
        "dropped",
        "drops",
        "unannounced_gaps",
        "gaps",
        "disconnects",
        "fds",
        "cpu_percent",
        "cpu_per_call_us",
        "cpu_per_event_us",
    ];
    const HIGHER: &[&str] = &["calls", "delivered", "published", "events"];
    match unit(path) {
        _ if LOWER.contains(&name) => Some(Better::Lower),
        _ if HIGHER.contains(&name) => Some(Better::Higher),
        Unit::Micros | Unit::Millis if name != "count" => Some(Better::Lower),
        Unit::PerSecond | Unit::Ratio => Some(Better::Higher),
        Unit::Mib => Some(Better::Lower),
        _ => None,
    }
}

/// `v` with 3 significant digits, plainly (`0.0136`, `1.24`, `12.5`, `950`).
fn sig3(v: f64) -> String {
    let a = v.abs();
    if a == 0.0 {
        return "0".into();
    }
    if a < 1e-9 {
        return if v < 0.0 {
            "-0.000000001"
        } else {
            "0.000000001"
        }
        .into();
    }
    let decimals = (2 - a.log10().floor() as i32).clamp(0, 12) as usize;
    let s = format!("{v:.decimals$}");
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

/// `v` rounded to `decimals` with thousands grouped (`1,234,567.5`).
pub fn grouped(v: f64, decimals: usize) -> String {
    let s = format!("{:.decimals$}", v.abs());
    let (int, frac) = s.split_once('.').map_or((s.as_str(), ""), |(i, f)| (i, f));
    let mut out = String::new();
    for (i, c) in int.chars().enumerate() {
        if i > 0 && (int.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    if !frac.is_empty() {
        out.push('.');
        out.push_str(frac);
    }
    if v < 0.0 && out.chars().any(|c| c != '0' && c != '.' && c != ',') {
        out.insert(0, '-');
    }
    out
}

/// A large number with a k/M/G suffix and 3 significant digits (`48.6 k`, `1.24 M`).
fn scaled(v: f64) -> String {
    const STEPS: &[(f64, &str)] = &[
        (1e18, "E"),
        (1e15, "P"),
        (1e12, "T"),
        (1e9, "G"),
        (1e6, "M"),
        (1e3, "k"),
    ];
    let a = v.abs();
    if a >= 1e21 {
        // Beyond any real measurement: a figure of 1e308 is not a 300-digit number.
        return format!("{v:.2e}");
    }
    for (step, suffix) in STEPS {
        // 999,950 rounds to 1.00 M, not 1000 k.
        if a >= step * 0.9995 {
            return format!("{} {suffix}", sig3(v / step));
        }
    }
    sig3(v)
}

/// A duration of `us` microseconds in the unit that reads best (`85.2 µs`, `7.31 ms`, `2.5 s`).
pub fn micros(us: f64) -> String {
    let a = us.abs();
    if a >= 999_950.0 {
        format!("{} s", sig3(us / 1e6))
    } else if a >= 999.95 {
        format!("{} ms", sig3(us / 1e3))
    } else {
        format!("{} µs", sig3(us))
    }
}

/// A figure for a person, in its unit.
pub fn value(v: f64, unit: Unit) -> String {
    match unit {
        Unit::Micros => micros(v),
        Unit::Millis => micros(v * 1e3),
        Unit::Seconds => micros(v * 1e6),
        Unit::PerSecond => format!("{}/s", scaled(v)),
        Unit::Mib => format!("{} MiB", sig3(v)),
        Unit::Percent => format!("{} %", sig3(v)),
        Unit::Ratio => format!("{v:.3}"),
        Unit::Plain if v.abs() >= 1e15 => scaled(v),
        Unit::Plain if v.fract() == 0.0 => grouped(v, 0),
        Unit::Plain if v.abs() >= 1000.0 => grouped(v, 1),
        Unit::Plain => sig3(v),
    }
}

/// B − A in the figure's unit, signed (`+104 µs`, `-27.1 k/s`, `+0`).
pub fn difference(d: f64, unit: Unit) -> String {
    let s = value(d, unit);
    if d > 0.0 {
        format!("+{s}")
    } else {
        s
    }
}

/// B ÷ A as a factor and a percent (`×0.443 (-55.7 %)`); `-` when A is 0.
pub fn ratio(a: f64, b: f64) -> String {
    if a == 0.0 || !a.is_finite() || !b.is_finite() {
        return "-".into();
    }
    let r = b / a;
    let p = (r - 1.0) * 100.0;
    let pct = if p.abs() >= 999.5 {
        format!("{} %", grouped(p, 0))
    } else {
        format!("{} %", sig3(p))
    };
    let pct = if p > 0.0 { format!("+{pct}") } else { pct };
    let factor = if r.abs() >= 100.0 {
        grouped(r, 0)
    } else {
        sig3(r)
    };
    format!("×{factor} ({pct})")
}

/// A setting's value for a table: strings bare, the rest as JSON.
pub fn setting(v: &Value) -> String {
    match v {
        Value::String(s) => gabp_rt::display::text(s, 120),
        Value::Null => "-".into(),
        Value::Number(n) => n.as_f64().map_or(n.to_string(), |f| value(f, Unit::Plain)),
        Value::Array(a) => a.iter().map(setting).collect::<Vec<_>>().join(","),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn units_and_directions_come_from_names() {
        assert_eq!(unit("relay.latency_us.p99"), Unit::Micros);
        assert_eq!(unit("latency_us.count"), Unit::Plain);
        assert_eq!(better("latency_us.count"), None);
        assert_eq!(better("relay.call_latency_us.p50"), Some(Better::Lower));
        assert_eq!(unit("calls_per_s"), Unit::PerSecond);
        assert_eq!(better("calls_per_s"), Some(Better::Higher));
        assert_eq!(better("relay.delivered_eps"), Some(Better::Higher));
        assert_eq!(unit("duration_s"), Unit::Seconds);
        assert_eq!(better("duration_s"), None);
        assert_eq!(better("peers.0.unannounced_gaps"), Some(Better::Lower));
        assert_eq!(unit("peer_ratios.redis"), Unit::Ratio);
        assert_eq!(better("ratio"), Some(Better::Higher));
        assert_eq!(better("relay.peak_rss_mib"), Some(Better::Lower));
        assert_eq!(better("errors"), Some(Better::Lower));
        assert_eq!(better("calls"), Some(Better::Higher));
    }

    #[test]
    fn numbers_read_as_a_person_writes_them() {
        assert_eq!(value(5002.0, Unit::Plain), "5,002");
        assert_eq!(value(1_236_512.0, Unit::Plain), "1,236,512");
        assert_eq!(value(2.5, Unit::Plain), "2.5");
        assert_eq!(value(0.0000136, Unit::Plain), "0.0000136");
        assert_eq!(value(48_612.3, Unit::PerSecond), "48.6 k/s");
        assert_eq!(value(1_240_000.0, Unit::PerSecond), "1.24 M/s");
        assert_eq!(value(999_990.0, Unit::PerSecond), "1 M/s");
        assert_eq!(value(950.0, Unit::PerSecond), "950/s");
        assert_eq!(value(85.24, Unit::Micros), "85.2 µs");
        assert_eq!(value(7_312.0, Unit::Micros), "7.31 ms");
        assert_eq!(value(2_500_000.0, Unit::Micros), "2.5 s");
        assert_eq!(value(5.0021, Unit::Seconds), "5 s");
        assert_eq!(value(0.25, Unit::Seconds), "250 ms");
        assert_eq!(value(0.8333, Unit::Ratio), "0.833");
        assert_eq!(value(74.6, Unit::Percent), "74.6 %");
        assert_eq!(value(1e308, Unit::Plain), "1.00e308");
        assert_eq!(difference(104.0, Unit::Micros), "+104 µs");
        assert_eq!(difference(-27_100.0, Unit::PerSecond), "-27.1 k/s");
        assert_eq!(difference(0.0, Unit::Plain), "0");
        assert_eq!(ratio(48_600.0, 21_500.0), "×0.442 (-55.8 %)");
        assert_eq!(ratio(100.0, 112.3), "×1.12 (+12.3 %)");
        assert_eq!(ratio(100.0, 100.0), "×1 (0 %)");
        assert_eq!(ratio(1.0, 30.0), "×30 (+2,900 %)");
        assert_eq!(ratio(0.0, 3.0), "-");
        assert_eq!(grouped(-1234.5, 1), "-1,234.5");
        for v in [1e-7, 1.362e-5, 0.5, 3.0, 1e9, 123_456_789.0] {
            for u in [Unit::Plain, Unit::Micros, Unit::PerSecond, Unit::Ratio] {
                let s = value(v, u);
                assert!(!s.contains('e'), "{v} as {u:?}: {s}");
            }
        }
    }

    #[test]
    fn settings_and_figures_are_told_apart() {
        let doc = json!({
            "calls_per_s": 10.0, "mode": "rate",
            "scenario": {"record": true, "rate": 0.0},
            "context": {"load_start": [1.0, 1.0, 1.0]},
            "spread": {"calls_per_s": {"min": 9.0}},
            "relay": {"target": "gabp-relay", "errors": []},
            "target": {"channels": ["a", "b"]}
        });
        let n: Vec<String> = numbers(&doc).into_iter().map(|(p, _)| p).collect();
        assert_eq!(n, ["calls_per_s"]);
        let s: Vec<String> = settings(&doc).into_iter().map(|(p, _)| p).collect();
        assert_eq!(
            s,
            [
                "mode",
                "relay.target",
                "scenario.rate",
                "scenario.record",
                "target.channels"
            ]
        );
        assert_eq!(setting(&doc["target"]["channels"]), "a,b");
    }
}
