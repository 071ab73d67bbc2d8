//! The replay's playhead: pause, resume, seek, step and speed for every bridge of a replay at
//! once (`relay/replay`), and where in each bridge's stream each change lands.
//!
//! Until a bridge first changes it (or from the start with `--paused`) a replay is free: each
//! timeline plays on its own from its bridge's first subscribe, as it always did. From then on
//! it is controlled: one playhead, and every change is an entry of a log placed at the
//! playhead's frontier (the first frame no timeline has played yet). Each timeline applies the
//! entries in order, each once it has played every frame before the entry's place, and
//! announces it to its bridge on `relay/replay` there, in order with the events. So bridges that
//! play from the same place see the same events and notices in the same order, whatever their
//! pace: a timeline behind plays up to the change (at once) and then follows it. Timelines
//! claim frames under one lock, so no timeline plays past a pause placed meanwhile. A free
//! timeline that the first change finds elsewhere than the furthest one jumps to the playhead,
//! announced as a seek; a bridge that subscribes to a controlled replay starts at the playhead.
//!
//! This module holds no frames: seek targets are found through the store's indexes (the time
//! bisection, the channel index) and marks through one lazy pass ([`super::marks`]); storage
//! reads run on blocking threads, never under the lock.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use gabp_proto::ErrorCode;
use gabp_storage::{Direction, FrameRecord};
use parking_lot::Mutex;
use serde_json::{json, Map, Value};
use tokio::sync::{watch, OnceCell};
use tokio::time::Instant;

use super::marks::Marks;
use super::recorded::{ReplayPlan, MAX_SPEED, MIN_SPEED};
use super::Speed;

/// The method.
pub const METHOD: &str = crate::route::PLAYBACK;
/// Log entries kept for timelines behind the others; one further behind jumps to the playhead.
const LOG_MAX: usize = 4096;
/// Most events one `step` may play.
pub const MAX_STEP: u64 = 1_000_000;
/// Frames read before the one a time target bisects to: receive times of concurrent writers
/// interleave slightly, so events just at the target are not missed.
pub const TIME_SLACK: u64 = 1024;

/// A refused control: the error code and one line.
pub type Refused = (ErrorCode, String);

fn invalid(why: impl Into<String>) -> Refused {
    (ErrorCode::InvalidParams, why.into())
}

/// Where one pass over the replayed range reads and what it skips.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pass {
    /// The first frame read.
    pub read_from: u64,
    /// Events at frames before this are skipped (a mark or an event sought).
    pub first_frame: u64,
    /// Events before this offset (ns from the session's start) are skipped.
    pub from_ns: u64,
}

/// What a pass does with one recorded frame.
#[derive(Debug, PartialEq, Eq)]
pub enum Judged {
    /// Not played (not an event, before the start, a channel not replayed).
    Skip,
    /// An event played.
    Play,
    /// The replayed range ends here.
    End,
}

impl ReplayPlan {
    /// The pass from the replayed range's start.
    pub fn first_pass(&self) -> Pass {
        Pass {
            read_from: self.start_frame,
            first_frame: self.first_frame,
            from_ns: self.from_ns,
        }
    }

    /// What `pass` does with frame `no`: one rule for the timelines and for counting a step.
    pub fn judge(&self, pass: &Pass, no: u64, rec: &FrameRecord) -> Judged {
        if self.end_frame.is_some_and(|e| no >= e) {
            return Judged::End;
        }
        let (Some(channel), Some(_)) = (rec.channel, rec.relay_seq) else {
            return Judged::Skip;
        };
        if rec.dir != Direction::ModToRelay {
            return Judged::Skip;
        }
        let offset = self.offset(rec.time_ns);
        if self.to_ns.is_some_and(|t| offset >= t) {
            return Judged::End;
        }
        if no < pass.first_frame || offset < pass.from_ns || !self.plays(channel) {
            return Judged::Skip;
        }
        Judged::Play
    }

    /// `time_ns` as an offset from the session's start.
    pub fn offset(&self, time_ns: u64) -> u64 {
        time_ns.saturating_sub(self.meta.started_ns)
    }
}

/// How a timeline plays at one point of its stream.
#[derive(Debug, Clone)]
pub struct Mode {
    /// Held until a change.
    pub paused: bool,
    /// Stepping: frames before the first number play, then it pauses at the offset.
    pub until: Option<(u64, u64)>,
    /// The range was played to its end (no `--loop`): held until a seek.
    pub ended: bool,
    /// The pace.
    pub speed: Speed,
    /// The offset (ns from the session's start) that plays at `anchor_at`; where it is held
    /// while paused.
    pub anchor_ns: u64,
    /// See `anchor_ns`.
    pub anchor_at: Instant,
}

impl Mode {
    fn playing(speed: Speed, at_ns: u64, now: Instant) -> Mode {
        Mode {
            paused: false,
            until: None,
            ended: false,
            speed,
            anchor_ns: at_ns,
            anchor_at: now,
        }
    }

    /// When the event at `offset_ns` is due.
    pub fn due(&self, offset_ns: u64) -> Instant {
        match self.speed {
            Speed::Max => self.anchor_at,
            Speed::Factor(f) => {
                let ahead = offset_ns.saturating_sub(self.anchor_ns) as f64 / f;
                self.anchor_at + Duration::from_nanos(ahead as u64)
            }
        }
    }

