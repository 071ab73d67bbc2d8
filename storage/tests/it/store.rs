//! Storage round trips in a temporary data dir: write, read back, index, check, crash prefix,
//! retention, locking.

use bytes::Bytes;
use gabp_storage::{
    Direction, EndReason, FrameRecord, SessionMeta, SessionWriter, Store, StoreOptions,
};

fn event(ch: u32, seq: u64, t: u64) -> FrameRecord {
    FrameRecord {
        dir: Direction::ModToRelay,
        conn: 0,
        time_ns: t,
        channel: Some(ch),
        mod_seq: Some(seq + 1),
        relay_seq: Some(seq),
        json_ok: true,
        body: Bytes::from(format!(
            r#"{{"v":"gabp/1","type":"event","channel":"c{ch}","seq":{seq},"payload":{{}}}}"#
        )),
    }
}

fn meta(route: &str) -> SessionMeta {
    SessionMeta {
        id: uuid::Uuid::now_v7(),
        route: route.into(),
        started_ns: 1,
        ..SessionMeta::default()
    }
}

#[test]
fn write_read_index_and_check() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path(), StoreOptions::default()).expect("open");
    let mut w = SessionWriter::new(store.clone());
    let m = meta("r");
    let id = m.id;
    w.begin(m);
    w.define_channel(id, 0, "a");
    w.define_channel(id, 1, "b");
    let mut sent = Vec::new();
    let (mut sa, mut sb) = (0, 0);
    for i in 0..2000u64 {
        let r = if i % 3 == 0 {
            sb += 1;
            event(1, sb - 1, i)
        } else {
            sa += 1;
            event(0, sa - 1, i)
        };
        w.append(id, &r).expect("open session");
        sent.push(r);
        if i % 97 == 0 {
            w.commit().expect("commit");
        }
    }
    w.end(id, EndReason::Clean, 5000);
    w.commit().expect("commit");

    let got: Vec<FrameRecord> = store.frames(id).map(|r| r.expect("frame").1).collect();
    assert_eq!(got, sent);
    let from_b: Vec<u64> = store
        .channel_frames(id, 1, 100)
        .expect("index")
        .map(|r| r.expect("frame").1.relay_seq.expect("seq"))
        .collect();
    assert_eq!(from_b, (100..sb).collect::<Vec<_>>());
    let tail: Vec<u64> = store
        .frames_from(id, 1990)
        .map(|r| r.expect("frame").0)
        .collect();
    assert_eq!(tail, (1990..2000).collect::<Vec<_>>());

    let report = store.check_session(id).expect("check");
    assert!(report.ok(), "{:?}", report.problems);
    assert_eq!(report.frames, 2000);
    let meta = store.session(id).expect("read").expect("present");
    assert_eq!(meta.end_reason, Some(EndReason::Clean));
    assert_eq!(meta.channels, vec!["a", "b"]);
    assert_eq!(meta.events, 2000);
}

#[test]
fn unfinished_session_reopens_as_crash_with_committed_prefix() {
    let dir = tempfile::tempdir().expect("tempdir");
    let id;
    {
        let store = Store::open(dir.path(), StoreOptions::default()).expect("open");
        let mut w = SessionWriter::new(store);
        let m = meta("r");
        id = m.id;
        w.begin(m);
        w.define_channel(id, 0, "a");
        for i in 0..300 {
            w.append(id, &event(0, i, i)).expect("open");
        }
        w.commit().expect("commit");
        for i in 300..400 {
            w.append(id, &event(0, i, i)).expect("open"); // never committed: lost like a crash
        }
    }
    let store = Store::open(dir.path(), StoreOptions::default()).expect("reopen");
    let m = store.session(id).expect("read").expect("present");
    assert_eq!(m.end_reason, Some(EndReason::Crash));
    assert_eq!(m.frames, 300);
    assert!(store.check_session(id).expect("check").ok());
}

