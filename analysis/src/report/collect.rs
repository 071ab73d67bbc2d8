//! One streaming pass over a session's frames into fixed-size time buckets: events per channel,
//! calls, errors, dropped events and gaps per bucket, a latency histogram per method, the marks
//! with their data, the episodes they cut (`crate::export::episode`, the rule the export and the listing share) with what happened in each,
//! and per bridge its role (from the welcome the relay recorded) and the relay's error answers
//! to it. Memory is bounded whatever the session's length: [`BUCKETS`] counters per channel (at
//! most the relay's channel cap), [`MAX_METHODS`] histograms, [`MAX_MARKS`] marks,
//! [`MAX_EPISODES`] episodes, [`MAX_BRIDGES`] bridges and [`MAX_OPEN`] requests awaiting their
//! answer; no frame is kept.

use std::collections::HashMap;

use gabp_proto::{ErrorCode, Mode, MsgType, Parser};
use gabp_rt::display::strip;
use gabp_storage::{Direction, SessionMeta, Store, StoreError};
use hdrhistogram::Histogram;

pub use crate::calls::{latency_at, MAX_METHODS, MAX_OPEN, OTHER_METHODS};
use crate::calls::{new_latency, take_answered};
use crate::export::episode::{EpisodeMarks, Tracker};

/// Time buckets across the session.
pub const BUCKETS: usize = 120;
/// Marks kept with their labels; later ones are only counted.
pub const MAX_MARKS: usize = 1000;
/// Episodes kept with their figures; later ones are only counted.
pub const MAX_EPISODES: usize = 1000;
/// Bridges whose role and refusals are followed (the catalog's first ones: the page lists as
/// many).
pub const MAX_BRIDGES: usize = 200;

/// One channel's events.
#[derive(Debug, Clone)]
pub struct ChannelLine {
    /// The channel's name.
    pub name: String,
    /// Events from the mod.
    pub events: u64,
    /// Events per bucket.
    pub per_bucket: Vec<u32>,
    /// Events the mod numbered but never sent (gaps in its seq).
    pub mod_seq_gaps: u64,
    last_mod_seq: Option<u64>,
}

/// One method's calls.
#[derive(Debug, Clone)]
pub struct MethodCalls {
    /// The method.
    pub name: String,
    /// Requests forwarded to the mod.
    pub calls: u64,
    /// Error answers.
    pub errors: u64,
    /// Requests without an answer in the session.
    pub unanswered: u64,
    /// Latency in nanoseconds, request to answer.
    pub latency: Histogram<u64>,
    /// The longest latency, exact (the histogram's is its bucket's upper end).
    pub max_ns: u64,
}

/// A mark on the timeline.
#[derive(Debug, Clone)]
pub struct Mark {
    /// Offset from the session's start, in nanoseconds.
    pub offset_ns: u64,
    /// The bridge connection that marked.
    pub conn: u32,
    /// Its label.
    pub label: String,
    /// Its data as the bridge wrote it (JSON text), if it gave any.
    pub data: Option<String>,
}

/// One episode: from its start mark to its end mark (or the session's end, without one).
#[derive(Debug, Clone, Default)]
pub struct Episode {
    /// Its number in the session, from 1.
    pub index: u64,
    /// Its start mark's offset from the session's start, in nanoseconds.
    pub start_ns: u64,
    /// Its end mark's offset; `None` when it had none (the session ended, or a start mark
    /// came first).
    pub end_ns: Option<u64>,
    /// The start mark's data (JSON text).
    pub start_data: Option<String>,
    /// The end mark's data (JSON text).
    pub end_data: Option<String>,
    /// Events from the mod within it.
    pub events: u64,
    /// Requests forwarded to the mod within it.
    pub calls: u64,
    /// Error answers from the mod within it.
    pub errors: u64,
}

/// What the recording says of one bridge beyond the catalog.
#[derive(Debug, Clone, Default)]
pub struct BridgeSeen {
    /// Its connection number.
    pub conn: u32,
    /// Its identity's role, from the welcome the relay answered its hello with.
    pub role: Option<String>,
    /// The relay's own error answers to it, (code, count) in order of first use: refused
    /// (forbidden, over its rate, a lease held by another) or failed (mod gone, timed out).
    pub refused: Vec<(i64, u64)>,
}

