//! The page of a selection of sessions (an experiment: `report --tag experiment=ppo-42`): a
//! summary, a table of the sessions and one of their episodes (tags, marks' data, durations,
//! events, errors, drops), and charts across the selection: each episode's duration, its events
//! and the numbers its end mark carries (a reward, say), by episode number, one line per group
//! of sessions (the tags that differ between them: a seed, a learning rate).
//!
//! Memory stays bounded whatever the selection: each session is read in one pass
//! ([`super::collect`]) and only its row and episodes are kept before the next is read; the
//! page lists the first [`MAX_SESSION_ROWS`] sessions and [`MAX_EPISODE_ROWS`] episodes and
//! counts the rest in its totals.

use std::collections::{BTreeMap, BTreeSet};

use gabp_report::chart;
use gabp_report::{Page, Series};
use gabp_storage::{SessionMeta, Store};

use super::collect::{self, Episode};
use super::page::{data_cell, episode_duration, episodes_note, secs, MAX_LINES};
use super::ReportError;
use crate::export::episode::EpisodeMarks;

/// Sessions listed in the page's table; the rest are counted in the totals.
pub const MAX_SESSION_ROWS: usize = 500;
/// Episodes listed and charted; the rest are counted in the totals.
pub const MAX_EPISODE_ROWS: usize = 2000;
/// Numeric fields of the end marks' data that get a chart of their own.
const MAX_DATA_CHARTS: usize = 2;
/// Distinct field names followed while choosing them.
const MAX_DATA_KEYS: usize = 64;

/// One session's line in the table.
struct SessionRow {
    /// Its place in the selection, from 1.
    n: usize,
    /// Its group (the tags that differ).
    group: usize,
    meta: SessionMeta,
    calls: u64,
    errors: u64,
    dropped: u64,
    missing: u64,
    marks: u64,
    episodes: u64,
    unfinished: u64,
}

/// One episode's line, with the session it belongs to.
struct EpisodeRow {
    /// The session's place in the selection.
    session: usize,
    /// The session's group (the lines of the charts).
    group: usize,
    e: Episode,
}

/// Figures summed over every selected session, listed or not.
#[derive(Default)]
struct Totals {
    duration_ns: u64,
    bytes: u64,
    events: u64,
    calls: u64,
    errors: u64,
    dropped: u64,
    missing: u64,
    marks: u64,
    episodes: u64,
    unfinished: u64,
}

/// The tag keys whose values differ between the sessions (or that some lack).
fn varying_keys(metas: &[SessionMeta]) -> Vec<String> {
    let keys: BTreeSet<&String> = metas.iter().flat_map(|m| m.tags.keys()).collect();
    keys.into_iter()
        .filter(|k| {
            let first = metas[0].tags.get(*k);
            metas.iter().any(|m| m.tags.get(*k) != first)
        })
        .cloned()
        .collect()
}

/// Each session's group (an index into the names): the values of the tags that differ between
/// sessions, or each session alone when none do.
fn groups(metas: &[SessionMeta], keys: &[String]) -> (Vec<String>, Vec<usize>) {
    let mut names: Vec<String> = Vec::new();
    let mut of = Vec::with_capacity(metas.len());
    for (i, m) in metas.iter().enumerate() {
        let name = if keys.is_empty() {
            format!("session #{}", i + 1)
        } else {
            keys.iter()
                .map(|k| format!("{k}={}", m.tags.get(k).map_or("-", String::as_str)))
                .collect::<Vec<_>>()
                .join(" ")
        };
        of.push(match names.iter().position(|n| *n == name) {
            Some(g) => g,
            None => {
                names.push(name);
                names.len() - 1
            }
        });
    }
    (names, of)
}

/// The tags every session shares, as one cell.
fn shared_tags(metas: &[SessionMeta], varying: &[String]) -> String {
    let shared: Vec<String> = metas[0]
        .tags
        .iter()
        .filter(|(k, _)| !varying.contains(k))
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    if shared.is_empty() {
        "none".into()
    } else {
        shared.join(", ")
    }
}

/// The numeric top-level fields of an end mark's data.
fn numbers(data: Option<&str>) -> Vec<(String, f64)> {
    let Some(serde_json::Value::Object(o)) = data.and_then(|d| serde_json::from_str(d).ok()) else {
        return Vec::new();
    };
    o.into_iter()
        .filter_map(|(k, v)| Some((k, v.as_f64().filter(|x| x.is_finite())?)))
        .collect()
}

