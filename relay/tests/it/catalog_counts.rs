//! The catalog's event count equals what the channel index holds (ARCHITECTURE invariant 6:
//! the recorder indexes every event it records and gives no other frame a channel). A
//! whole-session replay takes its count from the catalog without scanning; a replay cut to
//! channels counts by scanning the index. Both, through the real release binary, must agree
//! on a session with requests, answers, notices and events on several channels.

use crate::support::*;

/// The event count `replay --json` announces with `extra` flags.
async fn announced(data: &std::path::Path, extra: &[&str]) -> u64 {
    let mut child = relay()
        .args([
            "replay",
            "latest",
            "--json",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
        ])
        .arg(data)
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn replay");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let line = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
        .await
        .expect("replay started in time")
        .expect("stdout")
        .expect("a line");
    let _ = child.kill().await;
    let doc: serde_json::Value = serde_json::from_str(&line).expect("json");
    doc["events"].as_u64().expect("events")
}

#[tokio::test]
async fn the_catalog_counts_exactly_the_events_the_index_holds() {
    let sim = start_mod(Some(3000.0));
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let s = serve_recording(sim.addr(), &data, &[]).await;
    // Two bridges on different channels, tool calls and a status request between events.
    let (mut a, _) = Client::connect_hello(&s.addr, BRIDGE_TOKEN)
        .await
        .expect("hello");
    let (mut b, _) = Client::connect_hello(&s.addr, BRIDGE_TOKEN)
        .await
        .expect("hello");
    a.subscribe(&["world/tick"]).await.expect("subscribe");
    b.subscribe(&["player/move", "chat/message"])
        .await
        .expect("subscribe");
    for i in 0..30 {
        a.next_event().await.expect("event");
        if i % 10 == 0 {
            b.call(
                "tools/call",
                serde_json::json!({"name": "sim/echo", "arguments": {"i": i}}),
            )
            .await
            .expect("call");
            a.call("relay/status", serde_json::json!({}))
                .await
                .expect("status");
        }
    }
    drop((a, b));
    s.stop_cleanly().await;
    sim.stop();
    let v = crate::support::storage::sessions(&data).await;
    let meta = &v["sessions"][0];
    let catalog = meta["events"].as_u64().expect("events");
    // `stats` counts the events of each channel by reading every frame.
    let stats = crate::support::storage::json_of(&[
        "stats",
        "latest",
        "--json",
        "--data-dir",
        data.to_str().expect("utf8"),
    ])
    .await;
    let per_channel = stats["channels"].as_array().expect("channels");
    assert!(per_channel.len() >= 3, "{stats}");
    let read: u64 = per_channel
        .iter()
        .map(|c| c["events"].as_u64().expect("n"))
        .sum();
    let mut cut = Vec::new();
    for c in per_channel {
        cut.extend(["--channel", c["channel"].as_str().expect("name")]);
    }
    let (whole, scanned) = (announced(&data, &[]).await, announced(&data, &cut).await);
    assert!(catalog > 0);
    assert_eq!(
        (whole, scanned, read),
        (catalog, catalog, catalog),
        "replay's catalog count, the index scan and the frames read agree"
    );
    assert!(
        meta["frames"].as_u64().expect("frames") > catalog,
        "the session has frames besides events: {meta}"
    );
}
