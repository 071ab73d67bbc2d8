//! Deleting sessions in bulk, through the real binary: `sessions` only lists (`--retain` there
//! is a usage error that deletes nothing), `sessions prune --retain SIZE|AGE` lists exactly
//! what it deletes (`--dry-run` deletes nothing), refuses a data dir a relay holds, and
//! `serve --retain` logs every session it deletes.

use std::collections::BTreeSet;

use crate::support::*;

/// A data dir with `n` sessions recorded by `demo`, each about a second long.
async fn recorded(n: usize) -> tempfile::TempDir {
    recorded_for(n, "1s").await
}

/// A data dir with `n` sessions recorded by `demo`, each `long`, one after another (so each
/// ended at least that long after the one before).
async fn recorded_for(n: usize, long: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let d = data.to_str().expect("utf-8");
    for _ in 0..n {
        let out = output(&[
            "demo",
            "--duration",
            long,
            "--rate",
            "2000",
            "--bridges",
            "1",
            "--data-dir",
            d,
        ])
        .await;
        assert!(
            out.status.success(),
            "demo: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    dir
}

fn data_of(dir: &tempfile::TempDir) -> String {
    dir.path().join("data").to_str().expect("utf-8").to_string()
}

/// `sessions --json`: the sessions, oldest first.
async fn listed(d: &str) -> Vec<serde_json::Value> {
    let out = output(&["sessions", "--json", "--data-dir", d]).await;
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    json(&out)["sessions"].as_array().expect("list").clone()
}

fn ids(sessions: &[serde_json::Value]) -> Vec<String> {
    sessions
        .iter()
        .map(|s| s["id"].as_str().expect("id").to_string())
        .collect()
}

/// The session ids on the rows of a `sessions prune` table.
fn table_ids(stdout: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|w| uuid::Uuid::parse_str(w).is_ok())
        .map(str::to_string)
        .collect()
}

/// The data dir's files other than RocksDB's info logs, with their sizes and contents.
fn files(d: &str) -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<(String, Vec<u8>)> = std::fs::read_dir(d)
        .expect("data dir")
        .map(|e| {
            let e = e.expect("entry");
            let name = e.file_name().to_string_lossy().into_owned();
            (name, std::fs::read(e.path()).unwrap_or_default())
        })
        .filter(|(n, _)| !n.starts_with("LOG"))
        .collect();
    v.sort();
    v
}

#[tokio::test]
async fn sessions_never_deletes_and_prune_lists_exactly_what_it_deletes() {
    let dir = recorded(3).await;
    let d = &data_of(&dir);
    let all = listed(d).await;
    assert_eq!(all.len(), 3);
    let before = files(d);

    // The listing does not take --retain: exit 2, one line naming prune, nothing deleted.
    for args in [
        &["sessions", "--retain", "1KiB", "--data-dir", d][..],
        &["sessions", "--data-dir", d, "--retain"],
        &["sessions", "--retain", "7d", "--json", "--data-dir", d],
    ] {
        let out = output(args).await;
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = one_line(&out);
        assert!(err.contains("gabp-relay sessions prune --retain"), "{err}");
        assert!(out.stdout.is_empty(), "{args:?} printed a listing");
    }
    // No other read command deletes either: each takes no --retain.
    for cmd in [
        &["stats", "latest"][..],
        &["export", "latest"],
        &["report", "latest"],
        &["replay", "latest"],
        &["sessions", "check"],
        &["status"],
    ] {
        let mut args = cmd.to_vec();
        args.extend(["--retain", "1KiB", "--data-dir", d]);
        let out = output(&args).await;
        assert_eq!(out.status.code(), Some(2), "{args:?}");
    }
    assert_eq!(files(d), before, "a refused command changed the data dir");
    assert_eq!(ids(&listed(d).await), ids(&all));

    // A dry run lists all three (1 KiB holds none of them) and deletes nothing.
    let out = output(&[
        "sessions",
        "prune",
        "--retain",
        "1KiB",
        "--dry-run",
        "--data-dir",
        d,
    ])
    .await;
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(table_ids(&out.stdout), ids(&all), "{text}");
    assert!(text.contains("would delete 3 sessions"), "{text}");
    assert!(text.contains("nothing deleted (--dry-run)"), "{text}");
    assert!(text.contains("over size"), "{text}");
    assert_eq!(ids(&listed(d).await), ids(&all), "a dry run deleted");

    // A cap of the newest session's size: the two oldest go, listed with route, start and
    // size; `sessions` shows the newest alone afterwards.
    let newest = all[2]["bytes"].as_u64().expect("bytes");
    let cap = format!("{newest}B");
    let out = output(&["sessions", "prune", "--retain", &cap, "--data-dir", d]).await;
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(table_ids(&out.stdout), ids(&all[..2]), "{text}");
    for s in &all[..2] {
        let row = text
            .lines()
            .find(|l| l.starts_with(s["id"].as_str().expect("id")))
            .expect("row");
        assert!(row.contains(s["route"].as_str().expect("route")), "{row}");
        assert!(
            row.contains(s["startedAt"].as_str().expect("start")),
            "{row}"
        );
        assert!(row.ends_with("over size"), "{row}");
    }
    let gone: u64 = all[..2]
        .iter()
        .map(|s| s["bytes"].as_u64().expect("b"))
        .sum();
    let summary = text.lines().last().expect("summary");
    assert!(summary.starts_with("deleted 2 sessions"), "{summary}");
    assert!(summary.contains("on disk before"), "{summary}");
    assert_eq!(ids(&listed(d).await), ids(&all[2..]));

    // Nothing over the cap any more: nothing deleted, said so; --json is one document.
    let out = output(&[
        "sessions",
        "prune",
        "--retain",
        &cap,
        "--json",
        "--data-dir",
        d,
    ])
    .await;
    assert_eq!(out.status.code(), Some(0));
    let v = json(&out);
    assert_eq!(v["count"], 0, "{v}");
    assert_eq!(v["dryRun"], false, "{v}");
    assert_eq!(v["recordedBytesBefore"], newest, "{v}");
    assert_eq!(ids(&listed(d).await), ids(&all[2..]));
    eprintln!(
        "pruned {gone} recorded bytes; {}",
        String::from_utf8_lossy(summary.as_bytes())
    );
}

