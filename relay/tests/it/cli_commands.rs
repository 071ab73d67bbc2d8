//! The command line as a stranger meets it, through the real binary: `status`, one
//! JSON key style, sizes with suffixes, config errors with line and suggestion, ambiguous
//! prefixes, `--json` only where it works, a closed pipe, and Ctrl-C on `demo`.

use std::time::Duration;

use crate::support::*;
use gabp_client::Client;
use tokio::io::{AsyncBufReadExt, BufReader};

/// Every object key in `v`, recursively, except inside recorded GABP messages.
fn keys(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, v) in m {
                out.push(k.clone());
                if k != "msg" && k != "raw" {
                    keys(v, out);
                }
            }
        }
        serde_json::Value::Array(a) => a.iter().for_each(|v| keys(v, out)),
        _ => {}
    }
}

fn assert_camel(what: &str, v: &serde_json::Value) {
    let mut all = Vec::new();
    keys(v, &mut all);
    assert!(!all.is_empty(), "{what}: no keys");
    let snake: Vec<_> = all.iter().filter(|k| k.contains('_')).collect();
    assert!(snake.is_empty(), "{what}: snake_case keys {snake:?}");
}

#[tokio::test]
async fn every_json_output_uses_camel_case_keys() {
    let dir = record_a_session().await;
    let data = dir.path().join("data");
    let d = data.to_str().expect("utf-8");
    for args in [
        &["sessions", "--json", "--data-dir", d][..],
        &["sessions", "check", "--json", "--data-dir", d],
        &["stats", "latest", "--json", "--data-dir", d],
    ] {
        let out = output(args).await;
        assert_eq!(out.status.code(), Some(0), "{args:?}");
        assert_camel(&format!("{args:?}"), &json(&out));
    }
    let out = output(&["export", "latest", "--data-dir", d]).await;
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.lines().count() > 20);
    for line in text.lines() {
        let v: serde_json::Value = serde_json::from_str(line).expect("JSONL");
        assert_camel("export", &v);
    }
}

#[tokio::test]
async fn status_shows_the_mod_session_and_bridges_via_the_discovery_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("bridge.json");
    let f = file.to_str().expect("utf-8");
    let sim = start_mod(Some(500.0));
    let s = serve(&[
        "--upstream",
        &sim.addr().to_string(),
        "--upstream-token",
        MOD_TOKEN,
        "--listen",
        "127.0.0.1:0",
        "--route-name",
        "colony",
        "--no-record",
        "--bridge-file",
        f,
    ])
    .await;
    let token = s.token.clone().expect("generated token printed");
    let (mut c, _) = Client::connect_hello(&s.addr, &token).await.expect("hello");
    c.subscribe(&["world/tick"]).await.expect("subscribe");
    let out = output(&["status", "--bridge-file", f, "--json"]).await;
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v = json(&out);
    let r = &v["relays"][0];
    assert_eq!(r["route"], "colony", "{v}");
    assert_eq!(r["modConnected"], true, "{v}");
    let bridges = r["status"]["bridges"].as_array().expect("bridges");
    assert_eq!(bridges.len(), 1, "the status connection is left out: {v}");
    assert_eq!(bridges[0]["bridgeVersion"], "gabp-sim/0.1");
    assert_camel("status", &v);
    // The same relay by address and token, as a table.
    let out = output(&[
        "status",
        "--address",
        &s.addr.to_string(),
        "--token",
        &token,
    ])
    .await;
    assert_eq!(out.status.code(), Some(0));
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table.contains("LAG (batches)") && table.contains("QUEUE (events)"),
        "{table}"
    );
    assert!(table.contains(" connected "), "{table}");
    assert!(table.contains("gabp-sim/0.1"), "{table}");
    // A wrong token: exit 1, one line, the token never echoed.
    let out = output(&[
        "status",
        "--address",
        &s.addr.to_string(),
        "--token",
        "wrongtok",
    ])
    .await;
    assert_eq!(out.status.code(), Some(1));
    assert!(!String::from_utf8_lossy(&out.stderr).contains("wrongtok"));
    // No relay there: exit 1 with one line.
    let out = output(&["status", "--bridge-file", "/nonexistent/bridge.json"]).await;
    assert_eq!(out.status.code(), Some(1));
    one_line(&out);
    sim.stop();
}