/// The end marks' numeric fields worth a chart: the most common ones, leaving out a field that
/// only repeats the episode's number.
fn data_fields(episodes: &[EpisodeRow]) -> Vec<String> {
    // name -> (episodes carrying it, whether it always equals the episode's number)
    let mut seen: BTreeMap<String, (u64, bool)> = BTreeMap::new();
    for r in episodes.iter().filter(|r| r.e.end_ns.is_some()) {
        for (k, v) in numbers(r.e.end_data.as_deref()) {
            if !seen.contains_key(&k) && seen.len() >= MAX_DATA_KEYS {
                continue;
            }
            let s = seen.entry(k).or_insert((0, true));
            s.0 += 1;
            s.1 &= v == r.e.index as f64;
        }
    }
    let mut fields: Vec<(String, u64)> = seen
        .into_iter()
        .filter(|(_, (_, is_index))| !is_index)
        .map(|(k, (n, _))| (k, n))
        .collect();
    fields.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    fields
        .into_iter()
        .take(MAX_DATA_CHARTS)
        .map(|f| f.0)
        .collect()
}

/// One line per group (the first [`MAX_LINES`], the rest pooled): at each episode number, the
/// mean of `value` over the group's finished episodes that have one.
fn per_episode(
    episodes: &[EpisodeRow],
    names: &[String],
    value: impl Fn(&Episode) -> Option<f64>,
) -> Vec<Series> {
    let shown = names.len().min(MAX_LINES);
    let pooled = names.len() > MAX_LINES;
    // line -> episode number -> (sum, n)
    let mut acc: Vec<BTreeMap<u64, (f64, u64)>> = vec![BTreeMap::new(); shown + pooled as usize];
    for r in episodes.iter().filter(|r| r.e.end_ns.is_some()) {
        let Some(v) = value(&r.e) else { continue };
        let a = acc[r.group.min(shown)].entry(r.e.index).or_insert((0.0, 0));
        a.0 += v;
        a.1 += 1;
    }
    acc.into_iter()
        .enumerate()
        .filter(|(_, points)| !points.is_empty())
        .map(|(i, points)| Series {
            name: if i < shown {
                names[i].clone()
            } else {
                format!("{} other groups", names.len() - shown)
            },
            points: points
                .into_iter()
                .map(|(ix, (sum, n))| (ix as f64, sum / n as f64))
                .collect(),
        })
        .collect()
}

