//! A measurement, not a test: recording throughput, per 500 ms window, while retention reclaims
//! a large old session, against the same recording without retention. Prints the table
//! (BENCHMARKS.md). About half a minute: `cargo bench --workspace --bench retention`.

#[path = "../tests/it/support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use gabp_storage::{SessionMeta, SessionWriter, Store, StoreOptions};
use support::*;

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` runs this too, and there it only
    // has to build.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    recording_throughput_while_retention_reclaims_a_large_session();
}

/// (time since start, frames/s) per window.
type Windows = Vec<(Duration, f64)>;

/// Per 500 ms window: (time since start, frames/s) of a recording written as the relay's
/// recorder writes (a synced commit per tick of at most 10 ms or 10,000 frames), over a data dir
/// holding a 2-million-frame old session; with `retain`, retention deletes the old session after 4 s,
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
/// without retention.
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