    fn held(&self) -> bool {
        self.paused || self.ended
    }
}

/// A change placed in every controlled timeline's stream.
#[derive(Debug, Clone)]
struct Entry {
    /// Applies before the first event at or after this frame (`u64::MAX`: where the pass ends).
    at_frame: u64,
    /// The mode from here on.
    mode: Mode,
    /// A new pass (a seek, a `--loop` restart) from here on.
    pass: Option<Pass>,
    /// What the bridge is told.
    notice: Value,
}

/// Where a free timeline is, so the first change can find the furthest one.
#[derive(Debug, Clone)]
struct Seat {
    free: bool,
    loops: u64,
    pass: Pass,
    /// The first frame it has not played.
    frontier: u64,
    at_ns: u64,
    mode: Mode,
}

/// The playhead (see the module doc).
#[derive(Debug)]
struct Head {
    controlled: bool,
    pass: Pass,
    mode: Mode,
    /// The first frame of `pass` no controlled timeline has played.
    frontier: u64,
    /// The offset of the last event played (or sought).
    at_ns: u64,
    log: VecDeque<Entry>,
    /// The index of `log[0]`.
    base: u64,
    loops: u64,
    seats: HashMap<u32, Seat>,
    /// The free timeline whose place the playhead took: it goes on without a jump.
    source: Option<(u32, u64)>,
}

impl Head {
    fn end(&self) -> u64 {
        self.base + self.log.len() as u64
    }

    /// Where the playhead is (ns from the session's start).
    fn position(&self, now: Instant, end_ns: u64) -> u64 {
        let m = &self.mode;
        if m.ended {
            return end_ns.max(self.at_ns);
        }
        if m.paused {
            return m.anchor_ns;
        }
        match m.speed {
            Speed::Max => self.at_ns,
            Speed::Factor(f) => {
                let ran = now.saturating_duration_since(m.anchor_at).as_nanos() as f64 * f;
                let clock = m.anchor_ns.saturating_add(ran as u64);
                let mut at = clock.max(self.at_ns).min(end_ns.max(self.at_ns));
                if let Some((_, u)) = m.until {
                    at = at.min(u.max(self.at_ns));
                }
                at
            }
        }
    }

    /// Appends a change at the frontier (never before an earlier entry of the same pass).
    fn push(&mut self, mode: Mode, pass: Option<Pass>, notice: Value) {
        let floor = self
            .log
            .back()
            .filter(|e| e.pass.is_none())
            .map_or(0, |e| e.at_frame);
        self.log.push_back(Entry {
            at_frame: self.frontier.max(floor),
            mode: mode.clone(),
            pass,
            notice,
        });
        if let Some(p) = pass {
            self.pass = p;
            self.frontier = p.read_from;
        }
        self.mode = mode;
        while self.log.len() > LOG_MAX {
            self.log.pop_front();
            self.base += 1;
        }
    }
}

/// One timeline's copy of the playhead, as far as it has applied the log.
#[derive(Debug)]
pub struct Follow {
    conn: u32,
    /// The pass it reads.
    pub pass: Pass,
    /// How it plays.
    pub mode: Mode,
    free: bool,
    next: u64,
    loops: u64,
}

impl Follow {
    /// Whether it still plays on its own (the replay is not controlled yet).
    pub fn is_free(&self) -> bool {
        self.free
    }
}

/// What a timeline does next.
#[derive(Debug)]
pub enum Verdict {
    /// Play the first n upcoming events (claimed).
    Play(usize),
    /// Nothing is due before this.
    Wait(Instant),
    /// Held (paused, ended): wait for a change.
    Hold,
    /// Looping over a pass that gave this bridge nothing: wait for a subscribe or a change.
    Idle,
    /// Tell the bridge this, then go on.
    Notice(Value),
    /// Tell the bridge this, then read [`Follow::pass`] from its start; with `rebase` each
    /// channel's seq is the recorded one from here on.
    Jump {
        /// The notice.
        notice: Value,
        /// Seqs as recorded from here.
        rebase: bool,
    },
}

/// A parsed `relay/replay` request.
#[derive(Debug, Clone, PartialEq)]
enum Action {
    State,
    Pause,
    Resume,
    Speed(Speed),
    Seek(Target),
    Step(Step),
}

#[derive(Debug, Clone, PartialEq)]
enum Target {
    Ms(f64),
    Mark(String),
    Seq(String, u64),
}

#[derive(Debug, Clone, PartialEq)]
enum Step {
    Events(u64),
    Mark(String),
}

/// The offset `ns` as milliseconds, to the microsecond.
fn ms(ns: u64) -> Value {
    json!((ns / 1_000) as f64 / 1_000.0)
}

/// A speed as the answers and notices give it: a factor (whole ones as integers) or "max".
fn speed_json(s: Speed) -> Value {
    match s {
        Speed::Max => json!("max"),
        Speed::Factor(f) if f.fract() == 0.0 && f <= 1e6 => json!(f as u64),
        Speed::Factor(f) => json!(f),
    }
}