/// What one pass gathered.
#[derive(Debug, Clone)]
pub struct Collected {
    /// Width of a bucket in nanoseconds.
    pub bucket_ns: u64,
    /// Buckets covering the session (at most [`BUCKETS`]).
    pub buckets: usize,
    /// Frames read.
    pub frames: u64,
    /// Per channel (by channel id).
    pub channels: Vec<ChannelLine>,
    /// Per method, in order of first call.
    pub methods: Vec<MethodCalls>,
    /// Requests forwarded per bucket.
    pub calls: Vec<u64>,
    /// Error answers per bucket.
    pub errors: Vec<u64>,
    /// Events dropped for slow bridges per bucket (from the `relay/dropped` notices).
    pub dropped: Vec<u64>,
    /// Events missing from the mod's seq per bucket.
    pub mod_seq_gaps: Vec<u64>,
    /// Frames lost to recording errors per bucket.
    pub lost: Vec<u64>,
    /// Marks, in time order (the first [`MAX_MARKS`]).
    pub marks: Vec<Mark>,
    /// Every mark, also those past [`MAX_MARKS`].
    pub marks_total: u64,
    /// Answers whose request was not tracked (past [`MAX_OPEN`] awaiting at once).
    pub untracked: u64,
    /// Episodes, in order (the first [`MAX_EPISODES`]).
    pub episodes: Vec<Episode>,
    /// Every episode started, also those past [`MAX_EPISODES`].
    pub episodes_total: u64,
    /// Of them, those without an end mark.
    pub episodes_unfinished: u64,
    /// The first [`MAX_BRIDGES`] bridges of the catalog, in its order.
    pub bridges: Vec<BridgeSeen>,
}

impl Collected {
    /// What the recording says of bridge `conn`, if it is one of those followed.
    pub fn bridge(&self, conn: u32) -> Option<&BridgeSeen> {
        self.bridges.iter().find(|b| b.conn == conn)
    }

    /// Error answers from the mod.
    pub fn errors_total(&self) -> u64 {
        self.errors.iter().sum()
    }

    /// Requests forwarded to the mod.
    pub fn calls_total(&self) -> u64 {
        self.calls.iter().sum()
    }
}

/// The role in a welcome the relay wrote (`capabilities.extensions.relay.bridge.role` of its
/// result), as text fit for a table.
fn welcome_role(body: &[u8]) -> Option<String> {
    let mut v = body;
    for key in [
        "result",
        "capabilities",
        "extensions",
        "relay",
        "bridge",
        "role",
    ] {
        v = v.get(gabp_proto::scan::member_value(v, key)?)?;
    }
    let role: String = serde_json::from_slice(v).ok()?;
    Some(strip(&role, false).chars().take(32).collect())
}

/// A mark's data: the `data` member of its params as the bridge wrote it.
fn mark_data(body: &[u8], params: Option<std::ops::Range<usize>>) -> Option<String> {
    let p = body.get(params?)?;
    let d = p.get(gabp_proto::scan::member_value(p, "data")?)?;
    std::str::from_utf8(d).ok().map(String::from)
}

/// A JSON value's field as text, from a span of `body`.
fn field(
    body: &[u8],
    span: Option<std::ops::Range<usize>>,
    key: &str,
) -> Option<serde_json::Value> {
    let v: serde_json::Value = serde_json::from_slice(body.get(span?)?).ok()?;
    v.get(key).cloned()
}

