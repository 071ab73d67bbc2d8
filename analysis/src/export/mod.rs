//! `gabp-relay export`: recorded sessions as analysis data, streamed in constant memory.
//!
//! This module owns what a frame becomes in every format: [`Row`] (its number, times,
//! direction, bridge, kind, method, id, channel, seqs, error code and payload), which frames
//! are exported ([`ExportFilter`]: channels, offsets, or the span between two marks), and the
//! atomic file write. The formats are [`jsonl`] (one frame per line) and [`parquet`] (one row
//! per frame, columns, a Hive-partitioned directory for many sessions); both write this row.
//!
//! A mark is a bridge's `relay/mark {label, data?}` request: recorded as a frame like any
//! other, exported with kind `mark`, its label and data. Marks make episodes ([`episode`]):
//! every row carries the episode it belongs to, found in the same walk that exports it.

mod atomic;
pub mod episode;
pub mod jsonl;
pub mod mcap;
pub mod parquet;

use std::borrow::Cow;
use std::time::Duration;

use gabp_proto::mark::{accepted_mark, MARK};
use gabp_proto::{Mode, MsgType, Parser};
use gabp_storage::{Direction, FrameRecord, SessionMeta, Store, StoreError};

pub use atomic::{is_link_to_a_directory, write_atomically};
pub use episode::{EpisodeMarks, Tracker};
pub use jsonl::{export, export_sessions, export_to_file};

/// Which frames to export.
#[derive(Debug, Clone, Default)]
pub struct ExportFilter {
    /// Only events on these channels (all frames when empty).
    pub channels: Vec<String>,
    /// Only frames at or after this offset from the session start.
    pub from: Option<Duration>,
    /// Only frames before this offset.
    pub to: Option<Duration>,
    /// From the first mark with this label (inclusive).
    pub from_mark: Option<String>,
    /// To the next mark with this label after the start (inclusive).
    pub to_mark: Option<String>,
    /// Only the frames of this episode (numbered from 1).
    pub episode: Option<u64>,
    /// The marks that start and end an episode.
    pub episode_marks: EpisodeMarks,
    /// With [`ExportFilter::episode`]: a session without that episode is left out (no rows)
    /// instead of failing the export, as a selection does.
    pub skip_without_episode: bool,
}

/// What a frame is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A method call.
    Request,
    /// An answer.
    Response,
    /// A message on a channel.
    Event,
    /// A bridge's `relay/mark`.
    Mark,
    /// Not a GABP message (a frame that did not parse).
    Other,
}

impl Kind {
    /// The exported name.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Request => "request",
            Kind::Response => "response",
            Kind::Event => "event",
            Kind::Mark => "mark",
            Kind::Other => "other",
        }
    }
}

/// One exported frame, borrowed from its record.
#[derive(Debug)]
pub struct Row<'a> {
    /// The frame number in the session.
    pub frame: u64,
    /// The record.
    pub rec: &'a FrameRecord,
    /// The channel's name, for events.
    pub channel: Option<&'a str>,
    /// The bridge's name (its `bridgeVersion`), for a bridge's frames.
    pub bridge: Option<&'a str>,
    /// The bridge's configured identity name (`BridgeInfo.name`), when it has one.
    pub bridge_name: Option<&'a str>,
    /// What the frame is.
    pub kind: Kind,
    /// A request's method.
    pub method: Option<Cow<'a, str>>,
    /// The message id.
    pub id: Option<Cow<'a, str>>,
    /// An error response's code.
    pub error_code: Option<i64>,
    /// The params, result, error or payload, as JSON text.
    pub payload: Option<Cow<'a, str>>,
    /// A mark's label.
    pub label: Option<String>,
    /// A mark's data (JSON text).
    pub data: Option<String>,
    /// The episode the frame belongs to (numbered from 1), if any.
    pub episode: Option<u64>,
}

/// Classifies frames; keeps one parser for the whole export.
#[derive(Default)]
pub struct Classifier {
    parser: Parser,
    /// For the strict second look at marks.
    strict: Parser,
}

