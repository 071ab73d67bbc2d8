//! The session report's page from what [`super::collect`] gathered: the summary, the charts
//! (events per second per channel, call latency percentiles per method, calls with errors,
//! drops and gaps over time; marks drawn on both timelines) and the tables beside them.

use gabp_report::chart::{self, CURVE_QUANTILES};
use gabp_report::{ChartError, Page, Series, TimeMark};
use gabp_storage::SessionMeta;

use super::collect::{latency_at, Collected};

/// Lines drawn per chart; the rest of the channels are summed into one line.
const MAX_LINES: usize = 8;

fn secs(ns: u64) -> f64 {
    ns as f64 / 1e9
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

/// Bridges listed in the page's table.
const BRIDGE_ROWS: usize = 200;

fn bridge_name(meta: &SessionMeta, conn: u32) -> String {
    meta.bridges
        .iter()
        .find(|b| b.conn == conn)
        .map(|b| match &b.label {
            Some(label) => format!("{label} ({}, {conn})", b.bridge_version),
            None => format!("{} ({conn})", b.bridge_version),
        })
        .unwrap_or_else(|| format!("conn {conn}"))
}

/// The whole page.
pub fn render(meta: &SessionMeta, c: &Collected) -> Result<String, ChartError> {
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
        (
            "tags",
            if meta.tags.is_empty() {
                "none".into()
            } else {
                meta.tags
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            },
        ),
        ("session", meta.id.to_string()),
        ("duration", format!("{:.3} s", secs(meta.duration_ns()))),
        ("bridges", meta.bridges.len().to_string()),
        ("ended", meta.end_label().to_string()),
        ("frames", meta.frames.to_string()),
        ("bytes", meta.bytes.to_string()),
        ("events", meta.events.to_string()),
        ("events dropped for slow bridges", dropped.to_string()),
        ("gaps in the mod's seq (events)", gaps.to_string()),
        (
            "frames lost to recording errors",
            meta.lost_frames.to_string(),
        ),
        ("anomalies", meta.anomalies.to_string()),
        ("marks", c.marks_total.to_string()),
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
        "Events from the mod per second, per channel; vertical lines are marks.",
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
    p.table(&["channel", "events#", "events/s#", "mod seq gaps#"], &rows);

    // Tool-call latency per method.
    let mut methods: Vec<_> = c.methods.iter().collect();
    methods.sort_by(|a, b| b.calls.cmp(&a.calls).then(a.name.cmp(&b.name)));
    let curves: Vec<Series> = methods
        .iter()
        .filter(|m| !m.latency.is_empty())
        .take(MAX_LINES)
        .map(|m| Series {
            name: m.name.clone(),
            points: CURVE_QUANTILES
                .iter()
                .map(|&q| (q, latency_at(&m.latency, m.max_ns, q) as f64 / 1e6))
                .collect(),
        })
        .collect();
    p.heading("Tool-call latency per method").chart(
        "latency",
        "Latency from the relay's request to the mod's answer, by percentile (the tail stretched).",
        &chart::percentiles("latency (ms)", &curves)?,
    );
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
            "method",
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
        "Requests forwarded to the mod, error answers, events dropped for slow bridges, and events missing (the mod's seq gaps and frames lost to recording errors), per second; vertical lines are marks.",
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
            vec![
                b.conn.to_string(),
                b.name
                    .clone()
                    .unwrap_or_else(|| gabp_storage::catalog::DEFAULT_IDENTITY.into()),
                b.label.clone().unwrap_or_else(|| "-".into()),
                b.bridge_version.clone(),
                b.platform.clone(),
                format!("{:.3}", secs(b.attached_ns.saturating_sub(meta.started_ns))),
                b.detached_ns
                    .map(|d| format!("{:.3}", secs(d.saturating_sub(meta.started_ns))))
                    .unwrap_or_else(|| "-".into()),
                b.policy.clone(),
                b.dropped.to_string(),
            ]
        })
        .collect();
    p.table(
        &[
            "conn#",
            "identity",
            "label",
            "bridge",
            "platform",
            "attached s#",
            "left s#",
            "policy",
            "dropped#",
        ],
        &rows,
    );
    if meta.bridges.len() > BRIDGE_ROWS {
        p.note(&format!(
            "{} more bridges are not listed; every frame's conn is in `gabp-relay export`.",
            meta.bridges.len() - BRIDGE_ROWS
        ));
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
            ]
        })
        .collect();
    p.table(&["time s#", "bridge", "label"], &rows);
    Ok(p.finish())
}
