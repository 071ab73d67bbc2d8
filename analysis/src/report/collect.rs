//! One streaming pass over a session's frames into fixed-size time buckets: events per channel,
//! calls, errors, dropped events and gaps per bucket, a latency histogram per method, and the
//! marks. Memory is bounded whatever the session's length: [`BUCKETS`] counters per channel (at
//! most the relay's channel cap), [`MAX_METHODS`] histograms, [`MAX_MARKS`] marks and
//! [`MAX_OPEN`] requests awaiting their answer; no frame is kept.

use std::collections::HashMap;

use gabp_proto::{Mode, MsgType, Parser};
use gabp_storage::{Direction, SessionMeta, Store, StoreError};
use hdrhistogram::Histogram;

pub use crate::calls::{latency_at, MAX_METHODS, MAX_OPEN, OTHER_METHODS};
use crate::calls::{new_latency, take_answered};

/// Time buckets across the session.
pub const BUCKETS: usize = 120;
/// Marks kept with their labels; later ones are only counted.
pub const MAX_MARKS: usize = 1000;

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

/// Reads the session once.
pub fn collect(store: &Store, meta: &SessionMeta) -> Result<Collected, StoreError> {
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
    };
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
            (Direction::BridgeToRelay, MsgType::Request)
                if view.method.as_deref() == Some("relay/mark") =>
            {
                // A mark the relay refused (a bad frame, no valid label) is not on the timeline.
                let Some(label) = gabp_proto::mark::accepted_mark(&mut strict, &rec.body) else {
                    continue;
                };
                c.marks_total += 1;
                if c.marks.len() < MAX_MARKS {
                    c.marks.push(Mark {
                        offset_ns: rec.time_ns.saturating_sub(meta.started_ns),
                        conn: rec.conn,
                        label,
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
    Ok(c)
}
