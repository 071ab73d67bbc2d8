//! `replay`'s request matching (`--match`, `--ignore-field`) and the call check
//! (`--expect-calls`): the flags, the rule they make, and what the replay prints when it ends
//! (its requests answered and unmatched, and with `--expect-calls` the diff and the exit). The
//! rule is `gabp_proto::matching`'s, the comparison `gabp_analysis::callcheck`'s; this parses,
//! gathers and prints.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;
use clap::{Args, ValueEnum};
use gabp_analysis::callcheck::{self, Collector, Timing};
use gabp_engine::replay::{Recording, Speed};
use gabp_proto::matching::{FieldPath, MatchRule};
use gabp_storage::SessionMeta;

use super::usage;

/// How a replay's request finds its recorded answer.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum MatchMode {
    /// The same method and params (as canonical JSON: keys sorted, absent params as {}).
    Exact,
    /// As exact, once the --ignore-field fields are removed from both.
    Ignore,
    /// The Nth call of a method from a bridge gets the Nth recorded answer of that method,
    /// whatever its params.
    Order,
}

/// How requests are matched, and the agent test.
#[derive(Args, Debug)]
pub struct CallArgs {
    /// How a request finds its recorded answer (and how --expect-calls compares params): exact
    /// (method and params), ignore (without the --ignore-field fields), order (by order of
    /// calls per method, whatever the params) [default: exact].
    #[arg(long = "match", value_name = "MODE", value_enum)]
    pub matching: Option<MatchMode>,
    /// A field left out when matching and comparing, e.g. params.arguments.timestamp or
    /// /params/arguments/timestamp (a JSON pointer); `*` stands for every member or element.
    /// Repeatable; implies --match ignore.
    #[arg(long, value_name = "PATH", value_parser = parse_path)]
    pub ignore_field: Vec<FieldPath>,
    /// Test the agent: once the last bridge has left (after one connected), compare the calls it
    /// made with the recorded session's, print the differences and exit: 0 when they match, 1
    /// when they differ.
    #[arg(long)]
    pub expect_calls: bool,
    /// Compare with the calls of this session instead (id, unique id prefix, or `latest`).
    #[arg(long, value_name = "SESSION", requires = "expect_calls")]
    pub calls_from: Option<String>,
    /// Also write the comparison as one JSON document to FILE.
    #[arg(long, value_name = "FILE", requires = "expect_calls")]
    pub diff_json: Option<PathBuf>,
    /// Also check when each call came: within this much of its recorded time (e.g. 500ms),
    /// on the replayed timeline (after --from and --speed).
    #[arg(long, value_name = "DUR", value_parser = gabp_rt::units::parse_duration, requires = "expect_calls")]
    pub timing_tolerance: Option<Duration>,
}

fn parse_path(s: &str) -> Result<FieldPath, String> {
    s.parse()
}

impl CallArgs {
    /// The matching rule the flags ask for; a usage error if they disagree.
    pub fn rule(&self) -> Result<MatchRule> {
        match (self.matching, self.ignore_field.is_empty()) {
            (None | Some(MatchMode::Exact), true) => Ok(MatchRule::Exact),
            (Some(MatchMode::Order), true) => Ok(MatchRule::Order),
            (None | Some(MatchMode::Ignore), false) => {
                Ok(MatchRule::Ignore(self.ignore_field.clone()))
            }
            (Some(MatchMode::Ignore), true) => Err(usage(
                "--match ignore needs at least one --ignore-field PATH",
            )),
            (Some(m), false) => Err(usage(format!(
                "--ignore-field goes with --match ignore, not --match {}",
                m.to_possible_value()
                    .map_or("?".into(), |v| v.get_name().to_string())
            ))),
        }
    }
}

/// What the replay prints when it ends, and the call check's verdict: an error (exit 1) when
/// the agent's calls differ from `expected`'s.
pub fn finish(
    a: &CallArgs,
    rec: &Recording,
    expected: &SessionMeta,
    speed: Speed,
    json: bool,
) -> Result<()> {
    let (requests, answered, unmatched) = rec.calls().counts();
    let summary = format!(
        "replay ended: {requests} requests, {answered} answered from the recording, {unmatched} with no recorded match (-32004)\n"
    );
    if !a.expect_calls {
        if json {
            let doc = serde_json::json!({
                "requests": requests, "answered": answered, "unmatched": unmatched,
            });
            super::print_best_effort(&format!("{doc}\n"));
        } else {
            super::print_best_effort(&summary);
        }
        return Ok(());
    }
    let rule = a.rule()?;
    // The recorded calls are those of the replayed range (`--from`/`--to`, the marks, the
    // episode): the agent meets only that stretch of the game. Another session counts whole.
    let same_session = expected.id == rec.meta.id;
    let (from, within) = if same_session {
        let (start, end) = rec.range();
        (start, start.as_nanos() as u64..=end.as_nanos() as u64)
    } else {
        (Duration::ZERO, 0..=u64::MAX)
    };
    let want = callcheck::recorded(rec.store(), expected, &rule, within)?;
    let made = rec.calls().made();
    let mut calls: Vec<(u64, u32, u64, &gabp_engine::replay::AgentCall)> = made
        .bridges
        .iter()
        .flat_map(|b| {
            b.calls
                .iter()
                .map(move |c| (c.at_ns, b.conn, c.at_ns.saturating_sub(b.start_ns), c))
        })
        .collect();
    // One side in the order the calls happened, so bridges pair by their first call.
    calls.sort_by_key(|c| (c.0, c.1));
    let mut got = Collector::new(&rule);
    for (_, conn, offset, c) in calls {
        got.add(conn, &c.method, c.params.as_deref(), offset);
    }
    let mut got = got.finish();
    got.not_kept += made.not_kept;
    let timing = match (a.timing_tolerance, speed) {
        (Some(tolerance), Speed::Factor(speed)) => Some(Timing {
            tolerance,
            from,
            speed,
        }),
        _ => None,
    };
    let mut diff = callcheck::compare(&want, &got, &rule, timing);
    diff.recorded.session = Some(expected.id.to_string());
    if let Some(path) = &a.diff_json {
        gabp_analysis::export::write_atomically(path, |f| -> Result<()> {
            use std::io::Write;
            serde_json::to_writer_pretty(&mut *f, &diff)?;
            f.write_all(b"\n")?;
            Ok(())
        })
        // Exit 2, not 1: a harness that cannot keep the diff is not an agent that differs.
        .map_err(|e| {
            super::usage(format!(
                "cannot write --diff-json {}: {e:#}",
                path.display()
            ))
        })?;
    }
    if json {
        let doc = serde_json::json!({
            "requests": requests, "answered": answered, "unmatched": unmatched, "calls": diff,
        });
        super::print_best_effort(&format!("{doc}\n"));
    } else {
        let mut text = summary;
        if a.timing_tolerance.is_some() && timing.is_none() {
            text += "timing not checked: at --speed max the replay keeps no timeline\n";
        }
        text += &diff.text();
        super::print_best_effort(&text);
    }
    if diff.same {
        Ok(())
    } else {
        anyhow::bail!("{}", diff.verdict())
    }
}
