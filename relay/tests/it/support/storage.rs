//! What the storage-fault tests share: a recorded data dir left in a chosen state, `serve`
//! recording into a data dir, snapshots of its files, byte flips, and the check that every
//! read command refuses a damaged dir in one line without changing it.

pub use std::collections::BTreeMap;
pub use std::os::unix::fs::PermissionsExt;
pub use std::path::{Path, PathBuf};
pub use std::process::Stdio;
pub use std::time::{Duration, Instant};

pub use gabp_sim::{ModSim, ModSimConfig};
pub use tokio::io::{AsyncBufReadExt, BufReader};
pub use tokio::process::{Child, Command};

pub use super::{output as run, relay, BIN};

pub const EVENTS: u64 = 20_000;

/// The one line a failed command printed (tracing lines of `serve` excluded).
pub fn error_line(out: &std::process::Output) -> String {
    let err = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("gabp-relay:"))
        .collect();
    assert_eq!(lines.len(), 1, "exactly one error line: {err}");
    lines[0].to_string()
}

/// Starts `serve` recording into `data`; returns once it printed its start-up lines.
pub async fn serve(upstream: &str, data: &Path, extra: &[&str]) -> Child {
    let mut child = relay()
        .args([
            "serve",
            "--upstream",
            upstream,
            "--upstream-token",
            super::MOD_TOKEN,
            "--listen",
            "127.0.0.1:0",
            "--token",
            super::BRIDGE_TOKEN,
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

pub fn signal(child: &Child, sig: &str) {
    let pid = child.id().expect("running").to_string();
    std::process::Command::new("kill")
        .args([sig, &pid])
        .status()
        .expect("kill");
}

pub async fn wait_exit(child: &mut Child) -> Option<i32> {
    tokio::time::timeout(Duration::from_secs(20), child.wait())
        .await
        .expect("exits in time")
        .expect("status")
        .code()
}

/// `sessions --json` of `data`, read-only while a relay may be recording.
pub async fn sessions(data: &Path) -> serde_json::Value {
    json_of(&[
        "sessions",
        "--json",
        "--data-dir",
        data.to_str().expect("utf8"),
    ])
    .await
}

/// The JSON document a command that must succeed prints (`stats --json`, `sessions --json`).
pub async fn json_of(args: &[&str]) -> serde_json::Value {
    let out = run(args).await;
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("json")
}

pub async fn wait_for_events(data: &Path, n: u64) {
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
pub enum Left {
    /// `kill -9` mid-session: everything is in the write-ahead log.
    Killed,
    /// Stopped, then opened again by a relay: everything is in table files.
    Flushed,
    /// Stopped once (SIGTERM).
    Stopped,
}

/// A data dir holding one session of [`EVENTS`] events.
pub async fn recorded(left: Left) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let sim = ModSim::start(
        &"127.0.0.1:0".parse().expect("addr"),
        ModSimConfig {
            token: super::MOD_TOKEN.into(),
            // Paced, so the recording is many commits (one per 10 ms tick): a fault placed in
            // the middle of the write-ahead log then lands after the session's first record.
            // At full rate a large read burst could put half the session in one commit.
            rate: Some(50_000.0),
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
            // Killed once the relay has marked its commits (about once a second), as a relay
            // that ran for any time has.
            let deadline = Instant::now() + Duration::from_secs(30);
            while !data.join("COMMITTED").exists() {
                assert!(Instant::now() < deadline, "no committed mark");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            signal(&child, "-KILL");
            wait_exit(&mut child).await;
        }
        Left::Stopped => {
            signal(&child, "-TERM");
            assert_eq!(wait_exit(&mut child).await, Some(0));
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
pub fn snapshot(data: &Path, with_info_log: bool) -> BTreeMap<String, (u64, u64)> {
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

pub fn files_with(data: &Path, pred: impl Fn(&str) -> bool) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(data)
        .expect("read dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| pred(&p.file_name().expect("name").to_string_lossy()))
        .collect();
    v.sort_by_key(|p| std::cmp::Reverse(std::fs::metadata(p).expect("meta").len()));
    v
}

/// Flips `n` bytes in the middle of `path`.
pub fn flip_middle(path: &Path, n: usize) {
    let mut b = std::fs::read(path).expect("read");
    let (mid, end) = (b.len() / 2, (b.len() / 2 + n).min(b.len()));
    for x in &mut b[mid..end] {
        *x ^= 0x5a;
    }
    std::fs::write(path, b).expect("write");
}

/// Runs every read command and a refused `serve` against a damaged `data`, checking that
/// nothing recorded changes and that each refusal is one clear line.
pub async fn assert_refused_and_untouched(data: &Path, serve_refuses: bool) {
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
                    super::BRIDGE_TOKEN,
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

pub fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).expect("meta").permissions().mode() & 0o777
}