const ACTIONS: &str = "pause, resume, seek, step, speed or state";

impl Action {
    /// Reads `relay/replay`'s params: each action takes exactly its own fields.
    fn parse(params: &Value) -> Result<Action, Refused> {
        let Some(obj) = params.as_object() else {
            return Err(invalid(format!(
                "relay/replay needs params {{\"action\": ...}}: one of {ACTIONS}"
            )));
        };
        let action = obj
            .get("action")
            .and_then(Value::as_str)
            .ok_or_else(|| invalid(format!("relay/replay needs an action: one of {ACTIONS}")))?;
        let allowed: &[&str] = match action {
            "state" | "pause" | "resume" => &[],
            "speed" => &["speed"],
            "seek" => &["toMs", "toMark", "channel", "toSeq"],
            "step" => &["events", "toMark"],
            other => {
                return Err(invalid(format!(
                    "relay/replay has no action {:?}: one of {ACTIONS}",
                    gabp_rt::display::name(other)
                )))
            }
        };
        if let Some(k) = obj
            .keys()
            .find(|k| *k != "action" && !allowed.contains(&k.as_str()))
        {
            return Err(invalid(format!(
                "relay/replay {action} takes no {:?}{}",
                gabp_rt::display::name(k),
                if allowed.is_empty() {
                    String::new()
                } else {
                    format!(" (it takes {})", allowed.join(", "))
                }
            )));
        }
        let label = |v: &Value| -> Result<String, Refused> {
            v.as_str()
                .filter(|l| !l.is_empty() && l.len() <= gabp_proto::mark::MAX_MARK_LABEL)
                .map(String::from)
                .ok_or_else(|| {
                    invalid(format!(
                        "toMark must be a mark's label: a non-empty string of at most {} bytes",
                        gabp_proto::mark::MAX_MARK_LABEL
                    ))
                })
        };
        Ok(match action {
            "state" => Action::State,
            "pause" => Action::Pause,
            "resume" => Action::Resume,
            "speed" => {
                let bad = || {
                    invalid("speed must be a number from 0.001 to 1000000 (2 is twice as fast) or \"max\"")
                };
                match obj.get("speed") {
                    Some(Value::String(s)) if s == "max" => Action::Speed(Speed::Max),
                    Some(Value::Number(n)) => match n.as_f64() {
                        Some(f) if (MIN_SPEED..=MAX_SPEED).contains(&f) => {
                            Action::Speed(Speed::Factor(f))
                        }
                        _ => return Err(bad()),
                    },
                    _ => return Err(bad()),
                }
            }
            "seek" => {
                let target = match (obj.get("toMs"), obj.get("toMark"), obj.get("channel"), obj.get("toSeq")) {
                    (Some(ms), None, None, None) => match ms.as_f64() {
                        Some(m) if m >= 0.0 && m.is_finite() => Target::Ms(m),
                        _ => return Err(invalid("toMs must be a number of milliseconds from the session's start, 0 or more")),
                    },
                    (None, Some(l), None, None) => Target::Mark(label(l)?),
                    (None, None, Some(c), Some(s)) => {
                        let c = c.as_str().filter(|c| !c.is_empty()).ok_or_else(|| invalid("channel must be a channel's name"))?;
                        let s = s.as_u64().ok_or_else(|| invalid("toSeq must be a recorded seq: an integer, 0 or more"))?;
                        Target::Seq(c.to_string(), s)
                    }
                    _ => return Err(invalid("seek takes one target: toMs, toMark, or channel and toSeq")),
                };
                Action::Seek(target)
            }
            _ => {
                let step = match (obj.get("events"), obj.get("toMark")) {
                    (Some(n), None) => match n.as_u64() {
                        Some(n) if (1..=MAX_STEP).contains(&n) => Step::Events(n),
                        _ => {
                            return Err(invalid(format!(
                                "events must be an integer from 1 to {MAX_STEP}"
                            )))
                        }
                    },
                    (None, Some(l)) => Step::Mark(label(l)?),
                    _ => return Err(invalid("step takes events or toMark")),
                };
                Action::Step(step)
            }
        })
    }
}

/// A seek's destination.
#[derive(Debug, Clone, Copy)]
struct Dest {
    pass: Pass,
    to_ns: u64,
}

/// The replay's playhead and its log (see the module doc).
#[derive(Debug)]
pub struct Playback {
    plan: Arc<ReplayPlan>,
    head: Mutex<Head>,
    version: watch::Sender<u64>,
    marks: OnceCell<Result<Arc<Marks>, String>>,
    stop: Arc<AtomicBool>,
}

impl Playback {
    /// The playhead of `plan`: controlled (and paused) from the start with `--paused`.
    pub fn new(plan: Arc<ReplayPlan>, stop: Arc<AtomicBool>) -> Playback {
        let mut mode = Mode::playing(plan.speed, plan.start_ns, Instant::now());
        mode.paused = plan.paused;
        let pass = plan.first_pass();
        let head = Head {
            controlled: plan.paused,
            pass,
            mode,
            frontier: pass.read_from,
            at_ns: plan.start_ns,
            log: VecDeque::new(),
            base: 0,
            loops: 0,
            seats: HashMap::new(),
            source: None,
        };
        Playback {
            plan,
            head: Mutex::new(head),
            version: watch::channel(0).0,
            marks: OnceCell::new(),
            stop,
        }
    }

