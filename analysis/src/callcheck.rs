//! The call check of `replay --expect-calls`: the calls an agent made to a replay compared with
//! the calls a recording holds, as a readable diff and as JSON.
//!
//! A call is a bridge's request other than the hello, `events/*` and `relay/*`
//! ([`gabp_proto::matching::is_agent_call`]): on the recorded side every such request a bridge
//! sent (as recorded, before the relay forwarded it); on the agent's side every such request the
//! replay received. Each side is kept per bridge in arrival order, bridges in the order of their
//! first call, and the Nth bridge of one side is compared with the Nth of the other.
//!
//! Two sequences are aligned twice (Myers, bounded by a deadline): first on the whole call
//! (method, tool and params under the replay's [`MatchRule`]), so a call missing or added in a
//! run of like calls is told as such; then, inside each stretch that differs, on the method and
//! tool alone, so a call whose params changed is told as changed, with the paths that differ.
//! Calls left over are missing (recorded, not made) or extra (made, not recorded). With a timing
//! tolerance, each pair of calls is also checked for when it came, relative to the session's
//! start on the recorded side and to the bridge's timeline start in the replay.
//!
//! Bounded: each side keeps [`MAX_CALLS`] calls and [`MAX_CALL_BYTES`] of params, counting the
//! rest; the report lists [`MAX_LISTED`] differences and [`MAX_CHANGES`] paths per call.
//! Reads a store opened for reading; knows nothing of the engine or a socket.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::time::{Duration, Instant};

use gabp_proto::matching::{is_agent_call, tool_name, MatchRule, MAX_CALLS, MAX_CALL_BYTES};
use gabp_proto::{Mode, MsgType, Parser};
use gabp_storage::{Direction, SessionMeta, Store, StoreError};
use serde::Serialize;
use serde_json::Value;
use similar::{capture_diff_slices_deadline, Algorithm, DiffOp};

/// Differences the report lists; the rest are counted.
pub const MAX_LISTED: usize = 1_000;
/// Paths listed per changed call.
pub const MAX_CHANGES: usize = 50;
/// How long each alignment may search for the fewest differences before it settles for a
/// good one.
const ALIGN_DEADLINE: Duration = Duration::from_secs(5);
/// Characters of params shown per line of the text report.
const SHOWN: usize = 160;

/// One call, as it is compared.
#[derive(Debug, Clone)]
pub struct Call {
    /// The method.
    pub method: String,
    /// The tool, for `tools/call`.
    pub tool: Option<String>,
    /// The params as compared (the ignored fields removed; `None` under `--match order`).
    pub params: Option<Value>,
    /// When it came: from the session's start (recorded) or the bridge's timeline start (the
    /// agent's), in ns.
    pub offset_ns: u64,
    /// The whole call, hashed.
    whole: u128,
    /// Its method and tool, hashed.
    kind: u64,
}

/// One side's calls (see the module doc).
#[derive(Debug, Clone, Default)]
pub struct Calls {
    /// Each bridge's calls in order, with its connection number; bridges in the order of their
    /// first call.
    pub bridges: Vec<(u32, Vec<Call>)>,
    /// Calls past the bounds: counted, not compared.
    pub not_kept: u64,
}

impl Calls {
    /// Calls on this side, kept or not.
    pub fn total(&self) -> u64 {
        self.bridges.iter().map(|b| b.1.len() as u64).sum::<u64>() + self.not_kept
    }
}

/// Gathers one side's calls, in the order they happened, within the bounds.
#[derive(Debug)]
pub struct Collector {
    rule: MatchRule,
    bridges: Vec<(u32, Vec<Call>)>,
    at: HashMap<u32, usize>,
    kept: usize,
    bytes: usize,
    not_kept: u64,
}

fn hash128(parts: &[&str]) -> u128 {
    let half = |salt: u8| {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        salt.hash(&mut h);
        parts.hash(&mut h);
        h.finish()
    };
    (u128::from(half(1)) << 64) | u128::from(half(2))
}

