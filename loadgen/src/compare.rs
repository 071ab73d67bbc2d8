//! `gabp-loadgen compare A.json B.json`: two `--json` results (of `run`, `baseline`, `call`,
//! `bridges`, `overhead`: any of them) side by side. Each input is named (its file name, or
//! `--label`) and described (target, rounds, when, whether the machine was busy); the settings
//! that differ come first (a target, `record`, a concurrency: strings and booleans included);
//! then every figure by its path (`relay.latency_us.p99`) in its unit, with B − A, B ÷ A, which
//! direction is better and whether B is better or worse: beyond the noise when both results
//! have rounds whose ranges do not overlap, "within noise" when they overlap, marked `?` when a
//! side has one round. A figure in only one document shows `-` on the other side. An unreadable
//! input is a usage error (exit 2).

use std::path::Path;

use gabp_rt::display::{self, Align, Table};
use serde::Serialize;
use serde_json::{json, Value};

use crate::figures::{self, Better, Unit};
use crate::spread::{self, Stats, Verdict};

/// One figure in either document.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Change {
    /// Its path, keys joined by `.` (array items by index).
    pub figure: String,
    /// In A (the median of its rounds, when it has rounds).
    pub a: Option<f64>,
    /// In B.
    pub b: Option<f64>,
    /// B − A.
    pub change: Option<f64>,
    /// (B − A) / A in percent (none when A is 0 or missing).
    pub change_percent: Option<f64>,
    /// B ÷ A (none when A is 0 or missing).
    pub ratio: Option<f64>,
    /// What it measures, from its name.
    pub unit: Unit,
    /// Which direction is better (none: neither, as for a window's length).
    pub better: Option<Better>,
    /// A's spread over its rounds.
    pub a_spread: Option<Stats>,
    /// B's spread over its rounds.
    pub b_spread: Option<Stats>,
    /// How B stands against A.
    pub verdict: Verdict,
    /// Whether the difference is beyond the rounds' spread (none: unknown, or no difference).
    pub beyond_noise: Option<bool>,
}

/// A setting that differs between the two results.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Setting {
    /// Its path.
    pub setting: String,
    /// In A (null when A does not have it).
    pub a: Value,
    /// In B.
    pub b: Value,
}

/// Why a compare could not start: the input, in one line.
#[derive(Debug)]
pub struct Unreadable(pub String);

impl std::fmt::Display for Unreadable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Unreadable {}

/// Reads one `--json` result.
pub fn read(path: &Path) -> Result<Value, Unreadable> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Unreadable(format!("cannot read {}: {e}", path.display())))?;
    let v: Value = serde_json::from_str(&text)
        .map_err(|e| Unreadable(format!("{} is not a JSON result: {e}", path.display())))?;
    if !v.is_object() {
        return Err(Unreadable(format!(
            "{} is not a JSON result (not an object)",
            path.display()
        )));
    }
    if figures::numbers(&v).is_empty() {
        return Err(Unreadable(format!(
            "{} is not a gabp-loadgen --json result: it holds no figures",
            path.display()
        )));
    }
    Ok(v)
}

/// Two results compare only if they are of one kind: at least one figure in common.
pub fn comparable(a: &Value, b: &Value) -> Result<(), Unreadable> {
    let (fa, fb) = (figures::numbers(a), figures::numbers(b));
    if fa.iter().any(|(k, _)| fb.iter().any(|(j, _)| j == k)) {
        Ok(())
    } else {
        Err(Unreadable(
            "the two results have no figure in common: compare results of the same command".into(),
        ))
    }
}

/// The names of the two inputs: `--label`s, else their file names without `.json` (whole
/// paths when those are the same).
pub fn labels(a: &Path, b: &Path, given: &[String]) -> (String, String) {
    let stem = |p: &Path| {
        p.file_stem()
            .map_or_else(|| p.display().to_string(), |s| s.to_string_lossy().into())
    };
    let (mut la, mut lb) = (stem(a), stem(b));
    if la == lb {
        (la, lb) = (a.display().to_string(), b.display().to_string());
    }
    if la == lb {
        (la, lb) = ("A".into(), "B".into());
    }
    (
        given.first().cloned().unwrap_or(la),
        given.get(1).cloned().unwrap_or(lb),
    )
}