    /// Changes to the log, for a timeline waiting on one.
    pub fn watch(&self) -> watch::Receiver<u64> {
        self.version.subscribe()
    }

    fn bump(&self) {
        self.version.send_modify(|v| *v += 1);
    }

    /// A new timeline (a bridge's first subscribe): free, from the range's start, or at the
    /// playhead of a controlled replay.
    pub fn join(&self, conn: u32) -> Follow {
        let now = Instant::now();
        let mut h = self.head.lock();
        let follow = if h.controlled {
            if h.seats.is_empty() && !h.mode.held() {
                // Nobody played meanwhile: the clock starts again where the playhead stands,
                // rather than this bridge getting the time that passed in one burst.
                let at = h.position(now, self.plan.end_ns);
                h.mode.anchor_ns = at;
                h.mode.anchor_at = now;
            }
            Follow {
                conn,
                pass: Pass {
                    read_from: h.frontier,
                    first_frame: h.pass.first_frame.max(h.frontier),
                    from_ns: h.pass.from_ns,
                },
                mode: h.mode.clone(),
                free: false,
                next: h.end(),
                loops: h.loops,
            }
        } else {
            Follow {
                conn,
                pass: self.plan.first_pass(),
                mode: Mode::playing(self.plan.speed, self.plan.start_ns, now),
                free: true,
                next: 0,
                loops: 0,
            }
        };
        let at_ns = if follow.free {
            self.plan.start_ns
        } else {
            h.at_ns
        };
        h.seats.insert(
            conn,
            Seat {
                free: follow.free,
                loops: 0,
                pass: follow.pass,
                frontier: follow.pass.read_from,
                at_ns,
                mode: follow.mode.clone(),
            },
        );
        follow
    }

    /// A timeline ended (its bridge left).
    pub fn leave(&self, conn: u32) {
        let mut h = self.head.lock();
        h.seats.remove(&conn);
    }

    /// What `f`'s timeline does next, with `upcoming` the events it has read (frame, offset),
    /// empty once its pass is over. `idle`: nothing of the pass that just ended reached the
    /// bridge (a `--loop` then waits for a subscribe instead of spinning at `max`).
    pub fn decide(
        &self,
        f: &mut Follow,
        upcoming: impl Iterator<Item = (u64, u64)> + Clone,
        idle: bool,
    ) -> Verdict {
        let now = Instant::now();
        let mut h = self.head.lock();
        let first = upcoming.clone().next();
        let frame = first.map_or(u64::MAX, |e| e.0);
        if f.free {
            if !h.controlled {
                return self.free_step(&mut h, f, upcoming, idle, now);
            }
            if let Some(v) = self.join_playhead(&mut h, f) {
                return v;
            }
        }
        loop {
            if f.next < h.base {
                // So far behind that the log moved on: it goes to the playhead, as a seek.
                return self.to_playhead(&mut h, f);
            }
            let pending = h.log.get((f.next - h.base) as usize).cloned();
            // A step ends once its last event is played, before anything placed at or after
            // its end.
            if let Some((u, u_ns)) = f.mode.until {
                if frame >= u && pending.as_ref().is_none_or(|e| e.at_frame >= u) {
                    f.mode.until = None;
                    f.mode.paused = true;
                    f.mode.anchor_ns = u_ns;
                    f.mode.anchor_at = now;
                    if f.next == h.end() {
                        h.mode = f.mode.clone();
                        h.at_ns = h.at_ns.max(u_ns.min(self.plan.end_ns));
                    }
                    return Verdict::Notice(json!({"state": "paused", "atMs": ms(u_ns)}));
                }
            }
            if let Some(e) = pending.filter(|e| e.at_frame <= frame) {
                f.next += 1;
                f.mode = e.mode;
                return match e.pass {
                    Some(p) => {
                        f.pass = p;
                        Verdict::Jump {
                            notice: e.notice,
                            rebase: true,
                        }
                    }
                    None => Verdict::Notice(e.notice),
                };
            }
            if f.mode.held() {
                return Verdict::Hold;
            }
            if first.is_none() {
                // The pass is over and no change is pending: this timeline is the first to
                // get here, so it places the pass's end for all.
                if self.plan.looping && self.plan.events > 0 && idle {
                    return Verdict::Idle;
                }
                self.end_pass(&mut h, now);
                drop(h);
                self.bump();
                h = self.head.lock();
                continue;
            }
            let bound = f.mode.until.map_or(u64::MAX, |u| u.0).min(
                h.log
                    .get((f.next - h.base) as usize)
                    .map_or(u64::MAX, |e| e.at_frame),
            );
            let mut n = 0;
            let mut last = (0, 0);
            for (fr, off) in upcoming {
                if fr >= bound {
                    break;
                }
                let due = f.mode.due(off);
                if due > now {
                    if n == 0 {
                        return Verdict::Wait(due);
                    }
                    break;
                }
                n += 1;
                last = (fr, off);
            }
            if n == 0 {
                // Unreachable: an event at the bound is handled above.
                return Verdict::Hold;
            }
            if f.next == h.end() {
                h.frontier = h.frontier.max(last.0 + 1);
                h.at_ns = h.at_ns.max(last.1);
            }
            return Verdict::Play(n);
        }
    }

