//! Sessions as analysis data, through the real binary: tags (`serve --tag`, `sessions tag`),
//! one selection for `sessions`, `stats` and `export`, and marks cut out with
//! `export --from-mark/--to-mark`.

use crate::support::*;
use serde_json::{json, Value};

/// `serve` in front of a fresh simulated mod, recording `route` into `data` with `tags`.
async fn serve_tagged(sim: &ModSim, data: &str, route: &str, tags: &[&str]) -> Serve {
    let up = sim.addr().to_string();
    let mut args = vec![
        "--upstream",
        &up,
        "--upstream-token",
        MOD_TOKEN,
        "--listen",
        "127.0.0.1:0",
        "--token",
        BRIDGE_TOKEN,
        "--route-name",
        route,
        "--data-dir",
        data,
    ];
    for t in tags {
        args.extend(["--tag", t]);
    }
    serve(&args).await
}

/// A mark's data holds this number, which no double holds.
const BIG: &str = "123456789012345678901234567890";

/// Records one session with `serve --tag …`: a bridge marks `ep-start`, calls `sim/echo`,
/// marks `ep-end`, and the relay stops (SIGTERM) so the data dir is free.
async fn record(data: &str, route: &str, tags: &[&str]) {
    let sim = start_mod(None);
    let s = serve_tagged(&sim, data, route, tags).await;
    let (mut c, _) = Client::connect_hello(&s.addr, BRIDGE_TOKEN)
        .await
        .expect("hello");
    // Sent as text: the data's number is one no double holds, and it must export exact.
    let id = "5f0c2d1e-8a3b-4c6d-9e7f-1a2b3c4d5e6f";
    let mark = format!(
        r#"{{"v":"gabp/1","id":"{id}","type":"request","method":"relay/mark","params":{{"label":"ep-start","data":{{"episode":1,"big":{BIG}}}}}}}"#
    );
    c.send_body(mark.as_bytes()).await.expect("mark sent");
    let answer = c.response_to(id).await.expect("mark answered");
    assert!(answer["result"].is_object(), "{answer}");
    c.call(
        "tools/call",
        json!({"name": "sim/echo", "arguments": {"q": route}}),
    )
    .await
    .expect("echo");
    // Refused marks are recorded, and are not marks: the export below counts two per session.
    for bad in [
        json!({"label": ""}),
        json!({"label": "x".repeat(300)}),
        json!({"data": 1}),
    ] {
        let r = c.request("relay/mark", bad).await.expect("answered");
        assert_eq!(r["error"]["code"], -32602, "{r}");
    }
    // So are marks refused at the bridge boundary (a repeated key), whatever their label.
    for (id, params) in [
        (
            "1c2d3e4f-5a6b-4c7d-8e9f-0a1b2c3d4e5f",
            r#"{"label":"","label":"dup-label"}"#,
        ),
        (
            "2d3e4f5a-6b7c-4d8e-9f0a-1b2c3d4e5f6a",
            r#"{"label":"dup-data","data":{"a":1,"a":2}}"#,
        ),
    ] {
        let body = format!(
            r#"{{"v":"gabp/1","id":"{id}","type":"request","method":"relay/mark","params":{params}}}"#
        );
        c.send_body(body.as_bytes()).await.expect("sent");
        let r = c.response_to(id).await.expect("answered");
        assert_eq!(r["error"]["code"], -32600, "{r}");
    }
    c.call("relay/mark", json!({"label": "ep-end"}))
        .await
        .expect("mark");
    c.call("relay/status", json!({})).await.expect("status");
    s.stop_cleanly().await;
}

/// The ids `sessions --json` lists with `args`.
async fn pick(data: &str, args: &[&str]) -> Vec<String> {
    let mut a = vec!["sessions", "--json", "--data-dir", data];
    a.extend(args);
    let v = json(&output(&a).await);
    v["sessions"]
        .as_array()
        .expect("sessions")
        .iter()
        .map(|s| s["id"].as_str().expect("id").to_string())
        .collect()
}

