//! The MCP front driven by a client nobody here wrote: the official MCP Python SDK (`mcp` from
//! PyPI, installed into ~/.cache/gabp-relay/venv when missing) runs relay/tests/it/support/mcp_client.py
//! against `gabp-relay mcp` (stdio) and `serve --mcp-listen` (Streamable HTTP), with the relay in
//! front of the simulated mod and a plain GABP bridge on the same game.

use std::time::{Duration, Instant};

use crate::support::mcp::*;
use gabp_client::Client;
use serde_json::{json, Value};

fn check_scenario(r: &Value, name: &str) {
    assert_eq!(r["name"], name);
    assert_eq!(r["server"], "gabp-relay");
    assert_eq!(r["echo"], json!({"echo": {"hello": name}}));
    assert!(
        r["failText"]
            .as_str()
            .is_some_and(|t| t.contains("tool failed on purpose")),
        "the GABP error reaches the assistant: {}",
        r["failText"]
    );
    assert_eq!(r["events"]["count"], 500);
    assert_eq!(r["ack"]["attentionId"], "attn_1");
    assert_eq!(r["ack"]["acknowledged"], false);
    assert!(r["attention"]["attention"].is_null());
    assert_eq!(r["listChanged"], true);
    let resources: Vec<&str> = r["resources"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    for want in [
        "/welcome",
        "/stats",
        "/channels/world/tick",
        "/channels/chat/message",
    ] {
        assert!(
            resources
                .iter()
                .any(|u| u.starts_with("gabp://default/") && u.ends_with(want)),
            "{want} missing from {resources:?}"
        );
    }
}

/// Two MCP clients (stdio and HTTP) and one plain bridge share one game; every check of the
/// scenario holds for both clients, and the recording names all three.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_mcp_clients_and_a_bridge_share_one_game_and_are_recorded() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sim = sim(false, None);
    let s = serve(&sim, dir.path()).await;
    let (mut plain, _) = Client::connect_hello(&s.addr, &s.token)
        .await
        .expect("plain bridge hello");
    plain.subscribe(&["world/tick"]).await.expect("subscribe");

    let mut a = spawn_py("scenario", "stdio", "assistant-a", &s, dir.path(), &[]);
    let mut b = spawn_py("scenario", "http", "assistant-b", &s, dir.path(), &[]);
    for py in [&mut a, &mut b] {
        assert_eq!(py.line(Duration::from_secs(120)).await, "RESTART");
    }
    // Both assistants are bridges of the route, beside the plain one.
    let status = plain
        .call("relay/status", json!({}))
        .await
        .expect("relay/status");
    let versions: Vec<&str> = status["bridges"]
        .as_array()
        .expect("bridges")
        .iter()
        .filter_map(|b| b["bridgeVersion"].as_str())
        .collect();
    assert_eq!(versions.len(), 3, "{versions:?}");
    assert_eq!(
        versions
            .iter()
            .filter(|v| v.starts_with("gabp-relay-mcp/"))
            .count(),
        2,
        "{versions:?}"
    );
    // The plain bridge shares the game with both assistants.
    let echoed = plain
        .call(
            "tools/call",
            json!({"name": "sim/echo", "arguments": {"from": "plain"}}),
        )
        .await
        .expect("plain bridge call");
    assert_eq!(echoed, json!({"echo": {"from": "plain"}}));
    // The mod restarts (a crash): the relay reconnects, a new session begins.
    sim.kill_connections();
    let ra = a.finish(Duration::from_secs(60)).await;
    let rb = b.finish(Duration::from_secs(60)).await;
    check_scenario(&ra, "assistant-a");
    check_scenario(&rb, "assistant-b");
    // The plain bridge was told and still works in the new session.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        assert!(Instant::now() < deadline, "no relay/session notice");
        let ev = plain.next_event().await.expect("event");
        if ev["channel"] == "relay/session" && ev["payload"]["state"] == "started" {
            break;
        }
    }
    let echoed = plain
        .call(
            "tools/call",
            json!({"name": "sim/echo", "arguments": {"from": "plain"}}),
        )
        .await
        .expect("plain bridge call after restart");
    assert_eq!(echoed, json!({"echo": {"from": "plain"}}));

    // The recording holds all three hellos, the assistants by name.
    let list = std::process::Command::new(BIN)
        .args(["sessions", "--json", "--data-dir"])
        .arg(&s.data_dir)
        .output()
        .expect("sessions");
    assert!(list.status.success());
    let list: Value = serde_json::from_slice(&list.stdout).expect("sessions json");
    let mut recorded = String::new();
    for sess in list["sessions"].as_array().expect("sessions") {
        let id = sess["id"].as_str().expect("id");
        let out = std::process::Command::new(BIN)
            .args(["export", id, "--data-dir"])
            .arg(&s.data_dir)
            .output()
            .expect("export");
        assert!(out.status.success(), "export {id}");
        recorded += &String::from_utf8_lossy(&out.stdout);
    }
    for who in [
        "assistant-a",
        "assistant-b",
        "gabp-sim/0.1",
        "gabp-relay-mcp/",
    ] {
        assert!(recorded.contains(who), "{who} not in the recording");
    }
    assert!(!recorded.contains(&s.token), "the token was recorded");
    // Each MCP client's `mark` is in the recording, and no mark reached the mod.
    for who in ["assistant-a", "assistant-b"] {
        let label = format!("episode-start-{who}");
        assert!(recorded.contains(&label), "{label} not in the recording");
    }
    assert!(
        !recorded
            .lines()
            .any(|l| l.contains("relay/mark") && l.contains("\"relay->mod\"")),
        "a mark reached the mod"
    );
}

/// The HTTP endpoint refuses requests without the route's bearer token.
#[tokio::test]
async fn mcp_http_needs_the_bearer_token() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sim = sim(false, None);
    let s = serve(&sim, dir.path()).await;
    let url = s.mcp_url.strip_prefix("http://").expect("http url");
    let (host, path) = url.split_once('/').expect("path");
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"x","version":"1"}}}"#;
    for auth in [
        "",
        "Authorization: Bearer wrongwrongwrongwrongwrongwrong00\r\n",
    ] {
        let req = format!(
            "POST /{path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\n{auth}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        let mut conn = tokio::net::TcpStream::connect(host).await.expect("connect");
        tokio::io::AsyncWriteExt::write_all(&mut conn, req.as_bytes())
            .await
            .expect("write");
        let mut resp = String::new();
        tokio::time::timeout(
            Duration::from_secs(10),
            tokio::io::AsyncReadExt::read_to_string(&mut conn, &mut resp),
        )
        .await
        .expect("answer in time")
        .expect("read");
        assert!(resp.starts_with("HTTP/1.1 401"), "{resp}");
    }
}