impl Collector {
    /// An empty side, compared under `rule`.
    pub fn new(rule: &MatchRule) -> Collector {
        Collector {
            rule: rule.clone(),
            bridges: Vec::new(),
            at: HashMap::new(),
            kept: 0,
            bytes: 0,
            not_kept: 0,
        }
    }

    /// Bridge `conn` made a call to `method` with `params` (as sent), `offset_ns` into its
    /// timeline. Calls are added in the order they happened.
    pub fn add(&mut self, conn: u32, method: &str, params: Option<&[u8]>, offset_ns: u64) {
        let size = method.len() + params.map_or(0, <[u8]>::len);
        if self.kept >= MAX_CALLS || self.bytes + size > MAX_CALL_BYTES {
            self.not_kept += 1;
            return;
        }
        self.kept += 1;
        self.bytes += size;
        let raw = params.and_then(|p| serde_json::from_slice::<Value>(p).ok());
        let tool = tool_name(method, raw.as_ref()).map(str::to_string);
        let compared = self.rule.compared(params);
        let canonical = compared
            .as_ref()
            .map(|v| serde_json::to_string(v).unwrap_or_default())
            .unwrap_or_default();
        let tool_text = tool.as_deref().unwrap_or("");
        let (whole, kind) = (
            hash128(&[method, tool_text, &canonical]),
            hash128(&[method, tool_text]) as u64,
        );
        let call = Call {
            method: method.to_string(),
            tool,
            params: compared,
            offset_ns,
            whole,
            kind,
        };
        let n = self.bridges.len();
        let i = *self.at.entry(conn).or_insert(n);
        if i == n {
            self.bridges.push((conn, Vec::new()));
        }
        self.bridges[i].1.push(call);
    }

    /// The side gathered.
    pub fn finish(self) -> Calls {
        Calls {
            bridges: self.bridges,
            not_kept: self.not_kept,
        }
    }
}

/// The calls bridges made in a recorded session at offsets `within_ns` of its start (the range
/// a replay plays), compared under `rule`: one streaming pass, events skipped unparsed.
pub fn recorded(
    store: &Store,
    meta: &SessionMeta,
    rule: &MatchRule,
    within_ns: std::ops::RangeInclusive<u64>,
) -> Result<Calls, StoreError> {
    let mut side = Collector::new(rule);
    let mut parser = Parser::new();
    for item in store.frames(meta.id) {
        let (_, rec) = item?;
        if rec.channel.is_some() || rec.dir != Direction::BridgeToRelay {
            continue;
        }
        let offset = rec.time_ns.saturating_sub(meta.started_ns);
        if !within_ns.contains(&offset) {
            continue;
        }
        let Ok(view) = parser.parse(&rec.body, Mode::Tolerant) else {
            continue;
        };
        if view.kind != MsgType::Request {
            continue;
        }
        let method = view.method.as_deref().unwrap_or_default();
        if !is_agent_call(method) {
            continue;
        }
        let params = view.params.clone().map(|p| &rec.body[p]);
        side.add(rec.conn, method, params, offset);
    }
    Ok(side.finish())
}

/// When calls must come, for the timing check.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    /// How far a call may come from its recorded time.
    pub tolerance: Duration,
    /// `--from`: the recorded time the replay's timelines start at.
    pub from: Duration,
    /// `--speed`: the replay's pace (2.0 plays twice as fast).
    pub speed: f64,
}

/// One side's figures in the report.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Side {
    /// The recorded session the calls come from (the recorded side only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    /// Calls on this side.
    pub calls: u64,
    /// Bridges that made calls.
    pub bridges: usize,
    /// Calls past the bounds, not compared.
    pub not_compared: u64,
}

/// How many differences of each kind.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Counts {
    /// Recorded calls the agent did not make.
    pub missing: u64,
    /// Calls the agent made that the recording does not hold.
    pub extra: u64,
    /// Calls made with other params.
    pub changed: u64,
    /// Calls that came earlier or later than the tolerance allows.
    pub timing: u64,
}

/// A path whose value differs between a recorded call and the agent's.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Change {
    /// A JSON pointer into the request (`/params/arguments/q`), as `--ignore-field` takes it.
    pub path: String,
    /// The recorded value; absent when the recorded call has none there.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recorded: Option<Value>,
    /// The agent's value; absent when the agent's call has none there.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub got: Option<Value>,
}