fn lines(out: &std::process::Output) -> Vec<Value> {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tags_selection_and_marks() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let data = data.to_str().expect("utf-8");
    record(data, "lab", &["exp=ppo", "seed=7"]).await;
    record(data, "lab", &["exp=dqn"]).await;
    record(data, "other", &[]).await;

    // Tags from serve are in the catalog: `sessions --json` and the table show them.
    let all = json(&output(&["sessions", "--json", "--data-dir", data]).await);
    let all = all["sessions"].as_array().expect("sessions").clone();
    assert_eq!(all.len(), 3);
    assert_eq!(all[0]["tags"], json!({"exp": "ppo", "seed": "7"}));
    assert_eq!(all[1]["tags"], json!({"exp": "dqn"}));
    assert_eq!(all[2]["tags"], json!({}));
    let ids: Vec<String> = all
        .iter()
        .map(|s| s["id"].as_str().expect("id").to_string())
        .collect();
    let table = output(&["sessions", "--data-dir", data]).await;
    let table = String::from_utf8_lossy(&table.stdout).to_string();
    assert!(
        table.lines().next().is_some_and(|h| h.ends_with("TAGS")),
        "{table}"
    );
    assert!(table.contains("exp=ppo seed=7"), "{table}");

    // The selection filters `sessions`: tags (all must match), route, app, since.
    assert_eq!(pick(data, &["--tag", "exp=ppo"]).await, [ids[0].clone()]);
    assert_eq!(
        pick(data, &["--tag", "exp=ppo", "--tag", "seed=7"]).await,
        [ids[0].clone()]
    );
    assert_eq!(pick(data, &["--route", "lab"]).await, ids[..2]);
    assert_eq!(
        pick(
            data,
            &[
                "--since",
                "1h",
                "--app",
                all[0]["app"].as_str().expect("app")
            ]
        )
        .await
        .len(),
        3
    );
    let none = output(&[
        "sessions",
        "--data-dir",
        data,
        "--tag",
        "exp=ppo",
        "--tag",
        "seed=8",
    ])
    .await;
    assert_eq!(none.status.code(), Some(1));
    assert!(one_line(&none).contains("no session matches"));
    let future = output(&[
        "sessions",
        "--data-dir",
        data,
        "--since",
        "2999-01-01T00:00:00Z",
    ])
    .await;
    assert_eq!(future.status.code(), Some(1));
    one_line(&future);

    // `sessions tag` after the fact: set and remove; bad input is a usage error.
    let t = json(
        &output(&[
            "sessions",
            "tag",
            &ids[2],
            "exp=base",
            "note=a b",
            "--json",
            "--data-dir",
            data,
        ])
        .await,
    );
    assert_eq!(t["tags"], json!({"exp": "base", "note": "a b"}));
    let t = json(
        &output(&[
            "sessions",
            "tag",
            &ids[2],
            "--remove",
            "note",
            "--json",
            "--data-dir",
            data,
        ])
        .await,
    );
    assert_eq!(t["tags"], json!({"exp": "base"}));
    for bad in ["novalue", "a b=c", "k=line\nbreak"] {
        let out = output(&["sessions", "tag", &ids[2], bad, "--data-dir", data]).await;
        assert_eq!(out.status.code(), Some(2), "{bad:?}");
        one_line(&out);
    }
    let out = output(&[
        "serve",
        "--upstream",
        "127.0.0.1:1",
        "--listen",
        "127.0.0.1:0",
        "--tag",
        "x",
        "--data-dir",
        data,
    ])
    .await;
    assert_eq!(out.status.code(), Some(2), "serve --tag without =");

    // stats: tags in --json; a selection prints every session.
    let one = json(&output(&["stats", &ids[0], "--json", "--data-dir", data]).await);
    assert_eq!(one["tags"], json!({"exp": "ppo", "seed": "7"}));
    assert_eq!(one["session"], ids[0].as_str());
    let many = json(&output(&["stats", "--route", "lab", "--json", "--data-dir", data]).await);
    let many = many["sessions"].as_array().expect("per session");
    assert_eq!(many.len(), 2);
    assert_eq!(many[1]["tags"], json!({"exp": "dqn"}));
    let usage_err = output(&["stats", "--data-dir", data]).await;
    assert_eq!(
        usage_err.status.code(),
        Some(2),
        "no selection is a usage error"
    );

    // export: several sessions in one stream, each line with its session (and tags).
    let ex = lines(&output(&["export", &ids[0], &ids[1][..13], "--data-dir", data]).await);
    let sessions: std::collections::BTreeSet<&str> = ex
        .iter()
        .map(|l| l["session"].as_str().expect("session"))
        .collect();
    assert_eq!(sessions.len(), 2);
    assert!(ex.iter().all(|l| l["tags"]["exp"].is_string()));
    let all_ex = lines(&output(&["export", "--all", "--data-dir", data]).await);
    assert!(all_ex.len() > ex.len());
    assert!(all_ex
        .iter()
        .any(|l| l["session"] == ids[2].as_str() && l["tags"] == json!({"exp": "base"})));

    // Marks are frames of kind mark; an episode is cut out between two labels, inclusive.
    let marks: Vec<&Value> = ex.iter().filter(|l| l["kind"] == "mark").collect();
    assert_eq!(marks.len(), 4, "two marks per session");
    assert_eq!(marks[0]["label"], "ep-start");
    assert_eq!(marks[0]["data"]["episode"], 1);
    let exported = String::from_utf8(
        output(&["export", &ids[0], "--data-dir", data])
            .await
            .stdout,
    )
    .expect("utf-8");
    assert!(
        exported.contains(&format!(r#""data":{{"episode":1,"big":{BIG}}}"#)),
        "a mark's data is exported exactly as the bridge wrote it"
    );
    assert_eq!(marks[0]["dir"], "bridge->relay");
    let ep = lines(
        &output(&[
            "export",
            &ids[0],
            "--from-mark",
            "ep-start",
            "--to-mark",
            "ep-end",
            "--data-dir",
            data,
        ])
        .await,
    );
    assert_eq!(ep.first().expect("first")["label"], "ep-start");
    assert_eq!(ep.last().expect("last")["label"], "ep-end");
    assert!(ep.iter().any(|l| l["kind"] == "request"
        && l["msg"]["method"] == "tools/call"
        && l["dir"] == "relay->mod"));
    assert!(ep.iter().any(|l| l["kind"] == "response"));
    assert!(
        !ep.iter().any(|l| l["msg"]["method"] == "session/hello"),
        "nothing before the start mark"
    );
    assert!(
        !ep.iter().any(|l| l["msg"]["method"] == "relay/status"),
        "nothing after the end mark"
    );
    assert!(
        !all_ex
            .iter()
            .any(|l| l["dir"] == "relay->mod" && l["msg"]["method"] == "relay/mark"),
        "a mark never reaches the mod"
    );
    let missing = output(&[
        "export",
        &ids[0],
        "--from-mark",
        "ep-start",
        "--to-mark",
        "nope",
        "--data-dir",
        data,
    ])
    .await;
    assert_eq!(missing.status.code(), Some(1));
    assert!(one_line(&missing).contains("\"nope\""));
    assert!(
        missing.stdout.is_empty(),
        "nothing written before the error"
    );

    // A session without the marks: a selection skips it with a note on stderr instead of
    // failing the whole export; when no session has them, that is an error.
    let sim = start_mod(None);
    let s = serve_tagged(&sim, data, "plain", &[]).await;
    let (mut c, _) = Client::connect_hello(&s.addr, BRIDGE_TOKEN)
        .await
        .expect("hello");
    c.call("relay/status", json!({})).await.expect("status");
    s.stop_cleanly().await;
    let plain = pick(data, &["--route", "plain"]).await;
    assert_eq!(plain.len(), 1);
    let out = output(&[
        "export",
        "--all",
        "--from-mark",
        "ep-start",
        "--to-mark",
        "ep-end",
        "--data-dir",
        data,
    ])
    .await;
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        one_line(&out).trim_end(),
        format!(
            "skipping session {}: it has no mark labelled \"ep-start\"",
            plain[0]
        )
    );
    let cut = lines(&out);
    let sessions: std::collections::BTreeSet<&str> = cut
        .iter()
        .map(|l| l["session"].as_str().expect("session"))
        .collect();
    assert_eq!(sessions.len(), 3, "every session with the marks");
    assert!(!sessions.contains(plain[0].as_str()));
    assert_eq!(cut.iter().filter(|l| l["kind"] == "mark").count(), 6);
    let none = output(&["export", "--all", "--from-mark", "nope", "--data-dir", data]).await;
    assert_eq!(none.status.code(), Some(1));
    assert!(none.stdout.is_empty());
    let err = String::from_utf8_lossy(&none.stderr);
    assert!(err.contains("none of the 4 selected sessions"), "{err}");
}

/// `sessions tag` while a relay holds the data dir: one line, exit 1, nothing changed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tagging_a_data_dir_a_relay_holds_is_refused_in_one_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let data = data.to_str().expect("utf-8");
    let sim = start_mod(None);
    let s = serve_tagged(&sim, data, "default", &["exp=live"]).await;
    let (mut c, _) = Client::connect_hello(&s.addr, BRIDGE_TOKEN)
        .await
        .expect("hello");
    c.call("relay/status", json!({})).await.expect("status");
    // The session's record reaches the catalog with the recorder's next commit.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let list = json(&output(&["sessions", "--json", "--data-dir", data]).await);
        if list["sessions"][0]["tags"] == json!({"exp": "live"}) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "tags readable while recording: {list}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let out = output(&["sessions", "tag", "latest", "k=v", "--data-dir", data]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        one_line(&out).contains("in use"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `stats` reads a session of endless distinct methods into a bounded table: the first 64 by
/// name, the rest pooled, every call counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_pools_methods_past_the_first_64() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let data = data.to_str().expect("utf-8");
    let (_sim, s, mut c) = recording_bridge(data).await;
    for i in 0..100 {
        // Unknown to the mod: forwarded, answered with an error, recorded both ways.
        let r = c
            .request(&format!("probe/m{i:03}"), json!({}))
            .await
            .expect("answered");
        assert!(r["error"].is_object(), "{r}");
    }
    s.stop_cleanly().await;
    let st = json(&output(&["stats", "latest", "--json", "--data-dir", data]).await);
    let methods = st["methods"].as_array().expect("methods");
    assert_eq!(methods.len(), 65, "64 named and the pool: {st}");
    let pooled = methods
        .iter()
        .find(|m| m["method"] == "(other methods)")
        .expect("pool");
    let calls: u64 = methods
        .iter()
        .map(|m| m["calls"].as_u64().expect("calls"))
        .sum();
    assert!(calls >= 100, "every call counted: {calls}");
    assert!(pooled["calls"].as_u64().expect("calls") >= 36, "{pooled}");
}

