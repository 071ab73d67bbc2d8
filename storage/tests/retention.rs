//! Deleting sessions gives their disk space back, and a recording goes on while it does.

use std::path::Path;
use std::time::{Duration, Instant};

use bytes::Bytes;
use gabp_storage::{
    Direction, Durability, EndReason, FrameRecord, SessionId, SessionMeta, SessionWriter, Store,
    StoreOptions,
};

/// Bytes of every file under `dir`.
fn disk_usage(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .expect("read dir")
        .map(|e| {
            let e = e.expect("entry");
            let m = e.metadata().expect("metadata");
            if m.is_dir() {
                disk_usage(&e.path())
            } else {
                m.len()
            }
        })
        .sum()
}

/// An event whose payload does not compress away, so the session's size on disk is real.
fn event(ch: u32, seq: u64, t: u64) -> FrameRecord {
    let noise = seq.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ t.rotate_left(17);
    FrameRecord {
        dir: Direction::ModToRelay,
        conn: 0,
        time_ns: t,
        channel: Some(ch),
        mod_seq: Some(seq),
        relay_seq: Some(seq),
        json_ok: true,
        body: Bytes::from(format!(
            r#"{{"v":"gabp/1","type":"event","channel":"c{ch}","seq":{seq},"payload":{{"n":"{noise:016x}{:016x}"}}}}"#,
            noise.rotate_left(31) ^ 0x5555
        )),
    }
}

/// Writes one ended session of `frames` events, timed from `t0`.
fn write_session(w: &mut SessionWriter, frames: u64, t0: u64) -> SessionId {
    let m = SessionMeta {
        id: uuid::Uuid::now_v7(),
        route: "r".into(),
        started_ns: t0,
        ..SessionMeta::default()
    };
    let id = m.id;
    w.begin(m);
    w.define_channel(id, 0, "a");
    for i in 0..frames {
        w.append(id, &event(0, i, t0 + i));
        if i % 10_000 == 9_999 {
            w.commit().expect("commit");
        }
    }
    w.end(id, EndReason::Clean, t0 + frames);
    w.commit().expect("commit");
    id
}

fn fast(data: &Path) -> Store {
    Store::open(
        data,
        StoreOptions {
            durability: Durability::None,
            ..StoreOptions::default()
        },
    )
    .expect("open")
}

/// A data dir with a large session and a small one, flushed to table files.
fn large_and_small(data: &Path) -> (SessionId, SessionId) {
    let store = fast(data);
    let mut w = SessionWriter::new(store.clone());
    let large = write_session(&mut w, 400_000, 1);
    let small = write_session(&mut w, 1_000, 18_000_000);
    drop(w);
    store.flush().expect("flush");
    (large, small)
}

#[test]
fn sessions_rm_gives_a_large_sessions_disk_space_back() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let (large, small) = large_and_small(&data);
    let before = disk_usage(&data);
    // As `sessions rm` opens it: the space is free when the delete returns.
    let store = Store::open_for_change(&data).expect("change");
    store.delete_session(large).expect("rm");
    let after = disk_usage(&data);
    eprintln!(
        "data dir: {} KiB before, {} KiB after",
        before / 1024,
        after / 1024
    );
    assert!(before > 16 << 20, "the session is large ({before} bytes)");
    assert!(
        after < before / 10,
        "{after} bytes left of {before} after deleting the session"
    );
    assert_eq!(store.frames(large).count(), 0);
    let r = store.check_session(small).expect("check");
    assert!(r.ok() && r.frames == 1_000, "{:?}", r.problems);
}

#[test]
fn retention_in_a_relay_gives_space_back_in_the_background() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let (large, small) = large_and_small(&data);
    let before = disk_usage(&data);
    // As a relay opens it: retention returns at once, the space follows.
    let store = fast(&data);
    let t = Instant::now();
    let deleted = store
        .apply_retention(20_000_000, Some(5_000_000), None)
        .expect("retention");
    let blocked = t.elapsed();
    assert_eq!(deleted, vec![large]);
    assert!(store.frames(large).next().is_none());
    store.wait_reclaimed();
    let after = disk_usage(&data);
    eprintln!(
        "retention returned in {blocked:?}; data dir {} KiB before, {} KiB after",
        before / 1024,
        after / 1024
    );
    assert!(after < before / 10, "{after} bytes left of {before}");
    assert!(store.check_session(small).expect("check").ok());
}

