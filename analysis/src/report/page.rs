//! The session report's page from what [`super::collect`] gathered: the summary, the charts
//! (events per second per channel, call latency percentiles of the methods with enough calls,
//! calls with errors, drops and gaps over time; marks drawn on both timelines) and the tables
//! beside them (channels, methods, bridges with their identity, role and refusals, episodes,
//! marks with their data). The table cells the selection's page shares are here too.

use gabp_report::chart::{self, CURVE_QUANTILES};
use gabp_report::{ChartError, Page, Series, TimeMark};
use gabp_storage::SessionMeta;

use crate::export::episode::EpisodeMarks;

use super::collect::{latency_at, BridgeSeen, Collected, Episode, MAX_BRIDGES};

/// Lines drawn per chart; the rest of the channels are summed into one line.
pub(super) const MAX_LINES: usize = 8;

/// Answered calls a method needs for its latency percentile curve: fewer give a curve drawn
/// through a handful of points, whose tail means nothing (the table still lists them).
pub const MIN_CURVE_CALLS: u64 = 20;

/// Characters of a mark's data shown in a table cell.
const DATA_CHARS: usize = 160;

pub(super) fn secs(ns: u64) -> f64 {
    ns as f64 / 1e9
}

/// A mark's data for a table cell: the JSON as written, cut to [`DATA_CHARS`].
pub(super) fn data_cell(data: Option<&str>) -> String {
    match data {
        None => "-".into(),
        Some(d) if d.chars().count() > DATA_CHARS => {
            d.chars().take(DATA_CHARS - 1).chain(['…']).collect()
        }
        Some(d) => d.to_string(),
    }
}

