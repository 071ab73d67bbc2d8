//! Storage faults, with the real binary on real files: a data dir with a missing `CURRENT`, a
//! corrupt MANIFEST, table file or write-ahead log. Every case ends the same way: no byte a
//! relay recorded is deleted (by a read command, or by `serve` refusing to start), each refusal
//! is one clear line pointing at `gabp-relay repair`, and `sessions check` exits 1 where data is
//! unreadable; a torn tail after `kill -9` is not damage.

use crate::support::storage::*;

#[tokio::test]
async fn missing_current_is_refused_and_nothing_is_deleted() {
    let (_dir, data) = recorded(Left::Flushed).await;
    assert!(!files_with(&data, |n| n.ends_with(".sst")).is_empty());
    std::fs::remove_file(data.join("CURRENT")).expect("rm CURRENT");
    assert_refused_and_untouched(&data, true).await;
    let d = data.to_str().expect("utf8");
    let out = run(&["sessions", "--data-dir", d]).await;
    assert!(error_line(&out).contains("CURRENT"), "{}", error_line(&out));
    // Repair names the manifest again: the whole recording is back, and sound.
    let out = run(&["repair", "--data-dir", d]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("rewrote CURRENT"));
    let v = sessions(&data).await;
    assert_eq!(v["sessions"][0]["events"].as_u64(), Some(EVENTS), "{v}");
    let check = run(&["sessions", "check", "--data-dir", d]).await;
    assert_eq!(check.status.code(), Some(0));
}

#[tokio::test]
async fn corrupt_manifest_is_refused_and_nothing_is_deleted() {
    let (_dir, data) = recorded(Left::Flushed).await;
    let manifest = files_with(&data, |n| n.starts_with("MANIFEST-"));
    flip_middle(&manifest[0], 16);
    assert_refused_and_untouched(&data, true).await;
}

#[tokio::test]
async fn corrupt_table_is_reported_and_nothing_is_deleted() {
    let (_dir, data) = recorded(Left::Flushed).await;
    let sst = files_with(&data, |n| n.ends_with(".sst"));
    flip_middle(&sst[0], 64);
    // The open cannot see a bad block in the middle of a table: reading it fails instead.
    assert_refused_and_untouched(&data, false).await;
    let check = run(&[
        "sessions",
        "check",
        "--data-dir",
        data.to_str().expect("utf8"),
    ])
    .await;
    let out = String::from_utf8_lossy(&check.stdout);
    assert!(
        out.contains("FAILED") && out.contains("unreadable"),
        "{out}"
    );
    // Every read command that meets the damage says what to run about it.
    let d = data.to_str().expect("utf8");
    for args in [
        vec!["stats", "latest", "--data-dir", d],
        vec!["export", "latest", "--data-dir", d],
        vec![
            "replay",
            "latest",
            "--data-dir",
            d,
            "--listen",
            "127.0.0.1:0",
            "--speed",
            "max",
        ],
    ] {
        let out = run(&args).await;
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let line = error_line(&out);
        assert!(
            line.contains("gabp-relay repair") && line.contains("sessions check"),
            "{args:?}: {line}"
        );
    }
    // Repair cannot rebuild a damaged block: it says so instead of "repaired".
    let out = run(&["repair", "--data-dir", d]).await;
    assert_eq!(out.status.code(), Some(1));
    let line = error_line(&out);
    assert!(
        line.contains("not sound") && line.contains(".bak-"),
        "{line}"
    );
    assert!(!String::from_utf8_lossy(&out.stdout).contains("repaired"));
}

#[tokio::test]
async fn corrupt_write_ahead_log_is_refused_then_repaired_from_a_copy() {
    let (_dir, data) = recorded(Left::Killed).await;
    let wal = files_with(&data, |n| n.ends_with(".log"));
    // The log holds the whole session (its LZ4 chunks are a small part of the raw frames'
    // bytes), so the flip below lands in a record with others after it, not in a torn tail.
    let len = std::fs::metadata(&wal[0]).expect("wal").len();
    assert!(len > 64 << 10, "write-ahead log of {len} bytes");
    flip_middle(&wal[0], 64);
    assert_refused_and_untouched(&data, true).await;

    let before = snapshot(&data, true);
    let out = run(&["repair", "--data-dir", data.to_str().expect("utf8")]).await;
    // Records were dropped to get it open: not a success, and it says what and where the copy is.
    assert_eq!(out.status.code(), Some(1));
    let line = error_line(&out);
    assert!(
        line.contains("write-ahead log records") && line.contains(".bak-"),
        "{line}"
    );
    let said = String::from_utf8_lossy(&out.stdout);
    let backup = said
        .split("copy at ")
        .nth(1)
        .and_then(|s| s.split(" (").next())
        .expect("repair names its copy");
    assert_eq!(
        snapshot(Path::new(backup), true),
        before,
        "the copy is the damaged dir, byte for byte"
    );
    assert!(!said.contains("repaired"), "{said}");
    // Repaired, it opens again: listing works and a relay starts on it.
    let v = sessions(&data).await;
    assert_eq!(v["sessions"].as_array().expect("list").len(), 1, "{said}");
    let mut s = serve("127.0.0.1:1", &data, &[]).await;
    signal(&s, "-TERM");
    assert_eq!(wait_exit(&mut s).await, Some(0));
}