    /// A free timeline's next step: its own pace, its own passes.
    fn free_step(
        &self,
        h: &mut Head,
        f: &mut Follow,
        upcoming: impl Iterator<Item = (u64, u64)> + Clone,
        idle: bool,
        now: Instant,
    ) -> Verdict {
        if f.mode.ended {
            return Verdict::Hold;
        }
        let plan = &self.plan;
        let seat = h.seats.get_mut(&f.conn);
        if upcoming.clone().next().is_none() {
            let session = plan.meta.id.to_string();
            if plan.looping && plan.events > 0 {
                if idle {
                    return Verdict::Idle;
                }
                f.loops += 1;
                f.pass = plan.first_pass();
                f.mode = Mode::playing(f.mode.speed, plan.start_ns, now);
                if let Some(s) = seat {
                    s.loops = f.loops;
                    s.pass = f.pass;
                    s.frontier = f.pass.read_from;
                    s.at_ns = plan.start_ns;
                    s.mode = f.mode.clone();
                }
                return Verdict::Jump {
                    notice: json!({"state": "restarted", "sessionId": session, "loop": f.loops}),
                    rebase: false,
                };
            }
            f.mode.ended = true;
            if let Some(s) = seat {
                s.mode.ended = true;
            }
            return Verdict::Notice(json!({"state": "ended", "sessionId": session}));
        }
        let mut n = 0;
        let mut last = (0, 0);
        for (fr, off) in upcoming {
            let due = f.mode.due(off);
            if due > now {
                if n == 0 {
                    return Verdict::Wait(due);
                }
                break;
            }
            n += 1;
            last = (fr, off);
        }
        if let Some(s) = seat {
            s.frontier = s.frontier.max(last.0 + 1);
            s.at_ns = s.at_ns.max(last.1);
        }
        Verdict::Play(n)
    }

    /// A free timeline in a replay that has just become controlled: the one whose place the
    /// playhead took goes on from there (`None`); any other jumps to the playhead.
    fn join_playhead(&self, h: &mut Head, f: &mut Follow) -> Option<Verdict> {
        f.free = false;
        if let Some(s) = h.seats.get_mut(&f.conn) {
            s.free = false;
        }
        match h.source {
            Some((conn, first_entry)) if conn == f.conn => {
                f.next = first_entry;
                None
            }
            _ => Some(self.to_playhead(h, f)),
        }
    }

    /// Puts `f` at the playhead: a jump announced as a seek (or as the end, if the replay
    /// ended: then nothing is read until the next seek).
    fn to_playhead(&self, h: &mut Head, f: &mut Follow) -> Verdict {
        let now = Instant::now();
        let from = h.seats.get(&f.conn).map_or(self.plan.start_ns, |s| s.at_ns);
        f.next = h.end();
        f.mode = h.mode.clone();
        f.pass = Pass {
            read_from: h.frontier,
            first_frame: h.pass.first_frame.max(h.frontier),
            from_ns: h.pass.from_ns,
        };
        if h.mode.ended {
            return Verdict::Jump {
                notice: json!({"state": "ended", "sessionId": self.plan.meta.id.to_string()}),
                rebase: true,
            };
        }
        let to = h.position(now, self.plan.end_ns);
        Verdict::Jump {
            notice: json!({"state": "seeked", "fromMs": ms(from), "toMs": ms(to)}),
            rebase: true,
        }
    }

    /// Places the pass's end: a restart with `--loop`, else the end.
    fn end_pass(&self, h: &mut Head, now: Instant) {
        let plan = &self.plan;
        let session = plan.meta.id.to_string();
        if plan.looping && plan.events > 0 {
            h.loops += 1;
            let pass = plan.first_pass();
            let mut mode = Mode::playing(h.mode.speed, plan.start_ns, now);
            mode.paused = h.mode.paused;
            let notice = json!({"state": "restarted", "sessionId": session, "loop": h.loops});
            h.frontier = u64::MAX;
            h.push(mode, Some(pass), notice);
            h.at_ns = plan.start_ns;
        } else {
            let mut mode = h.mode.clone();
            mode.ended = true;
            h.frontier = u64::MAX;
            h.push(mode, None, json!({"state": "ended", "sessionId": session}));
        }
    }

    /// Makes the replay controlled, at the place of its furthest free timeline (or the
    /// range's start when none plays yet).
    fn take_control(&self, h: &mut Head) {
        if h.controlled {
            return;
        }
        h.controlled = true;
        let furthest = h
            .seats
            .iter()
            .filter(|(_, s)| s.free)
            .max_by_key(|(_, s)| (s.loops, s.frontier))
            .map(|(c, s)| (*c, s.clone()));
        if let Some((conn, s)) = furthest {
            h.pass = s.pass;
            h.frontier = s.frontier;
            h.at_ns = s.at_ns;
            h.mode = s.mode;
            h.loops = s.loops;
            h.source = Some((conn, h.end()));
        } else {
            h.mode.anchor_at = Instant::now();
        }
    }

