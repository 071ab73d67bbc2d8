//! Storage faults, with the real binary on real files: a data dir with a missing `CURRENT`, a
//! corrupt MANIFEST, table file or write-ahead log. Every case ends the same way: no byte a
//! relay recorded is deleted (by a read command, or by `serve` refusing to start), each refusal
//! is one clear line pointing at `gabp-relay repair`, and `sessions check` exits 1 where data is
//! unreadable. Also: read commands never create a data dir, the data dir and its files are
//! private, unsafe data dirs are refused, `sessions rm` names the recording relay, `repair`
//! copies before it touches anything, and `export -o` never damages its target.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use gabp_sim::{ModSim, ModSimConfig};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

const BIN: &str = env!("CARGO_BIN_EXE_gabp-relay");
const EVENTS: u64 = 20_000;

fn relay() -> Command {
    let mut c = Command::new(BIN);
    c.env_remove("GABP_RELAY_TOKEN")
        .env_remove("GABP_RELAY_DATA_DIR")
        .kill_on_drop(true);
    c
}

async fn run(args: &[&str]) -> std::process::Output {
    tokio::time::timeout(Duration::from_secs(60), relay().args(args).output())
        .await
        .expect("command finished")
        .expect("ran")
}

/// The one line a failed command printed (tracing lines of `serve` excluded).
fn error_line(out: &std::process::Output) -> String {
    let err = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("gabp-relay:"))
        .collect();
    assert_eq!(lines.len(), 1, "exactly one error line: {err}");
    lines[0].to_string()
}

/// Starts `serve` recording into `data`; returns once it printed its start-up lines.
async fn serve(upstream: &str, data: &Path, extra: &[&str]) -> Child {
    let mut child = relay()
        .args([
            "serve",
            "--upstream",
            upstream,
            "--upstream-token",
            "m",
            "--listen",
            "127.0.0.1:0",
            "--token",
            "t",
            "--no-bridge-file",
        ])
        .args(extra)
        .arg("--data-dir")
        .arg(data)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(l) = lines.next_line().await.expect("stdout") {
            if l.starts_with("recording") {
                return;
            }
        }
        panic!("serve exited before recording");
    })
    .await
    .expect("serve started");
    child
}

fn signal(child: &Child, sig: &str) {
    let pid = child.id().expect("running").to_string();
    std::process::Command::new("kill")
        .args([sig, &pid])
        .status()
        .expect("kill");
}

async fn wait_exit(child: &mut Child) -> Option<i32> {
    tokio::time::timeout(Duration::from_secs(20), child.wait())
        .await
        .expect("exits in time")
        .expect("status")
        .code()
}

/// `sessions --json` of `data`, read-only while a relay may be recording.
async fn sessions(data: &Path) -> serde_json::Value {
    let out = run(&[
        "sessions",
        "--json",
        "--data-dir",
        data.to_str().expect("utf8"),
    ])
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("json")
}

async fn wait_for_events(data: &Path, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let v = sessions(data).await;
        if v["sessions"][0]["events"].as_u64() == Some(n) {
            return;
        }
        assert!(Instant::now() < deadline, "never recorded {n} events: {v}");
    }
}

/// How the recording was left.
#[derive(Clone, Copy, PartialEq)]
enum Left {
    /// `kill -9` mid-session: everything is in the write-ahead log.
    Killed,
    /// Stopped, then opened again by a relay: everything is in table files.
    Flushed,
}

/// A data dir holding one session of [`EVENTS`] events.
async fn recorded(left: Left) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let sim = ModSim::start(
        &"127.0.0.1:0".parse().expect("addr"),
        ModSimConfig {
            token: "m".into(),
            rate: None,
            payload_bytes: 512,
            max_events: Some(EVENTS),
            ..ModSimConfig::default()
        },
    )
    .expect("mod");
    let mut child = serve(&sim.addr().to_string(), &data, &[]).await;
    wait_for_events(&data, EVENTS).await;
    match left {
        Left::Killed => {
            signal(&child, "-KILL");
            wait_exit(&mut child).await;
        }
        Left::Flushed => {
            signal(&child, "-TERM");
            assert_eq!(wait_exit(&mut child).await, Some(0));
            // A relay opening it again replays the log into table files.
            let mut again = serve("127.0.0.1:1", &data, &[]).await;
            signal(&again, "-TERM");
            assert_eq!(wait_exit(&mut again).await, Some(0));
        }
    }
    sim.stop();
    (dir, data)
}