/// A session's tags as one cell.
fn tags_cell(meta: &SessionMeta) -> String {
    if meta.tags.is_empty() {
        return "none".into();
    }
    meta.tags
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// An episode's duration, `-` without an end mark.
pub(super) fn episode_duration(e: &Episode) -> String {
    match e.end_ns {
        Some(end) => format!("{:.3}", secs(end.saturating_sub(e.start_ns))),
        None => "- (no end mark)".into(),
    }
}

/// How episodes were cut, said under their table.
pub(super) fn episodes_note(labels: &EpisodeMarks) -> String {
    format!(
        "An episode runs from a mark labelled {:?} to the next mark labelled {:?} (another start first leaves it without an end); set the labels with --episode-marks.",
        labels.start, labels.end
    )
}

/// What the relay's error code says, for a bridge's refusals.
fn code_name(code: i64) -> String {
    use gabp_proto::ErrorCode as E;
    let name = match E::from_code(code) {
        Some(E::Forbidden) => "forbidden",
        Some(E::SlowDown) => "over its rate",
        Some(E::LeaseHeld) => "lease held by another",
        Some(E::LimitExceeded) => "over a limit",
        Some(E::OutcomeUnknown) => "outcome unknown",
        Some(E::ModUnavailable) => "mod unavailable",
        Some(E::TooLarge) => "too large",
        Some(E::InvalidRequest) => "invalid request",
        Some(E::MethodNotFound) => "no such method",
        Some(E::InvalidParams) => "invalid params",
        Some(E::InternalError) => "internal error",
        Some(E::NoRecordedResponse) => "no recorded answer",
        Some(E::ShuttingDown) => "shutting down",
        Some(E::BadToken) => "bad token",
        Some(E::NoSession) => "before its hello",
        _ => "other",
    };
    format!("{name} ({code})")
}

/// A bridge's refusals as one cell: `3 forbidden (-32006), 1 lease held by another (-32008)`.
fn refusals_cell(seen: Option<&BridgeSeen>) -> String {
    match seen {
        None => "-".into(),
        Some(b) if b.refused.is_empty() => "0".into(),
        Some(b) => b
            .refused
            .iter()
            .map(|&(code, n)| format!("{n} {}", code_name(code)))
            .collect::<Vec<_>>()
            .join(", "),
    }
}

fn ms(ns: u64) -> String {
    format!("{:.3}", ns as f64 / 1e6)
}

/// A per-bucket count as a rate per second, at each bucket's start.
fn rate(c: &Collected, counts: impl Iterator<Item = u64>) -> Vec<(f64, f64)> {
    let w = secs(c.bucket_ns);
    counts
        .enumerate()
        .map(|(i, n)| (i as f64 * w, n as f64 / w))
        .collect()
}

fn time_marks(c: &Collected) -> Vec<TimeMark> {
    c.marks
        .iter()
        .map(|m| TimeMark {
            x: secs(m.offset_ns),
            label: m.label.clone(),
        })
        .collect()
}

/// Bridges listed in the page's table (as many as the pass follows).
const BRIDGE_ROWS: usize = MAX_BRIDGES;

/// Who a bridge is: its identity, its own label (or its software) and its connection.
fn bridge_name(meta: &SessionMeta, conn: u32) -> String {
    meta.bridges
        .iter()
        .find(|b| b.conn == conn)
        .map(|b| {
            let identity = b
                .name
                .as_deref()
                .unwrap_or(gabp_storage::catalog::DEFAULT_IDENTITY);
            let what = b.label.as_deref().unwrap_or(&b.bridge_version);
            format!("{identity}: {what} (conn {conn})")
        })
        .unwrap_or_else(|| format!("conn {conn}"))
}

/// The whole page; `labels` are the marks that cut the episodes `c` holds.
pub fn render(
    meta: &SessionMeta,
    c: &Collected,
    labels: &EpisodeMarks,
) -> Result<String, ChartError> {
    let mut p = Page::new(&format!("Session {}", meta.id));
    let app = match (&meta.app_name, &meta.app_version) {
        (Some(n), Some(v)) => format!("{n} {v}"),
        (Some(n), None) => n.clone(),
        _ => "unknown".into(),
    };
    let dropped: u64 = meta.bridges.iter().map(|b| b.dropped).sum();
    let gaps: u64 = c.channels.iter().map(|ch| ch.mod_seq_gaps).sum();
    p.heading("Summary").summary(&[
        ("app", app),
        ("route", meta.route.clone()),
        ("tags", tags_cell(meta)),
        ("session", meta.id.to_string()),
        ("duration", format!("{:.3} s", secs(meta.duration_ns()))),
        ("bridges", meta.bridges.len().to_string()),
        ("ended", meta.end_label().to_string()),
        ("frames", meta.frames.to_string()),
        ("recorded size", gabp_rt::display::bytes(meta.bytes)),
        ("events", meta.events.to_string()),
        ("events dropped for slow bridges", dropped.to_string()),
        ("gaps in the mod's seq (events)", gaps.to_string()),
        (
            "frames lost to recording errors",
            meta.lost_frames.to_string(),
        ),
        ("anomalies", meta.anomalies.to_string()),
        ("marks", c.marks_total.to_string()),
        (
            "episodes",
            match c.episodes_unfinished {
                0 => c.episodes_total.to_string(),
                n => format!("{} ({n} without an end mark)", c.episodes_total),
            },
        ),
        ("relay", meta.relay_version.clone()),
    ]);
    let marks = time_marks(c);

    // Events per second per channel: the busiest lines, the rest summed.
    let mut chans: Vec<_> = c.channels.iter().filter(|ch| ch.events > 0).collect();
    chans.sort_by(|a, b| b.events.cmp(&a.events).then(a.name.cmp(&b.name)));
    let mut lines: Vec<Series> = chans
        .iter()
        .take(MAX_LINES)
        .map(|ch| Series {
            name: ch.name.clone(),
            points: rate(c, ch.per_bucket.iter().map(|&n| n as u64)),
        })
        .collect();
    if chans.len() > MAX_LINES {
        let rest = &chans[MAX_LINES..];
        lines.push(Series {
            name: format!("{} other channels", rest.len()),
            points: rate(
                c,
                (0..c.buckets).map(|i| rest.iter().map(|ch| ch.per_bucket[i] as u64).sum()),
            ),
        });
    }
    p.heading("Events per second per channel").chart(
        "events",
        "Events from the mod per second, per channel; dashed lines are marks (hover one for its whole label).",
        &chart::lines("time (s)", "events/s", &lines, &marks)?,
    );
    let rows: Vec<Vec<String>> = chans
        .iter()
        .map(|ch| {
            vec![
                ch.name.clone(),
                ch.events.to_string(),
                format!(
                    "{:.1}",
                    ch.events as f64 / secs(meta.duration_ns()).max(1e-9)
                ),
                ch.mod_seq_gaps.to_string(),
            ]
        })
        .collect();
    p.table(
        &["channel~", "events#", "events/s#", "mod seq gaps#"],
        &rows,
    );

    // Tool-call latency per method.
    let mut methods: Vec<_> = c.methods.iter().collect();
    methods.sort_by(|a, b| b.calls.cmp(&a.calls).then(a.name.cmp(&b.name)));
    let curves: Vec<Series> = methods
        .iter()
        .filter(|m| m.latency.len() >= MIN_CURVE_CALLS)
        .take(MAX_LINES)
        .map(|m| Series {
            name: m.name.clone(),
            points: CURVE_QUANTILES
                .iter()
                .map(|&q| (q, latency_at(&m.latency, m.max_ns, q) as f64 / 1e6))
                .collect(),
        })
        .collect();
    p.heading("Tool-call latency per method");
    if curves.is_empty() {
        p.note(&format!(
            "No method has {MIN_CURVE_CALLS} answered calls, too few for a percentile curve: each method's latencies are in the table."
        ));
    } else {
        p.chart(
            "latency",
            &format!("Latency from the relay's request to the mod's answer, by percentile (the tail stretched), for methods with at least {MIN_CURVE_CALLS} answered calls; every method is in the table."),
            &chart::percentiles("latency (ms)", &curves)?,
        );
    }
    let rows: Vec<Vec<String>> = methods
        .iter()
        .map(|m| {
            let h = &m.latency;
            // No answered call: no latency, rather than a 0 ms that was never measured.
            let at = |q: f64| match h.is_empty() {
                true => "-".to_string(),
                false => ms(latency_at(h, m.max_ns, q)),
            };
            vec![
                m.name.clone(),
                m.calls.to_string(),
                m.errors.to_string(),
                m.unanswered.to_string(),
                at(0.5),
                at(0.9),
                at(0.99),
                match h.is_empty() {
                    true => "-".to_string(),
                    false => ms(m.max_ns),
                },
            ]
        })
        .collect();
    p.table(
        &[
            "method~",
            "calls#",
            "errors#",
            "unanswered#",
            "p50 ms#",
            "p90 ms#",
            "p99 ms#",
            "max ms#",
        ],
        &rows,
    );

    // Calls, errors, drops and gaps over time.
    let timeline = vec![
        Series {
            name: "calls/s".into(),
            points: rate(c, c.calls.iter().copied()),
        },
        Series {
            name: "errors/s".into(),
            points: rate(c, c.errors.iter().copied()),
        },
        Series {
            name: "dropped events/s".into(),
            points: rate(c, c.dropped.iter().copied()),
        },
        Series {
            name: "seq gaps + lost frames /s".into(),
            points: rate(c, c.mod_seq_gaps.iter().zip(&c.lost).map(|(a, b)| a + b)),
        },
    ];
    p.heading("Calls, errors, drops and gaps over time").chart(
        "calls",
        "Requests forwarded to the mod, error answers, events dropped for slow bridges, and events missing (the mod's seq gaps and frames lost to recording errors), per second; dashed lines are marks.",
        &chart::lines("time (s)", "per second", &timeline, &marks)?,
    );

    p.heading("Bridges");
    // A session that thousands of bridges joined keeps the page readable (and small): the
    // first ones are listed, the count of the rest is said.
    let rows: Vec<Vec<String>> = meta
        .bridges
        .iter()
        .take(BRIDGE_ROWS)
        .map(|b| {
            let seen = c.bridge(b.conn);
            vec![
                b.conn.to_string(),
                b.name
                    .clone()
                    .unwrap_or_else(|| gabp_storage::catalog::DEFAULT_IDENTITY.into()),
                seen.and_then(|s| s.role.clone())
                    .unwrap_or_else(|| "-".into()),
                b.label.clone().unwrap_or_else(|| "-".into()),
                b.bridge_version.clone(),
                b.platform.clone(),
                format!("{:.3}", secs(b.attached_ns.saturating_sub(meta.started_ns))),
                b.detached_ns
                    .map(|d| format!("{:.3}", secs(d.saturating_sub(meta.started_ns))))
                    .unwrap_or_else(|| "-".into()),
                b.policy.clone(),
                b.dropped.to_string(),
                refusals_cell(seen),
            ]
        })
        .collect();
    p.table(
        &[
            "conn#",
            "identity",
            "role",
            "label~",
            "bridge~",
            "platform",
            "attached s#",
            "left s#",
            "policy",
            "dropped#",
            "refused by the relay~",
        ],
        &rows,
    );
    p.note("Role: the identity's, from the welcome the relay recorded (- where the bridge joined before this session began). Refused by the relay: the relay's own error answers to the bridge, by code.");
    if meta.bridges.len() > BRIDGE_ROWS {
        p.note(&format!(
            "{} more bridges are not listed; every frame's conn is in `gabp-relay export`.",
            meta.bridges.len() - BRIDGE_ROWS
        ));
    }

    if c.episodes_total > 0 {
        p.heading("Episodes");
        p.note(&episodes_note(labels));
        if c.episodes_total as usize > c.episodes.len() {
            p.note(&format!(
                "The first {} of {} episodes.",
                c.episodes.len(),
                c.episodes_total
            ));
        }
        let rows: Vec<Vec<String>> = c
            .episodes
            .iter()
            .map(|e| {
                vec![
                    e.index.to_string(),
                    format!("{:.3}", secs(e.start_ns)),
                    episode_duration(e),
                    e.events.to_string(),
                    e.calls.to_string(),
                    e.errors.to_string(),
                    data_cell(e.start_data.as_deref()),
                    data_cell(e.end_data.as_deref()),
                ]
            })
            .collect();
        p.table(
            &[
                "episode#",
                "start s#",
                "duration s#",
                "events#",
                "calls#",
                "errors#",
                "start mark's data~",
                "end mark's data~",
            ],
            &rows,
        );
    }

    p.heading("Marks");
    if c.marks_total as usize > c.marks.len() {
        p.note(&format!(
            "The first {} of {} marks.",
            c.marks.len(),
            c.marks_total
        ));
    }
    let rows: Vec<Vec<String>> = c
        .marks
        .iter()
        .map(|m| {
            vec![
                format!("{:.3}", secs(m.offset_ns)),
                bridge_name(meta, m.conn),
                m.label.clone(),
                data_cell(m.data.as_deref()),
            ]
        })
        .collect();
    p.table(&["time s#", "bridge~", "label~", "data~"], &rows);
    Ok(p.finish())
}