#[test]
fn discarded_batch_leaves_no_hole() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path(), StoreOptions::default()).expect("open");
    let mut w = SessionWriter::new(store.clone());
    let m = meta("r");
    let id = m.id;
    w.begin(m);
    w.define_channel(id, 0, "a");
    for i in 0..10 {
        w.append(id, &event(0, i, i));
    }
    w.commit().expect("commit");
    for i in 10..20 {
        w.append(id, &event(0, i, i));
    }
    assert_eq!(w.discard_staged(), 10);
    // Relay seqs go on after the loss: the gap record explains the jump.
    for i in 20..25 {
        w.append(id, &event(0, i, i));
    }
    w.end(id, EndReason::Clean, 99);
    w.commit().expect("commit");
    let m = store.session(id).expect("read").expect("present");
    assert_eq!((m.frames, m.lost_frames), (15, 10));
    let r = store.check_session(id).expect("check");
    assert!(r.ok(), "{:?}", r.problems);
    assert_eq!((r.gaps, r.lost_frames), (1, 10));
    let g = store.gaps(id).expect("gaps");
    assert_eq!(g[0].frame, 10);
    assert_eq!(g[0].channels, vec![(0, 10, 10)]);
}

#[test]
fn check_finds_an_unannounced_hole() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path(), StoreOptions::default()).expect("open");
    let mut w = SessionWriter::new(store.clone());
    let m = meta("r");
    let id = m.id;
    w.begin(m);
    w.define_channel(id, 0, "a");
    for i in 0..600 {
        w.append(id, &event(0, i, i));
    }
    w.end(id, EndReason::Clean, 999);
    w.commit().expect("commit");
    drop(w);
    // Delete the middle chunk (frames 256..512) behind the writer's back.
    store.delete_chunk_for_test(id, 256).expect("delete");
    let r = store.check_session(id).expect("check");
    assert!(!r.ok());
    assert!(
        r.problems.iter().any(|p| p.contains("a hole")),
        "{:?}",
        r.problems
    );
    assert!(
        r.problems
            .iter()
            .any(|p| p.contains("catalog counts 600 frames")),
        "{:?}",
        r.problems
    );
}

#[test]
fn retention_deletes_oldest_ended_sessions_and_lock_is_exclusive() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path(), StoreOptions::default()).expect("open");
    assert!(matches!(
        Store::open(dir.path(), StoreOptions::default()),
        Err(gabp_storage::StoreError::Locked { .. })
    ));
    let ro = Store::open_for_reading(dir.path()).expect("read-only while locked");
    assert!(ro.sessions().expect("list").is_empty());
    let mut w = SessionWriter::new(store.clone());
    let mut ids = Vec::new();
    for k in 0..3u64 {
        let m = meta("r");
        ids.push(m.id);
        w.begin(m.clone());
        w.define_channel(m.id, 0, "a");
        for i in 0..10 {
            w.append(m.id, &event(0, i, k * 100 + i));
        }
        w.end(m.id, EndReason::Clean, k * 100 + 50);
        w.commit().expect("commit");
    }
    let per = store.session(ids[0]).expect("read").expect("present").bytes;
    let deleted = store
        .apply_retention(1000, None, Some(per * 2))
        .expect("retention");
    assert_eq!(deleted, vec![ids[0]]);
    assert_eq!(store.frames(ids[0]).count(), 0);
    let deleted = store
        .apply_retention(1000, Some(800), None)
        .expect("retention");
    assert_eq!(deleted, vec![ids[1]]);
    assert_eq!(
        store.resolve(&ids[2].to_string()[..8]).expect("prefix").id,
        ids[2]
    );
}

/// Names, sizes and contents of every file in `dir`.
fn listing(dir: &std::path::Path) -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .expect("read dir")
        .map(|e| {
            let e = e.expect("entry");
            let name = e.file_name().to_string_lossy().into_owned();
            (name, std::fs::read(e.path()).unwrap_or_default())
        })
        .collect();
    v.sort();
    v
}

/// Entries of the system temp dir other than the `.tmp…` dirs tests make with `tempfile`.
fn temp_entries() -> std::collections::BTreeSet<String> {
    std::fs::read_dir(std::env::temp_dir())
        .expect("read temp dir")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with(".tmp"))
        .collect()
}