#[tokio::test]
async fn prune_by_age_deletes_only_sessions_ended_longer_ago() {
    let dir = recorded_for(3, "2s").await;
    let d = &data_of(&dir);
    let all = listed(d).await;
    let ended = |s: &serde_json::Value| s["endedNs"].as_u64().expect("ended");
    assert!(ended(&all[1]) + 1_900_000_000 <= ended(&all[2]), "{all:?}");
    // Older than the newest session by a second, counted just before the command runs: the
    // two before it ended two seconds or more earlier than it did.
    let age_now = || {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_nanos() as u64;
        format!("{}ms", (now - ended(&all[2])) / 1_000_000 + 1000)
    };
    let age = age_now();
    let out = output(&[
        "sessions",
        "prune",
        "--retain",
        &age,
        "--dry-run",
        "--json",
        "--data-dir",
        d,
    ])
    .await;
    assert_eq!(out.status.code(), Some(0));
    let v = json(&out);
    assert_eq!(v["dryRun"], true, "{v}");
    assert_eq!(ids(v["sessions"].as_array().expect("list")), ids(&all[..2]));
    assert_eq!(v["sessions"][0]["why"], "over age", "{v}");
    assert!(v["diskBytesAfter"].is_null(), "{v}");
    assert_eq!(listed(d).await.len(), 3, "a dry run deleted");

    let age = age_now();
    let out = output(&[
        "sessions",
        "prune",
        "--retain",
        &age,
        "--json",
        "--data-dir",
        d,
    ])
    .await;
    assert_eq!(out.status.code(), Some(0));
    let v = json(&out);
    assert_eq!(ids(v["sessions"].as_array().expect("list")), ids(&all[..2]));
    let gone: u64 = all[..2]
        .iter()
        .map(|s| s["bytes"].as_u64().expect("b"))
        .sum();
    assert_eq!(v["bytes"], gone, "{v}");
    let (before, after) = (
        v["diskBytesBefore"].as_u64().expect("before"),
        v["diskBytesAfter"].as_u64().expect("after"),
    );
    eprintln!("data dir on disk: {before} bytes before, {after} after");
    assert_eq!(ids(&listed(d).await), ids(&all[2..]));

    // Both at once, as serve takes them; a retention with neither is a usage error.
    let out = output(&["sessions", "prune", "--retain", "1ms,1KiB", "--data-dir", d]).await;
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(table_ids(&out.stdout), ids(&all[2..]));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("over age and size"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(listed(d).await.is_empty());
    for bad in ["", ",", "7 parsecs", "2PiB"] {
        let out = output(&["sessions", "prune", "--retain", bad, "--data-dir", d]).await;
        assert_eq!(out.status.code(), Some(2), "{bad:?}");
        one_line(&out);
    }
    let out = output(&[
        "sessions",
        "--route",
        "x",
        "prune",
        "--retain",
        "1s",
        "--data-dir",
        d,
    ])
    .await;
    assert_eq!(out.status.code(), Some(2));
    assert!(one_line(&out).contains("--retain alone"));
}

#[tokio::test]
async fn prune_is_refused_while_a_relay_holds_the_data_dir_and_a_dry_run_says_so() {
    let dir = recorded(2).await;
    let d = &data_of(&dir);
    let old = listed(d).await;
    let sim = start_mod(None);
    let s = serve_recording(sim.addr(), &dir.path().join("data"), &[]).await;
    let pid = s.child.id().expect("running");
    // The relay's own session appears beside the two old ones.
    until_listed(d, 3).await;
    let before = files(d);
    let out = output(&["sessions", "prune", "--retain", "0B", "--data-dir", d]).await;
    assert_eq!(out.status.code(), Some(1));
    let err = one_line(&out);
    assert!(
        err.contains(&format!("in use by another process (pid {pid}")),
        "{err}"
    );
    assert!(out.stdout.is_empty(), "refused, yet printed a row");
    assert_eq!(
        names(&files(d)),
        names(&before),
        "a refused prune changed the data dir"
    );
    let now = listed(d).await;
    for s in &old {
        assert!(ids(&now).contains(&s["id"].as_str().expect("id").to_string()));
    }
    // A dry run reads only: it works, lists the old sessions (not the one recording) and
    // names the relay.
    let out = output(&[
        "sessions",
        "prune",
        "--retain",
        "0B",
        "--dry-run",
        "--data-dir",
        d,
    ])
    .await;
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert_eq!(table_ids(&out.stdout), ids(&old), "{text}");
    assert!(text.contains("kept 1 still recording"), "{text}");
    assert!(text.contains(&format!("a relay (pid {pid})")), "{text}");
    assert_eq!(listed(d).await.len(), 3);
    s.stop_cleanly().await;
    sim.stop();
}

/// Waits (bounded, by listing again) until `d` holds `n` sessions, the newest with a frame.
async fn until_listed(d: &str, n: usize) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let l = listed(d).await;
        if l.len() == n && l[n - 1]["bytes"].as_u64() > Some(0) {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "never {n} sessions");
    }
}