/// The change of every figure, A's order first, then figures only B has.
pub fn compare(a: &Value, b: &Value) -> Vec<Change> {
    let (fa, fb) = (figures::numbers(a), figures::numbers(b));
    let find = |f: &[(String, f64)], k: &str| f.iter().find(|(p, _)| p == k).map(|x| x.1);
    let mut out: Vec<Change> = fa
        .iter()
        .map(|(k, va)| change(k, Some(*va), find(&fb, k), a, b))
        .collect();
    out.extend(
        fb.iter()
            .filter(|(k, _)| find(&fa, k).is_none())
            .map(|(k, vb)| change(k, None, Some(*vb), a, b)),
    );
    out
}

fn change(figure: &str, va: Option<f64>, vb: Option<f64>, a: &Value, b: &Value) -> Change {
    let d = va.zip(vb).map(|(a, b)| b - a);
    let nonzero_a = va.filter(|a| *a != 0.0);
    let (sa, sb) = (spread::of(a, figure), spread::of(b, figure));
    let better = figures::better(figure);
    let verdict = spread::verdict(va, vb, sa.as_ref(), sb.as_ref(), better);
    Change {
        figure: figure.to_string(),
        a: va,
        b: vb,
        change: d,
        change_percent: nonzero_a.zip(d).map(|(a, d)| d / a * 100.0),
        ratio: nonzero_a.zip(vb).map(|(a, b)| b / a),
        unit: figures::unit(figure),
        better,
        a_spread: sa,
        b_spread: sb,
        verdict,
        beyond_noise: verdict.beyond_noise(),
    }
}

/// What is not a setting to compare though it sits among them: a process id changes every run.
fn incidental(path: &str) -> bool {
    let last = path.rsplit('.').next().unwrap_or(path);
    matches!(last, "pid" | "upstream_pid")
}

/// The settings of a result, with the machine and loadgen's version from its context.
fn settings_of(doc: &Value) -> Vec<(String, Value)> {
    let mut s = figures::settings(doc);
    let ctx = &doc["context"];
    let mut machine = Vec::new();
    figures::leaves(&ctx["machine"], "context.machine", &mut machine);
    s.extend(machine.into_iter().map(|(p, v)| (p, v.clone())));
    if !ctx["loadgen_version"].is_null() {
        s.push((
            "context.loadgen_version".into(),
            ctx["loadgen_version"].clone(),
        ));
    }
    s.retain(|(p, _)| !incidental(p));
    s
}

/// The settings that differ (or that only one result has), A's order first.
pub fn settings(a: &Value, b: &Value) -> Vec<Setting> {
    let (sa, sb) = (settings_of(a), settings_of(b));
    let find = |s: &[(String, Value)], k: &str| s.iter().find(|(p, _)| p == k).map(|x| x.1.clone());
    let mut out: Vec<Setting> = sa
        .iter()
        .filter_map(|(k, va)| {
            let vb = find(&sb, k).unwrap_or(Value::Null);
            (*va != vb).then(|| Setting {
                setting: k.clone(),
                a: va.clone(),
                b: vb,
            })
        })
        .collect();
    out.extend(
        sb.iter()
            .filter(|(k, v)| find(&sa, k).is_none() && !v.is_null())
            .map(|(k, v)| Setting {
                setting: k.clone(),
                a: Value::Null,
                b: v.clone(),
            }),
    );
    out
}

