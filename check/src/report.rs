//! Verdicts and the report a check run prints: each check named, with the section of the GABP
//! 1.0 specification (and the vendored schema) it comes from, a verdict and one line saying
//! what was seen. Text for people, JSON (`--json`) for CI. The text escapes what a peer chose
//! (names, error messages) before it reaches a terminal; the JSON keeps it exact.

use serde::Serialize;

/// What a check found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    /// As the specification says.
    Pass,
    /// A deviation the relay absorbs (a bridge behind it never sees it, or GABP's additive
    /// rule lets peers ignore it).
    Tolerated,
    /// A deviation that breaks peers.
    Fail,
    /// Not run: the peer does not offer what it checks, or could not show it.
    Skip,
}

impl Verdict {
    fn label(self) -> &'static str {
        match self {
            Verdict::Pass => "pass",
            Verdict::Tolerated => "tolerated",
            Verdict::Fail => "FAIL",
            Verdict::Skip => "skip",
        }
    }

    /// How bad: the worst finding decides a check's verdict.
    fn rank(self) -> u8 {
        match self {
            Verdict::Skip => 0,
            Verdict::Pass => 1,
            Verdict::Tolerated => 2,
            Verdict::Fail => 3,
        }
    }

    /// The worse of two verdicts.
    pub fn worst(self, other: Verdict) -> Verdict {
        if other.rank() > self.rank() {
            other
        } else {
            self
        }
    }
}

/// One named check and its verdict.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Check {
    /// Its name, stable for scripts (`framing.utf8-request`).
    pub id: String,
    /// The section of the GABP 1.0 specification it comes from (`§12.2`).
    pub section: &'static str,
    /// The vendored schema it validates against, if any (a path under `SCHEMA/1.0`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub schema: Option<&'static str>,
    /// The verdict.
    pub verdict: Verdict,
    /// One line: what was seen.
    pub detail: String,
    /// What to do about a deviation, when there is something to do.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hint: Option<String>,
}

impl Check {
    /// A check with its verdict and detail, no schema and no hint.
    pub fn new(id: &str, section: &'static str, verdict: Verdict, detail: String) -> Check {
        Check {
            id: id.into(),
            section,
            schema: None,
            verdict,
            detail,
            hint: None,
        }
    }

    /// The same check, naming the schema it validates against.
    pub fn schema(mut self, schema: &'static str) -> Check {
        self.schema = Some(schema);
        self
    }

    /// The same check with a hint.
    pub fn hint(mut self, hint: impl Into<String>) -> Check {
        self.hint = Some(hint.into());
        self
    }
}

/// How many checks got each verdict.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Summary {
    /// Passed.
    pub pass: usize,
    /// Deviations the relay absorbs.
    pub tolerated: usize,
    /// Failures.
    pub fail: usize,
    /// Not run.
    pub skip: usize,
}

/// The result of a run.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// `mod` or `bridge`: what was checked.
    pub subject: &'static str,
    /// Where (the address, or the command of a stdio mod).
    pub target: String,
    /// What the peer said it is (a mod's app and agent; a bridge's version), as it said it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peer: Option<String>,
    /// The checks, in the order they ran.
    pub checks: Vec<Check>,
    /// The verdicts counted.
    pub summary: Summary,
    /// Whether no check failed.
    pub ok: bool,
}

impl Report {
    /// A report of `checks`, counted.
    pub fn new(
        subject: &'static str,
        target: String,
        peer: Option<String>,
        checks: Vec<Check>,
    ) -> Report {
        let mut summary = Summary::default();
        for c in &checks {
            match c.verdict {
                Verdict::Pass => summary.pass += 1,
                Verdict::Tolerated => summary.tolerated += 1,
                Verdict::Fail => summary.fail += 1,
                Verdict::Skip => summary.skip += 1,
            }
        }
        Report {
            subject,
            target,
            peer,
            ok: summary.fail == 0,
            checks,
            summary,
        }
    }