impl Classifier {
    /// The row of frame `n` of the session `meta`.
    pub fn row<'a>(&mut self, meta: &'a SessionMeta, n: u64, rec: &'a FrameRecord) -> Row<'a> {
        let channel = rec
            .channel
            .and_then(|c| meta.channels.get(c as usize))
            .map(String::as_str);
        let info = (rec.conn != 0)
            .then(|| meta.bridges.iter().find(|b| b.conn == rec.conn))
            .flatten();
        let mut row = Row {
            frame: n,
            rec,
            channel,
            bridge: info.map(|b| b.bridge_version.as_str()),
            bridge_name: info.and_then(|b| b.name.as_deref()),
            kind: Kind::Other,
            method: None,
            id: None,
            error_code: None,
            payload: None,
            label: None,
            data: None,
            episode: None,
        };
        let body = &rec.body[..];
        let Ok(view) = self.parser.parse(body, Mode::Tolerant) else {
            return row;
        };
        let text = |r: Option<std::ops::Range<usize>>| {
            r.and_then(|r| std::str::from_utf8(&body[r]).ok())
                .map(Cow::Borrowed)
        };
        row.id = view.id;
        row.error_code = view.error_code;
        match view.kind {
            MsgType::Request => {
                row.kind = Kind::Request;
                row.payload = text(view.params.clone());
                let label = (rec.dir == Direction::BridgeToRelay
                    && view.method.as_deref() == Some(MARK))
                .then(|| accepted_mark(&mut self.strict, body))
                .flatten();
                // A refused mark (a bad frame, or no valid label) stays a request.
                if let Some(label) = label {
                    row.kind = Kind::Mark;
                    row.label = Some(label);
                    // As the bridge wrote it: numbers of any size stay exact.
                    row.data = row.payload.as_deref().and_then(|p| {
                        let span = gabp_proto::scan::member_value(p.as_bytes(), "data")?;
                        Some(p[span].to_string())
                    });
                }
                row.method = view.method;
            }
            MsgType::Response => {
                row.kind = Kind::Response;
                row.payload = match view.error_code {
                    // The error object has no span in the view; errors are rare, so scan.
                    Some(_) => text(gabp_proto::scan::member_value(body, "error")),
                    None => text(view.result.clone()),
                };
            }
            MsgType::Event => {
                row.kind = Kind::Event;
                row.payload = text(view.payload.clone());
            }
        }
        row
    }
}

/// Whether `meta` has what `filter` cuts at: every `--channel` and the marks (an extra pass
/// over the session when marks are asked for). A selection skips the sessions that fail this
/// with a note instead of failing the whole export.
pub fn check(store: &Store, meta: &SessionMeta, filter: &ExportFilter) -> Result<(), ExportError> {
    let meta = &*store.with_details(meta)?;
    if let Some(c) = filter.channels.iter().find(|c| !meta.channels.contains(c)) {
        return Err(ExportError::UnknownChannel(c.clone()));
    }
    mark_span(store, meta, filter).map(|_| ())
}