/// One input in a line: what was measured, where, in how many rounds, when.
pub fn describe(doc: &Value) -> String {
    let mut parts = Vec::new();
    let ctx = &doc["context"];
    if let Some(cmd) = ctx["command_line"].as_array() {
        let words: Vec<&str> = cmd.iter().filter_map(Value::as_str).collect();
        if let Some(sub) = words.get(1) {
            parts.push(display::text(sub, 24));
        }
    }
    if doc["target"].is_object() {
        parts.push(crate::context::target_line(&doc["target"]));
    } else if let Some(sc) = doc["scenario"].as_object() {
        parts.push(format!(
            "scenario {}, record {}",
            display::text(sc.get("name").and_then(Value::as_str).unwrap_or("?"), 40),
            sc.get("record").map_or("?".into(), Value::to_string)
        ));
    }
    let rounds = doc["round_results"].as_array().map_or(1, Vec::len);
    parts.push(format!(
        "{rounds} round{}",
        if rounds == 1 { "" } else { "s" }
    ));
    if let Some(t) = ctx["started_at"].as_str() {
        parts.push(format!("started {}", display::text(t, 32)));
    }
    if ctx["busy"] == true {
        parts.push("on a BUSY machine".into());
    }
    parts.join(", ")
}

/// The human report: the inputs, the settings that differ, every figure with its verdict, and
/// a count of verdicts.
pub fn table(
    (la, lb): (&str, &str),
    (a, b): (&Value, &Value),
    settings: &[Setting],
    changes: &[Change],
) -> String {
    use std::fmt::Write;
    let (la, lb) = (display::text(la, 40), display::text(lb, 40));
    let mut o = String::new();
    let _ = writeln!(o, "A = {la}: {}", describe(a));
    let _ = writeln!(o, "B = {lb}: {}", describe(b));
    for (name, doc) in [(&la, a), (&lb, b)] {
        if let Some(cmd) = doc["context"]["command_line"].as_array() {
            let words: Vec<&str> = cmd.iter().filter_map(Value::as_str).collect();
            let _ = writeln!(o, "  {name}: {}", display::text(&words.join(" "), 300));
        }
    }
    let _ = writeln!(o);
    if settings.is_empty() {
        let _ = writeln!(o, "Settings: the same in both.");
    } else {
        let _ = writeln!(o, "Settings that differ:");
        let mut t = Table::new(&[
            ("SETTING", Align::Left, 48),
            (&la, Align::Left, 60),
            (&lb, Align::Left, 60),
        ]);
        for s in settings {
            t.row(vec![
                display::text(&s.setting, 48),
                figures::setting(&s.a),
                figures::setting(&s.b),
            ]);
        }
        o.push_str(&t.render());
    }
    let _ = writeln!(o);
    let _ = writeln!(o, "Figures, B against A:");
    let mut t = Table::new(&[
        ("FIGURE", Align::Left, 44),
        ("BETTER", Align::Left, 6),
        (&la, Align::Right, 36),
        (&lb, Align::Right, 36),
        ("B - A", Align::Right, 16),
        ("B ÷ A", Align::Right, 22),
        ("B IS", Align::Left, 12),
    ]);
    // Figures the same in both are listed by name after the table, not as rows of zeros.
    let same: Vec<&str> = changes
        .iter()
        .filter(|c| c.verdict == Verdict::Same)
        .map(|c| c.figure.as_str())
        .collect();
    for c in changes.iter().filter(|c| c.verdict != Verdict::Same) {
        t.row(vec![
            display::text(&c.figure, 44),
            c.better.map_or("", Better::word).to_string(),
            spread::cell(c.a, c.a_spread.as_ref(), c.unit),
            spread::cell(c.b, c.b_spread.as_ref(), c.unit),
            c.change
                .map_or("-".into(), |d| figures::difference(d, c.unit)),
            match (c.a, c.b) {
                (Some(a), Some(b)) => figures::ratio(a, b),
                _ => "-".into(),
            },
            c.verdict.word().to_string(),
        ]);
    }
    o.push_str(&t.render());
    if !same.is_empty() {
        let _ = writeln!(
            o,
            "The same in both (within 0.5 %, in every round): {}.",
            display::text(&same.join(", "), 2000)
        );
    }
    let count = |v: &[Verdict]| changes.iter().filter(|c| v.contains(&c.verdict)).count();
    let _ = writeln!(
        o,
        "\nB is better in {}, worse in {} (beyond noise); within noise in {}; better? {}, worse? {}.",
        count(&[Verdict::Better]),
        count(&[Verdict::Worse]),
        count(&[Verdict::WithinNoise]),
        count(&[Verdict::BetterUnknownNoise]),
        count(&[Verdict::WorseUnknownNoise]),
    );
    o.push_str(
        "Cells with rounds read median (min–max). BETTER: which direction of the figure is better.\n\
         B IS: better or worse when B's range over its rounds does not overlap A's (beyond noise);\n\
         within noise when the ranges overlap; same: within 0.5 % in every round; changed: a figure\n\
         with no better direction, different beyond noise; a ? when a side has one round,\n\
         so nothing says how large the noise is: measure with --rounds 3 or more.\n",
    );
    o
}

