//! Episodes as data, through the real binary, on sessions a real relay recorded in front of
//! the simulated mod while a bridge marked episodes:
//! - `gabp-relay episodes` lists them (numbered from 1, marks' data exact, an episode cut short
//!   by the next start, the last one open to the session's end), as JSON and as a table that
//!   shows untrusted mark data escaped;
//! - every exported row (JSONL and Parquet) carries its episode, the marks included, agreeing
//!   with the listing's frames and events per channel;
//! - `export --episode N` is exactly episode N's rows; a selection leaves out the sessions
//!   without it, naming each; `--episode-marks` chooses the labels.

use std::collections::BTreeMap;

use crate::support::*;
use serde_json::{json, Value};

const CHANNELS: [&str; 3] = ["world/tick", "player/move", "chat/message"];
/// A mark's data holds this number, which no double holds.
const BIG: &str = "123456789012345678901234567890";

/// Records one session tagged `tags`; the bridge, subscribed to every channel (the mod streams
/// at 2,000 events/s), sends `marks` (label and data as JSON text) 60 ms apart.
async fn record(data: &str, tags: &[&str], marks: &[(&str, &str)]) {
    let sim = start_mod(Some(2000.0));
    let tags: Vec<&str> = tags.iter().flat_map(|t| ["--tag", t]).collect();
    let s = serve_recording(sim.addr(), std::path::Path::new(data), &tags).await;
    let (mut c, _) = Client::connect_hello(&s.addr, BRIDGE_TOKEN)
        .await
        .expect("hello");
    c.subscribe(&CHANNELS).await.expect("subscribe");
    for (i, (label, data)) in marks.iter().enumerate() {
        tokio::time::sleep(Duration::from_millis(60)).await;
        // Sent as text: data must come back byte for byte.
        let id = format!("5f0c2d1e-8a3b-4c6d-9e7f-{i:012}");
        let body = format!(
            r#"{{"v":"gabp/1","id":"{id}","type":"request","method":"relay/mark","params":{{"label":"{label}","data":{data}}}}}"#
        );
        c.send_body(body.as_bytes()).await.expect("mark sent");
        let answer = c.response_to(&id).await.expect("mark answered");
        assert!(answer["result"].is_object(), "{answer}");
    }
    tokio::time::sleep(Duration::from_millis(60)).await;
    s.stop_cleanly().await;
}

fn ok(out: &std::process::Output) -> String {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).expect("utf-8")
}

fn lines(out: &std::process::Output) -> Vec<Value> {
    ok(out)
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect()
}

