//! `gabp-relay episodes`: a session's episodes as rows (when each started and ended, its marks'
//! data, frames and events per channel), found by the export's rule ([`crate::export::episode`])
//! in one pass that parses only bridge frames.
//!
//! Episodes are handed over one by one as each ends, so memory holds one open episode (its
//! counts per channel, at most the catalog's channel bound) whatever the session's length or
//! its number of marks. This module reads; printing is the command's.

use std::collections::BTreeMap;

use gabp_storage::{Direction, SessionMeta, Store, StoreError};
use serde::Serialize;

use crate::export::{Classifier, EpisodeMarks, Kind, Tracker};

/// How an episode ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum EndedBy {
    /// Its end mark.
    Mark,
    /// The next start mark, with no end mark before it.
    NextStart,
    /// The session's end, with no end mark (the last episode, still open).
    SessionEnd,
}

impl EndedBy {
    /// As the table shows it.
    pub fn as_str(self) -> &'static str {
        match self {
            EndedBy::Mark => "mark",
            EndedBy::NextStart => "next-start",
            EndedBy::SessionEnd => "session-end",
        }
    }
}

/// One episode of one session.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Episode {
    /// The session.
    pub session: String,
    /// Its route.
    pub route: String,
    /// The episode's number in the session, from 1 (the export's `episode`).
    pub episode: u64,
    /// The start mark's time (ns since the Unix epoch).
    pub start_ns: u64,
    /// The end mark's time; without one, the next start mark's or the session's end.
    pub end_ns: u64,
    /// The start as RFC 3339 (UTC, to the second).
    pub start_at: String,
    /// Milliseconds from the session's start to the episode's.
    pub offset_ms: f64,
    /// `end_ns - start_ns`, in seconds.
    pub duration_s: f64,
    /// Whether it has no end mark (ended by the next start or the session's end).
    pub open: bool,
    /// What ended it.
    pub ended_by: EndedBy,
    /// The start mark's frame number.
    pub first_frame: u64,
    /// Its last frame's number (the end mark's, when it has one).
    pub last_frame: u64,
    /// Frames in it, both marks included.
    pub frames: u64,
    /// Events from the mod in it.
    pub events: u64,
    /// Events per channel (only channels that had one).
    pub channels: BTreeMap<String, u64>,
    /// The session's tags.
    pub tags: BTreeMap<String, String>,
    /// The start mark's data as the bridge wrote it (JSON text; numbers of any size exact).
    #[serde(skip)]
    pub start_data: Option<String>,
    /// The end mark's data, likewise.
    #[serde(skip)]
    pub end_data: Option<String>,
}

impl Episode {
    /// One JSON object on one line (camelCase keys), `startData` and `endData` spliced in as
    /// the bridge wrote them (a parsed number would lose digits no double holds).
    pub fn to_json_line(&self) -> String {
        let mut s = serde_json::to_string(self).expect("serializable");
        s.pop(); // reopen the object
        for (key, data) in [("startData", &self.start_data), ("endData", &self.end_data)] {
            s.push_str(&format!(",\"{key}\":"));
            match data {
                // Valid JSON (the mark was parsed strictly), so a raw CR or LF in it is
                // whitespace between tokens, never inside a string.
                Some(d) => s.push_str(&d.replace(['\n', '\r'], " ")),
                None => s.push_str("null"),
            }
        }
        s.push('}');
        s
    }
}

/// An episode being read.
struct Open {
    episode: u64,
    start_ns: u64,
    first_frame: u64,
    last_frame: u64,
    frames: u64,
    events: u64,
    per_channel: BTreeMap<u32, u64>,
    start_data: Option<String>,
}

/// Calls `each` with every episode of `meta`, in order, as each ends; returns how many.
pub fn for_each_episode<E: From<StoreError>>(
    store: &Store,
    meta: &SessionMeta,
    marks: &EpisodeMarks,
    mut each: impl FnMut(&Episode) -> Result<(), E>,
) -> Result<u64, E> {
    let meta = &*store.with_details(meta)?;
    let mut classifier = Classifier::default();
    let mut tracker = Tracker::new(marks.clone());
    let mut open: Option<Open> = None;
    let mut count = 0;
    let mut close = |o: Open, end_ns: u64, ended_by: EndedBy, end_data: Option<String>| {
        count += 1;
        each(&finish(meta, o, end_ns, ended_by, end_data))
    };
    for item in store.frames(meta.id) {
        let (n, rec) = item?;
        let mark = match rec.dir {
            // Only a bridge's requests can be marks: nothing else is parsed.
            Direction::BridgeToRelay => {
                let row = classifier.row(meta, n, &rec);
                (row.kind == Kind::Mark).then(|| (row.label.unwrap_or_default(), row.data))
            }
            _ => None,
        };
        let step = tracker.step(mark.as_ref().map(|m| m.0.as_str()));
        if step.cut {
            if let Some(o) = open.take() {
                close(o, rec.time_ns, EndedBy::NextStart, None)?;
            }
        }
        let Some(episode) = step.episode else {
            continue;
        };
        let data = mark.and_then(|m| m.1);
        let o = open.get_or_insert_with(|| Open {
            episode,
            start_ns: rec.time_ns,
            first_frame: n,
            last_frame: n,
            frames: 0,
            events: 0,
            per_channel: BTreeMap::new(),
            start_data: if step.begins { data.clone() } else { None },
        });
        o.frames += 1;
        o.last_frame = n;
        if let Some(c) = rec.channel {
            o.events += 1;
            *o.per_channel.entry(c).or_default() += 1;
        }
        if step.ends {
            let o = open.take().expect("just filled");
            close(o, rec.time_ns, EndedBy::Mark, data)?;
        }
    }
    if let Some(o) = open.take() {
        let end = meta.ended_ns.unwrap_or(meta.last_ns).max(o.start_ns);
        close(o, end, EndedBy::SessionEnd, None)?;
    }
    Ok(count)
}

fn finish(
    meta: &SessionMeta,
    o: Open,
    end_ns: u64,
    ended_by: EndedBy,
    end_data: Option<String>,
) -> Episode {
    let channels = o
        .per_channel
        .into_iter()
        .map(|(c, n)| {
            let name = meta
                .channels
                .get(c as usize)
                .cloned()
                .unwrap_or_else(|| "?".into());
            (name, n)
        })
        .collect();
    Episode {
        session: meta.id.to_string(),
        route: meta.route.clone(),
        episode: o.episode,
        start_ns: o.start_ns,
        end_ns,
        start_at: gabp_rt::display::utc(o.start_ns),
        offset_ms: o.start_ns.saturating_sub(meta.started_ns) as f64 / 1e6,
        duration_s: end_ns.saturating_sub(o.start_ns) as f64 / 1e9,
        open: ended_by != EndedBy::Mark,
        ended_by,
        first_frame: o.first_frame,
        last_frame: o.last_frame,
        frames: o.frames,
        events: o.events,
        channels,
        tags: meta.tags.clone(),
        start_data: o.start_data,
        end_data,
    }
}