/// The JSON document.
pub fn document(
    paths: (&Path, &Path),
    labels: (&str, &str),
    docs: (&Value, &Value),
    settings: &[Setting],
    changes: &[Change],
) -> Value {
    let input = |p: &Path, l: &str, d: &Value| json!({"path": p, "label": l, "described": describe(d), "context": d["context"], "target": d["target"]});
    json!({
        "a": paths.0,
        "b": paths.1,
        "inputs": [input(paths.0, labels.0, docs.0), input(paths.1, labels.1, docs.1)],
        "settings": settings,
        "figures": changes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn every_number_is_compared_by_its_path() {
        let a = json!({"relay": {"delivered_eps": 100.0, "latency_us": {"p99": 50}}, "ratio": 0.5, "tool": "x", "peers": [{"delivered_eps": 10}]});
        let b = json!({"relay": {"delivered_eps": 150.0, "latency_us": {"p99": 40}}, "ratio": null, "new": 3, "peers": [{"delivered_eps": 0}]});
        let c = compare(&a, &b);
        let get = |k: &str| c.iter().find(|c| c.figure == k).cloned().expect(k);
        assert_eq!(get("relay.delivered_eps").change_percent, Some(50.0));
        assert_eq!(get("relay.latency_us.p99").change, Some(-10.0));
        assert_eq!(get("ratio").b, None);
        assert_eq!(get("new").a, None);
        assert_eq!(get("peers.0.delivered_eps").change_percent, Some(-100.0));
        assert_eq!(c.len(), 5, "strings are not figures: {c:?}");
        assert_eq!(
            get("relay.delivered_eps").verdict,
            Verdict::BetterUnknownNoise
        );
        assert_eq!(
            get("relay.latency_us.p99").verdict,
            Verdict::BetterUnknownNoise
        );
        assert_eq!(
            get("peers.0.delivered_eps").verdict,
            Verdict::WorseUnknownNoise
        );
        let s = settings(&a, &b);
        assert_eq!(s.len(), 1, "{s:?}");
        assert_eq!((s[0].setting.as_str(), &s[0].a), ("tool", &json!("x")));
        let t = table(("a", "b"), (&a, &b), &s, &c);
        let row = t
            .lines()
            .find(|l| l.starts_with("relay.delivered_eps "))
            .expect("a row");
        assert!(row.contains("×1.5 (+50 %)"), "{row}");
        assert!(row.contains("higher") && row.ends_with("better?"), "{row}");
        assert!(
            t.find("Settings that differ").expect("settings") < t.find("Figures").expect("figures")
        );
    }

    #[test]
    fn figures_read_in_their_units_without_scientific_notation() {
        let a = json!({"calls": 5002, "calls_per_s": 48_600.0, "latency_us": {"p50": 82.0}, "x": 0.00002});
        let b = json!({"calls": 4001, "calls_per_s": 21_500.0, "latency_us": {"p50": 186.0}, "x": 0.0000136});
        let c = compare(&a, &b);
        let t = table(("direct", "relayed"), (&a, &b), &[], &c);
        assert!(t.contains("5,002"), "{t}");
        assert!(!t.contains("5002.000"), "{t}");
        assert!(t.contains("48.6 k/s") && t.contains("21.5 k/s"), "{t}");
        assert!(t.contains("×0.442 (-55.8 %)"), "{t}");
        assert!(t.contains("+104 µs"), "{t}");
        assert!(t.contains("0.0000136"), "{t}");
        assert!(!t.contains("e-"), "{t}");
        let header = t.lines().find(|l| l.starts_with("FIGURE")).expect("header");
        assert!(
            header.contains("direct") && header.contains("relayed"),
            "{header}"
        );
        let huge = compare(&json!({"x": 1e308}), &json!({"x": 1e308}));
        let t = table(("a", "b"), (&json!({}), &json!({})), &[], &huge);
        assert!(t.lines().all(|l| l.chars().count() < 200), "{t}");
    }

    #[test]
    fn rounds_tell_a_difference_from_noise() {
        let a = crate::spread::merge(vec![
            json!({"calls_per_s": 100.0, "latency_us": {"p50": 80.0}}),
            json!({"calls_per_s": 110.0, "latency_us": {"p50": 85.0}}),
            json!({"calls_per_s": 105.0, "latency_us": {"p50": 90.0}}),
        ]);
        let b = crate::spread::merge(vec![
            json!({"calls_per_s": 50.0, "latency_us": {"p50": 88.0}}),
            json!({"calls_per_s": 55.0, "latency_us": {"p50": 95.0}}),
            json!({"calls_per_s": 52.0, "latency_us": {"p50": 84.0}}),
        ]);
        let c = compare(&a, &b);
        let get = |k: &str| c.iter().find(|c| c.figure == k).cloned().expect(k);
        assert_eq!(get("calls_per_s").verdict, Verdict::Worse);
        assert_eq!(get("calls_per_s").beyond_noise, Some(true));
        assert_eq!(get("latency_us.p50").verdict, Verdict::WithinNoise);
        assert_eq!(c.len(), 2, "spread and rounds are not figures: {c:?}");
        let t = table(("a", "b"), (&a, &b), &[], &c);
        assert!(t.contains("within noise"), "{t}");
        assert!(
            t.contains("105/s (100–110/s)") || t.contains("105/s (100/s–110/s)"),
            "{t}"
        );
        assert!(t.contains("3 rounds"), "{t}");
    }

    #[test]
    fn settings_that_differ_come_with_both_values() {
        let a = json!({"scenario": {"record": true, "rate": 0.0}, "relay": {"delivered_eps": 1.0}, "target": {"pid": 5, "address": "x"}});
        let b = json!({"scenario": {"record": false, "rate": 0.0}, "relay": {"delivered_eps": 1.0}, "target": {"pid": 6, "address": "x"}});
        let s = settings(&a, &b);
        assert_eq!(s.len(), 1, "process ids are not settings: {s:?}");
        assert_eq!(s[0].setting, "scenario.record");
        assert_eq!(
            (s[0].a.clone(), s[0].b.clone()),
            (json!(true), json!(false))
        );
        let t = table(("on", "off"), (&a, &b), &s, &compare(&a, &b));
        let row = t
            .lines()
            .find(|l| l.starts_with("scenario.record"))
            .expect("row");
        assert!(row.contains("true") && row.contains("false"), "{row}");
    }

    #[test]
    fn inputs_are_named_by_their_files_or_labels() {
        let (a, b) = (Path::new("x/direct.json"), Path::new("x/relayed.json"));
        assert_eq!(labels(a, b, &[]), ("direct".into(), "relayed".into()));
        assert_eq!(
            labels(Path::new("1/r.json"), Path::new("2/r.json"), &[]),
            ("1/r.json".into(), "2/r.json".into())
        );
        assert_eq!(
            labels(a, b, &["on".into(), "off".into()]),
            ("on".into(), "off".into())
        );
        assert_eq!(labels(a, a, &[]), ("A".into(), "B".into()));
    }

    #[test]
    fn documents_without_common_figures_do_not_compare() {
        comparable(&json!({"a": 1}), &json!({"b": 1})).expect_err("nothing in common");
        comparable(&json!({"a": 1, "b": 2}), &json!({"b": 1})).expect("b in common");
    }
}