    /// Answers `relay/replay` (see the module doc): the state after the change.
    pub async fn control(&self, params: &Value) -> Result<Value, Refused> {
        let action = Action::parse(params)?;
        match action {
            Action::State => Ok(self.state()),
            Action::Pause => Ok(self.change(|h, now, at| {
                if h.mode.held() {
                    return None;
                }
                let mut mode = h.mode.clone();
                mode.paused = true;
                mode.until = None;
                mode.anchor_ns = at;
                mode.anchor_at = now;
                Some((mode, None, json!({"state": "paused", "atMs": ms(at)})))
            })),
            Action::Resume => Ok(self.change(|h, now, at| {
                if h.mode.ended || (!h.mode.paused && h.mode.until.is_none()) {
                    return None;
                }
                let mode = Mode::playing(h.mode.speed, at, now);
                let notice =
                    json!({"state": "resumed", "atMs": ms(at), "speed": speed_json(mode.speed)});
                Some((mode, None, notice))
            })),
            Action::Speed(s) => Ok(self.change(|h, now, at| {
                if h.mode.speed == s {
                    return None;
                }
                let mut mode = h.mode.clone();
                mode.speed = s;
                if !mode.held() {
                    mode.anchor_ns = at;
                    mode.anchor_at = now;
                }
                Some((
                    mode,
                    None,
                    json!({"state": "speed", "atMs": ms(at), "speed": speed_json(s)}),
                ))
            })),
            Action::Seek(target) => {
                let dest = self.destination(target).await?;
                Ok(self.change(|h, now, at| {
                    // A seek keeps the replay paused (a step in progress ends paused); an
                    // ended replay plays again from the place sought.
                    let mut mode = Mode::playing(h.mode.speed, dest.to_ns, now);
                    mode.paused = h.mode.paused || h.mode.until.is_some();
                    let notice =
                        json!({"state": "seeked", "fromMs": ms(at), "toMs": ms(dest.to_ns)});
                    Some((mode, Some(dest), notice))
                }))
            }
            Action::Step(step) => self.step(step).await,
        }
    }

    /// Applies one change under the lock (`make` gets the head, now and the position; `None`:
    /// nothing changes), wakes the timelines, and answers the state.
    fn change(
        &self,
        make: impl FnOnce(&Head, Instant, u64) -> Option<(Mode, Option<Dest>, Value)>,
    ) -> Value {
        let now = Instant::now();
        let mut h = self.head.lock();
        self.take_control(&mut h);
        let at = h.position(now, self.plan.end_ns);
        if let Some((mode, dest, notice)) = make(&h, now, at) {
            h.push(mode, dest.map(|d| d.pass), notice);
            if let Some(d) = dest {
                h.at_ns = d.to_ns;
            }
            drop(h);
            self.bump();
            h = self.head.lock();
        }
        self.state_of(&h, now)
    }

    /// The state, as every answer gives it.
    pub fn state(&self) -> Value {
        let h = self.head.lock();
        self.state_of(&h, Instant::now())
    }

    fn state_of(&self, h: &Head, now: Instant) -> Value {
        let plan = &self.plan;
        let mut out = Map::new();
        let (state, at, speed) = if h.controlled {
            let state = if h.mode.ended {
                "ended"
            } else if h.mode.paused {
                "paused"
            } else {
                "playing"
            };
            (state, h.position(now, plan.end_ns), h.mode.speed)
        } else {
            // Free: each timeline on its own; the furthest one stands for the replay.
            let free = h.seats.values().filter(|s| s.free);
            let furthest = free.max_by_key(|s| (s.loops, s.frontier));
            let ended = !h.seats.is_empty() && h.seats.values().all(|s| s.mode.ended);
            let at = furthest.map_or(plan.start_ns, |s| s.at_ns);
            (if ended { "ended" } else { "playing" }, at, plan.speed)
        };
        out.insert("state".into(), json!(state));
        out.insert("atMs".into(), ms(at));
        out.insert("speed".into(), speed_json(speed));
        if let (true, Some((_, u))) = (h.controlled && !h.mode.held(), h.mode.until) {
            out.insert("untilMs".into(), ms(u.min(plan.end_ns)));
        }
        out.insert("startMs".into(), ms(plan.start_ns));
        out.insert("endMs".into(), ms(plan.end_ns));
        out.insert("controlled".into(), json!(h.controlled));
        out.insert("timelines".into(), json!(h.seats.len()));
        out.insert("sessionId".into(), json!(plan.meta.id.to_string()));
        Value::Object(out)
    }

    /// The session's marks, read once on first use.
    async fn marks(&self) -> Result<Arc<Marks>, Refused> {
        let built = self
            .marks
            .get_or_init(|| async {
                let (plan, stop) = (self.plan.clone(), self.stop.clone());
                let t = std::time::Instant::now();
                let read = tokio::task::spawn_blocking(move || {
                    Marks::build(&plan.store, plan.meta.id, &stop)
                })
                .await;
                match read {
                    Ok(Ok(m)) => {
                        tracing::info!(session = %self.plan.meta.id, marks = m.len(), secs = t.elapsed().as_secs_f64(), "recorded marks read");
                        Ok(Arc::new(m))
                    }
                    Ok(Err(e)) => Err(e.to_string()),
                    Err(e) => Err(e.to_string()),
                }
            })
            .await;
        built.clone().map_err(|why| {
            (
                ErrorCode::InternalError,
                format!("the recording's marks cannot be read: {why}"),
            )
        })
    }