/// One difference (see the module doc). Indexes count a bridge's calls from 1.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum Difference {
    /// A recorded call the agent did not make.
    #[serde(rename_all = "camelCase")]
    Missing {
        /// Its place among the recorded bridge's calls.
        recorded_index: usize,
        /// The method.
        method: String,
        /// The tool, for `tools/call`.
        #[serde(skip_serializing_if = "Option::is_none")]
        tool: Option<String>,
        /// Its params as compared.
        #[serde(skip_serializing_if = "Option::is_none")]
        params: Option<Value>,
        /// When it was recorded, ms from the session's start.
        recorded_ms: f64,
    },
    /// A call the agent made that the recording does not hold.
    #[serde(rename_all = "camelCase")]
    Extra {
        /// Its place among the agent bridge's calls.
        got_index: usize,
        /// The method.
        method: String,
        /// The tool, for `tools/call`.
        #[serde(skip_serializing_if = "Option::is_none")]
        tool: Option<String>,
        /// Its params as compared.
        #[serde(skip_serializing_if = "Option::is_none")]
        params: Option<Value>,
        /// When it came, ms from the bridge's timeline start.
        got_ms: f64,
    },
    /// The same method and tool, other params.
    #[serde(rename_all = "camelCase")]
    Changed {
        /// Its place among the recorded bridge's calls.
        recorded_index: usize,
        /// Its place among the agent bridge's calls.
        got_index: usize,
        /// The method.
        method: String,
        /// The tool, for `tools/call`.
        #[serde(skip_serializing_if = "Option::is_none")]
        tool: Option<String>,
        /// The paths that differ (at most [`MAX_CHANGES`]).
        changes: Vec<Change>,
        /// Paths that differ past those listed.
        #[serde(skip_serializing_if = "is_zero")]
        more_changes: usize,
    },
    /// A call that came earlier or later than the tolerance allows.
    #[serde(rename_all = "camelCase")]
    Timing {
        /// Its place among the recorded bridge's calls.
        recorded_index: usize,
        /// Its place among the agent bridge's calls.
        got_index: usize,
        /// The method.
        method: String,
        /// The tool, for `tools/call`.
        #[serde(skip_serializing_if = "Option::is_none")]
        tool: Option<String>,
        /// When it was recorded, ms from the session's start.
        recorded_ms: f64,
        /// When the replay's timeline played that moment, ms from the bridge's timeline start
        /// (`--from` and `--speed` applied).
        expected_ms: f64,
        /// When it came, ms from the bridge's timeline start.
        got_ms: f64,
        /// `gotMs - expectedMs`: positive when late.
        shift_ms: f64,
    },
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// One pair of bridges compared: the Nth bridge of each side.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct BridgeDiff {
    /// The recorded bridge's connection number; absent when the agent used more bridges.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recorded_conn: Option<u32>,
    /// The agent bridge's connection number in the replay; absent when it used fewer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub got_conn: Option<u32>,
    /// The recorded bridge's calls.
    pub recorded_calls: usize,
    /// The agent bridge's calls.
    pub got_calls: usize,
    /// Its differences, in call order (the first [`MAX_LISTED`] of the whole report).
    pub differences: Vec<Difference>,
}

/// The call check's verdict and differences: what `--diff-json` writes.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CallDiff {
    /// Whether the agent's calls match the recording's.
    pub same: bool,
    /// The match mode params were compared under.
    #[serde(rename = "match")]
    pub matching: &'static str,
    /// The fields left out of the comparison (`--ignore-field`).
    pub ignored_fields: Vec<String>,
    /// The timing tolerance in ms, when timing is checked.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timing_tolerance_ms: Option<f64>,
    /// The recorded side.
    pub recorded: Side,
    /// The agent's side.
    pub got: Side,
    /// Differences of each kind, listed or not.
    pub counts: Counts,
    /// Differences found but not listed (past [`MAX_LISTED`]).
    pub not_listed: u64,
    /// Each pair of bridges compared.
    pub bridges: Vec<BridgeDiff>,
}

