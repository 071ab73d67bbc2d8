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
    eprintln!("data dir: {} KiB before, {} KiB after", before / 1024, after / 1024);
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

/// Measures a recording's throughput (as the relay's recorder writes: a synced commit every
/// 10 ms) before, while and after retention deletes a 2-million-frame session on the same
/// thread, as the relay's recorder runs it. Run with `--ignored --nocapture`.
#[test]
#[ignore = "a measurement: run with --ignored --nocapture"]
fn recording_throughput_while_retention_reclaims_a_large_session() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let (old, _) = {
        let store = fast(&data);
        let mut w = SessionWriter::new(store.clone());
        let old = write_session(&mut w, 2_000_000, 1);
        drop(w);
        store.flush().expect("flush");
        (old, ())
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
    let (mut seq, mut windows) = (0u64, Vec::new());
    let start = Instant::now();
    let mut retained = None;
    while start.elapsed() < Duration::from_secs(12) {
        let w_start = Instant::now();
        let mut n = 0u64;
        while w_start.elapsed() < window {
            let tick = Instant::now();
            // One 10 ms tick's worth at up to 1 M frames/s.
            while tick.elapsed() < Duration::from_millis(10) && n % 10_000 != 9_999 {
                w.append(id, &event(0, seq, 1_000_000_000_000 + seq));
                seq += 1;
                n += 1;
            }
            w.commit().expect("commit");
            n += 0;
        }
        windows.push((start.elapsed(), n as f64 / window.as_secs_f64()));
        if retained.is_none() && start.elapsed() >= Duration::from_secs(4) {
            let t = Instant::now();
            let deleted = store
                .apply_retention(2_000_000_000_000, Some(1_000_000_000), None)
                .expect("retention");
            assert_eq!(deleted, vec![old]);
            retained = Some((start.elapsed(), t.elapsed()));
        }
    }
    let (at, blocked) = retained.expect("retention ran");
    let t = Instant::now();
    store.wait_reclaimed();
    let waited = t.elapsed();
    for (t, rate) in &windows {
        eprintln!("{:>6.1}s  {:>9.0} frames/s", t.as_secs_f64(), rate);
    }
    let mean = |f: &dyn Fn(Duration) -> bool| {
        let v: Vec<f64> = windows.iter().filter(|w| f(w.0)).map(|w| w.1).collect();
        v.iter().sum::<f64>() / v.len().max(1) as f64
    };
    eprintln!(
        "old session: {} MiB on disk; retention at {:.1}s blocked the recorder {blocked:?}; \
         reclaim finished {waited:?} after the run; mean before {:.0}/s, after {:.0}/s; \
         data dir now {} MiB",
        size >> 20,
        at.as_secs_f64(),
        mean(&|t| t <= at),
        mean(&|t| t > at),
        disk_usage(&data) >> 20
    );
    assert!(blocked < Duration::from_secs(2), "retention blocked {blocked:?}");
}