#[tokio::test]
async fn sizes_take_suffixes_and_help_shows_defaults_and_choices() {
    let sim = start_mod(None);
    let s = serve(&[
        "--upstream",
        &sim.addr().to_string(),
        "--listen",
        "127.0.0.1:0",
        "--outbox-bytes",
        "16MiB",
        "--max-body",
        "4MiB",
        "--request-timeout",
        "1.5s",
        "--no-record",
    ])
    .await;
    drop(s);
    for bad in [&["--outbox-bytes", "512"][..], &["--max-body", "lots"]] {
        let mut args = vec![
            "serve",
            "--upstream",
            "127.0.0.1:1",
            "--listen",
            "127.0.0.1:0",
        ];
        args.extend_from_slice(bad);
        let out = output(&args).await;
        assert_eq!(out.status.code(), Some(2), "{args:?}");
    }
    let help = output(&["serve", "--help"]).await;
    let help = String::from_utf8_lossy(&help.stdout);
    for want in [
        "[default: drop-oldest]",
        "[possible values: none, batch]",
        "[default: 16MiB]",
        "[default: 10s]",
    ] {
        assert!(help.contains(want), "help lacks {want}: {help}");
    }
    // The banner names the durability as the flag spells it.
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("d");
    let s = serve(&[
        "--upstream",
        &sim.addr().to_string(),
        "--listen",
        "127.0.0.1:0",
        "--no-bridge-file",
        "--data-dir",
        data.to_str().expect("utf-8"),
    ])
    .await;
    let line = s.start_up.last().expect("recording line");
    assert!(line.ends_with("(durability batch)"), "{line}");
    sim.stop();
}

#[tokio::test]
async fn config_errors_give_the_line_and_the_closest_field() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("relay.toml");
    std::fs::write(
        &path,
        "data_dir = \"/tmp/x\"\n\n[[route]]\nname = \"a\"\nupstream = \"127.0.0.1:1\"\nlisten = \"127.0.0.1:0\"\noutbox_byte = \"16MiB\"\n",
    )
    .expect("write");
    let out = output(&["serve", "--config", path.to_str().expect("utf-8")]).await;
    assert_eq!(out.status.code(), Some(2));
    let err = one_line(&out);
    assert!(err.contains("line 7"), "{err}");
    assert!(err.contains("did you mean `outbox_bytes`?"), "{err}");
    // A value below its bound in the file: the line and the field.
    std::fs::write(
        &path,
        "[[route]]\nname = \"a\"\nupstream = \"127.0.0.1:1\"\nlisten = \"127.0.0.1:0\"\nmax_body = \"12\"\n",
    )
    .expect("write");
    let out = output(&["serve", "--config", path.to_str().expect("utf-8")]).await;
    assert_eq!(out.status.code(), Some(2));
    let err = one_line(&out);
    assert!(err.contains("line 5: route \"a\", field max_body"), "{err}");
}

#[tokio::test]
async fn json_is_offered_only_where_it_works_and_a_closed_pipe_is_quiet() {
    let dir = record_a_session().await;
    let d = dir.path().join("data");
    let d = d.to_str().expect("utf-8");
    // export writes JSON lines already: --json is only its -o summary.
    let out = output(&["export", "latest", "--json", "--data-dir", d]).await;
    assert_eq!(out.status.code(), Some(2));
    let file = dir.path().join("out.jsonl");
    let out = output(&[
        "export",
        "latest",
        "--json",
        "-o",
        file.to_str().expect("utf-8"),
        "--data-dir",
        d,
    ])
    .await;
    assert_eq!(out.status.code(), Some(0));
    let v = json(&out);
    assert!(v["frames"].as_u64().expect("frames") > 20, "{v}");
    let out = output(&["repair", "--json", "--data-dir", d]).await;
    assert_eq!(out.status.code(), Some(2), "repair has no JSON form");
    // A reader that goes away: no panic, no message, exit 0.
    let sh = format!("{BIN} sessions --data-dir {d} | head -c 0; exit ${{PIPESTATUS[0]}}");
    let out = tokio::process::Command::new("bash")
        .args(["-c", &sh])
        .env_remove("GABP_RELAY_DATA_DIR")
        .output()
        .await
        .expect("bash");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = output(&["sessions", "rm", "latest", "--json", "--data-dir", d]).await;
    assert_eq!(out.status.code(), Some(0));
    assert!(json(&out)["removed"].is_string());
}