    /// Whether the offset `ns` lies in the replayed range, else the refusal naming `what`.
    fn in_range(&self, what: &str, frame: Option<u64>, ns: u64) -> Result<(), Refused> {
        let plan = &self.plan;
        let before = ns < plan.start_ns || frame.is_some_and(|f| f < plan.first_frame);
        let after =
            ns > plan.end_ns || frame.is_some_and(|f| plan.end_frame.is_some_and(|e| f >= e));
        if before || after {
            return Err(invalid(format!(
                "{what} (at {} ms) is outside the replayed range, {} to {} ms",
                ms(ns),
                ms(plan.start_ns),
                ms(plan.end_ns)
            )));
        }
        Ok(())
    }

    /// Where a seek goes: found through the store's indexes (or the marks), off the async
    /// workers.
    async fn destination(&self, target: Target) -> Result<Dest, Refused> {
        let plan = self.plan.clone();
        match target {
            Target::Ms(m) => {
                let ns = (m * 1e6) as u64;
                self.in_range(&format!("toMs {m}"), None, ns)?;
                let frame = blocking(move || {
                    plan.store
                        .frame_at_time(plan.meta.id, plan.meta.started_ns.saturating_add(ns))
                })
                .await?;
                let p = &self.plan;
                Ok(Dest {
                    pass: Pass {
                        read_from: frame.saturating_sub(TIME_SLACK).max(p.start_frame),
                        first_frame: p.first_frame,
                        from_ns: ns.max(p.from_ns),
                    },
                    to_ns: ns,
                })
            }
            Target::Mark(label) => {
                let marks = self.marks().await?;
                let m = marks.first(&label, 0).ok_or_else(|| {
                    invalid(format!(
                        "session {} has no mark labelled {:?}",
                        plan.meta.id,
                        gabp_rt::display::name(&label)
                    ))
                })?;
                let ns = plan.offset(m.time_ns);
                self.in_range(
                    &format!("mark {:?}", gabp_rt::display::name(&label)),
                    Some(m.frame),
                    ns,
                )?;
                Ok(Dest {
                    pass: Pass {
                        read_from: m.frame,
                        first_frame: m.frame.max(plan.first_frame),
                        from_ns: plan.from_ns,
                    },
                    to_ns: ns,
                })
            }
            Target::Seq(channel, seq) => {
                let Some(id) = plan.names.iter().position(|n| **n == *channel) else {
                    return Err(invalid(format!(
                        "session {} has no channel {:?}",
                        plan.meta.id,
                        gabp_rt::display::name(&channel)
                    )));
                };
                if !plan.plays(id as u32) {
                    return Err(invalid(format!(
                        "channel {:?} is not replayed (--channel)",
                        gabp_rt::display::name(&channel)
                    )));
                }
                let p = plan.clone();
                let found = blocking(move || {
                    p.store
                        .channel_frames(p.meta.id, id as u32, seq)?
                        .next()
                        .transpose()
                })
                .await?;
                let Some((frame, rec)) = found else {
                    return Err(invalid(format!(
                        "channel {:?} has no seq {seq} in this recording",
                        gabp_rt::display::name(&channel)
                    )));
                };
                let ns = plan.offset(rec.time_ns);
                self.in_range(
                    &format!("seq {seq} of {:?}", gabp_rt::display::name(&channel)),
                    Some(frame),
                    ns,
                )?;
                Ok(Dest {
                    pass: Pass {
                        read_from: frame,
                        first_frame: frame.max(plan.first_frame),
                        from_ns: plan.from_ns,
                    },
                    to_ns: ns,
                })
            }
        }
    }

    /// `step`: plays `events` more events (counted over every replayed channel, so every bridge
    /// stops at the same place) or up to a mark, then pauses.
    async fn step(&self, step: Step) -> Result<Value, Refused> {
        // Counted from a snapshot of the playhead; a seek meanwhile means counting again.
        for _ in 0..3 {
            let (pass, frontier, ended) = {
                let h = self.head.lock();
                playhead_now(&h, &self.plan)
            };
            if ended {
                return Err(invalid("the replay has ended: seek back before stepping"));
            }
            let until = match &step {
                Step::Events(n) => {
                    let (plan, n) = (self.plan.clone(), *n);
                    blocking(move || nth_event(&plan, &pass, frontier, n)).await?
                }
                Step::Mark(label) => {
                    let marks = self.marks().await?;
                    let m = marks.first(label, frontier).ok_or_else(|| {
                        invalid(format!(
                            "no mark labelled {:?} after the replay's position",
                            gabp_rt::display::name(label)
                        ))
                    })?;
                    let ns = self.plan.offset(m.time_ns);
                    self.in_range(
                        &format!("the next mark {:?}", gabp_rt::display::name(label)),
                        Some(m.frame),
                        ns,
                    )?;
                    (m.frame, ns)
                }
            };
            let mut applied = false;
            let answer = self.change(|h, now, at| {
                if h.pass != pass {
                    return None;
                }
                applied = true;
                let mut mode = Mode::playing(h.mode.speed, at, now);
                mode.until = Some(until);
                let mut notice = json!({"state": "stepping", "atMs": ms(at), "untilMs": ms(until.1.min(self.plan.end_ns))});
                match &step {
                    Step::Events(n) => notice["events"] = json!(n),
                    Step::Mark(l) => notice["toMark"] = json!(l),
                }
                Some((mode, None, notice))
            });
            if applied {
                return Ok(answer);
            }
        }
        Err((
            ErrorCode::OutcomeUnknown,
            "the replay kept seeking while the step was counted; step again".into(),
        ))
    }
}