/// The names in a listing of [`files`] other than those a recording relay changes by itself
/// (its write-ahead logs, table files and manifests).
fn names(v: &[(String, Vec<u8>)]) -> BTreeSet<String> {
    v.iter()
        .map(|(n, _)| n.clone())
        .filter(|n| !n.ends_with(".log") && !n.ends_with(".sst") && !n.starts_with("MANIFEST"))
        .collect()
}

#[tokio::test]
async fn serve_retain_logs_each_session_it_deletes() {
    let dir = recorded(2).await;
    let data = dir.path().join("data");
    let d = &data_of(&dir);
    let old = listed(d).await;
    let sim = start_mod(None);
    let upstream = sim.addr().to_string();
    let mut child = relay()
        .args([
            "serve",
            "--upstream",
            &upstream,
            "--upstream-token",
            MOD_TOKEN,
            "--listen",
            "127.0.0.1:0",
            "--token",
            BRIDGE_TOKEN,
            "--no-bridge-file",
            "--retain",
            "1KiB",
            "--data-dir",
        ])
        .arg(&data)
        .env("GABP_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("serve");
    let log = collect_stderr(&mut child);
    let lines_for = |id: &str| -> Vec<String> {
        log.lock()
            .lines()
            .filter(|l| l.contains("retention deleted a session") && l.contains(id))
            .map(str::to_string)
            .collect()
    };
    for s in &old {
        let id = s["id"].as_str().expect("id");
        until(&format!("a log line for {id}"), || {
            !lines_for(id).is_empty()
        })
        .await;
        let line = lines_for(id).remove(0);
        assert!(
            line.contains(&format!("route={}", s["route"].as_str().expect("route"))),
            "{line}"
        );
        assert!(
            line.contains(&format!("bytes={}", s["bytes"].as_u64().expect("bytes"))),
            "{line}"
        );
        assert!(line.contains("why=\"over size\""), "{line}");
        assert!(line.contains(" INFO "), "{line}");
    }
    until("the count", || {
        log.lock()
            .contains("retention removed old sessions deleted=2")
    })
    .await;
    let left = listed(d).await;
    for s in &old {
        assert!(!ids(&left).contains(&s["id"].as_str().expect("id").to_string()));
    }
    sigterm(&child);
    let st = tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .expect("stops")
        .expect("status");
    assert!(st.success(), "{}", log.lock());
    sim.stop();
}