#[test]
fn reading_creates_no_file_in_the_data_dir_or_anywhere_else() {
    let dir = tempfile::tempdir().expect("tempdir");
    let id = {
        let store = Store::open(dir.path(), StoreOptions::default()).expect("open");
        let mut w = SessionWriter::new(store);
        let m = meta("r");
        w.begin(m.clone());
        w.define_channel(m.id, 0, "a");
        for i in 0..100 {
            w.append(m.id, &event(0, i, i));
        }
        w.end(m.id, EndReason::Clean, 200);
        w.commit().expect("commit");
        m.id
    };
    let before = listing(dir.path());
    let temp_before = temp_entries();
    let ro = Store::open_for_reading(dir.path()).expect("read");
    assert_eq!(ro.sessions().expect("list").len(), 1);
    assert_eq!(ro.frames(id).count(), 100);
    assert!(ro.check_session(id).expect("check").ok());
    // While it is open: a read command killed now (SIGKILL runs no destructor) must leave
    // nothing behind, so nothing may have been made for it.
    let made: Vec<String> = temp_entries().difference(&temp_before).cloned().collect();
    assert!(
        made.is_empty(),
        "a read-only open made {made:?} in the temp dir"
    );
    drop(ro);
    assert_eq!(
        listing(dir.path()),
        before,
        "reading changed the data dir (info log included)"
    );
}

#[test]
fn a_retention_plan_says_why_and_what_it_keeps_and_deletes_nothing() {
    use gabp_storage::retention::{Deletable, RetentionRule};
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path(), StoreOptions::default()).expect("open");
    let mut w = SessionWriter::new(store.clone());
    let mut ids = Vec::new();
    // Three ended sessions (ending at 50, 150, 250) and one still recording.
    for k in 0..4u64 {
        let m = meta("r");
        ids.push(m.id);
        w.begin(m.clone());
        w.define_channel(m.id, 0, "a");
        for i in 0..10 {
            w.append(m.id, &event(0, i, k * 100 + i));
        }
        if k < 3 {
            w.end(m.id, EndReason::Clean, k * 100 + 50);
        }
        w.commit().expect("commit");
    }
    let sizes: Vec<u64> = ids
        .iter()
        .map(|id| store.session(*id).expect("read").expect("present").bytes)
        .collect();
    let total: u64 = sizes.iter().sum();
    // Older than 120 at 300: the first two by age; a cap of the last session's size: the
    // third by size too (the fourth is recording, kept, and counted as kept).
    let rule = RetentionRule {
        now_ns: 300,
        max_age_ns: Some(120),
        max_bytes: Some(sizes[3]),
        deletable: Deletable::Ended,
    };
    let plan = store.retention_plan(&rule).expect("plan");
    let got: Vec<_> = plan.expired.iter().map(|e| (e.meta.id, e.why())).collect();
    assert_eq!(
        got,
        vec![
            (ids[0], "over age and size"),
            (ids[1], "over age and size"),
            (ids[2], "over size"),
        ]
    );
    assert_eq!(plan.kept_recording, 0, "the rest fits the cap");
    assert_eq!(plan.before_bytes, total);
    assert_eq!(plan.after_bytes, sizes[3]);
    assert_eq!(
        store.sessions().expect("list").len(),
        4,
        "a plan deletes nothing"
    );
    // A cap below the recording session: kept, and said so.
    let tight = RetentionRule {
        max_age_ns: None,
        max_bytes: Some(0),
        ..rule
    };
    let plan = store.retention_plan(&tight).expect("plan");
    assert_eq!(plan.expired.len(), 3);
    assert_eq!(plan.kept_recording, 1);
    // Nothing shipped: a rule that keeps what no destination has whole deletes nothing.
    let shipped_only = RetentionRule {
        deletable: Deletable::ShippedAnywhere,
        ..tight
    };
    let plan = store.retention_plan(&shipped_only).expect("plan");
    assert!(plan.expired.is_empty());
    assert_eq!(plan.kept_unshipped, 3);
    // Deleting follows the plan, one session at a time, each said as it goes.
    let mut said = Vec::new();
    let deleted = store
        .delete_expired(&tight, |e| said.push(e.meta.id))
        .expect("delete");
    assert_eq!(said, ids[..3].to_vec());
    assert_eq!(deleted.len(), 3);
    let left: Vec<_> = store
        .sessions()
        .expect("list")
        .iter()
        .map(|m| m.id)
        .collect();
    assert_eq!(left, vec![ids[3]]);
}
