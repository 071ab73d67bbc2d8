//! `gabp-loadgen compare A.json B.json`: the change of every numeric figure between two `--json`
//! results (of `run`, `baseline`, `call`, `bridges`: any of them). Figures are found by their
//! path in the document (`relay.latency_us.p99`); one in only one document is listed with `-`
//! on the other side. An unreadable input is a usage error (exit 2).

use std::path::Path;

use serde::Serialize;
use serde_json::Value;

/// One figure in either document.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Change {
    /// Its path, keys joined by `.` (array items by index).
    pub figure: String,
    /// In A.
    pub a: Option<f64>,
    /// In B.
    pub b: Option<f64>,
    /// B − A.
    pub change: Option<f64>,
    /// (B − A) / A in percent (none when A is 0 or missing).
    pub change_percent: Option<f64>,
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
    let mut found = Vec::new();
    figures(&v, "", &mut found);
    if found.is_empty() {
        return Err(Unreadable(format!(
            "{} is not a gabp-loadgen --json result: it holds no figures",
            path.display()
        )));
    }
    Ok(v)
}

/// Two results compare only if they are of one kind: at least one figure in common.
pub fn comparable(a: &Value, b: &Value) -> Result<(), Unreadable> {
    let (mut fa, mut fb) = (Vec::new(), Vec::new());
    figures(a, "", &mut fa);
    figures(b, "", &mut fb);
    if fa.iter().any(|(k, _)| fb.iter().any(|(j, _)| j == k)) {
        Ok(())
    } else {
        Err(Unreadable(
            "the two results have no figure in common: compare results of the same command".into(),
        ))
    }
}

/// A figure for the table: plain with 3 decimals in the usual range, in scientific notation
/// when it is huge or tiny (a figure of 1e308 is not a 300-digit number).
fn fmt_figure(v: f64, sign: bool) -> String {
    let a = v.abs();
    match (a != 0.0 && !(1e-3..1e12).contains(&a), sign) {
        (true, true) => format!("{v:+.3e}"),
        (true, false) => format!("{v:.3e}"),
        (false, true) => format!("{v:+.3}"),
        (false, false) => format!("{v:.3}"),
    }
}

/// Every number in `v` with its path, in document order.
fn figures(v: &Value, path: &str, out: &mut Vec<(String, f64)>) {
    let join = |k: &str| {
        if path.is_empty() {
            k.to_string()
        } else {
            format!("{path}.{k}")
        }
    };
    match v {
        Value::Number(n) => {
            if let Some(f) = n.as_f64() {
                out.push((path.to_string(), f));
            }
        }
        Value::Object(m) => m.iter().for_each(|(k, v)| figures(v, &join(k), out)),
        Value::Array(a) => a
            .iter()
            .enumerate()
            .for_each(|(i, v)| figures(v, &join(&i.to_string()), out)),
        _ => {}
    }
}

/// The change of every figure, A's order first, then figures only B has.
pub fn compare(a: &Value, b: &Value) -> Vec<Change> {
    let (mut fa, mut fb) = (Vec::new(), Vec::new());
    figures(a, "", &mut fa);
    figures(b, "", &mut fb);
    let find = |f: &[(String, f64)], k: &str| f.iter().find(|(p, _)| p == k).map(|x| x.1);
    let mut out: Vec<Change> = fa
        .iter()
        .map(|(k, va)| {
            let vb = find(&fb, k);
            change(k, Some(*va), vb)
        })
        .collect();
    out.extend(
        fb.iter()
            .filter(|(k, _)| find(&fa, k).is_none())
            .map(|(k, vb)| change(k, None, Some(*vb))),
    );
    out
}

fn change(figure: &str, a: Option<f64>, b: Option<f64>) -> Change {
    let d = a.zip(b).map(|(a, b)| b - a);
    Change {
        figure: figure.to_string(),
        a,
        b,
        change: d,
        change_percent: a
            .zip(d)
            .filter(|(a, _)| *a != 0.0)
            .map(|(a, d)| d / a * 100.0),
    }
}

/// The human table.
pub fn table(changes: &[Change]) -> String {
    use std::fmt::Write;
    let w = changes
        .iter()
        .map(|c| c.figure.chars().count())
        .max()
        .unwrap_or(6)
        .max(6);
    let num = |v: Option<f64>| v.map_or("-".to_string(), |v| fmt_figure(v, false));
    let mut o = String::new();
    let _ = writeln!(
        o,
        "{:<w$} {:>16} {:>16} {:>16} {:>9}",
        "FIGURE", "A", "B", "CHANGE", "CHANGE%"
    );
    for c in changes {
        let pct = c.change_percent.map_or("-".to_string(), |p| {
            if p.abs() < 1e6 {
                format!("{p:+.1}%")
            } else {
                format!("{p:+.1e}%")
            }
        });
        let _ = writeln!(
            o,
            "{:<w$} {:>16} {:>16} {:>16} {:>9}",
            c.figure,
            num(c.a),
            num(c.b),
            c.change.map_or("-".to_string(), |d| fmt_figure(d, true)),
            pct
        );
    }
    o
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
        let t = table(&c);
        assert!(t.contains("+50.0%"), "{t}");
    }

    #[test]
    fn huge_and_tiny_figures_print_in_scientific_notation() {
        let c = compare(
            &json!({"x": 1e308, "y": 2.5}),
            &json!({"x": 1e308, "y": 0.0001}),
        );
        let t = table(&c);
        assert!(t.contains("1.000e308"), "{t}");
        assert!(t.lines().all(|l| l.len() < 120), "{t}");
        assert!(t.contains("1.000e-4"), "{t}");
        assert_eq!(fmt_figure(12.5, false), "12.500");
        assert_eq!(fmt_figure(-1.0, true), "-1.000");
    }

    #[test]
    fn documents_without_common_figures_do_not_compare() {
        comparable(&json!({"a": 1}), &json!({"b": 1})).expect_err("nothing in common");
        comparable(&json!({"a": 1, "b": 2}), &json!({"b": 1})).expect("b in common");
    }
}