/// Every file of the data dir with its contents' hash (and size).
fn snapshot(data: &Path, with_info_log: bool) -> BTreeMap<String, (u64, u64)> {
    use std::hash::{Hash, Hasher};
    let mut out = BTreeMap::new();
    for e in std::fs::read_dir(data).expect("read dir") {
        let e = e.expect("entry");
        let name = e.file_name().to_string_lossy().into_owned();
        if !with_info_log && name.starts_with("LOG") {
            continue;
        }
        let bytes = std::fs::read(e.path()).expect("read file");
        let mut h = std::collections::hash_map::DefaultHasher::new();
        bytes.hash(&mut h);
        out.insert(name, (bytes.len() as u64, h.finish()));
    }
    out
}

fn files_with(data: &Path, pred: impl Fn(&str) -> bool) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(data)
        .expect("read dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| pred(&p.file_name().expect("name").to_string_lossy()))
        .collect();
    v.sort_by_key(|p| std::cmp::Reverse(std::fs::metadata(p).expect("meta").len()));
    v
}

/// Flips `n` bytes in the middle of `path`.
fn flip_middle(path: &Path, n: usize) {
    let mut b = std::fs::read(path).expect("read");
    let (mid, end) = (b.len() / 2, (b.len() / 2 + n).min(b.len()));
    for x in &mut b[mid..end] {
        *x ^= 0x5a;
    }
    std::fs::write(path, b).expect("write");
}

/// Runs every read command and a refused `serve` against a damaged `data`, checking that
/// nothing recorded changes and that each refusal is one clear line.
async fn assert_refused_and_untouched(data: &Path, serve_refuses: bool) {
    let d = data.to_str().expect("utf8");
    let before = snapshot(data, true);
    for _ in 0..2 {
        let out = run(&["sessions", "--data-dir", d]).await;
        if !out.status.success() {
            assert_eq!(out.status.code(), Some(1));
            assert!(error_line(&out).contains("repair"), "{}", error_line(&out));
        }
    }
    let check = run(&["sessions", "check", "--data-dir", d]).await;
    assert_eq!(
        check.status.code(),
        Some(1),
        "sessions check must fail on unreadable data: {}",
        String::from_utf8_lossy(&check.stdout)
    );
    error_line(&check);
    let out_file = data.parent().expect("parent").join("export.jsonl");
    for args in [
        vec!["stats", "latest", "--data-dir", d],
        vec![
            "export",
            "latest",
            "--data-dir",
            d,
            "-o",
            out_file.to_str().expect("utf8"),
        ],
    ] {
        let out = run(&args).await;
        assert_eq!(out.status.code(), Some(1), "{args:?} fails");
        error_line(&out);
    }
    assert_eq!(
        snapshot(data, true),
        before,
        "read commands changed the data dir"
    );
    if serve_refuses {
        let out = tokio::time::timeout(
            Duration::from_secs(30),
            relay()
                .args([
                    "serve",
                    "--upstream",
                    "127.0.0.1:1",
                    "--listen",
                    "127.0.0.1:0",
                    "--token",
                    "t",
                    "--no-bridge-file",
                    "--data-dir",
                    d,
                ])
                .output(),
        )
        .await
        .expect("serve gave up in time")
        .expect("ran");
        assert_eq!(out.status.code(), Some(1));
        let line = error_line(&out);
        assert!(line.contains("gabp-relay repair"), "{line}");
        // RocksDB's own info log rotates; every other file is exactly as it was.
        let (mut a, mut b) = (snapshot(data, false), before.clone());
        b.retain(|k, _| !k.starts_with("LOG"));
        a.retain(|k, _| !k.starts_with("LOG"));
        assert_eq!(a, b, "serve changed a damaged data dir");
    }
}

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
    assert!(std::fs::metadata(&wal[0]).expect("wal").len() > 1 << 20);
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
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&wal[0])
        .expect("wal");
    let len = f.metadata().expect("meta").len();
    f.set_len(len - 100).expect("truncate mid-record");
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

