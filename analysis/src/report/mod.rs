//! `gabp-relay report`: one recorded session as a self-contained HTML page (summary, events
//! per second per channel, call latency per method, calls with errors, drops and gaps over
//! time, marks on the timeline), read in one bounded-memory pass ([`collect`]) and drawn by
//! `gabp-report` ([`page`]).

pub mod collect;
pub mod page;

use std::path::Path;

use gabp_storage::{SessionMeta, Store, StoreError};

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

/// The page of a session.
pub fn render(store: &Store, meta: &SessionMeta) -> Result<String, ReportError> {
    let meta = store.with_details(meta)?;
    let c = collect::collect(store, &meta)?;
    Ok(page::render(&meta, &c)?)
}

/// Writes the page of a session to `path` (a temp file renamed on success, so a failed report
/// never leaves half a page; a FIFO or device there is written into); returns its size in bytes.
pub fn write(store: &Store, meta: &SessionMeta, path: &Path) -> Result<u64, ReportError> {
    let html = render(store, meta)?;
    crate::export::write_atomically(path, |f| -> Result<(), ReportError> {
        std::io::Write::write_all(f, html.as_bytes())?;
        Ok(())
    })?;
    Ok(html.len() as u64)
}

#[cfg(test)]
mod tests {
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
        w.end(id, EndReason::Clean, 2_000_000_000);
        w.commit().expect("commit");
        let meta = store.session(id).expect("read").expect("present");
        (store, meta)
    }

    #[test]
    fn every_name_from_a_recording_is_escaped_and_every_figure_is_counted() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (store, meta) = hostile_session(&dir.path().join("data"));
        let html = super::render(&store, &meta).expect("rendered");
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
        let c = super::collect::collect(&store, &meta).expect("collected");
        assert_eq!(c.frames, 53);
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
        assert_eq!(html.matches("<figure class=\"chart\"").count(), 3);
    }
}
