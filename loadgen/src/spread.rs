//! Rounds: the median and spread (min–max, quartiles) of each figure over N rounds of one
//! measurement, the one result document that stands for them, and whether two sets of rounds
//! differ by more than their spread. Nothing here runs a round.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::figures::{self, Better};

/// One figure over its rounds.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Stats {
    /// Rounds that measured it.
    pub n: usize,
    /// The median.
    pub median: f64,
    /// The smallest.
    pub min: f64,
    /// The largest.
    pub max: f64,
    /// The first quartile.
    pub q1: f64,
    /// The third quartile.
    pub q3: f64,
}

impl Stats {
    /// Of `values` (NaN left out); `None` when there is none.
    pub fn of(values: &[f64]) -> Option<Stats> {
        let mut v: Vec<f64> = values.iter().copied().filter(|x| !x.is_nan()).collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        Some(Stats {
            n: v.len(),
            median: quantile(&v, 0.5),
            min: v[0],
            max: v[v.len() - 1],
            q1: quantile(&v, 0.25),
            q3: quantile(&v, 0.75),
        })
    }

    /// Reads one back from a result's `spread`.
    pub fn from_json(v: &Value) -> Option<Stats> {
        let f = |k: &str| v.get(k).and_then(Value::as_f64);
        Some(Stats {
            n: usize::try_from(v.get("n")?.as_u64()?).ok()?,
            median: f("median")?,
            min: f("min")?,
            max: f("max")?,
            q1: f("q1").unwrap_or(f("min")?),
            q3: f("q3").unwrap_or(f("max")?),
        })
    }

    /// Whether the two ranges (min–max) share a value: a difference between them could be
    /// noise.
    pub fn overlaps(&self, other: &Stats) -> bool {
        self.min <= other.max && other.min <= self.max
    }
}

/// The `q` quantile of sorted values, interpolated between neighbours.
fn quantile(sorted: &[f64], q: f64) -> f64 {
    let at = q * (sorted.len() - 1) as f64;
    let (lo, hi) = (at.floor() as usize, at.ceil() as usize);
    sorted[lo] + (sorted[hi] - sorted[lo]) * (at - lo as f64)
}

/// The figure at `path` (dotted, as [`figures::numbers`] names them) in `doc`.
pub fn at<'a>(doc: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.').try_fold(doc, |v, k| match v {
        Value::Object(m) => m.get(k),
        Value::Array(a) => a.get(k.parse::<usize>().ok()?),
        _ => None,
    })
}

/// Sets the figure at `path` in `doc` (which has it).
fn set(doc: &mut Value, path: &str, new: Value) {
    let mut v = doc;
    for k in path.split('.') {
        v = match v {
            Value::Object(m) => match m.get_mut(k) {
                Some(x) => x,
                None => return,
            },
            Value::Array(a) => match k.parse::<usize>().ok().and_then(|i| a.get_mut(i)) {
                Some(x) => x,
                None => return,
            },
            _ => return,
        };
    }
    *v = new;
}

/// The result standing for `rounds` (each one round's document, all of one command): the
/// first round's document with each figure replaced by its median over the rounds (a figure
/// some rounds did not measure: over those that did), `round_results` holding every round's
/// document, and `spread` each figure's [`Stats`] by its path. One round is returned as it is.
pub fn merge(rounds: Vec<Value>) -> Value {
    if rounds.len() < 2 {
        return rounds.into_iter().next().unwrap_or(Value::Null);
    }
    let mut doc = rounds[0].clone();
    // Every figure any round has, in the first round's places (figures only a later round has,
    // a peer's ratio for one, have no place to stand in the first document).
    let mut spread = Map::new();
    let mut leaves = Vec::new();
    if let Value::Object(m) = &rounds[0] {
        for (k, v) in m.iter().filter(|(k, _)| figures::holds_figures(k)) {
            figures::leaves(v, k, &mut leaves);
        }
    }
    for (path, first) in leaves {
        if !(first.is_number() || first.is_null()) {
            continue;
        }
        let values: Vec<f64> = rounds
            .iter()
            .filter_map(|r| at(r, &path).and_then(Value::as_f64))
            .collect();
        let Some(s) = Stats::of(&values) else {
            continue;
        };
        // A count stays a whole number when the median of an odd number of rounds is one.
        let median = if s.median.fract() == 0.0 && s.median.abs() < 9e15 {
            Value::from(s.median as i64)
        } else {
            Value::from(s.median)
        };
        set(&mut doc, &path, median);
        spread.insert(path, serde_json::to_value(&s).expect("plain numbers"));
    }
    if let Value::Object(m) = &mut doc {
        m.insert("spread".into(), Value::Object(spread));
        m.insert("round_results".into(), Value::Array(rounds));
    }
    doc
}