#[tokio::test]
async fn read_commands_never_create_a_data_dir() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("nothing-here");
    let d = data.to_str().expect("utf8");
    for args in [
        vec!["sessions", "--data-dir", d],
        vec!["sessions", "check", "--data-dir", d],
        vec!["sessions", "rm", "latest", "--data-dir", d],
        vec!["stats", "latest", "--data-dir", d],
        vec!["export", "latest", "--data-dir", d],
        vec![
            "replay",
            "latest",
            "--data-dir",
            d,
            "--listen",
            "127.0.0.1:0",
        ],
        vec!["repair", "--data-dir", d],
    ] {
        let out = run(&args).await;
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        assert_eq!(error_line(&out), format!("gabp-relay: no data dir at {d}"));
        assert!(!data.exists(), "{args:?} created the data dir");
    }
}

#[tokio::test]
async fn sessions_rm_while_recording_names_the_relay() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let sim = ModSim::start(
        &"127.0.0.1:0".parse().expect("addr"),
        ModSimConfig {
            token: "m".into(),
            max_events: Some(100),
            ..ModSimConfig::default()
        },
    )
    .expect("mod");
    let mut child = serve(&sim.addr().to_string(), &data, &[]).await;
    wait_for_events(&data, 100).await;
    let out = run(&[
        "sessions",
        "rm",
        "latest",
        "--data-dir",
        data.to_str().expect("utf8"),
    ])
    .await;
    assert_eq!(out.status.code(), Some(1));
    let line = error_line(&out);
    let pid = child.id().expect("running");
    assert!(
        line.contains("in use") && line.contains(&format!("pid {pid}")),
        "{line}"
    );
    signal(&child, "-TERM");
    assert_eq!(wait_exit(&mut child).await, Some(0));
    sim.stop();
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).expect("meta").permissions().mode() & 0o777
}