/// A bridge's bad frames past the first 16 are answered but not recorded (garbage must not fill
/// the disk); the recording says how many, so the gap is visible.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_frames_not_recorded_are_counted_in_the_recording() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let data = data.to_str().expect("utf-8");
    let (_sim, s, mut c) = recording_bridge(data).await;
    for i in 0..20 {
        // Half invalid, half valid events (which bridges may not send): both are bad frames.
        let body = if i % 2 == 0 {
            format!(
                r#"{{"v":"gabp/1","id":"bad-id-{i}","type":"request","method":"tools/list","params":{{}}}}"#
            )
        } else {
            format!(
                r#"{{"v":"gabp/1","id":"00000000-0000-4000-8000-{i:012}","type":"event","channel":"c","seq":0,"payload":{{"bad-id-{i}":1}}}}"#
            )
        };
        c.send_body(body.as_bytes()).await.expect("sent");
        let answer = c.next_message().await.expect("read").expect("answer");
        assert_eq!(answer["error"]["code"], -32600, "{answer}");
    }
    c.call("relay/status", json!({})).await.expect("status");
    drop(c);
    // The bridge's leaving is recorded when the relay sees it go, at the latest as it stops.
    s.stop_cleanly().await;
    let st = json(&output(&["stats", "latest", "--json", "--data-dir", data]).await);
    assert_eq!(st["bridges"][0]["unrecordedBadFrames"], 4, "{st}");
    let export = String::from_utf8(
        output(&["export", "latest", "--data-dir", data])
            .await
            .stdout,
    )
    .expect("utf-8");
    let recorded = export
        .lines()
        .filter(|l| l.contains(r#""dir":"bridge->relay""#) && l.contains("bad-id-"))
        .count();
    assert_eq!(recorded, 16, "the first 16 bad frames are recorded");
    // A status request is recorded before its answer, as they happened.
    let lines: Vec<Value> = export
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    // Untagged, yet every line has the same keys as a tagged session's.
    assert!(lines.iter().all(|l| l["tags"] == json!({})), "{}", lines[0]);
    let asked = lines
        .iter()
        .position(|l| l["msg"]["method"] == "relay/status")
        .expect("the status request is recorded");
    let answered = lines
        .iter()
        .position(|l| l["msg"]["id"] == lines[asked]["msg"]["id"] && l["kind"] == "response")
        .expect("its answer is recorded");
    assert!(asked < answered, "request at {asked}, answer at {answered}");
}

/// A simulated mod, a relay recording it into `data`, and a welcomed bridge.
/// The same count for a bridge still attached when the relay stops: the session's end records
/// it (the bridge's own leaving comes after the session has ended).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bridge_attached_at_shutdown_keeps_its_unrecorded_count() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let data = data.to_str().expect("utf-8");
    let (_sim, s, mut c) = recording_bridge(data).await;
    for i in 0..20 {
        let body = format!(
            r#"{{"v":"gabp/1","id":"bad-id-{i}","type":"request","method":"tools/list","params":{{}}}}"#
        );
        c.send_body(body.as_bytes()).await.expect("sent");
        let answer = c.next_message().await.expect("read").expect("answer");
        assert_eq!(answer["error"]["code"], -32600, "{answer}");
    }
    // Still connected as the relay stops.
    s.stop_cleanly().await;
    drop(c);
    let st = json(&output(&["stats", "latest", "--json", "--data-dir", data]).await);
    assert_eq!(st["bridges"][0]["unrecordedBadFrames"], 4, "{st}");
}

async fn recording_bridge(data: &str) -> (ModSim, Serve, Client) {
    let sim = start_mod(None);
    let s = serve_tagged(&sim, data, "lab", &[]).await;
    let (c, _) = Client::connect_hello(&s.addr, BRIDGE_TOKEN)
        .await
        .expect("hello");
    (sim, s, c)
}
