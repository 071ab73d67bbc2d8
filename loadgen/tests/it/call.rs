//! `gabp-loadgen call --subscribe`: a caller whose connection also carries a busy mod's events
//! (the direct half of `scripts/bench-calls`) gets every answer and skips the events unread.

use std::time::Duration;

use super::loadgen;
use gabp_sim::{ModSim, ModSimConfig};

#[tokio::test]
async fn a_subscribed_caller_gets_every_answer_among_the_events() {
    let sim = ModSim::start(
        &"127.0.0.1:0".parse().expect("addr"),
        ModSimConfig {
            token: "t".into(),
            rate: Some(20_000.0),
            ..ModSimConfig::default()
        },
    )
    .expect("mod");
    let addr = sim.addr().to_string();
    let out = loadgen(&[
        "call",
        "--addr",
        &addr,
        "--token",
        "t",
        "--concurrency",
        "1",
        "--subscribe",
        "world/tick,player/move,chat/message",
        "--warmup",
        "0",
        "--duration",
        "1s",
        "--json",
    ])
    .await;
    let emitted = sim.emitted();
    sim.stop();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON document");
    assert!(doc["calls"].as_u64().expect("calls") > 100, "{doc}");
    assert_eq!(doc["errors"], 0, "{doc}");
    assert_eq!(doc["unanswered"], 0, "{doc}");
    // The subscription made the mod stream events to the caller's connection meanwhile.
    assert!(emitted > 5_000, "the mod sent {emitted} events");
}

#[tokio::test]
async fn one_connection_keeps_every_call_in_flight_on_it() {
    // Each answer takes 20 ms: one call at a time would make 50 calls/s; eight in flight on
    // the one connection make about 400.
    let sim = ModSim::start(
        &"127.0.0.1:0".parse().expect("addr"),
        ModSimConfig {
            token: "t".into(),
            tool_latency: Duration::from_millis(20),
            ..ModSimConfig::default()
        },
    )
    .expect("mod");
    let addr = sim.addr().to_string();
    let out = loadgen(&[
        "call",
        "--addr",
        &addr,
        "--token",
        "t",
        "--concurrency",
        "8",
        "--one-connection",
        "--warmup",
        "0",
        "--duration",
        "1s",
        "--json",
    ])
    .await;
    let accepted = sim.accepted();
    sim.stop();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON document");
    assert_eq!(accepted, 1, "one connection to the mod");
    assert_eq!(doc["config"]["one_connection"], true, "{doc}");
    assert_eq!(doc["errors"], 0, "{doc}");
    let rate = doc["calls_per_s"].as_f64().expect("calls/s");
    assert!(
        rate > 200.0,
        "several calls in flight at once: {rate} calls/s"
    );
    // Without --concurrency the flag means nothing: refused.
    let refused = loadgen(&["call", "--addr", &addr, "--rate", "10", "--one-connection"]).await;
    assert_eq!(refused.status.code(), Some(2));
}