#[tokio::test]
async fn ctrl_c_on_demo_prints_the_summary_and_ends_clean_and_prefixes_list_candidates() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path().join("data");
    let d = d.to_str().expect("utf-8");
    let mut ids = Vec::new();
    for _ in 0..2 {
        let mut child = relay()
            .args([
                "demo",
                "--duration",
                "10m",
                "--rate",
                "2000",
                "--data-dir",
                d,
            ])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("demo");
        let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        let mut text = String::new();
        tokio::time::timeout(Duration::from_secs(30), async {
            while let Some(l) = lines.next_line().await.expect("read") {
                let tick = l.starts_with("[ 1s]");
                text += &l;
                text.push('\n');
                if tick {
                    break;
                }
            }
        })
        .await
        .expect("a first progress line");
        signal(&child, "INT");
        tokio::time::timeout(Duration::from_secs(30), async {
            while let Some(l) = lines.next_line().await.expect("read") {
                text += &l;
                text.push('\n');
            }
        })
        .await
        .expect("demo ended");
        let st = child.wait().await.expect("status");
        assert_eq!(st.code(), Some(0), "{text}");
        assert!(text.contains("interrupted after"), "{text}");
        assert!(text.contains("ended relay_shutdown"), "{text}");
        assert!(text.contains("consistency check: ok"), "{text}");
        let out = output(&["sessions", "--json", "--data-dir", d]).await;
        let v = json(&out);
        let latest = v["sessions"]
            .as_array()
            .expect("list")
            .iter()
            .max_by_key(|s| s["startedNs"].as_u64())
            .expect("a session")
            .clone();
        assert_eq!(latest["end"], "relay_shutdown", "{v}");
        ids.push(latest["id"].as_str().expect("id").to_string());
    }
    // Two sessions of the same minute share an id prefix (UUIDv7): it lists both.
    let common: String = ids[0]
        .chars()
        .zip(ids[1].chars())
        .take_while(|(a, b)| a == b)
        .map(|(a, _)| a)
        .collect();
    assert!(common.len() >= 4, "{ids:?}");
    let out = output(&["stats", &common, "--data-dir", d]).await;
    assert_eq!(out.status.code(), Some(1));
    let err = one_line(&out);
    assert!(err.contains(&ids[0]) && err.contains(&ids[1]), "{err}");
    assert!(err.contains("matches 2 sessions"), "{err}");
}

#[tokio::test]
async fn replay_json_prints_its_start_up_line_as_one_document() {
    let dir = record_a_session().await;
    let d = dir.path().join("data");
    let mut child = relay()
        .args([
            "replay",
            "latest",
            "--listen",
            "127.0.0.1:0",
            "--json",
            "--data-dir",
        ])
        .arg(&d)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("replay");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let line = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
        .await
        .expect("a start-up line")
        .expect("read")
        .expect("a line");
    let v: serde_json::Value = serde_json::from_str(&line).expect("one JSON document");
    assert_camel("replay", &v);
    let addr: gabp_sim::Addr = v["listen"].as_str().expect("listen").parse().expect("addr");
    let token = v["token"].as_str().expect("generated token");
    Client::connect_hello(&addr, token)
        .await
        .expect("hello with the printed token");
    sigterm(&child);
    let st = tokio::time::timeout(Duration::from_secs(20), child.wait())
        .await
        .expect("stopped")
        .expect("status");
    assert_eq!(st.code(), Some(0));
}

/// The `sessions --json` list of a data dir (read-only, so it works while a relay records).
async fn session_ids(data: &str) -> Vec<String> {
    let out = output(&["sessions", "--json", "--data-dir", data]).await;
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    json(&out)["sessions"]
        .as_array()
        .expect("list")
        .iter()
        .map(|s| s["id"].as_str().expect("id").to_string())
        .collect()
}

#[tokio::test]
async fn sessions_rm_reports_an_ambiguous_prefix_even_while_a_relay_records() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let d = data.to_str().expect("utf-8");
    let sim = start_mod(None);
    let upstream = sim.addr().to_string();
    let s = serve(&[
        "--upstream",
        &upstream,
        "--upstream-token",
        MOD_TOKEN,
        "--listen",
        "127.0.0.1:0",
        "--token",
        BRIDGE_TOKEN,
        "--data-dir",
        d,
    ])
    .await;
    // Two sessions of one relay: the mod drops the relay, which reconnects.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while session_ids(d).await.is_empty() {
        assert!(std::time::Instant::now() < deadline, "no first session");
    }
    sim.kill_connections();
    let ids = loop {
        let ids = session_ids(d).await;
        if ids.len() == 2 {
            break ids;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no second session: {ids:?}"
        );
    };
    let common: String = ids[0]
        .chars()
        .zip(ids[1].chars())
        .take_while(|(a, b)| a == b)
        .map(|(a, _)| a)
        .collect();
    assert!(common.len() >= 4, "{ids:?}");
    let out = output(&["sessions", "rm", &common, "--data-dir", d]).await;
    assert_eq!(out.status.code(), Some(1));
    let err = one_line(&out);
    assert!(err.contains("matches 2 sessions"), "{err}");
    assert!(err.contains(&ids[0]) && err.contains(&ids[1]), "{err}");
    assert!(!err.contains("in use"), "the ambiguity comes first: {err}");
    // A removal that names one session is refused for the running relay, by its pid; so are
    // the other commands that change a data dir, and none of them touches a file of it (they
    // used to rotate the running relay's RocksDB info log while finding the lock held).
    let files = || {
        let mut v: Vec<String> = std::fs::read_dir(d)
            .expect("data dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .filter(|n| !n.ends_with(".log") && !n.ends_with(".sst") && !n.starts_with("MANIFEST"))
            .collect();
        v.sort();
        v
    };
    let before = files();
    let pid = s.child.id().expect("running");
    for args in [
        &["sessions", "rm", &ids[0], "--data-dir", d][..],
        &["sessions", "tag", &ids[0], "a=b", "--data-dir", d],
        &["sessions", "prune", "--retain", "1s", "--data-dir", d],
    ] {
        let out = output(args).await;
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let err = one_line(&out);
        assert!(
            err.contains(&format!("in use by another process (pid {pid}")),
            "{args:?}: {err}"
        );
    }
    assert_eq!(files(), before, "a refused command changed the data dir");
    assert_eq!(session_ids(d).await.len(), 2, "nothing was removed");
    sim.stop();
}