fn ms(ns: u64) -> f64 {
    (ns as f64 / 1e6 * 1000.0).round() / 1000.0
}

/// Lists a differing path, or counts it past [`MAX_CHANGES`].
fn push_change(
    out: &mut Vec<Change>,
    more: &mut usize,
    path: &str,
    recorded: Option<&Value>,
    got: Option<&Value>,
) {
    if out.len() < MAX_CHANGES {
        out.push(Change {
            path: path.to_string(),
            recorded: recorded.cloned(),
            got: got.cloned(),
        });
    } else {
        *more += 1;
    }
}

/// The paths where `recorded` and `got` differ, under `path`, the first [`MAX_CHANGES`] listed
/// and the rest counted. Recursion is bounded by the depth serde_json parses (128).
fn changes(
    path: &mut String,
    recorded: &Value,
    got: &Value,
    out: &mut Vec<Change>,
    more: &mut usize,
) {
    match (recorded, got) {
        (Value::Object(r), Value::Object(g)) => {
            let mut keys: Vec<&String> = r.keys().chain(g.keys()).collect();
            keys.sort();
            keys.dedup();
            for k in keys {
                let len = path.len();
                path.push('/');
                path.push_str(&k.replace('~', "~0").replace('/', "~1"));
                match (r.get(k), g.get(k)) {
                    (Some(a), Some(b)) => changes(path, a, b, out, more),
                    (a, b) => push_change(out, more, path, a, b),
                }
                path.truncate(len);
            }
        }
        (Value::Array(r), Value::Array(g)) => {
            for i in 0..r.len().max(g.len()) {
                let len = path.len();
                path.push('/');
                path.push_str(&i.to_string());
                match (r.get(i), g.get(i)) {
                    (Some(a), Some(b)) => changes(path, a, b, out, more),
                    (a, b) => push_change(out, more, path, a, b),
                }
                path.truncate(len);
            }
        }
        (a, b) if a != b => push_change(out, more, path, Some(a), Some(b)),
        _ => {}
    }
}

/// What the walk over one pair of bridges adds up.
struct Walk<'a> {
    timing: Option<Timing>,
    counts: &'a mut Counts,
    listed: &'a mut usize,
    not_listed: &'a mut u64,
    out: Vec<Difference>,
}