/// Calls `each` with every exported row of one session, in frame order; returns how many.
/// Every row carries its episode, found in this same walk: the walk looks at every bridge
/// frame for marks, exported or not, so episodes are numbered alike whatever is cut.
pub fn for_each_row(
    store: &Store,
    meta: &SessionMeta,
    filter: &ExportFilter,
    mut each: impl FnMut(&Row<'_>) -> Result<(), ExportError>,
) -> Result<u64, ExportError> {
    let ids: Vec<u32> = filter
        .channels
        .iter()
        .map(|c| {
            meta.channels
                .iter()
                .position(|n| n == c)
                .map(|i| i as u32)
                .ok_or_else(|| ExportError::UnknownChannel(c.clone()))
        })
        .collect::<Result<_, _>>()?;
    let from_ns = filter.from.map(|d| meta.started_ns + d.as_nanos() as u64);
    let to_ns = filter.to.map(|d| meta.started_ns + d.as_nanos() as u64);
    let span = mark_span(store, meta, filter)?;
    let mut classifier = Classifier::default();
    let mut rows = 0;
    let (frames, mut tracker, last) = match span {
        Some(s) => (store.frames_from(meta.id, s.first), s.tracker, s.last),
        None => (
            store.frames(meta.id),
            Tracker::new(filter.episode_marks.clone()),
            u64::MAX,
        ),
    };
    let mut in_episode = false;
    for item in frames {
        let (n, rec) = item?;
        if n > last {
            break;
        }
        // Only a bridge's requests can be marks: the rest are classified only if exported.
        let bridge_row =
            (rec.dir == Direction::BridgeToRelay).then(|| classifier.row(meta, n, &rec));
        let label = bridge_row
            .as_ref()
            .filter(|r| r.kind == Kind::Mark)
            .and_then(|r| r.label.as_deref());
        let episode = tracker.step(label).episode;
        if let Some(want) = filter.episode {
            if episode == Some(want) {
                in_episode = true;
            } else if in_episode {
                break;
            } else {
                continue;
            }
        }
        if !ids.is_empty() && !rec.channel.is_some_and(|c| ids.contains(&c)) {
            continue;
        }
        if from_ns.is_some_and(|f| rec.time_ns < f) {
            continue;
        }
        if to_ns.is_some_and(|t| rec.time_ns >= t) {
            break;
        }
        let mut row = match bridge_row {
            Some(r) => r,
            None => classifier.row(meta, n, &rec),
        };
        row.episode = episode;
        each(&row)?;
        rows += 1;
    }
    match filter.episode {
        Some(want) if !in_episode => Err(ExportError::NoEpisode {
            session: meta.id.to_string(),
            episode: want,
            episodes: tracker.begun(),
        }),
        _ => Ok(rows),
    }
}

/// The first mark the relay accepted labelled `label` at or after frame `from`: its frame
/// number and time (ns since the Unix epoch). One pass from `from` that parses only bridge
/// frames and stops at the mark; `replay --from-mark` and `--to-mark` start and end there.
pub fn find_mark(
    store: &Store,
    meta: &SessionMeta,
    label: &str,
    from: u64,
) -> Result<Option<(u64, u64)>, StoreError> {
    let mut classifier = Classifier::default();
    for item in store.frames_from(meta.id, from) {
        let (n, rec) = item?;
        if rec.dir != Direction::BridgeToRelay {
            continue;
        }
        let row = classifier.row(meta, n, &rec);
        if row.kind == Kind::Mark && row.label.as_deref() == Some(label) {
            return Ok(Some((n, rec.time_ns)));
        }
    }
    Ok(None)
}

/// Where an export between two marks starts and ends, and the episodes as they stood just
/// before its first frame (so the rows after it are numbered as in a whole-session export).
struct Span {
    first: u64,
    last: u64,
    tracker: Tracker,
}

/// The frame numbers of the first mark labelled `from_mark` and the next one labelled
/// `to_mark` after it, when the filter asks for a span between marks.
fn mark_span(
    store: &Store,
    meta: &SessionMeta,
    filter: &ExportFilter,
) -> Result<Option<Span>, ExportError> {
    if filter.from_mark.is_none() && filter.to_mark.is_none() {
        return Ok(None);
    }
    let mut classifier = Classifier::default();
    let mut tracker = Tracker::new(filter.episode_marks.clone());
    let mut first: Option<(u64, Tracker)> = None;
    for item in store.frames(meta.id) {
        let (n, rec) = item?;
        // Only a bridge's requests can be marks: skip the rest without parsing.
        if rec.dir != Direction::BridgeToRelay {
            continue;
        }
        let row = classifier.row(meta, n, &rec);
        if row.kind != Kind::Mark {
            continue;
        }
        let label = row.label.as_deref();
        match &first {
            None if filter.from_mark.is_none() || label == filter.from_mark.as_deref() => {
                if filter.to_mark.is_none() {
                    return Ok(Some(Span {
                        first: n,
                        last: u64::MAX,
                        tracker,
                    }));
                }
                first = Some((n, tracker.clone()));
            }
            Some((f, at_first)) if label == filter.to_mark.as_deref() => {
                return Ok(Some(Span {
                    first: *f,
                    last: n,
                    tracker: at_first.clone(),
                }))
            }
            _ => {}
        }
        // Only marks move episodes: the state before the start mark is all the walk needs.
        tracker.step(label);
    }
    let missing = match first {
        None => filter.from_mark.clone().unwrap_or_default(),
        Some(_) => filter.to_mark.clone().unwrap_or_default(),
    };
    Err(ExportError::NoMark {
        session: meta.id.to_string(),
        label: missing,
        after: first.is_some(),
    })
}

/// Whether writing to `output` could touch the data dir `data`: it is that dir, lies inside
/// it, or is a directory holding it (which `--force` would replace). Paths are compared
/// resolved, with `output`'s own last component taken as it is (a symlink there is replaced,
/// not followed).
pub fn overlaps_data_dir(output: &std::path::Path, data: &std::path::Path) -> bool {
    let resolve = |p: &std::path::Path| {
        std::fs::canonicalize(p)
            .or_else(|_| std::path::absolute(p))
            .unwrap_or_else(|_| p.to_path_buf())
    };
    let data = resolve(data);
    let is_dir = std::fs::symlink_metadata(output).is_ok_and(|m| m.is_dir());
    let at = match (output.file_name(), is_dir) {
        (Some(name), false) => {
            let parent = match output.parent() {
                Some(p) if !p.as_os_str().is_empty() => p,
                _ => std::path::Path::new("."),
            };
            resolve(parent).join(name)
        }
        _ => resolve(output),
    };
    at.starts_with(&data) || data.starts_with(&at)
}

/// Whether `-o PATH` means standard output (`-`, as for most command-line tools).
pub fn is_stdout(path: &std::path::Path) -> bool {
    path.as_os_str() == "-"
}

impl ExportError {
    /// What the session lacks that the filter cuts at (a channel or a mark), when that is why
    /// the export failed.
    pub fn missing_in_session(&self) -> Option<String> {
        match self {
            ExportError::UnknownChannel(c) => Some(format!("it has no channel {c:?}")),
            ExportError::NoMark { label, after, .. } => Some(format!(
                "it has no mark labelled {label:?}{}",
                if *after { " after the start mark" } else { "" }
            )),
            ExportError::NoEpisode {
                episode, episodes, ..
            } => Some(format!(
                "it has no episode {episode} ({episodes} episode{})",
                if *episodes == 1 { "" } else { "s" }
            )),
            _ => None,
        }
    }
}

/// Why an export failed.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// Reading the store failed.
    #[error("{0}")]
    Store(#[from] StoreError),
    /// Writing the output failed.
    #[error("writing output: {0}")]
    Io(#[from] std::io::Error),
    /// The Parquet encoder failed (not an I/O error: those are [`ExportError::Io`]).
    #[error("writing parquet: {0}")]
    Parquet(String),
    /// A `--channel` the session never saw.
    #[error("the session has no channel {0:?}")]
    UnknownChannel(String),
    /// A `--from-mark` or `--to-mark` label the session does not have (where it was looked for).
    #[error("session {session} has no mark labelled {label:?}{}", if *after { " after the start mark" } else { "" })]
    NoMark {
        /// The session.
        session: String,
        /// The label.
        label: String,
        /// Whether it was looked for after the start mark.
        after: bool,
    },
    /// An `--episode` the session does not have.
    #[error("session {session} has no episode {episode} (it has {episodes})")]
    NoEpisode {
        /// The session.
        session: String,
        /// The episode asked for.
        episode: u64,
        /// How many episodes it has.
        episodes: u64,
    },
    /// The MCAP writer failed (not an I/O error: those are [`ExportError::Io`]).
    #[error("writing mcap: {0}")]
    Mcap(String),
}
