//! Recording round trips: what the mod sent is what export shows; replay serves it back.

use std::time::Duration;

use gabp_client::Client;
use gabp_engine::replay::{Recording, ReplayOptions, Speed};
use gabp_sim::Listener;
use gabp_storage::{Direction, EndReason, Store, StoreOptions};
use serde_json::json;

use crate::support::in_process::{emit, loopback, quiet_mod, Harness};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_is_recorded_losslessly_and_exports_as_sent() {
    let h = Harness::start(quiet_mod()).await;
    let mut c = h.bridge().await;
    c.subscribe(&["a"]).await.expect("subscribe");
    emit(&mut c, "a", 500).await;
    let mut seen = Vec::new();
    for _ in 0..500 {
        seen.push(c.next_event().await.expect("event"));
    }
    let echo = c
        .call(
            "tools/call",
            json!({"name": "sim/echo", "arguments": {"z": 9}}),
        )
        .await
        .expect("call");
    drop(c);
    let dir = h.shutdown().await;

    let store = Store::open(dir.path(), StoreOptions::default()).expect("open");
    let sessions = store.sessions().expect("list");
    assert_eq!(sessions.len(), 1);
    let meta = &sessions[0];
    assert_eq!(meta.end_reason, Some(EndReason::RelayShutdown));
    assert_eq!(meta.app_name.as_deref(), Some("SimGame"));
    assert!(meta
        .bridges
        .iter()
        .any(|b| b.bridge_version == "gabp-sim/0.1"));
    assert!(store.check_session(meta.id).expect("check").ok());

    let events: Vec<_> = store
        .frames(meta.id)
        .map(|f| f.expect("frame").1)
        .filter(|r| r.dir == Direction::ModToRelay && r.channel.is_some())
        .collect();
    assert_eq!(events.len(), 500);
    for (rec, delivered) in events.iter().zip(&seen) {
        let mut original: serde_json::Value = serde_json::from_slice(&rec.body).expect("json");
        assert_eq!(
            Some(rec.relay_seq.expect("relay seq")),
            delivered["seq"].as_u64()
        );
        original["seq"] = delivered["seq"].clone();
        assert_eq!(
            &original, delivered,
            "the bridge got exactly what the mod sent, seq aside"
        );
    }
    // No token anywhere in the recording.
    for item in store.frames(meta.id) {
        let body = item.expect("frame").1.body;
        let s = String::from_utf8_lossy(&body);
        assert!(
            !s.contains(crate::support::in_process::MOD_TOKEN),
            "upstream token recorded"
        );
    }
    let mut out = Vec::new();
    let n = gabp_analysis::export::export(
        &store,
        meta,
        &gabp_analysis::export::ExportFilter {
            channels: vec!["a".into()],
            ..Default::default()
        },
        &mut out,
    )
    .expect("export");
    assert_eq!(n, 500);
    let first: serde_json::Value =
        serde_json::from_slice(out.split(|&b| b == b'\n').next().expect("line")).expect("jsonl");
    assert_eq!(first["dir"], "mod->relay");
    assert_eq!(first["channel"], "a");
    assert_eq!(first["msg"]["type"], "event");
    let stats = gabp_analysis::stats::compute(&store, meta).expect("stats");
    let tc = stats
        .methods
        .iter()
        .find(|m| m.method == "tools/call")
        .expect("tools/call row");
    assert_eq!(tc.calls, 2);
    assert_eq!(echo["echo"]["z"], 9);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_serves_the_same_events_and_answers() {
    let h = Harness::start(quiet_mod()).await;
    let mut c = h.bridge().await;
    c.subscribe(&["a", "b"]).await.expect("subscribe");
    emit(&mut c, "a", 50).await;
    emit(&mut c, "b", 20).await;
    let mut live = Vec::new();
    for _ in 0..70 {
        let e = c.next_event().await.expect("event");
        live.push((e["channel"].clone(), e["seq"].clone(), e["payload"].clone()));
    }
    let answer = c
        .call(
            "tools/call",
            json!({"name": "sim/echo", "arguments": {"q": 1}}),
        )
        .await
        .expect("call");
    drop(c);
    let dir = h.shutdown().await;

    let store = Store::open(dir.path(), StoreOptions::default()).expect("open");
    let meta = store.resolve("latest").expect("session");
    let opts = ReplayOptions::new("t", Speed::Max);
    let rec = std::sync::Arc::new(Recording::open(store, meta, &opts).expect("open"));
    let listener = Listener::bind(&loopback()).await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let cancel = tokio_util::sync::CancellationToken::new();
    let server = tokio::spawn(gabp_engine::replay::serve(
        listener,
        rec,
        opts,
        cancel.clone(),
    ));

    for _ in 0..2 {
        let (mut r, welcome) = Client::connect_hello(&addr, "t").await.expect("hello");
        assert_eq!(welcome["app"]["name"], "SimGame");
        r.subscribe(&["a", "b"]).await.expect("subscribe");
        let mut replayed = Vec::new();
        for _ in 0..70 {
            let e = r.next_event().await.expect("event");
            replayed.push((e["channel"].clone(), e["seq"].clone(), e["payload"].clone()));
        }
        assert_eq!(
            replayed, live,
            "replay is identical to what the bridge saw live"
        );
        assert_eq!(
            r.call(
                "tools/call",
                json!({"name": "sim/echo", "arguments": {"q": 1}})
            )
            .await
            .expect("recorded answer"),
            answer
        );
        let miss = r
            .request(
                "tools/call",
                json!({"name": "sim/echo", "arguments": {"q": 2}}),
            )
            .await
            .expect("answer");
        assert_eq!(miss["error"]["code"], -32004);
    }
    cancel.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(5), server).await;
}