impl Walk<'_> {
    fn note(&mut self, d: impl FnOnce() -> Difference) {
        if *self.listed < MAX_LISTED {
            *self.listed += 1;
            self.out.push(d());
        } else {
            *self.not_listed += 1;
        }
    }

    fn missing(&mut self, i: usize, c: &Call) {
        self.counts.missing += 1;
        self.note(|| Difference::Missing {
            recorded_index: i + 1,
            method: c.method.clone(),
            tool: c.tool.clone(),
            params: c.params.clone(),
            recorded_ms: ms(c.offset_ns),
        });
    }

    fn extra(&mut self, j: usize, c: &Call) {
        self.counts.extra += 1;
        self.note(|| Difference::Extra {
            got_index: j + 1,
            method: c.method.clone(),
            tool: c.tool.clone(),
            params: c.params.clone(),
            got_ms: ms(c.offset_ns),
        });
    }

    /// A recorded call and the agent's, paired: their params and their timing.
    fn pair(&mut self, i: usize, r: &Call, j: usize, g: &Call) {
        if r.whole != g.whole {
            let (mut found, mut more) = (Vec::new(), 0);
            if let (Some(a), Some(b)) = (&r.params, &g.params) {
                changes(&mut "/params".to_string(), a, b, &mut found, &mut more);
            }
            self.counts.changed += 1;
            self.note(|| Difference::Changed {
                recorded_index: i + 1,
                got_index: j + 1,
                method: g.method.clone(),
                tool: g.tool.clone(),
                changes: found,
                more_changes: more,
            });
        }
        let Some(t) = self.timing else { return };
        let from = t.from.as_nanos() as u64;
        let expected = (r.offset_ns.saturating_sub(from) as f64 / t.speed) as u64;
        let shift = g.offset_ns as i128 - expected as i128;
        if shift.unsigned_abs() > t.tolerance.as_nanos() {
            self.counts.timing += 1;
            self.note(|| Difference::Timing {
                recorded_index: i + 1,
                got_index: j + 1,
                method: g.method.clone(),
                tool: g.tool.clone(),
                recorded_ms: ms(r.offset_ns),
                expected_ms: ms(expected),
                got_ms: ms(g.offset_ns),
                shift_ms: shift as f64 / 1e6,
            });
        }
    }

    /// A stretch where the whole calls differ: aligned again on method and tool.
    fn stretch(&mut self, rec: &[Call], r0: usize, got: &[Call], g0: usize) {
        let rk: Vec<u64> = rec.iter().map(|c| c.kind).collect();
        let gk: Vec<u64> = got.iter().map(|c| c.kind).collect();
        for step in align(&rk, &gk) {
            match step {
                Step::Pair(i, j) => self.pair(r0 + i, &rec[i], g0 + j, &got[j]),
                Step::Differ(r, g) => {
                    for i in r {
                        self.missing(r0 + i, &rec[i]);
                    }
                    for j in g {
                        self.extra(g0 + j, &got[j]);
                    }
                }
            }
        }
    }

    fn bridge(&mut self, rec: &[Call], got: &[Call]) {
        let rk: Vec<u128> = rec.iter().map(|c| c.whole).collect();
        let gk: Vec<u128> = got.iter().map(|c| c.whole).collect();
        for step in align(&rk, &gk) {
            match step {
                Step::Pair(i, j) => self.pair(i, &rec[i], j, &got[j]),
                Step::Differ(r, g) => {
                    self.stretch(&rec[r.clone()], r.start, &got[g.clone()], g.start)
                }
            }
        }
    }
}

/// One step of an alignment: two positions whose keys are equal, or a stretch of each side
/// (either may be empty) that differs.
enum Step {
    Pair(usize, usize),
    Differ(std::ops::Range<usize>, std::ops::Range<usize>),
}

/// Aligns two lists of keys (Myers, given up to [`ALIGN_DEADLINE`]).
fn align<K: std::hash::Hash + Eq + Ord>(a: &[K], b: &[K]) -> Vec<Step> {
    let deadline = Instant::now() + ALIGN_DEADLINE;
    let mut steps = Vec::new();
    for op in capture_diff_slices_deadline(Algorithm::Myers, a, b, Some(deadline)) {
        match op {
            DiffOp::Equal {
                old_index,
                new_index,
                len,
            } => steps.extend((0..len).map(|k| Step::Pair(old_index + k, new_index + k))),
            other => steps.push(Step::Differ(other.old_range(), other.new_range())),
        }
    }
    steps
}

/// Compares the agent's calls (`got`) with the recorded ones (`expected`), both gathered under
/// `rule`; checks timing too when `timing` is given.
pub fn compare(
    expected: &Calls,
    got: &Calls,
    rule: &MatchRule,
    timing: Option<Timing>,
) -> CallDiff {
    let mut counts = Counts::default();
    let (mut listed, mut not_listed) = (0, 0);
    let mut bridges = Vec::new();
    let empty: (u32, Vec<Call>) = (0, Vec::new());
    for n in 0..expected.bridges.len().max(got.bridges.len()) {
        let r = expected.bridges.get(n);
        let g = got.bridges.get(n);
        let mut walk = Walk {
            timing,
            counts: &mut counts,
            listed: &mut listed,
            not_listed: &mut not_listed,
            out: Vec::new(),
        };
        walk.bridge(&r.unwrap_or(&empty).1, &g.unwrap_or(&empty).1);
        bridges.push(BridgeDiff {
            recorded_conn: r.map(|b| b.0),
            got_conn: g.map(|b| b.0),
            recorded_calls: r.map_or(0, |b| b.1.len()),
            got_calls: g.map_or(0, |b| b.1.len()),
            differences: walk.out,
        });
    }
    let side = |c: &Calls| Side {
        session: None,
        calls: c.total(),
        bridges: c.bridges.len(),
        not_compared: c.not_kept,
    };
    let same = counts == Counts::default() && expected.total() == got.total();
    CallDiff {
        same,
        matching: rule.name(),
        ignored_fields: rule.ignored().iter().map(|p| p.to_string()).collect(),
        timing_tolerance_ms: timing.map(|t| t.tolerance.as_secs_f64() * 1e3),
        recorded: side(expected),
        got: side(got),
        counts,
        not_listed,
        bridges,
    }
}