/// The page of `metas` (oldest first), its episodes cut at the marks `labels` name;
/// `selection` says how the sessions were chosen (shown in the summary).
pub fn render(
    store: &Store,
    metas: &[SessionMeta],
    labels: &EpisodeMarks,
    selection: &str,
) -> Result<String, ReportError> {
    let varying = varying_keys(metas);
    let (names, group_of) = groups(metas, &varying);
    let mut t = Totals::default();
    let mut sessions: Vec<SessionRow> = Vec::new();
    let mut episodes: Vec<EpisodeRow> = Vec::new();
    for (i, meta) in metas.iter().enumerate() {
        let meta = store.with_details(meta)?;
        let c = collect::collect(store, &meta, labels)?;
        let dropped: u64 = meta.bridges.iter().map(|b| b.dropped).sum();
        let missing = c.mod_seq_gaps.iter().sum::<u64>() + c.lost.iter().sum::<u64>();
        t.duration_ns += meta.duration_ns();
        t.bytes += meta.bytes;
        t.events += meta.events;
        t.calls += c.calls_total();
        t.errors += c.errors_total();
        t.dropped += dropped;
        t.missing += missing;
        t.marks += c.marks_total;
        t.episodes += c.episodes_total;
        t.unfinished += c.episodes_unfinished;
        if sessions.len() >= MAX_SESSION_ROWS {
            continue;
        }
        for e in c.episodes.iter() {
            if episodes.len() >= MAX_EPISODE_ROWS {
                break;
            }
            episodes.push(EpisodeRow {
                session: i + 1,
                group: group_of[i],
                e: e.clone(),
            });
        }
        sessions.push(SessionRow {
            n: i + 1,
            group: group_of[i],
            calls: c.calls_total(),
            errors: c.errors_total(),
            dropped,
            missing,
            marks: c.marks_total,
            episodes: c.episodes_total,
            unfinished: c.episodes_unfinished,
            // Only the catalog's figures are shown: its channel and bridge lists go.
            meta: SessionMeta {
                bridges: Vec::new(),
                channels: Vec::new(),
                welcome: None,
                ..(*meta).clone()
            },
        });
    }

    let mut p = Page::new(&match metas.len() {
        1 => format!("1 session: {selection}"),
        n => format!("{n} sessions: {selection}"),
    });
    let first = metas.iter().map(|m| m.started_ns).min().unwrap_or(0);
    let last = metas
        .iter()
        .map(|m| m.started_ns + m.duration_ns())
        .max()
        .unwrap_or(0);
    let apps: BTreeSet<&str> = metas
        .iter()
        .map(|m| m.app_name.as_deref().unwrap_or("unknown"))
        .collect();
    p.heading("Summary").summary(&[
        ("selection", selection.to_string()),
        ("sessions", metas.len().to_string()),
        (
            "apps",
            apps.iter().take(8).copied().collect::<Vec<_>>().join(", "),
        ),
        ("tags all share", shared_tags(metas, &varying)),
        (
            "tags that differ (the charts' lines)",
            if varying.is_empty() {
                "none: one line per session".into()
            } else {
                varying.join(", ")
            },
        ),
        (
            "from",
            format!(
                "{} to {}",
                gabp_rt::display::utc(first),
                gabp_rt::display::utc(last)
            ),
        ),
        ("recorded time", format!("{:.1} s", secs(t.duration_ns))),
        (
            "episodes",
            match t.unfinished {
                0 => t.episodes.to_string(),
                n => format!("{} ({n} without an end mark)", t.episodes),
            },
        ),
        ("events", t.events.to_string()),
        ("calls", t.calls.to_string()),
        ("error answers", t.errors.to_string()),
        ("events dropped for slow bridges", t.dropped.to_string()),
        (
            "events missing (seq gaps, lost frames)",
            t.missing.to_string(),
        ),
        ("marks", t.marks.to_string()),
        ("recorded size", gabp_rt::display::bytes(t.bytes)),
    ]);

    let by = if varying.is_empty() {
        "session".to_string()
    } else {
        varying.join(", ")
    };
    // A tag key could end in a table's column marker: one more keeps it as written.
    let by_col = match by.ends_with(['#', '~']) {
        true => format!("{by}~"),
        false => by.clone(),
    };
    p.heading("Sessions");
    if metas.len() > sessions.len() {
        p.note(&format!(
            "The first {} of {} sessions; the totals above count them all.",
            sessions.len(),
            metas.len()
        ));
    }
    let rows: Vec<Vec<String>> = sessions
        .iter()
        .map(|s| {
            vec![
                s.n.to_string(),
                s.meta.id.to_string(),
                names[s.group].clone(),
                format!("{:.3}", secs(s.meta.duration_ns())),
                s.meta.events.to_string(),
                s.calls.to_string(),
                s.errors.to_string(),
                s.dropped.to_string(),
                s.missing.to_string(),
                s.marks.to_string(),
                match s.unfinished {
                    0 => s.episodes.to_string(),
                    n => format!("{} ({n} no end)", s.episodes),
                },
                gabp_rt::display::bytes(s.meta.bytes),
                s.meta.end_label().to_string(),
            ]
        })
        .collect();
    p.table(
        &[
            "#",
            "session",
            &by_col,
            "duration s#",
            "events#",
            "calls#",
            "errors#",
            "dropped#",
            "missing#",
            "marks#",
            "episodes#",
            "size#",
            "ended",
        ],
        &rows,
    );
    p.note("The tags all sessions share are in the summary. Errors: the mod's error answers. Dropped: events dropped for slow bridges. Missing: gaps in the mod's seq and frames lost to recording errors. `gabp-relay report SESSION` gives one session's own page.");

    p.heading(&format!("Episodes by {by}"));
    let finished = episodes.iter().filter(|r| r.e.end_ns.is_some()).count();
    if finished == 0 {
        p.note(&format!(
            "No episode with an end mark in the selection, so nothing to chart. {}",
            episodes_note(labels)
        ));
    } else {
        let mean = if sessions.len() > names.len() {
            " (the mean at each episode number where a group holds several sessions)"
        } else {
            ""
        };
        p.chart(
            "episode-duration",
            &format!("Each episode's duration, start mark to end mark, by episode number; one line per {by}{mean}."),
            &chart::per_index(
                "episode",
                "duration (s)",
                &per_episode(&episodes, &names, |e| {
                    e.end_ns.map(|end| secs(end.saturating_sub(e.start_ns)))
                }),
            )?,
        );
        p.chart(
            "episode-events",
            &format!("Events from the mod within each episode, by episode number; one line per {by}{mean}."),
            &chart::per_index(
                "episode",
                "events",
                &per_episode(&episodes, &names, |e| Some(e.events as f64)),
            )?,
        );
        for (i, field) in data_fields(&episodes).iter().enumerate() {
            p.chart(
                &format!("episode-data-{}", i + 1),
                &format!("{field:?} in each episode's end mark's data, by episode number; one line per {by}{mean}."),
                &chart::per_index(
                    "episode",
                    field,
                    &per_episode(&episodes, &names, |e| {
                        numbers(e.end_data.as_deref())
                            .into_iter()
                            .find(|(k, _)| k == field)
                            .map(|(_, v)| v)
                    }),
                )?,
            );
        }
    }

    if !episodes.is_empty() {
        p.heading("Episodes");
        p.note(&episodes_note(labels));
        if t.episodes as usize > episodes.len() {
            p.note(&format!(
                "The first {} of {} episodes; the totals above count them all.",
                episodes.len(),
                t.episodes
            ));
        }
        let rows: Vec<Vec<String>> = episodes
            .iter()
            .map(|r| {
                vec![
                    r.session.to_string(),
                    names[r.group].clone(),
                    r.e.index.to_string(),
                    format!("{:.3}", secs(r.e.start_ns)),
                    episode_duration(&r.e),
                    r.e.events.to_string(),
                    r.e.calls.to_string(),
                    r.e.errors.to_string(),
                    data_cell(r.e.start_data.as_deref()),
                    data_cell(r.e.end_data.as_deref()),
                ]
            })
            .collect();
        p.table(
            &[
                "session#",
                &by_col,
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
    Ok(p.finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(tags: &[(&str, &str)]) -> SessionMeta {
        SessionMeta {
            tags: tags
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..SessionMeta::default()
        }
    }

    #[test]
    fn sessions_group_by_the_tags_that_differ() {
        let metas = [
            meta(&[("exp", "ppo"), ("seed", "1")]),
            meta(&[("exp", "ppo"), ("seed", "2")]),
            meta(&[("exp", "ppo"), ("seed", "1"), ("gpu", "a")]),
        ];
        let keys = varying_keys(&metas);
        assert_eq!(keys, ["gpu", "seed"]);
        let (names, of) = groups(&metas, &keys);
        assert_eq!(names, ["gpu=- seed=1", "gpu=- seed=2", "gpu=a seed=1"]);
        assert_eq!(of, [0, 1, 2]);
        assert_eq!(shared_tags(&metas, &keys), "exp=ppo");
        let same = [meta(&[("exp", "ppo")]), meta(&[("exp", "ppo")])];
        let (names, of) = groups(&same, &varying_keys(&same));
        assert_eq!(names, ["session #1", "session #2"]);
        assert_eq!(of, [0, 1]);
    }

    fn ep(group: usize, index: u64, end_data: &str) -> EpisodeRow {
        EpisodeRow {
            session: group + 1,
            group,
            e: Episode {
                index,
                start_ns: 0,
                end_ns: Some(index * 1_000_000_000),
                end_data: Some(end_data.into()),
                events: 10 * index,
                ..Episode::default()
            },
        }
    }

    #[test]
    fn end_mark_numbers_are_charted_but_not_the_episode_number() {
        let eps = [
            ep(0, 1, r#"{"episode":1,"reward":2.5,"steps":10,"note":"x"}"#),
            ep(0, 2, r#"{"episode":2,"reward":3.5}"#),
            ep(1, 1, r#"{"episode":1,"reward":1e400}"#),
        ];
        assert_eq!(data_fields(&eps), ["reward", "steps"]);
        let names: Vec<String> = vec!["seed=1".into(), "seed=2".into()];
        let lines = per_episode(&eps, &names, |e| {
            numbers(e.end_data.as_deref())
                .into_iter()
                .find(|(k, _)| k == "reward")
                .map(|x| x.1)
        });
        assert_eq!(lines.len(), 1, "a reward too large for f64 is left out");
        assert_eq!(lines[0].points, [(1.0, 2.5), (2.0, 3.5)]);
        let dur = per_episode(&eps, &names, |e| e.end_ns.map(|end| secs(end - e.start_ns)));
        assert_eq!(dur[1].points, [(1.0, 1.0)]);
    }

    #[test]
    fn more_groups_than_lines_are_pooled_into_one() {
        let names: Vec<String> = (0..12).map(|i| format!("seed={i}")).collect();
        let eps: Vec<EpisodeRow> = (0..12).map(|g| ep(g, 1, "{}")).collect();
        let lines = per_episode(&eps, &names, |e| Some(e.events as f64));
        assert_eq!(lines.len(), MAX_LINES + 1);
        assert_eq!(lines[MAX_LINES].name, "4 other groups");
        assert_eq!(lines[MAX_LINES].points, [(1.0, 10.0)]);
    }
}