/// Reads the session once; episodes are cut at marks labelled as `labels` say.
pub fn collect(
    store: &Store,
    meta: &SessionMeta,
    labels: &EpisodeMarks,
) -> Result<Collected, StoreError> {
    let meta = &*store.with_details(meta)?;
    let duration = meta.duration_ns().max(1);
    let bucket_ns = duration.div_ceil(BUCKETS as u64).max(1);
    let buckets = (duration.div_ceil(bucket_ns) as usize).clamp(1, BUCKETS);
    let at = |t: u64| ((t.saturating_sub(meta.started_ns) / bucket_ns) as usize).min(buckets - 1);
    let mut c = Collected {
        bucket_ns,
        buckets,
        frames: 0,
        channels: Vec::new(),
        methods: Vec::new(),
        calls: vec![0; buckets],
        errors: vec![0; buckets],
        dropped: vec![0; buckets],
        mod_seq_gaps: vec![0; buckets],
        lost: vec![0; buckets],
        marks: Vec::new(),
        marks_total: 0,
        untracked: 0,
        episodes: Vec::new(),
        episodes_total: 0,
        episodes_unfinished: 0,
        bridges: meta
            .bridges
            .iter()
            .take(MAX_BRIDGES)
            .map(|b| BridgeSeen {
                conn: b.conn,
                ..BridgeSeen::default()
            })
            .collect(),
    };
    let bridge_ix: HashMap<u32, usize> = c
        .bridges
        .iter()
        .enumerate()
        .map(|(i, b)| (b.conn, i))
        .collect();
    let mut cutter = Tracker::new(labels.clone());
    // The episode in progress, counted as frames pass.
    let mut episode: Option<Episode> = None;
    let channel_cap = gabp_storage::catalog::MAX_CHANNELS.max(meta.channels.len());
    let mut method_ix: HashMap<String, usize> = HashMap::new();
    let mut open: HashMap<String, (usize, u64, u32)> = HashMap::new();
    let mut gaps = store.gaps(meta.id)?.into_iter().peekable();
    let mut parser = Parser::new();
    let mut strict = Parser::new();
    for item in store.frames(meta.id) {
        let (n, rec) = item?;
        c.frames += 1;
        let b = at(rec.time_ns);
        while let Some(g) = gaps.next_if(|g| g.frame <= n) {
            c.lost[b] += g.frames;
        }
        let Ok(view) = parser.parse(&rec.body, Mode::Tolerant) else {
            continue;
        };
        match (rec.dir, view.kind) {
            (Direction::ModToRelay, MsgType::Event) => {
                let Some(id) = rec
                    .channel
                    .map(|id| id as usize)
                    .filter(|&id| id < channel_cap)
                else {
                    continue;
                };
                if c.channels.len() <= id {
                    c.channels.resize_with(id + 1, || ChannelLine {
                        name: String::new(),
                        events: 0,
                        per_bucket: Vec::new(),
                        mod_seq_gaps: 0,
                        last_mod_seq: None,
                    });
                }
                let ch = &mut c.channels[id];
                if ch.per_bucket.is_empty() {
                    ch.per_bucket = vec![0; buckets];
                    ch.name = meta
                        .channels
                        .get(id)
                        .cloned()
                        .unwrap_or_else(|| view.channel.as_deref().unwrap_or("?").to_string());
                }
                ch.events += 1;
                if let Some(e) = episode.as_mut() {
                    e.events += 1;
                }
                ch.per_bucket[b] = ch.per_bucket[b].saturating_add(1);
                if let Some(s) = rec.mod_seq {
                    if let Some(prev) = ch.last_mod_seq {
                        if s > prev + 1 {
                            ch.mod_seq_gaps += s - prev - 1;
                            c.mod_seq_gaps[b] += s - prev - 1;
                        }
                    }
                    ch.last_mod_seq = Some(s);
                }
            }
            (Direction::RelayToMod, MsgType::Request) => {
                let name = view.method.as_deref().unwrap_or("?");
                let ix = match method_ix.get(name) {
                    Some(&ix) => ix,
                    None => {
                        let key = if c.methods.len() < MAX_METHODS {
                            name
                        } else {
                            OTHER_METHODS
                        };
                        let ix = *method_ix.entry(key.to_string()).or_insert_with(|| {
                            c.methods.push(MethodCalls {
                                name: key.to_string(),
                                calls: 0,
                                errors: 0,
                                unanswered: 0,
                                latency: new_latency(),
                                max_ns: 0,
                            });
                            c.methods.len() - 1
                        });
                        ix
                    }
                };
                c.methods[ix].calls += 1;
                c.calls[b] += 1;
                if let Some(e) = episode.as_mut() {
                    e.calls += 1;
                }
                if let Some(id) = view.id.as_deref() {
                    if open.len() < MAX_OPEN {
                        open.insert(id.to_string(), (ix, rec.time_ns, rec.conn));
                    } else {
                        c.methods[ix].unanswered += 1;
                    }
                }
            }
            (Direction::ModToRelay, MsgType::Response) => {
                // A late answer (after the caller's -32001) is not the call's answer: see stats.
                let Some((ix, sent, _)) = view
                    .id
                    .as_deref()
                    .and_then(|id| take_answered(&mut open, id, rec.conn))
                else {
                    c.untracked += 1;
                    continue;
                };
                let m = &mut c.methods[ix];
                if view.is_error() {
                    m.errors += 1;
                    c.errors[b] += 1;
                    if let Some(e) = episode.as_mut() {
                        e.errors += 1;
                    }
                }
                let took = rec.time_ns.saturating_sub(sent).max(1);
                m.latency.saturating_record(took);
                m.max_ns = m.max_ns.max(took);
            }
            (Direction::RelayToBridge, MsgType::Event)
                if view.channel.as_deref() == Some("relay/dropped") =>
            {
                let count = field(&rec.body, view.payload.clone(), "count")
                    .and_then(|v| v.as_u64())
                    .unwrap_or(1);
                c.dropped[b] += count;
            }
            (Direction::RelayToBridge, MsgType::Response) => {
                let Some(seen) = bridge_ix.get(&rec.conn).map(|&i| &mut c.bridges[i]) else {
                    continue;
                };
                match view.error_code {
                    Some(code) => {
                        match seen.refused.iter().position(|r| r.0 == code) {
                            Some(i) => seen.refused[i].1 += 1,
                            // The relay uses a handful of codes; the list stays small anyway.
                            None if seen.refused.len() < 32 => seen.refused.push((code, 1)),
                            None => {}
                        }
                    }
                    None if seen.role.is_none() => seen.role = welcome_role(&rec.body),
                    None => {}
                }
            }
            (Direction::BridgeToRelay, MsgType::Request)
                if view.method.as_deref() == Some("relay/mark") =>
            {
                // A mark the relay refused (a bad frame, no valid label) is not on the timeline.
                let Some(label) = gabp_proto::mark::accepted_mark(&mut strict, &rec.body) else {
                    continue;
                };
                let offset_ns = rec.time_ns.saturating_sub(meta.started_ns);
                let data = mark_data(&rec.body, view.params.clone());
                let step = cutter.step(Some(&label));
                if step.begins {
                    if step.cut {
                        if let Some(e) = episode.take() {
                            c.finish(e);
                        }
                    }
                    c.episodes_total += 1;
                    episode = Some(Episode {
                        index: step.episode.unwrap_or_default(),
                        start_ns: offset_ns,
                        start_data: data.clone(),
                        ..Episode::default()
                    });
                } else if step.ends {
                    if let Some(mut e) = episode.take() {
                        e.end_ns = Some(offset_ns);
                        e.end_data = data.clone();
                        c.finish(e);
                    }
                }
                c.marks_total += 1;
                if c.marks.len() < MAX_MARKS {
                    c.marks.push(Mark {
                        offset_ns,
                        conn: rec.conn,
                        label,
                        data,
                    });
                }
            }
            _ => {}
        }
    }
    for g in gaps {
        c.lost[buckets - 1] += g.frames;
    }
    for (ix, ..) in open.into_values() {
        c.methods[ix].unanswered += 1;
    }
    if let Some(e) = episode.take() {
        c.finish(e);
    }
    // The recording keeps a bridge's first refusals only, and none over its rate: the counts
    // it left with hold them all.
    for b in &meta.bridges {
        let Some(seen) = bridge_ix.get(&b.conn).map(|&i| &mut c.bridges[i]) else {
            continue;
        };
        for (code, left_with) in [
            (ErrorCode::Forbidden, b.denied),
            (ErrorCode::LeaseHeld, b.lease_refused),
            (ErrorCode::SlowDown, b.rate_limited),
        ] {
            let code = code.code();
            match seen.refused.iter_mut().find(|r| r.0 == code) {
                Some(r) => r.1 = r.1.max(left_with),
                None if left_with > 0 => seen.refused.push((code, left_with)),
                None => {}
            }
        }
    }
    Ok(c)
}

impl Collected {
    /// An episode over: kept if there is room, counted as unfinished without its end mark.
    fn finish(&mut self, e: Episode) {
        if e.end_ns.is_none() {
            self.episodes_unfinished += 1;
        }
        if self.episodes.len() < MAX_EPISODES {
            self.episodes.push(e);
        }
    }
}