    /// The report as lines for a terminal: one per check (a hint on the line below), then the
    /// counts.
    pub fn text(&self) -> String {
        let mut out = format!("{} {}", self.subject, text(&self.target, 200));
        if let Some(p) = &self.peer {
            out += &format!(": {}", text(p, 120));
        }
        out.push('\n');
        let id_width = self.checks.iter().map(|c| c.id.len()).max().unwrap_or(0);
        for c in &self.checks {
            out += &format!(
                "{:<9}  {:<id_width$}  {:<5}  {}\n",
                c.verdict.label(),
                c.id,
                c.section,
                text(&c.detail, 600)
            );
            if let Some(h) = &c.hint {
                out += &format!(
                    "{:<9}  {:<id_width$}  {:<5}  hint: {}\n",
                    "",
                    "",
                    "",
                    text(h, 600)
                );
            }
        }
        let s = &self.summary;
        out += &format!(
            "{} checks: {} pass, {} tolerated, {} fail, {} skipped\n",
            self.checks.len(),
            s.pass,
            s.tolerated,
            s.fail,
            s.skip
        );
        out
    }
}

/// `n` and `word`, plural when `n` is not 1: `1 hello`, `3 hellos`.
pub fn count(n: u64, word: &str) -> String {
    if n == 1 {
        format!("1 {word}")
    } else {
        format!("{n} {word}s")
    }
}

/// `s` for a terminal: control, invisible and text-direction characters removed (a peer's
/// names and messages are in it), at most `max` characters. Backslashes stay: the report's own
/// texts name `\uXXXX` escapes.
fn text(s: &str, max: usize) -> String {
    let s = gabp_rt::display::strip(s, false);
    if s.chars().count() > max {
        format!("{}…", s.chars().take(max).collect::<String>())
    } else {
        s
    }
}

/// Findings of one check, gathered over many messages: each distinct finding counted once
/// with its verdict, so a thousand events with the same extra member say so in one line.
#[derive(Debug, Default)]
pub struct Findings {
    items: Vec<(Verdict, String, u64)>,
}

impl Findings {
    /// Notes one finding.
    pub fn note(&mut self, verdict: Verdict, what: impl Into<String>) {
        let what = what.into();
        if let Some(item) = self.items.iter_mut().find(|(_, w, _)| *w == what) {
            item.2 += 1;
            item.0 = item.0.worst(verdict);
            return;
        }
        // Bounded: a peer that is wrong in a new way every message fills no memory.
        if self.items.len() < 64 {
            self.items.push((verdict, what, 1));
        }
    }

    /// The worst verdict noted, or `None` when nothing was.
    pub fn verdict(&self) -> Option<Verdict> {
        self.items.iter().map(|(v, ..)| *v).reduce(Verdict::worst)
    }

    /// The findings with a verdict worse than a pass, worst first, as one line (at most
    /// `max` of them, how many more said).
    pub fn line(&self, max: usize) -> String {
        let mut bad: Vec<&(Verdict, String, u64)> = self
            .items
            .iter()
            .filter(|(v, ..)| matches!(v, Verdict::Tolerated | Verdict::Fail))
            .collect();
        bad.sort_by_key(|(v, ..)| std::cmp::Reverse(v.rank()));
        let mut parts: Vec<String> = bad
            .iter()
            .take(max)
            .map(|(_, w, n)| {
                if *n > 1 {
                    format!("{w} (×{n})")
                } else {
                    w.clone()
                }
            })
            .collect();
        if bad.len() > max {
            parts.push(format!("and {} more", bad.len() - max));
        }
        parts.join("; ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_worst_finding_decides_and_repeats_are_counted() {
        let mut f = Findings::default();
        assert_eq!(f.verdict(), None);
        f.note(Verdict::Pass, "fine");
        f.note(Verdict::Tolerated, "extra member /x");
        f.note(Verdict::Tolerated, "extra member /x");
        assert_eq!(f.verdict(), Some(Verdict::Tolerated));
        f.note(Verdict::Fail, "no id");
        assert_eq!(f.verdict(), Some(Verdict::Fail));
        assert_eq!(f.line(5), "no id; extra member /x (×2)");
    }

    #[test]
    fn the_text_escapes_what_a_peer_chose_and_counts_verdicts() {
        let r = Report::new(
            "mod",
            "127.0.0.1:1".into(),
            Some("Game\u{1b}[2J 1.0".into()),
            vec![
                Check::new("a.b", "§3", Verdict::Pass, "ok".into()),
                Check::new("c", "§4.1", Verdict::Fail, "said \u{202e}x".into()).hint("fix"),
            ],
        );
        assert!(!r.ok);
        let t = r.text();
        assert!(!t.contains('\u{1b}') && !t.contains('\u{202e}'), "{t}");
        assert!(t.contains("FAIL") && t.contains("hint: fix"), "{t}");
        assert!(
            t.ends_with("2 checks: 1 pass, 0 tolerated, 1 fail, 0 skipped\n"),
            "{t}"
        );
    }
}