/// A route that records nothing answers a mark `"marked": false` with the reason: a mark no
/// export or report will ever show is not confirmed (it was `"marked": true`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mark_on_a_route_that_records_nothing_is_answered_as_kept_nowhere() {
    let h = Harness::start_with(quiet_mod(), |c| c.routes[0].record = false).await;
    let mut c = h.bridge().await;
    let answer = c
        .call("relay/mark", json!({"label": "episode-start"}))
        .await
        .expect("mark answered");
    assert_eq!(answer["marked"], false, "{answer}");
    assert_eq!(answer["label"], "episode-start", "{answer}");
    assert!(
        answer["why"]
            .as_str()
            .is_some_and(|w| w.contains("--no-record")),
        "{answer}"
    );
    drop(c);
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mark_is_answered_by_the_relay_recorded_and_never_forwarded() {
    let h = Harness::start(quiet_mod()).await;
    let mut c = h.bridge().await;
    let answer = c
        .call(
            "relay/mark",
            json!({"label": "episode-start", "data": {"episode": 7}}),
        )
        .await
        .expect("mark answered");
    assert_eq!(answer["marked"], true);
    assert_eq!(answer["label"], "episode-start");
    // A mark needs a label: refused with -32602, and the connection carries on.
    let refused = c.call("relay/mark", json!({"data": 1})).await;
    assert!(
        format!("{refused:?}").contains("-32602"),
        "an unlabelled mark is refused: {refused:?}"
    );
    c.call("relay/status", json!({}))
        .await
        .expect("still usable");
    drop(c);
    let dir = h.shutdown().await;

    let store = Store::open(dir.path(), StoreOptions::default()).expect("open");
    let sessions = store.sessions().expect("list");
    let meta = &sessions[0];
    let frames: Vec<_> = store.frames(meta.id).map(|f| f.expect("frame").1).collect();
    let marks: Vec<_> = frames
        .iter()
        .filter(|r| {
            r.dir == Direction::BridgeToRelay
                && String::from_utf8_lossy(&r.body).contains("\"relay/mark\"")
        })
        .collect();
    assert_eq!(marks.len(), 2, "both mark requests are in the recording");
    assert!(String::from_utf8_lossy(&marks[0].body).contains("episode-start"));
    assert!(
        !frames.iter().any(|r| r.dir == Direction::RelayToMod
            && String::from_utf8_lossy(&r.body).contains("relay/mark")),
        "a mark never reaches the mod"
    );
}