/// The playhead's pass, frontier and whether it ended, as [`Playback::take_control`] would
/// make them (a failed step must not take control).
fn playhead_now(h: &Head, plan: &ReplayPlan) -> (Pass, u64, bool) {
    if h.controlled {
        return (h.pass, h.frontier, h.mode.ended);
    }
    h.seats
        .values()
        .filter(|s| s.free)
        .max_by_key(|s| (s.loops, s.frontier))
        .map_or((plan.first_pass(), plan.start_frame, false), |s| {
            (s.pass, s.frontier, s.mode.ended)
        })
}

/// Where `n` more events from `frontier` end in `pass`: the frame after the nth, and its
/// offset; the range's end if it comes first.
fn nth_event(
    plan: &ReplayPlan,
    pass: &Pass,
    frontier: u64,
    n: u64,
) -> Result<(u64, u64), gabp_storage::StoreError> {
    let mut left = n;
    for item in plan
        .store
        .frames_from(plan.meta.id, frontier.max(pass.read_from))
    {
        let (no, rec) = item?;
        match plan.judge(pass, no, &rec) {
            Judged::Skip => {}
            Judged::End => break,
            Judged::Play => {
                left -= 1;
                if left == 0 {
                    return Ok((no + 1, plan.offset(rec.time_ns)));
                }
            }
        }
    }
    Ok((u64::MAX, plan.end_ns))
}

/// Runs a storage read on a blocking thread.
async fn blocking<T: Send + 'static>(
    read: impl FnOnce() -> Result<T, gabp_storage::StoreError> + Send + 'static,
) -> Result<T, Refused> {
    match tokio::task::spawn_blocking(read).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err((
            ErrorCode::InternalError,
            format!("the recording cannot be read: {}", e.detail()),
        )),
        Err(_) => Err((
            ErrorCode::InternalError,
            "the recording cannot be read".into(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(v: Value) -> Result<Action, String> {
        Action::parse(&v).map_err(|(code, why)| {
            assert_eq!(code, ErrorCode::InvalidParams);
            assert_eq!(why.lines().count(), 1, "{why}");
            why
        })
    }

    #[test]
    fn each_action_takes_exactly_its_own_fields() {
        assert_eq!(parse(json!({"action": "pause"})), Ok(Action::Pause));
        assert_eq!(
            parse(json!({"action": "speed", "speed": "max"})),
            Ok(Action::Speed(Speed::Max))
        );
        assert_eq!(
            parse(json!({"action": "speed", "speed": 2.5})),
            Ok(Action::Speed(Speed::Factor(2.5)))
        );
        assert_eq!(
            parse(json!({"action": "seek", "toMs": 1500})),
            Ok(Action::Seek(Target::Ms(1500.0)))
        );
        assert_eq!(
            parse(json!({"action": "seek", "channel": "c", "toSeq": 7})),
            Ok(Action::Seek(Target::Seq("c".into(), 7)))
        );
        assert_eq!(
            parse(json!({"action": "step", "toMark": "goal"})),
            Ok(Action::Step(Step::Mark("goal".into())))
        );
        for bad in [
            json!(null),
            json!([]),
            json!({}),
            json!({"action": "rewind"}),
            json!({"action": "pause", "toMs": 3}),
            json!({"action": "speed", "speed": 0}),
            json!({"action": "speed", "speed": -1}),
            json!({"action": "speed", "speed": "fast"}),
            json!({"action": "seek"}),
            json!({"action": "seek", "toMs": -1}),
            json!({"action": "seek", "toMs": 1, "toMark": "x"}),
            json!({"action": "seek", "channel": "c"}),
            json!({"action": "seek", "channel": "c", "toSeq": -2}),
            json!({"action": "seek", "toMark": ""}),
            json!({"action": "step"}),
            json!({"action": "step", "events": 0}),
            json!({"action": "step", "events": MAX_STEP + 1}),
            json!({"action": "step", "events": 1.5}),
        ] {
            assert!(parse(bad.clone()).is_err(), "{bad}");
        }
    }

    #[test]
    fn pacing_follows_the_anchor() {
        let now = Instant::now();
        let m = Mode::playing(Speed::Factor(2.0), 1_000_000_000, now);
        assert_eq!(m.due(3_000_000_000), now + Duration::from_secs(1));
        assert_eq!(m.due(0), now, "behind the anchor: due at once");
        let max = Mode::playing(Speed::Max, 0, now);
        assert_eq!(max.due(u64::MAX), now);
    }
}
