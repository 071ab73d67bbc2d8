//! The relay's semantics (docs/concepts.md): handshake, multiplexing, fan-out, seq,
//! backpressure policies, mod failures and restarts.

use std::collections::HashSet;
use std::time::Duration;

use gabp_client::Client;
use gabp_sim::ModSimConfig;
use serde_json::json;

use crate::support::in_process::{emit, error_code, quiet_mod, Harness, MOD_TOKEN};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn welcome_is_the_mods_own_plus_the_relay_extension() {
    let h = Harness::start(ModSimConfig {
        quirks: true,
        ..quiet_mod()
    })
    .await;
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
    crate::support::in_process::wait_pending(&h, true, "relay's own requests answered").await;
    let id = uuid::Uuid::new_v4().to_string();
    c.send_body(&gabp_proto::message::request(
        &id,
        "tools/call",
        json!({"name": "sim/echo", "arguments": {}}),
    ))
    .await
    .expect("send");
    // Wait until the relay has forwarded it, then kill the mod's connection.
    crate::support::in_process::wait_pending(&h, false, "request forwarded").await;
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
    let mut rx = h.relay().routes[0].sessions();
    tokio::time::timeout(Duration::from_secs(5), rx.wait_for(|s| s.is_none()))
        .await
        .expect("session ends")
        .expect("watch");
    let r = c.request("tools/list", json!({})).await.expect("answer");
    assert_eq!(error_code(&r), -32000);
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
    use gabp_engine::{Relay, RouteConfig, Upstream};
    use gabp_sim::ModSim;
    let a = ModSim::start(
        &crate::support::in_process::loopback(),
        ModSimConfig {
            app_name: "GameA".into(),
            ..quiet_mod()
        },
    )
    .expect("mod a");
    let b = ModSim::start(
        &crate::support::in_process::loopback(),
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
            crate::support::in_process::loopback(),
            format!("tok-{name}"),
        );
        r.upstream_token = MOD_TOKEN.into();
        r
    };
    let mut cfg = crate::support::in_process::relay_config(route("alpha", &a), dir.path());
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
