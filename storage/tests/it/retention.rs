//! Deleting sessions gives their disk space back, and a recording goes on while it does (the
//! recording's throughput meanwhile is measured by `storage/benches/retention.rs`).

use std::path::Path;
use std::time::Instant;

use crate::support::*;
use gabp_storage::{SessionId, SessionWriter, Store};

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