/// (time since start, frames/s) per window.
type Windows = Vec<(Duration, f64)>;

/// Per 500 ms window: (time since start, frames/s) of a recording written as the relay's
/// recorder writes (a synced commit per tick of at most 10 ms or 10,000 frames), over a data dir
/// holding a 2-million-frame old session; with `retain`, retention deletes that session 4 s in,
/// on the recording thread, as the relay's recorder runs it. Returns the windows, when retention
/// ran and how long it held the thread, and the old session's size on disk.
fn record_beside_an_old_session(retain: bool) -> (Windows, Option<(Duration, Duration)>, u64) {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let old = {
        let store = fast(&data);
        let mut w = SessionWriter::new(store.clone());
        let old = write_session(&mut w, 2_000_000, 1);
        drop(w);
        store.flush().expect("flush");
        old
    };
    let size = disk_usage(&data);
    let store = Store::open(&data, StoreOptions::default()).expect("open");
    let mut w = SessionWriter::new(store.clone());
    let live = SessionMeta {
        id: uuid::Uuid::now_v7(),
        route: "live".into(),
        started_ns: 1_000_000_000_000,
        ..SessionMeta::default()
    };
    let id = live.id;
    w.begin(live);
    w.define_channel(id, 0, "a");
    let window = Duration::from_millis(500);
    let (mut seq, mut windows, mut retained) = (0u64, Vec::new(), None);
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(12) {
        let w_start = Instant::now();
        let mut n = 0u64;
        while w_start.elapsed() < window {
            let tick = Instant::now();
            for _ in 0..10_000 {
                w.append(id, &event(0, seq, 1_000_000_000_000 + seq));
                seq += 1;
                n += 1;
                if seq % 256 == 0 && tick.elapsed() >= Duration::from_millis(10) {
                    break;
                }
            }
            w.commit().expect("commit");
        }
        windows.push((start.elapsed(), n as f64 / window.as_secs_f64()));
        if retain && retained.is_none() && start.elapsed() >= Duration::from_secs(4) {
            let t = Instant::now();
            let deleted = store
                .apply_retention(2_000_000_000_000, Some(1_000_000_000), None)
                .expect("retention");
            assert_eq!(deleted, vec![old]);
            retained = Some((start.elapsed(), t.elapsed()));
        }
    }
    if retain {
        store.wait_reclaimed();
        assert!(
            disk_usage(&data) < size + (seq * 140),
            "the old session's space came back"
        );
    }
    (windows, retained, size)
}

/// Recording throughput while retention reclaims a large old session, against the same run
/// without retention. Run with `--ignored --nocapture`.
#[test]
#[ignore = "a measurement: run with --ignored --nocapture"]
fn recording_throughput_while_retention_reclaims_a_large_session() {
    let (control, _, _) = record_beside_an_old_session(false);
    let (windows, retained, size) = record_beside_an_old_session(true);
    let (at, blocked) = retained.expect("retention ran");
    eprintln!("  time   without   with retention (frames/s)");
    for ((t, a), (_, b)) in control.iter().zip(&windows) {
        eprintln!("{:>5.1}s {a:>9.0} {b:>9.0}", t.as_secs_f64());
    }
    let mean = |v: &[(Duration, f64)], after: bool| {
        let v: Vec<f64> = v
            .iter()
            .filter(|w| (w.0 > at) == after)
            .map(|w| w.1)
            .collect();
        v.iter().sum::<f64>() / v.len().max(1) as f64
    };
    eprintln!(
        "old session {} MiB on disk; retention at {:.1}s held the recording thread {blocked:?}; \
         mean frames/s before/after that point: without {:.0}/{:.0}, with {:.0}/{:.0}",
        size >> 20,
        at.as_secs_f64(),
        mean(&control, false),
        mean(&control, true),
        mean(&windows, false),
        mean(&windows, true),
    );
    assert!(
        blocked < Duration::from_secs(2),
        "retention blocked {blocked:?}"
    );
}