fn shown(v: &Option<Value>) -> String {
    v.as_ref().map_or_else(
        || "(absent)".to_string(),
        |v| gabp_rt::display::text(&v.to_string(), SHOWN),
    )
}

fn what(method: &str, tool: &Option<String>) -> String {
    match tool {
        Some(t) => format!(
            "{} {}",
            gabp_rt::display::name(method),
            gabp_rt::display::name(t)
        ),
        None => gabp_rt::display::name(method),
    }
}

fn secs(ms: f64) -> String {
    format!("{:.3} s", ms / 1e3)
}

impl CallDiff {
    /// The readable report: a line per difference under its pair of bridges, and the verdict.
    pub fn text(&self) -> String {
        use std::fmt::Write;
        let mut t = String::new();
        let session = self
            .recorded
            .session
            .as_deref()
            .map(|s| format!(" in session {s}"))
            .unwrap_or_default();
        let _ = write!(
            t,
            "calls: {} recorded{session} from {} bridge(s), {} made by the agent from {} bridge(s); match {}",
            self.recorded.calls, self.recorded.bridges, self.got.calls, self.got.bridges, self.matching
        );
        if !self.ignored_fields.is_empty() {
            let _ = write!(t, " (ignoring {})", self.ignored_fields.join(", "));
        }
        t.push('\n');
        if self.recorded.not_compared + self.got.not_compared > 0 {
            let _ = writeln!(
                t,
                "only the first {MAX_CALLS} calls (or {} MiB of params) of each side were compared: {} recorded and {} made were not",
                MAX_CALL_BYTES >> 20,
                self.recorded.not_compared,
                self.got.not_compared
            );
        }
        for (n, b) in self.bridges.iter().enumerate() {
            if b.differences.is_empty() {
                continue;
            }
            let conn = |c: Option<u32>| c.map_or_else(|| "none".to_string(), |c| c.to_string());
            let _ = writeln!(
                t,
                "bridge {} (recorded conn {}, replay conn {}): {} recorded, {} made",
                n + 1,
                conn(b.recorded_conn),
                conn(b.got_conn),
                b.recorded_calls,
                b.got_calls
            );
            for d in &b.differences {
                match d {
                    Difference::Missing {
                        recorded_index,
                        method,
                        tool,
                        params,
                        recorded_ms,
                    } => {
                        let _ = writeln!(
                            t,
                            "  missing  call {recorded_index}: {} {} (recorded at {})",
                            what(method, tool),
                            shown(params),
                            secs(*recorded_ms)
                        );
                    }
                    Difference::Extra {
                        got_index,
                        method,
                        tool,
                        params,
                        got_ms,
                    } => {
                        let _ = writeln!(
                            t,
                            "  extra    call {got_index} made: {} {} (at {})",
                            what(method, tool),
                            shown(params),
                            secs(*got_ms)
                        );
                    }
                    Difference::Changed {
                        recorded_index,
                        got_index,
                        method,
                        tool,
                        changes,
                        more_changes,
                    } => {
                        let _ = writeln!(
                            t,
                            "  changed  call {recorded_index} (made as call {got_index}): {}",
                            what(method, tool)
                        );
                        for c in changes {
                            let _ = writeln!(
                                t,
                                "           {}: recorded {}, got {}",
                                gabp_rt::display::text(&c.path, SHOWN),
                                shown(&c.recorded),
                                shown(&c.got)
                            );
                        }
                        if *more_changes > 0 {
                            let _ = writeln!(t, "           and {more_changes} more paths");
                        }
                    }
                    Difference::Timing {
                        recorded_index,
                        got_index,
                        method,
                        tool,
                        expected_ms,
                        got_ms,
                        shift_ms,
                        ..
                    } => {
                        let _ = writeln!(
                            t,
                            "  timing   call {recorded_index} (made as call {got_index}): {} came at {}, expected at {} ({} {})",
                            what(method, tool),
                            secs(*got_ms),
                            secs(*expected_ms),
                            secs(shift_ms.abs()),
                            if *shift_ms > 0.0 { "late" } else { "early" }
                        );
                    }
                }
            }
        }
        if self.not_listed > 0 {
            let _ = writeln!(t, "{} more differences not listed", self.not_listed);
        }
        let c = &self.counts;
        if self.same {
            let _ = writeln!(t, "calls match: {} calls", self.got.calls);
        } else {
            let mut parts = Vec::new();
            for (n, what) in [
                (c.changed, "changed"),
                (c.missing, "missing"),
                (c.extra, "extra"),
                (c.timing, "off time"),
            ] {
                if n > 0 {
                    parts.push(format!("{n} {what}"));
                }
            }
            if parts.is_empty() {
                parts.push(format!(
                    "{} recorded calls, {} made",
                    self.recorded.calls, self.got.calls
                ));
            }
            let _ = writeln!(t, "calls differ: {}", parts.join(", "));
        }
        t
    }