/// The spread of the figure at `path` in a merged result, if it has rounds.
pub fn of(doc: &Value, path: &str) -> Option<Stats> {
    doc.get("spread")?.get(path).and_then(Stats::from_json)
}

/// Two figures this close (a share of the larger) are the same: a fixed-rate delivery a few
/// events apart, a window a few microseconds longer.
pub const SAME_WITHIN: f64 = 0.005;

/// How B stands against A on one figure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// The same value (within [`SAME_WITHIN`]).
    Same,
    /// Better, and B's range over its rounds does not meet A's.
    Better,
    /// Worse, and the ranges do not meet.
    Worse,
    /// Different, but the ranges overlap: the difference may be noise.
    WithinNoise,
    /// Better in a single round each: nothing says how large the noise is.
    BetterUnknownNoise,
    /// Worse in a single round each.
    WorseUnknownNoise,
    /// Different, beyond the noise, in a figure with no better direction.
    Changed,
    /// Different, in a single round, in a figure with no better direction.
    ChangedUnknownNoise,
    /// Measured on one side only.
    Missing,
}

impl Verdict {
    /// The word a table shows.
    pub fn word(self) -> &'static str {
        match self {
            Verdict::Same => "same",
            Verdict::Better => "better",
            Verdict::Worse => "worse",
            Verdict::WithinNoise => "within noise",
            Verdict::BetterUnknownNoise => "better?",
            Verdict::WorseUnknownNoise => "worse?",
            Verdict::Changed => "changed",
            Verdict::ChangedUnknownNoise => "changed?",
            Verdict::Missing => "-",
        }
    }

    /// Whether the difference is beyond the spread of the rounds (`None`: not known, or no
    /// difference).
    pub fn beyond_noise(self) -> Option<bool> {
        match self {
            Verdict::Better | Verdict::Worse | Verdict::Changed => Some(true),
            Verdict::WithinNoise => Some(false),
            _ => None,
        }
    }
}

/// B against A: the medians (or single values) `a` and `b`, each side's spread when it had
/// rounds, and which direction of the figure is better.
pub fn verdict(
    a: Option<f64>,
    b: Option<f64>,
    sa: Option<&Stats>,
    sb: Option<&Stats>,
    better: Option<Better>,
) -> Verdict {
    let (Some(a), Some(b)) = (a, b) else {
        return Verdict::Missing;
    };
    let scale = a.abs().max(b.abs());
    if (b - a).abs() <= SAME_WITHIN * scale {
        // Equal medians of figures that swing from round to round say nothing: that is noise.
        let swings = [sa, sb]
            .into_iter()
            .flatten()
            .any(|s| s.n > 1 && s.max - s.min > SAME_WITHIN * scale);
        return if swings {
            Verdict::WithinNoise
        } else {
            Verdict::Same
        };
    }
    let rounds = match (sa, sb) {
        (Some(x), Some(y)) if x.n > 1 && y.n > 1 => Some(x.overlaps(y)),
        _ => None,
    };
    let up = b > a;
    match (rounds, better) {
        (Some(true), _) => Verdict::WithinNoise,
        (Some(false), None) => Verdict::Changed,
        (None, None) => Verdict::ChangedUnknownNoise,
        (Some(false), Some(d)) => {
            if up == (d == Better::Higher) {
                Verdict::Better
            } else {
                Verdict::Worse
            }
        }
        (None, Some(d)) => {
            if up == (d == Better::Higher) {
                Verdict::BetterUnknownNoise
            } else {
                Verdict::WorseUnknownNoise
            }
        }
    }
}

