//! `gabp-relay report`: one recorded session as a self-contained HTML page (summary, events
//! per second per channel, call latency per method, calls with errors, drops and gaps over
//! time, marks on the timeline, episodes), or a selection of sessions (an experiment) as one
//! page of its own ([`selection`]: a table per session and per episode, charts across them).
//! Each session is read in one bounded-memory pass ([`collect`]) and drawn by `gabp-report`
//! ([`page`]).

pub mod collect;
pub mod page;
pub mod selection;

use std::path::Path;

use gabp_storage::{SessionMeta, Store, StoreError};

use crate::export::episode::EpisodeMarks;

/// Why a report could not be written.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// Reading the store failed.
    #[error("{0}")]
    Store(#[from] StoreError),
    /// Drawing failed.
    #[error("{0}")]
    Chart(#[from] gabp_report::ChartError),
    /// Writing the page failed.
    #[error("writing the report: {0}")]
    Io(#[from] std::io::Error),
}

/// The page of a session, its episodes cut at the marks `labels` name.
pub fn render(
    store: &Store,
    meta: &SessionMeta,
    labels: &EpisodeMarks,
) -> Result<String, ReportError> {
    let meta = store.with_details(meta)?;
    let c = collect::collect(store, &meta, labels)?;
    Ok(page::render(&meta, &c, labels)?)
}

/// Writes the page of a session to `path` (see [`write_page`]); returns its size in bytes.
pub fn write(
    store: &Store,
    meta: &SessionMeta,
    labels: &EpisodeMarks,
    path: &Path,
) -> Result<u64, ReportError> {
    write_page(&render(store, meta, labels)?, path)
}

/// Writes a page to `path` (a temp file renamed on success, so a failed report never leaves
/// half a page; a FIFO or device there is written into); returns its size in bytes.
pub fn write_page(html: &str, path: &Path) -> Result<u64, ReportError> {
    crate::export::write_atomically(path, |f| -> Result<(), ReportError> {
        std::io::Write::write_all(f, html.as_bytes())?;
        Ok(())
    })?;
    Ok(html.len() as u64)
}

#[cfg(test)]
mod tests {
    use crate::export::episode::EpisodeMarks;
    use bytes::Bytes;
    use gabp_storage::{
        BridgeInfo, Direction, EndReason, FrameRecord, SessionMeta, SessionWriter, Store,
        StoreOptions,
    };

    const EVIL: &str = "<script>alert(1)</script>";

    fn frame(dir: Direction, conn: u32, t: u64, body: String) -> FrameRecord {
        FrameRecord::message(dir, conn, t, true, Bytes::from(body))
    }

    /// A session whose every name a mod or bridge chooses is hostile markup.
    fn hostile_session(dir: &std::path::Path) -> (Store, SessionMeta) {
        let store = Store::open(dir, StoreOptions::default()).expect("open");
        let mut w = SessionWriter::new(store.clone());
        let meta = SessionMeta {
            id: uuid::Uuid::now_v7(),
            route: EVIL.into(),
            started_ns: 1_000_000_000,
            app_name: Some(EVIL.into()),
            tags: [("exp".to_string(), EVIL.to_string())].into(),
            ..SessionMeta::default()
        };
        let id = meta.id;
        w.begin(meta);
        w.define_channel(id, 0, EVIL);
        w.upsert_bridge(
            id,
            BridgeInfo {
                conn: 1,
                name: Some(EVIL.into()),
                bridge_version: EVIL.into(),
                platform: EVIL.into(),
                attached_ns: 1_000_000_000,
                policy: "drop-oldest".into(),
                unrecorded_bad_frames: 0,
                rate_limited: 0,
                denied: 0,
                lease_refused: 0,
                label: Some(EVIL.into()),
                ..BridgeInfo::default()
            },
        );
        let esc = EVIL.replace('/', "\\/");
        for i in 0..50u64 {
            let t = 1_000_000_000 + i * 20_000_000;
            // Seq 5 is skipped: a gap.
            let seq = if i < 5 { i } else { i + 1 };
            w.append(
                id,
                &FrameRecord {
                    channel: Some(0),
                    mod_seq: Some(seq),
                    relay_seq: Some(i),
                    ..frame(
                        Direction::ModToRelay,
                        0,
                        t,
                        format!(r#"{{"v":"gabp/1","type":"event","channel":"{esc}","seq":{seq},"payload":{{}}}}"#),
                    )
                },
            );
        }
        let rid = "00000000-0000-4000-8000-000000000001";
        w.append(
            id,
            &frame(
                Direction::BridgeToRelay,
                1,
                1_100_000_000,
                format!(r#"{{"v":"gabp/1","type":"request","id":"{rid}","method":"relay/mark","params":{{"label":"{esc}"}}}}"#),
            ),
        );
        w.append(
            id,
            &frame(
                Direction::RelayToMod,
                0,
                1_200_000_000,
                format!(r#"{{"v":"gabp/1","type":"request","id":"{rid}","method":"tools/call","params":{{}}}}"#),
            ),
        );
        w.append(
            id,
            &frame(
                Direction::ModToRelay,
                0,
                1_203_000_000,
                format!(r#"{{"v":"gabp/1","type":"response","id":"{rid}","error":{{"code":-32000,"message":"x"}}}}"#),
            ),
        );
        // The relay's welcome to the bridge (its role) and its refusals.
        w.append(
            id,
            &frame(
                Direction::RelayToBridge,
                1,
                1_000_000_001,
                format!(r#"{{"v":"gabp/1","type":"response","id":"{rid}","result":{{"capabilities":{{"extensions":{{"relay":{{"bridge":{{"name":null,"role":"{esc}"}}}}}}}}}}}}"#),
            ),
        );
        for code in [-32006, -32008, -32006] {
            w.append(
                id,
                &frame(
                    Direction::RelayToBridge,
                    1,
                    1_300_000_000,
                    format!(r#"{{"v":"gabp/1","type":"response","id":"{rid}","error":{{"code":{code},"message":"no"}}}}"#),
                ),
            );
        }
        w.end(id, EndReason::Clean, 2_000_000_000);
        w.commit().expect("commit");
        let meta = store.session(id).expect("read").expect("present");
        (store, meta)
    }

    #[test]
    fn every_name_from_a_recording_is_escaped_and_every_figure_is_counted() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (store, meta) = hostile_session(&dir.path().join("data"));
        let labels = crate::export::episode::EpisodeMarks::default();
        let html = super::render(&store, &meta, &labels).expect("rendered");
        // The only script is the page's own checker; the hostile name shows escaped.
        assert_eq!(
            html.matches("<script>").count(),
            2,
            "no script got in: the page has its own two"
        );
        assert!(
            !html.contains("<script>alert(1)"),
            "raw markup from the recording"
        );
        assert!(html.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
        assert!(
            html.contains("exp=&lt;script&gt;"),
            "the tags are in the summary"
        );
        let c = super::collect::collect(&store, &meta, &labels).expect("collected");
        assert_eq!(c.frames, 57);
        assert_eq!(c.channels[0].events, 50);
        assert_eq!(c.channels[0].mod_seq_gaps, 1);
        assert_eq!(c.marks.len(), 1);
        assert_eq!(c.marks[0].offset_ns, 100_000_000);
        assert_eq!(c.methods[0].calls, 1);
        assert_eq!(c.methods[0].errors, 1);
        assert_eq!(c.errors.iter().sum::<u64>(), 1);
        // 3 ms, within the histogram's 2 significant figures.
        let p50 = c.methods[0].latency.value_at_quantile(0.5);
        assert!((2_970_000..=3_030_000).contains(&p50), "{p50}");
        assert!(c.buckets <= super::collect::BUCKETS);
        // One call is too few for a percentile curve: events and calls over time only.
        assert_eq!(html.matches("<figure class=\"chart\"").count(), 2);
        assert!(html.contains("No method has 20 answered calls"));
        // The bridge's role from its welcome (escaped: a recording is untrusted) and the
        // relay's refusals by code.
        assert_eq!(c.bridges[0].role.as_deref(), Some(EVIL));
        assert_eq!(c.bridges[0].refused, [(-32006, 2), (-32008, 1)]);
        assert!(html.contains(
            "<td class=\"t\">2 forbidden (-32006), 1 lease held by another (-32008)</td>"
        ));
        assert!(html.contains("<td>&lt;script&gt;alert(1)&lt;/script&gt;</td>"));
        // A mark not named as an episode's start or end cuts no episode.
        assert_eq!(c.episodes_total, 0);
    }

    /// A session whose marks cut episodes: 10 events before any mark, then episode 1 (20
    /// events, a failing call), a stray end, episode 2 left open by episode 3's start, and
    /// episode 3 open at the session's end.
    #[test]
    fn episodes_run_from_a_start_mark_to_the_next_end_mark_with_their_data() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open(&dir.path().join("data"), StoreOptions::default()).expect("open");
        let mut w = SessionWriter::new(store.clone());
        let meta = SessionMeta {
            id: uuid::Uuid::now_v7(),
            route: "r".into(),
            started_ns: 1_000_000_000,
            ..SessionMeta::default()
        };
        let id = meta.id;
        w.begin(meta);
        w.define_channel(id, 0, "tick");
        let mut t = 1_000_000_000u64;
        let mut seq = 0u64;
        let mut events = |w: &mut SessionWriter, t: &mut u64, n: u64| {
            for _ in 0..n {
                *t += 1_000_000;
                w.append(
                    id,
                    &FrameRecord {
                        channel: Some(0),
                        mod_seq: Some(seq),
                        relay_seq: Some(seq),
                        ..frame(
                            Direction::ModToRelay,
                            0,
                            *t,
                            format!(r#"{{"v":"gabp/1","type":"event","channel":"tick","seq":{seq},"payload":{{}}}}"#),
                        )
                    },
                );
                seq += 1;
            }
        };
        let mut n = 0u32;
        let mut mark = |w: &mut SessionWriter, t: &mut u64, label: &str, data: &str| {
            *t += 1_000_000;
            n += 1;
            let rid = format!("00000000-0000-4000-8000-{n:012}");
            w.append(
                id,
                &frame(
                    Direction::BridgeToRelay,
                    1,
                    *t,
                    format!(r#"{{"v":"gabp/1","type":"request","id":"{rid}","method":"relay/mark","params":{{"label":"{label}","data":{data}}}}}"#),
                ),
            );
        };
        events(&mut w, &mut t, 10);
        mark(&mut w, &mut t, "go", r#"{"episode": 1}"#);
        events(&mut w, &mut t, 20);
        let rid = "00000000-0000-4000-8000-00000000ffff";
        w.append(
            id,
            &frame(Direction::RelayToMod, 0, t + 1, format!(r#"{{"v":"gabp/1","type":"request","id":"{rid}","method":"tools/call","params":{{}}}}"#)),
        );
        w.append(
            id,
            &frame(Direction::ModToRelay, 0, t + 2, format!(r#"{{"v":"gabp/1","type":"response","id":"{rid}","error":{{"code":-32000,"message":"x"}}}}"#)),
        );
        t += 2;
        mark(
            &mut w,
            &mut t,
            "stop",
            r#"{"episode": 1, "reward": 12345678901234567890}"#,
        );
        events(&mut w, &mut t, 5);
        mark(&mut w, &mut t, "stop", "null");
        mark(&mut w, &mut t, "go", r#"{"episode": 2}"#);
        events(&mut w, &mut t, 7);
        mark(&mut w, &mut t, "go", r#"{"episode": 3}"#);
        events(&mut w, &mut t, 3);
        w.end(id, EndReason::Clean, t + 1_000_000);
        w.commit().expect("commit");
        let meta = store.session(id).expect("read").expect("present");
        let labels = EpisodeMarks::parse("go,stop").expect("labels");
        let c = super::collect::collect(&store, &meta, &labels).expect("collected");
        assert_eq!(c.episodes_total, 3);
        assert_eq!(c.episodes_unfinished, 2);
        let e: Vec<(u64, u64, u64, u64, bool)> = c
            .episodes
            .iter()
            .map(|e| (e.index, e.events, e.calls, e.errors, e.end_ns.is_some()))
            .collect();
        assert_eq!(
            e,
            [
                (1, 20, 1, 1, true),
                (2, 7, 0, 0, false),
                (3, 3, 0, 0, false)
            ]
        );
        // 20 events 1 ms apart, the call's two frames 1 ns apart, the end mark 1 ms later.
        assert_eq!(
            c.episodes[0].end_ns.map(|end| end - c.episodes[0].start_ns),
            Some(21_000_002)
        );
        // The marks' data as the bridge wrote it: a number too big for f64 stays exact.
        assert_eq!(
            c.episodes[0].start_data.as_deref(),
            Some(r#"{"episode": 1}"#)
        );
        assert_eq!(
            c.episodes[0].end_data.as_deref(),
            Some(r#"{"episode": 1, "reward": 12345678901234567890}"#)
        );
        assert_eq!(c.marks[2].data.as_deref(), Some("null"));
        let html = super::page::render(&meta, &c, &labels).expect("page");
        assert!(
            html.contains("12345678901234567890"),
            "the data is on the page"
        );
        assert!(html.contains("- (no end mark)"));
        assert!(html.contains("3 (2 without an end mark)"));
    }
}
