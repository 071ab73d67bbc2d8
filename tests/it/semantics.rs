//! The relay's semantics (DESIGN.md, Semantics): handshake, multiplexing, fan-out, seq,
//! backpressure policies, mod failures and restarts.

use std::collections::HashSet;
use std::time::Duration;

use gabp_relay::OnSlow;
use gabp_sim::{Client, ModSimConfig};
use serde_json::json;

use crate::harness::{emit, error_code, quiet_mod, Harness, MOD_TOKEN};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn welcome_is_the_mods_own_plus_the_relay_extension() {
    let h = Harness::start(quiet_mod()).await;
    let (_, welcome) = Client::connect_hello(&h.addr, &h.token)
        .await
        .expect("hello");
    assert_eq!(welcome["app"]["name"], "SimGame");
    assert_eq!(
        welcome["x-unknown-field"], true,
        "unknown welcome fields pass through"
    );
    assert_eq!(welcome["capabilities"]["x-sim"]["seed"], 1);
    let relay = &welcome["capabilities"]["extensions"]["relay"];
    assert_eq!(relay["backpressure"]["policy"], "drop-oldest");
    assert_eq!(relay["sessionId"].as_str().expect("session id").len(), 36);
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_token_and_requests_before_hello_are_refused() {
    let h = Harness::start(quiet_mod()).await;
    let mut c = Client::connect(&h.addr).await.expect("connect");
    let r = c.request("tools/list", json!({})).await.expect("answer");
    assert_eq!(error_code(&r), -31001);
    let r = c
        .request(
            "session/hello",
            json!({"token": "wrong", "bridgeVersion": "t", "platform": "linux", "launchId": "x"}),
        )
        .await
        .expect("answer");
    assert_eq!(error_code(&r), -31000);
    assert!(!r.to_string().contains(&h.token));
    // The same connection can still succeed.
    c.hello(&h.token)
        .await
        .expect("right token works after a wrong one");
    assert!(c.call("tools/list", json!({})).await.expect("list")["tools"].is_array());
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_bridges_reusing_one_request_id_get_their_own_answers() {
    let h = Harness::start(quiet_mod()).await;
    let mut a = h.bridge().await;
    let mut b = h.bridge().await;
    let id = uuid::Uuid::new_v4().to_string();
    let req = |who: &str| {
        gabp_proto::message::request(
            &id,
            "tools/call",
            json!({"name": "sim/echo", "arguments": {"who": who}}),
        )
    };
    let (ra, rb) = (req("a"), req("b"));
    let (sa, sb) = tokio::join!(a.send_body(&ra), b.send_body(&rb));
    sa.expect("send a");
    sb.expect("send b");
    let (ra, rb) = tokio::join!(a.response_to(&id), b.response_to(&id));
    assert_eq!(ra.expect("a answered")["result"]["echo"]["who"], "a");
    assert_eq!(rb.expect("b answered")["result"]["echo"]["who"], "b");
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn legacy_parameters_and_length_only_headers_pass_through() {
    let h = Harness::start(quiet_mod()).await;
    let mut c = Client::connect(&h.addr).await.expect("connect");
    c.length_only_headers = true;
    c.hello(&h.token).await.expect("hello");
    let r = c
        .call(
            "tools/call",
            json!({"name": "sim/echo", "parameters": {"x": 1}}),
        )
        .await
        .expect("call");
    assert_eq!(r["echo"]["x"], 1);
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_subscribers_get_the_same_10000_events_in_order() {
    let h = Harness::start(quiet_mod()).await;
    let mut bridges = Vec::new();
    for _ in 0..8 {
        let mut c = h.bridge().await;
        c.subscribe(&["a"]).await.expect("subscribe");
        bridges.push(c);
    }
    let mut driver = h.bridge().await;
    emit(&mut driver, "a", 10_000).await;
    let mut first: Option<Vec<String>> = None;
    for mut c in bridges {
        let mut ids = Vec::with_capacity(10_000);
        for want in 0..10_000u64 {
            let e = c.next_event().await.expect("event");
            assert_eq!(e["channel"], "a");
            assert_eq!(e["seq"], want, "contiguous relay seq");
            ids.push(e["id"].as_str().expect("id").to_string());
        }
        match &first {
            None => first = Some(ids),
            Some(f) => assert_eq!(
                &ids, f,
                "every subscriber sees the same events in the same order"
            ),
        }
    }
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_gets_nothing_from_other_channels() {
    let h = Harness::start(quiet_mod()).await;
    let mut only_a = h.bridge().await;
    only_a.subscribe(&["a"]).await.expect("subscribe");
    let mut driver = h.bridge().await;
    emit(&mut driver, "b", 100).await;
    emit(&mut driver, "a", 1).await;
    let e = only_a.next_event().await.expect("event");
    assert_eq!(
        (e["channel"].as_str(), e["seq"].as_u64()),
        (Some("a"), Some(0))
    );
    // Unsubscribing stops delivery.
    only_a
        .call("events/unsubscribe", json!({"channels": ["a"]}))
        .await
        .expect("unsubscribe");
    emit(&mut driver, "a", 5).await;
    only_a.set_wait(Duration::from_millis(300));
    assert!(
        only_a.next_event().await.is_err(),
        "no events after unsubscribe"
    );
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quirky_mod_is_normalised_for_sequencing_and_passed_through() {
    let cfg = ModSimConfig {
        quirks: true,
        seq_start: 1,
        ..quiet_mod()
    };
    let h = Harness::start(cfg).await;
    let mut c = h.bridge().await;
    c.subscribe(&["a"]).await.expect("subscribe");
    let r = c
        .request(
            "tools/call",
            json!({"name": "sim/echo", "arguments": {"k": 2}}),
        )
        .await
        .expect("call");
    assert_eq!(
        r["result"]["echo"]["k"], 2,
        "success with \"error\": null is a success"
    );
    let r = c
        .request("tools/call", json!({"name": "sim/fail", "arguments": {}}))
        .await
        .expect("call");
    assert_eq!(
        error_code(&r),
        -32000,
        "error with \"result\": null is an error"
    );
    emit(&mut c, "a", 3).await;
    for want in 0..3u64 {
        let e = c.next_event().await.expect("event");
        assert_eq!(e["seq"], want, "mod seq 1.. becomes relay seq 0..");
        assert!(e["timestamp"].is_u64(), "extra mod fields pass through");
    }
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mod_that_dies_with_calls_in_flight_leaves_outcomes_unknown() {
    let cfg = ModSimConfig {
        tool_latency: Duration::from_secs(3),
        ..quiet_mod()
    };
    let h = Harness::start(cfg).await;
    let old = h.wait_session().await;
    let mut c = h.bridge().await;
    c.subscribe(&["a"]).await.expect("subscribe");
    // The relay's own upstream requests (its subscribe) must be answered first, so that the
    // pending entry waited for below is the bridge's call.
    crate::harness::wait_pending(&h, true, "relay's own requests answered").await;
    let id = uuid::Uuid::new_v4().to_string();
    c.send_body(&gabp_proto::message::request(
        &id,
        "tools/call",
        json!({"name": "sim/echo", "arguments": {}}),
    ))
    .await
    .expect("send");
    // Wait until the relay has forwarded it, then kill the mod's connection.
    crate::harness::wait_pending(&h, false, "request forwarded").await;
    h.sim.kill_connections();
    let r = c.response_to(&id).await.expect("answer");
    assert_eq!(error_code(&r), -32001);
    assert!(r["error"]["message"]
        .as_str()
        .expect("message")
        .contains("may or may not"));
    // The relay reconnects: a new session, the bridge keeps its connection and is told.
    let new = h.wait_new_session(&old).await;
    assert_ne!(new, old);
    let mut saw = HashSet::new();
    while saw.len() < 2 {
        let e = c.next_event().await.expect("session notices");
        if e["channel"] == "relay/session" {
            saw.insert(e["payload"]["state"].as_str().expect("state").to_string());
        }
    }
    assert!(
        c.call("tools/list", json!({})).await.is_ok(),
        "requests work in the new session"
    );
    emit(&mut c, "a", 1).await;
    let e = c.next_event().await.expect("event");
    assert_eq!(e["seq"], 0, "seq restarts with the session");
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_that_outlive_the_timeout_get_outcome_unknown() {
    let cfg = ModSimConfig {
        tool_latency: Duration::from_secs(2),
        ..quiet_mod()
    };
    let h = Harness::start_with(cfg, |c| {
        c.routes[0].request_timeout = Duration::from_millis(200)
    })
    .await;
    let mut c = h.bridge().await;
    let r = c
        .request("tools/call", json!({"name": "sim/echo", "arguments": {}}))
        .await
        .expect("answer");
    assert_eq!(error_code(&r), -32001);
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_while_the_mod_is_down_fail_clearly() {
    let h = Harness::start(quiet_mod()).await;
    h.wait_session().await;
    let mut c = h.bridge().await;
    h.sim.stop();
    let mut rx = h.relay().routes[0].session.subscribe();
    tokio::time::timeout(Duration::from_secs(5), rx.wait_for(|s| s.is_none()))
        .await
        .expect("session ends")
        .expect("watch");
    let r = c.request("tools/list", json!({})).await.expect("answer");
    assert_eq!(error_code(&r), -32000);
    h.shutdown().await;
}

fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("procfs");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches(" kB").parse::<u64>().ok())
        .expect("VmRSS")
        * 1024
}

async fn stalled_bridge_case(policy: OnSlow) {
    let h = Harness::start_with(quiet_mod(), |c| {
        c.routes[0].on_slow = policy;
        // Room for one burst, so bridges that keep reading never drop; the stalled one must.
        c.routes[0].outbox_frames = 25_000;
        c.routes[0].record = false;
    })
    .await;
    let mut stalled = h.bridge().await;
    stalled.subscribe(&["a"]).await.expect("subscribe");
    let mut good = Vec::new();
    for _ in 0..2 {
        let mut c = h.bridge().await;
        c.subscribe(&["a"]).await.expect("subscribe");
        good.push(c);
    }
    let before = rss_bytes();
    let mut driver = h.bridge().await;
    const N: u64 = 200_000;
    const BURST: u64 = 20_000;
    let mut progress = Vec::new();
    let readers: Vec<_> = good
        .into_iter()
        .map(|mut c| {
            let (tx, rx) = tokio::sync::watch::channel(0u64);
            progress.push(rx);
            tokio::spawn(async move {
                for want in 0..N {
                    let e = c.next_event().await.expect("event");
                    assert_eq!(e["seq"], want, "healthy bridges lose nothing");
                    if (want + 1) % 1000 == 0 {
                        let _ = tx.send(want + 1);
                    }
                }
            })
        })
        .collect();
    for burst in 1..=(N / BURST) {
        emit(&mut driver, "a", BURST).await;
        // Healthy bridges read as fast as they can; the next burst waits for them.
        for rx in &mut progress {
            tokio::time::timeout(
                Duration::from_secs(30),
                rx.wait_for(|n| *n >= burst * BURST),
            )
            .await
            .expect("reader progress")
            .expect("reader alive");
        }
    }
    for r in readers {
        r.await.expect("reader");
    }
    let growth = rss_bytes().saturating_sub(before);
    assert!(
        growth < 150 << 20,
        "relay memory grew by {} MiB",
        growth >> 20
    );
    // Now the stalled bridge reads what it has.
    let mut last = None;
    let mut notices = 0u64;
    let mut dropped_total = 0u64;
    let mut received = 0u64;
    stalled.set_wait(Duration::from_secs(2));
    loop {
        let msg = match stalled.next_message().await {
            Ok(Some(m)) => m,
            _ => break,
        };
        if msg["type"] != "event" {
            continue;
        }
        if msg["channel"] == "relay/dropped" {
            notices += 1;
            dropped_total += msg["payload"]["count"].as_u64().expect("count");
            let from = msg["payload"]["fromSeq"].as_u64().expect("from");
            assert_eq!(
                Some(from),
                last.map_or(Some(0), |l: u64| Some(l + 1)),
                "notice starts right after the last delivered seq"
            );
            last = msg["payload"]["toSeq"].as_u64();
            continue;
        }
        let seq = msg["seq"].as_u64().expect("seq");
        assert_eq!(
            Some(seq),
            last.map_or(Some(0), |l| Some(l + 1)),
            "every gap is announced"
        );
        last = Some(seq);
        received += 1;
        if seq == N - 1 {
            break;
        }
    }
    match policy {
        OnSlow::DropOldest => {
            assert!(notices > 0, "drops are announced");
            assert_eq!(
                received + dropped_total,
                N,
                "delivered + dropped = published"
            );
        }
        OnSlow::Disconnect => assert!(received < N, "the slow bridge was cut off"),
        OnSlow::Block => unreachable!("not used here"),
    }
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_bridge_under_drop_oldest_sees_announced_gaps_and_costs_nobody() {
    stalled_bridge_case(OnSlow::DropOldest).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_bridge_under_disconnect_is_cut_off() {
    stalled_bridge_case(OnSlow::Disconnect).await;
}

/// A bridge that stops reading while its events and its own answers pile up: the mod reader's
/// direct writes fill the socket and leave the rest to the bridge's writer task (and the outbox
/// drops the oldest events once it is full). When the bridge reads again, every answer is there
/// exactly once and the events come in order, every gap announced by `relay/dropped`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bridge_that_pauses_reading_gets_every_answer_and_ordered_events() {
    let h = Harness::start(quiet_mod()).await;
    let mut slow = h.bridge().await;
    slow.subscribe(&["a"]).await.expect("subscribe");
    let mut driver = h.bridge().await;
    let mut asked = HashSet::new();
    // ~12 MB of events, more than loopback socket buffers and the outbox hold, interleaved
    // with requests the bridge sends without reading anything back.
    for _ in 0..10 {
        emit(&mut driver, "a", 4_000).await;
        for _ in 0..10 {
            let id = uuid::Uuid::new_v4().to_string();
            slow.send_body(&gabp_proto::message::request(
                &id,
                "tools/call",
                json!({"name": "sim/echo", "arguments": {"id": id}}),
            ))
            .await
            .expect("send");
            asked.insert(id);
        }
    }
    let (mut next_seq, mut received, mut dropped) = (0u64, 0u64, 0u64);
    let mut answered = HashSet::new();
    while answered.len() < asked.len() || next_seq < 40_000 {
        let m = slow
            .next_message()
            .await
            .expect("a frame")
            .expect("still open");
        match (m["type"].as_str(), m["channel"].as_str()) {
            (Some("response"), _) => {
                let id = m["id"].as_str().expect("id").to_string();
                assert!(asked.contains(&id), "an answer to a request of ours");
                assert_eq!(m["result"]["echo"]["id"], id.as_str(), "its own answer");
                assert!(answered.insert(id), "answered once");
            }
            (Some("event"), Some("a")) => {
                assert_eq!(m["seq"], next_seq, "in order, gaps only where announced");
                next_seq += 1;
                received += 1;
            }
            (Some("event"), Some("relay/dropped")) => {
                let p = &m["payload"];
                assert_eq!(p["channel"], "a");
                assert_eq!(p["fromSeq"], next_seq, "the notice stands where the gap is");
                next_seq = p["toSeq"].as_u64().expect("toSeq") + 1;
                dropped += p["count"].as_u64().expect("count");
            }
            _ => {}
        }
    }
    assert_eq!(
        received + dropped,
        40_000,
        "every event delivered or announced"
    );
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn block_policy_is_lossless() {
    let h = Harness::start_with(quiet_mod(), |c| {
        c.routes[0].on_slow = OnSlow::Block;
        c.routes[0].outbox_frames = 100;
    })
    .await;
    let mut slow = h.bridge().await;
    slow.subscribe(&["a"]).await.expect("subscribe");
    let mut driver = h.bridge().await;
    let emitting = tokio::spawn(async move {
        emit(&mut driver, "a", 20_000).await;
        driver
    });
    for want in 0..20_000u64 {
        let e = slow.next_event().await.expect("event");
        assert_eq!(e["seq"], want);
        if want % 5000 == 0 {
            tokio::time::sleep(Duration::from_millis(20)).await; // read slower than the mod writes
        }
    }
    emitting.await.expect("emitter");
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_status_reports_route_session_and_bridges() {
    let h = Harness::start(quiet_mod()).await;
    let mut c = h.bridge().await;
    c.subscribe(&["a", "b"]).await.expect("subscribe");
    let s = c.call("relay/status", json!({})).await.expect("status");
    assert_eq!(s["route"], "test");
    assert_eq!(s["session"]["state"], "connected");
    let me = s["bridges"]
        .as_array()
        .expect("bridges")
        .iter()
        .find(|b| b["subscriptions"] == json!(["a", "b"]))
        .expect("this bridge listed");
    assert_eq!(me["policy"], "drop-oldest");
    let r = c.request("relay/nope", json!({})).await.expect("answer");
    assert_eq!(error_code(&r), -32601);
    let _ = MOD_TOKEN;
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_routes_in_one_process_stay_apart_and_are_recorded_by_name() {
    use gabp_relay::{Relay, RouteConfig, Upstream};
    use gabp_sim::ModSim;
    let a = ModSim::start(
        &crate::harness::loopback(),
        ModSimConfig {
            app_name: "GameA".into(),
            ..quiet_mod()
        },
    )
    .expect("mod a");
    let b = ModSim::start(
        &crate::harness::loopback(),
        ModSimConfig {
            app_name: "GameB".into(),
            ..quiet_mod()
        },
    )
    .expect("mod b");
    let dir = tempfile::tempdir().expect("tempdir");
    let route = |name: &str, sim: &ModSim| {
        let mut r = RouteConfig::new(
            name,
            Upstream::Addr(sim.addr().clone()),
            crate::harness::loopback(),
            format!("tok-{name}"),
        );
        r.upstream_token = MOD_TOKEN.into();
        r
    };
    let mut cfg = crate::harness::relay_config(route("alpha", &a), dir.path());
    cfg.routes.push(route("beta", &b));
    let relay = Relay::start(cfg).await.expect("two routes");
    let (mut ca, wa) = Client::connect_hello(&relay.addrs[0], "tok-alpha")
        .await
        .expect("alpha");
    let (mut cb, wb) = Client::connect_hello(&relay.addrs[1], "tok-beta")
        .await
        .expect("beta");
    assert_eq!(
        (wa["app"]["name"].as_str(), wb["app"]["name"].as_str()),
        (Some("GameA"), Some("GameB"))
    );
    assert_eq!(error_code(&Client::connect(&relay.addrs[1]).await.expect("c").request("session/hello", json!({"token": "tok-alpha", "bridgeVersion": "x", "platform": "linux", "launchId": "l"})).await.expect("answer")), -31000, "tokens are per route");
    ca.subscribe(&["a"]).await.expect("subscribe");
    cb.subscribe(&["a"]).await.expect("subscribe");
    emit(&mut ca, "a", 3).await;
    for want in 0..3u64 {
        assert_eq!(ca.next_event().await.expect("alpha event")["seq"], want);
    }
    cb.set_wait(Duration::from_millis(300));
    assert!(
        cb.next_event().await.is_err(),
        "beta sees nothing of alpha's mod"
    );
    assert_eq!(
        cb.call("relay/status", json!({})).await.expect("status")["route"],
        "beta"
    );
    drop((ca, cb));
    assert!(relay.shutdown().await);
    a.stop();
    b.stop();
    let store =
        gabp_storage::Store::open(dir.path(), gabp_storage::StoreOptions::default()).expect("open");
    let mut routes: Vec<String> = store
        .sessions()
        .expect("list")
        .into_iter()
        .map(|m| m.route)
        .collect();
    routes.sort();
    assert_eq!(routes, vec!["alpha", "beta"]);
}