    /// The one line an exit 1 says, when the calls differ.
    pub fn verdict(&self) -> String {
        let c = &self.counts;
        format!(
            "the agent's calls differ from the recording's ({} changed, {} missing, {} extra, {} off time)",
            c.changed, c.missing, c.extra, c.timing
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn side(rule: &MatchRule, calls: &[(u32, &str, Value, u64)]) -> Calls {
        let mut c = Collector::new(rule);
        for (conn, method, params, at) in calls {
            let p = params.to_string();
            c.add(*conn, method, Some(p.as_bytes()), *at);
        }
        c.finish()
    }

    fn echo(q: i64) -> Value {
        json!({"name": "sim/echo", "arguments": {"q": q}})
    }

    #[test]
    fn the_same_calls_match() {
        let rule = MatchRule::Exact;
        let a = side(
            &rule,
            &[(1, "tools/call", echo(1), 0), (1, "tools/call", echo(2), 5)],
        );
        let b = side(
            &rule,
            &[(7, "tools/call", echo(1), 9), (7, "tools/call", echo(2), 9)],
        );
        let d = compare(&a, &b, &rule, None);
        assert!(d.same, "{}", d.text());
        assert!(d.text().contains("calls match: 2 calls"), "{}", d.text());
    }

    #[test]
    fn a_changed_argument_is_told_by_its_path() {
        let rule = MatchRule::Exact;
        let a = side(
            &rule,
            &[(1, "tools/call", echo(1), 0), (1, "tools/call", echo(2), 0)],
        );
        let b = side(
            &rule,
            &[
                (1, "tools/call", echo(1), 0),
                (1, "tools/call", echo(20), 0),
            ],
        );
        let d = compare(&a, &b, &rule, None);
        assert!(!d.same);
        assert_eq!(d.counts.changed, 1);
        assert_eq!(
            d.bridges[0].differences,
            vec![Difference::Changed {
                recorded_index: 2,
                got_index: 2,
                method: "tools/call".into(),
                tool: Some("sim/echo".into()),
                changes: vec![Change {
                    path: "/params/arguments/q".into(),
                    recorded: Some(json!(2)),
                    got: Some(json!(20)),
                }],
                more_changes: 0,
            }]
        );
        let text = d.text();
        assert!(
            text.contains("changed  call 2 (made as call 2): tools/call sim/echo")
                && text.contains("/params/arguments/q: recorded 2, got 20"),
            "{text}"
        );
    }

    #[test]
    fn a_call_left_out_and_one_added_are_missing_and_extra() {
        let rule = MatchRule::Exact;
        let a = side(
            &rule,
            &[
                (1, "tools/call", echo(1), 0),
                (1, "tools/call", echo(2), 0),
                (1, "tools/call", echo(3), 0),
            ],
        );
        let b = side(
            &rule,
            &[
                (1, "tools/call", echo(1), 0),
                (1, "tools/call", echo(3), 0),
                (1, "tools/list", json!({}), 0),
            ],
        );
        let d = compare(&a, &b, &rule, None);
        assert_eq!(
            (d.counts.missing, d.counts.extra, d.counts.changed),
            (1, 1, 0),
            "{}",
            d.text()
        );
        let text = d.text();
        assert!(
            text.contains("missing  call 2: tools/call sim/echo"),
            "{text}"
        );
        assert!(
            text.contains("extra    call 3 made: tools/list {}"),
            "{text}"
        );
    }

    #[test]
    fn ignored_fields_and_order_mode_compare_less() {
        let stamp = |q: i64, ts: i64| json!({"name": "sim/echo", "arguments": {"q": q, "ts": ts}});
        let ignore = MatchRule::Ignore(vec!["params.arguments.ts".parse().expect("path")]);
        let a = side(&ignore, &[(1, "tools/call", stamp(1, 100), 0)]);
        let b = side(&ignore, &[(1, "tools/call", stamp(1, 999), 0)]);
        assert!(compare(&a, &b, &ignore, None).same);
        let order = MatchRule::Order;
        let a = side(&order, &[(1, "tools/call", stamp(1, 1), 0)]);
        let b = side(&order, &[(1, "tools/call", stamp(2, 2), 0)]);
        assert!(compare(&a, &b, &order, None).same);
        // The tool still counts under order.
        let b = side(&order, &[(1, "tools/call", json!({"name": "sim/emit"}), 0)]);
        assert!(!compare(&a, &b, &order, None).same);
    }

    #[test]
    fn timing_is_checked_against_the_replayed_timeline() {
        let rule = MatchRule::Exact;
        let s = 1_000_000_000u64;
        let a = side(
            &rule,
            &[
                (1, "tools/call", echo(1), 10 * s),
                (1, "tools/call", echo(2), 20 * s),
            ],
        );
        // --from 4s at twice the speed: 10 s recorded is 3 s in; 20 s is 8 s in.
        let b = side(
            &rule,
            &[
                (1, "tools/call", echo(1), 3 * s),
                (1, "tools/call", echo(2), 9 * s),
            ],
        );
        let timing = Timing {
            tolerance: Duration::from_millis(500),
            from: Duration::from_secs(4),
            speed: 2.0,
        };
        let d = compare(&a, &b, &rule, Some(timing));
        assert_eq!(d.counts.timing, 1, "{}", d.text());
        assert!(
            d.text()
                .contains("came at 9.000 s, expected at 8.000 s (1.000 s late)"),
            "{}",
            d.text()
        );
    }

    #[test]
    fn bridges_pair_in_the_order_of_their_first_call_and_bounds_hold() {
        let rule = MatchRule::Exact;
        let a = side(&rule, &[(5, "a/x", json!({}), 0), (3, "b/x", json!({}), 1)]);
        let b = side(&rule, &[(1, "a/x", json!({}), 0), (2, "b/x", json!({}), 0)]);
        assert!(compare(&a, &b, &rule, None).same);
        let mut c = Collector::new(&rule);
        for _ in 0..MAX_CALLS + 3 {
            c.add(1, "a/x", None, 0);
        }
        let c = c.finish();
        assert_eq!((c.total(), c.not_kept), (MAX_CALLS as u64 + 3, 3));
    }

    #[test]
    fn the_json_shape_is_camel_case_with_a_kind_per_difference() {
        let rule = MatchRule::Exact;
        let a = side(&rule, &[(1, "tools/call", echo(1), 0)]);
        let b = side(&rule, &[(1, "tools/call", echo(2), 0)]);
        let v = serde_json::to_value(compare(&a, &b, &rule, None)).expect("json");
        assert_eq!(v["match"], "exact");
        assert_eq!(v["counts"]["changed"], 1);
        let d = &v["bridges"][0]["differences"][0];
        assert_eq!(d["kind"], "changed");
        assert_eq!(d["recordedIndex"], 1);
        assert_eq!(d["changes"][0]["path"], "/params/arguments/q");
    }
}
