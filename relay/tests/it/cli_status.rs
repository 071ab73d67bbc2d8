//! `gabp-relay status` on a relay whose mod is down, through the real binary: the
//! relay is shown (route, mod disconnected, no bridges, recorder state) as JSON and as a table,
//! without waiting for the mod; once a mod comes, the same command says it is connected.
//! Looking leaves no trace: a relay-only (`withoutMod`) connection may ask only `relay/status`
//! and is never recorded.

use std::time::Instant;

use crate::support::*;

async fn status_json(file: &str) -> serde_json::Value {
    let out = output(&["status", "--bridge-file", file, "--json", "--wait", "5s"]).await;
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    json(&out)
}

#[tokio::test]
async fn status_shows_a_relay_whose_mod_is_down_and_then_connected() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("bridge.json");
    let f = file.to_str().expect("utf-8");
    let data = dir.path().join("data");
    let upstream = free_addr().to_string();
    let s = serve(&[
        "--upstream",
        &upstream,
        "--upstream-token",
        MOD_TOKEN,
        "--listen",
        "127.0.0.1:0",
        "--route-name",
        "idle",
        "--data-dir",
        data.to_str().expect("utf-8"),
        "--bridge-file",
        f,
    ])
    .await;
    // The relay holds a hello without this flag for 10 s: an answer well within that (and
    // within --wait 5s) shows the status hello was not kept waiting.
    let asked = Instant::now();
    let v = status_json(f).await;
    assert!(asked.elapsed() < Duration::from_secs(5), "{v}");
    let r = &v["relays"][0];
    assert_eq!(r["route"], "idle", "{v}");
    assert_eq!(r["modConnected"], false, "{v}");
    assert!(r["error"].is_null(), "{v}");
    assert!(r["status"]["session"].is_null(), "{v}");
    assert_eq!(r["status"]["bridges"], serde_json::json!([]), "{v}");
    assert_eq!(r["status"]["recording"], true, "{v}");
    assert_eq!(r["status"]["recorderHealth"]["ok"], true, "{v}");
    // The table says the same.
    let out = output(&["status", "--bridge-file", f, "--wait", "5s"]).await;
    assert_eq!(out.status.code(), Some(0));
    let table = String::from_utf8_lossy(&out.stdout);
    let row = table
        .lines()
        .find(|l| l.starts_with("idle "))
        .unwrap_or_else(|| panic!("a row for the route: {table}"));
    assert!(row.contains(" disconnected "), "{table}");
    assert!(row.trim_end().ends_with(" ok"), "recorder ok: {table}");
    // The mod comes up where the relay looks for it: status follows.
    let sim = ModSim::start(
        &upstream.parse().expect("addr"),
        ModSimConfig {
            token: MOD_TOKEN.into(),
            rate: None,
            ..ModSimConfig::default()
        },
    )
    .expect("mod");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let v = status_json(f).await;
        let r = &v["relays"][0];
        if r["modConnected"] == true {
            assert_eq!(r["status"]["session"]["state"], "connected", "{v}");
            assert_eq!(r["status"]["bridges"], serde_json::json!([]), "{v}");
            break;
        }
        assert!(Instant::now() < deadline, "status never saw the mod: {v}");
    }
    let out = output(&["status", "--bridge-file", f]).await;
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("idle ") && l.contains(" connected ")),
        "{table}"
    );
    let token = s.token.clone().expect("generated token printed");
    // `withoutMod` is a boolean: anything else is refused, not taken as false.
    let mut c = Client::connect(&s.addr).await.expect("connect");
    let typo = serde_json::json!({"token": token, "bridgeVersion": "typo/1", "platform": "linux",
        "launchId": "l", "relay": {"withoutMod": "yes"}});
    let r = c.request("session/hello", typo).await.expect("answer");
    assert_eq!(r["error"]["code"], -32602, "{r}");
    drop(c);
    // So is a `relay` that is not an object.
    for relay in [
        serde_json::json!(5),
        serde_json::json!("withoutMod"),
        serde_json::json!([]),
    ] {
        let mut c = Client::connect(&s.addr).await.expect("connect");
        let odd = serde_json::json!({"token": token, "bridgeVersion": "odd/1", "platform": "linux",
            "launchId": "l", "relay": relay});
        let r = c.request("session/hello", odd).await.expect("answer");
        assert_eq!(r["error"]["code"], -32602, "{relay}: {r}");
    }
    // A relay-only connection of its own: the mod is refused to it.
    let mut c = Client::connect(&s.addr).await.expect("connect");
    let hello = serde_json::json!({"token": token, "bridgeVersion": "looker/1", "platform": "linux",
        "launchId": "l", "relay": {"withoutMod": true}});
    let w = c.request("session/hello", hello).await.expect("hello");
    assert_eq!(
        w["result"]["capabilities"]["extensions"]["relay"]["methods"],
        serde_json::json!(["relay/status"]),
        "{w}"
    );
    let r = c
        .request("tools/list", serde_json::json!({}))
        .await
        .expect("answer");
    assert_eq!(r["error"]["code"], -32006, "{r}");
    let r = c
        .request("relay/mark", serde_json::json!({"label": "x"}))
        .await
        .expect("answer");
    assert_eq!(r["error"]["code"], -32006, "{r}");
    c.call("relay/status", serde_json::json!({}))
        .await
        .expect("status answered");
    drop(c);
    sim.stop();
    s.stop_cleanly().await;
    // The session the mod had holds no bridge and no frame of any status connection.
    let d = data.to_str().expect("utf-8");
    let v = json(&output(&["sessions", "--json", "--data-dir", d]).await);
    let sessions = v["sessions"].as_array().expect("sessions");
    assert_eq!(sessions.len(), 1, "{v}");
    assert_eq!(sessions[0]["bridges"], 0, "{v}");
    let out = output(&["export", "--all", "--data-dir", d, "-o", "-"]).await;
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        !text.contains("gabp-relay-status") && !text.contains("looker/1"),
        "{text}"
    );
}