/// `gabp-relay mark` records a mark with its data in the session a running route records,
/// under the name it was given, found through the route's discovery file; bad input is a
/// one-line usage error (exit 2) and a relay with no mod connected says why (exit 1).
#[tokio::test]
async fn mark_records_an_episode_boundary_from_the_shell() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("bridge.json");
    let f = file.to_str().expect("utf-8");
    let data = dir.path().join("data");
    let d = data.to_str().expect("utf-8");
    let sim = start_mod(Some(200.0));
    let s = serve(&[
        "--upstream",
        &sim.addr().to_string(),
        "--upstream-token",
        MOD_TOKEN,
        "--listen",
        "127.0.0.1:0",
        "--route-name",
        "lab",
        "--data-dir",
        d,
        "--bridge-file",
        f,
    ])
    .await;
    let out = output(&[
        "mark",
        "episode-start",
        "--data",
        r#"{"episode":3,"seed":7}"#,
        "--bridge-file",
        f,
        "--name",
        "trainer",
        "--json",
    ])
    .await;
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v = json(&out);
    assert_eq!(v["label"], "episode-start", "{v}");
    assert_eq!(v["data"]["seed"], 7, "{v}");
    let session = v["session"]
        .as_str()
        .expect("the session marked")
        .to_string();
    let out = output(&["mark", "episode-end", "--bridge-file", f]).await;
    assert_eq!(out.status.code(), Some(0));
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.starts_with("marked \"episode-end\" in session ") && said.contains(&session),
        "{said}"
    );
    // Bad input: one line, exit 2, nothing sent.
    for bad in [
        vec!["mark", "x", "--data", "{not json", "--bridge-file", f],
        vec!["mark", "", "--bridge-file", f],
    ] {
        let out = output(&bad).await;
        assert_eq!(out.status.code(), Some(2), "{bad:?}");
        one_line(&out);
    }
    let big = format!("{{\"blob\":\"{}\"}}", "x".repeat(4096));
    let out = output(&["mark", "x", "--data", &big, "--bridge-file", f]).await;
    assert_eq!(out.status.code(), Some(2));
    assert!(one_line(&out).contains("at most 2048"));
    s.stop_cleanly().await;
    sim.stop();
    // Both marks are in the session's recording, with their data and who sent them.
    let out = output(&["export", &session, "--data-dir", d]).await;
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines = String::from_utf8_lossy(&out.stdout);
    let marks: Vec<serde_json::Value> = lines
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("JSON line"))
        .filter(|v| v["kind"] == "mark")
        .collect();
    assert_eq!(marks.len(), 2, "{marks:?}");
    assert_eq!(marks[0]["label"], "episode-start");
    assert_eq!(
        marks[0]["data"],
        serde_json::json!({"episode": 3, "seed": 7})
    );
    assert_eq!(marks[1]["label"], "episode-end");
    // Who marked: the connection's hello carries the name given.
    let hello = lines
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("JSON line"))
        .find(|v| v["conn"] == marks[0]["conn"] && v["msg"]["method"] == "session/hello")
        .expect("the marking connection's hello");
    assert_eq!(hello["msg"]["params"]["clientInfo"]["name"], "trainer");
    // With no mod connected there is no session to mark: exit 1, one line that says so.
    let upstream = free_addr().to_string();
    let file2 = dir.path().join("idle.json");
    let f2 = file2.to_str().expect("utf-8");
    let idle = serve(&[
        "--upstream",
        &upstream,
        "--upstream-token",
        MOD_TOKEN,
        "--listen",
        "127.0.0.1:0",
        "--route-name",
        "idle",
        "--no-record",
        "--bridge-file",
        f2,
    ])
    .await;
    let out = output(&["mark", "x", "--bridge-file", f2, "--wait", "3s"]).await;
    assert_eq!(out.status.code(), Some(1));
    let err = one_line(&out);
    assert!(err.contains("did not welcome"), "{err}");
    idle.stop_cleanly().await;
}