#[tokio::test]
async fn torn_tail_after_kill_is_not_damage() {
    let (_dir, data) = recorded(Left::Killed).await;
    let wal = files_with(&data, |n| n.ends_with(".log"));
    // A commit torn by the crash: a record's header and the start of its payload, as the
    // log's first 100 bytes are (a synced record cut short is not a torn write: see below).
    let head = std::fs::read(&wal[0]).expect("wal")[..100].to_vec();
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&wal[0])
        .expect("wal");
    std::io::Write::write_all(&mut f, &head).expect("append a torn record");
    drop(f);
    let check = run(&[
        "sessions",
        "check",
        "--data-dir",
        data.to_str().expect("utf8"),
    ])
    .await;
    assert_eq!(
        check.status.code(),
        Some(0),
        "{}{}",
        String::from_utf8_lossy(&check.stdout),
        String::from_utf8_lossy(&check.stderr)
    );
    let mut s = serve("127.0.0.1:1", &data, &[]).await;
    signal(&s, "-TERM");
    assert_eq!(wait_exit(&mut s).await, Some(0));
    let v = sessions(&data).await;
    assert_eq!(v["sessions"][0]["end"], "crash");
    let check = run(&[
        "sessions",
        "check",
        "--data-dir",
        data.to_str().expect("utf8"),
    ])
    .await;
    assert_eq!(check.status.code(), Some(0));
}

/// A write-ahead log that went missing, or was cut short, after a crash reads as a smaller
/// recording to RocksDB (a live log is in no MANIFEST): the committed mark makes every command
/// refuse it, and `repair` says how much is gone (exit 1) and leaves a dir that opens.
#[tokio::test]
async fn a_missing_or_shortened_write_ahead_log_is_refused_and_repair_says_what_is_gone() {
    let (_dir, data) = recorded(Left::Killed).await;
    let wal = files_with(&data, |n| n.ends_with(".log"));
    let len = std::fs::metadata(&wal[0]).expect("wal").len();
    let short = data.with_file_name("short");
    std::process::Command::new("cp")
        .arg("-a")
        .arg(&data)
        .arg(&short)
        .status()
        .expect("cp");
    std::fs::remove_file(&wal[0]).expect("rm the log");
    let cut = short.join(wal[0].file_name().expect("name"));
    std::fs::OpenOptions::new()
        .write(true)
        .open(&cut)
        .expect("wal")
        .set_len(len / 10)
        .expect("cut short");
    for d in [&data, &short] {
        assert_refused_and_untouched(d, true).await;
        let out = run(&["sessions", "--data-dir", d.to_str().expect("utf8")]).await;
        assert!(
            error_line(&out).contains("committed write(s) are missing"),
            "{}",
            error_line(&out)
        );
    }
    let out = run(&["repair", "--data-dir", data.to_str().expect("utf8")]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        error_line(&out).contains("committed write(s) are missing"),
        "{}",
        error_line(&out)
    );
    let v = sessions(&data).await;
    assert!(v["sessions"].as_array().is_some(), "{v}");
}

/// A clean stop leaves the recording in table files: a table-only rebuild (or a lost log)
/// loses nothing of it.
#[tokio::test]
async fn a_clean_stop_leaves_the_recording_in_tables() {
    let (_dir, data) = recorded(Left::Stopped).await;
    for wal in files_with(&data, |n| n.ends_with(".log")) {
        std::fs::remove_file(wal).expect("rm the log");
    }
    let v = sessions(&data).await;
    assert_eq!(v["sessions"][0]["events"].as_u64(), Some(EVENTS), "{v}");
    assert_eq!(v["sessions"][0]["end"], "relay_shutdown", "{v}");
}

#[tokio::test]
async fn repair_of_a_dir_that_is_no_data_dir_changes_nothing_and_fails() {
    let dir = tempfile::tempdir().expect("tempdir");
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).expect("mkdir");
    let other = dir.path().join("photos");
    std::fs::create_dir(&other).expect("mkdir");
    std::fs::write(other.join("cat.jpg"), b"not a database").expect("write");
    // A dir of a program's own logs: `app.log` is no RocksDB write-ahead log (`000012.log`).
    let logs = dir.path().join("logs");
    std::fs::create_dir(&logs).expect("mkdir");
    std::fs::write(logs.join("app.log"), b"started\n").expect("write");
    // Plain names RocksDB also uses do not make a data dir either.
    std::fs::write(logs.join("LOG"), b"started\n").expect("write");
    std::fs::write(logs.join("LOCK"), b"").expect("write");
    for d in [&empty, &other, &logs] {
        let before: Vec<_> = std::fs::read_dir(dir.path())
            .expect("ls")
            .map(|e| e.expect("entry").file_name())
            .collect();
        let out = run(&["repair", "--data-dir", d.to_str().expect("utf8")]).await;
        assert_eq!(out.status.code(), Some(1), "{}", d.display());
        let line = error_line(&out);
        assert!(line.contains("not a gabp-relay data dir"), "{line}");
        // No database created inside it, no backup beside it.
        let after: Vec<_> = std::fs::read_dir(dir.path())
            .expect("ls")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(before, after);
        assert!(!d.join("CURRENT").exists());
    }
    assert_eq!(std::fs::read_dir(&empty).expect("ls").count(), 0);
    // Nor does any other command send its user to a repair that cannot help.
    let d = other.to_str().expect("utf8");
    for args in [
        vec!["sessions", "--data-dir", d],
        vec!["stats", "latest", "--data-dir", d],
        vec!["export", "latest", "--data-dir", d],
        vec!["sessions", "check", "--data-dir", d],
    ] {
        let out = run(&args).await;
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let line = error_line(&out);
        assert!(
            line.contains("not a gabp-relay data dir") && !line.contains("repair"),
            "{args:?}: {line}"
        );
    }
    assert_eq!(std::fs::read_dir(&other).expect("ls").count(), 1);
}