/// (episode, channel) -> events, counted from exported rows.
fn events_per_episode(rows: &[Value]) -> BTreeMap<(u64, String), u64> {
    let mut m = BTreeMap::new();
    for r in rows {
        if let (Some(ep), Some(ch)) = (r["episode"].as_u64(), r["channel"].as_str()) {
            assert_eq!(r["kind"], "event", "{r}");
            *m.entry((ep, ch.to_string())).or_default() += 1;
        }
    }
    m
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn episodes_are_listed_exported_and_cut_out() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let data = data.to_str().expect("utf-8");
    // A stray end mark, a whole episode, one cut short by the next start, another whole one,
    // and the last left open; a note mark inside the first changes nothing.
    let start1 = format!(r#"{{"episode":1,"big":{BIG}}}"#);
    record(
        data,
        &["exp=ep", "seed=1"],
        &[
            ("episode-end", "0"),
            ("episode-start", &start1),
            ("note", r#""halfway""#),
            ("episode-end", r#"{"episode":1,"reward":1.5}"#),
            ("episode-start", r#"{"episode":2}"#),
            ("episode-start", r#"{"episode":3}"#),
            ("episode-end", r#"{"episode":3}"#),
            // U+202E (right-to-left override): JSON carries it raw, a table must not.
            ("episode-start", "{\"episode\":4,\"who\":\"\u{202e}olleh\"}"),
        ],
    )
    .await;
    // Its own labels; the default ones hold a single open episode.
    record(
        data,
        &["exp=ep", "seed=2"],
        &[("go", "1"), ("stop", "2"), ("episode-start", "null")],
    )
    .await;
    let ids: Vec<String> = json(&output(&["sessions", "--json", "--data-dir", data]).await)
        ["sessions"]
        .as_array()
        .expect("sessions")
        .iter()
        .map(|s| s["id"].as_str().expect("id").to_string())
        .collect();
    let (one, two) = (&ids[0], &ids[1]);

    // The listing.
    let raw = ok(&output(&["episodes", one, "--json", "--data-dir", data]).await);
    assert!(
        raw.contains(&format!(r#""startData":{start1}"#)),
        "mark data exact: {raw}"
    );
    let listed: Value = serde_json::from_str(&raw).expect("one JSON document");
    let eps = listed["episodes"].as_array().expect("episodes").clone();
    let got: Vec<(u64, &str, bool)> = eps
        .iter()
        .map(|e| {
            (
                e["episode"].as_u64().expect("number"),
                e["endedBy"].as_str().expect("endedBy"),
                e["open"].as_bool().expect("open"),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            (1, "mark", false),
            (2, "next-start", true),
            (3, "mark", false),
            (4, "session-end", true)
        ]
    );
    assert_eq!(eps[0]["endData"], json!({"episode": 1, "reward": 1.5}));
    assert_eq!(eps[1]["endData"], Value::Null);
    assert_eq!(eps[3]["startData"]["who"], "\u{202e}olleh");
    assert_eq!(eps[0]["tags"], json!({"exp": "ep", "seed": "1"}));
    assert_eq!(eps[0]["session"], one.as_str());
    // The cut episode ends where the next begins; the open one at the session's end.
    assert_eq!(eps[1]["endNs"], eps[2]["startNs"]);
    assert_eq!(
        eps[1]["lastFrame"].as_u64(),
        eps[2]["firstFrame"].as_u64().map(|f| f - 1)
    );
    let meta =
        json(&output(&["sessions", "--json", "--data-dir", data]).await)["sessions"][0].clone();
    assert_eq!(eps[3]["endNs"], meta["endedNs"]);
    for e in &eps {
        let d = e["durationS"].as_f64().expect("duration");
        let span = (e["endNs"].as_u64().expect("end") - e["startNs"].as_u64().expect("start"))
            as f64
            / 1e9;
        assert!((d - span).abs() < 1e-6, "{e}");
        assert!(d >= 0.05, "60 ms between marks: {e}");
        let per: u64 = e["channels"]
            .as_object()
            .expect("channels")
            .values()
            .map(|v| v.as_u64().expect("count"))
            .sum();
        assert_eq!(per, e["events"].as_u64().expect("events"), "{e}");
        assert!(per > 0, "the mod streamed during every episode: {e}");
    }

    // Every exported row carries its episode, marks included; the listing agrees with them.
    let rows = lines(&output(&["export", one, "--data-dir", data]).await);
    assert!(
        rows.iter().all(|r| r.get("episode").is_some()),
        "every line"
    );
    let marks: Vec<&Value> = rows.iter().filter(|r| r["kind"] == "mark").collect();
    let mark_eps: Vec<Value> = marks.iter().map(|m| m["episode"].clone()).collect();
    assert_eq!(
        mark_eps,
        [
            Value::Null,
            json!(1),
            json!(1),
            json!(1),
            json!(2),
            json!(3),
            json!(3),
            json!(4)
        ],
        "the stray end mark belongs to none; every other mark to its episode"
    );
    let counted = events_per_episode(&rows);
    for e in &eps {
        let n = e["episode"].as_u64().expect("n");
        for (ch, count) in e["channels"].as_object().expect("channels") {
            assert_eq!(
                counted.get(&(n, ch.clone())),
                count.as_u64().as_ref(),
                "{e}"
            );
        }
        let frames: Vec<u64> = rows
            .iter()
            .filter(|r| r["episode"] == n)
            .map(|r| r["frame"].as_u64().expect("frame"))
            .collect();
        assert_eq!(frames.len() as u64, e["frames"].as_u64().expect("frames"));
        assert_eq!(Some(frames[0]), e["firstFrame"].as_u64());
        assert_eq!(frames.last().copied(), e["lastFrame"].as_u64());
    }
    assert_eq!(
        counted.keys().map(|k| k.0).max(),
        Some(4),
        "no events outside the listed episodes are numbered"
    );

    // --episode N: exactly the rows of episode N, in the same walk's numbering.
    for n in 1..=4u64 {
        let cut = lines(
            &output(&[
                "export",
                one,
                "--episode",
                &n.to_string(),
                "--data-dir",
                data,
            ])
            .await,
        );
        let want: Vec<&Value> = rows.iter().filter(|r| r["episode"] == n).collect();
        assert_eq!(cut.iter().collect::<Vec<_>>(), want, "episode {n}");
        assert_eq!(cut[0]["kind"], "mark", "starts with its start mark");
    }
    let ticks = lines(
        &output(&[
            "export",
            one,
            "--episode",
            "3",
            "--channel",
            "world/tick",
            "--data-dir",
            data,
        ])
        .await,
    );
    assert_eq!(
        ticks.len() as u64,
        eps[2]["channels"]["world/tick"].as_u64().expect("ticks")
    );
    assert!(ticks
        .iter()
        .all(|r| r["channel"] == "world/tick" && r["episode"] == 3));
    // With --from-mark too, episodes keep the whole session's numbering.
    let from = lines(
        &output(&[
            "export",
            one,
            "--from-mark",
            "note",
            "--to-mark",
            "episode-start",
            "--data-dir",
            data,
        ])
        .await,
    );
    assert_eq!(from[0]["episode"], 1);
    assert_eq!(from.last().expect("last")["episode"], 2);
    let none = output(&["export", one, "--episode", "5", "--data-dir", data]).await;
    assert_eq!(none.status.code(), Some(1));
    assert!(one_line(&none).contains("has no episode 5 (it has 4)"));
    assert!(none.stdout.is_empty());
    for bad in [
        &["--episode", "0"][..],
        &["--episode", "1", "--from", "1s"],
        &["--episode", "1", "--from-mark", "x"],
        &["--episode-marks", "same,same"],
        &["--episode-marks", "nocomma"],
    ] {
        let mut a = vec!["export", one.as_str(), "--data-dir", data];
        a.extend(bad);
        let out = output(&a).await;
        assert_eq!(out.status.code(), Some(2), "{bad:?}");
    }

    // Parquet carries the same column.
    let pq = dir.path().join("one.parquet");
    ok(&output(&[
        "export",
        one,
        "--format",
        "parquet",
        "-o",
        pq.to_str().expect("utf-8"),
        "--data-dir",
        data,
    ])
    .await);
    let b = crate::analysis_parquet::read_parquet(&pq);
    let col = b
        .column_by_name("episode")
        .expect("episode column")
        .as_any()
        .downcast_ref::<arrow_array::Int64Array>()
        .expect("int64");
    assert_eq!(b.schema().fields().last().expect("last").name(), "episode");
    for (i, r) in rows.iter().enumerate() {
        let v = (!arrow_array::Array::is_null(col, i)).then(|| col.value(i));
        assert_eq!(v, r["episode"].as_i64(), "row {i}: {r}");
    }

    // Another session's labels.
    let custom = json(
        &output(&[
            "episodes",
            two,
            "--episode-marks",
            "go,stop",
            "--json",
            "--data-dir",
            data,
        ])
        .await,
    );
    let custom = custom["episodes"].as_array().expect("episodes");
    assert_eq!(custom.len(), 1);
    assert_eq!(custom[0]["startData"], 1);
    assert_eq!(custom[0]["endData"], 2);
    let cut = lines(
        &output(&[
            "export",
            two,
            "--episode",
            "1",
            "--episode-marks",
            "go,stop",
            "--data-dir",
            data,
        ])
        .await,
    );
    assert_eq!(cut[0]["label"], "go");
    assert_eq!(cut.last().expect("last")["label"], "stop");

    // A selection: the table streams every session's episodes, escaping mark data; export
    // --episode leaves out (and names) the sessions without it.
    let table = ok(&output(&["episodes", "--tag", "exp=ep", "--data-dir", data]).await);
    let table_lines: Vec<&str> = table.lines().collect();
    assert_eq!(table_lines.len(), 1 + 4 + 1, "{table}");
    assert!(table_lines[0].starts_with("SESSION"), "{table}");
    assert!(table.contains("\\u{202e}olle"), "escaped: {table}");
    assert!(!table.contains('\u{202e}'), "{table}");
    assert!(table.contains("session-end"), "{table}");
    let sel = output(&[
        "export",
        "--tag",
        "exp=ep",
        "--episode",
        "2",
        "--data-dir",
        data,
    ])
    .await;
    let sel_rows = lines(&sel);
    assert!(sel_rows
        .iter()
        .all(|r| r["session"] == one.as_str() && r["episode"] == 2));
    assert_eq!(
        one_line(&sel).trim_end(),
        format!("skipping session {two}: it has no episode 2")
    );
    let hive = dir.path().join("study");
    let h = output(&[
        "export",
        "--tag",
        "exp=ep",
        "--episode",
        "2",
        "--format",
        "parquet",
        "-o",
        hive.to_str().expect("utf-8"),
        "--json",
        "--data-dir",
        data,
    ])
    .await;
    let files = json(&h)["sessions"].as_array().expect("sessions").clone();
    assert_eq!(files.len(), 1, "{files:?}");
    let on_disk = crate::analysis_parquet::walk(&hive);
    assert_eq!(on_disk.len(), 1, "no file for the other: {on_disk:?}");
    let nothing = output(&[
        "export",
        "--tag",
        "exp=ep",
        "--episode",
        "9",
        "--data-dir",
        data,
    ])
    .await;
    assert_eq!(nothing.status.code(), Some(1));
    assert!(one_line(&nothing).contains("none of the 2 selected sessions has an episode 9"));
}