/// A figure for a person with its spread over the rounds: `85.2 µs (80.1–91.0)`, the unit
/// written once where the three share it; the value alone without rounds.
pub fn cell(v: Option<f64>, s: Option<&Stats>, unit: figures::Unit) -> String {
    let Some(v) = v else {
        return "-".into();
    };
    let shown = figures::value(v, unit);
    // Rounds that all measured the same show it once.
    let Some(s) = s.filter(|s| s.n > 1 && s.min != s.max) else {
        return shown;
    };
    let (lo, hi) = (figures::value(s.min, unit), figures::value(s.max, unit));
    if lo == hi {
        return shown;
    }
    let suffix = |t: &str| t.rsplit_once(' ').map(|(_, u)| u.to_string());
    match (suffix(&shown), suffix(&lo), suffix(&hi)) {
        (Some(u), Some(a), Some(b)) if u == a && a == b => {
            let bare = |t: &str| t.rsplit_once(' ').map_or(t, |(n, _)| n).to_string();
            format!("{shown} ({}–{})", bare(&lo), bare(&hi))
        }
        _ => format!("{shown} ({lo}–{hi})"),
    }
}

/// Lines of `label  median (min–max)` for the figures at `paths` of a merged result (those it
/// has), headed by how many rounds they stand for.
pub fn summary(doc: &Value, rows: &[(String, String)]) -> String {
    use std::fmt::Write;
    let n = doc["round_results"].as_array().map_or(1, Vec::len);
    let w = rows
        .iter()
        .map(|(l, _)| l.chars().count())
        .max()
        .unwrap_or(0);
    let mut o = String::new();
    let _ = writeln!(o, "median of {n} rounds (min–max):");
    for (label, path) in rows {
        let Some(v) = at(doc, path).and_then(Value::as_f64) else {
            continue;
        };
        let s = of(doc, path);
        let _ = writeln!(
            o,
            "  {label:<w$}  {}",
            cell(Some(v), s.as_ref(), figures::unit(path))
        );
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn stats_of_rounds() {
        let s = Stats::of(&[3.0, 1.0, 2.0, 10.0]).expect("stats");
        assert_eq!((s.n, s.min, s.max, s.median), (4, 1.0, 10.0, 2.5));
        assert_eq!((s.q1, s.q3), (1.75, 4.75));
        let one = Stats::of(&[5.0]).expect("stats");
        assert_eq!((one.median, one.q1, one.q3), (5.0, 5.0, 5.0));
        assert!(Stats::of(&[]).is_none());
        assert!(s.overlaps(&Stats::of(&[10.0, 11.0]).expect("stats")));
        assert!(!s.overlaps(&Stats::of(&[10.5, 11.0]).expect("stats")));
        let back = Stats::from_json(&serde_json::to_value(&s).expect("json")).expect("back");
        assert_eq!(back, s);
    }

    #[test]
    fn merged_rounds_hold_medians_and_spread() {
        let rounds = vec![
            json!({"calls_per_s": 100.0, "calls": 5, "latency_us": {"p50": 10.0, "p99": null}, "tool": "x", "config": {"rate": 7}}),
            json!({"calls_per_s": 300.0, "calls": 7, "latency_us": {"p50": 30.0, "p99": 50.0}, "tool": "x", "config": {"rate": 7}}),
            json!({"calls_per_s": 200.0, "calls": 6, "latency_us": {"p50": 20.0, "p99": 70.0}, "tool": "x", "config": {"rate": 7}}),
        ];
        let m = merge(rounds);
        assert_eq!(m["calls_per_s"], 200.0);
        assert_eq!(m["calls"], 6);
        assert_eq!(m["latency_us"]["p50"], 20.0);
        assert_eq!(
            m["latency_us"]["p99"], 60.0,
            "over the rounds that measured it"
        );
        assert_eq!(m["tool"], "x");
        assert_eq!(m["round_results"].as_array().map(Vec::len), Some(3));
        let s = of(&m, "calls_per_s").expect("spread");
        assert_eq!((s.min, s.max, s.n), (100.0, 300.0, 3));
        assert_eq!(of(&m, "latency_us.p99").map(|s| s.n), Some(2));
        assert!(
            m["spread"].get("config.rate").is_none(),
            "settings have no spread"
        );
        let single = merge(vec![json!({"calls": 1})]);
        assert_eq!(single, json!({"calls": 1}));
    }

    #[test]
    fn verdicts_weigh_the_difference_against_the_spread() {
        let lo = Stats::of(&[10.0, 11.0, 12.0]).expect("stats");
        let hi = Stats::of(&[20.0, 21.0, 22.0]).expect("stats");
        let wide = Stats::of(&[9.0, 15.0, 25.0]).expect("stats");
        let h = Some(Better::Higher);
        let l = Some(Better::Lower);
        // Equal medians: the same when the rounds agree, within noise when they swing.
        let steady = Stats::of(&[60_000.0, 60_000.0, 60_001.0]).expect("stats");
        assert_eq!(
            verdict(
                Some(60_000.0),
                Some(60_000.0),
                Some(&steady),
                Some(&steady),
                h
            ),
            Verdict::Same
        );
        assert_eq!(
            verdict(Some(15.0), Some(15.0), Some(&wide), Some(&wide), h),
            Verdict::WithinNoise
        );
        assert_eq!(
            verdict(Some(11.0), Some(21.0), Some(&lo), Some(&hi), h),
            Verdict::Better
        );
        assert_eq!(
            verdict(Some(11.0), Some(21.0), Some(&lo), Some(&hi), l),
            Verdict::Worse
        );
        assert_eq!(
            verdict(Some(11.0), Some(15.0), Some(&lo), Some(&wide), h),
            Verdict::WithinNoise
        );
        assert_eq!(
            verdict(Some(11.0), Some(21.0), None, None, h),
            Verdict::BetterUnknownNoise
        );
        assert_eq!(
            verdict(Some(11.0), Some(21.0), None, None, l),
            Verdict::WorseUnknownNoise
        );
        assert_eq!(
            verdict(Some(11.0), Some(21.0), Some(&lo), Some(&hi), None),
            Verdict::Changed
        );
        assert_eq!(verdict(Some(1.0), Some(1.0), None, None, h), Verdict::Same);
        assert_eq!(
            verdict(Some(20_000.0), Some(20_003.7), Some(&lo), Some(&hi), h),
            Verdict::Same,
            "a fixed rate a few events apart"
        );
        assert_eq!(
            verdict(Some(0.0), Some(1.0), None, None, l),
            Verdict::WorseUnknownNoise
        );
        assert_eq!(verdict(None, Some(1.0), None, None, h), Verdict::Missing);
        assert_eq!(Verdict::WithinNoise.beyond_noise(), Some(false));
        assert_eq!(Verdict::Worse.beyond_noise(), Some(true));
        assert_eq!(Verdict::WorseUnknownNoise.beyond_noise(), None);
        assert_eq!(
            cell(Some(11.0), Some(&lo), figures::Unit::Micros),
            "11 µs (10–12)"
        );
        let wide = Stats::of(&[900.0, 1500.0]).expect("stats");
        assert_eq!(
            cell(Some(1200.0), Some(&wide), figures::Unit::Micros),
            "1.2 ms (900 µs–1.5 ms)"
        );
        assert_eq!(
            cell(Some(5.0), Some(&lo), figures::Unit::Plain),
            "5 (10–12)"
        );
        assert_eq!(cell(Some(5.0), None, figures::Unit::Plain), "5");
    }
}