#[tokio::test]
async fn data_dir_and_files_are_private_and_unsafe_dirs_are_refused() {
    let (dir, data) = recorded(Left::Killed).await;
    assert_eq!(mode(&data), 0o700);
    for e in std::fs::read_dir(&data).expect("dir") {
        let p = e.expect("entry").path();
        assert_eq!(mode(&p), 0o600, "{} is {:o}", p.display(), mode(&p));
    }
    let try_serve = |d: PathBuf, extra: Vec<&'static str>| async move {
        tokio::time::timeout(
            Duration::from_secs(30),
            relay()
                .args([
                    "serve",
                    "--upstream",
                    "127.0.0.1:1",
                    "--listen",
                    "127.0.0.1:0",
                    "--token",
                    "t",
                    "--no-bridge-file",
                ])
                .args(extra)
                .arg("--data-dir")
                .arg(d)
                .output(),
        )
        .await
        .expect("in time")
        .expect("ran")
    };
    // Writable by others.
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let out = try_serve(data.clone(), vec![]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(error_line(&out).contains("writable by group or others"));
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    // A symlink, unless allowed.
    let link = dir.path().join("link");
    std::os::unix::fs::symlink(&data, &link).expect("symlink");
    let out = try_serve(link.clone(), vec![]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(error_line(&out).contains("symlink"));
    let mut s = serve("127.0.0.1:1", &link, &["--allow-symlinked-data-dir"]).await;
    signal(&s, "-TERM");
    assert_eq!(wait_exit(&mut s).await, Some(0));
    // Owned by someone else (only checkable as root, which may chown).
    let other = dir.path().join("other");
    std::fs::create_dir(&other).expect("mkdir");
    std::fs::set_permissions(&other, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    if std::os::unix::fs::chown(&other, Some(65534), Some(65534)).is_ok() {
        let out = try_serve(other.clone(), vec![]).await;
        assert_eq!(out.status.code(), Some(1));
        assert!(error_line(&out).contains("owned by uid 65534"));
    } else {
        eprintln!("SKIPPED: cannot chown (not root): foreign owner not checked");
    }
}

#[tokio::test]
async fn export_to_a_file_is_atomic_private_and_does_not_follow_symlinks() {
    let (dir, data) = recorded(Left::Killed).await;
    let d = data.to_str().expect("utf8");
    let target = dir.path().join("out.jsonl");
    std::fs::write(&target, b"keep me").expect("write");
    let out = run(&[
        "export",
        "latest",
        "--data-dir",
        d,
        "--channel",
        "no/such",
        "-o",
        target.to_str().expect("utf8"),
    ])
    .await;
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(std::fs::read(&target).expect("read"), b"keep me");
    // A symlink at FILE is replaced, never written through.
    let victim = dir.path().join("victim");
    std::fs::write(&victim, b"precious").expect("write");
    let link = dir.path().join("link.jsonl");
    std::os::unix::fs::symlink(&victim, &link).expect("symlink");
    let out = run(&[
        "export",
        "latest",
        "--data-dir",
        d,
        "-o",
        link.to_str().expect("utf8"),
    ])
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(std::fs::read(&victim).expect("read"), b"precious");
    assert!(!std::fs::symlink_metadata(&link)
        .expect("meta")
        .file_type()
        .is_symlink());
    assert_eq!(mode(&link), 0o600);
    let lines = std::fs::read_to_string(&link)
        .expect("read")
        .lines()
        .count() as u64;
    assert!(lines >= EVENTS, "{lines} lines");
    let leftovers = files_with(dir.path(), |n| n.starts_with(".gabp-export-"));
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

/// A relay killed before any flush (everything in the write-ahead log) with its MANIFEST
/// destroyed: RocksDB's own repair knows only the default column family and sets the log
/// aside, so `repair` must not call that a success. It exits 1 with one line naming what was
/// lost and the untouched copy, never advises running itself, and leaves the dir private.
#[tokio::test]
async fn repair_that_loses_data_says_so_and_keeps_the_dir_private() {
    let (_dir, data) = recorded(Left::Killed).await;
    assert!(files_with(&data, |n| n.ends_with(".sst")).is_empty());
    let manifest = files_with(&data, |n| n.starts_with("MANIFEST-"));
    let noise: Vec<u8> = (0..100u32).map(|i| (i * 97 + 13) as u8).collect();
    std::fs::write(&manifest[0], noise).expect("overwrite manifest");
    let out = run(&["repair", "--data-dir", data.to_str().expect("utf8")]).await;
    let said = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{said}");
    let line = error_line(&out);
    assert!(
        line.contains("could not recover") && line.contains(".bak-"),
        "{line}"
    );
    assert!(!said.contains("repaired"), "{said}");
    assert!(!said.contains("gabp-relay repair"), "{said}");
    let backup = line.split("copy is at ").nth(1).expect("names the copy");
    assert!(Path::new(backup.trim()).is_dir(), "{backup}");
    // Whatever repair created is as private as the relay keeps its data dir.
    fn walk(p: &Path) {
        let m = mode(p);
        if p.is_dir() {
            assert_eq!(m, 0o700, "{}", p.display());
            for e in std::fs::read_dir(p).expect("read dir") {
                walk(&e.expect("entry").path());
            }
        } else {
            assert_eq!(m, 0o600, "{}", p.display());
        }
    }
    walk(&data);
}

/// Files left readable by others (an older relay, a manual copy, a repair run without the
/// private umask) are made private when a relay opens the dir to record.
#[tokio::test]
async fn serve_makes_files_it_finds_readable_by_others_private() {
    let (_dir, data) = recorded(Left::Flushed).await;
    let lost = data.join("lost");
    std::fs::create_dir(&lost).expect("mkdir lost");
    std::fs::write(lost.join("000001.log"), b"set aside").expect("write");
    let open = |p: &Path, m: u32| {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).expect("chmod")
    };
    open(&data, 0o755);
    open(&lost, 0o755);
    for e in std::fs::read_dir(&data).expect("dir") {
        let p = e.expect("entry").path();
        if p.is_file() {
            open(&p, 0o644);
        }
    }
    open(&lost.join("000001.log"), 0o644);
    let mut s = serve("127.0.0.1:1", &data, &[]).await;
    signal(&s, "-TERM");
    assert_eq!(wait_exit(&mut s).await, Some(0));
    fn walk(p: &Path) {
        if p.is_dir() {
            assert_eq!(mode(p), 0o700, "{}", p.display());
            for e in std::fs::read_dir(p).expect("read dir") {
                walk(&e.expect("entry").path());
            }
        } else {
            assert_eq!(mode(p), 0o600, "{}", p.display());
        }
    }
    walk(&data);
}
